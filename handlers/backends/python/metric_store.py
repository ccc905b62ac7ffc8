"""Where Python models' custom metrics (pb_utils.MetricFamily) live: one store per serving
process, exposed on /metrics through `handlers.exposition.REGISTRY`.

Semantics follow Triton's core (metric_family.cc, prometheus-cpp): a family name is unique per
kind (the same name and kind returns the same family, another kind is an error); metrics with the
same labels in a family are the same metric, shared by every instance that asks for it (model
processes reach this store over their socket). Counters are exposed without the `_total` suffix
and histograms as `_count`, `_sum` and cumulative `_bucket{le=...}` samples, as tritonserver does.
"""

from __future__ import annotations

import itertools
import math
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

COUNTER, GAUGE, HISTOGRAM = 0, 1, 2
KIND_NAMES = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}
_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass
class _Metric:
    labels: dict[str, str]
    buckets: tuple[float, ...] = ()
    value: float = 0.0
    bucket_counts: list[int] = field(default_factory=list)
    count: int = 0
    total: float = 0.0


@dataclass
class _Family:
    name: str
    description: str
    kind: int
    metrics: dict[frozenset, int] = field(default_factory=dict)


class MetricStore:
    """The `host.MetricsBackend` of the serving process. Thread-safe; errors are ValueError with
    the core's messages."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: list[_Family] = []
        self._by_name: dict[str, int] = {}
        self._metrics: list[tuple[int, _Metric]] = []  # (family id, metric)

    def family(self, name: str, description: str, kind: int) -> int:
        if not isinstance(name, str) or not _NAME.match(name):
            raise ValueError("Invalid metric name")
        if kind not in KIND_NAMES:
            raise ValueError(f"Unknown metric kind {kind}")
        with self._lock:
            existing = self._by_name.get(name)
            if existing is not None:
                if self._families[existing].kind != kind:
                    raise ValueError("Family name already exists with different type")
                return existing
            self._families.append(_Family(name, description, kind))
            self._by_name[name] = len(self._families) - 1
            return len(self._families) - 1

    def metric(self, family: int, labels: dict[str, str], buckets: list[float] | None) -> int:
        for key, value in labels.items():
            if not isinstance(value, str) or not isinstance(key, str):
                raise ValueError("attempt to access JSON non-string as string")  # noqa: TRY004 - the core's message
            if not _LABEL.match(key) or key.startswith("__"):
                raise ValueError(f"Invalid label name '{key}'")
        bounds: tuple[float, ...] = ()
        if buckets is not None:
            bounds = tuple(float(b) for b in buckets)
            if any(b >= c for b, c in itertools.pairwise(bounds)):
                raise ValueError("Bucket Boundaries must be strictly sorted")
        key = frozenset(labels.items())
        with self._lock:
            fam = self._families[family]
            existing = fam.metrics.get(key)
            if existing is not None:
                return existing
            metric = _Metric(dict(labels), bounds, bucket_counts=[0] * len(bounds))
            self._metrics.append((family, metric))
            fam.metrics[key] = len(self._metrics) - 1
            return len(self._metrics) - 1

    def update(self, metric: int, operation: str, value: float) -> None:
        with self._lock:
            family, m = self._metrics[metric]
            kind = self._families[family].kind
            if operation == "increment" and kind != HISTOGRAM:
                if kind == COUNTER and value < 0:
                    raise ValueError(
                        "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative values."
                    )
                m.value += value
            elif operation == "set" and kind == GAUGE:
                m.value = value
            elif operation == "observe" and kind == HISTOGRAM:
                m.count += 1
                m.total += value
                for i, bound in enumerate(m.buckets):
                    if value <= bound:
                        m.bucket_counts[i] += 1
            else:
                raise ValueError(unsupported_operation(kind, operation))

    def value(self, metric: int) -> float:
        with self._lock:
            family, m = self._metrics[metric]
            if self._families[family].kind == HISTOGRAM:
                raise ValueError(unsupported_operation(HISTOGRAM, "value"))
            return m.value

    # -- exposition -----------------------------------------------------------------------------------

    def collect(self) -> Iterator[Any]:
        """prometheus-client collector protocol."""
        from prometheus_client.core import Metric

        from ...exposition import CounterMetric

        with self._lock:
            families = [(f, [(m, self._metrics[m][1]) for m in f.metrics.values()]) for f in self._families]
            snapshot = [
                (f, [(dict(m.labels), m.value, m.buckets, list(m.bucket_counts), m.count, m.total) for _, m in ms])
                for f, ms in families
            ]
        for fam, metrics in snapshot:
            out = (CounterMetric(fam.name, fam.description) if fam.kind == COUNTER
                   else Metric(fam.name, fam.description, KIND_NAMES[fam.kind]))
            for labels, value, buckets, counts, count, total in metrics:
                if fam.kind == HISTOGRAM:
                    out.add_sample(fam.name + "_count", labels, count)
                    out.add_sample(fam.name + "_sum", labels, total)
                    for bound, hits in zip(buckets, counts):
                        out.add_sample(fam.name + "_bucket", {**labels, "le": _bound(bound)}, hits)
                    out.add_sample(fam.name + "_bucket", {**labels, "le": "+Inf"}, count)
                else:
                    out.add_sample(fam.name, labels, value)
            yield out


_OPERATION_NAMES = {"increment": "Increment", "set": "Set", "observe": "Observe", "value": "Value"}


def unsupported_operation(kind: int, operation: str) -> str:
    return f"TRITONSERVER_METRIC_KIND_{KIND_NAMES[kind].upper()} does not support {_OPERATION_NAMES[operation]}"


def _bound(value: float) -> str:
    if math.isfinite(value) and value == int(value):
        return str(int(value))
    return repr(value)


_runtime_store: MetricStore | None = None
_runtime_lock = threading.Lock()


def runtime_store() -> MetricStore:
    """The serving process's store, registered in `handlers.exposition.REGISTRY` on first use."""
    global _runtime_store
    with _runtime_lock:
        if _runtime_store is None:
            store = MetricStore()
            try:
                from ...exposition import REGISTRY
            except ImportError:  # pragma: no cover - the runtime always ships handlers.exposition
                REGISTRY = None
            if REGISTRY is not None:
                REGISTRY.register(store)
            _runtime_store = store
        return _runtime_store
