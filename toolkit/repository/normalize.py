"""Triton's config normalisation: defaults filled in exactly as tritonserver fills them.

`normalize_model_config` follows `NormalizeModelConfig` and `normalize_instance_groups` follows
`NormalizeInstanceGroup` + `SetDefaultInstanceCount` (core/src/model_config_utils.cc), with one
deliberate difference: the GPUs considered are those of the *target* the config is compiled for
(`Device`), never the build host's. For a CPU-only target (AWS Lambda, CPU Cloud Run) KIND_GPU
groups are mapped to KIND_CPU with a warning instead of failing (docs/triton-compatibility.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from google.protobuf.message import Message

from .backend_fields import ONNXRUNTIME_BACKEND, OPENVINO_BACKEND, TENSORFLOW_BACKEND
from .model_config import ModelInstanceGroup

KIND_AUTO = ModelInstanceGroup.KIND_AUTO
KIND_GPU = ModelInstanceGroup.KIND_GPU
KIND_CPU = ModelInstanceGroup.KIND_CPU
KIND_MODEL = ModelInstanceGroup.KIND_MODEL

# Triton's default CPU instance count for the backends that opt into it.
DEFAULT_CPU_INSTANCE_COUNT = 2


@dataclass(frozen=True)
class Device:
    """The devices of the platform a config is compiled for."""

    kind: str = "cpu"  # "cpu" or "gpu"
    gpus: tuple[int, ...] = ()

    @classmethod
    def parse(cls, text: str) -> "Device":
        """`cpu`, `gpu` (one GPU, id 0) or `gpu:N` (N GPUs, ids 0..N-1)."""
        if text == "cpu":
            return cls("cpu", ())
        if text == "gpu":
            return cls("gpu", (0,))
        if text.startswith("gpu:") and text[4:].isdigit() and int(text[4:]) > 0:
            return cls("gpu", tuple(range(int(text[4:]))))
        raise ValueError(f"unknown device '{text}': expected cpu, gpu or gpu:N")

    def __str__(self) -> str:
        if self.kind == "cpu":
            return "cpu"
        return "gpu" if self.gpus == (0,) else f"gpu:{len(self.gpus)}"


@dataclass(frozen=True)
class PreferredGroup:
    kind: int
    count: int = 0
    gpus: tuple[int, ...] = ()


# Backend attributes (TRITONBACKEND_GetBackendAttribute): the onnxruntime backend prefers GPU
# instances when a GPU exists, then CPU; the python backend declares none.
PREFERRED_GROUPS: dict[str, tuple[PreferredGroup, ...]] = {
    ONNXRUNTIME_BACKEND: (PreferredGroup(KIND_GPU), PreferredGroup(KIND_CPU)),
    OPENVINO_BACKEND: (PreferredGroup(KIND_CPU),),  # openvino_backend: CPU, count 0 (default 1)
}


def normalize_model_config(config: Message) -> None:
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    if config.HasField("dynamic_batching"):
        if len(config.dynamic_batching.preferred_batch_size) == 0 and config.max_batch_size > 0:
            config.dynamic_batching.preferred_batch_size.append(config.max_batch_size)
    if config.HasField("sequence_batching"):
        sb = config.sequence_batching
        if sb.max_sequence_idle_microseconds == 0:
            sb.max_sequence_idle_microseconds = 1_000_000
        if sb.HasField("oldest") and len(sb.oldest.preferred_batch_size) == 0 and config.max_batch_size > 0:
            sb.oldest.preferred_batch_size.append(config.max_batch_size)
    if not config.HasField("ensemble_scheduling"):
        if not config.optimization.HasField("input_pinned_memory"):
            config.optimization.input_pinned_memory.enable = True
        if not config.optimization.HasField("output_pinned_memory"):
            config.optimization.output_pinned_memory.enable = True


def _default_instance_count(group: Message, backend: str) -> int:
    if group.kind == KIND_CPU and backend in (TENSORFLOW_BACKEND, ONNXRUNTIME_BACKEND):
        return DEFAULT_CPU_INSTANCE_COUNT
    return 1


@dataclass
class NormalizeReport:
    warnings: list[str] = field(default_factory=list)


def normalize_instance_groups(config: Message, device: Device, report: NormalizeReport | None = None) -> None:
    if config.HasField("ensemble_scheduling"):
        return
    supported_gpus = set(device.gpus)
    preferred = PREFERRED_GROUPS.get(config.backend, ())

    if len(config.instance_group) == 0:
        group = config.instance_group.add()
        group.name = config.name
        for pg in preferred:
            if pg.kind == KIND_GPU:
                if not supported_gpus:
                    continue
                group.gpus.extend(g for g in pg.gpus if g in supported_gpus)
            elif pg.kind == KIND_AUTO:
                group.gpus.extend(pg.gpus)
            group.kind = pg.kind
            group.count = pg.count
            break

    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"

        if group.kind == KIND_AUTO:
            if not supported_gpus or any(g not in supported_gpus for g in group.gpus):
                group.kind = KIND_CPU
            else:
                group.kind = KIND_GPU

        if group.kind == KIND_GPU and device.kind == "cpu":
            # A CPU-only target: keep the model servable instead of failing like tritonserver.
            instances = group.count if group.count > 0 else 1
            if group.gpus:
                instances *= len(group.gpus)
            if report is not None:
                report.warnings.append(
                    f"instance group {group.name} of model {config.name} has kind KIND_GPU but the "
                    f"target device is cpu: mapped to KIND_CPU with count {instances}"
                )
            group.kind = KIND_CPU
            del group.gpus[:]
            group.count = instances

        for pg in preferred:
            if group.kind != pg.kind:
                continue
            if group.kind == KIND_GPU and not group.gpus and pg.gpus:
                group.gpus.extend(g for g in pg.gpus if g in supported_gpus)
                if not group.gpus:
                    continue
            if group.count < 1 and pg.count > 0:
                group.count = pg.count

        if group.count < 1:
            group.count = _default_instance_count(group, config.backend)
        if group.kind == KIND_GPU and not group.gpus:
            group.gpus.extend(sorted(supported_gpus))
