"""The Prometheus text at `/metrics`, with tritonserver's metric names and labels.

Everything is registered in `REGISTRY`: the per-model families of `handlers.metrics`, the machine's
gauges (nv_cpu_utilization, nv_cpu_memory_total_bytes, nv_cpu_memory_used_bytes, and with an
NVIDIA GPU, through NVML (nvidia-ml-py), nv_gpu_utilization, nv_gpu_memory_total_bytes,
nv_gpu_memory_used_bytes, label `gpu_uuid`), and the Python models' `pb_utils.MetricFamily`
(handlers/backends/python/metric_store.py). Imported on the first scrape (or the first custom
metric), not at start-up: see `handlers.metrics`. nv_cpu_utilization is the fraction of the CPUs
busy since the previous scrape, 0 at the first (tritonserver polls it every second; a deviation,
docs/triton-compatibility.md).

Triton's counters carry no `_total` suffix, and its text says `# TYPE <name> counter`.
prometheus-client's text format renames every counter family `<name>_total` in its HELP and TYPE
lines, so counters are collected as `CounterMetric` (untyped to prometheus-client) and `text`
types them `counter` again: the text is Triton's line for line.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Iterable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from . import metrics

REGISTRY = CollectorRegistry(auto_describe=False)


class CounterMetric(Metric):
    """A counter family as Triton exposes it: samples and HELP/TYPE lines under the same name,
    without prometheus-client's `_total` (see the module doc and `text`)."""

    def __init__(self, name: str, documentation: str) -> None:
        super().__init__(name, documentation, "unknown")


class FamiliesCollector(Collector):
    """The per-model families of `handlers.metrics`, as collected metrics."""

    def __init__(self, families: Iterable[metrics.Family], only_with_samples: bool = False) -> None:
        self.families = list(families)
        self.only_with_samples = only_with_samples

    def collect(self) -> Iterator[Metric]:
        for family in self.families:
            if self.only_with_samples and not family.samples():
                continue
            if family.kind == "counter":
                metric: Metric = CounterMetric(family.name, family.documentation)
            else:
                metric = Metric(family.name, family.documentation, family.kind)
            for labels, value in family.samples():
                metric.add_sample(family.name, labels, value)
            yield metric


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


REGISTRY.register(FamiliesCollector(metrics.MODEL_FAMILIES))
REGISTRY.register(FamiliesCollector(metrics.CACHE_FAMILIES, only_with_samples=True))
REGISTRY.register(CpuCollector())
_gpu = GpuCollector.create()
if _gpu is not None:
    REGISTRY.register(_gpu)


class _Collected:
    """Metrics already collected, in the shape generate_latest reads."""

    def __init__(self, collected: list[Metric]) -> None:
        self.collected = collected

    def collect(self) -> Iterator[Metric]:
        return iter(self.collected)


_UNTYPED = re.compile(rb"^# TYPE (\S+) untyped$", re.M)


def text(registry: CollectorRegistry = REGISTRY) -> bytes:
    """The Prometheus text of every metric, counters typed `counter` without a `_total`."""
    return render(list(registry.collect()))


def render(collected: list[Metric]) -> bytes:
    """The Prometheus text of collected metrics (`text`; handlers/workers sums workers' first)."""
    counters = {m.name.encode() for m in collected if isinstance(m, CounterMetric)}
    body = generate_latest(_Collected(collected))
    return _UNTYPED.sub(lambda m: b"# TYPE " + m[1] + b" counter" if m[1] in counters else m[0], body)
