"""Build hooks that run inside the image build, where the models' own dependencies are installed.

PYTHON-MODEL AUTO-COMPLETE HOOK (not implemented yet). Triton completes a python-backend model's
config by calling its `TritonPythonModel.auto_complete_config(auto_complete_model_config)` when
the model loads. That code imports the model's own dependencies (its requirements.txt), which
exist only inside the image, so the step belongs in the image build: after the wheels are
installed and the repository copied, one `RUN` executes the runtime's python backend in
"complete configs" mode, which rewrites `models.json` in place. The python backend
(handlers/backends/python*) is being written separately; when it offers that mode, return its
command from `python_autocomplete_command` and the Dockerfile template runs it (the template's
`python_autocomplete_command` block). Until then the build ships python models' configs as
compiled on the host and says so in the build report.
"""

from __future__ import annotations

from collections.abc import Iterable

from .targets import ImageLayout

PYTHON_BACKEND = "python"


def python_models(models: Iterable[tuple[str, str]]) -> list[str]:
    """Names of the python-backend models among (name, backend) pairs."""
    return sorted(name for name, backend in models if backend == PYTHON_BACKEND)


def python_autocomplete_command(models: list[str], layout: ImageLayout) -> str | None:
    """The shell command the image build runs to auto-complete python models' configs, or None
    while the runtime has no such mode (see the module docstring)."""
    del models, layout  # the hook's inputs once it is implemented
    return None
