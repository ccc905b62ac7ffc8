"""gRPC `ModelInferRequest` -> `InferRequest`, and `InferResponse` -> `ModelInferResponse`.

The same request rules as the REST codec (handlers/protocol/codec.py), with gRPC's own framing:

- tensor data comes from `raw_input_contents` (one entry per input, in input order; BYTES
  elements length-prefixed as in the binary extension) or from an input's typed `contents`
  (`fp32_contents`, `int_contents`, `bytes_contents`, ...), never both in one request, and never
  from two typed fields of one input;
- request parameters are `InferParameter` oneofs; `sequence_id`, `sequence_start`,
  `sequence_end`, `priority` and `timeout` are read by the server as Triton's gRPC frontend reads
  them, `triton_enable_empty_final_response` is the only `triton_` key allowed (it concerns the
  stream, not the model), every other parameter reaches the model;
- responses always carry their data in `raw_output_contents` (Triton never fills `contents`).

Messages and status codes are tritonserver 2.51's gRPC frontend's, measured against the real
server (tests/test_grpc_protocol.py records them). Then the request is checked against the model
by `validate_request`, exactly as a REST request is.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ...datatypes import PROTOCOL_DATATYPES, from_config_type, numpy_dtype
from ...model_io import ModelIO
from ...errors import invalid_argument, not_found
from ...inference import InferRequest, InferResponse, RequestedOutput
from ..binary import BytesContext, deserialize_bytes, string_count_error
from ..codec import (
    SEQUENCE_END,
    SEQUENCE_START,
    array_from_buffer,
    check_representable,
    classify,
    log_prefix,
    output_bytes,
    tensor_datatype,
    unsendable_output,
)

__all__ = [
    "EMPTY_FINAL_RESPONSE",
    "FINAL_RESPONSE",
    "contents_array",
    "decode_infer_request",
    "encode_infer_response",
    "parameter_value",
    "parse_version",
    "set_parameter",
]

EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"
FINAL_RESPONSE = "triton_final_response"
_RESERVED = (EMPTY_FINAL_RESPONSE,)
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_VERSION = re.compile(r"\s*([+-]?)(\d+)")

# The typed `contents` fields, in the order Triton's frontend reads them, with the datatype each
# one carries for a given input datatype (int_contents: INT8/INT16 narrowed from int32, ...).
_CONTENTS = (
    ("bool_contents", lambda dt: "BOOL"),
    ("int_contents", lambda dt: dt if dt in ("INT8", "INT16") else "INT32"),
    ("int64_contents", lambda dt: "INT64"),
    ("uint_contents", lambda dt: dt if dt in ("UINT8", "UINT16") else "UINT32"),
    ("uint64_contents", lambda dt: "UINT64"),
    ("fp32_contents", lambda dt: "FP32"),
    ("fp64_contents", lambda dt: "FP64"),
    ("bytes_contents", lambda dt: "BYTES"),
)
_WIDE = {"INT8": np.int32, "INT16": np.int32, "UINT8": np.uint32, "UINT16": np.uint32}


def parse_version(text: str) -> int | None:
    """A request's `model_version` string: None for "" (the latest ready version). Triton's
    messages for a version that is not a number or is negative (INVALID_ARGUMENT); trailing
    characters, which Triton's stol silently ignores, are refused too."""
    if text == "":
        return None
    match = _VERSION.fullmatch(text)
    if match is None or int(match.group(2)) > _INT64_MAX:
        raise invalid_argument(
            f"failed to get model version from specified version string '{text}' (details: stol), "
            "version should be an integral value > 0"
        )
    if match.group(1) == "-" and int(match.group(2)) != 0:
        raise invalid_argument(
            f"invalid model version specified '{text}' , version should be an integral value > 0"
        )
    return int(match.group(2))


def parameter_value(parameter: Any) -> Any:
    """An `InferParameter`'s value (None when none of its oneof is set)."""
    kind = parameter.WhichOneof("parameter_choice")
    return None if kind is None else getattr(parameter, kind)


def set_parameter(parameter: Any, value: Any) -> None:
    """Fill an `InferParameter` from a Python value (bool, int, float or str)."""
    if isinstance(value, bool):
        parameter.bool_param = value
    elif isinstance(value, int):
        if _INT64_MIN <= value <= _INT64_MAX:
            parameter.int64_param = value
        else:
            parameter.uint64_param = value
    elif isinstance(value, float):
        parameter.double_param = value
    else:
        parameter.string_param = str(value)


