"""The build report: image, layers, models, Python dependencies, cold start, warnings.

Written as `build-report.json` next to the context and printed as tables. Warnings say what the
target platform will do differently from tritonserver (no GPU on Lambda, no batching across
requests there, payload limits that a full batch can exceed); errors are limits the image
breaks (Lambda's 10 GB image size), which fail the build.

Cold start: measured when the image was run (`--measure-cold-start`: container start to
`/v2/health/ready` 200, models loaded and warmed up), else estimated from sizes with the
constants below (docs/build.md explains them).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from handlers.backends.python import AUTO, IN_PROCESS, PROCESS

from ..repository.compile import CompiledRepository
from .builders import Layer
from .runtime_deps import runtime_backends
from .targets import Target

# Estimate constants (documented in docs/build.md): image fetch + unpack throughput, the Python
# runtime's import time, model read + session creation throughput, per-instance session cost.
IMAGE_FETCH_BYTES_PER_S = 100 * 1024 * 1024
RUNTIME_IMPORT_S = 1.5
MODEL_LOAD_BYTES_PER_S = 200 * 1024 * 1024
INSTANCE_SETUP_S = 0.2
WARMUP_SAMPLE_S = 0.05

DTYPE_BYTES = {
    "TYPE_BOOL": 1, "TYPE_UINT8": 1, "TYPE_INT8": 1, "TYPE_UINT16": 2, "TYPE_INT16": 2, "TYPE_FP16": 2,
    "TYPE_BF16": 2, "TYPE_UINT32": 4, "TYPE_INT32": 4, "TYPE_FP32": 4, "TYPE_UINT64": 8, "TYPE_INT64": 8,
    "TYPE_FP64": 8,
}


def human_bytes(size: float | None) -> str:
    if size is None:
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if abs(size) < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} GB"


@dataclass
class ModelEntry:
    name: str
    backend: str
    versions: list[int]
    bytes: int
    max_batch_size: int
    instances: int
    dynamic_batching: bool
    cpu_threads: str = ""  # threads per instance on the target's CPUs (the runtime's CPU budget)


@dataclass
class ColdStart:
    seconds: float
    measured: bool
    how: str
    init_seconds: float | None = None  # Lambda: the init phase alone (AWS's RIE, INIT REPORT)


@dataclass
class BackendEntry:
    """What one backend (or backends sharing one framework) adds to the image."""

    backends: list[str]
    models: list[str]
    distributions: dict[str, str]  # only its models need these: name -> version
    installed_bytes: int  # their installed size: what the image would lose without these models
    # Measured with the cold start: its slowest model's load (framework import included) plus warmup.
    ready_seconds: float | None = None


@dataclass
class BuildReport:
    name: str
    tag: str
    target: str
    platform: str
    base_image: str
    python: str
    device: str
    context: str
    context_digest: str
    repository_digest: str
    builder: str
    build_command: str
    image: str | None = None
    image_id: str | None = None
    image_size: int | None = None
    layers: list[Layer] = field(default_factory=list)
    models: list[ModelEntry] = field(default_factory=list)
    backends: list[BackendEntry] = field(default_factory=list)
    python_deps: dict[str, str] = field(default_factory=dict)
    wheelhouse_bytes: int = 0
    cuda: dict[str, Any] | None = None
    cold_start: ColdStart | None = None
    cpu_budget: dict[str, Any] | None = None  # the runtime's thread plan on the target's default CPUs
    pushed: str | None = None
    manifests: list[str] = field(default_factory=list)  # deployment manifests (IaC) written beside the image
    build_seconds: float | None = None
    # TOOLKIT_PYTHON_INSTANCE_MODE baked into the image: where python models' instances run
    python_instance_mode: str | None = None
    # gRPC images: the front end (native or grpcio), where its wheel came from and what it adds,
    # or why it is not native (toolkit/build/native_frontend.py NativeFrontend.as_dict)
    grpc_frontend: dict[str, Any] | None = None
    # HTTP images of Cloud Run / Knative: the same for the HTTP front end (native or uvicorn)
    http_frontend: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    def render(self, console: Console) -> None:
        summary = Table(title=f"toolkit build: {self.name}:{self.tag} ({self.target})", show_header=False)
        summary.add_column("", style="bold")
        summary.add_column("")
        rows = [
            ("image", self.image or "(not built)"),
            ("pushed", self.pushed or "-"),
            ("deploy manifests", ", ".join(self.manifests) or "-"),
            ("image size", human_bytes(self.image_size)),
            ("base image", f"{self.base_image} (Python {self.python}, {self.platform})"),
            ("device", self.device),
            ("context", f"{self.context} ({self.context_digest[:19]}...)"),
            ("wheelhouse", human_bytes(self.wheelhouse_bytes)),
        ]
        if self.grpc_frontend:
            rows.append(("gRPC front end", grpc_frontend_text(self.grpc_frontend)))
        if self.http_frontend:
            rows.append(("HTTP front end", http_frontend_text(self.http_frontend)))
        if self.cuda:
            rows.append(("CUDA", f"{self.cuda['major']} ({', '.join(self.cuda['frameworks'])}), NVIDIA driver >= {self.cuda['min_driver']}"))
        if self.cold_start:
            kind = "measured" if self.cold_start.measured else "estimated"
            rows.append(("cold start", f"{self.cold_start.seconds:.1f} s {kind} ({self.cold_start.how})"))
        if self.python_instance_mode and any(m.backend == "python" for m in self.models):
            rows.append(("python instances", python_instances_text(self.python_instance_mode)))
        if self.cpu_budget:
            rows.append(("CPU budget", self.cpu_budget["summary"].removeprefix("CPU budget: ")))
        if self.build_seconds is not None:
            rows.append(("build time", f"{self.build_seconds:.1f} s"))
        for key, value in rows:
            summary.add_row(key, value)
        console.print(summary)

        models = Table(title="models")
        for column in ("model", "backend", "versions", "size", "max batch", "instances", "threads", "dynamic batching"):
            models.add_column(column)
        for m in self.models:
            models.add_row(
                m.name, m.backend, ",".join(map(str, m.versions)), human_bytes(m.bytes), str(m.max_batch_size),
                str(m.instances), m.cpu_threads or "-", "yes" if m.dynamic_batching else "no",
            )
        console.print(models)

        if self.backends:
            backends = Table(title="backends: what each adds to the image")
            for column in ("backend", "models", "adds", "size", "cold start (its models ready)"):
                backends.add_column(column)
            for b in self.backends:
                backends.add_row(
                    ", ".join(b.backends), ", ".join(b.models),
                    ", ".join(f"{n} {v}" for n, v in b.distributions.items()) or "-", human_bytes(b.installed_bytes),
                    "-" if b.ready_seconds is None else f"{b.ready_seconds:.2f} s measured",
                )
            console.print(backends)

        if self.layers:
            layers = Table(title="layers")
            layers.add_column("size", justify="right")
            layers.add_column("created by")
            for layer in self.layers:
                layers.add_row(human_bytes(layer.size), _short(layer.created_by))
            console.print(layers)

        deps = Table(title="Python dependencies in the image")
        deps.add_column("distribution")
        deps.add_column("version")
        for name, version in self.python_deps.items():
            deps.add_row(name, version)
        console.print(deps)


def grpc_frontend_text(entry: dict[str, Any]) -> str:
    """The gRPC front end for the report's table."""
    return _frontend_text(entry, "grpc++", "grpcio's server")


