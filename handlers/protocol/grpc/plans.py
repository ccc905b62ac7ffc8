"""Request plans for gRPC: a repeated ModelInferRequest, less its tensor data, is decoded and
validated once per loaded model (HTTP's plans, handlers/protocol/plans.py, keyed here by the
message's other fields).

tritonclient and perf_analyzer send every request of a kind with the same fields (model, id,
parameters, input names, datatypes and shapes, requested outputs) and new `raw_input_contents`.
The key is the message without those contents, serialized by protobuf with deterministic output
(map entries in key order), so messages whose other fields are equal have one key, and messages
whose fields differ never share one. Once such a message has passed the full path
(decode_infer_request, the element limit, validate_request), the next one with the same key and
raw contents of the same count and sizes is made from the plan: one array over each raw content,
reshaped as validation reshaped it. Every check the full path makes is decided by those fields and
sizes; a plan is used only while its tensors are within the element limit.

Planned: messages whose every input is in `raw_input_contents`, one content per input, with a
fixed-size datatype (not BYTES, not typed `contents`), whose key is at most MAX_HEADER bytes.
Anything else, and every request that fails, takes the full path with its messages. A model keeps
at most MAX_PLANS in `LoadedModel.grpc_request_plans` (apart from HTTP's, whose keys are JSON).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from ... import limits
from ...inference import InferRequest
from ..codec import Span
from ..plans import MAX_HEADER, RequestPlan, keep, plan_of
from ..validation import validate_request
from .tensors import decode_infer_request

if TYPE_CHECKING:
    from ...model_repository import LoadedModel

__all__ = ["GrpcPlan", "infer_request"]


class GrpcPlan(NamedTuple):
    plan: RequestPlan
    sizes: tuple[int, ...]  # each raw content's bytes, in order
    empty_final: bool  # triton_enable_empty_final_response, as decode_infer_request read it


def infer_request(model: LoadedModel, message: Any) -> tuple[InferRequest, bool]:
    """The validated request of a ModelInferRequest for `model`, and whether the client asked for
    an empty final response: from the plan of its fields when there is one for raw contents of
    these sizes, else decoded, limited and validated in full (and planned, when it can be). A
    request made from a plan takes the message's raw contents (its arrays are over them; putting
    them back would copy them again), so the message is left without them; the full path leaves
    it as it came."""
    contents = list(message.raw_input_contents)
    key = None
    if contents:
        message.ClearField("raw_input_contents")  # put back below, unless the plan makes the request
        key = message.SerializeToString(deterministic=True)
        planned = model.grpc_request_plans.get(key)
        if (planned is not None and tuple(map(len, contents)) == planned.sizes
                and planned.plan.elements <= limits.LIMITS.max_tensor_elements):
            return planned.plan.request_from(model.name, model.version, contents), planned.empty_final
        message.raw_input_contents.extend(contents)
    config = model.spec.config
    request, empty_final = decode_infer_request(message, config, model_name=model.name, model_version=model.version)
    limits.LIMITS.check_request(request)
    validate_request(config, request, model.io)
    if key is not None and len(key) <= MAX_HEADER:
        spans = _spans(message, contents)
        if spans is not None:
            keep(model.grpc_request_plans, key,
                 GrpcPlan(plan_of(request, spans, -1), tuple(map(len, contents)), empty_final))
    return request, empty_final


def _spans(message: Any, contents: list[bytes]) -> list[Span] | None:
    """Each input's data as a span of its own raw content (the whole of it), when every input's
    data is one raw content of a fixed-size datatype; else None."""
    if len(contents) != len(message.inputs):
        return None
    spans = []
    for tensor, content in zip(message.inputs, contents):
        if tensor.datatype == "BYTES" or tensor.HasField("contents"):
            return None
        spans.append(Span(tensor.name, tensor.datatype, tuple(tensor.shape), 0, len(content)))
    return spans
