"""Batch inputs and batch outputs (a config's `batch_input` and `batch_output`): tensors a backend
makes from the batch itself, and outputs it cuts by a source input's shape instead of the batch
dimension. Triton's ragged batching (docs/user_guide/ragged_batching.md) rests on them.

What Triton's backend library does for the onnxruntime and pytorch backends:

- `BatchInput.tensor(requests)` is BackendInputCollector::BatchInputShape + ProcessBatchInput.
  Each request's source input counts with the shape the backend sees (batch dimension included,
  after the input's `reshape`):
  - BATCH_ELEMENT_COUNT: [requests], each request's element count;
  - BATCH_ACCUMULATED_ELEMENT_COUNT: [requests], their running sum;
  - BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO: [requests + 1], 0 then the running sum;
  - BATCH_MAX_ELEMENT_COUNT_AS_SHAPE: [largest element count], a tensor only its shape tells
    about (Triton leaves its contents unset; zeros here);
  - BATCH_ITEM_SHAPE: [batch items, rank - 1], each batch item's shape without the batch dimension;
  - BATCH_ITEM_SHAPE_FLATTEN: the same values in one dimension.
  The data type is the batch input's, TYPE_FP32 or TYPE_INT32.
- `BatchOutput.scatter(array, requests)` is BackendOutputResponder::ProcessBatchOutput
  (BATCH_SCATTER_WITH_INPUT_SHAPE): each request gets the next elements of the flattened output,
  shaped as the output's `reshape.shape` (else `dims`) behind the batch dimension, every -1 taking
  the size of the source input's request shape at the same position. Where Triton would read past
  the output (it does not check), the batch fails with an INTERNAL error naming the output.

`split_batch` cuts a batch's outputs per request: batch outputs by `scatter`, every other output
by the batch dimension (merge.split_outputs).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from itertools import accumulate
from typing import Any

import numpy as np

from ..datatypes import from_config_type, numpy_dtype
from ..inference import InferRequest
from .merge import split_outputs

__all__ = ["BatchInput", "BatchOutput", "batch_inputs", "batch_outputs", "split_batch"]

_DTYPES = {"TYPE_FP32": np.dtype(np.float32), "TYPE_INT32": np.dtype(np.int32)}
KINDS = (
    "BATCH_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT",
    "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
    "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
    "BATCH_ITEM_SHAPE",
    "BATCH_ITEM_SHAPE_FLATTEN",
)


class BatchInput:
    """One `batch_input` entry: the tensor every one of its `target_name`s receives."""

    __slots__ = ("dtype", "kind", "source", "targets")

    def __init__(self, entry: Mapping[str, Any]) -> None:
        self.kind = str(entry.get("kind", "BATCH_ELEMENT_COUNT"))
        if self.kind not in KINDS:
            raise ValueError(f"unexpected batch input kind '{self.kind}'")
        self.targets = [str(t) for t in entry.get("target_name", ())]
        sources = entry.get("source_input", ())
        if len(sources) != 1:
            raise ValueError(f"batch input kind '{self.kind}' expects 1 source input, got {len(sources)}")
        self.source = str(sources[0])
        data_type = entry.get("data_type", "TYPE_INVALID")
        if data_type not in _DTYPES:
            raise ValueError("batch input data type must be TYPE_INT32 or TYPE_FP32")
        self.dtype = _DTYPES[data_type]

    def tensor(self, requests: Sequence[InferRequest]) -> np.ndarray:
        shapes = [_source_shape(request, self.source) for request in requests]
        kind = self.kind
        if kind == "BATCH_ELEMENT_COUNT":
            values: list[int] = [math.prod(shape) for shape in shapes]
        elif kind == "BATCH_ACCUMULATED_ELEMENT_COUNT":
            values = list(accumulate(math.prod(shape) for shape in shapes))
        elif kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":
            values = [0, *accumulate(math.prod(shape) for shape in shapes)]
        elif kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE":
            return np.zeros(max((math.prod(shape) for shape in shapes), default=0), dtype=self.dtype)
        else:  # BATCH_ITEM_SHAPE, BATCH_ITEM_SHAPE_FLATTEN: one row per batch item
            if any(len(shape) == 0 for shape in shapes):
                raise ValueError(f"batch input kind '{kind}' needs source input '{self.source}' with a batch dimension")
            ranks = {len(shape) - 1 for shape in shapes}
            if len(ranks) > 1:
                raise ValueError(
                    f"batch input kind '{kind}': the requests' '{self.source}' inputs differ in rank ({sorted(ranks)})"
                )
            rank = ranks.pop()
            rows = [list(shape[1:]) for shape in shapes for _ in range(shape[0])]
            array = np.array(rows, dtype=self.dtype).reshape(len(rows), rank)
            return array.reshape(-1) if kind == "BATCH_ITEM_SHAPE_FLATTEN" else array
        return np.array(values, dtype=self.dtype)


class BatchOutput:
    """One `batch_output` entry (BATCH_SCATTER_WITH_INPUT_SHAPE) for its output `target`."""

    __slots__ = ("dtype", "shape", "source", "target")

    def __init__(self, entry: Mapping[str, Any], config: Mapping[str, Any]) -> None:
        kind = entry.get("kind", "BATCH_SCATTER_WITH_INPUT_SHAPE")
        if kind != "BATCH_SCATTER_WITH_INPUT_SHAPE":
            raise ValueError(f"unexpected batch output kind '{kind}'")
        targets, sources = entry.get("target_name", ()), entry.get("source_input", ())
        if len(sources) != 1 or not targets:
            raise ValueError(f"batch output kind '{kind}' expects 1 source input and a target name")
        self.target, self.source = str(targets[0]), str(sources[0])
        output = next((io for io in config.get("output", ()) if io.get("name") == self.target), None)
        if output is None:
            raise ValueError(f"unknown target output name '{self.target}'")
        self.dtype = numpy_dtype(from_config_type(output.get("data_type", "")))
        dims = output["reshape"].get("shape", ()) if "reshape" in output else output.get("dims", ())
        batch = [-1] if int(config.get("max_batch_size", 0)) > 0 else []
        self.shape = [*batch, *(int(d) for d in dims)]

    def scatter(self, array: np.ndarray, requests: Sequence[InferRequest]) -> list[np.ndarray]:
        """Each request's part of `array`, in request order."""
        if array.dtype != self.dtype:
            raise ValueError(
                f"batch output '{self.target}' is {array.dtype}, its config's data type "
                f"is {self.dtype}"
            )
        flat = np.ascontiguousarray(array).reshape(-1)
        parts: list[np.ndarray] = []
        offset = 0
        for request in requests:
            source = _source_shape(request, self.source)
            if len(source) < len(self.shape):
                raise ValueError(
                    f"batch output '{self.target}' has {len(self.shape)} dimensions, but "
                    f"source input '{self.source}' of a request has shape {list(source)}"
                )
            shape = tuple(source[i] if d == -1 else d for i, d in enumerate(self.shape))
            count = math.prod(shape)
            if offset + count > flat.size:
                raise ValueError(
                    f"batch output '{self.target}' holds {flat.size} elements, fewer than the "
                    f"shapes of the requests' '{self.source}' inputs take"
                )
            parts.append(flat[offset : offset + count].reshape(shape))
            offset += count
        return parts


