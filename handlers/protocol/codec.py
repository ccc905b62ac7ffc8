"""The KServe/Triton v2 REST tensor codec: request bodies -> `InferRequest`, responses -> bodies.

Public surface (what the routes, the batcher and the backends use):

- `decode_request(body, header_length, *, model_name, model_version)` -> `InferRequest`.
  `body` is the (decompressed) HTTP body, `header_length` the `Inference-Header-Content-Length`
  header value or None. Inputs become numpy arrays of the declared shape: binary tensors are
  zero-copy views of the body when aligned (so possibly read-only), JSON tensors fresh arrays.
  BYTES tensors are object arrays of `bytes`; BF16 tensors are uint16 bit patterns whose dtype
  carries the tag `tensor_datatype` reads (numpy has no bfloat16). The request `parameters` keep
  every parameter the client sent; the ones the HTTP frontend consumes (`FRONTEND_PARAMETERS`) are
  also parsed into `priority`, `timeout_us`, `correlation_id`, `flags` and the default output kind.
  A raw binary request (header length 0) yields one uint8 input that `validate_request` resolves
  against the model's single input, as Triton's core does.
- `encode_response(response, request, config, *, labels=None)` -> `(body, headers)`. `config` is
  the model's Triton config JSON; `headers` has lowercase keys (`content-type`, and
  `inference-header-content-length` when binary data follows the JSON).
- `encode_error(error)` -> `{"error": "..."}` bytes.
- `tensor_datatype(array)`, `array_from_buffer(...)`, `bf16_from_float32(...)`,
  `float32_from_bf16(...)`: datatype helpers shared with validation and backends.

Every malformed request raises `InferenceError` with INVALID_ARG (HTTP 400), except references to
shared memory regions, which are NOT_FOUND (404) as in Triton (no region can be registered here).
Messages use tritonserver 2.51's wording where it has one; docs/protocol.md lists the deviations.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from itertools import chain
from typing import Any, NamedTuple

import numpy as np
import orjson

from ..datatypes import PROTOCOL_DATATYPES, from_numpy, numpy_dtype
from ..errors import InferenceError, internal, invalid_argument, not_found
from ..inference import InferRequest, InferResponse, RequestedOutput
from ..model_io import ModelIO
from .binary import (
    BytesContext,
    Framing,
    deserialize_bytes,
    element_bytes,
    parse_header_length,
    serialize_bytes,
    split_body,
    string_count_error,
)

__all__ = [
    "FRONTEND_PARAMETERS",
    "RAW_INPUT_NAME",
    "SEQUENCE_END",
    "SEQUENCE_START",
    "Span",
    "array_from_buffer",
    "bf16_from_float32",
    "check_representable",
    "classify",
    "decode_framing",
    "decode_request",
    "encode_error",
    "encode_response",
    "float32_from_bf16",
    "is_raw_input",
    "json_data",
    "json_tensor",
    "log_prefix",
    "output_bytes",
    "parse_json",
    "tensor_datatype",
]

# Request parameters the HTTP frontend consumes instead of passing them to the model (Triton's
# ParseJsonTritonParams). They stay in InferRequest.parameters; a Python-model adapter should hide
# them from `request.parameters()` as Triton does.
FRONTEND_PARAMETERS = frozenset(
    {"sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output"}
)
SEQUENCE_START = 1  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
SEQUENCE_END = 2  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
RAW_INPUT_NAME = "raw_input"  # the name Triton's HTTP frontend gives a raw request's input

_UINT64_LIMIT = 1 << 64
_INTP_MAX = (1 << 63) - 1
_TAG = "triton_datatype"
_BF16 = np.dtype(np.uint16, metadata={_TAG: "BF16"})
_RAW = np.dtype(np.uint8, metadata={_TAG: "RAW"})
_FLOATS = frozenset({"FP16", "FP32", "FP64", "BF16"})
_INTEGERS = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"})
_CLASSIFIABLE = _INTEGERS | {"FP32", "FP64"}
_JSON_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
_DATATYPE_OF = {numpy_dtype(name): name for name in PROTOCOL_DATATYPES if name != "BF16"}


# --- datatype helpers -----------------------------------------------------------------------------


def tensor_datatype(array: np.ndarray) -> str:
    """The protocol datatype of a decoded tensor ("BF16" for tagged uint16 bit patterns)."""
    dtype = array.dtype
    metadata = dtype.metadata
    if metadata and _TAG in metadata:
        return metadata[_TAG]
    return _DATATYPE_OF.get(dtype) or from_numpy(dtype.newbyteorder("="))


def is_raw_input(array: np.ndarray) -> bool:
    """True for the undeduced input of a raw binary request (see `validate_request`)."""
    metadata = array.dtype.metadata
    return bool(metadata) and metadata.get(_TAG) == "RAW"


def _storage_dtype(datatype: str) -> np.dtype:
    return _BF16 if datatype == "BF16" else numpy_dtype(datatype)


def array_from_buffer(buffer: memoryview | bytes, datatype: str, shape: Sequence[int]) -> np.ndarray:
    """A numeric tensor over `buffer` (whose size the caller has checked): a zero-copy view when
    the data is aligned for the dtype, else a view of an aligned copy (`bytes(...)` is one memcpy;
    numpy's own copy of unaligned data goes element by element and is ~10x slower). Either way
    the array may be read-only."""
    dtype = _storage_dtype(datatype)
    if len(buffer) == _prod(shape) * dtype.itemsize:  # (the callers' check) one numpy call, not two
        array = np.ndarray(shape, dtype, buffer)
        if array.flags.aligned:
            return array
    array = np.frombuffer(buffer, dtype=dtype)
    if not array.flags.aligned:
        array = np.frombuffer(bytes(buffer), dtype=dtype)
        if not array.flags.aligned:  # pragma: no cover - CPython's bytes data is 16-byte aligned
            array = array.copy()
    return array.reshape(shape)


def bf16_from_float32(values: np.ndarray) -> np.ndarray:
    """float32 -> BF16 bit patterns, rounding to nearest even (as ml_dtypes, PyTorch and ONNX do);
    NaNs stay (quiet) NaNs."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    bits = values.view(np.uint32)
    rounded = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)
    nan = np.isnan(values)
    if nan.any():
        rounded[nan] = ((bits[nan] >> 16) | 0x0040).astype(np.uint16)
    return rounded.view(_BF16)


