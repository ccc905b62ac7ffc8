"""How many threads a fil instance predicts with: the one place this backend decides it.

FIL's `cpu_nthread` parameter wins when it is positive. Otherwise (FIL's default, -1, "all
cores") the container's CPUs are shared among the model's instances: the CPUs this process may
run on (its affinity) capped by the cgroup's CPU quota (`docker --cpus`, Cloud Run and Knative
CPU limits; Lambda sizes vCPUs with memory), divided by the instance count, at least 1.
OpenMP's own "all cores" counts the host's cores, which oversubscribes a limited container.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2
CGROUP_V1_QUOTA = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
CGROUP_V1_PERIOD = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us")


def _cgroup_quota() -> float | None:
    try:
        quota, period = CGROUP_CPU_MAX.read_text().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int(CGROUP_V1_QUOTA.read_text())
        if quota_us > 0:
            return quota_us / int(CGROUP_V1_PERIOD.read_text())
    except (OSError, ValueError):
        pass
    return None


def container_cpus() -> int:
    """CPUs this process can use: its affinity, capped by the cgroup CPU quota (rounded up)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


def instance_threads(cpu_nthread: int, instances: int) -> int:
    """Threads for one instance: `cpu_nthread` when positive, else its share of the container."""
    if cpu_nthread > 0:
        return cpu_nthread
    return max(1, container_cpus() // max(1, instances))
