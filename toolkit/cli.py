"""`toolkit` command line (Typer + Rich)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from . import __version__

app = typer.Typer(
    name="toolkit",
    help="Ship an NVIDIA Triton model repository to serverless platforms.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

RepoArg = Annotated[str, typer.Argument(help="Model repository: a directory, s3://bucket/prefix or gs://bucket/prefix")]
ModelOpt = Annotated[
    Optional[list[str]],
    typer.Option("--model", "-m", help="Only this model (repeatable), like tritonserver --load-model; ensembles bring their composing models"),
]
DeviceOpt = Annotated[str, typer.Option("--device", help="Target device the config is compiled for: cpu, gpu or gpu:N")]
StrictOpt = Annotated[
    bool,
    typer.Option("--disable-auto-complete-config", help="Like tritonserver --disable-auto-complete-config: configs must be complete"),
]


def _version_callback(value: bool) -> None:
    if value:
        console.print(f"toolkit {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version_callback, is_eager=True, help="Print the version")] = False,
) -> None:
    """Ship an NVIDIA Triton model repository to serverless platforms."""


def _compile(repo: str, models: list[str] | None, device: str, strict: bool):
    from .repository.compile import compile_repository
    from .repository.discover import ensure_repository
    from .repository.errors import RepositoryError

    try:
        root = ensure_repository(repo)
        return compile_repository(root, models, device, auto_complete=not strict)
    except (RepositoryError, ValueError) as exc:
        err_console.print(f"[red]error:[/red] {exc}", highlight=False)
        raise typer.Exit(2) from None


def _batching(config: dict) -> str:
    mbs = config.get("max_batch_size", 0)
    if "dynamic_batching" in config:
        db = config["dynamic_batching"]
        delay = db.get("max_queue_delay_microseconds", 0)
        preferred = db.get("preferred_batch_size", [])
        return f"dynamic (max {mbs}, preferred {preferred}, delay {delay} us)"
    if "sequence_batching" in config:
        strategy = "oldest" if "oldest" in config["sequence_batching"] else "direct"
        return f"sequence, {strategy} (max {mbs})" if mbs > 0 else f"sequence, {strategy}"
    if mbs > 0:
        return f"none (max {mbs})"
    return "none"


def _instances(config: dict) -> str:
    groups = config.get("instance_group", [])
    if not groups:
        return "-"
    return ", ".join(f"{g['count']} x {g['kind'].removeprefix('KIND_')}" for g in groups)


def _status(result, name: str) -> str:
    """READY, INVALID (tritonserver would refuse it) or UNSUPPORTED (valid, but not servable here)."""
    if name in result.models:
        return "READY"
    return "UNSUPPORTED" if result.failures[name].unsupported else "INVALID"


def _error_lines(name: str, error) -> list[str]:
    """One precise error per problem: where, Triton's message, then what we add."""
    where = f"{error.location}: " if error.location else ""
    lines = [f"{name}: {where}{error.message}"]
    if error.detail:
        lines.append(f"  {error.detail}")
    return lines


def _print_error(name: str, error) -> None:
    label = "[yellow]unsupported:[/yellow]" if error.unsupported else "[red]error:[/red]"
    first, *rest = _error_lines(name, error)
    err_console.print(f"{label} {escape(first)}", highlight=False, soft_wrap=True, markup=True)
    for line in rest:
        err_console.print(line, highlight=False, soft_wrap=True, markup=False, style="dim")


def _backends_needed(result) -> dict[str, list[str]]:
    """The backends the repository's valid models use -> the frameworks they put into an image
    for the device (toolkit/build/runtime_deps.py)."""
    from .build.runtime_deps import CUDA_LINES, DEFAULT_CUDA_MAJOR, backend_requirements, runtime_backends

    gpu = result.device.kind == "gpu"
    cuda = CUDA_LINES[DEFAULT_CUDA_MAJOR] if gpu else None
    try:  # with onnxruntime's OpenVINO accelerator ("onnxruntime+openvino")
        keys = runtime_backends((m.config for m in result.models.values()), gpu=gpu)
    except ValueError:  # refused by the build with its message; list the models' backends
        keys = {m.backend for m in result.models.values()}
    requirements = {key: backend_requirements(key, cuda) for key in keys}
    superseded = {name for found in requirements.values() for r in found for name in r.supersedes}
    return {
        key: [r.spec for r in found if r.imports and r.name not in superseded]
        for key, found in sorted(requirements.items())
    }


def _model_json(result, name: str) -> dict:
    entry: dict = {"name": name, "status": _status(result, name)}
    if name in result.models:
        m = result.models[name]
        entry.update(
            versions=m.versions,
            backend=m.backend,
            max_batch_size=m.config.get("max_batch_size", 0),
            instances=[
                {"name": g["name"], "kind": g["kind"], "count": g["count"], "gpus": g.get("gpus", [])}
                for g in m.config.get("instance_group", [])
            ],
            warnings=m.warnings,
        )
    else:
        e = result.failures[name]
        entry.update(
            error=e.message,
            detail=e.detail,
            stage=e.stage,
            file=e.file,
            line=e.line,
            column=e.column,
        )
    return entry


def _cpu_plan(result, cpus: Optional[float]):
    """The runtime's CPU thread budget for the compiled models (handlers/cpu_budget.py), on
    `cpus` CPUs or this machine's."""
    from handlers import cpu_budget

    count = cpu_budget.available_cpus() if cpus is None else cpu_budget.for_target(cpus, f"--cpus {cpus:g}")
    return cpu_budget.plan(result.models.values(), count)


