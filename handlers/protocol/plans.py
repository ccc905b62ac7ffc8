"""Request plans: what a repeated request header decodes and validates to, kept per loaded model.

A client sends the same JSON header with every request of a kind: tritonclient and perf_analyzer
with binary tensors repeat the names, datatypes, shapes, binary sizes and requested outputs, and
only the tensor data after the header changes. Once a header has been decoded and validated
against a model (the full path: codec.decode_framing, limits, validation.validate_request), its
plan makes the next request with the same header bytes directly: one array over the new payload
per input (reshaped as validation reshaped it), and the header's own fields (id, parameters and
the flags, priority and timeout they set, requested outputs, batch size). No JSON is parsed and
nothing is validated again: for one model and one header, every check the full path makes is
decided by the header and the payload's size, and a plan is used only for a payload of the
planned size and while the planned tensors are within the element limit.

Planned: headers whose every input is binary data of a fixed-size datatype (not BYTES, not JSON
`data`, not a raw request), up to MAX_HEADER bytes. Anything else, and every request that fails,
takes the full path, which answers as before (the same messages, in the same order). A model keeps
at most MAX_PLANS plans (the oldest goes first), in `LoadedModel.request_plans`, so a reloaded
model starts with none.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import limits
from ..inference import InferRequest, RequestedOutput
from .binary import parse_header_length, split_body
from .codec import Span, array_from_buffer, decode_framing
from .validation import validate_request

if TYPE_CHECKING:
    from ..model_repository import LoadedModel

__all__ = ["MAX_HEADER", "MAX_PLANS", "RequestPlan", "infer_request", "keep", "plan_of"]

MAX_PLANS = 16  # per model
MAX_HEADER = 4096  # bytes of JSON: a longer header is not kept


class PlannedInput(NamedTuple):
    span: Span
    shape: tuple[int, ...] | None  # the shape validation gave it (a config `reshape`), else None


class RequestPlan(NamedTuple):
    inputs: tuple[PlannedInput, ...]
    payload_size: int
    elements: int  # the most elements of one input (limits.Limits.check_request)
    id: str
    parameters: dict[str, Any]
    requested_outputs: tuple[RequestedOutput, ...] | None  # shared: nothing changes one after decoding
    batch_size: int
    priority: int
    timeout_us: int
    correlation_id: int | str
    flags: int

    def request(self, model_name: str, model_version: int, payload: memoryview) -> InferRequest:
        """The request of a payload of `payload_size` bytes (HTTP: the body after the header)."""
        return self.request_from(model_name, model_version,
                                 [payload[planned.span.start:planned.span.end] for planned in self.inputs])

    def request_from(self, model_name: str, model_version: int, buffers: Sequence[memoryview | bytes],
                     ) -> InferRequest:
        """The request whose inputs' data are `buffers`, one per planned input, in order, each of
        its span's size."""
        inputs = {}
        for planned, buffer in zip(self.inputs, buffers):
            span = planned.span
            array = array_from_buffer(buffer, span.datatype, span.shape)
            inputs[span.name] = array if planned.shape is None else array.reshape(planned.shape)
        outputs = self.requested_outputs
        return InferRequest(
            model_name=model_name, model_version=model_version, inputs=inputs,
            requested_outputs=None if outputs is None else list(outputs), id=self.id,
            parameters=dict(self.parameters), batch_size=self.batch_size, priority=self.priority,
            timeout_us=self.timeout_us, correlation_id=self.correlation_id, flags=self.flags,
        )


def infer_request(model: LoadedModel, body: bytes | bytearray | memoryview,
                  header_length: str | int | None) -> InferRequest:
    """The validated request of an (uncompressed) infer body for `model`: from the header's plan
    when there is one for a payload of this size, else decoded, limited and validated in full
    (and planned, when it can be)."""
    framing = split_body(body, parse_header_length(header_length, len(body)))
    bounds = limits.LIMITS
    key = None
    if not framing.raw and len(framing.header) <= MAX_HEADER:
        key = framing.header.tobytes()
        plan = model.request_plans.get(key)
        if (plan is not None and len(framing.payload) == plan.payload_size
                and plan.elements <= bounds.max_tensor_elements):
            return plan.request(model.name, model.version, framing.payload)
    request, spans = decode_framing(framing, model_name=model.name, model_version=model.version)
    bounds.check_request(request)
    validate_request(model.spec.config, request, model.io)
    if key is not None and spans is not None:
        keep(model.request_plans, key, plan_of(request, spans, len(framing.payload)))
    return request


def plan_of(request: InferRequest, spans: Sequence[Span], payload_size: int) -> RequestPlan:
    """The plan of a request that passed the full path, its inputs' data at `spans` (in the
    request's input order) of a payload of `payload_size` bytes (-1 where each input's data is a
    buffer of its own, as gRPC's raw contents are: `request_from` takes those)."""
    inputs = []
    for span in spans:
        shape = request.inputs[span.name].shape
        inputs.append(PlannedInput(span, None if shape == span.shape else shape))
    elements = max((math.prod(span.shape) for span in spans), default=0)
    outputs = request.requested_outputs
    return RequestPlan(tuple(inputs), payload_size, elements, request.id, dict(request.parameters),
                       None if outputs is None else tuple(outputs), request.batch_size, request.priority,
                       request.timeout_us, request.correlation_id, request.flags)


def keep(plans: dict[bytes, Any], key: bytes, plan: Any) -> None:
    """`plan` kept under `key`, with at most MAX_PLANS in `plans` (the oldest goes first)."""
    plans[key] = plan
    while len(plans) > MAX_PLANS:
        try:
            del plans[next(iter(plans))]
        except (StopIteration, KeyError, RuntimeError):  # another thread took it first
            break