def http_frontend_text(entry: dict[str, Any]) -> str:
    """The HTTP front end for the report's table."""
    return _frontend_text(entry, "libevent", "uvicorn")


def _frontend_text(entry: dict[str, Any], library: str, fallback: str) -> str:
    if entry["frontend"] == "native":
        origin = {"built": "built now, cached", "cache": "from the wheel cache"}.get(entry["source"], entry["source"])
        return (f"native ({library}): {entry['wheel']}, adds {human_bytes(entry['installed_bytes'])} installed "
                f"({human_bytes(entry['wheel_bytes'])} wheel; {origin})")
    return f"{fallback} ({entry.get('reason', entry['source'])})"


def python_instances_text(mode: str) -> str:
    """Where python models' instances run in the image, for the report."""
    where = {
        PROCESS: "each in a model process of its own: a model that crashes fails only its own requests",
        AUTO: "in the serving process when a model has one instance (faster cold start), else in model processes",
        IN_PROCESS: "in the serving process",
    }.get(mode, mode)
    return f"{where} (TOOLKIT_PYTHON_INSTANCE_MODE={mode})"


def _short(created_by: str, width: int = 100) -> str:
    text = " ".join(created_by.replace("/bin/sh -c #(nop) ", "").split())
    return text if len(text) <= width else text[: width - 3] + "..."


