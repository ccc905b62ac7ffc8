"""Repository -> compiled, validated model configurations (the runtime's only input).

The steps follow the order in which tritonserver reads and loads a model, so the first problem
reported is the one Triton would report:

1. parse config.pbtxt (or start empty: auto-complete, Triton's default)
2. AutoCompleteBackendFields, NormalizeModelConfig, ValidateModelConfig (+ IO checks when
   auto-complete is disabled), directory name == model name
3. version policy -> versions; the product's own support checks
4. backend auto-complete (ONNX signature), normalise again, instance groups for the target
   device, IO checks, config vs model file, label files, warmup samples
5. ensembles: composing models present and selected (they are added in explicit mode)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from google.protobuf.message import Message

from .. import __version__
from . import onnx_autocomplete
from .backend_fields import ENSEMBLE_PLATFORM, ONNXRUNTIME_BACKEND, autocomplete_backend_fields
from .discover import ModelDirectory, find_model_file, list_models, missing_specific_versions, select_versions
from .ensemble import validate_ensembles
from .errors import ModelError, RepositoryError
from .model_config import ModelConfig, read_config_file, to_triton_json
from .normalize import Device, NormalizeReport, normalize_instance_groups, normalize_model_config
from .support import check_supported
from .validate import validate_instance_groups, validate_model_config, validate_model_io_config
from .warmup import validate_warmup

MANIFEST_FORMAT = 1
MANIFEST_FILENAME = "models.json"


@dataclass
class CompiledModel:
    """One model, ready to serve: Triton's completed config plus what the runtime must load."""

    name: str
    path: Path
    config: dict[str, Any]
    versions: list[int]
    model_files: dict[int, str]  # version -> path relative to the model directory
    warnings: list[str] = field(default_factory=list)

    @property
    def backend(self) -> str:
        return self.config.get("backend") or self.config.get("platform", "")

    def manifest_entry(self, root: Path) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path.relative_to(root).as_posix() if self.path.is_relative_to(root) else str(self.path),
            "versions": self.versions,
            "model_files": {str(v): f for v, f in self.model_files.items()},
            "config": self.config,
        }


@dataclass
class CompiledRepository:
    root: Path
    device: Device
    models: dict[str, CompiledModel] = field(default_factory=dict)
    failures: dict[str, ModelError] = field(default_factory=dict)
    selected: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def manifest(self) -> dict[str, Any]:
        """The JSON document the runtime (handlers/) reads; it never sees protobuf."""
        return {
            "format": MANIFEST_FORMAT,
            "toolkit_version": __version__,
            "device": str(self.device),
            "models": [self.models[n].manifest_entry(self.root) for n in sorted(self.models)],
        }

    def write_manifest(self, path: Path) -> Path:
        path.write_text(json.dumps(self.manifest(), indent=2) + "\n")
        return path


def _read_config(model: ModelDirectory, auto_complete: bool) -> Message:
    if model.has_config:
        return read_config_file(model.config_path)
    if not auto_complete:
        raise ModelError(
            f"failed to load model configuration: {model.config_path} does not exist "
            "(auto-complete is disabled)",
            model=model.name,
            file=str(model.config_path),
        )
    return ModelConfig()


def compile_model(model: ModelDirectory, device: Device, auto_complete: bool = True) -> CompiledModel:
    """Compile one model directory, raising `ModelError` at the first problem."""
    try:
        return _compile_model(model, device, auto_complete)
    except ModelError as exc:
        if exc.model is None:
            exc.model = model.name
        if exc.file is None and model.has_config:
            exc.file = str(model.config_path)
        if exc.line is None and exc.hint and exc.file == str(model.config_path):
            exc.line = _line_of(model.config_path, exc.hint)
        raise


