"""`toolkit deploy --target cloudrun`: push, apply service.yaml through the Admin API v1, wait.

1. settings (GPU, CPU, memory, concurrency, probe budget; Cloud Run's rules checked): no call yet
2. the image: used as it is from Artifact Registry / gcr.io / Docker Hub, or pushed from the local
   container engine to REGION-docker.pkg.dev/PROJECT/REPOSITORY (the repository is created)
3. service.yaml rendered (templates/deploy/cloudrun-service.yaml.j2), written, read back and
   applied as it is: replaceService, or create for a new service
4. wait until the new revision is Ready; print its URL
5. `--allow-unauthenticated`: allUsers gets roles/run.invoker; otherwise the service stays private

Without application-default credentials nothing is applied: the manifest is written and the
equivalent gcloud / engine commands are printed (ManualSteps).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ...repository.compile import CompiledRepository
from ..errors import DeployError, DeployOptionError, ManualSteps
from ..image_source import ArchiveImage, ImageReference, parse_image
from ..manifests import MANIFEST_FILES, render_service
from ..progress import DeployUI, SilentUI
from ..records import DeployRecord
from ..service_settings import ServiceOverrides, ServiceSettings, service_settings
from .admin_api import CloudRunV1, Endpoints
from .artifact_registry import is_google_registry, registry_host

SCOPES = ["https://www.googleapis.com/auth/cloud-platform"]
PUBLIC_REGISTRIES = ("docker.io", "index.docker.io")


@dataclass
class CloudRunDeployOptions:
    name: str
    region: str | None = None
    image: str | None = None
    repository: str | None = None
    models: list[str] | None = None
    project: str | None = None
    overrides: ServiceOverrides = field(default_factory=ServiceOverrides)
    allow_unauthenticated: bool = False
    ar_repository: str = "toolkit"
    engine: str = "auto"
    dry_run: bool = False
    output_dir: Path = Path(".")
    api_endpoint: str | None = None  # one base URL for every Google API (private endpoints, tests)
    # toolkit build's --base-image and --grpc-frontend when the image is built from the repository
    base_image: str | None = None
    grpc_frontend: str = "auto"
    http_frontend: str = "auto"
    wait_timeout_s: float | None = None
    poll_s: float = 2.0
    sleep: Callable[[float], None] = time.sleep


def _project_hint(options: CloudRunDeployOptions) -> str | None:
    return options.project or os.environ.get("GOOGLE_CLOUD_PROJECT") or os.environ.get("CLOUDSDK_CORE_PROJECT")


def plan_cloudrun(options: CloudRunDeployOptions, compiled: CompiledRepository | None) -> tuple[ServiceSettings, ArchiveImage | ImageReference | None]:
    if not options.region:
        raise DeployOptionError("--region is required for Cloud Run (e.g. us-central1; GPUs: see docs/deploy.md)")
    overrides = options.overrides
    overrides.region = options.region
    settings = service_settings("cloudrun", options.name, compiled, overrides)
    source = parse_image(options.image) if options.image else None
    if source is None and options.repository is None:
        raise DeployOptionError("give a model repository to build and deploy, or --image")
    if isinstance(source, ArchiveImage):
        raise DeployOptionError(
            f"Cloud Run pulls images from a registry; {source} is an archive: load it into docker or podman "
            "(podman load -i ...) and pass the image name, or push it to Artifact Registry (skopeo copy) and pass that"
        )
    return settings, source


def plan_lines(settings: ServiceSettings, source: ImageReference | None, options: CloudRunDeployOptions, target: str) -> list[tuple[str, str]]:
    project = _project_hint(options) or "<project>"
    if source is None:
        image = f"build (toolkit build), push to {registry_host(options.region or '<region>')}/{project}/{options.ar_repository}"
        built_with = [f"base image {options.base_image}"] if options.base_image else []
        if settings.protocol == "grpc":
            built_with.append(f"gRPC front end {options.grpc_frontend}")
        elif options.http_frontend != "auto":
            built_with.append(f"HTTP front end {options.http_frontend}")
        if built_with:
            image += f" ({', '.join(built_with)})"
    elif is_google_registry(source.registry) or source.registry in PUBLIC_REGISTRIES:
        image = f"{source} (used as it is)"
    else:
        image = f"{source} -> {registry_host(options.region or '<region>')}/{project}/{options.ar_repository} (container engine push)"
    resources = f"{settings.cpu} vCPU, {settings.memory}"
    if settings.gpu:
        resources += (f", 1 x {settings.gpu}, CPU always allocated, "
                      f"zonal redundancy {'on' if settings.gpu_zonal_redundancy else 'off'}")
    return [
        ("project / region", f"{project} / {options.region}"),
        ("image", image),
        ("service", f"{settings.name}: {MANIFEST_FILES[target]} applied with the Admin API v1 (create or replaceService)"),
        ("resources", resources),
        ("concurrency", f"{settings.concurrency} requests per instance"),
        ("instances", f"{settings.min_instances} to {settings.max_instances}"),
        ("protocol", "gRPC over HTTP/2 end to end (port h2c)" if settings.protocol == "grpc" else "HTTP (v2 REST)"),
        ("startup probe", ("gRPC health check" if settings.protocol == "grpc" else "GET /v2/health/ready")
         + f" every {settings.probe_period_s} s, budget {settings.startup_budget_s} s"),
        ("access", "PUBLIC (allUsers: roles/run.invoker)" if options.allow_unauthenticated else
         "private: callers need roles/run.invoker and a Google ID token (toolkit invoke / toolkit proxy)"),
        *[("sizing", note) for note in settings.notes],
    ]


def _credentials(project: str | None) -> tuple[Any, str | None]:
    try:
        import google.auth
        import google.auth.exceptions
    except ImportError:
        raise DeployError("deploying to Cloud Run needs google-auth: pip install 'triton-serverless-toolkit[cloudrun]'") from None
    try:
        credentials, detected = google.auth.default(scopes=SCOPES)
    except google.auth.exceptions.DefaultCredentialsError:
        return None, project
    return credentials, project or detected


def _manual_commands(settings: ServiceSettings, options: CloudRunDeployOptions, manifest: Path, push: tuple[str, str] | None,
                     project: str | None) -> list[str]:
    project_flag = f" --project {project}" if project else ""
    commands = []
    if push is not None:
        source, target = push
        commands += [
            f"gcloud auth configure-docker {target.split('/', 1)[0]}",
            f"gcloud artifacts repositories create {options.ar_repository} --repository-format=docker "
            f"--location {options.region}{project_flag}   # once",
            f"docker tag {source} {target}",
            f"docker push {target}",
        ]
    commands.append(f"gcloud run services replace {manifest} --region {options.region}{project_flag}")
    if options.allow_unauthenticated:
        commands.append(
            f"gcloud run services add-iam-policy-binding {settings.name} --region {options.region}{project_flag} "
            "--member=allUsers --role=roles/run.invoker"
        )
    return commands


def deploy_cloudrun(
    options: CloudRunDeployOptions, compiled: CompiledRepository | None, ui: DeployUI | None = None,
    credentials: Any | None = None,
) -> DeployRecord:
    ui = ui or SilentUI()
    settings, source = plan_cloudrun(options, compiled)
    assert not isinstance(source, ArchiveImage)
    manifest_path = options.output_dir / MANIFEST_FILES["cloudrun"]
    if options.allow_unauthenticated:
        ui.warn(f"--allow-unauthenticated: {settings.name} will be PUBLIC: anyone can run inferences and you pay for them")
    if options.dry_run:
        image = str(source) if source else f"(built from {options.repository})"
        options.output_dir.mkdir(parents=True, exist_ok=True)
        manifest_path.write_text(render_service(settings, image))
        return DeployRecord(
            target="cloudrun", name=settings.name, url=None, auth="NONE" if options.allow_unauthenticated else "google-id-token",
            image=image, image_digest=None, region=options.region, account=_project_hint(options),
            settings=_settings_dict(settings), manifest=str(manifest_path), dry_run=True,
        )

    if credentials is None:
        credentials, project = _credentials(_project_hint(options))
    else:
        project = _project_hint(options)
    if source is None:
        from ..from_repository import build_image

        assert options.repository is not None
        source = parse_image(build_image(
            options.repository, "cloudrun", options.models, "linux/amd64", "gpu" if settings.gpu else "cpu", ui,
            settings.protocol, base_image=options.base_image, grpc_frontend=options.grpc_frontend,
            http_frontend=options.http_frontend,
        ))
        assert isinstance(source, ImageReference)
    needs_push = not (is_google_registry(source.registry) or source.registry in PUBLIC_REGISTRIES)
    target = None
    if needs_push:
        tag = source.tag or "latest"
        target = f"{registry_host(options.region or '')}/{project or 'PROJECT'}/{options.ar_repository}/{source.name}:{tag}"

    if credentials is None:
        options.output_dir.mkdir(parents=True, exist_ok=True)
        manifest_path.write_text(render_service(settings, target or str(source)))
        raise ManualSteps(
            "no Google application-default credentials (gcloud auth application-default login, or "
            "GOOGLE_APPLICATION_CREDENTIALS): nothing was deployed; these commands do the same",
            _manual_commands(settings, options, manifest_path, (str(source), target) if target else None, project),
            str(manifest_path),
        )
    if not project:
        raise DeployOptionError("no Google Cloud project: pass --project (or set GOOGLE_CLOUD_PROJECT)")

    from google.auth.transport.requests import AuthorizedSession, Request

    endpoints = Endpoints.override(options.api_endpoint) if options.api_endpoint else Endpoints.google(options.region or "")
    session = AuthorizedSession(credentials)
    digest = source.digest
    image = str(source)
    if target is not None:
        from ..engine import find_engine
        from .artifact_registry import ensure_repository, push

        engine = find_engine(options.engine, image=str(source))  # before creating anything
        ensure_repository(session, endpoints, project, options.region or "", options.ar_repository, ui,
                          poll_s=options.poll_s, sleep=options.sleep)
        if not credentials.valid:
            credentials.refresh(Request())
        digest = push(str(source), target, credentials.token, engine, ui)
        image = f"{target.rsplit(':', 1)[0]}@{digest}" if digest else target

    options.output_dir.mkdir(parents=True, exist_ok=True)
    manifest_path.write_text(render_service(settings, image))
    import yaml

    document = yaml.safe_load(manifest_path.read_text())  # the file as written is what is applied
    api = CloudRunV1(session, project, options.region or "", endpoints)
    ui.step(f"applying {manifest_path} to Cloud Run ({project}, {options.region})")
    stored, created = api.apply(document)
    generation = int(stored.get("metadata", {}).get("generation", 1))
    ui.step(f"{'creating' if created else 'updating'} service {settings.name}: waiting for the new revision to be ready")
    timeout = options.wait_timeout_s or settings.startup_budget_s + 600
    service = api.wait_ready(settings.name, generation, timeout, options.poll_s, options.sleep, ui.line)
    public = options.allow_unauthenticated
    if options.allow_unauthenticated:
        ui.step("granting allUsers roles/run.invoker")
        api.allow_unauthenticated(settings.name)
    elif api.is_public(settings.name):
        public = True
        ui.warn(
            f"{settings.name} is public: its IAM policy already grants allUsers roles/run.invoker (remove with "
            f"gcloud run services remove-iam-policy-binding {settings.name} --member=allUsers --role=roles/run.invoker)"
        )
    status = service.get("status", {})
    return DeployRecord(
        target="cloudrun", name=settings.name, url=status.get("url"), auth="NONE" if public else "google-id-token",
        image=image, image_digest=digest, region=options.region, account=project,
        resource=f"projects/{project}/locations/{options.region}/services/{settings.name}",
        version=status.get("latestReadyRevisionName"), settings=_settings_dict(settings), manifest=str(manifest_path),
    )


def _settings_dict(s: ServiceSettings) -> dict[str, Any]:
    return {
        "gpu": s.gpu, "cpu": s.cpu, "memory": s.memory, "concurrency": s.concurrency, "min_instances": s.min_instances,
        "max_instances": s.max_instances, "timeout_s": s.timeout_s, "startup_budget_s": s.startup_budget_s,
        "cpu_throttling": s.cpu_throttling, "startup_cpu_boost": s.startup_cpu_boost,
        "gpu_zonal_redundancy": s.gpu_zonal_redundancy, "environment": s.environment,
    }
