"""`toolkit deploy` as a request: options checked per target, dispatched, planned or applied.

The CLI (toolkit/cli.py) only parses flags into a `DeployRequest` and renders the `DeployOutcome`;
everything a deploy decides is here and in the target packages, so it is testable without Typer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from ..repository.compile import CompiledRepository
from ..repository.model_config import ModelInstanceGroup, read_config_file
from .aws_lambda.settings import LambdaOverrides
from .errors import DeployOptionError
from .manifests import TARGETS, manifest_name
from .progress import DeployUI
from .records import DeployRecord
from .service_settings import ServiceOverrides, parse_memory_mib

# Options that only one family of targets reads: giving one to another target is a usage error.
LAMBDA_ONLY = ("ephemeral_storage", "arch", "auth", "provisioned_concurrency", "role", "ecr_repository", "smoke_test")
SERVICE_ONLY = ("gpu", "cpu", "concurrency", "min_instances", "max_instances", "startup_budget", "cpu_throttling",
                "service_account")
CLOUDRUN_ONLY = ("project", "ar_repository", "api_endpoint", "allow_unauthenticated")
KNATIVE_ONLY = ("namespace", "context")


@dataclass
class DeployRequest:
    target: str
    repository: str | None = None
    name: str | None = None
    image: str | None = None
    models: list[str] | None = None
    region: str | None = None
    memory: str | None = None
    timeout: int | None = None
    env: list[str] = field(default_factory=list)
    dry_run: bool = False
    output: Path | None = None
    engine: str = "auto"
    # lambda
    ephemeral_storage: int | None = None
    arch: str | None = None
    auth: str | None = None
    provisioned_concurrency: int | None = None
    role: str | None = None
    ecr_repository: str | None = None
    smoke_test: bool | None = None
    # cloudrun / knative
    gpu: str | None = None
    cpu: str | None = None
    concurrency: int | None = None
    min_instances: int | None = None
    max_instances: int | None = None
    startup_budget: int | None = None
    cpu_throttling: bool | None = None
    startup_cpu_boost: bool | None = None
    gpu_zonal_redundancy: bool | None = None
    service_account: str | None = None
    # cloudrun
    project: str | None = None
    ar_repository: str | None = None
    api_endpoint: str | None = None
    allow_unauthenticated: bool | None = None
    # knative
    namespace: str | None = None
    context: str | None = None
    # cloudrun / knative: what the image serves on its port (None: http)
    protocol: str | None = None
    # when deploy builds the image from the repository (no --image): toolkit build's --base-image
    # (lambda, cloudrun) and --grpc-frontend (cloudrun --protocol grpc)
    base_image: str | None = None
    grpc_frontend: str | None = None
    http_frontend: str | None = None


@dataclass
class DeployOutcome:
    record: DeployRecord
    plan: list[tuple[str, str]]
    output_dir: Path


def parse_env(pairs: list[str]) -> dict[str, str]:
    environment: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise DeployOptionError(f"--env {pair}: expected KEY=VALUE")
        environment[key] = value
    return environment


def check_target_options(request: DeployRequest) -> None:
    if request.target not in TARGETS:
        raise DeployOptionError(f"unknown target '{request.target}': choose one of {', '.join(TARGETS)}")
    if request.protocol not in (None, "http", "grpc"):
        raise DeployOptionError(f"--protocol {request.protocol}: choose http or grpc")
    if request.target == "lambda" and request.protocol == "grpc":
        raise DeployOptionError(
            "AWS Lambda has no gRPC: deploy with --protocol http and drive the function with gRPC clients through "
            "`toolkit proxy URL --grpc-port 8001`"
        )
    _check_build_options(request)
    allowed = {
        "lambda": set(LAMBDA_ONLY),
        "cloudrun": set(SERVICE_ONLY) | set(CLOUDRUN_ONLY) | {"gpu_zonal_redundancy", "startup_cpu_boost"},
        "knative": set(SERVICE_ONLY) | set(KNATIVE_ONLY),
    }[request.target]
    for option in (*LAMBDA_ONLY, *SERVICE_ONLY, *CLOUDRUN_ONLY, *KNATIVE_ONLY, "gpu_zonal_redundancy", "startup_cpu_boost"):
        if getattr(request, option) is not None and option not in allowed:
            flag = "--" + option.replace("_", "-")
            raise DeployOptionError(f"{flag} does not apply to --target {request.target}")


def _check_build_options(request: DeployRequest) -> None:
    """--base-image, --grpc-frontend and --http-frontend choose what `toolkit build` puts into the
    image deploy builds from the repository; they mean nothing where no image is built."""
    from ..build.native_frontend import GRPC, HTTP

    for option, value in (("--base-image", request.base_image), ("--grpc-frontend", request.grpc_frontend),
                          ("--http-frontend", request.http_frontend)):
        if value is None:
            continue
        if request.target == "knative":
            raise DeployOptionError(
                f"{option} does not apply to --target knative: it deploys a pushed --image (toolkit build --target "
                f"knative {option} {value} --push REGISTRY)"
            )
        if request.image is not None:
            raise DeployOptionError(f"{option} chooses what the image built from the repository carries: --image {request.image} is built already")
    for option, value, kind in (("--grpc-frontend", request.grpc_frontend, GRPC), ("--http-frontend", request.http_frontend, HTTP)):
        if value is None:
            continue
        if value not in kind.choices:
            raise DeployOptionError(f"{option} {value}: choose {', '.join(kind.choices)}")
        if request.target == "lambda":
            raise DeployOptionError(f"{option} {value} applies to Cloud Run services only: a Lambda function has no {kind.label} server")
        if (request.protocol or "http") != kind.name:
            raise DeployOptionError(f"{option} {value} applies to --protocol {kind.name} services only")


def resolve_name(request: DeployRequest) -> str:
    if request.name:
        return request.name
    if request.repository:
        base = request.repository.rstrip("/").rsplit("/", 1)[-1]
        return manifest_name(base, request.target)
    raise DeployOptionError("--name is required when no model repository is given")


def wants_gpu(compiled: CompiledRepository) -> bool:
    """A model's config.pbtxt asks for a GPU (a KIND_GPU instance group or a GPU accelerator)."""
    for model in compiled.models.values():
        path = model.path / "config.pbtxt"
        if not path.is_file():
            continue
        config = read_config_file(path)
        if any(g.kind == ModelInstanceGroup.KIND_GPU for g in config.instance_group):
            return True
        if len(config.optimization.execution_accelerators.gpu_execution_accelerator) > 0:
            return True
    return False