def float32_from_bf16(bits: np.ndarray) -> np.ndarray:
    """BF16 bit patterns -> float32 (exact)."""
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def log_prefix(request_id: str) -> str:
    """Triton core's `LogRequest()` prefix, which starts its request validation messages."""
    return f"[request id: {request_id or '<id_unknown>'}] "


def _prod(shape: Sequence[int]) -> int:
    return math.prod(shape)  # Python ints: a [1, 2**40] shape is a number, never an allocation


def _is_uint(value: Any) -> bool:
    return type(value) is int and 0 <= value < _UINT64_LIMIT


def _type_name(value: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number"
    )


# --- request decoding -----------------------------------------------------------------------------


def decode_request(
    body: bytes | bytearray | memoryview,
    header_length: str | int | None,
    *,
    model_name: str,
    model_version: int = 0,
) -> InferRequest:
    """Decode an infer request body into an `InferRequest` (not yet validated against the model).

    Check order follows Triton's HTTP frontend: header length, JSON, `id`, `parameters`, then each
    input (content kind, name, datatype, shape, data), trailing binary data, then `outputs`.
    """
    framing = split_body(body, parse_header_length(header_length, len(body)))
    return decode_framing(framing, model_name=model_name, model_version=model_version)[0]


class Span(NamedTuple):
    """Where a binary input's data lies in a request's payload, as its header declares it."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    start: int
    end: int


def decode_framing(framing: Framing, *, model_name: str,
                   model_version: int = 0) -> tuple[InferRequest, list[Span] | None]:
    """`decode_request` of a body already cut in two, with the payload spans of its inputs when
    every input is binary data of a fixed-size datatype (handlers/protocol/plans.py), else None."""
    if framing.raw:
        raw = np.frombuffer(framing.payload, dtype=_RAW)
        return InferRequest(
            model_name=model_name,
            model_version=model_version,
            inputs={RAW_INPUT_NAME: raw},
            parameters={"binary_data_output": True},  # Triton answers raw requests in binary
        ), None

    document = parse_json(framing.header)
    if type(document) is not dict:
        raise invalid_argument(
            f"Unable to parse 'inputs': the request JSON must be an object, got {_type_name(document)}"
        )

    request_id = document.get("id", "")
    if type(request_id) is not str:
        raise invalid_argument(f"Unable to parse 'id': expected a string, got {_type_name(request_id)}")
    request = InferRequest(model_name=model_name, model_version=model_version, inputs={}, id=request_id)
    if "parameters" in document:
        _decode_parameters(document["parameters"], request)

    decoder = _InputDecoder(model_name, log_prefix(request_id), framing.payload)
    if "inputs" not in document:
        raise invalid_argument("Unable to parse 'inputs': the request has no 'inputs'")
    inputs = document["inputs"]
    if type(inputs) is not list:
        raise invalid_argument(f"Unable to parse 'inputs': expected an array, got {_type_name(inputs)}")
    for index, tensor in enumerate(inputs):
        name, array = decoder.decode(index, tensor)
        if name in request.inputs:
            raise invalid_argument(f"{decoder.prefix}input '{name}' already exists in request")
        request.inputs[name] = array
    if decoder.offset != len(framing.payload):
        raise invalid_argument(f"unexpected additional input data for model '{model_name}'")

    if "outputs" in document:
        request.requested_outputs = _decode_outputs(document["outputs"])
    return request, decoder.spans


def parse_json(header: memoryview) -> Any:
    """A request's JSON (NaN and Infinity accepted, as Triton's parser does); INVALID_ARG with
    the parser's message otherwise."""
    try:
        return orjson.loads(header)
    except orjson.JSONDecodeError as error:
        text = bytes(header)
        # Triton's JSON parser accepts NaN/Infinity (tritonclient sends them); orjson does not.
        if b"NaN" in text or b"Infinity" in text:
            try:
                return json.loads(text)
            except (ValueError, RecursionError):
                pass
        raise invalid_argument(f"failed to parse the request JSON buffer: {error}") from None


