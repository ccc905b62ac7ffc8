"""`pb_utils.Tensor`: a named numpy array, as the python backend's `c_python_backend_utils.Tensor`.

Mirrors tritonserver 2.51's pybind class (pb_tensor.cc): `Tensor(name, numpy_array)` with
positional arguments only, `name()`, `shape()` (a list), `as_numpy()`, `is_cpu()`,
`triton_dtype()`, `to_dlpack()` and the static `from_dlpack(name, tensor)`.

BYTES tensors are numpy object arrays (elements `bytes`, or anything `serialize_byte_tensor`
accepts) or `np.bytes_` arrays; numpy unicode arrays are refused as Triton refuses them. BF16 has
no numpy type: a BF16 input keeps its 16-bit patterns and, as in Triton, `as_numpy()` refuses it.

Deviation (docs/python-backend.md): Triton 2.51's `triton_dtype()` raises TypeError (its return
type is not registered with pybind); here it returns the TRITONSERVER_DataType number
(`numpy_to_triton_type` numbering: TYPE_FP32 = 11, BYTES = 13, BF16 = 14).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .triton_error import TritonModelException

# TRITONSERVER_DataType numbering (tritonserver.h), as numpy_to_triton_type returns it.
DATATYPE_NUMBERS: dict[str, int] = {
    "BOOL": 1,
    "UINT8": 2,
    "UINT16": 3,
    "UINT32": 4,
    "UINT64": 5,
    "INT8": 6,
    "INT16": 7,
    "INT32": 8,
    "INT64": 9,
    "FP16": 10,
    "FP32": 11,
    "FP64": 12,
    "BYTES": 13,
    "BF16": 14,
}
_NUMERIC: dict[np.dtype, str] = {
    np.dtype(np.bool_): "BOOL",
    np.dtype(np.uint8): "UINT8",
    np.dtype(np.uint16): "UINT16",
    np.dtype(np.uint32): "UINT32",
    np.dtype(np.uint64): "UINT64",
    np.dtype(np.int8): "INT8",
    np.dtype(np.int16): "INT16",
    np.dtype(np.int32): "INT32",
    np.dtype(np.int64): "INT64",
    np.dtype(np.float16): "FP16",
    np.dtype(np.float32): "FP32",
    np.dtype(np.float64): "FP64",
}

_DLPACK_CPU = 1  # kDLCPU
_DLPACK_CUDA_HOST = 3  # kDLCUDAHost: pinned host memory, readable from the CPU


def datatype_of(array: np.ndarray) -> str:
    """The Triton datatype of a numpy array a model hands to `Tensor` (Triton's
    numpy_to_triton_type in pb_tensor.cc); anything else is TritonModelException as there."""
    dtype = array.dtype
    if dtype.kind in ("O", "S"):
        return "BYTES"
    name = _NUMERIC.get(np.dtype(dtype.str))  # ignore byte order tags / metadata
    if name is None or not dtype.isnative:
        raise TritonModelException("NumPy dtype is not supported.")
    return name


def _incompatible(args: tuple, kwargs: dict) -> TypeError:
    invoked = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()])
    if kwargs and not args:
        invoked = "kwargs: " + invoked
    return TypeError(
        "__init__(): incompatible constructor arguments. The following argument types are supported:\n"
        "    1. c_python_backend_utils.Tensor(arg0: str, arg1: numpy.ndarray)\n\n"
        f"Invoked with: {invoked}"
    )


class Tensor:
    """A named tensor. Built by a model from a numpy array, or by the runtime for inputs and BLS
    outputs (`Tensor._wrap`, with the datatype the request declared)."""

    __slots__ = ("_array", "_datatype", "_name")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if len(args) == 2 and isinstance(args[0], bytes):  # pybind11 takes bytes for a str
            try:
                args = (args[0].decode("utf-8"), args[1])
            except UnicodeDecodeError:
                pass
        if kwargs or len(args) != 2 or not isinstance(args[0], str) or not isinstance(args[1], np.ndarray):
            raise _incompatible(args, kwargs)
        name, array = args
        self._datatype = datatype_of(array)
        self._name = name
        self._array = array if array.flags.c_contiguous else array.copy(order="C")  # keeps 0-d arrays 0-d

    @classmethod
    def _wrap(cls, name: str, array: np.ndarray, datatype: str) -> Tensor:
        tensor = cls.__new__(cls)
        tensor._name = name
        tensor._array = array
        tensor._datatype = datatype
        return tensor

    # -- Triton's methods ---------------------------------------------------------------------------

    def name(self) -> str:
        return self._name

    def shape(self) -> list[int]:
        return [int(d) for d in self._array.shape]

    def triton_dtype(self) -> int:
        return DATATYPE_NUMBERS[self._datatype]

    def is_cpu(self) -> bool:
        return True

    def as_numpy(self) -> np.ndarray:
        if self._datatype == "BF16":
            raise TritonModelException(
                "Tensor dtype is BF16 and cannot be converted to NumPy. Use to_dlpack() and from_dlpack() instead."
            )
        if not self._array.flags.writeable:
            # Triton hands every execute() its own copy of the inputs (in shared memory): models
            # may write into them. Our inputs can be read-only views of the HTTP body.
            self._array = self._array.copy()
        return self._array

    def to_dlpack(self) -> Any:
        if self._datatype == "BYTES":
            raise TritonModelException("DLPack does not have support for string tensors.")
        if self._datatype == "BF16":
            raise TritonModelException(
                "TYPE_BF16 not currently supported: BF16 tensors cannot be exported through DLPack here "
                "(numpy has no bfloat16 type)"
            )
        return self.as_numpy().__dlpack__()  # as_numpy(): writable, which numpy's export requires

    @staticmethod
    def from_dlpack(name: str, tensor: Any) -> Tensor:
        source = _dlpack_source(tensor)
        try:
            array = np.from_dlpack(source)
        except BufferError as exc:  # e.g. a bool or complex tensor numpy cannot take
            raise TritonModelException(f"failed to import the DLPack tensor '{name}': {exc}") from None
        except TypeError as exc:
            raise TritonModelException(f"failed to import the DLPack tensor '{name}': {exc}") from None
        if not array.flags.c_contiguous:
            raise TritonModelException(
                "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored in C-Order are supported."
            )
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"<pb_utils.Tensor name={self._name!r} datatype={self._datatype} shape={self.shape()}>"

    # -- runtime access -------------------------------------------------------------------------------

    @property
    def datatype(self) -> str:
        return self._datatype

    @property
    def array(self) -> np.ndarray:
        """The array as it is (no copy; BF16 bit patterns included)."""
        return self._array


class _Capsule:
    """A bare DLPack capsule (the pre-2023 protocol: `torch.utils.dlpack.to_dlpack(t)`), given the
    `__dlpack__` interface numpy's from_dlpack expects. Capsules carry no device: assumed CPU."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (_DLPACK_CPU, 0)


