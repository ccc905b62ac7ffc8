"""Compile-time auto-complete of Python-backend models (their `auto_complete_config`).

Triton runs a python model's static `auto_complete_config(auto_complete_model_config)` when it
loads the model with auto-complete enabled (the default), after its own normalisation, then keeps
only part of what the model returns (`TritonModel::UpdateModelConfig`) and normalises again.
Those rules live in the runtime package, on Triton's config JSON, so that the image build's
completion step applies the very same code (handlers/backends/python/config_update.py); this
module converts the compiler's protobuf config to JSON and back around them, then runs
ValidateModelConfig again, as tritonserver's Model::Init does (the compiler then runs
ValidateModelIOConfig and the rest of the load checks).

The model is imported in a child process (handlers/backends/python/autocomplete_process.py) with
the interpreter that has the model's dependencies (`python`, default: this one), as Triton uses a
separate stub process. docs/python-backend.md has the measurements.

A model whose auto_complete_config imports a package that is not installed here raises
`MissingDependencyError`: `toolkit validate` / `serve` report it with the module's name and the
`pip install -r <model>/requirements.txt` to run; `toolkit build` catches it and defers the model
to the image build, where its requirements are installed.

Deviation: a returned config that is not a valid ModelConfig (e.g. data_type "TYPE_FOO") is an
error naming the problem; tritonserver 2.51 silently keeps the unchanged config.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from google.protobuf import json_format
from google.protobuf.message import Message

from handlers.backends.python import config_update
from handlers.config.errors import ConfigError
from handlers.backends.python.autocomplete_process import DEFAULT_TIMEOUT_S, AutoCompleteFailure, run_auto_complete

from .errors import CODE_INTERNAL, ModelError
from .model_config import ModelConfig, to_triton_json
from .normalize import normalize_model_config
from .validate import validate_model_config

REQUIREMENTS_FILENAME = "requirements.txt"


class MissingDependencyError(ModelError):
    """auto_complete_config needs a module that is not installed where it ran."""

    def __init__(self, message: str, *, module: str | None, **kwargs) -> None:
        super().__init__(message, **kwargs)
        self.module = module


def _dependency_advice(module: str | None, model_dir: Path) -> str:
    what = f"'{module}'" if module else "a module"
    requirements = model_dir / REQUIREMENTS_FILENAME
    if requirements.is_file():
        return (
            f"auto_complete_config needs {what}, which is not installed here: pip install -r {requirements} "
            "(toolkit build runs it in the image, where that file is installed)"
        )
    return (
        f"auto_complete_config needs {what}, which is not installed here: list it in {requirements} (the image "
        "build installs that file) and pip install -r it where the toolkit runs"
    )


def run_model_autocomplete(
    config_json: dict,
    model_file: Path,
    model_dir: Path,
    version: int,
    *,
    python: Sequence[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> dict:
    """The config dict the model's auto_complete_config returns (its input: `config_json`);
    ModelError with Triton's message when it fails (MissingDependencyError for an import)."""
    name = str(config_json.get("name", ""))
    try:
        return run_auto_complete(config_json, model_file, model_dir, version, python=python, timeout=timeout)
    except AutoCompleteFailure as failure:
        if failure.import_error:
            raise MissingDependencyError(
                failure.message,
                module=failure.missing_module,
                model=name,
                file=str(model_file),
                code=CODE_INTERNAL,
                detail=_dependency_advice(failure.missing_module, Path(model_dir)),
            ) from None
        raise ModelError(
            failure.message, model=name, file=str(model_file), code=CODE_INTERNAL, detail=failure.detail
        ) from None


def update_model_config(config: Message, returned: dict) -> None:
    """Apply what auto_complete_config returned to `config` (in place), keeping what Triton
    keeps and normalising again (handlers/backends/python/config_update.py)."""
    name = config.name
    try:
        updated = config_update.update_model_config(to_triton_json(config), returned)
    except ConfigError as exc:
        raise ModelError(exc.message, model=name, code=exc.code, detail=exc.detail) from None
    completed = ModelConfig()
    try:
        json_format.ParseDict(updated, completed)
    except json_format.ParseError as exc:  # a scheduler the shared rules keep as given
        raise ModelError(
            f"auto_complete_config of model '{name}' returned an invalid model configuration",
            model=name,
            code=CODE_INTERNAL,
            detail=str(exc),
        ) from None
    config.CopyFrom(completed)
    normalize_model_config(config)


def autocomplete(
    config: Message,
    model_dir: Path,
    version_dir: Path,
    *,
    model_file: Path | None = None,
    python: Sequence[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> None:
    """Run the model's auto_complete_config (when it has one) and update `config` in place as
    tritonserver does, then ValidateModelConfig as Model::Init does. Raises ModelError with
    Triton's message. The support checks (e.g. a model that made itself decoupled) stay with the
    compiler, after this step, as in tritonserver's order.

    `config` is the model's config after Triton's own auto-complete and normalisation;
    `version_dir` the version whose model.py runs (Triton: each loaded version; the toolkit: the
    newest, since versions share one config); `model_file` defaults to
    `version_dir / config.default_model_filename` (or model.py).
    """
    model_dir = Path(model_dir)
    version_dir = Path(version_dir)
    if model_file is None:
        model_file = version_dir / (config.default_model_filename or "model.py")
    returned = run_model_autocomplete(
        to_triton_json(config), Path(model_file), model_dir, int(version_dir.name), python=python, timeout=timeout
    )
    try:
        update_model_config(config, returned)
    except ModelError as exc:
        exc.file = exc.file or str(model_file)
        raise
    try:
        validate_model_config(config)
    except ModelError as exc:
        exc.detail = exc.detail or f"the config as completed by auto_complete_config of {model_file}"
        raise


__all__ = ["MissingDependencyError", "autocomplete", "run_model_autocomplete", "update_model_config"]
