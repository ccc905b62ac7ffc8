"""What a Knative Service of a repository is, on Cloud Run or on any Knative cluster.

`service_settings()` derives every value from the compiled repository (see sizing.py) and, for
Cloud Run, checks it against Cloud Run's documented rules before any API call:

- GPU services (cloud.google.com/run/docs/configuring/services/gpu): one `nvidia-l4` per instance,
  at least 4 CPU and 16 GiB of memory, CPU always allocated (`run.googleapis.com/cpu-throttling:
  "false"`, instance-based billing); zonal redundancy on by default (`--no-gpu-zonal-redundancy`
  for the cheaper best-effort capacity).
- CPU and memory (.../services/cpu, .../services/memory-limits): 0.08 to 1 vCPU in fractions, or
  1, 2, 4, 6, 8; memory 512 MiB (second generation) to 32 GiB, with a minimum CPU per memory:
  more than 4 GiB needs 2 vCPU, more than 8 GiB 4, more than 16 GiB 6, more than 24 GiB 8; 4 vCPU
  need at least 2 GiB and 6 or 8 vCPU at least 4 GiB. Below 1 vCPU concurrency must be 1.
- Concurrency 1 to 1000; request timeout up to 3600 s.
- Startup probe (.../configuring/healthchecks): failureThreshold x periodSeconds may not exceed
  240 s; GPU services are documented with up to 1800 s (30 min), for large models.
- Names (gcloud's check): lowercase letters, digits and dashes, no dash at either end, 63 at most.
- Protocol (.../configuring/http2, .../configuring/healthchecks): an image built with
  `--protocol grpc` serves gRPC on the container port, which is declared `h2c` so HTTP/2 goes end to
  end (Knative: the port name h2c too); its startup and liveness probes are `grpc` probes of the
  standard health service, whose overall status ("") turns SERVING once every model is ready.

Knative clusters have none of the Cloud Run rules; their Service gets plain Kubernetes resources.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..repository.compile import CompiledRepository
from .errors import DeployOptionError
from .sizing import container_concurrency, footprints, memory_estimate_mib, startup_budget_s

GIB = 1024  # memory is counted in MiB

CLOUDRUN_GPU_TYPES = ("nvidia-l4",)
GPU_MIN_CPU = 4
GPU_MIN_MEMORY_MIB = 16 * GIB
CPU_CHOICES = (1, 2, 4, 6, 8)
MEMORY_MIN_MIB = 512
MEMORY_MAX_MIB = 32 * GIB
# "More than N GiB needs M vCPU" (Cloud Run memory limits), and the memory floor of some CPUs.
MIN_CPU_FOR_MEMORY = ((24 * GIB, 8), (16 * GIB, 6), (8 * GIB, 4), (4 * GIB, 2))
MIN_MEMORY_FOR_CPU = {4: 2 * GIB, 6: 4 * GIB, 8: 4 * GIB}
MAX_MEMORY_FOR_CPU = {1: 4 * GIB, 2: 8 * GIB, 4: 16 * GIB, 6: 24 * GIB, 8: 32 * GIB}
CONCURRENCY_MAX = 1000
TIMEOUT_MAX_S = 3600
DEFAULT_TIMEOUT_S = 300
STARTUP_CAP_CPU_S = 240
STARTUP_CAP_GPU_S = 1800
PROBE_PERIOD_S = 2
CONTAINER_PORT = 8080
DEFAULT_MAX_INSTANCES_CPU = 100  # Cloud Run's own default
DEFAULT_MAX_INSTANCES_GPU = 3  # GPU quota is small by default; Google's GPU example uses 3
KNATIVE_PROGRESS_DEADLINE_S = 600  # Knative's default progress deadline
KNATIVE_GPU_RESOURCE = "nvidia.com/gpu"

_NAME = re.compile(r"(?=^[a-z0-9-]{1,63}$)(?!^-)(?!.*-$)")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?$")
_FACTORS = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024, "Ti": 1024 * 1024,
            "k": 1000 / (1024 * 1024), "M": 1000**2 / 1024**2, "G": 1000**3 / 1024**2, "T": 1000**4 / 1024**2}
# Cloud Run sets these itself.
RESERVED_ENV = frozenset({"PORT", "K_SERVICE", "K_REVISION", "K_CONFIGURATION"})


@dataclass
class ServiceOverrides:
    """Values the user chose; None takes the default computed from the repository."""

    gpu: str | None = None  # "auto", "none" or a GPU type ("nvidia-l4")
    cpu: str | None = None
    memory: str | None = None  # Kubernetes quantity: "16Gi", "2048Mi"; a bare number is MiB
    concurrency: int | None = None
    min_instances: int | None = None
    max_instances: int | None = None
    timeout_s: int | None = None
    startup_budget_s: int | None = None
    cpu_throttling: bool | None = None
    startup_cpu_boost: bool = True
    gpu_zonal_redundancy: bool = True
    service_account: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    region: str | None = None  # Cloud Run: the `cloud.googleapis.com/location` label
    namespace: str | None = None  # Knative: the Kubernetes namespace
    protocol: str = "http"  # what the image serves on its port: "http" or "grpc" (h2c, gRPC probes)


@dataclass(frozen=True)
class ServiceSettings:
    target: str  # "cloudrun" or "knative"
    name: str
    gpu: str | None  # accelerator type, None for a CPU-only service
    cpu: str
    memory_mib: int
    concurrency: int
    min_instances: int
    max_instances: int | None
    timeout_s: int
    startup_budget_s: int
    cpu_throttling: bool
    startup_cpu_boost: bool
    gpu_zonal_redundancy: bool
    service_account: str | None
    environment: dict[str, str]
    region: str | None
    namespace: str | None
    notes: tuple[str, ...] = ()  # how the defaults were chosen, printed in the plan
    protocol: str = "http"

    @property
    def port_name(self) -> str:
        """Cloud Run's port name: `h2c` carries HTTP/2 (gRPC) end to end, `http1` HTTP/1."""
        return "h2c" if self.protocol == "grpc" else "http1"

    @property
    def memory(self) -> str:
        """Kubernetes quantity."""
        return f"{self.memory_mib // GIB}Gi" if self.memory_mib % GIB == 0 else f"{self.memory_mib}Mi"

    @property
    def probe_period_s(self) -> int:
        return PROBE_PERIOD_S

    @property
    def probe_failure_threshold(self) -> int:
        return max(1, math.ceil(self.startup_budget_s / PROBE_PERIOD_S))

    @property
    def progress_deadline_s(self) -> int:
        return max(KNATIVE_PROGRESS_DEADLINE_S, self.startup_budget_s)


