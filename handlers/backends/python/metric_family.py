"""`pb_utils.MetricFamily` and its `Metric`s (metric_family.cc, metric.cc of the python backend).

Values live in the serving process's `MetricStore` (exposed on /metrics); a model process
reaches it over its socket. Errors are TritonModelException with Triton's messages, including the
`Failed to process the request for model '<instance>', message:` part Triton's IPC adds.
Deviation: Triton invalidates a Metric whose MetricFamily object was garbage collected ("The
'MetricFamily' object should be deleted AFTER its corresponding 'Metric' objects"); here a Metric
keeps its family alive.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

from . import host
from .metric_store import COUNTER, GAUGE, HISTOGRAM, MetricStore, unsupported_operation
from .triton_error import TritonModelException


class MetricKind(IntEnum):
    COUNTER = COUNTER
    GAUGE = GAUGE
    HISTOGRAM = HISTOGRAM


_local_store: MetricStore | None = None


def _backend() -> Any:
    global _local_store
    current = host.current_host()
    if current is not None:
        return current.metrics
    if _local_store is None:  # no runtime around (a model's own test): keep values locally
        _local_store = MetricStore()
    return _local_store


def _core_error(prefix: str, message: str) -> TritonModelException:
    context = host.current_context()
    instance = context.instance_name if context else ""
    return TritonModelException(
        f"{prefix}Failed to process the request for model '{instance}', message: {message}"
    )


class MetricFamily:
    COUNTER = MetricKind.COUNTER
    GAUGE = MetricKind.GAUGE
    HISTOGRAM = MetricKind.HISTOGRAM

    def __init__(self, name: str, description: str, kind: MetricKind) -> None:
        if not isinstance(name, str) or not isinstance(description, str) or not isinstance(kind, MetricKind):
            raise TypeError(
                "__init__(): incompatible constructor arguments. The following argument types are supported:\n"
                "    1. c_python_backend_utils.MetricFamily(name: str, description: str, kind: "
                "c_python_backend_utils.MetricKind)"
            )
        self._name = name
        self._description = description
        self._kind = MetricKind(kind)
        self._backend = _backend()
        try:
            self._id = self._backend.family(name, description, int(kind))
        except ValueError as exc:
            raise _core_error("Error when creating MetricFamily: ", str(exc)) from None

    def Metric(self, labels: Any = None, buckets: Any = None) -> Metric:
        if labels is None:
            labels = {}
        if not isinstance(labels, dict):
            raise TritonModelException("Failed to create metric. Labels must be a dictionary.")
        if buckets is not None and not isinstance(buckets, list):
            raise TritonModelException("Failed to create metric. Buckets must be a list.")
        if self._kind == MetricKind.HISTOGRAM and buckets is None:
            raise TritonModelException("Failed to create metric. Missing required buckets.")
        if self._kind != MetricKind.HISTOGRAM and buckets is not None:
            raise TritonModelException("Failed to create metric. Unexpected buckets found.")
        try:
            metric_id = self._backend.metric(self._id, labels, buckets)
        except ValueError as exc:
            raise _core_error("Error when creating Metric: ", str(exc)) from None
        return Metric(self, metric_id)


_PREFIXES = {
    "increment": "Failed to increment metric value: ",
    "set": "Failed to set metric value: ",
    "observe": "Failed to observe metric value: ",
    "value": "Failed to get metric value: ",
}
_ALLOWED = {
    "increment": (MetricKind.COUNTER, MetricKind.GAUGE),
    "set": (MetricKind.GAUGE,),
    "observe": (MetricKind.HISTOGRAM,),
    "value": (MetricKind.COUNTER, MetricKind.GAUGE),
}


class Metric:
    """One labelled metric of a family. Updates are checked here (so a model process sends them
    without waiting for an answer) and applied in the serving process."""

    def __init__(self, family: MetricFamily, metric_id: int) -> None:
        self._family = family  # keeps the family alive (see the module doc)
        self._id = metric_id

    def _check(self, operation: str, value: float | None = None) -> None:
        kind = self._family._kind
        if kind not in _ALLOWED[operation]:
            raise _core_error(_PREFIXES[operation], unsupported_operation(int(kind), operation))
        if operation == "increment" and kind == MetricKind.COUNTER and value is not None and value < 0:
            raise _core_error(
                _PREFIXES[operation],
                "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative values.",
            )

    def increment(self, value: float) -> None:
        value = float(value)
        self._check("increment", value)
        self._family._backend.update(self._id, "increment", value)

    def set(self, value: float) -> None:
        value = float(value)
        self._check("set")
        self._family._backend.update(self._id, "set", value)

    def observe(self, value: float) -> None:
        value = float(value)
        self._check("observe")
        self._family._backend.update(self._id, "observe", value)

    def value(self) -> float:
        self._check("value")
        return float(self._family._backend.value(self._id))