def _decode_parameters(parameters: Any, request: InferRequest) -> None:
    if type(parameters) is not dict:
        raise invalid_argument(
            f"Unable to parse 'parameters': expected an object, got {_type_name(parameters)}"
        )
    flags = 0
    for key, value in parameters.items():
        if key == "sequence_id":
            if not (_is_uint(value) or type(value) is str):
                raise invalid_argument(
                    "Unable to parse 'sequence_id': expected an unsigned integer or a string"
                )
            request.correlation_id = value
        elif key in ("sequence_start", "sequence_end", "binary_data_output"):
            if type(value) is not bool:
                raise invalid_argument(
                    f"Unable to parse '{key}': expected a boolean, got {_type_name(value)}"
                )
            if value and key == "sequence_start":
                flags |= SEQUENCE_START
            elif value and key == "sequence_end":
                flags |= SEQUENCE_END
        elif key in ("priority", "timeout"):
            if not _is_uint(value):
                raise invalid_argument(
                    f"Unable to parse '{key}': expected an unsigned integer, got {value!r}"
                )
            if key == "priority":
                request.priority = value
            else:
                request.timeout_us = value
        elif key.startswith("triton_"):
            raise invalid_argument(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should not be "
                "specified."
            )
        elif type(value) not in (str, int, bool, float):
            raise invalid_argument(
                f"parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
            )
    request.flags = flags
    request.parameters = dict(parameters)