def batch_inputs(config: Mapping[str, Any]) -> list[BatchInput]:
    return [BatchInput(entry) for entry in config.get("batch_input", ())]


def batch_outputs(config: Mapping[str, Any]) -> dict[str, BatchOutput]:
    """The batch outputs by target output name (Triton's FindBatchOutput takes the first)."""
    found: dict[str, BatchOutput] = {}
    for entry in config.get("batch_output", ()):
        output = BatchOutput(entry, config)
        found.setdefault(output.target, output)
    return found


def split_batch(
    outputs: Mapping[str, np.ndarray],
    requests: Sequence[InferRequest],
    sizes: Sequence[int],
    scattered: Mapping[str, BatchOutput],
) -> list[dict[str, np.ndarray]]:
    """Each request's outputs: batch outputs scattered by their source inputs, the rest cut along
    the batch dimension into `sizes`. Raises ValueError naming the output that does not fit."""
    if not scattered:
        return split_outputs(outputs, sizes)
    parts = split_outputs({n: a for n, a in outputs.items() if n not in scattered}, sizes)
    for name, array in outputs.items():
        if name in scattered:
            for part, piece in zip(parts, scattered[name].scatter(array, requests)):
                part[name] = piece
    return parts


def _source_shape(request: InferRequest, name: str) -> tuple[int, ...]:
    array = request.inputs.get(name)
    if array is None:
        raise ValueError(f"source input '{name}' is missing from a request of the batch")
    return tuple(array.shape)

