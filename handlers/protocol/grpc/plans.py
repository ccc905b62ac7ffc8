"""Request plans for gRPC: a repeated ModelInferRequest, less its tensor data, is decoded and
validated once per loaded model (HTTP's plans, handlers/protocol/plans.py, keyed here by the
message's other fields).

tritonclient and perf_analyzer send every request of a kind with the same fields (model, id,
parameters, input names, datatypes and shapes, requested outputs) and new `raw_input_contents`.
The key is the message without those contents and without its id, serialized by protobuf with
deterministic output (map entries in key order), so messages whose other fields are equal have one
key, and messages whose fields differ never share one; the id is the request's own (it reaches a
request only as its id, and error messages, which plans never give). Once such a message has passed the full path
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
    these sizes, else decoded, limited and validated in full (and planned, when it can be). The
    message's raw contents go to the request (its arrays are over them; putting them back would
    copy them again): the message is left without them."""
    contents = list(message.raw_input_contents)
    key = None
    if contents:
        message.ClearField("raw_input_contents")
        request_id = message.id  # not in the key: a client giving each request its own id has one plan
        if request_id:
            message.ClearField("id")
        key = message.SerializeToString(deterministic=True)
        message.id = request_id
        planned = model.grpc_request_plans.get(key)
        if (planned is not None and tuple(map(len, contents)) == planned.sizes
                and planned.plan.elements <= limits.LIMITS.max_tensor_elements):
            request = planned.plan.request_from(model.name, model.version, contents)
            request.id = request_id
            return request, planned.empty_final
    config = model.spec.config
    request, empty_final = decode_infer_request(message, config, model_name=model.name, model_version=model.version,
                                                raw_contents=contents)
    limits.LIMITS.check_request(request)
    validate_request(config, request, model.io)
    if key is not None and len(key) <= MAX_HEADER and _plannable(message, contents):
        sizes = tuple(map(len, contents))
        spans = [Span(tensor.name, tensor.datatype, tuple(tensor.shape), 0, size)
                 for tensor, size in zip(message.inputs, sizes)]
        keep(model.grpc_request_plans, key, GrpcPlan(plan_of(request, spans, -1), sizes, empty_final))
    return request, empty_final


def _plannable(message: Any, contents: list[bytes]) -> bool:
    """Whether every input's data is one raw content of a fixed-size datatype (input i takes raw
    content i then, as decode_infer_request assigns them)."""
    inputs = message.inputs
    if len(contents) != len(inputs):
        return False
    for tensor in inputs:
        if tensor.datatype == "BYTES" or tensor.HasField("contents"):
            return False
    return True
