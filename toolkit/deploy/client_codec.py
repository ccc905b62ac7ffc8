"""Client side of the v2 inference protocol: numpy arrays -> request body, response body -> arrays.

The JSON and binary-tensor framing are the KServe v2 protocol with Triton's binary data extension
(what `tritonclient.http` sends); BYTES elements are serialised with tritonclient's own helpers.
Input files (`--input NAME=FILE`) are read here too:

- `.npy`: the array (dtype and shape as saved; byte and unicode string arrays become BYTES)
- `.json`: a nested list (shape from the nesting, datatype from the model's metadata), or a v2
  input object {"datatype": ..., "shape": [...], "data": [...]}
- anything else: raw bytes, as one BYTES element, or as the bytes of a UINT8 / INT8 / numeric
  tensor with the model's shape (one -1 dimension is inferred; a batch dimension becomes 1)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DeployError, DeployOptionError

HEADER_LENGTH = "Inference-Header-Content-Length"


@dataclass
class InputTensor:
    name: str
    datatype: str
    array: np.ndarray


def _np_dtype(datatype: str) -> np.dtype:
    from tritonclient.utils import triton_to_np_dtype

    if datatype == "BF16":
        raise DeployOptionError("BF16 inputs are not supported by toolkit invoke (numpy has no bfloat16): use tritonclient")
    dtype = triton_to_np_dtype(datatype)
    if dtype is None:
        raise DeployOptionError(f"unknown datatype '{datatype}'")
    return np.dtype(dtype)


def _datatype_of(array: np.ndarray) -> str:
    from tritonclient.utils import np_to_triton_dtype

    if array.dtype.kind in ("S", "U", "O"):
        return "BYTES"
    datatype = np_to_triton_dtype(array.dtype)
    if datatype is None:
        raise DeployOptionError(f"numpy dtype {array.dtype} has no v2 datatype")
    return datatype


def _as_bytes_array(array: np.ndarray) -> np.ndarray:
    flat = [x.encode() if isinstance(x, str) else bytes(x) for x in array.reshape(-1).tolist()]
    result = np.empty(len(flat), dtype=object)
    result[:] = flat
    return result.reshape(array.shape)


def _concrete_shape(shape: list[int], size: int, name: str) -> list[int]:
    """The model's shape with its variable dimensions fixed for `size` elements."""
    dims = list(shape)
    unknown = [i for i, d in enumerate(dims) if d < 0]
    if len(unknown) > 1:
        for i in unknown[:-1]:
            dims[i] = 1  # leading variable dims (the batch) are 1
        unknown = unknown[-1:]
    known = math.prod(d for d in dims if d >= 0)
    if unknown:
        if known == 0 or size % known:
            raise DeployOptionError(f"input {name}: {size} elements do not fit shape {shape}")
        dims[unknown[0]] = size // known
    elif known != size:
        raise DeployOptionError(f"input {name}: {size} elements, the model expects shape {shape} ({known})")
    return dims