def model_entries(compiled: CompiledRepository, model_bytes: dict[str, int]) -> list[ModelEntry]:
    entries = []
    for name in sorted(compiled.models):
        model = compiled.models[name]
        config = model.config
        entries.append(
            ModelEntry(
                name=name,
                backend=model.backend,
                versions=list(model.versions),
                bytes=model_bytes.get(name, 0),
                max_batch_size=int(config.get("max_batch_size", 0)),
                instances=sum(int(g.get("count", 1)) for g in config.get("instance_group", [])),
                dynamic_batching="dynamic_batching" in config,
            )
        )
    return entries


def backend_entries(compiled: CompiledRepository, footprints: list) -> list[BackendEntry]:
    """One entry per footprint (toolkit/build/footprint.py), with the models that need it."""
    entries = []
    for footprint in footprints:
        models = sorted(n for n, m in compiled.models.items() if runtime_backends([m.config]) & set(footprint.backends))
        entries.append(BackendEntry(list(footprint.backends), models, dict(footprint.distributions), footprint.installed_bytes))
    return entries


def add_ready_seconds(entries: list[BackendEntry], compiled: CompiledRepository, metrics_text: str) -> None:
    """Each backend's share of a measured cold start, from the runtime's /metrics
    (toolkit_model_load_duration_seconds + toolkit_model_warmup_duration_seconds per model)."""
    seconds: dict[tuple[str, str], float] = {}  # (model, version) -> load + warmup
    for line in metrics_text.splitlines():
        for family in ("toolkit_model_load_duration_seconds{", "toolkit_model_warmup_duration_seconds{"):
            if line.startswith(family):
                labels, _, value = line[len(family):].partition("} ")
                pairs = dict(part.split("=", 1) for part in labels.split(",") if "=" in part)
                key = (pairs.get("model", "").strip('"'), pairs.get("version", "").strip('"'))
                try:
                    seconds[key] = seconds.get(key, 0.0) + float(value)
                except ValueError:
                    continue
    for entry in entries:
        measured = [value for (model, _), value in seconds.items() if model in entry.models]
        if measured:
            entry.ready_seconds = round(max(measured), 3)


def full_batch_bytes(config: dict[str, Any]) -> int | None:
    """Bytes of the input tensors of one request carrying a full batch, when every input has a
    fixed shape and a fixed-size type (else None: the size depends on the request)."""
    batch = max(int(config.get("max_batch_size", 0)), 1)
    total = 0
    for tensor in config.get("input", []):
        size = DTYPE_BYTES.get(tensor.get("data_type", ""))
        dims = [int(d) for d in tensor.get("dims", [])]
        if size is None or any(d < 0 for d in dims):
            return None
        count = 1
        for d in dims:
            count *= d
        total += count * size * batch
    return total


