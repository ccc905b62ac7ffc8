"""Request validation against the model's config, before a request is queued (Triton core's
`InferenceRequest::Normalize` and input checks, tritonserver 2.51).

Public surface: `validate_request(config, request)`. `config` is the model's Triton config JSON
(what `GET /v2/models/M/config` returns). On success the request is ready for the batcher:

- `request.batch_size` is set (the first dimension when max_batch_size > 0, else 1);
- a raw binary request's input is resolved to the model's single input (datatype, deduced shape);
- inputs with a `reshape` are reshaped to it (a view), so batcher and backends see what Triton's
  backends see; the request's own shape was checked against `dims` (with -1 wildcards and the
  batch dimension).

Checks, in Triton's order: requested outputs exist, input count (required and optional inputs),
unknown inputs and batch dimension, batch size, datatype, shape. Each failure raises
`InferenceError` (INVALID_ARG, HTTP 400) with Triton's message, including the
`[request id: ...] ` prefix where Triton's core adds it. Inputs are checked in request order
(Triton's order is that of a hash map). Deviations are listed in docs/protocol.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..datatypes import from_config_type, numpy_dtype
from ..errors import internal, invalid_argument
from ..inference import InferRequest
from ..model_io import ModelIO
from .codec import array_from_buffer, is_raw_input, log_prefix, tensor_datatype

__all__ = ["validate_request"]

_CLASSIFIABLE = frozenset(
    {"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"}
)
_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
    "prepended to each input shape. If you want to specify the full shape including the batch dim in "
    "your input dims config, try setting max_batch_size to zero. See the model configuration docs for "
    "more info on max_batch_size."
)


def validate_request(config: Mapping[str, Any], request: InferRequest, io: ModelIO | None = None) -> None:
    """Check `request` against `config` and prepare it for the batcher (see the module doc).
    `io`: the config's ModelIO when the caller keeps one (a loaded model's), else it is made here."""
    if io is None:
        io = ModelIO(config)
    model = request.model_name
    prefix = log_prefix(request.id)
    inputs = io.inputs
    max_batch_size = io.max_batch_size

    for array in request.inputs.values():
        if is_raw_input(array):
            _resolve_raw_input(request, inputs, max_batch_size, model, prefix)
            break

    if request.requested_outputs:
        outputs = io.outputs
        for output in request.requested_outputs:
            if output.name not in outputs:
                raise invalid_argument(f"unexpected inference output '{output.name}' for model '{model}'")
            datatype = io.output_datatypes[output.name]
            if datatype is None:
                datatype = from_config_type(outputs[output.name]["data_type"])  # KeyError, as unprepared
            if output.classification > 0 and datatype not in _CLASSIFIABLE:
                raise invalid_argument(
                    f"class result not available for output due to unsupported type '{datatype}'"
                )

    required = io.required
    if len(request.inputs) > len(inputs) or len(request.inputs) < len(required):
        raise _count_error(request, inputs, required, model, prefix)
    for name in request.inputs:
        if name not in inputs:
            raise invalid_argument(f"unexpected inference input '{name}' for model '{model}'")
    if any(name not in request.inputs for name in required):
        # Triton 2.51 lets this through to the backend (the count is in range); refused here.
        raise _count_error(request, inputs, required, model, prefix)

    batched = io.batched
    shape_tensors = io.shape_tensors
    first_batch: int | None = None
    for name, array in request.inputs.items():
        if not batched or name in shape_tensors:
            continue
        if array.ndim == 0:
            raise invalid_argument(
                f"{prefix}input '{name}' has no shape but model requires batch dimension for '{model}'"
            )
        # Triton keeps 0 as "not set yet", so a first input of batch 0 lets a second of any batch
        # through (to fail in the backend); here every input must have the first one's batch.
        if first_batch is None:
            first_batch = array.shape[0]
        elif array.shape[0] != first_batch:
            raise invalid_argument(
                f"{prefix}input '{name}' batch size does not match other inputs for '{model}'"
            )
    batch_size = first_batch or 0
    if batch_size > max_batch_size:
        raise invalid_argument(
            f"{prefix}inference request batch-size must be <= {max_batch_size} for '{model}'"
        )
    if batched and batch_size == 0 and any(name not in shape_tensors for name in request.inputs):
        raise invalid_argument(
            f"{prefix}inference request batch-size must be >= 1 for '{model}', got a batch dimension of 0"
        )

    for name, array in list(request.inputs.items()):
        config_io = inputs[name]
        expected = io.input_datatypes[name]
        if expected is None:
            expected = from_config_type(config_io["data_type"])  # KeyError, as unprepared
        actual = tensor_datatype(array)
        if actual != expected:
            raise invalid_argument(
                f"{prefix}inference input '{name}' data-type is '{actual}', but model '{model}' "
                f"expects '{expected}'"
            )
        has_batch = batched and name not in shape_tensors
        shape = array.shape
        dims = io.input_dims[name]
        if not _matches(shape[1:] if has_batch else shape, dims):
            full = ([-1] if batched else []) + list(dims)
            raise invalid_argument(
                f"{prefix}unexpected shape for input '{name}' for model '{model}'. Expected {_dims(full)}, "
                f"got {_dims(shape)}. {_BATCH_NOTE if batched else ''}"
            )
        if "reshape" in config_io:
            request.inputs[name] = _reshape(array, list(shape), list(dims), config_io["reshape"], has_batch, name,
                                            model)

    request.batch_size = batch_size if batched else 1


def _count_error(
    request: InferRequest,
    inputs: Mapping[str, Mapping[str, Any]],
    required: list[str],
    model: str,
    prefix: str,
) -> Exception:
    """Triton's input count message (given inputs in request order)."""
    given = list(request.inputs)
    missing = [name for name in required if name not in request.inputs]
    expected = (
        f"expected {len(inputs)} inputs"
        if len(required) == len(inputs)
        else f"expected number of inputs between {len(required)} and {len(inputs)}"
    )
    return invalid_argument(
        f"{prefix}{expected} but got {len(given)} inputs for model '{model}'. Got input(s) {_names(given)}, "
        f"but missing required input(s) {_names(missing)}. Please provide all required input(s)."
    )