def load_input(name: str, path: Path, metadata: dict[str, Any] | None) -> InputTensor:
    """Read `path` as the tensor `name` (see the module docstring)."""
    declared = {i["name"]: i for i in (metadata or {}).get("inputs", [])}
    spec = declared.get(name)
    if metadata is not None and spec is None:
        raise DeployOptionError(f"the model has no input '{name}' (inputs: {', '.join(declared) or 'none'})")
    if not path.is_file():
        raise DeployOptionError(f"input file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        try:
            array = np.load(path, allow_pickle=False)
        except ValueError as exc:
            raise DeployOptionError(f"{path}: {exc} (save strings as a bytes or unicode array, not objects)") from None
        datatype = _datatype_of(array)
        if datatype == "BYTES":
            array = _as_bytes_array(array)
        elif spec and spec["datatype"] != datatype and spec["datatype"] != "BYTES":
            array = array.astype(_np_dtype(spec["datatype"]))
            datatype = spec["datatype"]
        return InputTensor(name, datatype, array)
    if suffix == ".json":
        try:
            document = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DeployOptionError(f"{path} is not JSON: {exc}") from None
        if isinstance(document, dict):
            datatype = document.get("datatype") or (spec or {}).get("datatype")
            data, shape = document.get("data"), document.get("shape")
        else:
            datatype, data, shape = (spec or {}).get("datatype"), document, None
        if datatype is None:
            raise DeployOptionError(f"{path}: give a datatype ({{\"datatype\": ..., \"data\": ...}}) or let invoke read the model's metadata")
        if datatype == "BYTES":
            array = _as_bytes_array(np.array(data, dtype=object))
        else:
            array = np.array(data, dtype=_np_dtype(datatype))
        if shape is not None:
            array = array.reshape(shape)
        return InputTensor(name, datatype, array)
    raw = path.read_bytes()
    datatype = (spec or {}).get("datatype", "BYTES")
    shape = (spec or {}).get("shape", [-1])
    if datatype == "BYTES":
        element = np.empty(1, dtype=object)
        element[0] = raw
        return InputTensor(name, datatype, element.reshape(_concrete_shape(shape, 1, name)))
    dtype = _np_dtype(datatype)
    if len(raw) % dtype.itemsize:
        raise DeployOptionError(f"{path}: {len(raw)} bytes is not a whole number of {datatype} elements")
    array = np.frombuffer(raw, dtype=dtype)
    return InputTensor(name, datatype, array.reshape(_concrete_shape(shape, array.size, name)))


def _json_data(array: np.ndarray, datatype: str) -> list[Any]:
    if datatype == "BYTES":
        try:
            return [x.decode("utf-8") for x in array.reshape(-1).tolist()]
        except UnicodeDecodeError:
            raise DeployOptionError("a BYTES input is not UTF-8 text: send it with --binary") from None
    return array.reshape(-1).tolist()


def encode_request(
    inputs: list[InputTensor], outputs: list[str] | None, binary: bool, request_id: str | None = None
) -> tuple[bytes, dict[str, str]]:
    """(body, headers) of a v2 infer request."""
    from tritonclient.utils import serialize_byte_tensor

    header: dict[str, Any] = {}
    if request_id:
        header["id"] = request_id
    payload: list[bytes] = []
    entries = []
    for tensor in inputs:
        entry: dict[str, Any] = {"name": tensor.name, "shape": list(tensor.array.shape), "datatype": tensor.datatype}
        if binary:
            if tensor.datatype == "BYTES":
                serialized = serialize_byte_tensor(tensor.array)
                raw = serialized.item() if serialized.size > 0 else b""
            else:
                raw = np.ascontiguousarray(tensor.array).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            payload.append(raw)
        else:
            entry["data"] = _json_data(tensor.array, tensor.datatype)
        entries.append(entry)
    header["inputs"] = entries
    if outputs:
        header["outputs"] = [{"name": n, "parameters": {"binary_data": binary}} for n in outputs]
    elif binary:
        header["parameters"] = {"binary_data_output": True}
    text = json.dumps(header, separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json"}
    if binary:
        headers[HEADER_LENGTH] = str(len(text))
        headers["Content-Type"] = "application/octet-stream"
    return text + b"".join(payload), headers


@dataclass
class InferResult:
    response: dict[str, Any]  # the JSON part, binary outputs without data
    outputs: dict[str, np.ndarray]


def decode_response(body: bytes, headers: dict[str, str]) -> InferResult:
    from tritonclient.utils import deserialize_bytes_tensor

    lowered = {k.lower(): v for k, v in headers.items()}
    header_length = lowered.get(HEADER_LENGTH.lower())
    length = int(header_length) if header_length is not None else len(body)
    if not 0 <= length <= len(body):
        raise DeployError(f"bad {HEADER_LENGTH} {header_length} for a {len(body)} byte response")
    try:
        response = json.loads(body[:length])
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DeployError(f"the response is not v2 JSON: {exc}", detail=body[:500].decode(errors="replace")) from None
    offset = length
    outputs: dict[str, np.ndarray] = {}
    for output in response.get("outputs", []):
        name, datatype, shape = output["name"], output["datatype"], output["shape"]
        size = (output.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            raw = body[offset: offset + size]
            if len(raw) != size:
                raise DeployError(f"output {name}: the response ends before its {size} bytes")
            offset += size
            if datatype == "BYTES":
                array = deserialize_bytes_tensor(raw)
            else:
                array = np.frombuffer(raw, dtype=_np_dtype(datatype))
            outputs[name] = array.reshape(shape)
        else:
            data = output.get("data", [])
            if datatype == "BYTES":
                outputs[name] = _as_bytes_array(np.array(data, dtype=object)).reshape(shape)
            else:
                outputs[name] = np.array(data, dtype=_np_dtype(datatype)).reshape(shape)
    return InferResult(response, outputs)


def response_json(result: InferResult) -> dict[str, Any]:
    """The response with every output's data inline (binary ones decoded), for printing."""
    document = json.loads(json.dumps(result.response))
    for output in document.get("outputs", []):
        array = result.outputs.get(output["name"])
        if array is None:
            continue
        params = output.get("parameters") or {}
        params.pop("binary_data_size", None)
        if not params:
            output.pop("parameters", None)
        if output["datatype"] == "BYTES":
            output["data"] = [x.decode("utf-8", errors="backslashreplace") for x in array.reshape(-1).tolist()]
        else:
            output["data"] = array.reshape(-1).tolist()
    return document


def save_npy(result: InferResult, directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, array in result.outputs.items():
        if array.dtype == object:
            array = np.array(array.reshape(-1).tolist(), dtype=bytes).reshape(array.shape)  # no pickle needed
        path = directory / f"{name.replace('/', '_')}.npy"
        np.save(path, array, allow_pickle=False)
        written.append(path)
    return written