def decoupled_models(compiled: CompiledRepository) -> list[str]:
    """The models with `model_transaction_policy { decoupled: true }`."""
    return sorted(
        name for name, model in compiled.models.items()
        if (model.config.get("model_transaction_policy") or {}).get("decoupled", False)
    )


def target_warnings(target: Target, compiled: CompiledRepository, gpu_requested: list[str]) -> list[str]:
    """What the platform does differently from tritonserver, per model where it matters."""
    warnings: list[str] = []
    for name in sorted(compiled.models):
        for warning in compiled.models[name].warnings:
            warnings.append(f"{name}: {warning}")
    if target.name == "lambda":
        if gpu_requested:
            warnings.append(
                f"AWS Lambda has no GPU: {', '.join(gpu_requested)} asked for KIND_GPU and will run on CPU "
                "(use --target cloudrun for GPU serving)"
            )
        warnings.append(
            "AWS Lambda limits request and response payloads to 6 MB (synchronous invocation); binary tensor "
            "data travels base64-encoded (+33%); larger requests fail before reaching the handler"
        )
        batched = [n for n in sorted(compiled.models) if "dynamic_batching" in compiled.models[n].config]
        if batched:
            warnings.append(
                f"AWS Lambda runs one request per execution environment, so dynamic_batching of {', '.join(batched)} "
                "never batches across requests there (each request's own batch still runs as one batch)"
            )
        decoupled = decoupled_models(compiled)
        if decoupled:
            warnings.append(
                f"{', '.join(decoupled)}: decoupled (streaming) model(s) on AWS Lambda: POST "
                "/v2/models/<name>/generate answers a model's single response (within the 6 MB payload limit); "
                "generate_stream is refused (501) because a Python function's response reaches the client in one "
                "piece (Lambda streams responses natively only for Node.js runtimes), and /infer refuses decoupled "
                "models as tritonserver does (501); deploy to Cloud Run or Knative to stream responses"
            )
    elif decoupled_models(compiled):
        warnings.append(
            f"{', '.join(decoupled_models(compiled))}: decoupled (streaming) model(s) stream server-sent events through "
            "POST /v2/models/<name>/generate_stream until the service's request timeout ends the connection "
            "(toolkit deploy --timeout, up to 3600 s)"
        )
    stateful = [n for n in sorted(compiled.models) if "sequence_batching" in compiled.models[n].config]
    if stateful:
        where = (
            "AWS Lambda sends each invocation to any execution environment, so a sequence survives only with "
            "reserved concurrency 1"
            if target.name == "lambda"
            else "keep them on one gRPC stream (one connection, one container), or deploy with one instance or "
            "session affinity"
        )
        warnings.append(
            f"{', '.join(stateful)}: stateful model(s) (sequence_batching) keep each sequence in one container; {where}; "
            "a request that reaches another container is refused (must specify the START flag)"
        )
    if target.request_limit_bytes:
        overhead = 4 / 3 if target.name == "lambda" else 1.0
        for name in sorted(compiled.models):
            size = full_batch_bytes(compiled.models[name].config)
            if size is not None and size * overhead > target.request_limit_bytes:
                warnings.append(
                    f"{name}: a request carrying a full batch ({compiled.models[name].config.get('max_batch_size', 0)}) "
                    f"is {human_bytes(size * overhead)} of tensor data, over {target.request_limit_note}; "
                    "clients must send smaller batches"
                )
    return warnings


def estimate_cold_start(image_bytes: int, models: list[ModelEntry], warmup_samples: int) -> ColdStart:
    seconds = (
        image_bytes / IMAGE_FETCH_BYTES_PER_S
        + RUNTIME_IMPORT_S
        + sum(m.bytes for m in models) / MODEL_LOAD_BYTES_PER_S
        + INSTANCE_SETUP_S * sum(max(m.instances, 1) for m in models)
        + WARMUP_SAMPLE_S * warmup_samples
    )
    return ColdStart(round(seconds, 2), False, "from image and model sizes, docs/build.md")
