"""Merge a batch's inputs along the batch dimension and split the outputs back per request.

What a backend does with the requests the batcher hands it (Triton's BackendInputCollector and
BackendOutputResponder): inputs of all requests are concatenated along dim 0 (ragged inputs are
flattened and concatenated, as the ONNX Runtime backend does), and every output's dim 0 is cut
back into each request's own batch size. A batch of one request is passed through untouched, and
split outputs are views of the batched arrays, never copies. Merged numeric inputs are read-only.

Requests of a non-batching model (max_batch_size 0) are never merged: the scheduler gives them a
batch of their own, and `merge_inputs` refuses more than one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from itertools import accumulate

import numpy as np

from ..inference import InferenceError, InferOutcome, InferRequest, InferResponse


def run_batch(
    requests: Sequence[InferRequest], run: Callable[[list[InferRequest]], list[InferOutcome]], *, batching: bool
) -> list[InferOutcome]:
    """A batching model runs the whole batch in one `run`; a non-batching model's requests (never
    merged) each run alone."""
    if batching or len(requests) == 1:
        return run(list(requests))
    return [outcome for request in requests for outcome in run([request])]


def refuse_alone(
    requests: Sequence[InferRequest],
    check: Callable[[InferRequest], InferenceError | None],
    execute: Callable[[list[InferRequest]], list[InferOutcome]],
) -> list[InferOutcome] | None:
    """The requests `check` finds fault with get its error, alone; the rest of the batch runs together
    through `execute`, outcomes in the batch's order. None when `check` refuses none."""
    refused = {i: error for i, r in enumerate(requests) if (error := check(r)) is not None}
    if not refused:
        return None
    runnable = [r for i, r in enumerate(requests) if i not in refused]
    results = iter(execute(runnable) if runnable else ())
    return [refused[i] if i in refused else next(results) for i in range(len(requests))]


def merge_inputs(
    requests: Sequence[InferRequest], *, batching: bool = True, ragged: Collection[str] = ()
) -> dict[str, np.ndarray]:
    """One array per input for the whole batch.

    `ragged` names inputs with allow_ragged_batch: their requests' elements are concatenated into
    one flat array instead of along the batch dimension.
    """
    if not requests:
        raise ValueError("cannot merge an empty batch")
    first = requests[0]
    if len(requests) == 1:
        if not ragged:
            return dict(first.inputs)
        return {name: (a.reshape(-1) if name in ragged else a) for name, a in first.inputs.items()}
    if not batching:
        raise ValueError(f"requests of non-batching model '{first.model_name}' are never merged")
    merged: dict[str, np.ndarray] = {}
    for name in first.inputs:
        try:
            arrays = [request.inputs[name] for request in requests]
        except KeyError:
            raise ValueError(f"input '{name}' is missing from a request of the batch") from None
        if name in ragged:
            merged[name] = np.concatenate([a.reshape(-1) for a in arrays])
        else:
            merged[name] = _concatenate(arrays)
    return merged


# bytes.join copies without releasing the GIL below this total size (CPython's GIL_THRESHOLD).
_JOIN_LIMIT = 1 << 20


def _concatenate(arrays: list[np.ndarray]) -> np.ndarray:
    """`np.concatenate(arrays, axis=0)`, for numeric tensors by one `bytes.join` while that holds
    the GIL (under 1 MiB): numpy releases the GIL while it copies, and a batcher worker that lets
    go of it between taking a batch and starting the model waits for the event loop's next
    burst of work (measured: 1.5 ms per batch of text_recognition, docs/performance.md). The
    result is read-only, like the request tensors it is made of."""
    first = arrays[0]
    dtype = first.dtype
    if (
        dtype.hasobject
        or first.ndim == 0
        or sum(a.nbytes for a in arrays) >= _JOIN_LIMIT
        or not all(a.dtype == dtype and a.shape[1:] == first.shape[1:] and a.flags.c_contiguous for a in arrays)
    ):
        return np.concatenate(arrays, axis=0)
    joined = b"".join([a.data for a in arrays])
    return np.frombuffer(joined, dtype=dtype).reshape((sum(a.shape[0] for a in arrays), *first.shape[1:]))


def batch_sizes(requests: Sequence[InferRequest], *, batching: bool = True) -> list[int]:
    """Each request's share of the batch dimension."""
    return [request.batch_size if batching else 1 for request in requests]


def split_outputs(outputs: Mapping[str, np.ndarray], sizes: Sequence[int]) -> list[dict[str, np.ndarray]]:
    """Cut every output's dim 0 back into the requests' batch sizes (views, in request order)."""
    if len(sizes) == 1:
        return [dict(outputs)]
    total = sum(sizes)
    bounds = [0, *accumulate(sizes)]  # Python ints: np.cumsum cost more than the whole split
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            shape = list(array.shape)
            raise ValueError(
                f"output '{name}' has shape {shape}: its first dimension must be the batch size {total}"
            )
    return [
        {name: array[bounds[i] : bounds[i + 1]] for name, array in outputs.items()} for i in range(len(sizes))
    ]


def requested_output_names(requests: Sequence[InferRequest], model_outputs: Sequence[str]) -> list[str]:
    """The outputs the batch needs: every output if any request asks for all of them (None),
    else the union of what the requests ask for, in the model's order; then the implicit state's
    outputs that are not config outputs."""
    states = requests[0].state_outputs if requests else ()
    extra = [name for name in states if name not in model_outputs]
    wanted: set[str] = set(states)
    for request in requests:
        if request.requested_outputs is None:
            return [*model_outputs, *extra]
        wanted.update(output.name for output in request.requested_outputs)
    return [name for name in model_outputs if name in wanted] + extra


def batch_responses(
    requests: Sequence[InferRequest],
    parts: Sequence[Mapping[str, np.ndarray]],
    finish: Callable[[str, np.ndarray, InferRequest], np.ndarray] | None = None,
) -> list[InferResponse]:
    """One response per request from its part of the batch's outputs (`split_outputs`), with the
    outputs it asked for (every output when it named none) and its implicit state's outputs
    (`InferRequest.state_outputs`, for the sequence batcher); `finish(name, array, request)`
    converts an output where the backend must (e.g. strings to bytes)."""
    responses: list[InferResponse] = []
    for request, outputs in zip(requests, parts):
        wanted = None if request.requested_outputs is None else {o.name for o in request.requested_outputs}
        states = request.state_outputs
        result = {
            name: array if finish is None else finish(name, array, request)
            for name, array in outputs.items()
            if wanted is None or name in wanted or name in states
        }
        responses.append(InferResponse(request.model_name, request.model_version, result, id=request.id))
    return responses


def stamp_compute(requests: Sequence[InferRequest], start: int, input_end: int, infer_end: int, end: int) -> None:
    """The statistics' compute timestamps (time.monotonic_ns) of one execution, on each request."""
    for request in requests:
        request.compute_start_ns = start
        request.compute_input_end_ns = input_end
        request.compute_infer_end_ns = infer_end
        request.compute_end_ns = end
