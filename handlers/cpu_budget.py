"""The CPU thread budget: the container's CPUs divided among every model instance, never more.

Triton leaves a framework's thread pools at the framework's default when a config sets no thread
count: every ONNX Runtime session takes all the machine's cores, so two instances on two cores
run four compute threads that fight for them (measured: -10 % throughput on the tutorial's
text_recognition). Here, when a config leaves a model's thread count unset, the instances share
the CPUs the container really has:

1. **The CPUs** (`available_cpus`): the CPUs this process may run on (`os.sched_getaffinity`,
   i.e. cpusets), capped by the cgroup CPU quota (cgroup v2 `cpu.max`, v1 `cpu.cfs_quota_us /
   cpu.cfs_period_us`, the smallest along the cgroup's ancestors: Kubernetes / Knative limits,
   Cloud Run's `--cpu`) and, on AWS Lambda, by the vCPUs its memory setting buys (1,769 MB = one
   vCPU; AWS_LAMBDA_FUNCTION_MEMORY_SIZE). A fractional quota rounds down (1.5 CPUs -> 1), never
   below 1: a thread that waits for quota stalls a whole batch. `TOOLKIT_CPUS=N` overrides it.
2. **The division** (`plan`): every instance of every version of every model is one consumer.
   Instances whose backend reports an explicit count (`explicit_threads`, below) keep it, and a
   KIND_GPU instance gets one thread (its CPU work is feeding the GPU); both are taken from the
   CPUs first. The rest is divided evenly among the other instances, the remainder going one CPU
   each to the first instances in model-name order; with more instances than CPUs each gets 1.
   Ensembles have no instances. On AWS Lambda (`serial=True`) an execution environment serves
   one request at a time, so a model's instances never run together: every instance gets all the
   CPUs.

How a backend adopts it (handlers/backends/__init__.py is the backend contract):

- `create_instance(spec, version, slot)` receives `slot.threads`: this instance's share (None
  when no plan applies, e.g. an instance created outside a ModelRepository: then leave the
  framework's default). Use it only where the config leaves the framework's own count unset:
  explicit parameters always win. ONNX Runtime: intra-op threads (and inter-op in parallel
  mode); PyTorch: `torch.set_num_threads` when INTRA_OP_THREAD_COUNT is unset; OpenVINO:
  INFERENCE_NUM_THREADS; tree libraries: `nthread`. A backend that runs model code in another
  process passes `thread_environment(slot.threads)` to it (OMP_NUM_THREADS and friends, only
  where the environment does not set them already).
- Optionally, the backend module defines `explicit_threads(config) -> int | None`: the CPU
  threads one instance uses when the config sets them (e.g. `intra_op_thread_count`). The plan
  takes those CPUs out of the budget before dividing the rest; without the hook the backend's
  instances always get a share.

The plan is computed once per ModelRepository, logged at startup (`lines()`), and shown by
`toolkit validate` and the build report for the target's CPUs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CPUS_ENV = "TOOLKIT_CPUS"
LAMBDA_MEMORY_ENV = "AWS_LAMBDA_FUNCTION_MEMORY_SIZE"
LAMBDA_MB_PER_VCPU = 1769  # "At 1,769 MB, a function has the equivalent of one vCPU"
# What the usual numeric libraries read for their thread pools (OpenMP, MKL, OpenBLAS, numexpr,
# Accelerate), set for a model process when the environment leaves them unset.
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS",
              "VECLIB_MAXIMUM_THREADS")
# The instance's share, for model code that sizes its own pools (e.g. torch.set_num_threads).
SHARE_ENV = "TOOLKIT_CPU_THREADS"


# -- how many CPUs ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CpuCount:
    """The whole CPUs the budget divides, and where the number comes from."""

    cpus: int
    affinity: int  # CPUs this process may run on
    quota: float | None = None  # the cgroup CPU quota in CPUs (None: unlimited)
    quota_source: str = ""  # e.g. "cgroup v2 cpu.max 150000 100000"
    lambda_vcpus: float | None = None  # AWS Lambda's vCPUs from its memory setting
    override: bool = False  # TOOLKIT_CPUS
    target: str = ""  # set when computed for a deployment target rather than read here

    @property
    def basis(self) -> str:
        if self.target:
            return self.target
        if self.override:
            return f"{CPUS_ENV}={self.cpus}"
        parts = [f"affinity {self.affinity}"]
        if self.quota is not None:
            parts.append(f"{self.quota_source} = {self.quota:g} CPU")
        if self.lambda_vcpus is not None:
            parts.append(f"AWS Lambda memory = {self.lambda_vcpus:.2f} vCPU")
        return ", ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        return {"cpus": self.cpus, "basis": self.basis}


def whole_cpus(value: float) -> int:
    """CPUs a fractional allowance gives whole threads for: rounded down, at least 1."""
    return max(1, math.floor(value + 1e-9))


def for_target(cpus: float, description: str) -> CpuCount:
    """The CPU count of a deployment target (toolkit's build report, validate --cpus)."""
    whole = whole_cpus(cpus)
    return CpuCount(cpus=whole, affinity=whole, target=f"{description}" if description else f"{whole} CPU(s)")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _proc_cgroups(root: Path) -> list[tuple[str, list[str], str]]:
    """/proc/self/cgroup: (hierarchy id, controllers, path) per line."""
    text = _read(root / "proc/self/cgroup") or ""
    entries = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3:
            entries.append((parts[0], [c for c in parts[1].split(",") if c], parts[2]))
    return entries


def _cgroup_mounts(root: Path) -> list[tuple[str, str, str, list[str]]]:
    """/proc/self/mountinfo's cgroup mounts: (mount root, mount point, fstype, super options)."""
    text = _read(root / "proc/self/mountinfo") or ""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        mounts.append((fields[3], fields[4], tail[0], tail[2].split(",")))
    return mounts


def _directories(root: Path, mount_root: str, mount_point: str, path: str) -> list[Path]:
    """The cgroup's folder under its mount point and its ancestors up to the mount point."""
    base = root / mount_point.lstrip("/")
    relative = path
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root.rstrip("/") + "/")):
        relative = path[len(mount_root):]
    elif mount_root != "/":
        relative = "/"  # another namespace's path: the mount shows our own cgroup at its root
    folder = base / relative.lstrip("/")
    if not folder.is_dir():
        folder = base  # cgroup namespace: the container's cgroup is the mount's root
    found = [folder]
    while folder != base and base in folder.parents:
        folder = folder.parent
        found.append(folder)
    return found