def _names(names: Sequence[str]) -> str:
    return "[" + ",".join(f"'{name}'" for name in names) + "]"


def _dims(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _matches(shape: Sequence[int], dims: Sequence[int]) -> bool:
    if len(shape) != len(dims):
        return False
    for s, d in zip(shape, dims):
        if d != -1 and d != s:
            return False
    return True


def _reshape(
    array: np.ndarray,
    shape: list[int],
    dims: list[int],
    reshape: Mapping[str, Any],
    has_batch: bool,
    name: str,
    model: str,
) -> np.ndarray:
    """The tensor as the backend sees it: `reshape.shape`, its -1s taken from the request's values
    for the -1s of `dims`, in order (Triton's Normalize)."""
    own = shape[1:] if has_batch else shape
    variable = iter(value for value, dim in zip(own, dims, strict=True) if dim == -1)
    target = [next(variable, 0) if int(dim) == -1 else int(dim) for dim in reshape.get("shape", ())]
    if has_batch:
        target = [shape[0], *target]
    if math.prod(target) != array.size:
        raise internal(
            f"input '{name}' of model '{model}' with shape {_dims(shape)} cannot be reshaped to "
            f"{_dims(target)}"
        )
    return array.reshape(target)


def _resolve_raw_input(
    request: InferRequest,
    inputs: Mapping[str, Mapping[str, Any]],
    max_batch_size: int,
    model: str,
    prefix: str,
) -> None:
    """Give a raw binary request's bytes the name, datatype and shape of the model's only input;
    a single variable dimension is deduced from the byte size (Triton's Normalize)."""
    if len(request.inputs) != 1 or len(inputs) != 1:
        raise invalid_argument(
            f"{prefix}Raw request must only have 1 input (found {len(request.inputs)}) to be deduced but got "
            f"{len(inputs)} inputs in '{model}' model configuration"
        )
    (raw,) = request.inputs.values()
    (io,) = inputs.values()
    name = io["name"]
    datatype = from_config_type(io["data_type"])
    shape = [1] if max_batch_size != 0 else []
    dynamic = -1
    count = 1
    for dim in (int(d) for d in io.get("dims", ())):
        if dim == -1:
            if dynamic != -1:
                raise invalid_argument(
                    f"{prefix}The shape of the raw input '{name}' can not be deduced because there are more "
                    "than one variable-sized dimension"
                )
            dynamic = len(shape)
        else:
            count *= dim
        shape.append(dim)
    payload = raw.data
    if datatype == "BYTES":
        if dynamic != -1 or count != 1:
            raise invalid_argument(
                f"{prefix}For BYTE datatype raw input '{name}', the model must have input shape [1]"
            )
        array = np.empty(1, dtype=np.object_)
        array[0] = bytes(payload)
        request.inputs = {name: array.reshape(shape)}
        return
    itemsize = numpy_dtype(datatype).itemsize
    if dynamic != -1:
        shape[dynamic] = raw.size // count // itemsize if count else 0
    expected = math.prod(shape) * itemsize
    if expected != raw.size:
        raise invalid_argument(
            f"{prefix}input byte size mismatch for input '{name}' for model '{model}'. "
            f"Expected {expected}, got {raw.size}"
        )
    request.inputs = {name: array_from_buffer(payload, datatype, shape)}
