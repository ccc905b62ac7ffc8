"""Merging a batch's inputs and splitting its outputs back per request."""

from __future__ import annotations

import numpy as np
import pytest

from handlers.batching import batch_sizes, merge_inputs, requested_output_names, split_outputs
from handlers.inference import InferRequest, RequestedOutput


def req(name: str, **inputs: np.ndarray) -> InferRequest:
    size = next(iter(inputs.values())).shape[0] if inputs else 1
    return InferRequest("m", 1, dict(inputs), id=name, batch_size=size)


def test_single_request_passes_through_without_copies():
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    merged = merge_inputs([req("a", x=x)])
    assert merged["x"] is x
    y = x * 2
    (only,) = split_outputs({"y": y}, [2])
    assert only["y"] is y


def test_inputs_concatenate_along_the_batch_dimension_in_request_order():
    a = np.full((1, 3), 1, np.int32)
    b = np.full((3, 3), 2, np.int32)
    c = np.full((2, 3), 3, np.int32)
    requests = [
        req("a", x=a, s=a.astype(np.float32)),
        req("b", x=b, s=b.astype(np.float32)),
        req("c", x=c, s=c.astype(np.float32)),
    ]
    merged = merge_inputs(requests)
    assert merged["x"].shape == (6, 3) and merged["x"].dtype == np.int32
    assert merged["x"][:, 0].tolist() == [1, 2, 2, 2, 3, 3]
    assert merged["s"].dtype == np.float32
    assert batch_sizes(requests) == [1, 3, 2]


def test_bytes_inputs_merge_as_object_arrays():
    a = np.array([[b"x", b"yy"]], dtype=object)
    b = np.array([[b"zzz", b""]], dtype=object)
    merged = merge_inputs([req("a", t=a), req("b", t=b)])
    assert merged["t"].dtype == object and merged["t"].tolist() == [[b"x", b"yy"], [b"zzz", b""]]


def test_outputs_split_back_as_views():
    y = np.arange(12, dtype=np.float32).reshape(6, 2)
    z = np.arange(6, dtype=np.int64)
    parts = split_outputs({"y": y, "z": z}, [1, 3, 2])
    assert [p["y"].shape for p in parts] == [(1, 2), (3, 2), (2, 2)]
    assert parts[1]["y"].tolist() == [[2, 3], [4, 5], [6, 7]]
    assert parts[2]["z"].tolist() == [4, 5]
    for part in parts:
        assert np.shares_memory(part["y"], y) and np.shares_memory(part["z"], z)


def test_split_refuses_outputs_without_the_batch_dimension():
    with pytest.raises(
        ValueError, match=r"output 'y' has shape \[4\]: its first dimension must be the batch size 3"
    ):
        split_outputs({"y": np.zeros(4)}, [1, 2])
    with pytest.raises(ValueError, match="output 's' has shape"):
        split_outputs({"s": np.array(1.0, np.float32)}, [1, 1])


def test_ragged_inputs_are_flattened_and_concatenated():
    a = np.arange(3, dtype=np.float32).reshape(1, 3)
    b = np.arange(5, dtype=np.float32).reshape(1, 5)
    merged = merge_inputs([req("a", r=a), req("b", r=b)], ragged={"r"})
    assert merged["r"].shape == (8,)
    assert merge_inputs([req("a", r=a)], ragged={"r"})["r"].shape == (3,)


def test_requests_of_a_non_batching_model_are_never_merged():
    a = req("a", x=np.zeros(4, np.float32))
    b = req("b", x=np.zeros(4, np.float32))
    assert merge_inputs([a], batching=False)["x"].shape == (4,)
    assert batch_sizes([a, b], batching=False) == [1, 1]
    with pytest.raises(ValueError, match="never merged"):
        merge_inputs([a, b], batching=False)


def test_missing_input_in_a_request_is_an_error():
    with pytest.raises(ValueError, match="input 'y' is missing"):
        merge_inputs([req("a", x=np.zeros((1, 2)), y=np.zeros((1, 2))), req("b", x=np.zeros((1, 2)))])
    with pytest.raises(ValueError, match="empty batch"):
        merge_inputs([])


def test_requested_outputs_of_a_batch():
    names = ["OUTPUT0", "OUTPUT1", "OUTPUT2"]
    a = req("a", x=np.zeros((1, 1)))
    b = req("b", x=np.zeros((1, 1)))
    a.requested_outputs = [RequestedOutput("OUTPUT2")]
    b.requested_outputs = [RequestedOutput("OUTPUT0")]
    assert requested_output_names([a, b], names) == ["OUTPUT0", "OUTPUT2"]  # the model's order
    b.requested_outputs = None  # b wants every output
    assert requested_output_names([a, b], names) == names


def test_run_batch_runs_a_batching_model_once_and_a_non_batching_one_request_by_request():
    from handlers.batching.merge import run_batch

    requests = [req(n, x=np.zeros((1, 2), np.float32)) for n in "abc"]
    calls: list[list[str]] = []

    def run(batch):
        calls.append([r.id for r in batch])
        return [f"done {r.id}" for r in batch]

    assert run_batch(requests, run, batching=True) == ["done a", "done b", "done c"] and calls == [["a", "b", "c"]]
    calls.clear()
    assert run_batch(requests, run, batching=False) == ["done a", "done b", "done c"] and calls == [["a"], ["b"], ["c"]]


def test_refuse_alone_keeps_the_batch_order_and_runs_the_rest_together():
    from handlers.batching.merge import refuse_alone
    from handlers.inference import InferenceError

    requests = [req(n, x=np.zeros((1, 2), np.float32)) for n in "abcd"]
    bad = {"b": InferenceError("b is bad"), "d": InferenceError("d is bad")}
    runs: list[list[str]] = []

    def execute(batch):
        runs.append([r.id for r in batch])
        return [f"ran {r.id}" for r in batch]

    outcomes = refuse_alone(requests, lambda r: bad.get(r.id), execute)
    assert outcomes == ["ran a", bad["b"], "ran c", bad["d"]] and runs == [["a", "c"]]
    assert refuse_alone(requests, lambda r: None, execute) is None and runs == [["a", "c"]]
    assert refuse_alone(requests[1:2], lambda r: bad.get(r.id), execute) == [bad["b"]] and runs == [["a", "c"]]
