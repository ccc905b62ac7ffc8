"""The model process: `python -m handlers.backends.python.stub <socket fd> [portable]`.

Triton runs every Python-model instance in its own stub process; so does this runtime. The
process serves one instance: it receives `init` (model file, config, instance), loads the model
(`ModelRunner`), answers `execute` batches in order, and leaves after `finalize` or when the
serving process goes away (end of stream). BLS calls, `is_model_ready`, logs and metrics travel
to the serving process over the same socket (`StubHost`), so a model blocked in a BLS call only
waits for its answer. SIGINT/SIGTERM are ignored, as Triton's stub ignores them: the serving
process decides when the instance finalizes.

Messages (tuples): serving process -> stub: ("init", 0, dict), ("execute", id, [RequestPayload]),
("is_ready", id, None), ("reply", call id, ("ok", value) | ("error", message)), ("stream", call
id, (OutcomePayload | None, final)) for a decoupled BLS call, ("cancel", token, None) when the
client of a decoupled request went away, ("finalize", 0, None). Stub -> serving process: ("ready",
0, None), ("init_failed", 0, message), ("result", id, [OutcomePayload]), ("response", token,
(OutcomePayload | None, final)) from a decoupled model's response senders, ("answer", id, value),
("call", call id, (method, args)), ("notify", 0, (method, args)), ("finalized", 0, None).
"""

from __future__ import annotations

import itertools
import logging
import queue
import signal
import socket
import sys
import threading
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

from ... import huge_pages
from . import host
from .host import BlsCall, BlsOutcome, BlsStream
from .ipc import Channel, ChannelClosed
from .model_runner import ModelLoadError, ModelRunner
from .triton_error import TritonModelException


class _RemoteMetrics:
    """host.MetricsBackend over the socket: creation and reads wait for the answer (they can
    fail), updates are sent without waiting (pb_utils.Metric checks them first)."""

    def __init__(self, stub_host: StubHost) -> None:
        self._host = stub_host

    def family(self, name: str, description: str, kind: int) -> int:
        return self._host.call("metric_family", name, description, kind)

    def metric(self, family: int, labels: dict[str, str], buckets: list[float] | None) -> int:
        return self._host.call("metric_new", family, labels, buckets)

    def update(self, metric: int, operation: str, value: float) -> None:
        self._host.notify("metric_update", metric, operation, value)

    def value(self, metric: int) -> float:
        return self._host.call("metric_value", metric)


class StubHost:
    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._waiting: dict[int, Any] = {}
        self._closed = False
        self.metrics = _RemoteMetrics(self)
        self._streams: dict[int, BlsStream] = {}  # decoupled BLS calls in flight
        self._cancelled: set[int] = set()  # response tokens whose client went away

    # -- a decoupled model's responses (request.ResponseChannel) ------------------------------------

    def send(self, token: int, payload: Any, final: bool) -> None:
        if final:
            with self._lock:
                self._cancelled.discard(token)
        try:
            self.channel.send(("response", token, (payload, final)))
        except ChannelClosed:
            raise TritonModelException("Unable to send response: the serving process is gone.") from None

    def is_cancelled(self, token: int) -> bool:
        with self._lock:
            return token in self._cancelled

    def cancelled(self, token: int) -> None:
        with self._lock:
            self._cancelled.add(token)

    # -- calls to the serving process ---------------------------------------------------------------

    def call(self, method: str, *args: Any) -> Any:
        """Ask the serving process and wait; ("error", message) answers raise ValueError."""
        event = threading.Event()
        box: list[Any] = []
        call_id = next(self._ids)
        with self._lock:
            if self._closed:
                raise TritonModelException("the serving process is gone")
            self._waiting[call_id] = (event, box)
        self.channel.send(("call", call_id, (method, args)))
        event.wait()
        status, value = box[0]
        if status == "error":
            raise ValueError(value)
        return value

    def notify(self, method: str, *args: Any) -> None:
        try:
            self.channel.send(("notify", 0, (method, args)))
        except ChannelClosed:
            pass

    def infer(self, call: BlsCall) -> BlsOutcome:
        try:
            return self.call("infer", call)
        except ValueError as exc:
            raise TritonModelException(str(exc)) from None

    def infer_async(self, call: BlsCall) -> Awaitable[BlsOutcome]:
        import asyncio

        loop = asyncio.get_running_loop()
        future = loop.create_future()
        call_id = next(self._ids)
        with self._lock:
            if self._closed:
                raise TritonModelException("the serving process is gone")
            self._waiting[call_id] = (loop, future)
        self.channel.send(("call", call_id, ("infer", (call,))))
        return future

    def infer_stream(self, call: BlsCall) -> BlsStream:
        stream = BlsStream()
        call_id = next(self._ids)
        with self._lock:
            if self._closed:
                raise TritonModelException("the serving process is gone")
            self._streams[call_id] = stream
        stream.set_cancel(lambda: self.notify("bls_cancel", call_id))
        self.channel.send(("call", call_id, ("infer_stream", (call,))))
        return stream

    def stream_event(self, call_id: int, payload: Any, final: bool) -> None:
        with self._lock:
            stream = self._streams.pop(call_id, None) if final else self._streams.get(call_id)
        if stream is not None:
            stream.put(payload, final)

    def is_model_ready(self, name: str, version: str) -> bool:
        try:
            return bool(self.call("is_model_ready", name, version))
        except ValueError as exc:
            raise TritonModelException(f"Failed to check model readiness: {exc}") from None

    def log(self, level: int, message: str, filename: str, lineno: int) -> None:
        self.notify("log", level, message, filename, lineno)

    # -- answers (reader thread) ----------------------------------------------------------------------

    def answer(self, call_id: int, reply: Any) -> None:
        with self._lock:
            waiter = self._waiting.pop(call_id, None)
        if waiter is None:
            return
        first, second = waiter
        if isinstance(first, threading.Event):
            second.append(reply)
            first.set()
        else:  # an async BLS call: (loop, future); its answer is the outcome itself
            status, value = reply
            first.call_soon_threadsafe(_settle, second, value, status)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            waiting, self._waiting = self._waiting, {}
            streams, self._streams = self._streams, {}
        for stream in streams.values():
            stream.put(("error", "the serving process is gone", 1), True)
        for first, second in waiting.values():
            gone = ("error", "the serving process is gone")
            if isinstance(first, threading.Event):
                second.append(gone)
                first.set()
            else:
                first.call_soon_threadsafe(_settle, second, gone[1], "error")


