"""Deployment targets of `toolkit build`: what each platform runs and what it refuses.

- lambda: AWS Lambda container image. The handler is Mangum over the runtime app
  (`handlers.entrypoints.aws_lambda.handler`); AWS base images run it with their own runtime
  interface client, any other base image gets `awslambdaric` as entrypoint. CPU only (Lambda has
  no GPU), x86_64 or arm64, at most 10 GB uncompressed. Lambda runs the image as an arbitrary
  non-root user on a read-only file system where only /tmp is writable.
- cloudrun: Google Cloud Run service. uvicorn on $PORT (`python -m handlers.entrypoints.container`),
  or with `--protocol grpc` the gRPC service on $PORT (h2c); linux/amd64 only; GPU services run on
  NVIDIA L4 (driver 535, CUDA 12).
- knative: any Knative Serving cluster; same image as cloudrun, amd64 or arm64.

Where python models' instances run (`TOOLKIT_PYTHON_INSTANCE_MODE`, baked into the image): Cloud
Run and Knative send a container many requests at once (Cloud Run: up to 80 by default), so every
instance runs in a model process of its own and a model that crashes fails only its own batch;
Lambda sends one request per execution environment, so `auto` keeps single-instance models
in-process, where they start faster (docs/python-backend.md, docs/cold-start.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from handlers.backends.python import AUTO, PROCESS

DEFAULT_PYTHON_BASE = "python:3.12-slim-bookworm"
LAMBDA_BASE = "public.ecr.aws/lambda/python:3.12"

LAMBDA_HANDLER = "handlers.entrypoints.aws_lambda.handler"
CONTAINER_MODULE = "handlers.entrypoints.container"

# AWS Lambda quotas (docs.aws.amazon.com/lambda/latest/dg/gettingstarted-limits.html).
LAMBDA_MAX_IMAGE_BYTES = 10 * 1000**3  # "10 GB" uncompressed, all layers; decimal GB to stay safe
LAMBDA_PAYLOAD_BYTES = 6 * 1024 * 1024  # synchronous invocation request and response, 6 MB each
# Cloud Run: HTTP/1 requests are limited to 32 MiB (HTTP/2 end to end has no limit).
CLOUDRUN_REQUEST_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class Target:
    name: str
    platforms: tuple[str, ...]  # OCI platforms the service runs
    gpu: bool  # the platform offers GPUs
    server: bool  # the image serves HTTP itself (uvicorn on $PORT)
    default_base: str
    max_image_bytes: int | None = None
    request_limit_bytes: int | None = None
    request_limit_note: str = ""
    one_request_per_instance: bool = False
    python_instance_mode: str = PROCESS  # TOOLKIT_PYTHON_INSTANCE_MODE in the image


TARGETS: dict[str, Target] = {
    "lambda": Target(
        name="lambda",
        platforms=("linux/amd64", "linux/arm64"),
        gpu=False,
        server=False,
        default_base=LAMBDA_BASE,
        max_image_bytes=LAMBDA_MAX_IMAGE_BYTES,
        request_limit_bytes=LAMBDA_PAYLOAD_BYTES,
        request_limit_note="AWS Lambda's 6 MB synchronous payload limit",
        one_request_per_instance=True,
        python_instance_mode=AUTO,  # one request per environment: nothing in flight to protect
    ),
    "cloudrun": Target(
        name="cloudrun",
        platforms=("linux/amd64",),
        gpu=True,
        server=True,
        default_base=DEFAULT_PYTHON_BASE,
        request_limit_bytes=CLOUDRUN_REQUEST_BYTES,
        request_limit_note="Cloud Run's 32 MiB HTTP/1 request limit (use HTTP/2 end to end to lift it)",
    ),
    "knative": Target(
        name="knative",
        platforms=("linux/amd64", "linux/arm64"),
        gpu=True,
        server=True,
        default_base=DEFAULT_PYTHON_BASE,
    ),
}


@dataclass(frozen=True)
class ImageLayout:
    """Where things live inside the image."""

    app_dir: str  # parent of the `handlers` package
    deps_dir: str  # pip --target of the wheels
    repository_dir: str  # models.json and the model directories
    install_root: str  # what the final stage copies from the install stage

    @property
    def manifest(self) -> str:
        return f"{self.repository_dir}/models.json"

    @property
    def python_path(self) -> str:
        return self.app_dir if self.app_dir == self.deps_dir else f"{self.app_dir}:{self.deps_dir}"


# Any base image: everything under /opt/toolkit.
OPT_LAYOUT = ImageLayout(
    app_dir="/opt/toolkit/app",
    deps_dir="/opt/toolkit/python",
    repository_dir="/opt/toolkit/repository",
    install_root="/opt/toolkit",
)
# AWS Lambda base images: code and dependencies in ${LAMBDA_TASK_ROOT}, as AWS documents.
LAMBDA_TASK_LAYOUT = ImageLayout(
    app_dir="/var/task",
    deps_dir="/var/task",
    repository_dir="/opt/toolkit/repository",
    install_root="/var/task",
)

# The user images run as: no passwd entry needed, like distroless' "nonroot".
IMAGE_USER = "65532:65532"
