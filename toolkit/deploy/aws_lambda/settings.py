"""What a Lambda function of a repository is: memory, timeout, storage, architecture, URL auth.

`lambda_settings()` computes the defaults from the compiled repository and checks every value
against AWS Lambda's documented quotas (docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html
and the CreateFunction API reference), so a bad option fails before any AWS call.

The same `LambdaSettings` feed `toolkit deploy --target lambda` and the SAM template that
`toolkit build` writes, so both describe the same function.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ...repository.compile import CompiledRepository
from ..errors import DeployOptionError
from ..sizing import ModelFootprint, footprints, memory_estimate_mib

MEMORY_MIN_MB = 128
MEMORY_MAX_MB = 10240
# "At 1,769 MB, a function has the equivalent of one vCPU"; vCPUs grow with memory up to 6.
ONE_VCPU_MB = 1769
MAX_VCPUS = 6
TIMEOUT_MAX_S = 900
EPHEMERAL_MIN_MB = 512
EPHEMERAL_MAX_MB = 10240
ENVIRONMENT_MAX_BYTES = 4096
ARCHITECTURES = ("x86_64", "arm64")
AUTH_TYPES = {"iam": "AWS_IAM", "none": "NONE"}
ALIAS = "live"
DEFAULT_TIMEOUT_S = 60

_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ENV_KEY = re.compile(r"^[A-Za-z][A-Za-z0-9_]+$")
# Keys the Lambda runtime sets itself; CreateFunction refuses them.
RESERVED_ENV = frozenset({
    "_HANDLER", "_X_AMZN_TRACE_ID", "AWS_DEFAULT_REGION", "AWS_REGION", "AWS_EXECUTION_ENV",
    "AWS_LAMBDA_FUNCTION_NAME", "AWS_LAMBDA_FUNCTION_MEMORY_SIZE", "AWS_LAMBDA_FUNCTION_VERSION",
    "AWS_LAMBDA_INITIALIZATION_TYPE", "AWS_LAMBDA_LOG_GROUP_NAME", "AWS_LAMBDA_LOG_STREAM_NAME",
    "AWS_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "AWS_LAMBDA_RUNTIME_API", "LAMBDA_TASK_ROOT", "LAMBDA_RUNTIME_DIR",
})


@dataclass
class LambdaOverrides:
    """Values the user chose; None takes the default computed from the repository."""

    memory_mb: int | None = None
    timeout_s: int | None = None
    ephemeral_storage_mb: int | None = None
    architecture: str | None = None
    auth: str | None = None  # "iam" or "none"
    provisioned_concurrency: int | None = None
    environment: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LambdaSettings:
    name: str
    memory_mb: int
    memory_note: str  # how the memory was chosen, printed in the plan
    timeout_s: int
    ephemeral_storage_mb: int
    architecture: str
    auth_type: str  # "AWS_IAM" or "NONE", the Function URL's AuthType
    provisioned_concurrency: int | None  # None: leave as it is; 0: remove
    environment: dict[str, str]

    @property
    def vcpus(self) -> float:
        return min(MAX_VCPUS, self.memory_mb / ONE_VCPU_MB)

    @property
    def public(self) -> bool:
        return self.auth_type == "NONE"


def check_function_name(name: str) -> str:
    if not _FUNCTION_NAME.match(name):
        raise DeployOptionError(
            f"invalid Lambda function name '{name}': 1 to 64 letters, digits, '-' and '_'"
        )
    return name


def check_environment(environment: dict[str, str]) -> dict[str, str]:
    for key in environment:
        if key in RESERVED_ENV:
            raise DeployOptionError(f"environment variable {key} is reserved by AWS Lambda and cannot be set")
        if not _ENV_KEY.match(key):
            raise DeployOptionError(
                f"invalid environment variable name '{key}' for AWS Lambda: a letter followed by one or more letters, digits or '_'"
            )
    size = sum(len(k.encode()) + len(v.encode()) for k, v in environment.items())
    if size > ENVIRONMENT_MAX_BYTES:
        raise DeployOptionError(f"environment variables take {size} bytes, over AWS Lambda's {ENVIRONMENT_MAX_BYTES} byte limit")
    return dict(environment)


def default_memory_mb(compiled: CompiledRepository | None) -> tuple[int, str]:
    """Memory for the function: what the models need, and at least one full vCPU."""
    if compiled is None:
        return ONE_VCPU_MB, "1 vCPU (no repository given to size from)"
    return memory_for(footprints(compiled))


def memory_for(models: list[ModelFootprint]) -> tuple[int, str]:
    """(MB, why). ONNX Runtime sizes its thread pool from the vCPUs Lambda grants, which grow
    with memory (1,769 MB = 1 vCPU); below that the function gets a fraction of a core and every
    inference is slower, so 1,769 MB is the floor."""
    estimate = memory_estimate_mib(models)
    if estimate > MEMORY_MAX_MB:
        raise DeployOptionError(
            f"the models need about {estimate} MB of memory, over AWS Lambda's {MEMORY_MAX_MB} MB maximum: "
            "deploy them to Cloud Run (--target cloudrun), or set --memory if you know better"
        )
    if estimate <= ONE_VCPU_MB:
        return ONE_VCPU_MB, f"models need about {estimate} MB; 1,769 MB gives a full vCPU for ONNX Runtime"
    memory = min(MEMORY_MAX_MB, math.ceil(estimate / 64) * 64)
    return memory, f"models need about {estimate} MB (model weights per instance, batch tensors, runtime)"


def lambda_settings(name: str, compiled: CompiledRepository | None, overrides: LambdaOverrides | None = None) -> LambdaSettings:
    o = overrides or LambdaOverrides()
    check_function_name(name)
    if o.memory_mb is not None:
        if not MEMORY_MIN_MB <= o.memory_mb <= MEMORY_MAX_MB:
            raise DeployOptionError(f"--memory {o.memory_mb}: AWS Lambda allows {MEMORY_MIN_MB} to {MEMORY_MAX_MB} MB")
        memory, note = o.memory_mb, "set with --memory"
    else:
        memory, note = default_memory_mb(compiled)
    timeout = o.timeout_s if o.timeout_s is not None else DEFAULT_TIMEOUT_S
    if not 1 <= timeout <= TIMEOUT_MAX_S:
        raise DeployOptionError(f"--timeout {timeout}: AWS Lambda allows 1 to {TIMEOUT_MAX_S} seconds")
    storage = o.ephemeral_storage_mb if o.ephemeral_storage_mb is not None else EPHEMERAL_MIN_MB
    if not EPHEMERAL_MIN_MB <= storage <= EPHEMERAL_MAX_MB:
        raise DeployOptionError(
            f"--ephemeral-storage {storage}: AWS Lambda allows {EPHEMERAL_MIN_MB} to {EPHEMERAL_MAX_MB} MB of /tmp"
        )
    architecture = o.architecture or "x86_64"
    if architecture not in ARCHITECTURES:
        raise DeployOptionError(f"--arch {architecture}: choose x86_64 or arm64")
    auth = o.auth or "iam"
    if auth not in AUTH_TYPES:
        raise DeployOptionError(f"--auth {auth}: choose iam (AWS_IAM, the default) or none (a public URL)")
    if o.provisioned_concurrency is not None and o.provisioned_concurrency < 0:
        raise DeployOptionError("--provisioned-concurrency must be 0 (remove) or more")
    return LambdaSettings(
        name=name,
        memory_mb=memory,
        memory_note=note,
        timeout_s=timeout,
        ephemeral_storage_mb=storage,
        architecture=architecture,
        auth_type=AUTH_TYPES[auth],
        provisioned_concurrency=o.provisioned_concurrency,
        environment=check_environment(o.environment),
    )


def platform_architecture(platform: str) -> str:
    """OCI platform of an image -> Lambda architecture."""
    return {"linux/amd64": "x86_64", "linux/arm64": "arm64"}.get(platform, platform)
