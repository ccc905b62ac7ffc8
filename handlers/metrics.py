"""Prometheus metrics at `/metrics`, with tritonserver's metric names and labels.

Per model version (labels `model`, `version`): nv_inference_request_success,
nv_inference_request_failure (+ `reason`), nv_inference_count, nv_inference_exec_count,
nv_inference_pending_request_count, nv_inference_request_duration_us,
nv_inference_queue_duration_us, nv_inference_compute_{input,infer,output}_duration_us. Machine:
nv_cpu_utilization, nv_cpu_memory_total_bytes, nv_cpu_memory_used_bytes, and with an NVIDIA GPU
(NVML via nvidia-ml-py) nv_gpu_utilization, nv_gpu_memory_total_bytes, nv_gpu_memory_used_bytes
(label `gpu_uuid`). Cold start, our own: toolkit_model_load_duration_seconds and
toolkit_model_warmup_duration_seconds.

Triton's counters carry no `_total` suffix, and its text says `# TYPE <name> counter`.
prometheus-client's text format renames every counter family `<name>_total` in its HELP and TYPE
lines, so counters are collected as `CounterMetric` (untyped to prometheus-client) and
`exposition` types them `counter` again: the text is Triton's line for line. Everything is registered
in `REGISTRY`, which Python models' `pb_utils.MetricFamily` also use. Deviation: Triton serves
metrics on a separate port (8002); serverless platforms expose one port, so `/metrics` shares it.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry(auto_describe=False)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class CounterMetric(Metric):
    """A counter family as Triton exposes it: samples and HELP/TYPE lines under the same name,
    without prometheus-client's `_total` (see the module doc and `exposition`)."""

    def __init__(self, name: str, documentation: str) -> None:
        super().__init__(name, documentation, "unknown")


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

    def metric(self) -> Metric:
        if self.kind == "counter":
            metric: Metric = CounterMetric(self.name, self.documentation)
        else:
            metric = Metric(self.name, self.documentation, self.kind)
        for values, child in list(self._children.items()):
            metric.add_sample(self.name, dict(zip(self.labelnames, values)), child.value)
        return metric


class FamiliesCollector(Collector):
    def __init__(self, families: Iterable[Family]) -> None:
        self.families = list(families)

    def collect(self) -> Iterator[Metric]:
        for family in self.families:
            yield family.metric()


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
LOAD_SECONDS = _gauge("toolkit_model_load_duration_seconds", "Seconds spent creating the model's instances at startup (cold start)")
WARMUP_SECONDS = _gauge("toolkit_model_warmup_duration_seconds", "Seconds spent running model_warmup on every instance at startup (cold start)")

MODEL_FAMILIES = (
    SUCCESS, FAILURE, INFERENCE_COUNT, EXEC_COUNT, PENDING, REQUEST_DURATION, QUEUE_DURATION,
    COMPUTE_INPUT, COMPUTE_INFER, COMPUTE_OUTPUT, LOAD_SECONDS, WARMUP_SECONDS,
)
REGISTRY.register(FamiliesCollector(MODEL_FAMILIES))


class ModelMetrics:
    """The children of every per-model family for one model version."""

    def __init__(self, model: str, version: int) -> None:
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

    def failure(self, reason: str):
        return FAILURE.labels(*self._labels, reason)


# --- machine metrics -------------------------------------------------------------------------------


class CpuCollector(Collector):
    """nv_cpu_utilization (fraction of all CPUs busy since the previous scrape, /proc/stat) and
    memory from /proc/meminfo, as tritonserver reports them on Linux."""

    def __init__(self) -> None:
        self._previous: tuple[int, int] | None = None
        self._lock = threading.Lock()

    @staticmethod
    def _cpu_times() -> tuple[int, int] | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        return sum(fields[:8]), idle

    @staticmethod
    def _memory() -> tuple[int, int] | None:
        try:
            info = {}
            with open("/proc/meminfo") as f:
                for line in f:
                    key, value = line.split(":", 1)
                    info[key] = int(value.split()[0]) * 1024
        except (OSError, ValueError):
            return None
        total = info.get("MemTotal", 0)
        return total, total - info.get("MemAvailable", info.get("MemFree", 0))

    def collect(self) -> Iterator[Metric]:
        times = self._cpu_times()
        utilization = 0.0
        with self._lock:
            if times is not None and self._previous is not None:
                total = times[0] - self._previous[0]
                idle = times[1] - self._previous[1]
                utilization = (total - idle) / total if total > 0 else 0.0
            if times is not None:
                self._previous = times
        cpu = Metric("nv_cpu_utilization", "CPU utilization rate [0.0 - 1.0]", "gauge")
        cpu.add_sample("nv_cpu_utilization", {}, utilization)
        yield cpu
        memory = self._memory()
        if memory is not None:
            total_metric = Metric("nv_cpu_memory_total_bytes", "CPU total memory (RAM), in bytes", "gauge")
            total_metric.add_sample("nv_cpu_memory_total_bytes", {}, float(memory[0]))
            used_metric = Metric("nv_cpu_memory_used_bytes", "CPU used memory (RAM), in bytes", "gauge")
            used_metric.add_sample("nv_cpu_memory_used_bytes", {}, float(memory[1]))
            yield total_metric
            yield used_metric


class GpuCollector(Collector):
    """GPU gauges through NVML (the nvidia-ml-py package), per GPU UUID."""

    def __init__(self, nvml) -> None:
        self.nvml = nvml

    @classmethod
    def create(cls) -> "GpuCollector | None":
        if os.environ.get("TOOLKIT_DISABLE_GPU_METRICS"):
            return None
        try:
            import pynvml  # nvidia-ml-py
        except ImportError:
            return None
        try:
            pynvml.nvmlInit()
            if pynvml.nvmlDeviceGetCount() == 0:
                return None
        except Exception:  # no driver / no device
            return None
        return cls(pynvml)

    def collect(self) -> Iterator[Metric]:
        nvml = self.nvml
        utilization = Metric("nv_gpu_utilization", "GPU utilization rate [0.0 - 1.0)", "gauge")
        total = Metric("nv_gpu_memory_total_bytes", "GPU total memory, in bytes", "gauge")
        used = Metric("nv_gpu_memory_used_bytes", "GPU used memory, in bytes", "gauge")
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            uuid = nvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            labels = {"gpu_uuid": uuid}
            utilization.add_sample("nv_gpu_utilization", labels, nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            total.add_sample("nv_gpu_memory_total_bytes", labels, float(memory.total))
            used.add_sample("nv_gpu_memory_used_bytes", labels, float(memory.used))
        yield utilization
        yield total
        yield used


REGISTRY.register(CpuCollector())
_gpu = GpuCollector.create()
if _gpu is not None:
    REGISTRY.register(_gpu)


class _Collected:
    """Metrics already collected, in the shape generate_latest reads."""

    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)


_UNTYPED = re.compile(rb"^# TYPE (\S+) untyped$", re.M)


def exposition(registry: CollectorRegistry = REGISTRY) -> bytes:
    """The Prometheus text of every metric, counters typed `counter` without a `_total`."""
    return render(list(registry.collect()))


def render(metrics: list[Metric]) -> bytes:
    """The Prometheus text of collected metrics (`exposition`; handlers/workers sums workers' first)."""
    counters = {m.name.encode() for m in metrics if isinstance(m, CounterMetric)}
    text = generate_latest(_Collected(metrics))
    return _UNTYPED.sub(lambda m: b"# TYPE " + m[1] + b" counter" if m[1] in counters else m[0], text)