def _dlpack_source(tensor: Any) -> Any:
    if type(tensor).__name__ == "PyCapsule":
        return _Capsule(tensor)
    if not (hasattr(tensor, "__dlpack__") and hasattr(tensor, "__dlpack_device__")):
        raise TritonModelException(
            "Provided tensor is not supported. Tensor must be a DLPack capsule         or have `__dlpack__` "
            "and `__dlpack_device__` attributes"
        )
    device, _ = tensor.__dlpack_device__()
    if int(device) in (_DLPACK_CPU, _DLPACK_CUDA_HOST):
        return tensor
    # A GPU tensor (torch, cupy, ...): tensors live in host memory here, so copy it over.
    for method in ("cpu", "get"):
        copy = getattr(tensor, method, None)
        if callable(copy):
            host = copy()
            if hasattr(host, "__dlpack__"):
                return host
            return np.asarray(host)
    raise TritonModelException(
        f"DLPack tensor is on device type {int(device)}; this runtime keeps Python-model tensors in host "
        "memory and cannot copy this object to the CPU (give it a .cpu() method or copy it first)"
    )


def bytes_elements(array: np.ndarray) -> np.ndarray:
    """A BYTES array as the runtime carries it: an object array of `bytes` (Triton serialises
    `bytes` as they are and anything else as `str(x)` in UTF-8, see serialize_byte_tensor)."""
    if array.dtype.kind == "O" and all(type(x) is bytes for x in array.flat):
        return array
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)
    for i, item in enumerate(array.flat):
        if isinstance(item, (bytes, bytearray, memoryview)):  # np.bytes_ is a bytes subclass
            flat[i] = bytes(item)
        else:
            flat[i] = str(item).encode("utf-8")
    return out


def to_payload(tensor: Tensor) -> tuple[str, np.ndarray, str]:
    """(name, array, datatype) for the runtime; BYTES as object arrays of bytes."""
    array = tensor.array
    if tensor.datatype == "BYTES":
        array = bytes_elements(array)
    return tensor.name(), array, tensor.datatype