def _decode_parameters(message: Any, request: InferRequest) -> bool:
    """Request parameters as Triton's gRPC frontend reads them; returns whether the client asked
    for an empty final response on a stream."""
    flags = 0
    empty_final = False
    parameters: dict[str, Any] = {}
    for key, parameter in message.parameters.items():
        kind = parameter.WhichOneof("parameter_choice")
        value = None if kind is None else getattr(parameter, kind)
        if key == "sequence_id":
            if kind not in ("int64_param", "string_param"):
                raise invalid_argument(
                    "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."
                )
            request.correlation_id = value
        elif key in ("sequence_start", "sequence_end"):
            if kind != "bool_param":
                raise invalid_argument(f"invalid value type for '{key}' parameter, expected bool_param.")
            if value:
                flags |= SEQUENCE_START if key == "sequence_start" else SEQUENCE_END
        elif key == "priority":
            if kind == "int64_param":
                if value < 0:
                    raise invalid_argument("invalid value for 'priority', expected value >= 0.")
            elif kind != "uint64_param":
                raise invalid_argument(
                    "invalid value type for 'priority' parameter, expected int64_param or uint64_param."
                )
            request.priority = value
        elif key == "timeout":
            if kind != "int64_param":
                raise invalid_argument("invalid value type for 'timeout' parameter, expected int64_param.")
            if value < 0:  # Triton casts it to an unsigned number of microseconds
                raise invalid_argument("invalid value for 'timeout', expected value >= 0.")
            request.timeout_us = value
        elif key.startswith("triton_"):
            if key not in _RESERVED:
                raise invalid_argument(
                    "parameter keys starting with 'triton_' are reserved for Triton usage. Only the following "
                    "keys starting with 'triton_' are allowed: " + " ".join(_RESERVED)
                )
            if kind != "bool_param":
                raise invalid_argument(f"invalid value type for '{key}' parameter, expected bool_param.")
            empty_final = value
            continue  # the stream's business, not the model's
        elif kind not in ("int64_param", "bool_param", "string_param", "double_param"):
            raise invalid_argument(
                f"invalid value type for '{key}' parameter, expected int64_param, bool_param, or string_param."
            )
        parameters[key] = value
    request.flags = flags
    request.parameters = parameters
    return empty_final


def _shared_memory_region(parameters: Mapping[str, Any]) -> None:
    if "shared_memory_region" in parameters:
        region = parameter_value(parameters["shared_memory_region"])
        raise not_found(f"Unable to find shared memory region: '{region}'")


def _typed_contents(tensor: Any, datatype: str, model: str) -> tuple[str, Any] | None:
    """The one typed `contents` field of an input (name, values), with Triton's checks."""
    found: tuple[str, Any] | None = None
    contents = tensor.contents
    for field, carried in _CONTENTS:
        values = getattr(contents, field)
        if not values:
            continue
        if found is not None:
            raise invalid_argument(
                f"unexpected explicit tensor data for input tensor '{tensor.name}' for model '{model}', "
                "binary data was already supplied."
            )
        kind = carried(datatype)
        if kind != datatype:
            raise invalid_argument(
                f"unexpected explicit tensor data for input tensor '{tensor.name}' for model '{model}' of type "
                f"'{kind}', expected datatype '{datatype}'"
            )
        found = (field, values)
    return found


def _from_contents(
    field: str, values: Any, datatype: str, shape: list[int], where: BytesContext
) -> np.ndarray:
    count = math.prod(shape)  # Python ints: a [1, 2**40] shape is a number, never an allocation
    if field == "bytes_contents":
        if len(values) != count:
            raise string_count_error(where, count, len(values))
        array = np.empty(count, dtype=np.object_)
        array[:] = list(values)
        return array.reshape(shape)
    dtype = numpy_dtype(datatype)
    wide = _WIDE.get(datatype)
    array = np.asarray(values, dtype=wide) if wide is not None else np.asarray(values, dtype=dtype)
    if wide is not None:  # Triton keeps the low bytes of each 32-bit value (little-endian)
        array = array.astype(dtype)
    if array.size != count:
        raise invalid_argument(
            f"{where.log_prefix}input byte size mismatch for input '{where.input_name}' for model "
            f"'{where.model_name}'. Expected {count * dtype.itemsize}, got {array.size * dtype.itemsize}"
        )
    return array.reshape(shape)


def contents_array(tensor: Any, datatype: str, shape: list[int], where: BytesContext) -> np.ndarray:
    """An input's typed `contents` as a tensor of `shape` (Triton's checks: one typed field, the
    one that carries `datatype`, with the right element count)."""
    typed = _typed_contents(tensor, datatype, where.model_name)
    if typed is None:  # an empty `contents`: no data at all
        return _from_raw(b"", datatype, shape, where)
    return _from_contents(typed[0], typed[1], datatype, shape, where)


def _from_raw(raw: bytes, datatype: str, shape: list[int], where: BytesContext) -> np.ndarray:
    count = math.prod(shape)  # Python ints: a [1, 2**40] shape is a number, never an allocation
    if datatype == "BYTES":
        return deserialize_bytes(raw, count, where).reshape(shape)
    expected = count * numpy_dtype(datatype).itemsize
    if expected != len(raw):
        raise invalid_argument(
            f"{where.log_prefix}input byte size mismatch for input '{where.input_name}' for model "
            f"'{where.model_name}'. Expected {expected}, got {len(raw)}"
        )
    return array_from_buffer(raw, datatype, shape)