def check_service_name(name: str) -> str:
    if not _NAME.match(name):
        raise DeployOptionError(
            f"invalid service name '{name}': the name must use only lowercase alphanumeric characters and "
            "dashes, cannot begin or end with a dash, and cannot be longer than 63 characters"
        )
    return name


def parse_memory_mib(text: str) -> int:
    """'16Gi' -> 16384, '2048Mi' -> 2048, '4G' -> 3815 (rounded up), '3000' -> 3000 (MiB)."""
    match = _QUANTITY.match(text.strip())
    if not match:
        raise DeployOptionError(f"invalid memory '{text}': use a quantity such as 16Gi or 2048Mi")
    number, unit = float(match.group(1)), match.group(2)
    if unit is None:
        return math.ceil(number)  # a bare number is MiB, like Lambda's --memory in MB
    return math.ceil(number * _FACTORS[unit])


def parse_cpu(text: str) -> float:
    value = text.strip()
    try:
        cpu = float(value[:-1]) / 1000 if value.endswith("m") else float(value)
    except ValueError:
        raise DeployOptionError(f"invalid CPU '{text}': a number of vCPUs such as 1, 2, 4 or 0.5") from None
    return cpu


def _format_cpu(cpu: float) -> str:
    return str(int(cpu)) if cpu == int(cpu) else f"{cpu:g}"


def _check_environment(environment: dict[str, str], target: str) -> dict[str, str]:
    for key in environment:
        if not _ENV_KEY.match(key):
            raise DeployOptionError(f"invalid environment variable name '{key}'")
        if target == "cloudrun" and key in RESERVED_ENV:
            raise DeployOptionError(f"environment variable {key} is set by Cloud Run and cannot be set")
    return dict(environment)


def _default_cpu(instances: int) -> int:
    for choice in CPU_CHOICES:
        if instances <= choice:
            return choice
    return CPU_CHOICES[-1]


