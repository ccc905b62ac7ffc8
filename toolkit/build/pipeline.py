"""`toolkit build`: repository -> compiled manifest -> wheelhouse -> context -> image -> report.

1. compile the selected models for the target's device (Lambda: CPU; Cloud Run / Knative: GPU
   when a model asks for KIND_GPU, or --device)
2. describe the base image (Python, glibc, architecture): known tag, probe, or --python-version
3. download the wheelhouse for that Python and platform (cached by its inputs)
4. write the context (Dockerfile, .dockerignore, wheelhouse, handlers, repository) and its digest
5. build with the container engine (or print the command), inspect, check the target's limits
6. optionally measure the cold start, push, and write the build report
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from .. import __version__
from ..repository.compile import AUTOCOMPLETE_IMAGE, CompiledRepository, compile_repository
from ..repository.discover import ensure_repository
from ..repository.errors import RepositoryError
from ..repository.model_config import ModelInstanceGroup, read_config_file
from .base_image import (
    PLATFORM_ARCH,
    PROBE_SCRIPT,
    BaseImage,
    from_python_version,
    known_base_image,
    parse_probe,
)
from .builders import Builder, check_platform_buildable, detect_builder, printable_command, wait_ready
from .context import ImagePlan, check_output, default_image_name, render_context, write_metadata
from .errors import BuildError, BuildOptionError
from .local_run import LocalLambda, free_port, run_service
from .footprint import backend_footprints
from .native_frontend import GRPC as GRPC_FRONTEND
from .native_frontend import HTTP as HTTP_FRONTEND
from .native_frontend import NativeFrontend, choose_frontend
from .report import (
    BuildReport,
    ColdStart,
    add_ready_seconds,
    backend_entries,
    estimate_cold_start,
    model_entries,
    target_warnings,
)
from .runtime_deps import (
    CUDA_LINES,
    DEFAULT_CUDA_MAJOR,
    PROTOCOLS,
    check_wheels_exist,
    runtime_backends,
    runtime_requirements,
)
from .targets import LAMBDA_TASK_LAYOUT, OPT_LAYOUT, TARGETS, Target
from .wheelhouse import ModelRequirements, build_wheelhouse, default_cache_dir

# docker reference grammar (distribution/reference): lower-case path components, tag.
_NAME = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_REGISTRY = re.compile(r"^[A-Za-z0-9.-]+(?::\d+)?(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")
READY_TIMEOUT_S = 300.0


class BuildUI(Protocol):
    def step(self, message: str) -> None: ...
    def line(self, message: str) -> None: ...
    def warn(self, message: str) -> None: ...


class SilentUI:
    def step(self, message: str) -> None:
        pass

    def line(self, message: str) -> None:
        pass

    def warn(self, message: str) -> None:
        pass


@dataclass
class BuildOptions:
    repository: str
    target: str
    models: list[str] | None = None
    name: str | None = None
    tag: str | None = None
    output: Path | None = None
    builder: str = "auto"
    base_image: str | None = None
    platform: str = "linux/amd64"
    push: str | None = None
    device: str = "auto"  # cloudrun / knative: auto, cpu or gpu
    cuda: int = DEFAULT_CUDA_MAJOR
    python_version: str | None = None
    measure_cold_start: bool = False
    refresh_wheels: bool = False
    auto_complete: bool = True
    wheel_cache: Path | None = None
    protocol: str = "http"  # cloudrun / knative: "grpc" serves inference.GRPCInferenceService on $PORT
    # gRPC images: "auto" (the native grpc++ front end when it can be had, else grpcio's server),
    # "native" (fail when it cannot be had) or "grpcio" (toolkit/build/native_frontend.py)
    grpc_frontend: str = "auto"
    # HTTP images (Cloud Run, Knative): "auto" (the native libevent front end when it can be had,
    # else uvicorn), "native" or "uvicorn" (toolkit/build/native_frontend.py)
    http_frontend: str = "auto"


@dataclass
class BuildResult:
    report: BuildReport
    report_path: Path
    context_dir: Path
    notes: list[str] = field(default_factory=list)


def _check_options(options: BuildOptions) -> Target:
    if options.target not in TARGETS:
        raise BuildOptionError(f"unknown target '{options.target}': choose one of {', '.join(TARGETS)}")
    target = TARGETS[options.target]
    if options.platform not in PLATFORM_ARCH:
        raise BuildOptionError(f"unknown platform '{options.platform}': choose one of {', '.join(PLATFORM_ARCH)}")
    if options.platform not in target.platforms:
        raise BuildOptionError(f"{target.name} runs {', '.join(target.platforms)} images only, not {options.platform}")
    if options.device not in ("auto", "cpu", "gpu"):
        raise BuildOptionError(f"unknown device '{options.device}': choose auto, cpu or gpu")
    if options.device == "gpu" and not target.gpu:
        raise BuildOptionError(f"{target.name} has no GPU: build with --device cpu (KIND_GPU models are mapped to CPU)")
    if options.protocol not in PROTOCOLS:
        raise BuildOptionError(f"unknown protocol '{options.protocol}': choose {' or '.join(PROTOCOLS)}")
    if options.protocol == "grpc" and not target.server:
        raise BuildOptionError(
            f"{target.name} has no gRPC (a function is invoked with HTTP events): build with --protocol http and "
            "drive it with gRPC clients through `toolkit proxy URL --grpc-port 8001`"
        )
    if options.grpc_frontend not in GRPC_FRONTEND.choices:
        raise BuildOptionError(
            f"unknown gRPC front end '{options.grpc_frontend}': choose {', '.join(GRPC_FRONTEND.choices)}"
        )
    if options.http_frontend not in HTTP_FRONTEND.choices:
        raise BuildOptionError(
            f"unknown HTTP front end '{options.http_frontend}': choose {', '.join(HTTP_FRONTEND.choices)}"
        )
    if options.http_frontend != "auto" and not (target.server and options.protocol == "http"):
        what = "serves gRPC" if target.server else "is invoked with HTTP events (Mangum) and has no HTTP server"
        raise BuildOptionError(
            f"--http-frontend {options.http_frontend} applies to --protocol http images of Cloud Run and Knative only: "
            f"this {target.name} image {what}"
        )
    if options.grpc_frontend != "auto" and options.protocol != "grpc":
        raise BuildOptionError(
            f"--grpc-frontend {options.grpc_frontend} applies to --protocol grpc images (Cloud Run, Knative) only: "
            f"this {target.name} image serves HTTP and has no gRPC front end"
        )
    if options.cuda not in CUDA_LINES:
        raise BuildOptionError(f"unsupported CUDA major {options.cuda}: choose {' or '.join(map(str, CUDA_LINES))}")
    if options.name is not None and not _NAME.match(options.name):
        raise BuildOptionError(f"invalid image name '{options.name}': lower-case letters, digits, '.', '_', '-' and '/'")
    if options.tag is not None and not _TAG.match(options.tag):
        raise BuildOptionError(f"invalid image tag '{options.tag}': up to 128 of letters, digits, '_', '.', '-'")
    if options.push is not None and not _REGISTRY.match(options.push.rstrip("/")):
        raise BuildOptionError(f"invalid registry '{options.push}': expected HOST[:PORT][/NAMESPACE], e.g. 127.0.0.1:5000")
    return target


def _gpu_requested(compiled: CompiledRepository) -> list[str]:
    """Models whose config.pbtxt asks for a GPU (a KIND_GPU instance group or a GPU accelerator)."""
    wanted = []
    for name, model in sorted(compiled.models.items()):
        path = model.path / "config.pbtxt"
        if not path.is_file():
            continue
        config = read_config_file(path)
        gpu_groups = any(g.kind == ModelInstanceGroup.KIND_GPU for g in config.instance_group)
        accelerators = len(config.optimization.execution_accelerators.gpu_execution_accelerator) > 0
        if gpu_groups or accelerators:
            wanted.append(name)
    return wanted


def _compile(options: BuildOptions, target: Target, ui: BuildUI) -> tuple[CompiledRepository, str, list[str]]:
    """Compile for the image: python models whose auto_complete_config needs a package that is
    not installed here are left for the image build (toolkit/build/hooks.py)."""
    ui.step(f"compiling {options.repository}")
    try:
        root = ensure_repository(options.repository)
        compiled = compile_repository(
            root, options.models, "cpu", auto_complete=options.auto_complete, python_autocomplete=AUTOCOMPLETE_IMAGE
        )
    except (RepositoryError, ValueError) as exc:
        raise BuildError(str(exc)) from None
    _raise_failures(compiled)
    gpu_models = _gpu_requested(compiled)
    device = "cpu"
    if target.gpu and (options.device == "gpu" or (options.device == "auto" and gpu_models)):
        device = "gpu"
        compiled = compile_repository(
            root, options.models, device, auto_complete=options.auto_complete, python_autocomplete=AUTOCOMPLETE_IMAGE
        )
        _raise_failures(compiled)
    if not compiled.models:
        raise BuildError(f"no models to build: the repository {options.repository} has none")
    for name in completed_in_image(compiled):
        ui.step(
            f"python model '{name}': {compiled.models[name].autocomplete_reason}; its auto_complete_config runs in "
            "the image build, after its requirements.txt is installed"
        )
    return compiled, device, gpu_models


def completed_in_image(compiled: CompiledRepository) -> list[str]:
    """The python models whose config the image build completes (their auto_complete_config
    imports a package that is only installed into the image)."""
    return sorted(n for n, m in compiled.models.items() if m.autocomplete == AUTOCOMPLETE_IMAGE)


def _raise_failures(compiled: CompiledRepository) -> None:
    if compiled.failures:
        raise BuildError("the repository has invalid models; nothing was built:\n  " + "\n  ".join(compiled.failure_lines()))


def _describe_base(options: BuildOptions, target: Target, builder: Builder | None, ui: BuildUI) -> BaseImage:
    reference = options.base_image or target.default_base
    arch = PLATFORM_ARCH[options.platform]
    if options.python_version:
        return from_python_version(reference, options.python_version, arch)
    known = known_base_image(reference, arch)
    if known is not None:
        return known
    if builder is None:
        raise BuildError(
            f"cannot tell which Python base image {reference} has without a container engine: "
            "pass --python-version (e.g. 3.12), or use a builder that can run it"
        )
    ui.step(f"probing base image {reference}")
    return parse_probe(reference, builder.probe(reference, PROBE_SCRIPT, options.platform), arch)


def _model_requirements(compiled: CompiledRepository) -> list[ModelRequirements]:
    found = []
    for name in sorted(compiled.models):
        path = compiled.models[name].path / "requirements.txt"
        if path.is_file():
            found.append(ModelRequirements(name, path))
    return found


def _metrics_text(url: str) -> str:
    """The runtime's /metrics (each model's load and warmup seconds), or '' when it cannot be read."""
    import http.client
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException):
        return ""


def measure_cold_start(builder: Builder, image: str, ui: BuildUI, protocol: str = "http") -> tuple[ColdStart, str]:
    """Start the image as Cloud Run would (read-only root, writable /tmp, non-root) and time it
    until it is ready (models loaded and warmed up): /v2/health/ready answers 200, or for a gRPC
    image the grpc.health.v1 check answers SERVING. Returns the cold start and the runtime's
    /metrics text read right after (each model's share of it; '' for a gRPC image, whose one port
    speaks gRPC only)."""
    port = free_port()
    ui.step(f"measuring cold start of {image}")
    start = time.monotonic()
    container = run_service(builder, image, port)
    try:
        alive = lambda: builder.running(container)  # noqa: E731
        if protocol == "grpc":
            ready = wait_grpc_serving(f"127.0.0.1:{port}", READY_TIMEOUT_S, alive)
            what = "container start to gRPC health SERVING, this host"
        else:
            ready = wait_ready(f"http://127.0.0.1:{port}/v2/health/ready", READY_TIMEOUT_S, alive)
            what = "container start to /v2/health/ready, this host"
        if ready is None:
            raise BuildError(f"{image} did not become ready within {READY_TIMEOUT_S:.0f} s", detail=builder.logs(container)[-3000:])
        seconds = round(time.monotonic() - start, 2)
        metrics = "" if protocol == "grpc" else _metrics_text(f"http://127.0.0.1:{port}/metrics")
        return ColdStart(seconds, True, what), metrics
    finally:
        builder.remove_container(container)


def wait_grpc_serving(address: str, timeout_s: float, alive) -> float | None:
    """Seconds until the grpc.health.v1 check of `address` answers SERVING (None: timeout, or the
    container stopped)."""
    try:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc
    except ImportError:
        raise BuildError("measuring a gRPC image needs grpcio: pip install 'triton-serverless-toolkit[grpc]'") from None
    start = time.monotonic()
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() - start < timeout_s:
            if not alive():
                return None
            try:
                answer = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2)
                if answer.status == health_pb2.HealthCheckResponse.SERVING:
                    return time.monotonic() - start
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    return None


def measure_lambda_cold_start(builder: Builder, image: str, platform: str, ui: BuildUI) -> tuple[ColdStart, str]:
    """Run the image as Lambda does, under AWS's Lambda Runtime Interface Emulator (read-only
    root, /tmp tmpfs, an arbitrary non-root user), and time it from the engine's start to the
    answer to a Function URL event for /v2/health/ready; the init phase is the RIE's INIT REPORT."""
    import json

    from ..deploy.function_url import http_response, request_event
    from .lambda_rie import RIE_DESCRIPTION

    ui.step(f"measuring cold start of {image} (AWS Lambda Runtime Interface Emulator)")
    with LocalLambda(builder, image, arch=PLATFORM_ARCH[platform], function_name=image.split(":")[0].rsplit("/", 1)[-1]) as function:
        status, headers, payload = function.invoke(json.dumps(request_event("GET", "/v2/health/ready")).encode(), READY_TIMEOUT_S)
        seconds = time.monotonic() - function.started_at
        answer = http_response(payload, headers.get("X-Amz-Function-Error")) if status == 200 else None
        if answer is None or answer.status != 200:
            what = f"the RIE answered {status}" if answer is None else f"/v2/health/ready answered {answer.status}"
            body = payload if answer is None else answer.body
            raise BuildError(f"{image} is not ready under the Lambda RIE: {what}: {body[:500].decode(errors='replace')}",
                             detail=function.logs()[-3000:])
        reports = function.reports()
        metrics = ""
        try:  # each model's share of the cold start (the build report's backends)
            status, headers, payload = function.invoke(json.dumps(request_event("GET", "/metrics")).encode(), 60)
            answer = http_response(payload, headers.get("X-Amz-Function-Error")) if status == 200 else None
            if answer is not None and answer.status == 200:
                metrics = answer.body.decode("utf-8", "replace")
        except (OSError, RuntimeError, TimeoutError):
            pass
    init = round(reports.init_ms / 1000, 3) if reports.init_ms is not None else None
    how = f"container start to the first answer (init + first invoke) under {RIE_DESCRIPTION}, this host"
    if init is not None:
        how += f"; init {init:.2f} s (the RIE's INIT REPORT, Lambda's Init Duration)"
    return ColdStart(round(seconds, 2), True, how, init_seconds=init), metrics