@app.command()
def validate(
    repo: RepoArg,
    model: ModelOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON")] = False,
    device: DeviceOpt = "cpu",
    strict: StrictOpt = False,
    cpus: Annotated[
        Optional[float],
        typer.Option("--cpus", min=0.01, help="CPUs the thread budget is planned for (default: this machine's)"),
    ] = None,
) -> None:
    """Check a repository the way tritonserver would; exit 1 if any selected model is invalid.

    Messages are tritonserver's where it defines the check. Instances are computed for --device
    (the target), not for this machine. `threads` (per instance) is the runtime's CPU thread budget
    (docs/performance.md) on --cpus CPUs, or on this machine's.
    """
    result = _compile(repo, model, device, strict)
    cpu_plan = _cpu_plan(result, cpus)
    threads = cpu_plan.compact()
    if as_json:
        doc = {
            "repository": str(result.root),
            "device": str(result.device),
            "auto_complete": not strict,
            "ok": result.ok,
            "cpu_budget": cpu_plan.as_dict(),
            "models": [_model_json(result, name) for name in sorted(result.selected)],
            "backends": _backends_needed(result),
        }
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        raise typer.Exit(0 if result.ok else 1)

    names = sorted(result.selected)
    table = Table(title=f"Model repository {result.root} (device: {result.device})", title_justify="left")
    # Model names are never truncated: the column is as wide as the longest name.
    table.add_column("model", no_wrap=True, min_width=max((len(n) for n in names), default=5))
    for column in ("versions", "backend", "batching", "instances", "threads", "status"):
        table.add_column(column, overflow="fold")
    styles = {"READY": "[green]OK[/green]", "INVALID": "[red]INVALID[/red]", "UNSUPPORTED": "[yellow]UNSUPPORTED[/yellow]"}
    for name in names:
        status = styles[_status(result, name)]
        if name in result.models:
            m = result.models[name]
            table.add_row(
                name, ",".join(map(str, m.versions)), m.backend, _batching(m.config), _instances(m.config),
                threads.get(name, "-"), status, style=None,
            )
        else:
            table.add_row(name, "-", "-", "-", "-", "-", status)
    console.print(table, crop=False)
    needed = _backends_needed(result)
    if needed:
        listed = ", ".join(f"{b} ({', '.join(specs)})" if specs else b for b, specs in needed.items())
        console.print(f"backends needed: {listed}", highlight=False, soft_wrap=True)
    if result.models:
        console.print(cpu_plan.summary(), highlight=False, soft_wrap=True)
    for name in names:
        if name in result.models:
            for warning in result.models[name].warnings:
                err_console.print(f"[yellow]warning:[/yellow] {name}: {escape(warning)}", highlight=False, soft_wrap=True)
    for name in names:
        if name in result.failures:
            _print_error(name, result.failures[name])
    if not names:
        err_console.print("[yellow]warning:[/yellow] the repository has no models", highlight=False)
    elif result.ok:
        err_console.print(f"{len(names)} model(s) valid for device {result.device}", highlight=False)
    else:
        err_console.print(
            f"{len(result.failures)} of {len(names)} model(s) cannot be served", highlight=False
        )
    raise typer.Exit(0 if result.ok else 1)


@app.command()
def config(
    repo: RepoArg,
    model_name: Annotated[str, typer.Argument(metavar="MODEL", help="Model name")],
    device: DeviceOpt = "cpu",
    strict: StrictOpt = False,
) -> None:
    """Print a model's completed configuration as Triton's JSON (what GET /v2/models/M/config returns)."""
    result = _compile(repo, [model_name], device, strict)
    if model_name in result.failures:
        _print_error(model_name, result.failures[model_name])
        raise typer.Exit(1)
    compiled = result.models[model_name]
    for warning in compiled.warnings:
        err_console.print(f"[yellow]warning:[/yellow] {model_name}: {escape(warning)}", highlight=False, soft_wrap=True)
    sys.stdout.write(json.dumps(compiled.config, indent=2) + "\n")


def _resolve_device(device: str) -> str:
    if device != "auto":
        return device
    try:
        import onnxruntime
    except ImportError:
        return "cpu"
    return "gpu" if "CUDAExecutionProvider" in onnxruntime.get_available_providers() else "cpu"


GRPC_EXTRA_HINT = "pip install 'triton-serverless-toolkit[grpc]'"


def _grpc_available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("grpc", "grpc_health"))


