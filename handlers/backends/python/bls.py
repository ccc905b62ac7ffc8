"""BLS in the serving process: a Python model's `InferenceRequest(...).exec()` runs another model
of the same repository through that model's scheduler (its dynamic batcher), like any request.

`attach_repository(repository)` tells the python backend which `ModelRepository` its models
belong to (the repository calls it when it is created). `BlsBridge.submit` never blocks: the
request is validated as a client request would be and queued with a callback, so a model process
waiting for its BLS answer holds no thread of the serving process, and chains of BLS calls (A calls
B calls C) cannot deadlock. (A model calling itself while all its instances are busy waits for one
of them, as in Triton.)

Messages follow Triton's python backend (request_executor.cc): a request that cannot be queued
(model not ready, invalid request) fails with "Model <name> - Error when running inference: ...";
an error from the model's execution comes back as the model produced it. Deviation: Triton 2.51
reports every BLS error with code INTERNAL; the error's own code is kept here (see
docs/python-backend.md).

Decoupled calls (`exec(decoupled=True)`): `submit_stream` delivers every event of the callee
(one final event for a model that is not decoupled) as (payload, final); `exec()` without
`decoupled=True` on a decoupled model is refused with Triton's message.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable
from typing import Any

from ...errors import InferenceError, internal, not_found, unavailable
from ...inference import InferOutcome, InferRequest, RequestedOutput
from ...protocol.validation import validate_request
from ...streaming import ResponseSink, StreamEvent
from .conversion import error_payload, response_payload, runtime_array
from .host import BlsCall, BlsOutcome

_repositories: dict[int, weakref.ReferenceType[Any]] = {}
_latest: weakref.ReferenceType[Any] | None = None
_lock = threading.Lock()


def attach_repository(repository: Any) -> None:
    """Register the repository whose models' BLS calls this process serves."""
    global _latest
    ref = weakref.ref(repository)
    with _lock:
        for spec in repository.manifest.models.values():
            _repositories[id(spec)] = ref
        _latest = ref


def repository_for(spec: Any) -> Any:
    with _lock:
        ref = _repositories.get(id(spec)) or _latest
    return ref() if ref is not None else None


