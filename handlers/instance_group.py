"""Model instances from `instance_group`, named and placed as tritonserver does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class InstanceSlot:
    name: str
    kind: str  # KIND_CPU, KIND_GPU or KIND_MODEL
    device_id: int
    # CPU threads of this instance when its config leaves them unset (handlers/cpu_budget.py);
    # None outside a ModelRepository: the framework's default.
    threads: int | None = None
    # The CPU plan serves one request at a time (AWS Lambda): a version's instances never execute
    # together, which lets a backend share what they would otherwise each hold.
    serial: bool = False


def instance_slots(config: dict[str, Any]) -> list[InstanceSlot]:
    """One slot per instance to create, the same for every version of the model.

    TritonModelInstance::CreateInstances: `count` instances per group, and for KIND_GPU `count`
    on each listed GPU; instances are named "<group>_<i>" (tritonserver 2.51 does so for count 1
    too: observed `add_sub_0_0`, `probe_0`). Groups with `passive: true` make no slot: tritonserver
    loads their instances but never gives them a request (no warmup, no scheduler, no backend
    thread), so here they are not made at all.
    """
    slots: list[InstanceSlot] = []
    for group in config.get("instance_group", []):
        if group.get("passive", False):
            continue
        kind = group.get("kind", "KIND_CPU")
        count = int(group.get("count", 1))
        for index in range(count):
            name = f"{group['name']}_{index}"
            for gpu in group.get("gpus", []) if kind == "KIND_GPU" else [0]:
                slots.append(InstanceSlot(name, kind, int(gpu)))
    return slots
