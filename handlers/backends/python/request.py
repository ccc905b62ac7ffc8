"""`pb_utils.InferenceRequest` (infer_request.cc): the requests `execute` receives, and the
requests a model builds to call another model (BLS: `exec()` / `async_exec()`).

Constructor, accessors and error messages follow tritonserver 2.51's pybind class: keyword
arguments `request_id=''`, `correlation_id=0`, `inputs`, `requested_output_names`, `model_name`
(the last three required), `model_version=-1`, `flags=0`, `timeout=0` (microseconds),
`preferred_memory`, `trace`, `parameters` (a dict of bool/int/str, exposed as a JSON string).

BLS errors come back inside the response (`response.has_error()`), never raised, as in Triton;
calling BLS from `initialize`/`finalize` raises TritonModelException as in Triton.

Response senders (`request.get_response_sender()`, response_sender.cc): a model that is not
decoupled may send one response (and the final flag) before `execute` returns; a decoupled model
sends any number, from any thread, until the final flag, with Triton's messages for a sender used
wrongly. A decoupled sender that is dropped (garbage-collected) while its request is still open
ends the request's stream with an error, where tritonserver would leave the client waiting forever.
`exec(decoupled=True)` returns a `ResponseIterator` over the callee's responses as they arrive.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Iterator
from enum import IntEnum
from typing import Any, Protocol

from . import host
from .response import InferenceResponse, outcome_payload
from .tensor import Tensor, to_payload
from .triton_error import TritonError, TritonModelException

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


class MemoryType(IntEnum):
    TRITONSERVER_MEMORY_GPU = 2
    TRITONSERVER_MEMORY_CPU = 0


TRITONSERVER_MEMORY_GPU = MemoryType.TRITONSERVER_MEMORY_GPU
TRITONSERVER_MEMORY_CPU = MemoryType.TRITONSERVER_MEMORY_CPU


class PreferredMemory:
    """Accepted for compatibility; BLS outputs are always in host memory here."""

    def __init__(self, preferred_memory_type: MemoryType, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class InferenceTrace:
    """Accepted for compatibility: requests are not traced here (`get_context()` is None)."""

    def get_context(self) -> Any:
        return None


_SEND_SIGNATURE = (
    "    1. (self: c_python_backend_utils.InferenceResponseSender, response: "
    "c_python_backend_utils.InferenceResponse = None, flags: int = 0) -> None"
)


def _check_send_arguments(sender: Any, response: Any, flags: Any) -> None:
    """pybind11's argument check, then CheckResponseSenderArguments (response_sender.cc)."""
    if (response is not None and not isinstance(response, InferenceResponse)) or type(flags) is not int:
        raise TypeError(
            "send(): incompatible function arguments. The following argument types are supported:\n"
            f"{_SEND_SIGNATURE}\n\nInvoked with: {sender!r}, {response!r}; kwargs: flags={flags!r}"
        )
    if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
        raise TritonModelException("Unable to send response. Unsupported flag provided.")
    if flags == 0 and response is None:
        raise TritonModelException(
            "Inference Response object must be provided when the response flags is set to zero."
        )


class InferenceResponseSender:
    """A non-decoupled request's response sender: one response, then (optionally) the final flag,
    refused beyond that as Triton refuses it. The response reaches the client when `execute`
    returns."""

    __slots__ = ("_closed", "_response")

    def __init__(self) -> None:
        self._response: InferenceResponse | None = None
        self._closed = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        _check_send_arguments(self, response, flags)
        if response is not None and self._response is not None:
            raise TritonModelException(
                "Unable to send response. Non-decoupled model cannot send more than one response."
            )
        if response is None and self._response is None:
            raise TritonModelException(
                "Unable to send response. Non-decoupled model cannot send complete final before sending a "
                "response."
            )
        if self._closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        if response is not None:
            self._response = response
        if flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self._closed = True

    def is_cancelled(self) -> bool:
        return False

    @property
    def sent(self) -> InferenceResponse | None:
        return self._response

    def __repr__(self) -> str:
        return f"<c_python_backend_utils.InferenceResponseSender object at {id(self):#x}>"


class ResponseChannel(Protocol):
    """Where a decoupled model's responses go: the serving process's routes (in-process
    instances) or the model process's socket (stub.py). `payload` is an OutcomePayload, or None
    for a flag-only final."""

    def send(self, token: int, payload: Any, final: bool) -> None: ...

    def is_cancelled(self, token: int) -> bool: ...


