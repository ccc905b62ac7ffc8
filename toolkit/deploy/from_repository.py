"""A model repository as `toolkit deploy` takes it: compiled (to size the deployment) and, when no
`--image` is given, built into an image with `toolkit build`'s pipeline."""

from __future__ import annotations

from ..repository.compile import CompiledRepository, compile_repository
from ..repository.discover import ensure_repository
from ..repository.errors import RepositoryError
from .errors import DeployError, DeployOptionError
from .progress import DeployUI


def compile_for_deploy(repository: str, models: list[str] | None, device: str) -> CompiledRepository:
    """Compile like `toolkit build` does; every model must be valid (nothing half-deployed)."""
    try:
        compiled = compile_repository(ensure_repository(repository), models, device)
    except (RepositoryError, ValueError) as exc:
        raise DeployOptionError(str(exc)) from None
    if compiled.failures:
        raise DeployOptionError("the repository has invalid models; nothing was deployed:\n  "
                                + "\n  ".join(compiled.failure_lines()))
    if not compiled.models:
        raise DeployOptionError(f"the repository {repository} has no models")
    return compiled


def build_image(
    repository: str, target: str, models: list[str] | None, platform: str, device: str, ui: DeployUI, protocol: str = "http",
    *, base_image: str | None = None, grpc_frontend: str = "auto", http_frontend: str = "auto",
) -> str:
    """Build the image with `toolkit build` (a container engine is needed); its local reference.
    `base_image`, `grpc_frontend` and `http_frontend` are toolkit build's options of those names."""
    from ..build import BuildError, BuildOptions, run_build

    ui.step(f"building the {target} image of {repository} (toolkit build)")
    try:
        result = run_build(
            BuildOptions(
                repository=repository, target=target, models=models, platform=platform, device=device, protocol=protocol,
                base_image=base_image, grpc_frontend=grpc_frontend, http_frontend=http_frontend,
            ),
            ui,
        )
    except BuildError as exc:
        raise DeployError(f"toolkit build failed: {exc.message}", detail=exc.detail) from None
    image = result.report.image
    if not image:
        raise DeployError(
            "toolkit build wrote the build context but built no image (no container engine): build it, then "
            "deploy with --image"
        )
    return image
