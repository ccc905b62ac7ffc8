"""`toolkit deploy --target lambda`: the whole sequence, its dry-run plan and its record.

1. settings (memory sized from the models, Lambda's quotas checked) - before any AWS call
2. ECR repository, image push (engine or ECR layer API), pinned by digest
3. execution role (CloudWatch Logs of this function only)
4. function: create, or update $LATEST and wait (boto3 waiters)
5. publish a version, smoke-test it (GET /v2/health/ready through a Function URL event)
6. move alias `live`; Function URL on the alias (AWS_IAM unless --auth none) and its resource policy
7. provisioned concurrency on the alias, when asked

A second deploy updates everything in place; a failure in steps 2-5 leaves `live` where it was.
Credentials, region and endpoint come from boto3's usual chain (AWS_PROFILE, AWS_REGION,
AWS_ENDPOINT_URL...).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...repository.compile import CompiledRepository
from ..errors import DeployError, DeployOptionError
from ..image_source import ArchiveImage, ImageReference, parse_image
from ..manifests import render_sam_template
from ..progress import DeployUI, SilentUI
from ..records import DeployRecord
from . import iam as iam_role
from .ecr import registry_host
from .function import (
    Waiting,
    apply_provisioned_concurrency,
    create_function,
    ensure_url,
    existing_function,
    point_alias,
    publish_version,
    smoke_test,
    sync_public_access,
    update_function,
)
from .settings import ALIAS, LambdaOverrides, LambdaSettings, lambda_settings

PLATFORMS = {"x86_64": "linux/amd64", "arm64": "linux/arm64"}


@dataclass
class LambdaDeployOptions:
    name: str
    image: str | None = None  # --image: archive, registry reference or local engine image
    repository: str | None = None  # the model repository: sizes the function; built when no image
    models: list[str] | None = None
    region: str | None = None
    overrides: LambdaOverrides = field(default_factory=LambdaOverrides)
    ecr_repository: str | None = None
    role_arn: str | None = None  # an existing execution role instead of the toolkit-made one
    engine: str = "auto"
    base_image: str | None = None  # toolkit build's --base-image when the image is built from the repository
    smoke_test: bool = True
    dry_run: bool = False
    manifest_dir: Path | None = None  # also write the SAM template there
    waiting: Waiting = field(default_factory=Waiting)


@dataclass
class LambdaPlan:
    settings: LambdaSettings
    source: ArchiveImage | ImageReference | None  # None: built from the repository first
    region: str | None
    ecr_repository: str
    role: str

    def lines(self, account: str = "<account>") -> list[tuple[str, str]]:
        s = self.settings
        region = self.region or "<region>"
        registry = registry_host(account, region)
        if self.source is None:
            image = f"build the image (toolkit build), push it to {registry}/{self.ecr_repository} with the container engine"
        elif isinstance(self.source, ArchiveImage):
            image = f"{self.source} -> {registry}/{self.ecr_repository} (ECR layer API, no engine needed)"
        elif self.source.registry == registry:
            image = f"{self.source} (already in ECR: used as it is)"
        else:
            image = f"{self.source} -> {registry}/{self.ecr_repository} (ECR token, then the container engine's push)"
        env = ", ".join(f"{k}={v}" for k, v in sorted(s.environment.items())) or "-"
        if s.provisioned_concurrency is None:
            provisioned = "unchanged"
        elif s.provisioned_concurrency == 0:
            provisioned = f"removed from '{ALIAS}'"
        else:
            provisioned = f"{s.provisioned_concurrency} on '{ALIAS}' (environments initialised ahead: models loaded and warm)"
        return [
            ("region", region),
            ("image", image),
            ("ECR repository", f"{self.ecr_repository} (created if missing, scan on push)"),
            ("execution role", self.role),
            ("function", f"{s.name}: PackageType Image, {s.architecture}, created or $LATEST updated"),
            ("memory", f"{s.memory_mb} MB = {s.vcpus:.2f} vCPU ({s.memory_note})"),
            ("timeout / storage", f"{s.timeout_s} s, /tmp {s.ephemeral_storage_mb} MB"),
            ("environment", env),
            ("version", "published from $LATEST, smoke-tested (GET /v2/health/ready) before traffic moves"),
            ("alias", f"'{ALIAS}' moved to the new version (failures before this leave it where it was)"),
            ("Function URL", f"on '{ALIAS}', AuthType {s.auth_type}" + (
                " (PUBLIC: anyone can call it)" if s.public else " (callers sign with SigV4: toolkit invoke / toolkit proxy)")),
            ("provisioned concurrency", provisioned),
        ]


def plan_lambda(options: LambdaDeployOptions, compiled: CompiledRepository | None) -> LambdaPlan:
    settings = lambda_settings(options.name, compiled, options.overrides)
    source = parse_image(options.image) if options.image else None
    if source is None and options.repository is None:
        raise DeployOptionError("give a model repository to build and deploy, or --image")
    repository = (options.ecr_repository or options.name).lower()
    if options.role_arn:
        role = f"{options.role_arn} (given with --role)"
    else:
        role = (f"{iam_role.role_name(options.name)} (created if missing): logs:CreateLogGroup, logs:CreateLogStream, "
                f"logs:PutLogEvents on /aws/lambda/{options.name} only")
    return LambdaPlan(settings, source, options.region, repository, role)


def public_url_warning(settings: LambdaSettings) -> str:
    return (
        f"--auth none: the Function URL of {settings.name} will be PUBLIC - anyone who finds it can run inferences "
        "and you pay for them. The resource policy grants lambda:InvokeFunctionUrl and lambda:InvokeFunction "
        "(through the URL only) to everyone."
    )


def _session(region: str | None) -> Any:
    try:
        import boto3
    except ImportError:
        raise DeployError("deploying to AWS Lambda needs boto3: pip install 'triton-serverless-toolkit[lambda]'") from None
    session = boto3.session.Session(region_name=region) if region else boto3.session.Session()
    if not session.region_name:
        raise DeployOptionError("no AWS region: pass --region or set AWS_REGION (or a profile's region)")
    return session


def deploy_lambda(
    options: LambdaDeployOptions,
    compiled: CompiledRepository | None,
    ui: DeployUI | None = None,
    session: Any | None = None,
) -> DeployRecord:
    """Deploy (or, with `dry_run`, only plan: no AWS call at all) and return the record."""
    ui = ui or SilentUI()
    plan = plan_lambda(options, compiled)
    settings = plan.settings
    if settings.public:
        ui.warn(public_url_warning(settings))
    if options.dry_run:
        return DeployRecord(
            target="lambda", name=settings.name, url=None, auth=settings.auth_type,
            image=str(plan.source) if plan.source else f"(built from {options.repository})", image_digest=None,
            region=plan.region, settings=_settings_dict(settings), dry_run=True,
        )

    from botocore.exceptions import BotoCoreError, ClientError

    try:
        return _deploy(options, plan, ui, session)
    except (ClientError, BotoCoreError) as exc:
        raise DeployError(f"AWS refused the deployment: {exc}") from None


def _settings_dict(s: LambdaSettings) -> dict[str, Any]:
    return {
        "memory_mb": s.memory_mb, "timeout_s": s.timeout_s, "ephemeral_storage_mb": s.ephemeral_storage_mb,
        "architecture": s.architecture, "auth_type": s.auth_type, "provisioned_concurrency": s.provisioned_concurrency,
        "environment": s.environment,
    }


def _deploy(options: LambdaDeployOptions, plan: LambdaPlan, ui: DeployUI, session: Any | None) -> DeployRecord:
    from .ecr import push_image

    settings = plan.settings
    session = session or _session(options.region)
    region = session.region_name
    identity = session.client("sts").get_caller_identity()
    account = identity["Account"]
    partition = identity["Arn"].split(":")[1] if identity.get("Arn", "").startswith("arn:") else "aws"
    ecr = session.client("ecr")
    lam = session.client("lambda")
    iam = session.client("iam")

    source = plan.source
    if source is None:
        from ..from_repository import build_image

        assert options.repository is not None
        source = parse_image(build_image(
            options.repository, "lambda", options.models, PLATFORMS[settings.architecture], "cpu", ui, base_image=options.base_image,
        ))
    with tempfile.TemporaryDirectory(prefix="toolkit-deploy-") as tmp:
        pushed = push_image(
            ecr, source, account=account, region=region, repository=plan.ecr_repository,
            tag=None, platform=PLATFORMS[settings.architecture], engine_name=options.engine, workdir=Path(tmp), ui=ui,
        )
    ui.line(f"image {pushed.uri}")

    if options.role_arn:
        role_arn, role_created = options.role_arn, False
    else:
        role_arn, role_created = iam_role.ensure_execution_role(iam, settings.name, region, account, partition, ui)

    current = existing_function(lam, settings.name)
    if current is None:
        config = create_function(lam, settings, pushed.uri, role_arn, role_created, options.waiting, ui)
    else:
        config = update_function(lam, settings, pushed.uri, role_arn, current, options.waiting, ui)
    version = publish_version(lam, settings.name, config.get("CodeSha256"), options.waiting, ui)
    if options.smoke_test:
        smoke_test(lam, settings.name, version, ui)
    alias_arn = point_alias(lam, settings.name, version, ui)
    url = ensure_url(lam, settings.name, settings.auth_type, ui)
    sync_public_access(lam, settings.name, settings.public, ui)
    provisioned = apply_provisioned_concurrency(lam, settings.name, settings.provisioned_concurrency, options.waiting, ui)

    manifest = None
    if options.manifest_dir is not None:
        options.manifest_dir.mkdir(parents=True, exist_ok=True)
        path = options.manifest_dir / "template.yaml"
        path.write_text(render_sam_template(settings, pushed.uri))
        manifest = str(path)
    values = _settings_dict(settings)
    if provisioned is not None:
        values["provisioned_concurrency_status"] = provisioned
    return DeployRecord(
        target="lambda", name=settings.name, url=url, auth=settings.auth_type, image=pushed.uri,
        image_digest=pushed.digest, region=region, account=account, resource=config.get("FunctionArn"),
        version=version, alias=alias_arn, settings=values, manifest=manifest,
    )