def decode_infer_request(
    message: Any, config: Mapping[str, Any], *, model_name: str, model_version: int,
    raw_contents: Sequence[bytes] | None = None,
) -> tuple[InferRequest, bool]:
    """A `ModelInferRequest` as an `InferRequest` for `model_name` (not yet validated against
    the model: `validate_request` does that), and whether the client asked for an empty final
    response (`triton_enable_empty_final_response`, streams only). `raw_contents`: the message's
    raw input contents when the caller has taken them out of it (grpc/plans.py), else read there."""
    request = InferRequest(model_name=model_name, model_version=model_version, inputs={}, id=message.id)
    empty_final = _decode_parameters(message, request)
    prefix = log_prefix(message.id)
    if raw_contents is None:
        raw_contents = message.raw_input_contents
    raw_index = 0
    for tensor in message.inputs:
        name = tensor.name
        if name in request.inputs:
            raise invalid_argument(f"{prefix}input '{name}' already exists in request")
        datatype = tensor.datatype
        if datatype not in PROTOCOL_DATATYPES:
            declared = {io["name"]: from_config_type(io["data_type"]) for io in config.get("input", ())}
            if name in declared:
                raise invalid_argument(
                    f"{prefix}inference input '{name}' data-type is '<invalid>', but model '{model_name}' expects "
                    f"'{declared[name]}'"
                )
            raise invalid_argument(f"unexpected inference input '{name}' for model '{model_name}'")
        shape = list(tensor.shape)
        if any(d < 0 for d in shape):
            raise invalid_argument(
                f"{prefix}All input dimensions should be specified for input '{name}' for model '{model_name}', "
                f"got [{','.join(map(str, shape))}]"
            )
        check_representable(name, datatype, shape)
        _shared_memory_region(tensor.parameters)
        where = BytesContext(name, model_name, prefix)
        if tensor.HasField("contents"):
            if raw_contents:
                raise invalid_argument(
                    f"contents field must not be specified when using raw_input_contents for '{name}' for model "
                    f"'{model_name}'"
                )
            array = contents_array(tensor, datatype, shape, where)
        elif raw_index < len(raw_contents):
            array = _from_raw(raw_contents[raw_index], datatype, shape, where)
            raw_index += 1
        else:
            raise invalid_argument(
                f"unable to find data for input tensor '{name}' for model '{model_name}' in request."
            )
        request.inputs[name] = array
    if message.outputs:
        requested: dict[str, RequestedOutput] = {}
        for output in message.outputs:
            _shared_memory_region(output.parameters)
            classification = 0
            if "classification" in output.parameters:
                value = parameter_value(output.parameters["classification"])
                if type(value) is not int or value < 0:
                    raise invalid_argument(
                        f"Unable to set 'classification': output '{output.name}' needs a non-negative integer, "
                        f"got {value!r}"
                    )
                classification = value
            if output.name not in requested:
                requested[output.name] = RequestedOutput(output.name, True, classification)
        request.requested_outputs = list(requested.values())
    return request, empty_final


def encode_infer_response(
    response: InferResponse,
    request: InferRequest,
    config: Mapping[str, Any],
    message: Any,
    *,
    labels: Mapping[str, Sequence[str]] | None = None,
    io: ModelIO | None = None,
) -> Any:
    """Fill `message` (a `ModelInferResponse`) with `response`: the requested outputs (every
    output when none was named), in the order of the model's Triton backend (`ModelIO.response_order`),
    data in `raw_output_contents` (`io`: the
    config's ModelIO when the caller keeps one, else it is made here)."""
    if io is None:
        io = ModelIO(config)
    datatypes = io.output_types()
    batched = io.batched
    if request.requested_outputs is None:
        selection = {name: 0 for name in response.outputs}
    else:
        selection = {o.name: o.classification for o in request.requested_outputs}
    message.model_name = response.model_name
    message.model_version = str(response.model_version)
    response_id = response.id or request.id
    if response_id:
        message.id = response_id
    for key, value in response.parameters.items():
        set_parameter(message.parameters[key], value)
    for name in io.response_order(n for n in response.outputs if n in selection):
        array = np.asarray(response.outputs[name])
        datatype = datatypes.get(name) or tensor_datatype(array)
        class_count = selection[name]
        if class_count > 0:
            array = classify(array, datatype, class_count, batched, (labels or {}).get(name))
            datatype = "BYTES"
        try:
            raw = output_bytes(array, datatype)
        except (ValueError, TypeError, OverflowError) as exc:
            raise unsendable_output(response.model_name, name, array, datatype, exc) from None
        output = message.outputs.add()
        output.name = name
        output.datatype = datatype
        output.shape.extend(array.shape)
        message.raw_output_contents.append(raw if isinstance(raw, bytes) else raw.tobytes())
    return message