def _compile(request: DeployRequest) -> CompiledRepository | None:
    if request.repository is None:
        return None
    from .from_repository import compile_for_deploy

    compiled = compile_for_deploy(request.repository, request.models, "cpu")
    if request.target != "lambda":
        gpu = (request.gpu or "auto").lower()
        if gpu not in ("auto", "none") or (gpu == "auto" and wants_gpu(compiled)):
            compiled = compile_for_deploy(request.repository, request.models, "gpu")
    return compiled


def _memory_mb(request: DeployRequest) -> int | None:
    return parse_memory_mib(request.memory) if request.memory is not None else None


def run_deploy(request: DeployRequest, ui: DeployUI) -> DeployOutcome:
    check_target_options(request)
    name = resolve_name(request)
    output = request.output or Path("deploy") / f"{name}-{request.target}"
    environment = parse_env(request.env)
    compiled = _compile(request)

    if request.target == "lambda":
        from .aws_lambda.deploy import LambdaDeployOptions, deploy_lambda, plan_lambda

        options = LambdaDeployOptions(
            name=name, image=request.image, repository=request.repository, models=request.models, region=request.region,
            overrides=LambdaOverrides(
                memory_mb=_memory_mb(request), timeout_s=request.timeout, ephemeral_storage_mb=request.ephemeral_storage,
                architecture=request.arch, auth=request.auth, provisioned_concurrency=request.provisioned_concurrency,
                environment=environment,
            ),
            ecr_repository=request.ecr_repository, role_arn=request.role, engine=request.engine, base_image=request.base_image,
            smoke_test=request.smoke_test if request.smoke_test is not None else True,
            dry_run=request.dry_run, manifest_dir=output,
        )
        plan = plan_lambda(options, compiled)
        record = deploy_lambda(options, compiled, ui)
        if request.dry_run:
            from .manifests import render_sam_template

            output.mkdir(parents=True, exist_ok=True)
            path = output / "template.yaml"
            path.write_text(render_sam_template(plan.settings, record.image))
            record.manifest = str(path)
        return DeployOutcome(record, plan.lines(), output)

    overrides = ServiceOverrides(
        gpu=request.gpu, cpu=request.cpu, memory=request.memory, concurrency=request.concurrency,
        min_instances=request.min_instances, max_instances=request.max_instances, timeout_s=request.timeout,
        startup_budget_s=request.startup_budget, cpu_throttling=request.cpu_throttling,
        startup_cpu_boost=request.startup_cpu_boost if request.startup_cpu_boost is not None else True,
        gpu_zonal_redundancy=request.gpu_zonal_redundancy if request.gpu_zonal_redundancy is not None else True,
        service_account=request.service_account, environment=environment, namespace=request.namespace,
        protocol=request.protocol or "http",
    )
    if request.target == "cloudrun":
        from .cloudrun.deploy import CloudRunDeployOptions, deploy_cloudrun, plan_cloudrun, plan_lines

        options = CloudRunDeployOptions(
            name=name, region=request.region, image=request.image, repository=request.repository, models=request.models,
            project=request.project, overrides=overrides, allow_unauthenticated=bool(request.allow_unauthenticated),
            ar_repository=request.ar_repository or "toolkit", engine=request.engine, dry_run=request.dry_run,
            output_dir=output, api_endpoint=request.api_endpoint, base_image=request.base_image,
            grpc_frontend=request.grpc_frontend or "auto", http_frontend=request.http_frontend or "auto",
        )
        settings, source = plan_cloudrun(dataclasses.replace(options, overrides=dataclasses.replace(overrides)), compiled)
        lines = plan_lines(settings, source, options, "cloudrun")  # type: ignore[arg-type]
        return DeployOutcome(deploy_cloudrun(options, compiled, ui), lines, output)

    from .knative import KnativeDeployOptions, deploy_knative, plan_knative

    if request.region is not None:
        raise DeployOptionError("--region does not apply to --target knative (the kube context decides)")
    options_k = KnativeDeployOptions(
        name=name, image=request.image, overrides=overrides, context=request.context, dry_run=request.dry_run, output_dir=output,
    )
    settings, image = plan_knative(options_k, compiled)
    lines = [
        ("image", image),
        ("service", f"{settings.name} in {settings.namespace or 'the current namespace'}: kubectl apply -f knative-service.yaml"),
        ("resources", f"{settings.cpu} vCPU, {settings.memory}" + (", 1 nvidia.com/gpu" if settings.gpu else "")),
        ("concurrency", f"{settings.concurrency} requests per pod"),
        ("readiness", ("gRPC health check (port h2c)" if settings.protocol == "grpc" else "GET /v2/health/ready")
         + f"; progress deadline {settings.progress_deadline_s} s"),
        *[("sizing", note) for note in settings.notes],
    ]
    return DeployOutcome(deploy_knative(options_k, compiled, ui), lines, output)
