"""Triton's statistics extension: per model version counters, fed by the batcher's observer.

`GET /v2/models/stats` and `GET /v2/models/{m}[/versions/{v}]/stats` return exactly Triton's
schema (`model_stats: [{name, version, last_inference, inference_count, execution_count,
inference_stats: {success, fail, queue, compute_input, compute_infer, compute_output, cache_hit,
cache_miss}, response_stats, batch_stats: [{batch_size, compute_input, compute_infer,
compute_output}], memory_usage}]`). Durations are cumulative nanoseconds, per request for
`inference_stats` and per execution for `batch_stats`. `success.ns` runs from the moment the
server received the request to the end of its execution, as Triton's request duration does; warmup
executions are counted like any other, as Triton counts them. As in Triton's core,
`inference_count` sums the batch sizes of the requests that succeeded (a failed request adds
nothing) while `execution_count` and `batch_stats` count every execution. A request to a
decoupled model is counted when its execution returns (Triton's python backend reports it then),
whatever responses the model sends afterwards; `response_stats` stays empty, as the python
backend reports no per-response statistics.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Sequence

from .batching import BatchExecution, FailureReason
from .errors import InferenceError
from .inference import InferRequest
from .metrics import ModelMetrics


class _Duration:
    __slots__ = ("count", "ns")

    def __init__(self) -> None:
        self.count = 0
        self.ns = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += max(0, ns)

    def add_sum(self, ns: int, count: int) -> None:
        """`count` durations at once, `ns` their sum (each already at least 0)."""
        self.count += count
        self.ns += ns

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


class _BatchSizeStats:
    __slots__ = ("compute_input", "compute_infer", "compute_output")

    def __init__(self) -> None:
        self.compute_input = _Duration()
        self.compute_infer = _Duration()
        self.compute_output = _Duration()


class ModelStatistics:
    """Statistics of one model version; a BatcherObserver (thread-safe)."""

    def __init__(self, name: str, version: int, metrics: ModelMetrics | None = None) -> None:
        self.name = name
        self.version = version
        self.metrics = metrics
        self._lock = threading.Lock()
        self.last_inference_ms = 0
        self.inference_count = 0
        self.execution_count = 0
        self.success = _Duration()
        self.fail = _Duration()
        self.queue = _Duration()
        self.compute_input = _Duration()
        self.compute_infer = _Duration()
        self.compute_output = _Duration()
        self.batch_stats: dict[int, _BatchSizeStats] = {}
        self.cache_hits = _Duration()
        self.cache_misses = _Duration()

    # -- BatcherObserver ----------------------------------------------------------------------------

    def request_queued(self, request: InferRequest) -> None:
        if self.metrics is not None:
            self.metrics.pending.inc()

    def batch_started(self, instance: str, requests: Sequence[InferRequest]) -> None:
        if self.metrics is not None:
            self.metrics.pending.dec(len(requests))

    def batch_executed(self, execution: BatchExecution) -> None:
        with self._lock:
            self.execution_count += 1
            stats = self.batch_stats.get(execution.batch_size)
            if stats is None:
                stats = self.batch_stats[execution.batch_size] = _BatchSizeStats()
            stats.compute_input.add(execution.compute_input_ns)
            stats.compute_infer.add(execution.compute_infer_ns)
            stats.compute_output.add(execution.compute_output_ns)
            self.last_inference_ms = int(time.time() * 1000)
        if self.metrics is not None:
            self.metrics.execution_count.inc()

    def request_succeeded(self, instance: str, request: InferRequest, end_ns: int | None = None) -> None:
        """`end_ns` (default: the end of the request's computation) closes its request duration."""
        self.requests_succeeded(instance, (request,), end_ns)

    def requests_succeeded(
        self, instance: str, requests: Sequence[InferRequest], end_ns: int | None = None
    ) -> None:
        """`request_succeeded` for each request of an executed batch, the counters taken once (the
        batcher calls this instead of one call per request when the observer has it); `end_ns`
        (default: each request's end of computation) closes the request durations."""
        count = success_ns = queue_ns = input_ns = infer_ns = output_ns = 0
        for request in requests:
            start = request.compute_start_ns
            input_end = request.compute_input_end_ns
            infer_end = request.compute_infer_end_ns
            end = request.compute_end_ns
            count += request.batch_size if request.batch_size > 1 else 1
            success_ns += max(0, (end_ns or end) - request.received_ns)
            queue_ns += max(0, start - request.queue_start_ns)
            input_ns += max(0, input_end - start)
            infer_ns += max(0, infer_end - input_end)
            output_ns += max(0, end - infer_end)
        n = len(requests)
        with self._lock:
            self.inference_count += count
            self.success.add_sum(success_ns, n)
            self.queue.add_sum(queue_ns, n)
            self.compute_input.add_sum(input_ns, n)
            self.compute_infer.add_sum(infer_ns, n)
            self.compute_output.add_sum(output_ns, n)
        metrics = self.metrics
        if metrics is not None:
            metrics.success.inc(n)
            metrics.inference_count.inc(count)
            metrics.request_duration_us.inc(success_ns / 1000)
            metrics.queue_duration_us.inc(queue_ns / 1000)
            metrics.compute_input_duration_us.inc(input_ns / 1000)
            metrics.compute_infer_duration_us.inc(infer_ns / 1000)
            metrics.compute_output_duration_us.inc(output_ns / 1000)

    def request_failed(
        self, instance: str | None, request: InferRequest, error: InferenceError, reason: FailureReason
    ) -> None:
        ended = time.monotonic_ns()
        with self._lock:
            self.fail.add(ended - request.received_ns)
        if self.metrics is not None:
            if instance is None:
                self.metrics.pending.dec()
            self.metrics.failure(reason.value).inc()

    # -- the response cache (handlers/response_cache.py) --------------------------------------------

    def cache_hit(self, request: InferRequest, lookup_start_ns: int, end_ns: int) -> None:
        """A request answered from the cache (InferenceStatsAggregator::UpdateSuccessCacheHit): a
        success, its queue time up to the lookup, the lookup as the hit's duration; no inference."""
        request_ns = max(0, end_ns - request.received_ns)
        queue_ns = max(0, lookup_start_ns - request.queue_start_ns)
        lookup_ns = max(0, end_ns - lookup_start_ns)
        with self._lock:
            self.success.add(request_ns)
            self.queue.add(queue_ns)
            self.cache_hits.add(lookup_ns)
        metrics = self.metrics
        if metrics is not None:
            metrics.success.inc()
            metrics.request_duration_us.inc(request_ns / 1000)
            metrics.queue_duration_us.inc(queue_ns / 1000)
            metrics.cache_hits.inc()
            metrics.cache_hit_duration_us.inc(lookup_ns / 1000)

    def cache_miss(self, duration_ns: int) -> None:
        """A response that was looked up and then inserted (UpdateSuccessCacheMiss)."""
        with self._lock:
            self.cache_misses.add(duration_ns)
        metrics = self.metrics
        if metrics is not None:
            metrics.cache_misses.inc()
            metrics.cache_miss_duration_us.inc(duration_ns / 1000)

    # -- Triton JSON --------------------------------------------------------------------------------

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return {
                "name": self.name,
                "version": str(self.version),
                "last_inference": self.last_inference_ms,
                "inference_count": self.inference_count,
                "execution_count": self.execution_count,
                "inference_stats": {
                    "success": self.success.as_dict(),
                    "fail": self.fail.as_dict(),
                    "queue": self.queue.as_dict(),
                    "compute_input": self.compute_input.as_dict(),
                    "compute_infer": self.compute_infer.as_dict(),
                    "compute_output": self.compute_output.as_dict(),
                    "cache_hit": self.cache_hits.as_dict(),
                    "cache_miss": self.cache_misses.as_dict(),
                },
                "response_stats": {},
                "batch_stats": [
                    {
                        "batch_size": size,
                        "compute_input": stats.compute_input.as_dict(),
                        "compute_infer": stats.compute_infer.as_dict(),
                        "compute_output": stats.compute_output.as_dict(),
                    }
                    for size, stats in sorted(self.batch_stats.items())
                ],
                "memory_usage": [],
            }
