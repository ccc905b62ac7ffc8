"""`toolkit build`: container images of a model repository for AWS Lambda, Cloud Run and Knative.

See docs/build.md. The entry point is `run_build(BuildOptions(...))`; the modules are named after
what they hold: targets, runtime_deps (what the image installs), base_image, wheelhouse,
runtime_imports (the runtime ships alone), context (the build context and its digest), builders
(docker, podman, buildah), report, hooks (build-time hooks), pipeline.
"""

from .errors import BuildError
from .pipeline import BuildOptions, BuildResult, run_build

__all__ = ["BuildError", "BuildOptions", "BuildResult", "run_build"]
