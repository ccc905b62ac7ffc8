"""How a repository's instances are split across worker processes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..instance_group import InstanceSlot, instance_slots
from ..manifest import Manifest

WORKERS_ENV = "TOOLKIT_WORKERS"  # N or "auto" (images; `toolkit serve --workers`)
WORKER_ENV = "TOOLKIT_WORKER"  # "INDEX/COUNT", set by the supervisor for each worker
ENSEMBLE = "ensemble"


class WorkerPlanError(ValueError):
    """The workers asked for cannot be given an instance of every model."""


def instance_counts(manifest: Manifest) -> dict[str, int]:
    """Instances of each model that has any (ensembles have none: they run on their composing models)."""
    return {name: len(instance_slots(spec.config)) for name, spec in manifest.models.items()
            if spec.backend != ENSEMBLE}


def max_workers(manifest: Manifest) -> int:
    """The most workers that each get an instance of every model: the smallest instance count."""
    counts = [count for count in instance_counts(manifest).values() if count > 0]
    return min(counts, default=1)


def worker_count(manifest: Manifest, requested: str | int, cpus: int) -> int:
    """The number of workers for `requested` (a number, or "auto": as many as the instance counts
    and the CPUs allow, and 1 when a model has KIND_GPU instances, which would each need a CUDA
    context per process)."""
    text = str(requested).strip().lower()
    if text in ("", "1"):
        return 1
    allowed = max_workers(manifest)
    if text == "auto":
        gpu = any(slot.kind == "KIND_GPU" for spec in manifest.models.values() if spec.backend != ENSEMBLE
                  for slot in instance_slots(spec.config))
        return 1 if gpu else max(1, min(allowed, cpus))
    try:
        count = int(text)
    except ValueError:
        raise WorkerPlanError(f"the number of workers must be a positive integer or 'auto', got {requested!r}") from None
    if count < 1:
        raise WorkerPlanError(f"the number of workers must be a positive integer or 'auto', got {requested!r}")
    if count > allowed:
        smallest = min((c, n) for n, c in instance_counts(manifest).items())
        raise WorkerPlanError(
            f"{count} workers need at least {count} instances of every model, and model '{smallest[1]}' has "
            f"{smallest[0]} (instance_group count): instances are split across workers, never multiplied; use "
            f"at most {allowed} worker(s) or raise the instance count"
        )
    return count


@dataclass(frozen=True)
class WorkerSlot:
    """This process's place among the workers: worker `index` of `count`."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> "WorkerSlot":
        index, _, count = text.partition("/")
        slot = cls(int(index), int(count))
        if not 0 <= slot.index < slot.count:
            raise ValueError(f"{WORKER_ENV}={text!r}: expected INDEX/COUNT with 0 <= INDEX < COUNT")
        return slot

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def mine(self, slots: Iterable[InstanceSlot]) -> list[InstanceSlot]:
        """This worker's instances of a model: every count-th one, from its index (instance names
        stay the config's, so `model_0_1` runs in worker 1 of 2)."""
        return [slot for position, slot in enumerate(slots) if position % self.count == self.index]