class _InputDecoder:
    """Decodes `inputs[i]` objects, taking binary data from the payload in input order."""

    def __init__(self, model_name: str, prefix: str, payload: memoryview) -> None:
        self.model_name = model_name
        self.prefix = prefix
        self.payload = payload
        self.offset = 0
        self.spans: list[Span] | None = []  # None once an input is not fixed-size binary data

    def decode(self, index: int, tensor: Any) -> tuple[str, np.ndarray]:
        if type(tensor) is not dict:
            raise invalid_argument(
                f"Unable to parse 'inputs': input {index} must be an object, got {_type_name(tensor)}"
            )
        parameters = tensor.get("parameters")
        if parameters is None:
            parameters = {}
        elif type(parameters) is not dict:
            raise invalid_argument(
                f"Unable to parse 'parameters' of input {index}: expected an object, "
                f"got {_type_name(parameters)}"
            )
        _check_content_kind(tensor, parameters)

        name = tensor.get("name")
        if type(name) is not str:
            raise invalid_argument(f"Unable to parse 'name': input {index} needs a string 'name'")
        datatype = tensor.get("datatype")
        if type(datatype) is not str:
            raise invalid_argument(f"Unable to parse 'datatype': input '{name}' needs a string 'datatype'")
        shape = tensor.get("shape")
        if type(shape) is not list or not all(_is_uint(d) for d in shape):
            raise invalid_argument(
                f"Unable to parse 'shape': input '{name}' needs a 'shape' array of non-negative integers, "
                f"got {shape!r}"
            )
        if datatype not in PROTOCOL_DATATYPES:
            raise invalid_argument(f"invalid datatype for input {name}")
        check_representable(name, datatype, shape)

        if "shared_memory_region" in parameters:
            region = parameters["shared_memory_region"]
            if type(region) is not str:
                raise invalid_argument("Unable to parse 'shared_memory_region': expected a string")
            raise not_found(f"Unable to find shared memory region: '{region}'")
        if "binary_data_size" in parameters:
            return name, self._binary(name, datatype, shape, parameters["binary_data_size"])
        self.spans = None
        return name, json_tensor(
            tensor["data"], datatype, shape, BytesContext(name, self.model_name, self.prefix)
        )

    def _binary(self, name: str, datatype: str, shape: list[int], size: Any) -> np.ndarray:
        if not _is_uint(size):
            raise invalid_argument(
                f"Unable to parse 'binary_data_size': input '{name}' needs a non-negative integer, "
                f"got {size!r}"
            )
        available = len(self.payload) - self.offset
        if size > available:
            raise invalid_argument(
                f"unexpected size for input '{name}', expecting {size - available} additional bytes "
                f"for model '{self.model_name}'"
            )
        chunk = self.payload[self.offset : self.offset + size]
        self.offset += size
        count = _prod(shape)
        if datatype == "BYTES":
            self.spans = None
            where = BytesContext(name, self.model_name, self.prefix)
            return deserialize_bytes(chunk, count, where).reshape(shape)
        expected = count * numpy_dtype(datatype).itemsize
        if expected != size:
            raise invalid_argument(
                f"{self.prefix}input byte size mismatch for input '{name}' for model '{self.model_name}'. "
                f"Expected {expected}, got {size}"
            )
        if self.spans is not None:
            self.spans.append(Span(name, datatype, tuple(shape), self.offset - size, self.offset))
        return array_from_buffer(chunk, datatype, shape)


def check_representable(name: str, datatype: str, shape: list[int]) -> None:
    """numpy (like Triton's int64 shapes) cannot hold a dimension of 2**63 or more, nor a shape
    whose non-zero dimensions multiply past the address space, even for zero elements."""
    # (a dimension past the limit is non-zero, so it is in the product and puts the extent past it)
    extent = _prod(filter(None, shape)) * numpy_dtype(datatype).itemsize
    if extent > _INTP_MAX:
        raise invalid_argument(
            f"Unable to parse 'shape': input '{name}' has shape {shape}, which is too large"
        )


def _check_content_kind(tensor: dict, parameters: dict) -> None:
    """Exactly one of data / binary_data_size / shared_memory_region (Triton's message)."""
    found = ("data" in tensor, "binary_data_size" in parameters, "shared_memory_region" in parameters)
    if found.count(True) == 1:
        return
    present = [
        label
        for label, there in zip(("'data'", "'binary_data_size'", "'shared_memory_region'"), found)
        if there
    ]
    if len(present) != 1:
        detail = " no field is set" if not present else " set " + " ".join(present)
        raise invalid_argument(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
            "'shared_memory_region' in 'parameters'. But" + detail
        )