INTERNAL = 1  # TRITONSERVER_ERROR_INTERNAL
log = logging.getLogger("handlers.python")


class DecoupledResponseSender(InferenceResponseSender):
    """A decoupled request's response sender (pb_utils.InferenceResponseSender): any number of
    responses, from any thread, until the final flag; outputs pruned to the requested ones."""

    __slots__ = ("_channel", "_lock", "_owner", "_requested", "_token")

    def __init__(self, channel: ResponseChannel, token: int, requested: list[str], owner: str) -> None:
        super().__init__()
        self._channel = channel
        self._token = token
        self._requested = requested
        self._owner = owner  # the model instance's name, for messages
        self._lock = threading.Lock()
        _start_janitor()

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        _check_send_arguments(self, response, flags)
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        payload = None if response is None else outcome_payload(response, self._requested)
        with self._lock:  # the order of sends is the order of the stream, and nothing after final
            if self._closed:
                raise TritonModelException("Unable to send response. Response sender has been closed.")
            if final:
                self._closed = True
            self._channel.send(self._token, payload, final)

    def is_cancelled(self) -> bool:
        return self._channel.is_cancelled(self._token)

    @property
    def sent(self) -> InferenceResponse | None:
        return None

    def _close(self) -> None:
        """Refuse further sends (the request failed with its batch; the server ends it)."""
        with self._lock:
            self._closed = True

    def _fail(self, message: str) -> None:
        """End the request with an error unless the model ended it."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._channel.send(self._token, ("error", message, INTERNAL), True)

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            # Never send from a finalizer (it may run inside another send holding locks): the
            # janitor thread sends the error that ends the stream.
            _orphans.put((self._channel, self._token, (
                f"Python model '{self._owner}' released the response sender of this request without sending "
                "TRITONSERVER_RESPONSE_COMPLETE_FINAL: no further response will come"
            )))


_orphans: queue.SimpleQueue[tuple[ResponseChannel, int, str]] = queue.SimpleQueue()
_janitor: threading.Thread | None = None
_janitor_lock = threading.Lock()


def _start_janitor() -> None:
    global _janitor
    if _janitor is not None:
        return
    with _janitor_lock:
        if _janitor is None:
            _janitor = threading.Thread(target=_end_orphans, name="pb-response-janitor", daemon=True)
            _janitor.start()


def _end_orphans() -> None:
    while True:
        channel, token, message = _orphans.get()
        try:
            channel.send(token, ("error", message, INTERNAL), True)
        except Exception:  # noqa: BLE001 - the serving process may be gone
            log.debug("could not end an abandoned response stream", exc_info=True)


class ResponseSource(Protocol):
    """The responses of a decoupled BLS call as they arrive (host.BlsStream)."""

    def get(self) -> tuple[Any, bool]: ...

    def cancel(self) -> None: ...


class ResponseIterator:
    """What `exec(decoupled=True)` returns (pb_response_iterator.cc): the callee's responses as
    they arrive, each an InferenceResponse (an error response for an error; an empty one for a
    flag-only final). Iterating again after the end starts over from the first response."""

    def __init__(self, source: ResponseSource | list[InferenceResponse]) -> None:
        self._responses: list[InferenceResponse] = []
        self._index = 0
        if isinstance(source, list):  # a finished list of responses
            self._source: ResponseSource | None = None
            self._responses = list(source)
            self._finished = True
        else:
            self._source = source
            self._finished = False

    def __iter__(self) -> Iterator[InferenceResponse]:
        if self._finished and self._index >= len(self._responses):
            self._index = 0
        return self

    def __next__(self) -> InferenceResponse:
        if self._finished:
            if self._index < len(self._responses):
                self._index += 1
                return self._responses[self._index - 1]
            raise StopIteration
        payload, final = self._source.get()  # type: ignore[union-attr]
        response = InferenceResponse() if payload is None else response_from_outcome(payload)
        self._responses.append(response)
        if final:
            self._finished = True
            self._index = len(self._responses)
        return response

    def cancel(self) -> None:
        """Cancel the call (newer tritonservers' ResponseIterator.cancel): the callee sees
        `request.is_cancelled()`, a request still queued leaves the queue."""
        if self._source is not None and not self._finished:
            self._source.cancel()


_REQUIRED: Any = object()
_SIGNATURE = (
    "    1. c_python_backend_utils.InferenceRequest(request_id: str = '', correlation_id: object = 0, inputs: "
    "List[triton::backend::python::PbTensor], requested_output_names: List[str], model_name: str, "
    "model_version: int = -1, flags: int = 0, timeout: int = 0, preferred_memory: "
    "c_python_backend_utils.PreferredMemory = ..., trace: c_python_backend_utils.InferenceTrace = ..., "
    "parameters: object = None)"
)


def _incompatible(args: dict[str, Any]) -> TypeError:
    invoked = ", ".join(f"{k}={v!r}" for k, v in args.items() if v is not _REQUIRED)
    return TypeError(
        "__init__(): incompatible constructor arguments. The following argument types are supported:\n"
        f"{_SIGNATURE}\n\nInvoked with: kwargs: {invoked}"
    )


def _text(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return value
    return value


def parameters_json(parameters: Any) -> str:
    """A BLS request's parameters as Triton stores them (InferRequest constructor, pb_stub)."""
    if parameters is None:
        return "{}"
    if not isinstance(parameters, dict):
        raise TritonModelException(f"Expect N8pybind114dictE, got {type(parameters)}")
    for value in parameters.values():
        if type(value) not in (bool, int, str):
            raise TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}"
            )
    return json.dumps(parameters)


