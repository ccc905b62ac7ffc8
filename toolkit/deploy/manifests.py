"""Deployment manifests for infrastructure-as-code users, rendered from templates/deploy/.

- lambda: an AWS SAM template (`template.yaml`): the function from the image, a least-privilege
  execution role, alias `live`, a Function URL with AWS_IAM auth on the alias, optional
  provisioned concurrency.
- cloudrun: the Cloud Run service (`service.yaml`, Knative serving.knative.dev/v1 as Cloud Run's
  Admin API v1 reads it: `gcloud run services replace service.yaml`).
- knative: the same Service without Cloud Run's annotations (`knative-service.yaml`).

`toolkit deploy` applies exactly this content (for Cloud Run: this YAML, parsed, is the request
body), so a deployment made with the CLI and one made from the manifest are the same.

Entry point for `toolkit build`:

    write_manifests(target, output_dir, image=..., name=..., compiled_repository=..., options=None)

`options` is a `LambdaOverrides` (lambda) or `ServiceOverrides` (cloudrun, knative), or None for
the defaults sized from the repository. It returns the paths written.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import jinja2

from .. import __version__
from ..repository.compile import CompiledRepository
from .aws_lambda.settings import ALIAS, LambdaOverrides, LambdaSettings, lambda_settings
from .errors import DeployError, DeployOptionError
from .service_settings import CONTAINER_PORT, ServiceOverrides, ServiceSettings, service_settings

TARGETS = ("lambda", "cloudrun", "knative")
MANIFEST_FILES = {"lambda": "template.yaml", "cloudrun": "service.yaml", "knative": "knative-service.yaml"}
_TEMPLATES = {"lambda": "sam-template.yaml.j2", "cloudrun": "cloudrun-service.yaml.j2", "knative": "knative-service.yaml.j2"}

ECR_IMAGE = re.compile(
    r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com(?:\.cn)?/"
    r"(?P<repository>[a-z0-9][a-z0-9._/-]*?)(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)


def templates_dir() -> Path:
    """`$TOOLKIT_TEMPLATES/deploy`, else `templates/deploy` of the toolkit checkout."""
    root = os.environ.get("TOOLKIT_TEMPLATES")
    base = Path(root) if root else Path(__file__).resolve().parents[2] / "templates"
    return base / "deploy"


def _quote(value: Any) -> str:
    """A YAML scalar that stays a string whatever it contains (JSON strings are YAML)."""
    return json.dumps(str(value), ensure_ascii=False)


def _lower_bool(value: bool) -> str:
    return '"true"' if value else '"false"'


def _environment() -> jinja2.Environment:
    folder = templates_dir()
    if not folder.is_dir():
        raise DeployError(f"deployment templates not found in {folder} (set TOOLKIT_TEMPLATES to the templates folder)")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["q"] = _quote
    env.filters["lower_bool"] = _lower_bool
    return env


def render_sam_template(settings: LambdaSettings, image: str) -> str:
    return _environment().get_template(_TEMPLATES["lambda"]).render(
        s=settings, image=image, ecr_image=bool(ECR_IMAGE.match(image)), alias=ALIAS, toolkit_version=__version__
    )


def render_service(settings: ServiceSettings, image: str) -> str:
    """The Cloud Run or Knative Service YAML (by `settings.target`)."""
    note = f"{settings.concurrency} requests at once per instance"
    if any(n.startswith("concurrency") for n in settings.notes):
        note += ": max_batch_size x instances, so requests can meet in a batch"
    return _environment().get_template(_TEMPLATES[settings.target]).render(
        s=settings, image=image, port=CONTAINER_PORT, concurrency_note=note, toolkit_version=__version__
    )


def service_document(settings: ServiceSettings, image: str) -> dict[str, Any]:
    """The rendered Service as the JSON object the Cloud Run Admin API v1 (or Kubernetes) takes."""
    import yaml  # pyyaml: the cloudrun extra

    return yaml.safe_load(render_service(settings, image))


def manifest_settings(
    target: str,
    name: str,
    compiled_repository: CompiledRepository | None,
    options: LambdaOverrides | ServiceOverrides | None = None,
) -> LambdaSettings | ServiceSettings:
    if target == "lambda":
        if options is not None and not isinstance(options, LambdaOverrides):
            raise DeployOptionError("lambda manifests take LambdaOverrides")
        return lambda_settings(name, compiled_repository, options)
    if target in ("cloudrun", "knative"):
        if options is not None and not isinstance(options, ServiceOverrides):
            raise DeployOptionError(f"{target} manifests take ServiceOverrides")
        return service_settings(target, name, compiled_repository, options)
    raise DeployOptionError(f"unknown target '{target}': choose one of {', '.join(TARGETS)}")


def render_manifest(target: str, settings: LambdaSettings | ServiceSettings, image: str) -> str:
    if target == "lambda":
        assert isinstance(settings, LambdaSettings)
        return render_sam_template(settings, image)
    assert isinstance(settings, ServiceSettings)
    return render_service(settings, image)


def target_cpu_plan(
    target: str,
    name: str,
    compiled_repository: CompiledRepository,
    options: LambdaOverrides | ServiceOverrides | None = None,
):
    """The runtime's CPU thread budget (handlers/cpu_budget.py) on the CPUs the target's settings
    give a container: Lambda's vCPUs from its memory (one request at a time), Cloud Run's and
    Knative's --cpu."""
    from handlers import cpu_budget

    from .service_settings import parse_cpu

    settings = manifest_settings(target, manifest_name(name, target), compiled_repository, options)
    if isinstance(settings, LambdaSettings):
        count = cpu_budget.for_target(settings.vcpus, f"AWS Lambda {settings.memory_mb} MB = {settings.vcpus:.2f} vCPU")
        return cpu_budget.plan(compiled_repository.models.values(), count, serial=True)
    count = cpu_budget.for_target(parse_cpu(settings.cpu), f"{target} --cpu {settings.cpu}")
    return cpu_budget.plan(compiled_repository.models.values(), count)


def manifest_name(name: str, target: str) -> str:
    """A resource name for the target from an image name: Lambda allows A-Za-z0-9-_, Knative
    lowercase DNS labels (image names may hold '/', '.' and '_')."""
    base = name.rsplit("/", 1)[-1]
    if target == "lambda":
        cleaned = re.sub(r"[^A-Za-z0-9_-]+", "-", base).strip("-")
        return cleaned[:64] or "toolkit"
    cleaned = re.sub(r"[^a-z0-9-]+", "-", base.lower()).strip("-")
    return cleaned[:63].rstrip("-") or "toolkit"


def write_manifests(
    target: str,
    output_dir: Path | str,
    *,
    image: str,
    name: str,
    compiled_repository: CompiledRepository | None,
    options: LambdaOverrides | ServiceOverrides | None = None,
) -> list[Path]:
    """Write the deployment manifest of `target` into `output_dir`; return the paths written.

    `name` is the function / service name (an image name is turned into a valid one); `image`
    the image reference the manifest deploys.
    """
    settings = manifest_settings(target, manifest_name(name, target), compiled_repository, options)
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)
    path = output / MANIFEST_FILES[target]
    path.write_text(render_manifest(target, settings, image))
    return [path]