def _flatten(data: list) -> list:
    """Row-major leaves of a nested JSON array. Regular nesting is flattened level by level in C
    (itertools.chain); irregular nesting, which Triton also accepts, takes `_flatten_any`."""
    while data and type(data[0]) is list and all(type(item) is list for item in data):
        data = list(chain.from_iterable(data))
    return data


def _flatten_any(data: list) -> list:
    leaves: list = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if type(item) is list:
                stack.append(iter(item))
                break
            leaves.append(item)
        else:
            stack.pop()
    return leaves


def json_tensor(data: Any, datatype: str, shape: list[int], where: BytesContext) -> np.ndarray:
    """A JSON `data` array (flat or nested, row-major) as a tensor of `shape`. The element count is
    compared before any conversion; numbers are converted by numpy, never one by one in Python."""
    name = where.input_name
    if type(data) is not list:
        raise invalid_argument(
            f"Unable to parse 'data': input '{name}' needs a JSON array, got {_type_name(data)}"
        )
    leaves = _flatten(data)
    kinds = set(map(type, leaves))
    if list in kinds:
        leaves = _flatten_any(leaves)
        kinds = set(map(type, leaves))
    count = _prod(shape)
    if len(leaves) != count:
        if datatype == "BYTES":  # Triton's frontend sizes BYTES by their strings; its core counts them
            raise string_count_error(where, count, len(leaves))
        raise invalid_argument("Unable to parse 'data': Shape does not match true shape of 'data' field")

    if datatype == "BYTES":
        if kinds - {str}:
            raise invalid_argument(
                f"Unable to parse JSON bytes array: input '{name}' needs strings, got {_kinds(kinds - {str})}"
            )
        try:
            encoded = [item.encode("utf-8") for item in leaves]
        except UnicodeEncodeError as error:
            raise invalid_argument(f"Unable to parse JSON bytes array: input '{name}': {error}") from None
        array = np.empty(len(encoded), dtype=np.object_)
        array[:] = encoded
        return array.reshape(shape)

    if datatype == "BOOL":
        if kinds - {bool}:
            raise invalid_argument(
                f"Unable to parse 'data': BOOL input '{name}' needs true/false values, "
                f"got {_kinds(kinds - {bool})}"
            )
        return np.array(leaves, dtype=np.bool_).reshape(shape)

    allowed = {int} if datatype in _INTEGERS else {int, float}
    if kinds - allowed:
        wanted = "integers" if datatype in _INTEGERS else "numbers"
        raise invalid_argument(
            f"Unable to parse 'data': {datatype} input '{name}' needs {wanted}, got {_kinds(kinds - allowed)}"
        )
    target = np.float32 if datatype == "BF16" else numpy_dtype(datatype)
    try:
        with np.errstate(over="ignore"):  # like Triton's double -> float cast: out of range is inf
            array = np.array(leaves, dtype=target)
    except OverflowError:
        if datatype in _INTEGERS:
            info = np.iinfo(target)
            limits = f"outside [{info.min}, {info.max}]"
        else:
            limits = "too large for a floating-point number"
        raise invalid_argument(
            f"Unable to parse 'data': {datatype} input '{name}' has a value {limits}"
        ) from None
    if datatype == "BF16":
        array = bf16_from_float32(array)
    return array.reshape(shape)


def _kinds(kinds: set[type]) -> str:
    names = {
        "float": "number",
        "int": "integer",
        "str": "string",
        "bool": "boolean",
        "NoneType": "null",
        "dict": "object",
        "list": "array",
    }
    return ", ".join(sorted(names.get(kind.__name__, kind.__name__) for kind in kinds))