def _v2_limit(folder: Path) -> tuple[float, str] | None:
    text = _read(folder / "cpu.max")
    if not text:
        return None
    quota, _, period = text.partition(" ")
    if quota == "max":
        return None
    try:
        q, p = int(quota), int(period or "100000")
    except ValueError:
        return None
    return (q / p, f"cgroup v2 cpu.max {q} {p}") if q > 0 and p > 0 else None


def _v1_limit(folder: Path) -> tuple[float, str] | None:
    quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    try:
        q, p = int(quota or "-1"), int(period or "0")
    except ValueError:
        return None
    return (q / p, f"cgroup v1 cpu.cfs_quota_us {q} / cpu.cfs_period_us {p}") if q > 0 and p > 0 else None


def cgroup_quota(root: Path | str = "/") -> tuple[float, str] | None:
    """The CPU quota of this process's cgroup in CPUs (the smallest along its ancestors, cgroup
    v1 and v2 both read), with the file it came from; None when there is none. `root` is the
    filesystem root (tests point it at a folder of fixture files)."""
    root = Path(root)
    mounts = _cgroup_mounts(root)
    limits: list[tuple[float, str]] = []
    for hierarchy, controllers, path in _proc_cgroups(root):
        if hierarchy == "0" and not controllers:  # the unified (v2) hierarchy
            candidates = [(m[0], m[1], _v2_limit) for m in mounts if m[2] == "cgroup2"]
        elif "cpu" in controllers:
            candidates = [(m[0], m[1], _v1_limit) for m in mounts if m[2] == "cgroup" and "cpu" in m[3]]
        else:
            continue
        for mount_root, mount_point, read in candidates:
            for folder in _directories(root, mount_root, mount_point, path):
                limit = read(folder)
                if limit is not None:
                    limits.append(limit)
    if not limits and not mounts:  # no /proc view: a bare v2 mount at the usual place
        for folder, read in ((root / "sys/fs/cgroup", _v2_limit), (root / "sys/fs/cgroup/cpu", _v1_limit)):
            limit = read(folder)
            if limit is not None:
                limits.append(limit)
    return min(limits) if limits else None


