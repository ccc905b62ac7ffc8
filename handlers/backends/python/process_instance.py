"""A Python-model instance in a process of its own (the serving-process side of stub.py).

This is Triton's layout: each instance runs in its own stub process, so `count: 2` runs two
model.py copies in parallel even for CPU-bound Python code, a crash or a `sys.exit` in a model
takes down only its instance, and models never share `sys.modules`. The two processes talk over a
socketpair (no /dev/shm, which AWS Lambda lacks); see ipc.py.

One reader thread per instance serves what the model process sends: batch results, a decoupled
model's responses (handed to the requests' response streams, streams.py), BLS calls (queued on
the target model without blocking; a decoupled BLS call's responses go back as they arrive),
`is_model_ready`, log lines and custom metrics.
When the model process dies, the batch it was running fails with Triton's "Stub process
'<instance>' is not healthy." and the next batch starts a fresh process (Triton 2.51 keeps failing
instead; docs/python-backend.md).
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import handlers

from ...cpu_budget import thread_environment
from ...errors import InferenceError, internal
from ...inference import InferOutcome, InferRequest
from ...model_io import OutputReshape
from . import conversion, execution_env
from .bls import BlsBridge
from .host import emit_log, emit_record
from .ipc import Channel, ChannelClosed
from .metric_store import runtime_store
from .streams import ResponseRoutes

log = logging.getLogger("handlers.python")

STUB_MODULE = "handlers.backends.python.stub"
_HANDLERS_ROOT = str(Path(handlers.__file__).resolve().parent.parent)


class ModelProcessError(Exception):
    """The model process could not start or initialise the model (message: Triton's)."""


class _Waiter:
    __slots__ = ("event", "value")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.value: Any = None


class ProcessInstance:
    """One model instance, executed by a model process. `execute` is called by one batcher
    worker thread at a time."""

    def __init__(self, spec: Any, version: int, name: str, kind: str = "KIND_CPU", device_id: int = 0,
                 threads: int | None = None) -> None:
        self.spec = spec
        self.threads = threads  # CPU budget: OMP_NUM_THREADS etc. of the model process
        self.version = version
        self.name = name
        self.kind = kind
        self.device_id = device_id
        self.bridge = BlsBridge(spec)
        self.decoupled = bool(spec.decoupled)
        self.routes = ResponseRoutes(on_cancel=self._send_cancel, reshape=OutputReshape(spec.config))
        self._bls_streams: dict[int, Any] = {}  # call id -> cancel of a decoupled BLS call in flight
        self._ids = itertools.count(1)
        self._waiters: dict[int, _Waiter] = {}
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._channel: Channel | None = None
        self._healthy = False
        self._closing = False
        self._reading = False  # a reader thread serves the current process (guarded by _lock)
        self.start_seconds = 0.0
        try:
            # EXECUTION_ENV_PATH: the environment's own interpreter (execution_env.py)
            self.environment = execution_env.environment_root(spec)
        except (execution_env.EnvironmentError_, OSError, subprocess.CalledProcessError) as exc:
            raise ModelProcessError(f"Failed to prepare the Python execution environment of '{spec.name}': {exc}") from None
        self._start()

    # -- process lifecycle ------------------------------------------------------------------------------

    def _start(self) -> None:
        started = time.perf_counter()
        parent, child = socket.socketpair()
        if self.environment is None:
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(p for p in (_HANDLERS_ROOT, env.get("PYTHONPATH", "")) if p)
            command = [sys.executable, "-m", STUB_MODULE, str(child.fileno())]
        else:
            env = execution_env.activation_environment(self.environment, os.environ)
            command = execution_env.launch_command(self.environment, _HANDLERS_ROOT, [str(child.fileno()), "portable"])
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.update(thread_environment(self.threads, env))
        try:
            process = subprocess.Popen(
                command,
                pass_fds=(child.fileno(),),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        except OSError as exc:
            parent.close()
            raise ModelProcessError(f"Launch stub process failed for {self.name}: {exc}") from None
        finally:
            child.close()
        channel = Channel(parent, portable=self.environment is not None)
        ready = _Waiter()
        waiters: dict[int, _Waiter] = {0: ready}  # this process's pending answers
        with self._lock:
            self._process, self._channel = process, channel
            self._waiters = waiters
            self._reading = True
        threading.Thread(
            target=self._read, args=(channel, process, waiters), name=f"python-{self.name}", daemon=True
        ).start()
        spec = self.spec
        try:
            channel.send(
            (
                "init",
                0,
                {
                    "model_file": str(spec.model_files[self.version]),
                    "model_dir": str(spec.directory),
                    "version": self.version,
                    "config": spec.config,
                    "instance_name": self.name,
                    "kind": self.kind,
                    "device_id": self.device_id,
                    "log_level": logging.getLogger().getEffectiveLevel(),
                },
            )
            )
        except ChannelClosed:
            pass  # the process is already gone: the reader reports how it exited
        ready.event.wait()
        status, message = ready.value
        if status != "ready":
            self._reap()
            raise ModelProcessError(message)
        self._healthy = True
        self.start_seconds = time.perf_counter() - started

    def _reap(self) -> None:
        process = self._process
        if self._channel is not None:
            self._channel.close()
        if process is not None:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def close(self, timeout: float = 30.0) -> None:
        """finalize() the model and let its process exit."""
        self._closing = True
        channel, process = self._channel, self._process
        if channel is None or process is None:
            return
        done = self._register(-1) if self._healthy else None
        if done is not None:
            try:
                channel.send(("finalize", 0, None))
                done.event.wait(timeout)
            except ChannelClosed:
                pass
        self._healthy = False
        channel.close()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    # -- reader ---------------------------------------------------------------------------------------------

    def _read(self, channel: Channel, process: subprocess.Popen, waiters: dict[int, _Waiter]) -> None:
        try:
            while True:
                kind, ident, payload = channel.receive()
                if kind in ("result", "answer"):
                    self._wake(waiters, ident, payload)
                elif kind == "response":  # a decoupled model's response (payload, final)
                    self.routes.send(ident, *payload)
                elif kind == "call":
                    self._serve_call(channel, ident, *payload)
                elif kind == "notify":
                    self._serve_notify(*payload)
                elif kind == "ready":
                    self._wake(waiters, 0, ("ready", ""))
                elif kind == "init_failed":
                    self._wake(waiters, 0, ("failed", payload))
                elif kind == "finalized":
                    self._wake(waiters, -1, None)
        except ChannelClosed:
            pass
        except Exception:
            log.exception("model instance '%s': unreadable message from its process", self.name)
        with self._lock:
            if waiters is self._waiters:
                self._healthy = False
                self._reading = False
        code = process.poll()
        if code is None:
            try:
                code = process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
        if not self._closing:
            log.error("model instance '%s': its process exited (status %s)", self.name, code)
        gone = f"Stub process '{self.name}' is not healthy."
        with self._lock:
            pending = dict(waiters)
            waiters.clear()
        for ident, waiter in pending.items():
            waiter.value = ("failed", _exit_message(self.name, code)) if ident == 0 else ("gone", gone)
            waiter.event.set()
        if self.decoupled:  # nothing more will come for the requests it had open
            self.routes.close_all(
                f"model instance '{self.name}' was unloaded before it sent the final response" if self._closing else gone
            )
        with self._lock:
            streams, self._bls_streams = self._bls_streams, {}
        for cancel in streams.values():
            cancel()  # its BLS calls have nobody to answer

    def _register(self, ident: int) -> _Waiter | None:
        """A waiter for an answer, or None when no reader will ever answer (process gone)."""
        waiter = _Waiter()
        with self._lock:
            if not self._reading:
                return None
            self._waiters[ident] = waiter
        return waiter

    def _wake(self, waiters: dict[int, _Waiter], ident: int, value: Any) -> None:
        with self._lock:
            waiter = waiters.pop(ident, None)
        if waiter is not None:
            waiter.value = value
            waiter.event.set()

    def _serve_call(self, channel: Channel, call_id: int, method: str, args: tuple) -> None:
        def reply(value: Any) -> None:
            try:
                channel.send(("reply", call_id, value))
            except ChannelClosed:
                pass

        try:
            if method == "infer":
                self.bridge.submit(args[0], lambda outcome: reply(("ok", outcome)))
                return
            if method == "infer_stream":
                self._serve_stream(channel, call_id, args[0])
                return
            if method == "is_model_ready":
                reply(("ok", self.bridge.is_model_ready(*args)))
            elif method == "metric_family":
                reply(("ok", runtime_store().family(*args)))
            elif method == "metric_new":
                reply(("ok", runtime_store().metric(*args)))
            elif method == "metric_value":
                reply(("ok", runtime_store().value(*args)))
            else:
                reply(("error", f"unknown call '{method}'"))
        except ValueError as exc:
            reply(("error", str(exc)))
        except Exception as exc:  # noqa: BLE001 - answer, never leave the model waiting
            reply(("error", f"{type(exc).__name__}: {exc}"))

    def _serve_stream(self, channel: Channel, call_id: int, call: Any) -> None:
        """A decoupled BLS call: each event goes back as ("stream", call id, (payload, final))."""

        def event(payload: Any, final: bool) -> None:
            if final:
                with self._lock:
                    self._bls_streams.pop(call_id, None)
            try:
                channel.send(("stream", call_id, (payload, final)))
            except ChannelClosed:
                pass

        cancel = self.bridge.submit_stream(call, event)
        with self._lock:
            self._bls_streams[call_id] = cancel

    def _send_cancel(self, token: int) -> None:
        """The client of a decoupled request went away: the model's `is_cancelled()` turns true."""
        channel = self._channel
        if channel is not None:
            try:
                channel.send(("cancel", token, None))
            except ChannelClosed:
                pass

    def _serve_notify(self, method: str, args: tuple) -> None:
        try:
            if method == "log":
                emit_log(*args)
            elif method == "record":
                emit_record(*args)
            elif method == "metric_update":
                runtime_store().update(*args)
            elif method == "bls_cancel":
                with self._lock:
                    cancel = self._bls_streams.get(args[0])
                if cancel is not None:
                    cancel()
        except Exception as exc:  # noqa: BLE001 - a bad notification never stops the reader
            log.error("model instance '%s': %s notification refused: %s", self.name, method, exc)

    # -- execution ----------------------------------------------------------------------------------------

    def _ensure_started(self) -> None:
        if (self._healthy and self._reading) or self._closing:
            return
        log.error("Stub process '%s' is unhealthy and it will be restarted.", self.name)
        self._reap()
        self._start()

    def execute(self, requests: list[InferRequest]) -> list[InferOutcome]:
        try:
            self._ensure_started()
        except ModelProcessError as exc:
            error = internal(f"Stub process '{self.name}' is not healthy. Restarting it failed: {exc}")
            return [error] * len(requests)
        tokens = [self.routes.open(r) for r in requests] if self.decoupled else [None] * len(requests)
        payloads = [conversion.request_payload(r, t) for r, t in zip(requests, tokens)]
        batch = next(self._ids)
        waiter = self._register(batch)
        channel = self._channel
        if waiter is None or channel is None:
            self._forget(tokens)
            return [internal(f"Stub process '{self.name}' is not healthy.")] * len(requests)
        try:
            channel.send(("execute", batch, payloads))
        except ChannelClosed:
            pass  # the reader wakes the waiter with "gone"
        sent = time.monotonic_ns()
        for request in requests:
            request.compute_input_end_ns = sent
        waiter.event.wait()
        received = time.monotonic_ns()
        for request in requests:
            request.compute_infer_end_ns = received
        if isinstance(waiter.value, tuple) and waiter.value and waiter.value[0] == "gone":
            self._forget(tokens)
            return [internal(waiter.value[1])] * len(requests)
        outcomes = conversion.outcomes(waiter.value, requests)
        self._forget([t for t, o in zip(tokens, outcomes) if isinstance(o, InferenceError)])
        return outcomes

    def _forget(self, tokens: list[int | None]) -> None:
        """Requests that failed with their batch: the batcher ends their streams."""
        for token in tokens:
            if token is not None:
                self.routes.forget(token)

    def is_ready(self) -> bool:
        """The model's own is_ready() (True when it has none); False when its process is gone."""
        if not self._healthy or self._channel is None:
            return False
        ident = next(self._ids)
        waiter = self._register(ident)
        if waiter is None:
            return False
        try:
            self._channel.send(("is_ready", ident, None))
        except ChannelClosed:
            return False
        waiter.event.wait()
        return waiter.value is True


def _exit_message(name: str, code: int | None) -> str:
    return f"Failed to initialize Python stub for '{name}': the model process exited (status {code})"