def check_cloud_run_resources(cpu: float, memory_mib: int, gpu: str | None, concurrency: int, cpu_throttling: bool) -> None:
    """Cloud Run's documented CPU / memory / GPU / concurrency rules; DeployOptionError if broken."""
    if gpu is not None:
        if gpu not in CLOUDRUN_GPU_TYPES:
            raise DeployOptionError(f"unknown Cloud Run GPU type '{gpu}': choose {', '.join(CLOUDRUN_GPU_TYPES)} or none")
        if cpu < GPU_MIN_CPU or memory_mib < GPU_MIN_MEMORY_MIB:
            raise DeployOptionError(
                f"Cloud Run GPU services need at least {GPU_MIN_CPU} CPU and 16 GiB of memory "
                f"(asked: {_format_cpu(cpu)} CPU, {memory_mib} MiB)"
            )
        if cpu_throttling:
            raise DeployOptionError(
                "Cloud Run GPU services need CPU always allocated (instance-based billing): drop --cpu-throttling"
            )
    if cpu < 0.08:
        raise DeployOptionError(f"--cpu {_format_cpu(cpu)}: Cloud Run's minimum is 0.08 vCPU")
    if cpu > 1 and cpu not in CPU_CHOICES:
        raise DeployOptionError(f"--cpu {_format_cpu(cpu)}: above 1, Cloud Run allows 2, 4, 6 or 8 vCPU")
    if cpu < 1 and concurrency != 1:
        raise DeployOptionError("below 1 vCPU Cloud Run requires a maximum concurrency of 1 (--concurrency 1)")
    if not MEMORY_MIN_MIB <= memory_mib <= MEMORY_MAX_MIB:
        raise DeployOptionError(f"memory {memory_mib} MiB: Cloud Run allows 512 MiB to 32 GiB")
    for above, needed in MIN_CPU_FOR_MEMORY:
        if memory_mib > above and cpu < needed:
            raise DeployOptionError(
                f"Cloud Run needs at least {needed} vCPU for more than {above // GIB} GiB of memory "
                f"(asked: {_format_cpu(cpu)} vCPU, {memory_mib} MiB)"
            )
    if cpu in MIN_MEMORY_FOR_CPU and memory_mib < MIN_MEMORY_FOR_CPU[cpu]:
        raise DeployOptionError(
            f"Cloud Run needs at least {MIN_MEMORY_FOR_CPU[cpu] // GIB} GiB of memory with {int(cpu)} vCPU "
            f"(asked: {memory_mib} MiB)"
        )
    if cpu < 1 and memory_mib > 1024:
        raise DeployOptionError("Cloud Run needs at least 1 vCPU for more than 1 GiB of memory")
    if not 1 <= concurrency <= CONCURRENCY_MAX:
        raise DeployOptionError(f"concurrency {concurrency}: Cloud Run allows 1 to {CONCURRENCY_MAX}")


