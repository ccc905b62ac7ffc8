"""The runtime's InferRequest / InferResponse / InferenceError <-> the python backend's payloads.

Serving-process side only. Python models see what Triton's python backend gives them: request
parameters without the ones the HTTP frontend consumed, as compact JSON; the requested output
names (every output of the config when the client asked for none); correlation id, flags and the
timeout in microseconds.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from ...errors import ErrorCode, InferenceError
from ...inference import InferOutcome, InferRequest, InferResponse
from ...model_io import ModelIO
from ...protocol.codec import FRONTEND_PARAMETERS, array_from_buffer, tensor_datatype
from .host import TensorPayload
from .model_runner import OutcomePayload, RequestPayload

# TRITONSERVER_Error_Code numbers (pb_utils.TritonError codes) <-> the runtime's ErrorCode.
CODE_NUMBERS: dict[ErrorCode, int] = {
    ErrorCode.UNKNOWN: 0,
    ErrorCode.INTERNAL: 1,
    ErrorCode.NOT_FOUND: 2,
    ErrorCode.INVALID_ARG: 3,
    ErrorCode.UNAVAILABLE: 4,
    ErrorCode.UNSUPPORTED: 5,
    ErrorCode.ALREADY_EXISTS: 6,
    ErrorCode.CANCELLED: 7,
}
CODES: dict[int, ErrorCode] = {n: c for c, n in CODE_NUMBERS.items()}


def error_code(number: int) -> ErrorCode:
    return CODES.get(int(number), ErrorCode.INTERNAL)


def tensor_payload(name: str, array: np.ndarray) -> TensorPayload:
    return name, array, tensor_datatype(array)


def runtime_array(array: np.ndarray, datatype: str) -> np.ndarray:
    """A payload array as the runtime carries it (BF16 gets the codec's tagged dtype)."""
    if datatype == "BF16" and tensor_datatype(array) != "BF16":
        contiguous = np.ascontiguousarray(array)
        return array_from_buffer(memoryview(contiguous).cast("B"), "BF16", contiguous.shape)
    return array


def model_parameters(parameters: dict[str, Any], frontend: bool = True) -> str:
    """What `request.parameters()` returns: the request's parameters minus the ones the v2 infer
    frontend consumed (`frontend`), as the core's compact JSON."""
    kept = {k: v for k, v in parameters.items() if not (frontend and k in FRONTEND_PARAMETERS)}
    return json.dumps(kept, separators=(",", ":"))


def request_payload(request: InferRequest, token: int | None = None) -> RequestPayload:
    """`token`: where a decoupled model's responses to this request go (streams.py)."""
    requested = None if request.requested_outputs is None else [o.name for o in request.requested_outputs]
    return (
        request.id,
        request.correlation_id,
        [tensor_payload(name, array) for name, array in request.inputs.items()],
        requested,
        request.flags,
        request.timeout_us,
        model_parameters(request.parameters, request.frontend_parameters),
        token,
    )


def outcome(payload: OutcomePayload, request: InferRequest) -> InferOutcome:
    if payload[0] == "ok":
        outputs = {name: runtime_array(array, datatype) for name, array, datatype in payload[1]}
        return InferResponse(request.model_name, request.model_version, outputs, id=request.id)
    return InferenceError(payload[1], error_code(payload[2]))


def outcomes(payloads: Sequence[OutcomePayload], requests: Sequence[InferRequest]) -> list[InferOutcome]:
    return [outcome(p, r) for p, r in zip(payloads, requests)]


def response_payload(response: InferResponse, io: ModelIO | None = None) -> tuple:
    """A BLS call's result for the calling model: its outputs in the order the called model's
    Triton backend gives them (`io`: the called model's ModelIO; None: as they are)."""
    names = list(response.outputs) if io is None else io.response_order(response.outputs)
    return ("ok", [tensor_payload(name, response.outputs[name]) for name in names])


def error_payload(error: InferenceError) -> tuple:
    return ("error", error.message, CODE_NUMBERS.get(error.code, 1))