def _decode_outputs(outputs: Any) -> list[RequestedOutput] | None:
    """Requested outputs, first occurrence of a name wins (Triton keeps a set). An empty list asks
    for every output, as no list does."""
    if type(outputs) is not list:
        raise invalid_argument(f"Unable to parse 'outputs': expected an array, got {_type_name(outputs)}")
    requested: dict[str, RequestedOutput] = {}
    for index, output in enumerate(outputs):
        if type(output) is not dict:
            raise invalid_argument(
                f"Unable to parse 'outputs': output {index} must be an object, got {_type_name(output)}"
            )
        parameters = output.get("parameters")
        if parameters is None:
            parameters = {}
        elif type(parameters) is not dict:
            raise invalid_argument(
                f"Unable to parse 'parameters' of output {index}: expected an object, "
                f"got {_type_name(parameters)}"
            )
        name = output.get("name")
        if type(name) is not str:
            raise invalid_argument(f"Unable to parse 'name': output {index} needs a string 'name'")
        classification = parameters.get("classification", 0)
        if not _is_uint(classification):
            raise invalid_argument(
                f"Unable to set 'classification': output '{name}' needs an unsigned integer, "
                f"got {classification!r}"
            )
        if "shared_memory_region" in parameters:
            region = parameters["shared_memory_region"]
            if type(region) is not str:
                raise invalid_argument("Unable to parse 'shared_memory_region': expected a string")
            raise not_found(f"Unable to find shared memory region: '{region}'")
        binary = parameters.get("binary_data", False)
        if type(binary) is not bool:
            raise invalid_argument(
                f"Unable to parse 'binary_data': output '{name}' needs a boolean, got {binary!r}"
            )
        if name not in requested:
            requested[name] = RequestedOutput(name, binary, classification, dict(parameters))
    return list(requested.values()) or None


# --- response encoding ----------------------------------------------------------------------------


def unsendable_output(model: str, name: str, array: np.ndarray, datatype: str,
                      exc: Exception) -> InferenceError:
    """The error when a model returned an output its config does not declare (a Python model's
    bug): its data cannot be sent as the configured datatype. One message for every encoder."""
    return internal(
        f"output '{name}' of model '{model}' holds {array.dtype} data that cannot be sent as its configured "
        f"datatype {datatype}: {exc}"
    )

def encode_response(
    response: InferResponse,
    request: InferRequest,
    config: Mapping[str, Any],
    *,
    labels: Mapping[str, Sequence[str]] | None = None,
    io: ModelIO | None = None,
) -> tuple[bytes, dict[str, str]]:
    """The HTTP body and headers for `response` to `request` (`io`: the config's ModelIO when the
    caller keeps one, else it is made here).

    Outputs: the ones the request asked for (all of them when it named none), in the order the
    model's Triton backend answers with them (`ModelIO.response_order`). An output is binary when its
    request says `binary_data: true`, or, for outputs not named, when the request parameter
    `binary_data_output` is true; its bytes follow the JSON in output order. `classification: k`
    replaces an output with its top-k "value:index[:label]" strings (Triton's classification
    extension; `labels` maps output names to their label file lines).
    """
    if io is None:
        io = ModelIO(config)
    datatypes = io.output_types()
    batched = io.batched
    if request.requested_outputs is None:
        default_binary = request.parameters.get("binary_data_output") is True
        selection = {name: (default_binary, 0) for name in response.outputs}
    else:
        selection = {o.name: (o.binary_data, o.classification) for o in reversed(request.requested_outputs)}

    entries: list[dict[str, Any]] = []
    chunks: list[Any] = []
    for name in io.response_order(n for n in response.outputs if n in selection):
        binary, class_count = selection[name]
        array = np.asarray(response.outputs[name])
        datatype = datatypes.get(name) or tensor_datatype(array)
        if class_count > 0:
            array = classify(array, datatype, class_count, batched, (labels or {}).get(name))
            datatype = "BYTES"
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        try:
            data = None if binary else json_data(array, datatype)
            raw = output_bytes(array, datatype) if data is None else None
        except (ValueError, TypeError, OverflowError) as exc:
            raise unsendable_output(response.model_name, name, array, datatype, exc) from None
        if data is None:  # binary requested, or BYTES that are not UTF-8 (JSON cannot carry them)
            size = len(raw) if isinstance(raw, bytes) else raw.nbytes
            entry["parameters"] = {"binary_data_size": size}
            if size:
                chunks.append(raw)
        else:
            entry["data"] = data
        entries.append(entry)

    document: dict[str, Any] = {}
    response_id = response.id or request.id
    if response_id:
        document["id"] = response_id
    document["model_name"] = response.model_name
    document["model_version"] = str(response.model_version)
    if response.parameters:
        document["parameters"] = response.parameters
    document["outputs"] = entries
    header = orjson.dumps(document, option=_JSON_OPTIONS)
    if not chunks:
        return header, {"content-type": "application/json"}
    body = b"".join([header, *chunks])
    return body, {
        "content-type": "application/octet-stream",
        "inference-header-content-length": str(len(header)),
    }