class BlsBridge:
    """BLS calls of one model, against its repository (resolved when the first call comes, so a
    repository attached after the instances were created still works)."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec

    @property
    def repository(self) -> Any:
        repository = repository_for(self.spec)
        if repository is None:
            raise internal(
                f"model '{self.spec.name}' made a BLS call but no model repository is attached to the python "
                "backend (handlers.backends.python.attach_repository)"
            )
        return repository

    def submit(self, call: BlsCall, done: Callable[[BlsOutcome], None]) -> None:
        """Queue the call; `done(outcome)` is called exactly once, possibly before this returns."""
        prefix = f"Model {call.model_name} - Error when running inference: "
        try:
            model = self._resolve(call)
            if model.spec.decoupled:
                raise internal(
                    f"Model {call.model_name} is using the decoupled. The current BLS request call doesn't support "
                    "models using the decoupled transaction policy. Please use 'decoupled=True' argument to the "
                    "'exec' or 'async_exec' calls for decoupled models.'"
                )
            request = self._request(call, model)
            validate_request(model.spec.config, request)
        except InferenceError as exc:
            done(error_payload(InferenceError(prefix + exc.message, exc.code)))
            return
        except Exception as exc:  # noqa: BLE001 - a malformed call must not take the caller down
            done(error_payload(internal(prefix + f"{type(exc).__name__}: {exc}")))
            return

        def finished(outcome: InferOutcome) -> None:
            done(error_payload(outcome) if isinstance(outcome, InferenceError) else response_payload(outcome, model.io))

        scheduler = getattr(model, "scheduler", None) or getattr(model, "batcher", None)
        submit = getattr(scheduler, "submit", None)
        if submit is not None:
            try:
                submit(request, finished)
            except InferenceError as exc:  # queue full, stopping, batch too large: never queued
                done(error_payload(InferenceError(prefix + exc.message, exc.code)))
            return
        # Schedulers without a callback API (ensembles) run on the bridge's event loop thread.
        future = asyncio.run_coroutine_threadsafe(model.infer(request), _background_loop())

        def settle(f: Any) -> None:
            try:
                finished(f.result())
            except InferenceError as exc:
                finished(exc)
            except Exception as exc:  # noqa: BLE001
                finished(internal(f"{type(exc).__name__}: {exc}"))

        future.add_done_callback(settle)

    def submit_stream(self, call: BlsCall, on_event: Callable[[BlsOutcome | None, bool], None]) -> Callable[[], None]:
        """Queue a decoupled call: `on_event(payload, final)` gets each response (BlsOutcome), each
        error, and a flag-only final as None, in order, ending with final=True. Returns the call's
        cancel."""
        prefix = f"Model {call.model_name} - Error when running inference: "
        called: list[Any] = []  # the called model, once resolved (its ModelIO orders the outputs)

        def deliver(event: StreamEvent) -> None:
            if event.error is not None:
                payload: BlsOutcome | None = error_payload(event.error)
            elif event.response is not None:
                payload = response_payload(event.response, called[0].io if called else None)
            else:
                payload = None
            on_event(payload, event.final)

        sink = ResponseSink(deliver)
        try:
            model = self._resolve(call)
            called.append(model)
            request = self._request(call, model)
            validate_request(model.spec.config, request)
            model.submit_stream(request, sink, _background_loop())
        except InferenceError as exc:  # never queued
            sink.finish(InferenceError(prefix + exc.message, exc.code))
        except Exception as exc:  # noqa: BLE001 - a malformed call must not take the caller down
            sink.finish(internal(prefix + f"{type(exc).__name__}: {exc}"))
        return sink.cancel

    def _resolve(self, call: BlsCall) -> Any:
        repository = self.repository
        not_ready = f"Failed for execute the inference request. Model '{call.model_name}' is not ready."
        by_version = repository.models.get(call.model_name)
        if by_version is None:
            raise not_found(not_ready)
        if call.model_version == -1:
            ready = repository.ready_versions(call.model_name)
            if not ready:
                raise unavailable(not_ready)
            return by_version[ready[-1]]
        model = by_version.get(call.model_version)
        if model is None:
            raise not_found(not_ready)
        if not model.ready:
            raise unavailable(not_ready)
        return model

    @staticmethod
    def _request(call: BlsCall, model: Any) -> InferRequest:
        requested = [RequestedOutput(name) for name in call.requested_output_names] or None
        return InferRequest(
            model_name=model.name,
            model_version=model.version,
            inputs={name: runtime_array(array, datatype) for name, array, datatype in call.inputs},
            requested_outputs=requested,
            id=call.request_id,
            parameters=dict(call.parameters or {}),
            timeout_us=int(call.timeout_us),
            correlation_id=call.correlation_id,
            flags=int(call.flags),
        )

    def call(self, call: BlsCall) -> BlsOutcome:
        """Blocking form, for in-process models (called from their batcher worker thread)."""
        done = threading.Event()
        box: list[BlsOutcome] = []

        def finished(outcome: BlsOutcome) -> None:
            box.append(outcome)
            done.set()

        self.submit(call, finished)
        done.wait()
        return box[0]

    def is_model_ready(self, name: str, version: str) -> bool:
        repository = self.repository
        ready = repository.ready_versions(name)
        if version == "":
            return bool(ready)
        try:
            return int(version) in ready
        except ValueError:
            return False


_loop: asyncio.AbstractEventLoop | None = None


def _background_loop() -> asyncio.AbstractEventLoop:
    global _loop
    with _lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            threading.Thread(target=loop.run_forever, name="python-bls-loop", daemon=True).start()
            _loop = loop
        return _loop
