"""ModelStatistics: a batch's successes counted in one call equal the same requests counted one by
one (the batcher uses the batch call; warmup and ensembles the single one, which delegates)."""

from __future__ import annotations

import numpy as np

from handlers.inference import InferRequest
from handlers.statistics import ModelStatistics


def _request(base: int, batch_size: int) -> InferRequest:
    request = InferRequest("m", 1, {"X": np.zeros((batch_size, 2), np.float32)}, batch_size=batch_size)
    request.received_ns = base
    request.queue_start_ns = base + 10
    request.compute_start_ns = base + 110
    request.compute_input_end_ns = base + 130
    request.compute_infer_end_ns = base + 530
    request.compute_end_ns = base + 560
    return request


def test_a_batch_counted_at_once_equals_its_requests_counted_one_by_one() -> None:
    requests = [_request(1_000, 1), _request(2_000, 3), _request(3_000, 0)]
    requests[2].compute_start_ns = requests[2].queue_start_ns - 5  # a clock step: clamped to 0, not negative
    one_by_one, at_once = ModelStatistics("m", 1), ModelStatistics("m", 1)
    for request in requests:
        one_by_one.request_succeeded("m_0", request)
    at_once.requests_succeeded("m_0", requests)
    assert at_once.as_dict() == one_by_one.as_dict()
    stats = at_once.as_dict()["inference_stats"]
    assert at_once.inference_count == 1 + 3 + 1
    assert stats["success"] == {"count": 3, "ns": 3 * 560}
    assert stats["queue"] == {"count": 3, "ns": 100 + 100 + 0}
    assert stats["compute_infer"] == {"count": 3, "ns": 3 * 400}


def test_an_end_given_closes_the_request_duration() -> None:
    statistics = ModelStatistics("m", 1)
    statistics.request_succeeded("ensemble", _request(1_000, 1), end_ns=1_000 + 900)
    stats = statistics.as_dict()["inference_stats"]
    assert stats["success"] == {"count": 1, "ns": 900}
    assert stats["compute_output"] == {"count": 1, "ns": 30}
