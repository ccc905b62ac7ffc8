"""`triton_python_backend_utils` (pb_utils) for Triton python-backend models served by this runtime.

A model's `import triton_python_backend_utils as pb_utils` gets this module: the runtime puts it
in `sys.modules` under that name before importing model.py. It mirrors tritonserver 2.51's module
(the python file plus what the stub adds from `c_python_backend_utils`): the same names,
signatures, defaults and messages. Deviations are listed in docs/python-backend.md.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from . import host as _host
from .logger import Logger
from .metric_family import Metric, MetricFamily, MetricKind
from .model_config import ModelConfig
from .request import (
    TRITONSERVER_MEMORY_CPU,
    TRITONSERVER_MEMORY_GPU,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_END,
    TRITONSERVER_REQUEST_FLAG_SEQUENCE_START,
    TRITONSERVER_REQUEST_RELEASE_ALL,
    TRITONSERVER_REQUEST_RELEASE_RESCHEDULE,
    TRITONSERVER_RESPONSE_COMPLETE_FINAL,
    InferenceRequest,
    InferenceResponseSender,
    InferenceTrace,
    PreferredMemory,
    ResponseIterator,
)
from .response import InferenceResponse
from .tensor import Tensor
from .triton_error import TritonError, TritonModelException

__all__ = [
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "Logger",
    "Metric",
    "MetricFamily",
    "MetricKind",
    "ModelConfig",
    "PreferredMemory",
    "ResponseIterator",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_model_dir",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]

TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}

# TRITONSERVER_DataType numbers <-> numpy (BF16 = 14 has no numpy type).
_NUMBER_TO_NUMPY: dict[int, Any] = {
    1: np.bool_,
    2: np.uint8,
    3: np.uint16,
    4: np.uint32,
    5: np.uint64,
    6: np.int8,
    7: np.int16,
    8: np.int32,
    9: np.int64,
    10: np.float16,
    11: np.float32,
    12: np.float64,
    13: np.object_,
}
_NUMPY_TO_NUMBER: dict[Any, int] = {np.dtype(t): n for n, t in _NUMBER_TO_NUMPY.items()}
_UINT32 = struct.Struct("<I")


def serialize_byte_tensor(input_tensor: np.ndarray) -> Any:
    """BYTES elements as one buffer of 4-byte little-endian lengths followed by the bytes, in C
    order: `bytes` as they are, anything else as `str(x)` in UTF-8. An empty tensor gives `()`,
    a non-bytes dtype None (Triton's return values)."""
    if input_tensor.size == 0:
        return ()
    if input_tensor.dtype != np.object_ and input_tensor.dtype.type != np.bytes_:
        return None
    parts: list[bytes] = []
    is_object = input_tensor.dtype == np.object_
    for item in np.nditer(input_tensor, flags=["refs_ok"], order="C"):
        value = item.item()
        if is_object and type(value) is not bytes:
            value = str(value).encode("utf-8")
        parts.append(_UINT32.pack(len(value)))
        parts.append(value)
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: bytes) -> np.ndarray:
    """The inverse of `serialize_byte_tensor`: a 1-D object array of `bytes`."""
    elements: list[bytes] = []
    offset = 0
    buffer = memoryview(encoded_tensor)
    while offset < len(buffer):
        (length,) = _UINT32.unpack_from(buffer, offset)
        offset += 4
        elements.append(bytes(buffer[offset : offset + length]))
        offset += length
    out = np.empty(len(elements), dtype=object)
    out[:] = elements
    return out


def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    for tensor in inference_request.inputs():
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    for tensor in inference_response.output_tensors():
        if tensor.name() == name:
            return tensor
    return None


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for properties in model_config.get("input", []) if "input" in model_config else []:
        if properties["name"] == name:
            return properties
    return None


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    for properties in model_config.get("output", []) if "output" in model_config else []:
        if properties["name"] == name:
            return properties
    return None


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    """True when the config asks for decoupled responses (zero or many per request, sent through
    `request.get_response_sender()`)."""
    if "model_transaction_policy" in model_config:
        return bool(model_config["model_transaction_policy"].get("decoupled", False))
    return False


def triton_to_numpy_type(data_type: int) -> Any:
    return _NUMBER_TO_NUMPY.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    if data_type is bool:  # Triton compares with ==, and the builtin bool is not np.bool_
        return None
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind == "S":
        return 13
    return _NUMPY_TO_NUMBER.get(dtype)


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def get_model_dir() -> str:
    """The folder of the calling model's model.py (its version folder)."""
    context = _host.current_context()
    if context is None:
        raise TritonModelException("get_model_dir() is only available to a model served by the runtime")
    return context.model_dir


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether a model of this repository (a version of it, "" = any) is ready to serve."""
    current = _host.current_host()
    if current is None:
        raise TritonModelException(
            "Failed to check model readiness: this pb_utils module is not running inside a served model"
        )
    return current.is_model_ready(str(model_name), "" if model_version is None else str(model_version))


def load_model(model_name: str, config: str = "", files: Any = None) -> None:
    raise TritonModelException(
        f"Failed to load model: loading models at runtime is not supported here ('{model_name}'): an image "
        "serves the models it was built with"
    )


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    raise TritonModelException(
        f"Failed to unload model: unloading models at runtime is not supported here ('{model_name}'): an image "
        "serves the models it was built with"
    )


def __getattr__(name: str) -> Any:
    """A name this module does not have fails as it would in Triton's own module (models see it
    as `triton_python_backend_utils`, not under this runtime's package path)."""
    raise AttributeError(f"module 'triton_python_backend_utils' has no attribute '{name}'")
