"""`toolkit deploy --target knative`: the Service for any Knative Serving cluster, with kubectl.

The image must be in a registry the cluster pulls from (`toolkit build --push REGISTRY`, then
`--image REGISTRY/NAME:TAG`). The Service is written to knative-service.yaml and applied with
`kubectl apply -f` (the current kube context, or `--context`); then `kubectl wait` for
`Ready` within the progress deadline, and the URL and revision are read from the status.
Without kubectl, the manifest is written and the commands are printed.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..repository.compile import CompiledRepository
from .errors import DeployError, DeployOptionError, ManualSteps
from .image_source import ArchiveImage, parse_image
from .manifests import MANIFEST_FILES, render_service
from .progress import DeployUI, SilentUI
from .records import DeployRecord
from .service_settings import ServiceOverrides, ServiceSettings, service_settings


@dataclass
class KnativeDeployOptions:
    name: str
    image: str | None = None
    overrides: ServiceOverrides = field(default_factory=ServiceOverrides)
    context: str | None = None  # kube context
    kubectl: str | None = None  # path; default: kubectl on PATH
    dry_run: bool = False
    output_dir: Path = Path(".")


def _kubectl_base(kubectl: str, options: KnativeDeployOptions) -> list[str]:
    base = [kubectl]
    if options.context:
        base += ["--context", options.context]
    if options.overrides.namespace:
        base += ["--namespace", options.overrides.namespace]
    return base


def plan_knative(options: KnativeDeployOptions, compiled: CompiledRepository | None) -> tuple[ServiceSettings, str]:
    settings = service_settings("knative", options.name, compiled, options.overrides)
    if not options.image:
        raise DeployOptionError(
            "Knative pulls the image from a registry: build and push it (toolkit build --target knative --push "
            "REGISTRY), then pass --image REGISTRY/NAME:TAG"
        )
    source = parse_image(options.image)
    if isinstance(source, ArchiveImage) or source.registry is None:
        raise DeployOptionError(
            f"--image {options.image}: Knative needs an image in a registry the cluster can pull from "
            "(REGISTRY/NAME:TAG), not a local image or an archive"
        )
    return settings, str(source)


def _run(args: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise DeployError(f"{' '.join(args[:3])} ... did not finish in {int(timeout)} s") from None


def deploy_knative(options: KnativeDeployOptions, compiled: CompiledRepository | None, ui: DeployUI | None = None) -> DeployRecord:
    ui = ui or SilentUI()
    settings, image = plan_knative(options, compiled)
    options.output_dir.mkdir(parents=True, exist_ok=True)
    manifest = options.output_dir / MANIFEST_FILES["knative"]
    manifest.write_text(render_service(settings, image))
    settings_dict = {
        "gpu": settings.gpu, "cpu": settings.cpu, "memory": settings.memory, "concurrency": settings.concurrency,
        "min_instances": settings.min_instances, "max_instances": settings.max_instances,
        "timeout_s": settings.timeout_s, "progress_deadline_s": settings.progress_deadline_s,
        "environment": settings.environment,
    }
    record = DeployRecord(
        target="knative", name=settings.name, url=None, auth="cluster", image=image,
        image_digest=image.split("@", 1)[1] if "@" in image else None,
        resource=f"{settings.namespace or '(current namespace)'}/{settings.name}", settings=settings_dict,
        manifest=str(manifest), dry_run=options.dry_run,
    )
    kubectl = options.kubectl or shutil.which("kubectl")
    base = _kubectl_base(kubectl or "kubectl", options)
    wait_s = settings.progress_deadline_s + 60
    commands = [
        " ".join([*base, "apply", "-f", str(manifest)]),
        " ".join([*base, "wait", f"ksvc/{settings.name}", "--for=condition=Ready", f"--timeout={wait_s}s"]),
    ]
    if options.dry_run:
        return record
    if kubectl is None:
        raise ManualSteps("kubectl not found: nothing was deployed; apply the manifest with", commands, str(manifest))

    ui.step(f"kubectl apply -f {manifest}")
    applied = _run([*base, "apply", "-f", str(manifest)], 120)
    if applied.returncode != 0:
        raise DeployError("kubectl apply failed", detail=(applied.stderr or applied.stdout)[-3000:])
    ui.line(applied.stdout.strip())
    ui.step(f"waiting for ksvc/{settings.name} to be Ready (up to {wait_s} s: models load and warm up)")
    waited = _run([*base, "wait", f"ksvc/{settings.name}", "--for=condition=Ready", f"--timeout={wait_s}s"], wait_s + 30)
    if waited.returncode != 0:
        raise DeployError(f"ksvc/{settings.name} did not become Ready", detail=(waited.stderr or waited.stdout)[-3000:])
    got = _run([*base, "get", f"ksvc/{settings.name}", "-o", "json"], 60)
    if got.returncode != 0:
        raise DeployError(f"kubectl get ksvc/{settings.name} failed", detail=got.stderr[-3000:])
    status: dict[str, Any] = json.loads(got.stdout).get("status", {})
    record.url = status.get("url")
    record.version = status.get("latestReadyRevisionName")
    return record