def encode_error(error: InferenceError | str) -> bytes:
    """`{"error": message}` as Triton answers every failed request."""
    message = error.message if isinstance(error, InferenceError) else str(error)
    return orjson.dumps({"error": message})


def _typed(array: np.ndarray, datatype: str) -> np.ndarray:
    """`array` as the flat, C-contiguous numpy storage of `datatype` (BF16: uint16 bit patterns;
    float arrays or ml_dtypes.bfloat16 arrays given for a BF16 output are converted)."""
    if datatype == "BF16":
        if array.dtype == np.uint16 or array.dtype.name == "bfloat16":
            array = array.view(np.uint16)
        else:
            array = bf16_from_float32(array.astype(np.float32, copy=False))
        return np.ascontiguousarray(array).reshape(-1)
    expected = numpy_dtype(datatype)
    if array.dtype != expected:
        array = array.astype(expected)
    return np.ascontiguousarray(array).reshape(-1)


def _bytes_items(array: np.ndarray) -> list:
    return array.reshape(-1).tolist()


def output_bytes(array: np.ndarray, datatype: str) -> bytes | np.ndarray:
    """An output's tensor data as the binary extension (and gRPC's raw_output_contents) carry it:
    BYTES length-prefixed, everything else flat little-endian (a uint8 view when possible)."""
    if datatype == "BYTES":
        return serialize_bytes(_bytes_items(array))
    flat = _typed(array, datatype)
    return flat.view(np.uint8)


def json_data(array: np.ndarray, datatype: str) -> Any:
    """The flat JSON `data` of an output: a numpy array orjson serialises natively, a list of
    strings for BYTES, or a pre-serialised fragment when floats are not finite (Triton writes
    NaN/Infinity, which JSON-with-NaN parsers such as tritonclient's read). None when the output
    cannot be JSON (BYTES that are not UTF-8)."""
    if datatype == "BYTES":
        try:
            return [
                item if type(item) is str else element_bytes(item).decode("utf-8")
                for item in _bytes_items(array)
            ]
        except UnicodeDecodeError:
            return None
    flat = _typed(array, datatype)
    if datatype == "BF16":
        flat = float32_from_bf16(flat)
    if datatype in _FLOATS and not np.isfinite(flat).all():
        return orjson.Fragment(json.dumps(flat.tolist()).encode())
    return flat


def classify(
    array: np.ndarray, datatype: str, count: int, batched: bool, labels: Sequence[str] | None
) -> np.ndarray:
    """Top-`count` classes per batch entry as "value:index[:label]" strings (Triton's
    TopkClassifications): values descending, ties by index, values printed like C++ to_string."""
    if datatype not in _CLASSIFIABLE:
        raise invalid_argument(f"class result not available for output due to unsupported type '{datatype}'")
    values = _typed(array, datatype).reshape(array.shape)
    batch = values.shape[0] if batched and values.ndim > 0 else 0
    rows = values.reshape(batch, -1) if batch > 0 else values.reshape(1, -1)
    width = rows.shape[1]
    top = min(count, width)
    # Stable descending order: sort the reversed rows ascending, then read from the end.
    order = (width - 1 - np.argsort(rows[:, ::-1], axis=1, kind="stable"))[:, ::-1][:, :top]
    integer = datatype in _INTEGERS
    strings: list[str] = []
    for row, indices in zip(rows, order, strict=True):
        for index in indices.tolist():
            value = row[index]
            text = f"{int(value)}:{index}" if integer else f"{float(value):f}:{index}"
            if labels is not None and index < len(labels):
                text += f":{labels[index]}"
            strings.append(text)
    result = np.empty(len(strings), dtype=np.object_)
    result[:] = strings
    return result.reshape([batch, top] if batch > 0 else [top])