def run_build(options: BuildOptions, ui: BuildUI | None = None) -> BuildResult:
    ui = ui or SilentUI()
    target = _check_options(options)
    builder: Builder | None = None
    notes: list[str] = []
    if options.builder != "none":
        builder, notes = detect_builder(options.builder)
        for note in notes:
            ui.warn(note)
        check_platform_buildable(options.platform)

    compiled, device, gpu_models = _compile(options, target, ui)
    base = _describe_base(options, target, builder, ui)
    gpu = device == "gpu"
    try:
        backends = runtime_backends((model.config for model in compiled.models.values()), gpu=gpu)
        check_wheels_exist(backends, base.arch, base.python, base.glibc)
    except ValueError as exc:
        raise BuildError(str(exc)) from None
    runtime = runtime_requirements(
        server=target.server,
        aws_lambda=target.name == "lambda",
        runtime_client=not base.lambda_base,
        gpu_cuda=options.cuda if gpu else None,
        backends=backends,
        protocol=options.protocol,
    )
    frontend: NativeFrontend | None = None
    if target.server:  # gRPC: grpc++ or grpcio's server (docs/grpc.md); HTTP: libevent or uvicorn (docs/runtime.md)
        kind, choice = (GRPC_FRONTEND, options.grpc_frontend) if options.protocol == "grpc" else (
            HTTP_FRONTEND, options.http_frontend)
        frontend = choose_frontend(
            kind, choice, base, cache_dir=options.wheel_cache or default_cache_dir(),
            refresh=options.refresh_wheels, progress=ui.step,
        )
        if frontend.requirement is not None:
            runtime = replace(runtime, resolved=(*runtime.resolved, frontend.requirement))
        if frontend.source != "fallback":
            ui.step(frontend.line())
    layout = LAMBDA_TASK_LAYOUT if (target.name == "lambda" and base.lambda_base) else OPT_LAYOUT
    name = options.name or default_image_name(compiled.root)
    output = options.output or Path("build") / f"{name.replace('/', '-')}-{target.name}"
    if output.resolve().is_relative_to(compiled.root.resolve()):
        raise BuildOptionError(
            f"--output {output} is inside the model repository {compiled.root}: the next build would read it as "
            "a model (as tritonserver would); choose a folder outside the repository"
        )
    check_output(output)
    plan = ImagePlan(target=target, base=base, device=device, layout=layout, runtime=runtime, name=name)

    ui.step(f"wheelhouse for Python {base.python} on {plan.platform}")
    wheelhouse = build_wheelhouse(
        runtime, _model_requirements(compiled), base, cache_dir=options.wheel_cache, refresh=options.refresh_wheels,
        progress=ui.line,
    )
    deferred = completed_in_image(compiled)
    ui.step(f"writing build context {output}")
    context = render_context(plan, compiled, wheelhouse, output, deferred)
    tag = options.tag or context.default_tag
    reference = f"{name}:{tag}"
    tags = [reference]
    pushed = f"{options.push.rstrip('/')}/{name}:{tag}" if options.push else None
    if pushed:
        tags.append(pushed)

    command = builder.printable_build_command(context.directory, tags, plan.platform) if builder else printable_command(
        options.builder, context.directory, tags, plan.platform
    )
    models = model_entries(compiled, context.model_bytes)
    report = BuildReport(
        name=name, tag=tag, target=target.name, platform=plan.platform, base_image=base.reference, python=base.python,
        device=device, context=str(context.directory), context_digest=context.digest,
        repository_digest=context.repository_digest, builder=builder.name if builder else "none", build_command=command,
        models=models, backends=backend_entries(compiled, backend_footprints(runtime, wheelhouse, base)),
        python_deps=wheelhouse.versions(), wheelhouse_bytes=wheelhouse.size,
        warnings=target_warnings(target, compiled, gpu_models), python_instance_mode=target.python_instance_mode,
    )
    if frontend is not None:
        if frontend.kind is GRPC_FRONTEND:
            report.grpc_frontend = frontend.as_dict()
        else:
            report.http_frontend = frontend.as_dict()
        if frontend.source == "fallback":
            report.warnings.append(frontend.line())
    if runtime.cuda is not None:
        frameworks = [r.spec for requirements in runtime.backends.values() for r in requirements if r.imports]
        report.cuda = {
            "major": runtime.cuda.cuda_major, "min_driver": runtime.cuda.min_driver,
            "frameworks": list(dict.fromkeys(frameworks)), "note": runtime.cuda.note,
        }
    if deferred:
        report.warnings.append(
            f"python models {', '.join(deferred)}: auto_complete_config runs in the image build (it needs their "
            "requirements.txt), so this report shows their configs before it (max batch size, batching)"
        )
    write_metadata(context, {
        "toolkit_version": __version__, "name": name, "tag": tag, "image": reference, "push": pushed,
        "target": target.name, "protocol": options.protocol,
        "grpc_frontend": frontend.frontend if frontend and frontend.kind is GRPC_FRONTEND else None,
        "http_frontend": frontend.frontend if frontend and frontend.kind is HTTP_FRONTEND else None, "platform": plan.platform, "device": device, "base_image": base.reference,
        "python": base.python, "base_image_source": base.source, "labels": context.labels, "build_command": command,
        "models": {m.name: m.versions for m in models},
    })
    report_path = context.directory / "build-report.json"
    report.manifests = [
        str(p) for p in _write_deploy_manifests(target.name, context.directory, pushed or reference, name, compiled, options.protocol)
    ]
    _add_cpu_budget(report, target.name, name, compiled)

    if target.max_image_bytes is not None and sum(context.model_bytes.values()) > target.max_image_bytes:
        report.errors.append(f"the models alone exceed {target.name}'s image size limit")
    if builder is None:
        report.cold_start = estimate_cold_start(context.size, models, _warmups(compiled))
        report.write(report_path)
        if report.errors:
            raise BuildError("; ".join(report.errors))
        return BuildResult(report, report_path, context.directory, notes)

    ui.step(f"building {reference} with {builder.name}")
    started = time.monotonic()
    builder.build(context.directory, tags, plan.platform, on_line=ui.line)
    report.build_seconds = round(time.monotonic() - started, 1)
    info = builder.inspect(reference)
    report.image, report.image_id, report.image_size, report.layers = reference, info.id, info.size, info.layers
    if target.max_image_bytes is not None and info.size > target.max_image_bytes:
        report.errors.append(
            f"the image is {info.size} bytes, over {target.name}'s {target.max_image_bytes} byte limit for container images"
        )
    if options.measure_cold_start and not builder.can_run:
        ui.warn(f"{builder.name} cannot run the image: the cold start is estimated, not measured")
        report.cold_start = estimate_cold_start(info.size, models, _warmups(compiled))
    elif options.measure_cold_start:
        if target.server:
            report.cold_start, metrics = measure_cold_start(builder, reference, ui, options.protocol)
        else:
            report.cold_start, metrics = measure_lambda_cold_start(builder, reference, plan.platform, ui)
        add_ready_seconds(report.backends, compiled, metrics)
    else:
        report.cold_start = estimate_cold_start(info.size, models, _warmups(compiled))
    if report.errors:
        report.write(report_path)
        raise BuildError("; ".join(report.errors))
    if pushed:
        ui.step(f"pushing {pushed}")
        builder.push(pushed, on_line=ui.line)
        report.pushed = pushed
    report.write(report_path)
    return BuildResult(report, report_path, context.directory, notes)