def affinity_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def available_cpus(root: Path | str = "/", environ: Mapping[str, str] | None = None,
                   affinity: int | None = None) -> CpuCount:
    """The whole CPUs this container may use (see the module doc)."""
    environ = os.environ if environ is None else environ
    visible = affinity if affinity is not None else affinity_cpus()
    override = environ.get(CPUS_ENV, "").strip()
    if override:
        try:
            count = int(override)
        except ValueError:
            raise ValueError(f"{CPUS_ENV} must be a whole number of CPUs, got '{override}'") from None
        if count < 1:
            raise ValueError(f"{CPUS_ENV} must be at least 1, got {count}")
        return CpuCount(cpus=count, affinity=visible, override=True)
    cpus = float(visible)
    quota = cgroup_quota(root)
    if quota is not None:
        cpus = min(cpus, quota[0])
    lambda_vcpus = None
    memory = environ.get(LAMBDA_MEMORY_ENV, "").strip()
    if memory.isdigit():
        lambda_vcpus = int(memory) / LAMBDA_MB_PER_VCPU
        cpus = min(cpus, lambda_vcpus)
    return CpuCount(cpus=whole_cpus(cpus), affinity=visible, quota=None if quota is None else quota[0],
                    quota_source="" if quota is None else quota[1], lambda_vcpus=lambda_vcpus)


# -- the division -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Share:
    """The CPU threads of one instance (of every version of its model)."""

    model: str
    instance: str
    kind: str
    device_id: int
    threads: int
    source: str  # "budget", "explicit" (the config sets it) or "gpu" (one thread feeds the GPU)
    versions: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "instance": self.instance, "kind": self.kind, "threads": self.threads,
                "source": self.source, "versions": self.versions}


@dataclass(frozen=True)
class CpuPlan:
    cpus: CpuCount
    shares: tuple[Share, ...]
    serial: bool = False

    def threads_for(self, model: str, slot: Any) -> int | None:
        """The threads of `model`'s instance `slot` (an InstanceSlot); None if not planned."""
        for share in self.shares:
            if (share.model, share.instance, share.kind, share.device_id) == (model, slot.name, slot.kind,
                                                                              slot.device_id):
                return share.threads
        return None

    @property
    def planned_threads(self) -> int:
        """Threads that can compute at once (every instance busy; one request at a time on Lambda)."""
        if self.serial:
            return max((s.threads for s in self.shares), default=0)
        return sum(s.threads * s.versions for s in self.shares)

    def summary(self) -> str:
        instances = sum(s.versions for s in self.shares)
        if self.serial:
            how = "one request at a time (AWS Lambda), so every instance may use them all"
        else:
            how = f"{_count(instances, 'instance')}, {_count(self.planned_threads, 'thread')} in all"
            if self.planned_threads > self.cpus.cpus:
                how += " (more instances than CPUs or explicit counts: at least 1 thread each)"
        return f"CPU budget: {_count(self.cpus.cpus, 'CPU')} ({self.cpus.basis}); {how}"

    def model_lines(self) -> dict[str, str]:
        """Per model: e.g. '2 x CPU: 1 thread each (budget)'."""
        lines: dict[str, str] = {}
        by_model: dict[str, list[Share]] = {}
        for share in self.shares:
            by_model.setdefault(share.model, []).append(share)
        for model, shares in by_model.items():
            groups: dict[tuple[int, str], int] = {}
            for share in shares:
                groups[(share.threads, share.source)] = groups.get((share.threads, share.source), 0) + 1
            parts = [f"{_count(count, 'instance')} x {_count(threads, 'thread')} ({source})"
                     for (threads, source), count in sorted(groups.items(), key=lambda item: -item[0][0])]
            versions = shares[0].versions
            lines[model] = ", ".join(parts) + (f", for each of {versions} versions" if versions > 1 else "")
        return lines

    def compact(self) -> dict[str, str]:
        """Per model, the threads of its instances in few characters: '1 (budget)', '2, 1 (budget)'."""
        found: dict[str, tuple[list[int], str]] = {}
        for share in self.shares:
            threads, source = found.setdefault(share.model, ([], share.source))
            threads.append(share.threads)
        return {model: ", ".join(str(t) for t in sorted(set(threads), reverse=True)) + f" ({source})"
                for model, (threads, source) in found.items()}

    def lines(self) -> list[str]:
        return [self.summary()] + [f"  {model}: {text}" for model, text in self.model_lines().items()]

    def as_dict(self) -> dict[str, Any]:
        return {**self.cpus.as_dict(), "serial": self.serial, "instances": [s.as_dict() for s in self.shares]}


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