@app.command()
def serve(
    repo: RepoArg,
    host: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--http-port", "--port", help="HTTP port (v2 REST); 0 turns it off")] = 8000,
    grpc_port: Annotated[
        Optional[int], typer.Option("--grpc-port", help="gRPC port (inference.GRPCInferenceService, grpc.health.v1); 0 turns it off [default: 8001]")
    ] = None,
    metrics_port: Annotated[int, typer.Option("--metrics-port", help="Metrics port (GET /metrics); 0 turns it off. /metrics is also on the HTTP port")] = 8002,
    model: ModelOpt = None,
    device: Annotated[str, typer.Option("--device", help="auto (GPU when onnxruntime has CUDA), cpu, gpu or gpu:N")] = "auto",
    exit_on_error: Annotated[
        bool,
        typer.Option("--exit-on-error/--no-exit-on-error", help="Fail at startup if a model fails to load (tritonserver's default)"),
    ] = True,
    log_level: Annotated[str, typer.Option(help="uvicorn log level")] = "info",
    workers: Annotated[
        str, typer.Option("--workers", envvar="TOOLKIT_WORKERS", help="Server processes on the same ports, each with its share of every model's instances: N or auto (docs/performance.md); TOOLKIT_WORKERS as in images")
    ] = "1",
    cache_config: Annotated[
        Optional[str],
        typer.Option("--cache-config", envvar="TOOLKIT_CACHE_CONFIG", help="The response cache of models with response_cache { enable: true }: local,size=BYTES (tritonserver's --cache-config); TOOLKIT_CACHE_CONFIG as in images"),
    ] = None,
) -> None:
    """Serve a repository locally with the same runtime the images run: v2 REST on 8000, gRPC on 8001
    and metrics on 8002, like tritonserver."""
    import logging

    from handlers.backends.python import INSTANCE_MODE_ENV, PROCESS
    from handlers.entrypoints.server import serve as run_server
    from handlers.manifest import Manifest
    from handlers.model_repository import ModelRepository
    from handlers.workers.plan import worker_count
    from handlers.workers.supervisor import supervise

    for option, value in (("--http-port", port), ("--grpc-port", grpc_port), ("--metrics-port", metrics_port)):
        if value is not None and not 0 <= value <= 65535:
            raise typer.BadParameter(f"expected a port from 0 to 65535 (0 turns it off), got {value}", param_hint=option)
    if grpc_port is None:
        grpc_port = 8001
        if not _grpc_available():
            err_console.print(f"[yellow]warning:[/yellow] gRPC is off: grpcio is not installed ({GRPC_EXTRA_HINT})", highlight=False)
            grpc_port = 0
    elif grpc_port and not _grpc_available():
        err_console.print(f"[red]error:[/red] --grpc-port needs grpcio and grpcio-health-checking: {GRPC_EXTRA_HINT}", highlight=False)
        raise typer.Exit(2)
    if not (port or grpc_port):
        err_console.print("[red]error:[/red] --http-port and --grpc-port are both 0: nothing would serve inference", highlight=False)
        raise typer.Exit(2)
    if cache_config:
        from handlers.response_cache import CACHE_CONFIG_ENV, parse_cache_config

        try:
            parse_cache_config(cache_config)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--cache-config") from None
        os.environ[CACHE_CONFIG_ENV] = cache_config  # the repository below and any workers read it
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # A local server takes concurrent requests: python models run in model processes, so one that
    # crashes fails only its own requests (the environment may say otherwise: docs/python-backend.md).
    os.environ.setdefault(INSTANCE_MODE_ENV, PROCESS)
    result = _compile(repo, model, _resolve_device(device), False)
    for line in result.failure_lines():
        err_console.print(f"[red]error:[/red] {line}", highlight=False, soft_wrap=True)
    if result.failures and exit_on_error:
        raise typer.Exit(1)
    for name, compiled in sorted(result.models.items()):
        for warning in compiled.warnings:
            err_console.print(f"[yellow]warning:[/yellow] {name}: {escape(warning)}", highlight=False)
    manifest = Manifest.from_dict(result.manifest(), root=result.root)
    try:
        repository = ModelRepository(manifest)
        count = worker_count(manifest, workers, repository.cpu_plan.cpus.cpus)
    except ValueError as exc:  # e.g. TOOLKIT_CPUS that is not a number of CPUs, too many workers
        err_console.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None

    def listening(listeners) -> None:
        where = ", ".join(str(listener) for listener in listeners)
        err_console.print(f"serving {len(manifest.models)} model(s) from {result.root}: {where}", highlight=False, soft_wrap=True)

    if count > 1:
        with tempfile.TemporaryDirectory(prefix="toolkit-serve-") as folder:
            manifest_path = Path(folder) / "models.json"
            manifest_path.write_text(json.dumps(result.manifest()))
            raise typer.Exit(supervise(
                manifest_path, result.root, count, host, port, grpc_port=grpc_port, metrics_port=metrics_port,
                exit_on_error=exit_on_error, log_level=log_level, on_listening=listening,
            ))
    raise typer.Exit(run_server(
        repository, host, port, grpc_port=grpc_port, metrics_port=metrics_port, exit_on_error=exit_on_error,
        log_level=log_level, on_listening=listening,
    ))


class _RichBuildUI:
    """Progress of `toolkit build` on stderr: a spinner per step, engine output streamed dimmed."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.status = err_console.status("starting")

    def step(self, message: str) -> None:
        self.status.update(message)
        err_console.print(f"[bold]==>[/bold] {message}", highlight=False)

    def line(self, message: str) -> None:
        if not self.quiet:
            err_console.print(message, style="dim", highlight=False, markup=False, soft_wrap=True)

    def warn(self, message: str) -> None:
        err_console.print(f"[yellow]warning:[/yellow] {message}", highlight=False)


@app.command()
def build(
    repo: RepoArg,
    target: Annotated[str, typer.Option("--target", help="lambda, cloudrun or knative")],
    model: ModelOpt = None,
    name: Annotated[Optional[str], typer.Option(help="Image name (default: the repository folder's name)")] = None,
    tag: Annotated[Optional[str], typer.Option(help="Image tag (default: the first 12 hex digits of the context digest)")] = None,
    output: Annotated[Optional[Path], typer.Option(help="Build context folder (default: build/NAME-TARGET)")] = None,
    builder: Annotated[str, typer.Option(help="auto, docker, podman, buildah, or none (write the context, print the command)")] = "auto",
    base_image: Annotated[Optional[str], typer.Option(help="Base image with python3 (default: the target's)")] = None,
    platform: Annotated[str, typer.Option(help="linux/amd64 or linux/arm64")] = "linux/amd64",
    push: Annotated[Optional[str], typer.Option(metavar="REGISTRY", help="Push to this OCI registry, e.g. 127.0.0.1:5000 or ghcr.io/me")] = None,
    device: Annotated[str, typer.Option(help="cloudrun/knative: auto (GPU when a model asks for KIND_GPU), cpu or gpu")] = "auto",
    cuda: Annotated[int, typer.Option(help="CUDA major of GPU images: 12 (Cloud Run L4, driver >= 525.60.13) or 13 (driver >= 580)")] = 12,
    python_version: Annotated[Optional[str], typer.Option(help="The base image's Python (e.g. 3.12) when it cannot be probed")] = None,
    measure_cold_start: Annotated[
        bool, typer.Option("--measure-cold-start", help="Run the built image (as its platform would) and time it until it answers ready")
    ] = False,
    refresh_wheels: Annotated[
        bool, typer.Option("--refresh-wheels", help="Resolve and download the wheelhouse again instead of reusing the cache")
    ] = False,
    strict: StrictOpt = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not stream pip and engine output")] = False,
    protocol: Annotated[
        str, typer.Option("--protocol", help="cloudrun/knative: http (v2 REST) or grpc (inference.GRPCInferenceService, h2c) on the service's port")
    ] = "http",
    grpc_frontend: Annotated[
        str, typer.Option("--grpc-frontend", help="--protocol grpc images: auto (the native grpc++ front end when it can be had, else grpcio's server, saying why), native (fail when it cannot be had) or grpcio")
    ] = "auto",
    http_frontend: Annotated[
        str, typer.Option("--http-frontend", help="cloudrun/knative --protocol http images: auto (the native libevent front end when it can be had, else uvicorn, saying why), native (fail when it cannot be had) or uvicorn")
    ] = "auto",
) -> None:
    """Build a container image of a repository for AWS Lambda, Cloud Run or Knative."""
    from .build import BuildError, BuildOptions, run_build
    from .build.errors import BuildOptionError

    options = BuildOptions(
        repository=repo, target=target, models=model, name=name, tag=tag, output=output, builder=builder,
        base_image=base_image, platform=platform, push=push, device=device, cuda=cuda, python_version=python_version,
        measure_cold_start=measure_cold_start, refresh_wheels=refresh_wheels, auto_complete=not strict,
        protocol=protocol, grpc_frontend=grpc_frontend, http_frontend=http_frontend,
    )
    ui = _RichBuildUI(quiet)
    try:
        with ui.status:
            result = run_build(options, ui)
    except BuildOptionError as exc:
        err_console.print(f"[red]error:[/red] {exc.message}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except BuildError as exc:
        err_console.print(f"[red]error:[/red] {escape(exc.message)}", highlight=False, soft_wrap=True)
        if exc.detail and (quiet or not exc.streamed):
            err_console.print(exc.detail, style="dim", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1) from None
    report = result.report
    report.render(console)
    for warning in report.warnings:
        err_console.print(f"[yellow]warning:[/yellow] {escape(warning)}", highlight=False, soft_wrap=True)
    err_console.print(f"report: {result.report_path}", highlight=False)
    if report.image is None:
        console.print("context written; build it with:", highlight=False)
        console.print(f"  {report.build_command}", highlight=False, markup=False, soft_wrap=True)


class _RichDeployUI:
    """Progress of `toolkit deploy` on stderr; the plan and the record go to stdout."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet

    def step(self, message: str) -> None:
        err_console.print(f"[bold]==>[/bold] {message}", highlight=False, soft_wrap=True)

    def line(self, message: str) -> None:
        if not self.quiet:
            err_console.print(message, style="dim", highlight=False, markup=False, soft_wrap=True)

    def warn(self, message: str) -> None:
        err_console.print(f"[yellow]warning:[/yellow] {message}", highlight=False, soft_wrap=True)


