"""Sizes derived from a compiled repository: memory, request concurrency, startup budget.

Every number here is an estimate from what the repository declares, with the constants below
(documented, with how they were measured, in docs/deploy.md). Users override each one with an
option (`--memory`, `--concurrency`, `--startup-budget`); the deploy plan prints the reasoning.

- Memory: the runtime itself, plus per model instance its weights held by an ONNX Runtime session
  (measured: about 2.7 x the file size once the session is built and optimised), plus the tensors of
  one full batch (inputs and outputs, request and response copies) for tensors whose shape is fixed.
- Concurrency: requests can only meet in a batch if enough of them are in flight on one instance:
  max_batch_size x instances for each dynamically batched model, the instance count otherwise.
- Startup: image start and runtime import, reading the weights into every instance, warmup samples,
  CUDA initialisation on GPU. The probe budget is three times that estimate (a cold node pulls the
  image and reads the model from a slower disk than the build machine).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..repository.compile import CompiledModel, CompiledRepository

MIB = 1024 * 1024

# Resident memory of the runtime with a small model, measured with `toolkit serve` (CPython 3.11,
# numpy 2, onnxruntime 1.31, FastAPI): 128 MiB; rounded up for the Lambda adapter and allocator slack.
RUNTIME_BASE_MIB = 160
# Resident bytes per instance per byte of ONNX file (measured: a 16.8 MB MatMul model costs 45 MiB
# per extra instance, 2.7x) and a fixed cost per session (arena, thread pool).
SESSION_WEIGHT_FACTOR = 3.0
SESSION_OVERHEAD_MIB = 10
# A python-backend instance is its own stub process (interpreter, numpy, triton_python_backend_utils).
PYTHON_INSTANCE_MIB = 64
# Headroom over the estimate for allocator fragmentation, request bodies and response encoding.
MEMORY_HEADROOM = 1.5

# Startup: image start + runtime import; weight read and session build throughput; per-instance
# session cost; per warmup sample and instance; CUDA context and cuDNN load on a GPU.
STARTUP_BASE_S = 5.0
LOAD_BYTES_PER_S = 100 * 1000 * 1000
INSTANCE_SETUP_S = 0.5
WARMUP_SAMPLE_S = 0.2
GPU_INIT_S = 30.0
STARTUP_SAFETY_FACTOR = 3.0
MIN_STARTUP_BUDGET_S = 60

_DTYPE_BYTES = {
    "TYPE_BOOL": 1, "TYPE_UINT8": 1, "TYPE_INT8": 1, "TYPE_UINT16": 2, "TYPE_INT16": 2, "TYPE_FP16": 2,
    "TYPE_BF16": 2, "TYPE_UINT32": 4, "TYPE_INT32": 4, "TYPE_FP32": 4, "TYPE_UINT64": 8, "TYPE_INT64": 8,
    "TYPE_FP64": 8,
}


@dataclass(frozen=True)
class ModelFootprint:
    """What one model costs to hold and to start, as far as its files and config tell."""

    name: str
    kind: str  # "onnx", "python" or "ensemble"
    weight_bytes: int  # all files of the served versions
    instances: int  # model instances (0 for an ensemble: its composing models run the work)
    max_batch_size: int
    dynamic_batching: bool
    batch_tensor_bytes: int  # inputs + outputs of one full batch, fixed-shape tensors only
    warmup_samples: int
    gpu: bool

    @property
    def resident_bytes(self) -> int:
        if self.kind == "ensemble":
            return 0
        if self.kind == "python":
            per_instance = PYTHON_INSTANCE_MIB * MIB + self.weight_bytes
        else:
            per_instance = int(self.weight_bytes * SESSION_WEIGHT_FACTOR) + SESSION_OVERHEAD_MIB * MIB
        return self.instances * (per_instance + 2 * self.batch_tensor_bytes)


def _directory_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    if not path.is_dir():
        return 0
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _tensor_bytes(tensors: list[dict[str, Any]], batch: int) -> int:
    total = 0
    for tensor in tensors:
        dims = [int(d) for d in tensor.get("dims", [])]
        size = _DTYPE_BYTES.get(tensor.get("data_type", ""), 0)
        if size == 0 or any(d < 0 for d in dims):
            continue  # BYTES or variable shape: unknown until requests arrive
        total += math.prod(dims) * size * batch
    return total


def footprint(model: CompiledModel) -> ModelFootprint:
    config = model.config
    platform = config.get("platform", "")
    backend = config.get("backend", "")
    kind = "ensemble" if platform == "ensemble" else "python" if backend == "python" else "onnx"
    versions = {Path(f).parts[0] for f in model.model_files.values() if Path(f).parts}
    weight_bytes = sum(_directory_bytes(model.path / v) for v in versions)
    groups = config.get("instance_group", [])
    instances = 0 if kind == "ensemble" else sum(int(g.get("count", 1)) for g in groups) or 1
    max_batch = int(config.get("max_batch_size", 0))
    batch = max(1, max_batch)
    return ModelFootprint(
        name=model.name,
        kind=kind,
        weight_bytes=weight_bytes,
        instances=instances,
        max_batch_size=max_batch,
        dynamic_batching="dynamic_batching" in config,
        batch_tensor_bytes=_tensor_bytes(config.get("input", []), batch) + _tensor_bytes(config.get("output", []), batch),
        warmup_samples=len(config.get("model_warmup", [])),
        gpu=any(g.get("kind") == "KIND_GPU" for g in groups),
    )


def footprints(compiled: CompiledRepository) -> list[ModelFootprint]:
    return [footprint(compiled.models[name]) for name in sorted(compiled.models)]


def memory_estimate_mib(models: list[ModelFootprint]) -> int:
    """Resident memory the runtime needs for these models, with headroom, in MiB."""
    resident = RUNTIME_BASE_MIB * MIB + sum(m.resident_bytes for m in models)
    return math.ceil(resident * MEMORY_HEADROOM / MIB)


def container_concurrency(models: list[ModelFootprint]) -> int:
    """Requests one container should accept at once so that full batches can form.

    Each dynamically batched model takes max_batch_size x instances requests (every instance can
    run a full batch while the next one gathers); other models take one request per instance.
    """
    total = 0
    for m in models:
        if m.kind == "ensemble":
            continue
        per_instance = m.max_batch_size if (m.dynamic_batching and m.max_batch_size > 0) else 1
        total += per_instance * m.instances
    return max(1, total)


def startup_estimate_s(models: list[ModelFootprint], gpu: bool) -> float:
    """Seconds from container start to /v2/health/ready on a warm node (models loaded, warmed up)."""
    seconds = STARTUP_BASE_S + (GPU_INIT_S if gpu else 0.0)
    for m in models:
        if m.kind == "ensemble":
            continue
        seconds += m.instances * (m.weight_bytes / LOAD_BYTES_PER_S + INSTANCE_SETUP_S)
        seconds += m.instances * m.warmup_samples * WARMUP_SAMPLE_S
    return seconds


def startup_budget_s(models: list[ModelFootprint], gpu: bool, cap: int) -> int:
    """The startup probe's budget: three times the estimate, at least a minute, at most `cap`."""
    wanted = math.ceil(startup_estimate_s(models, gpu) * STARTUP_SAFETY_FACTOR)
    return min(cap, max(MIN_STARTUP_BUDGET_S, wanted))
