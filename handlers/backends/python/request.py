"""`pb_utils.InferenceRequest` (infer_request.cc): the requests `execute` receives, and the
requests a model builds to call another model (BLS: `exec()` / `async_exec()`).

Constructor, accessors and error messages follow tritonserver 2.51's pybind class: keyword
arguments `request_id=''`, `correlation_id=0`, `inputs`, `requested_output_names`, `model_name`
(the last three required), `model_version=-1`, `flags=0`, `timeout=0` (microseconds),
`preferred_memory`, `trace`, `parameters` (a dict of bool/int/str, exposed as a JSON string).

BLS errors come back inside the response (`response.has_error()`), never raised, as in Triton;
calling BLS from `initialize`/`finalize` raises TritonModelException as in Triton.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from enum import IntEnum
from typing import Any

from . import host
from .response import InferenceResponse
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


class InferenceResponseSender:
    """A non-decoupled request's response sender: one response, then (optionally) the final flag.
    Decoupled models are not supported, so a second response is refused as Triton refuses it for
    non-decoupled models. The response reaches the client when `execute` returns."""

    __slots__ = ("_closed", "_response")

    def __init__(self) -> None:
        self._response: InferenceResponse | None = None
        self._closed = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        if response is not None and not isinstance(response, InferenceResponse):
            raise TypeError(f"send(): response must be a pb_utils.InferenceResponse, got {type(response)}")
        if self._closed:
            raise TritonModelException("Unable to send response. Response sender has been closed.")
        if response is not None:
            if self._response is not None:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send more than one response."
                )
            self._response = response
        if flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            if self._response is None:
                raise TritonModelException(
                    "Unable to send response. Non-decoupled model cannot send complete final before sending a "
                    "response."
                )
            self._closed = True

    def is_cancelled(self) -> bool:
        return False

    @property
    def sent(self) -> InferenceResponse | None:
        return self._response


class ResponseIterator:
    """What `exec(decoupled=True)` returns: the responses of the call (one, here)."""

    def __init__(self, responses: list[InferenceResponse]) -> None:
        self._responses = list(responses)

    def __iter__(self) -> Iterator[InferenceResponse]:
        return self

    def __next__(self) -> InferenceResponse:
        if not self._responses:
            raise StopIteration
        return self._responses.pop(0)

    def cancel(self) -> None:
        self._responses.clear()


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
    ) -> InferenceRequest:
        """A request as `execute` receives it (parameters already a JSON string)."""
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
        request._sender = InferenceResponseSender()
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
        return False

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
                "Request rescheduling (TRITONSERVER_REQUEST_RELEASE_RESCHEDULE) needs sequence batching or a "
                "decoupled model, which this runtime does not support"
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
        call = self._bls_call()
        current = _bls_host()
        response = response_from_outcome(current.infer(call))
        return ResponseIterator([response]) if decoupled else response

    def async_exec(self, decoupled: bool = False) -> Any:
        """An asyncio Future (of the running loop) resolving to the response."""
        import asyncio

        call = self._bls_call()
        current = _bls_host()
        loop = asyncio.get_running_loop()
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
                response = response_from_outcome(done.result())
                result.set_result(ResponseIterator([response]) if decoupled else response)

        asyncio.ensure_future(inner, loop=loop).add_done_callback(settle)
        return result

    def __repr__(self) -> str:
        return f"<pb_utils.InferenceRequest model={self._model_name!r} id={self._request_id!r}>"


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