@dataclass(frozen=True)
class PlannedModel:
    """What the plan needs to know of a model."""

    name: str
    config: Mapping[str, Any]
    versions: int = 1

    @property
    def backend(self) -> str:
        return str(self.config.get("backend") or self.config.get("platform", ""))


def explicit_threads(backend: str, config: Mapping[str, Any]) -> int | None:
    """The threads an instance of `backend` uses because its config says so (the backend
    module's `explicit_threads` hook), else None."""
    from .backends import backend_module

    try:
        module = backend_module(backend)
    except ImportError:
        return None
    hook = getattr(module, "explicit_threads", None) if module is not None else None
    if hook is None:
        return None
    value = hook(config)
    return None if value is None else max(1, int(value))


def plan(models: Iterable[Any], cpus: CpuCount, *, serial: bool = False) -> CpuPlan:
    """Divide `cpus` among the instances of `models` (ModelSpecs, compiled models or
    PlannedModels: `.name`, `.config` and `.versions`, a count or a sequence)."""
    from .backends import BACKEND_MODULES
    from .instance_group import instance_slots

    fixed: list[Share] = []
    budgeted: list[tuple[str, Any, int]] = []  # (model, slot, versions)
    for model in sorted(models, key=lambda m: m.name):
        config = model.config
        backend = str(config.get("backend") or config.get("platform", ""))
        if backend not in BACKEND_MODULES:
            continue  # ensembles (no instances) and backends this runtime does not serve
        versions = model.versions if isinstance(model.versions, int) else len(model.versions)
        versions = max(1, versions)
        explicit = explicit_threads(backend, config)
        for slot in instance_slots(config):
            if explicit is not None:
                fixed.append(Share(model.name, slot.name, slot.kind, slot.device_id, explicit, "explicit", versions))
            elif slot.kind == "KIND_GPU":
                fixed.append(Share(model.name, slot.name, slot.kind, slot.device_id, 1, "gpu", versions))
            else:
                budgeted.append((model.name, slot, versions))
    shares = list(fixed)
    if serial:
        shares.extend(Share(m, s.name, s.kind, s.device_id, cpus.cpus, "budget", v) for m, s, v in budgeted)
    else:
        pool = cpus.cpus - sum(s.threads * s.versions for s in fixed)
        consumers = sum(v for _, _, v in budgeted)
        base = max(1, pool // consumers) if consumers else 0
        extra = max(0, pool - base * consumers) if consumers and pool > consumers else 0
        for model_name, slot, versions in budgeted:
            threads = base
            if extra >= versions:
                threads += 1
                extra -= versions
            shares.append(Share(model_name, slot.name, slot.kind, slot.device_id, threads, "budget", versions))
    order = {name: index for index, name in enumerate(sorted({s.model for s in shares}))}
    shares.sort(key=lambda s: order[s.model])
    return CpuPlan(cpus, tuple(shares), serial)


def thread_environment(threads: int | None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment variables for a model process with `threads` CPU threads: the numeric
    libraries' thread counts (only those the environment leaves unset: they win) and
    TOOLKIT_CPU_THREADS."""
    if threads is None:
        return {}
    environ = os.environ if environ is None else environ
    found = {name: str(threads) for name in THREAD_ENV if not environ.get(name)}
    found[SHARE_ENV] = str(threads)
    return found