def _warmups(compiled: CompiledRepository) -> int:
    return sum(len(m.config.get("model_warmup", [])) for m in compiled.models.values())


def _add_cpu_budget(report: BuildReport, target: str, name: str, compiled: CompiledRepository) -> None:
    """The runtime's CPU thread plan on the CPUs the deploy manifest gives a container."""
    from ..deploy.manifests import target_cpu_plan

    cpu_plan = target_cpu_plan(target, name, compiled)
    report.cpu_budget = {**cpu_plan.as_dict(), "summary": cpu_plan.summary(), "lines": cpu_plan.lines()}
    threads = cpu_plan.compact()
    for entry in report.models:
        entry.cpu_threads = threads.get(entry.name, "")


def _write_deploy_manifests(target: str, context_dir: Path, image: str, name: str, compiled, protocol: str = "http") -> list[Path]:
    """The target's deployment manifest (SAM template.yaml, Cloud Run or Knative service.yaml)
    beside the image, for teams that deploy through infrastructure as code."""
    from ..deploy.manifests import write_manifests
    from ..deploy.service_settings import ServiceOverrides
    from .context import DEPLOY_FOLDER

    options = ServiceOverrides(protocol=protocol) if protocol != "http" else None
    return write_manifests(
        target, context_dir / DEPLOY_FOLDER, image=image, name=name, compiled_repository=compiled, options=options
    )
