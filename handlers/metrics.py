"""Triton's per-model metrics, counted as the server runs: names, labels and values.

Per model version (labels `model`, `version`): nv_inference_request_success,
nv_inference_request_failure (+ `reason`), nv_inference_count, nv_inference_exec_count,
nv_inference_pending_request_count, nv_inference_request_duration_us,
nv_inference_queue_duration_us, nv_inference_compute_{input,infer,output}_duration_us; for a model
that enables the response cache, nv_cache_num_{hits,misses}_per_model and
nv_cache_{hit,miss}_duration_per_model (us). Cold start, our own: toolkit_model_load_duration_seconds and toolkit_model_warmup_duration_seconds.

This module holds the counts only and imports no Prometheus library: the request path and start-up
touch it, and `handlers.exposition` (prometheus-client, the machine's gauges, the text at
`/metrics`) is imported on the first scrape, which keeps prometheus-client's ~20 ms of imports
out of a cold start (AWS Lambda's init above all). Deviation: Triton serves metrics on a
separate port (8002); serverless platforms expose one port, so `/metrics` shares it.
"""

from __future__ import annotations

import threading

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _Child:
    __slots__ = ("value", "_lock")

    def __init__(self) -> None:
        self.value = 0.0
        self._lock = threading.Lock()

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value -= amount

    def set(self, value: float) -> None:
        with self._lock:
            self.value = value


class Family:
    """A metric family with fixed label names; children are created on first use."""

    def __init__(self, name: str, documentation: str, kind: str, labelnames: tuple[str, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.kind = kind
        self.labelnames = labelnames
        self._children: dict[tuple[str, ...], _Child] = {}
        self._lock = threading.Lock()

    def labels(self, *values: str) -> _Child:
        child = self._children.get(values)
        if child is None:
            with self._lock:
                child = self._children.setdefault(values, _Child())
        return child

    def remove(self, *values: str) -> None:
        with self._lock:
            self._children.pop(values, None)

    def samples(self) -> list[tuple[dict[str, str], float]]:
        """(labels, value) of every child, as they are now."""
        return [(dict(zip(self.labelnames, values)), child.value) for values, child in list(self._children.items())]


_MODEL = ("model", "version")


def _counter(name: str, doc: str, labels: tuple[str, ...] = _MODEL) -> Family:
    return Family(name, doc, "counter", labels)


def _gauge(name: str, doc: str, labels: tuple[str, ...] = _MODEL) -> Family:
    return Family(name, doc, "gauge", labels)


SUCCESS = _counter("nv_inference_request_success", "Number of successful inference requests, all batch sizes")
FAILURE = _counter(
    "nv_inference_request_failure", "Number of failed inference requests, all batch sizes", (*_MODEL, "reason")
)
INFERENCE_COUNT = _counter("nv_inference_count", "Number of inferences performed (does not include cached requests)")
EXEC_COUNT = _counter("nv_inference_exec_count", "Number of model executions performed (does not include cached requests)")
PENDING = _gauge("nv_inference_pending_request_count", "Instantaneous number of pending requests awaiting execution per-model.")
REQUEST_DURATION = _counter(
    "nv_inference_request_duration_us", "Cumulative inference request duration in microseconds (includes cached requests)"
)
QUEUE_DURATION = _counter("nv_inference_queue_duration_us", "Cumulative inference queuing duration in microseconds (includes cached requests)")
COMPUTE_INPUT = _counter(
    "nv_inference_compute_input_duration_us", "Cumulative compute input duration in microseconds (does not include cached requests)"
)
COMPUTE_INFER = _counter(
    "nv_inference_compute_infer_duration_us", "Cumulative compute inference duration in microseconds (does not include cached requests)"
)
COMPUTE_OUTPUT = _counter(
    "nv_inference_compute_output_duration_us", "Cumulative inference compute output duration in microseconds (does not include cached requests)"
)
# The response cache's, for the models that enable it (tritonserver creates them only for those)
CACHE_HITS = _counter("nv_cache_num_hits_per_model", "Number of cache hits per model")
CACHE_HIT_DURATION = _counter("nv_cache_hit_duration_per_model", "Total cache hit duration per model, in microseconds")
CACHE_MISSES = _counter("nv_cache_num_misses_per_model", "Number of cache misses per model")
CACHE_MISS_DURATION = _counter(
    "nv_cache_miss_duration_per_model", "Total cache miss (insert+lookup) duration per model, in microseconds"
)
LOAD_SECONDS = _gauge("toolkit_model_load_duration_seconds", "Seconds spent creating the model's instances at startup (cold start)")
WARMUP_SECONDS = _gauge("toolkit_model_warmup_duration_seconds", "Seconds spent running model_warmup on every instance at startup (cold start)")

MODEL_FAMILIES = (
    SUCCESS, FAILURE, INFERENCE_COUNT, EXEC_COUNT, PENDING, REQUEST_DURATION, QUEUE_DURATION,
    COMPUTE_INPUT, COMPUTE_INFER, COMPUTE_OUTPUT, LOAD_SECONDS, WARMUP_SECONDS,
)
# exposed only once a model has them (a model that enables the response cache)
CACHE_FAMILIES = (CACHE_HITS, CACHE_HIT_DURATION, CACHE_MISSES, CACHE_MISS_DURATION)


class ModelMetrics:
    """The children of every per-model family for one model version."""

    def __init__(self, model: str, version: int, cache: bool = False) -> None:
        labels = (model, str(version))
        self._labels = labels
        self.success = SUCCESS.labels(*labels)
        self.inference_count = INFERENCE_COUNT.labels(*labels)
        self.execution_count = EXEC_COUNT.labels(*labels)
        self.pending = PENDING.labels(*labels)
        self.request_duration_us = REQUEST_DURATION.labels(*labels)
        self.queue_duration_us = QUEUE_DURATION.labels(*labels)
        self.compute_input_duration_us = COMPUTE_INPUT.labels(*labels)
        self.compute_infer_duration_us = COMPUTE_INFER.labels(*labels)
        self.compute_output_duration_us = COMPUTE_OUTPUT.labels(*labels)
        self.load_seconds = LOAD_SECONDS.labels(*labels)
        self.warmup_seconds = WARMUP_SECONDS.labels(*labels)
        for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER"):
            self.failure(reason)  # Triton exports every reason from the start, at 0
        self.cache_hits = self.cache_hit_duration_us = self.cache_misses = self.cache_miss_duration_us = _Child()
        if cache:
            self.cache_hits = CACHE_HITS.labels(*labels)
            self.cache_hit_duration_us = CACHE_HIT_DURATION.labels(*labels)
            self.cache_misses = CACHE_MISSES.labels(*labels)
            self.cache_miss_duration_us = CACHE_MISS_DURATION.labels(*labels)

    def failure(self, reason: str):
        return FAILURE.labels(*self._labels, reason)