def _pairs_table(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, value)
    return table


@app.command()
def deploy(
    repo: Annotated[
        Optional[str],
        typer.Argument(help="Model repository: sizes the deployment, and is built into an image when --image is not given"),
    ] = None,
    target: Annotated[str, typer.Option("--target", "-t", help="lambda, cloudrun or knative")] = ...,  # type: ignore[assignment]
    name: Annotated[Optional[str], typer.Option(help="Function / service name (default: the repository folder's name)")] = None,
    image: Annotated[
        Optional[str],
        typer.Option(help="Image to deploy: a registry reference, a local engine image, or oci-archive:PATH / docker-archive:PATH / oci:DIR"),
    ] = None,
    model: ModelOpt = None,
    region: Annotated[Optional[str], typer.Option(help="AWS region / Cloud Run region")] = None,
    memory: Annotated[Optional[str], typer.Option(help="Memory: MB for Lambda (e.g. 3008), a quantity for services (16Gi)")] = None,
    timeout: Annotated[Optional[int], typer.Option(help="Seconds: Lambda function timeout / request timeout of a service")] = None,
    env: Annotated[Optional[list[str]], typer.Option("--env", help="KEY=VALUE environment variable (repeatable)")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the plan and write the manifest; no cloud call")] = False,
    output: Annotated[Optional[Path], typer.Option(help="Folder for the manifest and deploy-record.json (default deploy/NAME-TARGET)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the deploy record as JSON on stdout")] = False,
    engine: Annotated[str, typer.Option(help="Container engine that pushes local images: auto, docker or podman")] = "auto",
    ephemeral_storage: Annotated[Optional[int], typer.Option(help="lambda: /tmp size in MB (512 to 10240)")] = None,
    arch: Annotated[Optional[str], typer.Option(help="lambda: x86_64 (default) or arm64")] = None,
    auth: Annotated[Optional[str], typer.Option(help="lambda: Function URL auth, iam (AWS_IAM, default) or none (public)")] = None,
    provisioned_concurrency: Annotated[
        Optional[int], typer.Option(help="lambda: environments kept initialised on alias 'live' (0 removes)")
    ] = None,
    role: Annotated[Optional[str], typer.Option(help="lambda: an existing execution role ARN instead of a toolkit-made one")] = None,
    ecr_repository: Annotated[Optional[str], typer.Option(help="lambda: ECR repository (default: the function name)")] = None,
    smoke_test: Annotated[
        Optional[bool],
        typer.Option("--smoke-test/--no-smoke-test", help="lambda: invoke the new version (GET /v2/health/ready) before moving 'live' (default on)"),
    ] = None,
    project: Annotated[Optional[str], typer.Option(help="cloudrun: Google Cloud project (default: from the credentials)")] = None,
    gpu: Annotated[Optional[str], typer.Option(help="cloudrun/knative: auto (default), none, or nvidia-l4")] = None,
    cpu: Annotated[Optional[str], typer.Option(help="cloudrun/knative: vCPUs per instance")] = None,
    concurrency: Annotated[Optional[int], typer.Option(help="cloudrun/knative: requests per instance (default: max_batch_size x instances)")] = None,
    min_instances: Annotated[Optional[int], typer.Option(help="cloudrun/knative: instances kept warm")] = None,
    max_instances: Annotated[Optional[int], typer.Option(help="cloudrun/knative: scale-out limit")] = None,
    startup_budget: Annotated[Optional[int], typer.Option(help="cloudrun/knative: seconds allowed for load + warmup")] = None,
    cpu_throttling: Annotated[
        Optional[bool], typer.Option("--cpu-throttling/--no-cpu-throttling", help="cloudrun/knative: CPU only during requests (not with a GPU)")
    ] = None,
    startup_cpu_boost: Annotated[Optional[bool], typer.Option("--startup-cpu-boost/--no-startup-cpu-boost", help="cloudrun: more CPU while starting (default on)")] = None,
    gpu_zonal_redundancy: Annotated[
        Optional[bool], typer.Option("--gpu-zonal-redundancy/--no-gpu-zonal-redundancy", help="cloudrun: GPU zonal redundancy (default on)")
    ] = None,
    allow_unauthenticated: Annotated[
        Optional[bool], typer.Option("--allow-unauthenticated", help="cloudrun: make the service public (allUsers: roles/run.invoker)")
    ] = None,
    service_account: Annotated[Optional[str], typer.Option(help="cloudrun/knative: the service's identity")] = None,
    ar_repository: Annotated[Optional[str], typer.Option(help="cloudrun: Artifact Registry repository (default toolkit)")] = None,
    api_endpoint: Annotated[Optional[str], typer.Option(hidden=True, help="cloudrun: one base URL for Google's APIs")] = None,
    namespace: Annotated[Optional[str], typer.Option(help="knative: Kubernetes namespace")] = None,
    context: Annotated[Optional[str], typer.Option(help="knative: kube context")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Do not stream the engine's push output")] = False,
    protocol: Annotated[
        Optional[str], typer.Option("--protocol", help="cloudrun/knative: http (default) or grpc: the image's protocol (port h2c, gRPC health probes)")
    ] = None,
    base_image: Annotated[
        Optional[str], typer.Option("--base-image", help="lambda/cloudrun without --image: toolkit build's base image for the image built from the repository")
    ] = None,
    grpc_frontend: Annotated[
        Optional[str], typer.Option("--grpc-frontend", help="cloudrun --protocol grpc without --image: toolkit build's --grpc-frontend (auto, native or grpcio)")
    ] = None,
    http_frontend: Annotated[
        Optional[str], typer.Option("--http-frontend", help="cloudrun --protocol http without --image: toolkit build's --http-frontend (auto, native or uvicorn)")
    ] = None,
) -> None:
    """Deploy a repository (or an image of it) to AWS Lambda, Cloud Run or Knative."""
    from .deploy.command import DeployRequest, run_deploy
    from .deploy.errors import DeployError, DeployOptionError, ManualSteps

    request = DeployRequest(
        target=target, repository=repo, name=name, image=image, models=model, region=region, memory=memory, timeout=timeout,
        env=env or [], dry_run=dry_run, output=output, engine=engine, ephemeral_storage=ephemeral_storage, arch=arch,
        auth=auth, provisioned_concurrency=provisioned_concurrency, role=role, ecr_repository=ecr_repository,
        smoke_test=smoke_test, gpu=gpu, cpu=cpu, concurrency=concurrency, min_instances=min_instances,
        max_instances=max_instances, startup_budget=startup_budget, cpu_throttling=cpu_throttling,
        startup_cpu_boost=startup_cpu_boost, gpu_zonal_redundancy=gpu_zonal_redundancy, service_account=service_account,
        project=project, ar_repository=ar_repository, api_endpoint=api_endpoint, allow_unauthenticated=allow_unauthenticated,
        namespace=namespace, context=context, protocol=protocol, base_image=base_image, grpc_frontend=grpc_frontend,
        http_frontend=http_frontend,
    )
    try:
        outcome = run_deploy(request, _RichDeployUI(quiet))
    except DeployOptionError as exc:
        err_console.print(f"[red]error:[/red] {exc.message}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except ManualSteps as exc:
        err_console.print(f"[yellow]not deployed:[/yellow] {exc.message}", highlight=False, soft_wrap=True)
        if exc.manifest:
            err_console.print(f"manifest: {exc.manifest}", highlight=False)
        for command in exc.commands:
            console.print(f"  {command}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1) from None
    except DeployError as exc:
        err_console.print(f"[red]error:[/red] {exc.message}", highlight=False, soft_wrap=True)
        if exc.detail:
            err_console.print(exc.detail, style="dim", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1) from None
    record = outcome.record
    path = record.write(outcome.output_dir / "deploy-record.json")
    if as_json:
        sys.stdout.write(record.to_json())
        return
    if record.dry_run:
        console.print(_pairs_table(f"{target} deployment plan (dry run: nothing was changed)", outcome.plan))
    else:
        console.print(_pairs_table(f"deployed to {target}", record.rows()))
    if record.manifest:
        err_console.print(f"manifest: {record.manifest}", highlight=False)
    err_console.print(f"record: {path}", highlight=False)


@app.command()
def invoke(
    url: Annotated[str, typer.Argument(help="Base URL of the deployment (Function URL, Cloud Run URL, any v2 server)")],
    model_name: Annotated[str, typer.Option("--model", "-m", help="Model name")],
    inputs: Annotated[
        Optional[list[str]], typer.Option("--input", "-i", help="NAME=FILE: .npy, .json (list or v2 tensor), or raw bytes (repeatable)")
    ] = None,
    binary: Annotated[bool, typer.Option("--binary", help="Send and receive tensors with the binary data extension")] = False,
    output_format: Annotated[str, typer.Option("--output", help="json (print the response) or npy (one file per output)")] = "json",
    output_dir: Annotated[Optional[Path], typer.Option(help="Folder for npy outputs (and response.json)")] = None,
    requested: Annotated[Optional[list[str]], typer.Option("--requested-output", help="Only these outputs (repeatable)")] = None,
    model_version: Annotated[Optional[str], typer.Option(help="Model version (default: the server's choice)")] = None,
    request_id: Annotated[Optional[str], typer.Option("--id", help="Request id echoed in the response")] = None,
    auth: Annotated[str, typer.Option(help="auto (from the URL), iam (SigV4), google (ID token) or none")] = "auto",
    region: Annotated[Optional[str], typer.Option(help="SigV4 region when the URL does not tell")] = None,
    audience: Annotated[Optional[str], typer.Option(help="ID token audience (default: the URL's origin)")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the answer")] = 300.0,
    protocol: Annotated[str, typer.Option("--protocol", help="http (v2 REST) or grpc (a --protocol grpc service; the ID token goes in the metadata)")] = "http",
) -> None:
    """Run one v2 inference against a deployment, signing the request for private endpoints."""
    from .deploy.client_codec import response_json, save_npy
    from .deploy.errors import DeployError, DeployOptionError
    from .deploy.invoke import Endpoint, invoke as run_invoke, parse_input_specs
    from .deploy.signing import signer_for

    if output_format not in ("json", "npy"):
        err_console.print("[red]error:[/red] --output: choose json or npy", highlight=False)
        raise typer.Exit(2)
    if output_format == "npy" and output_dir is None:
        err_console.print("[red]error:[/red] --output npy needs --output-dir DIR", highlight=False)
        raise typer.Exit(2)
    if protocol not in ("http", "grpc"):
        err_console.print("[red]error:[/red] --protocol: choose http or grpc", highlight=False)
        raise typer.Exit(2)
    try:
        if protocol == "grpc":
            from .deploy.invoke import invoke_grpc

            result = invoke_grpc(
                url, signer_for(url, auth, region=region, audience=audience), model_name, parse_input_specs(inputs or []),
                version=model_version, outputs=requested, request_id=request_id, timeout_s=timeout,
            )
        else:
            endpoint = Endpoint(url, signer_for(url, auth, region=region, audience=audience), timeout)
            result = run_invoke(
                endpoint, model_name, parse_input_specs(inputs or []), version=model_version, outputs=requested,
                binary=binary, request_id=request_id,
            )
    except DeployOptionError as exc:
        err_console.print(f"[red]error:[/red] {exc.message}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except DeployError as exc:
        err_console.print(f"[red]error:[/red] {exc.message}", highlight=False, soft_wrap=True)
        if exc.detail:
            err_console.print(exc.detail, style="dim", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1) from None
    document = response_json(result)
    if output_dir is not None:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "response.json").write_text(json.dumps(document, indent=2) + "\n")
    if output_format == "npy":
        for path in save_npy(result, output_dir):  # type: ignore[arg-type]
            err_console.print(f"wrote {path}", highlight=False)
        return
    sys.stdout.write(json.dumps(document, indent=2) + "\n")


@app.command()
def proxy(
    url: Annotated[str, typer.Argument(help="Base URL of the private deployment")],
    port: Annotated[int, typer.Option(help="Local HTTP port (0: no HTTP listener)")] = 8000,
    grpc_port: Annotated[
        Optional[int], typer.Option("--grpc-port", help="Also accept gRPC (tritonclient.grpc, perf_analyzer -i grpc) on this local port")
    ] = None,
    upstream: Annotated[
        str, typer.Option(help="What the deployment speaks: http (Lambda, --protocol http services: gRPC calls become signed REST calls) or grpc (--protocol grpc services: relayed with an ID token)")
    ] = "http",
    host: Annotated[str, typer.Option(help="Local address (keep 127.0.0.1: the proxy signs with your credentials)")] = "127.0.0.1",
    auth: Annotated[str, typer.Option(help="auto (from the URL), iam (SigV4), google (ID token) or none")] = "auto",
    region: Annotated[Optional[str], typer.Option(help="SigV4 region when the URL does not tell")] = None,
    audience: Annotated[Optional[str], typer.Option(help="ID token audience (default: the URL's origin)")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the upstream's answer")] = 300.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every request")] = False,
) -> None:
    """Serve local endpoints that sign and forward to a private deployment, so unmodified
    tritonclient scripts and perf_analyzer (-i http or -i grpc) can drive it."""
    import signal
    import threading

    from .deploy.errors import DeployError, DeployOptionError
    from .deploy.proxy import SigningProxy
    from .deploy.signing import signer_for

    if upstream not in ("http", "grpc"):
        err_console.print("[red]error:[/red] --upstream: choose http or grpc", highlight=False)
        raise typer.Exit(2)
    if not port and not grpc_port:
        err_console.print("[red]error:[/red] --port 0 and no --grpc-port: nothing to listen on", highlight=False)
        raise typer.Exit(2)
    if upstream == "grpc" and port:
        err_console.print(
            "[yellow]note:[/yellow] --upstream grpc: the HTTP listener is off (a gRPC service answers no REST); "
            "use --grpc-port", highlight=False,
        )
        port = 0
    log = (lambda m: err_console.print(m, highlight=False, markup=False)) if verbose else None
    server = grpc_server = None
    try:
        signer = signer_for(url, auth, region=region, audience=audience)
        if port:
            server = SigningProxy(url, signer, host, port, timeout, log=log)
        if grpc_port is not None:
            from .deploy.grpc_proxy import GrpcProxy

            grpc_server = GrpcProxy(url, signer, host, grpc_port, upstream_protocol=upstream, timeout_s=timeout, log=log)
    except DeployOptionError as exc:
        err_console.print(f"[red]error:[/red] {exc.message}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    except DeployError as exc:
        err_console.print(f"[red]error:[/red] {exc.message}", highlight=False, soft_wrap=True)
        if server is not None:
            server.close()
        raise typer.Exit(1) from None
    if host not in ("127.0.0.1", "localhost", "::1"):
        err_console.print(
            f"[yellow]warning:[/yellow] listening on {host}: anyone who reaches this port calls {url} with your credentials",
            highlight=False,
        )
    stop = threading.Event()

    def _stop(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    if server is not None:
        err_console.print(
            f"proxying {server.url} -> {server.upstream} ({signer.description}); Ctrl-C stops", highlight=False, soft_wrap=True
        )
        server.start()
    if grpc_server is not None:
        how = "each RPC as signed v2 REST" if upstream == "http" else "gRPC with the token in its metadata"
        err_console.print(
            f"proxying gRPC {grpc_server.address} -> {grpc_server.upstream} ({how}; {signer.description}); Ctrl-C stops",
            highlight=False, soft_wrap=True,
        )
        grpc_server.start()
    try:
        while not stop.wait(0.5):
            pass
    finally:
        if grpc_server is not None:
            grpc_server.stop()
        if server is not None:
            server.shutdown()

@app.command()
def run(
    image: Annotated[str, typer.Argument(help="An image built by toolkit build, e.g. quickstart:22e5eca68e81")],
    port: Annotated[int, typer.Option(help="Local port of the v2 endpoint")] = 8000,
    host: Annotated[str, typer.Option(help="Local address")] = "127.0.0.1",
    target: Annotated[str, typer.Option(help="auto (the image's target label), lambda, cloudrun or knative")] = "auto",
    env: Annotated[Optional[list[str]], typer.Option("--env", "-e", help="KEY=VALUE for the function / container (repeatable)")] = None,
    builder: Annotated[str, typer.Option(help="Container engine: auto, docker or podman")] = "auto",
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every request; print the container's log at exit")] = False,
) -> None:
    """Run a built image here as its platform runs it and serve its v2 endpoint on --port, for
    unmodified tritonclient scripts and perf_analyzer. Lambda images run under AWS's Lambda Runtime
    Interface Emulator (read-only root, /tmp, non-root user) behind a Function URL front: every
    request becomes a Function URL event. Cloud Run / Knative images run with PORT and a read-only root."""
    import signal
    import time

    from .build import BuildError
    from .build.builders import detect_builder, wait_ready
    from .build.local_run import LocalLambda, run_service
    from .deploy.errors import DeployError
    from .deploy.proxy import SigningProxy
    from .deploy.signing import NoSigner

    environment: dict[str, str] = {}
    for item in env or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            err_console.print(f"[red]error:[/red] --env {item}: expected KEY=VALUE", highlight=False)
            raise typer.Exit(2)
        environment[key] = value
    if target not in ("auto", "lambda", "cloudrun", "knative"):
        err_console.print(f"[red]error:[/red] --target {target}: choose auto, lambda, cloudrun or knative", highlight=False)
        raise typer.Exit(2)

    def _stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _stop)
    engine = None
    container = None
    function: LocalLambda | None = None
    try:
        engine, notes = detect_builder(builder)
        if engine is None or not engine.can_run:
            raise BuildError(f"no container engine that runs images ({'; '.join(notes) or builder}): install docker or podman")
        info = engine.inspect(image)
        kind = target if target != "auto" else info.labels.get("io.triton-serverless-toolkit.target", "")
        if kind not in ("lambda", "cloudrun", "knative"):
            raise BuildError(f"{image} has no toolkit target label: pass --target lambda, cloudrun or knative")
        if kind == "lambda":
            function = LocalLambda(engine, image, arch=info.architecture or "amd64", environment=environment,
                                   function_name=image.split("@")[0].split(":")[0].rsplit("/", 1)[-1])
            function.start()
            function.wait_listening()
            server = SigningProxy(function.invoke_url, NoSigner(), host, port,
                                  log=(lambda m: err_console.print(m, highlight=False, markup=False)) if verbose else None)
            err_console.print(
                f"serving {image} (lambda, under AWS's Lambda Runtime Interface Emulator in container {function.container}; "
                f"every request becomes a Function URL event, one at a time) on {server.url}; Ctrl-C stops",
                highlight=False, soft_wrap=True,
            )
            try:
                server.serve_forever()
            finally:
                server.close()
        else:
            container = run_service(engine, image, port, host, environment)
            grpc = info.labels.get("io.triton-serverless-toolkit.protocol") == "grpc"
            if grpc:
                from .build.pipeline import wait_grpc_serving

                ready = wait_grpc_serving(f"{host}:{port}", 300.0, lambda: engine.running(container))
            else:
                ready = wait_ready(f"http://{host}:{port}/v2/health/ready", 300.0, lambda: engine.running(container))
            if ready is None:
                raise BuildError(f"{image} did not become ready", detail=engine.logs(container)[-3000:])
            where = f"gRPC {host}:{port}" if grpc else f"http://{host}:{port}"
            err_console.print(f"serving {image} ({kind}, container {container}) on {where}; Ctrl-C stops", highlight=False)
            while engine.running(container):
                time.sleep(1.0)  # the container runs on its own: wait for it to exit or for Ctrl-C
            err_console.print(f"[red]error:[/red] {image} exited", highlight=False)
            err_console.print(engine.logs(container)[-3000:], style="dim", highlight=False, markup=False)
            raise typer.Exit(1)
    except KeyboardInterrupt:
        pass
    except (BuildError, DeployError) as exc:
        err_console.print(f"[red]error:[/red] {exc.message}", highlight=False, soft_wrap=True)
        if exc.detail:
            err_console.print(exc.detail, style="dim", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(1) from None
    finally:
        if verbose and engine is not None and (function or container):
            err_console.print(function.logs() if function else engine.logs(container), style="dim", highlight=False, markup=False)
        if function is not None:
            function.stop()
        if container is not None and engine is not None:
            engine.remove_container(container)



def _int_list(text: str | None, option: str) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}", param_hint=option) from None
    if not values or any(v < 0 for v in values):
        raise typer.BadParameter(f"expected non-negative integers, got {text!r}", param_hint=option)
    return values


def _shapes(values: list[str] | None) -> dict[str, list[int]]:
    shapes: dict[str, list[int]] = {}
    for value in values or []:
        name, _, dims = value.rpartition(":")
        try:
            shapes[name] = [int(d) for d in dims.split(",")]
        except ValueError:
            raise typer.BadParameter(f"expected NAME:D1,D2,..., got {value!r}", param_hint="--shape") from None
        if not name or any(d < 0 for d in shapes[name]):
            raise typer.BadParameter(f"expected NAME:D1,D2,... with non-negative dims, got {value!r}", param_hint="--shape")
    return shapes


class _RichTuneProgress:
    def __init__(self, percentile: int) -> None:
        self.percentile = percentile

    # Progress lines are log lines: never hard-wrapped at the console's width (which rich fixes
    # when the process starts with COLUMNS set, e.g. 80 under pytest-xdist), so each stays whole.
    def step(self, message: str) -> None:
        err_console.print(f"[bold]==>[/bold] {message}", highlight=False, soft_wrap=True)

    def measured(self, m) -> None:
        level = m.level
        err_console.print(
            f"    concurrency {level.concurrency:3d}: {level.throughput:9.1f} infer/s   p50 {level.p50_ms:8.1f} ms   "
            f"p{self.percentile} {level.latency(self.percentile):8.1f} ms   batch {level.batch_size:5.2f}",
            highlight=False,
            soft_wrap=True,
        )


def _tune_table(title: str, rows, percentile: int) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("configuration", "concurrency", "infer/s", "p50 ms", f"p{percentile} ms", "avg batch", "$ / 1M infer"):
        table.add_column(column, overflow="fold", justify="left" if column == "configuration" else "right")
    for m in rows:
        level = m.level
        table.add_row(
            m.candidate.label(), str(level.concurrency), f"{level.throughput:.1f}", f"{level.p50_ms:.1f}",
            f"{level.latency(percentile):.1f}", f"{level.batch_size:.2f}", f"{m.cost.usd_per_million:.3f}",
        )
    return table


@app.command()
def tune(
    repo: Annotated[str, typer.Argument(help="Local model repository directory")],
    model_name: Annotated[str, typer.Argument(metavar="MODEL", help="The model to tune")],
    latency_budget_ms: Annotated[
        Optional[float], typer.Option("--latency-budget-ms", help="Latency budget (at --percentile) the choice must meet")
    ] = None,
    target: Annotated[str, typer.Option("--target", help="cloudrun (many requests per instance) or lambda (one at a time)")] = "cloudrun",
    percentile: Annotated[int, typer.Option(help="Latency percentile the budget applies to: 50, 95 or 99")] = 99,
    device: Annotated[str, typer.Option("--device", help="Where the runtime runs the model: cpu, gpu or gpu:N")] = "cpu",
    batch_size: Annotated[int, typer.Option("--batch-size", "-b", help="Batch size of each generated request")] = 1,
    shape: Annotated[
        Optional[list[str]], typer.Option("--shape", help="NAME:D1,D2,... for inputs with variable dims (repeatable)")
    ] = None,
    max_batch_sizes: Annotated[Optional[str], typer.Option(help="max_batch_size values to try, e.g. 4,8,16")] = None,
    instance_counts: Annotated[Optional[str], typer.Option(help="Instance counts to try, e.g. 1,2")] = None,
    queue_delays_us: Annotated[
        Optional[str], typer.Option("--queue-delays-us", help="max_queue_delay_microseconds values to try, e.g. 100,1000")
    ] = None,
    concurrency: Annotated[Optional[str], typer.Option(help="Concurrency levels, e.g. 1,2,4,8 (lambda: always 1)")] = None,
    max_concurrency: Annotated[int, typer.Option(help="Highest concurrency level")] = 64,
    warmup: Annotated[float, typer.Option(help="Warm-up seconds before each measurement window")] = 1.0,
    window: Annotated[float, typer.Option(help="Seconds of each measurement window")] = 3.0,
    memory_gib: Annotated[Optional[float], typer.Option(help="Cloud Run instance memory for the cost (default 2 GiB per vCPU)")] = None,
    write: Annotated[bool, typer.Option("--write/--no-write", help="Write config.tuned.pbtxt beside config.pbtxt")] = True,
) -> None:
    """Find the best dynamic_batching / instance_group for MODEL with the real runtime under load.

    Sweeps max_batch_size, instance count, queue delay and preferred batch size (Cloud Run) or
    vCPUs (Lambda, one request at a time), prints the throughput-latency frontier, the best
    configuration within the latency budget with its estimated cost per million inferences on
    the hardware measured, and writes it to config.tuned.pbtxt (config.pbtxt is never changed).
    """
    from .tune import TuneError, TuneOptions, run

    options = TuneOptions(
        repo=Path(repo),
        model=model_name,
        target=target,
        latency_budget_ms=latency_budget_ms,
        percentile=percentile,
        device=_resolve_device(device) if device == "auto" else device,
        batch_size=batch_size,
        shapes=_shapes(shape),
        max_batch_sizes=_int_list(max_batch_sizes, "--max-batch-sizes"),
        instance_counts=_int_list(instance_counts, "--instance-counts"),
        queue_delays_us=_int_list(queue_delays_us, "--queue-delays-us"),
        concurrency=_int_list(concurrency, "--concurrency"),
        max_concurrency=max_concurrency,
        warmup_s=warmup,
        window_s=window,
        memory_gib=memory_gib,
        write=write,
    )
    if options.instance_counts is not None and 0 in options.instance_counts:
        raise typer.BadParameter("instance counts must be at least 1", param_hint="--instance-counts")
    if options.concurrency is not None and 0 in options.concurrency:
        raise typer.BadParameter("concurrency levels must be at least 1", param_hint="--concurrency")
    try:
        report = run(options, _RichTuneProgress(percentile))
    except TuneError as exc:
        err_console.print(f"[red]error:[/red] {exc}", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    console.print(_tune_table(f"Measured ({len(report.measurements)} points)", report.measurements, percentile), crop=False)
    console.print(_tune_table(f"Throughput-latency frontier (p{percentile})", report.frontier, percentile), crop=False)
    for note in report.notes:
        err_console.print(f"note: {note}", highlight=False, soft_wrap=True)
    if report.best is None:
        err_console.print(
            f"[red]no configuration met p{percentile} <= {latency_budget_ms:g} ms[/red]; the fastest point is the first "
            "row of the frontier", highlight=False,
        )
        raise typer.Exit(1)
    best = report.best
    level = best.level
    console.print(
        f"[bold]best[/bold]: {best.candidate.label()} at concurrency {level.concurrency}: {level.throughput:.1f} infer/s, "
        f"p{percentile} {level.latency(percentile):.1f} ms", highlight=False, soft_wrap=True,
    )
    console.print(f"cost: ${best.cost.usd_per_million:.3f} per million inferences ({best.cost.basis})", highlight=False,
                  soft_wrap=True)
    if report.tuned_path is not None:
        kept = "" if report.kept_comments else " (written whole: the original layout could not be kept)"
        console.print(f"wrote {report.tuned_path}{kept}", highlight=False, soft_wrap=True)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
