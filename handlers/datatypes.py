"""Triton tensor datatypes: protocol names ("FP32"), config names ("TYPE_FP32") and numpy.

BYTES tensors are numpy object arrays of `bytes`. BF16 has no numpy type: it travels as the raw
16-bit pattern in a `uint16` array (`BF16_STORAGE`), converted only where a value is needed.
"""

from __future__ import annotations

import numpy as np

BF16_STORAGE = np.dtype(np.uint16)

_NUMPY = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BYTES": np.dtype(np.object_),
    "BF16": BF16_STORAGE,
}

PROTOCOL_DATATYPES = frozenset(_NUMPY)


def numpy_dtype(datatype: str) -> np.dtype:
    """numpy dtype for a protocol datatype name (KeyError if unknown)."""
    return _NUMPY[datatype]


def from_config_type(config_type: str) -> str:
    """'TYPE_FP32' -> 'FP32', 'TYPE_STRING' -> 'BYTES' (Triton's protocol names)."""
    name = config_type[5:] if config_type.startswith("TYPE_") else config_type
    return "BYTES" if name == "STRING" else name


def from_numpy(dtype: np.dtype) -> str:
    """Protocol datatype for a numpy dtype (object/bytes/str -> BYTES)."""
    dtype = np.dtype(dtype)
    if dtype.kind in ("O", "S", "U"):
        return "BYTES"
    for name, candidate in _NUMPY.items():
        if name != "BF16" and candidate == dtype:
            return name
    raise KeyError(f"no Triton datatype for numpy dtype {dtype}")


def element_size(datatype: str) -> int:
    """Bytes per element; 0 for BYTES (variable length)."""
    return 0 if datatype == "BYTES" else _NUMPY[datatype].itemsize