def service_settings(
    target: str, name: str, compiled: CompiledRepository | None, overrides: ServiceOverrides | None = None
) -> ServiceSettings:
    """Settings of the Knative Service for `target` ("cloudrun" or "knative")."""
    if target not in ("cloudrun", "knative"):
        raise DeployOptionError(f"unknown service target '{target}'")
    o = overrides or ServiceOverrides()
    if o.protocol not in ("http", "grpc"):
        raise DeployOptionError(f"--protocol {o.protocol}: choose http or grpc")
    check_service_name(name)
    models = footprints(compiled) if compiled is not None else []
    notes: list[str] = []

    gpu_choice = (o.gpu or "auto").lower()
    if gpu_choice == "auto":
        compiled_for_gpu = compiled is not None and compiled.device.kind == "gpu"
        gpu = CLOUDRUN_GPU_TYPES[0] if compiled_for_gpu else None
        notes.append(
            "GPU: the repository is compiled for GPU" if gpu else "no GPU: the repository is compiled for CPU"
        )
    elif gpu_choice == "none":
        gpu = None
    else:
        gpu = gpu_choice
    if target == "cloudrun" and gpu is not None and gpu not in CLOUDRUN_GPU_TYPES:
        raise DeployOptionError(f"unknown Cloud Run GPU type '{gpu}': choose {', '.join(CLOUDRUN_GPU_TYPES)} or none")
    if target == "knative" and gpu is not None:
        gpu = KNATIVE_GPU_RESOURCE  # a Kubernetes extended resource; the cluster picks the model

    instances = sum(m.instances for m in models) or 1
    estimate = memory_estimate_mib(models) if models else MEMORY_MIN_MIB

    cpu_set = o.cpu is not None
    cpu = parse_cpu(o.cpu) if o.cpu is not None else float(_default_cpu(instances))
    cpu_why = [f"{instances} model instance(s)"]
    memory_set = o.memory is not None
    memory = parse_memory_mib(o.memory) if o.memory is not None else max(MEMORY_MIN_MIB, math.ceil(estimate / 256) * 256)
    memory_why = [f"the models need about {estimate} MiB"]
    if gpu is not None and target == "cloudrun":
        if not cpu_set and cpu < GPU_MIN_CPU:
            cpu = float(GPU_MIN_CPU)
            cpu_why.append("Cloud Run GPU minimum 4")
        if not memory_set and memory < GPU_MIN_MEMORY_MIB:
            memory = GPU_MIN_MEMORY_MIB
            memory_why.append("Cloud Run GPU minimum 16 GiB")
    if target == "cloudrun":
        if not memory_set and memory > MEMORY_MAX_MIB:
            raise DeployOptionError(
                f"the models need about {estimate} MiB of memory, over Cloud Run's 32 GiB: remove instances or models"
            )
        # Raise whichever value the user left to us until the CPU / memory table is satisfied.
        if not cpu_set:
            for above, needed in MIN_CPU_FOR_MEMORY:
                if memory > above and cpu < needed:
                    cpu = float(needed)
                    cpu_why.append(f"Cloud Run needs {needed} for more than {above // GIB} GiB")
                    break
        if not memory_set and cpu in MIN_MEMORY_FOR_CPU and memory < MIN_MEMORY_FOR_CPU[int(cpu)]:
            memory = MIN_MEMORY_FOR_CPU[int(cpu)]
            memory_why.append(f"Cloud Run minimum with {int(cpu)} vCPU")
    if not cpu_set:
        notes.append(f"{_format_cpu(cpu)} vCPU: " + ", ".join(cpu_why))
    if not memory_set:
        notes.append(f"memory {memory} MiB: " + ", ".join(memory_why))

    concurrency = o.concurrency if o.concurrency is not None else min(CONCURRENCY_MAX, container_concurrency(models))
    if o.concurrency is None:
        notes.append(f"concurrency {concurrency}: max_batch_size x instances, so requests meet in a batch")

    cpu_throttling = o.cpu_throttling if o.cpu_throttling is not None else gpu is None
    timeout = o.timeout_s if o.timeout_s is not None else DEFAULT_TIMEOUT_S
    if target == "cloudrun" and not 1 <= timeout <= TIMEOUT_MAX_S:
        raise DeployOptionError(f"--timeout {timeout}: Cloud Run allows 1 to {TIMEOUT_MAX_S} seconds")
    cap = STARTUP_CAP_GPU_S if gpu is not None else STARTUP_CAP_CPU_S
    if o.startup_budget_s is not None:
        budget = o.startup_budget_s
        if target == "cloudrun" and not 1 <= budget <= cap:
            raise DeployOptionError(
                f"--startup-budget {budget}: Cloud Run's startup probe allows at most {cap} s"
                + (" for a GPU service" if gpu else " (1800 s with a GPU)")
            )
    else:
        budget = startup_budget_s(models, gpu is not None, cap)
        notes.append(f"startup probe budget {budget} s (load + warmup estimate x3)")

    min_instances = o.min_instances if o.min_instances is not None else 0
    max_instances = o.max_instances
    if max_instances is None and target == "cloudrun":
        max_instances = DEFAULT_MAX_INSTANCES_GPU if gpu else DEFAULT_MAX_INSTANCES_CPU
    if min_instances < 0 or (max_instances is not None and max_instances < max(1, min_instances)):
        raise DeployOptionError("instances: need 0 <= --min-instances <= --max-instances and --max-instances >= 1")

    if target == "cloudrun":
        check_cloud_run_resources(cpu, memory, gpu, concurrency, cpu_throttling)
    elif concurrency < 0:
        raise DeployOptionError("--concurrency must be 0 (unlimited) or more on Knative")

    return ServiceSettings(
        target=target,
        name=name,
        gpu=gpu,
        cpu=_format_cpu(cpu),
        memory_mib=memory,
        concurrency=concurrency,
        min_instances=min_instances,
        max_instances=max_instances,
        timeout_s=timeout,
        startup_budget_s=budget,
        cpu_throttling=cpu_throttling,
        startup_cpu_boost=o.startup_cpu_boost,
        gpu_zonal_redundancy=o.gpu_zonal_redundancy,
        service_account=o.service_account,
        environment=_check_environment(o.environment, target),
        region=o.region,
        namespace=o.namespace,
        notes=tuple(notes),
        protocol=o.protocol,
    )