class InferenceRequest:
    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: list[Tensor] = _REQUIRED,
        requested_output_names: list[str] = _REQUIRED,
        model_name: str = _REQUIRED,
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
        parameters: dict[str, bool | int | str] | None = None,
    ) -> None:
        # pybind11 takes bytes for str arguments (Triton's BLS example passes a BYTES input element
        # as model_name), so bytes are decoded as UTF-8 here too.
        request_id, model_name = _text(request_id), _text(model_name)
        if isinstance(requested_output_names, (list, tuple)):
            requested_output_names = [_text(n) for n in requested_output_names]
        args = {
            "request_id": request_id, "correlation_id": correlation_id, "inputs": inputs,
            "requested_output_names": requested_output_names, "model_name": model_name, "model_version": model_version,
            "flags": flags, "timeout": timeout,
        }
        if (
            inputs is _REQUIRED or requested_output_names is _REQUIRED or model_name is _REQUIRED
            or not isinstance(request_id, str) or not isinstance(model_name, str)
            or not isinstance(inputs, list) or not all(isinstance(t, Tensor) for t in inputs)
            or not isinstance(requested_output_names, (list, tuple))
            or not all(isinstance(n, str) for n in requested_output_names)
            or type(model_version) is not int or type(flags) is not int or type(timeout) is not int
            or (preferred_memory is not None and not isinstance(preferred_memory, PreferredMemory))
            or (trace is not None and not isinstance(trace, InferenceTrace))
        ):
            raise _incompatible(args)
        if type(correlation_id) not in (int, str):
            raise TritonModelException("Correlation ID must be integer or string")
        self._request_id = request_id
        self._correlation_id = correlation_id
        self._inputs = list(inputs)
        self._requested = list(dict.fromkeys(requested_output_names))
        self._model_name = model_name
        self._model_version = model_version
        self._flags = flags
        self._timeout = timeout
        self._parameters = parameters_json(parameters)
        self._trace = trace or InferenceTrace()
        self._sender: InferenceResponseSender | None = None
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL

    @classmethod
    def _from_server(
        cls,
        *,
        request_id: str,
        correlation_id: int | str,
        inputs: list[Tensor],
        requested_output_names: list[str],
        model_name: str,
        model_version: int,
        flags: int,
        timeout: int,
        parameters: str,
        sender: InferenceResponseSender | None = None,
    ) -> InferenceRequest:
        """A request as `execute` receives it (parameters already a JSON string); `sender`: its
        response sender (a decoupled model's, else a new one-response sender)."""
        request = cls.__new__(cls)
        request._request_id = request_id
        request._correlation_id = correlation_id
        request._inputs = inputs
        request._requested = requested_output_names
        request._model_name = model_name
        request._model_version = model_version
        request._flags = flags
        request._timeout = timeout
        request._parameters = parameters
        request._trace = InferenceTrace()
        request._sender = InferenceResponseSender() if sender is None else sender
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        return request

    # -- accessors (Triton's names) -----------------------------------------------------------------

    def inputs(self) -> list[Tensor]:
        return list(self._inputs)

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int | str:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = int(flags)

    def timeout(self) -> int:
        return self._timeout

    def parameters(self) -> str:
        return self._parameters

    def requested_output_names(self) -> set[str]:
        return set(self._requested)

    def is_cancelled(self) -> bool:
        """Whether the client cancelled the request (a decoupled model's requests; a request of a
        model that is not decoupled completes when `execute` returns)."""
        return self._sender is not None and self._sender.is_cancelled()

    def trace(self) -> InferenceTrace:
        return self._trace

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise TritonModelException(
                "only the requests passed to execute() have a response sender; this request was built for BLS"
            )
        return self._sender

    def set_release_flags(self, flags: int) -> None:
        if flags == TRITONSERVER_REQUEST_RELEASE_RESCHEDULE:
            raise TritonModelException(
                "Request rescheduling (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) is not supported by this runtime: "
                "send every response of a decoupled model from the execute call (or its threads) that "
                "received the request"
            )
        if flags != TRITONSERVER_REQUEST_RELEASE_ALL:
            raise TritonModelException(f"unknown request release flags {flags}")
        self._release_flags = flags

    # -- runtime access -------------------------------------------------------------------------------

    @property
    def requested_names(self) -> list[str]:
        """The requested outputs in request order (what responses are pruned to)."""
        return self._requested

    @property
    def response_sender(self) -> InferenceResponseSender | None:
        return self._sender

    # -- BLS ----------------------------------------------------------------------------------------------

    def _bls_call(self) -> host.BlsCall:
        context = host.current_context()
        if context is not None and context.phase in (host.Phase.INITIALIZE, host.Phase.FINALIZE, host.Phase.AUTO_COMPLETE):
            raise TritonModelException("BLS is only supported during the 'execute' function.")
        return host.BlsCall(
            model_name=self._model_name,
            model_version=self._model_version,
            inputs=[to_payload(t) for t in self._inputs],
            requested_output_names=list(self._requested),
            request_id=self._request_id,
            correlation_id=self._correlation_id,
            flags=self._flags,
            timeout_us=self._timeout,
            parameters=json.loads(self._parameters),
        )

    def exec(self, decoupled: bool = False) -> InferenceResponse | ResponseIterator:
        """Run the request on its model: its response, or with `decoupled=True` an iterator over
        every response (required for a decoupled model; any model works)."""
        if type(decoupled) is not bool:
            raise TypeError(f"exec(): decoupled must be a bool, got {type(decoupled).__name__}")
        call = self._bls_call()
        current = _bls_host()
        if decoupled:
            return ResponseIterator(current.infer_stream(call))
        return response_from_outcome(current.infer(call))

    def async_exec(self, decoupled: bool = False) -> Any:
        """An asyncio Future (of the running loop) resolving to the response, or with
        `decoupled=True` to a ResponseIterator once the first response has arrived."""
        import asyncio

        if type(decoupled) is not bool:
            raise TypeError(f"async_exec(): decoupled must be a bool, got {type(decoupled).__name__}")
        call = self._bls_call()
        current = _bls_host()
        loop = asyncio.get_running_loop()
        if decoupled:
            return _first_response(loop, current.infer_stream(call))
        result = loop.create_future()
        inner = current.infer_async(call)

        def settle(done: Any) -> None:
            if result.cancelled():
                return
            if done.cancelled():
                result.cancel()
            elif done.exception() is not None:
                result.set_exception(done.exception())
            else:
                result.set_result(response_from_outcome(done.result()))

        asyncio.ensure_future(inner, loop=loop).add_done_callback(settle)
        return result

    def __repr__(self) -> str:
        return f"<pb_utils.InferenceRequest model={self._model_name!r} id={self._request_id!r}>"


def _first_response(loop: Any, stream: host.BlsStream) -> Any:
    """A future of `loop` resolved with the stream's ResponseIterator when its first event has
    arrived (Triton runs the blocking `exec(decoupled=True)` in a thread for `async_exec`)."""
    future = loop.create_future()

    def ready() -> None:
        if not future.done():
            future.set_result(ResponseIterator(stream))

    stream.when_ready(lambda: loop.call_soon_threadsafe(ready))
    return future


def _bls_host() -> host.Host:
    current = host.current_host()
    if current is None:
        raise TritonModelException(
            "BLS needs the serving runtime: this pb_utils module is not running inside a served model"
        )
    return current


def response_from_outcome(outcome: host.BlsOutcome) -> InferenceResponse:
    if outcome[0] == "ok":
        return InferenceResponse([Tensor._wrap(name, array, datatype) for name, array, datatype in outcome[1]])
    return InferenceResponse(error=TritonError(outcome[1], outcome[2]))