def _settle(future: Any, value: Any, status: str) -> None:
    if future.done():
        return
    if status == "error":
        future.set_exception(TritonModelException(value))
    else:
        future.set_result(value)


class _ForwardLogs(logging.Handler):
    """Log records of the model process (the model's own `logging` calls, the runner's errors)
    go to the serving process's log."""

    def __init__(self, stub_host: StubHost) -> None:
        super().__init__()
        self._host = stub_host

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info:
                message += "\n" + logging.Formatter().formatException(record.exc_info)
            self._host.notify("record", record.levelno, message, record.pathname, record.lineno, record.name)
        except Exception:  # noqa: BLE001 - logging must never fail the model
            self.handleError(record)


def _read(channel: Channel, stub_host: StubHost, work: queue.Queue[Any]) -> None:
    try:
        while True:
            kind, ident, payload = channel.receive()
            if kind == "reply":
                stub_host.answer(ident, payload)
            elif kind == "stream":
                stub_host.stream_event(ident, *payload)
            elif kind == "cancel":
                stub_host.cancelled(ident)
            else:
                work.put((kind, ident, payload))
    except ChannelClosed:
        pass
    finally:
        stub_host.close()
        work.put(("gone", 0, None))


def serve(channel: Channel) -> int:
    kind, _, init = channel.receive()
    if kind != "init":
        return 2
    stub_host = StubHost(channel)
    host.install_host(stub_host)
    root = logging.getLogger()
    root.handlers[:] = [_ForwardLogs(stub_host)]
    root.setLevel(init.get("log_level", logging.WARNING))
    runner = ModelRunner(
        model_file=Path(init["model_file"]),
        model_dir=Path(init["model_dir"]),
        version=init["version"],
        config=init["config"],
        instance_name=init["instance_name"],
        kind=init["kind"],
        device_id=init["device_id"],
        responses=stub_host,
    )
    host.set_process_context(runner.context.with_phase(host.Phase.EXECUTE))
    work: queue.Queue[Any] = queue.Queue()
    threading.Thread(target=_read, args=(channel, stub_host, work), name="stub-reader", daemon=True).start()
    try:
        runner.load()
    except ModelLoadError as exc:
        channel.send(("init_failed", 0, str(exc)))
        return 1
    channel.send(("ready", 0, None))
    huge_pages.start()  # what the model loaded (its framework's weights) on huge pages
    while True:
        kind, ident, payload = work.get()
        if kind == "execute":
            channel.send(("result", ident, runner.execute(payload)))
        elif kind == "is_ready":
            channel.send(("answer", ident, runner.is_ready()))
        elif kind == "finalize":
            runner.finalize()
            channel.send(("finalized", 0, None))
            return 0
        elif kind == "gone":  # the serving process went away without finalize
            runner.finalize()
            return 0


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=int(argv[0]))
    # "portable": another environment's interpreter (execution_env.py) whose numpy may differ
    channel = Channel(sock, portable=argv[1:2] == ["portable"])
    try:
        return serve(channel)
    except ChannelClosed:
        return 0
    finally:
        channel.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
