"""`pb_utils.InferenceResponse` (infer_response.cc): output tensors, or an error."""

from __future__ import annotations

from typing import Any

from .tensor import Tensor, to_payload
from .triton_error import TritonError

_SIGNATURE = (
    "    1. c_python_backend_utils.InferenceResponse(output_tensors: List[c_python_backend_utils.Tensor] = [], "
    "error: c_python_backend_utils.TritonError = None)"
)


class InferenceResponse:
    __slots__ = ("_error", "_outputs")

    def __init__(self, output_tensors: Any = None, error: Any = None) -> None:
        outputs = [] if output_tensors is None else output_tensors
        if not isinstance(outputs, (list, tuple)) or not all(isinstance(t, Tensor) for t in outputs):
            raise _incompatible(output_tensors, error)
        if error is not None and not isinstance(error, TritonError):
            raise _incompatible(output_tensors, error)
        self._outputs = list(outputs)
        self._error = error

    def output_tensors(self) -> list[Tensor]:
        return list(self._outputs)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def __repr__(self) -> str:
        if self._error is not None:
            return f"<pb_utils.InferenceResponse error={self._error!r}>"
        return f"<pb_utils.InferenceResponse outputs={[t.name() for t in self._outputs]}>"


def _incompatible(outputs: Any, error: Any) -> TypeError:
    return TypeError(
        "__init__(): incompatible constructor arguments. The following argument types are supported:\n"
        f"{_SIGNATURE}\n\nInvoked with: {outputs!r}, {error!r}"
    )


def outcome_payload(response: InferenceResponse, requested: Any) -> tuple:
    """A response as it crosses the model boundary: ("error", message, code) for an error
    response, else ("ok", tensors) with the outputs pruned to the `requested` names (the first
    tensor of a name wins), as the python backend prunes them."""
    error = response.error()
    if error is not None:
        return ("error", error.message(), int(error.code()))
    wanted = set(requested)
    outputs = []
    seen: set[str] = set()
    for tensor in response.output_tensors():
        name = tensor.name()
        if name in wanted and name not in seen:
            seen.add(name)
            outputs.append(to_payload(tensor))
    return ("ok", outputs)
