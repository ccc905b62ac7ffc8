"""Build hooks that run inside the image build, where the models' own dependencies are installed.

PYTHON-MODEL AUTO-COMPLETE. Triton completes a python-backend model's config by calling its
`TritonPythonModel.auto_complete_config(auto_complete_model_config)` when the model loads. The
compiler runs it on the host first; a model whose auto_complete_config imports a package the host
does not have (one from the model's requirements.txt, which only the image installs) is left for
the image build: the compiler marks its manifest entry `"autocomplete": "image"`
(compile_repository(..., python_autocomplete="image")). For such models the Dockerfile runs, once
the wheels are installed and the repository is copied,

    PYTHONPATH=<app>:<deps> python3 -m handlers.backends.python.complete <repository>/models.json

as the build user (the image runs as another, non-root user with a read-only root; models.json is
written with mode 0644). It runs auto_complete_config with the image's Python and packages,
applies Triton's rules, runs the checks the host had to leave out and rewrites models.json
atomically; any error fails the image build with the model's name and Triton's message
(handlers/backends/python/complete.py). Without deferred models there is no such step.
"""

from __future__ import annotations

import shlex

from .targets import ImageLayout

COMPLETE_MODULE = "handlers.backends.python.complete"


def python_autocomplete_command(models: list[str], layout: ImageLayout) -> str | None:
    """The shell command the image build runs to complete the configs of `models` (the python
    models the host compile left for the image: their manifest entries say so), or None when
    there are none."""
    if not models:
        return None
    return (
        f"PYTHONDONTWRITEBYTECODE=1 PYTHONPATH={shlex.quote(layout.python_path)} "
        f"python3 -m {COMPLETE_MODULE} {shlex.quote(layout.manifest)}"
    )