def _line_of(path: Path, token: str) -> int | None:
    """First line of config.pbtxt mentioning `token` outside a comment (1-based)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    for number, line in enumerate(lines, 1):
        if token in line.split("#", 1)[0]:
            return number
    return None


def _compile_model(model: ModelDirectory, device: Device, auto_complete: bool) -> CompiledModel:
    config = _read_config(model, auto_complete)

    autocomplete_backend_fields(model.name, model.path, config)
    normalize_model_config(config)
    validate_model_config(config)
    if not auto_complete:
        validate_model_io_config(config)
    if config.name != model.name:
        raise ModelError(
            f"unexpected directory name '{model.name}' for model '{config.name}', directory name must "
            "equal model name",
            model=model.name,
        )

    policy = to_triton_json(config)["version_policy"]
    available = model.version_numbers()
    versions = select_versions(model.name, available, policy)
    warnings = [
        f"version {v} is specified for model '{model.name}', but the version directory is not present"
        for v in missing_specific_versions(available, policy)
    ]

    check_supported(config)

    is_ensemble = config.platform == ENSEMBLE_PLATFORM
    model_files: dict[int, str] = {}
    if not is_ensemble:
        for v in versions:
            path = find_model_file(model, v, config.default_model_filename)
            model_files[v] = path.relative_to(model.path).as_posix()

    signatures = {}
    if config.backend == ONNXRUNTIME_BACKEND:
        signatures = {v: onnx_autocomplete.read_signature(model.path / f, model.name) for v, f in model_files.items()}
        if auto_complete:
            # Triton auto-completes per loaded version; they share one config, so the newest wins.
            inputs, outputs = signatures[max(signatures)]
            onnx_autocomplete.autocomplete(config, inputs, outputs)
            normalize_model_config(config)

    report = NormalizeReport()
    normalize_instance_groups(config, device, report)
    warnings.extend(report.warnings)
    validate_instance_groups(config, set(device.gpus))
    validate_model_io_config(config)
    for inputs, outputs in signatures.values():
        onnx_autocomplete.validate_against_model(config, inputs, outputs)

    for output in config.output:
        if output.label_filename:
            label_path = model.path / output.label_filename
            if not label_path.is_file():
                raise ModelError(
                    f"label file '{output.label_filename}' of output '{output.name}' of model "
                    f"'{model.name}' not found (expected {label_path})",
                    model=model.name,
                )

    validate_warmup(config, model.path)

    return CompiledModel(
        name=model.name,
        path=model.path,
        config=to_triton_json(config),
        versions=versions,
        model_files=model_files,
        warnings=warnings,
    )


def compile_repository(
    root: Path | str,
    models: Iterable[str] | None = None,
    device: Device | str = "cpu",
    auto_complete: bool = True,
) -> CompiledRepository:
    """Compile a repository. `models` mirrors tritonserver's `--load-model` (explicit mode):
    only those models, plus the composing models of selected ensembles."""
    root = Path(root)
    if isinstance(device, str):
        device = Device.parse(device)
    directories = {m.name: m for m in list_models(root)}
    result = CompiledRepository(root=root, device=device)

    if models is None:
        wanted = list(directories)
    else:
        wanted = list(dict.fromkeys(models))
        unknown = [m for m in wanted if m not in directories]
        if unknown:
            raise RepositoryError(
                "model(s) not found in repository '"
                + str(root)
                + "': "
                + ", ".join(unknown)
                + (f" (available: {', '.join(directories)})" if directories else " (the repository has no models)")
            )

    pending = list(wanted)
    seen: set[str] = set()
    while pending:
        name = pending.pop(0)
        if name in seen:
            continue
        seen.add(name)
        result.selected.append(name)
        try:
            compiled = compile_model(directories[name], device, auto_complete)
        except ModelError as exc:
            result.failures[name] = exc
            continue
        result.models[name] = compiled
        if compiled.config.get("platform") == ENSEMBLE_PLATFORM:
            for step in compiled.config.get("ensemble_scheduling", {}).get("step", []):
                dependency = step.get("model_name")
                if dependency in directories and dependency not in seen:
                    pending.append(dependency)

    validate_ensembles(result, directories)
    return result
