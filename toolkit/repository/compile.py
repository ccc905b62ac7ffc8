"""Repository -> compiled, validated model configurations (the runtime's only input).

The steps follow the order in which tritonserver reads and loads a model, so the first problem
reported is the one tritonserver would report (tests/oracle compares both):

config stage (tritonserver's repository poll; a failure lists the model as INVALID)
  1. read config.pbtxt (or start empty: auto-complete, Triton's default), then its repository
     agents (repo_agents.py: Triton's checksum agent)
  2. AutoCompleteBackendFields, NormalizeModelConfig, ValidateModelConfig (and ValidateModelIOConfig
     when auto-complete is disabled), directory name == model name
ensemble dependencies (the repository manager's dependency graph): composing models present,
  no cycles, composing models loaded in the required versions, ValidateEnsembleConfig
load stage (a failure makes the model UNAVAILABLE)
  3. version policy -> versions
  4. NormalizeInstanceGroup / ValidateInstanceGroup for the *target* device
  5. the backend's model init: ONNX or python auto-complete (auto-complete enabled), the pytorch
     backend's parameters (it has no auto-complete)
  6. Model::Init: ValidateModelIOConfig, label files
   7. instances: the model file of each version, the onnxruntime, pytorch, fil and openvino
      backends' config-vs-model checks (onnx_autocomplete.py, torchscript.py, fil.py, openvino_model.py)
  8. warmup samples
  9. the product's own support checks (support.py): Triton's checks come first; a python model's
     EXECUTION_ENV_PATH environment (handlers/backends/python/execution_env.py)
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, Iterable

from google.protobuf.message import Message

from handlers.backends.onnxruntime import op_libraries
from handlers.batching.sequence_state import state_specs

from . import fil, onnx_autocomplete, torchscript
from .backend_fields import (
    ENSEMBLE_PLATFORM,
    ONNXRUNTIME_BACKEND,
    OPENVINO_BACKEND,
    PYTHON_BACKEND,
    PYTORCH_BACKEND,
    autocomplete_backend_fields,
)
from .compiled import (  # the compiler's results, importable from here too
    AUTOCOMPLETE_HOST,
    AUTOCOMPLETE_IMAGE,
    MANIFEST_FILENAME,
    MANIFEST_FORMAT,
    CompiledModel,
    CompiledRepository,
)
from .discover import ModelDirectory, find_model_file, list_models, missing_specific_versions, select_versions
from .ensemble import resolve_ensembles
from .errors import (
    STAGE_CONFIG,
    STAGE_ENSEMBLE,
    STAGE_LOAD,
    ConfigParseError,
    ModelError,
    RepositoryError,
)
from .model_config import ModelConfig, read_config_file, to_triton_json
from .normalize import Device, NormalizeReport, normalize_instance_groups, normalize_model_config
from .repo_agents import run_repository_agents
from .support import SUPPORTED_BACKENDS, check_supported
from .validate import (
    check_execution_environment,
    check_label_files,
    duplicate_tensor_warnings,
    validate_instance_groups,
    validate_model_config,
    validate_model_io_config,
)
from .warmup import validate_warmup

__all__ = [
    "AUTOCOMPLETE_HOST",
    "AUTOCOMPLETE_IMAGE",
    "MANIFEST_FILENAME",
    "MANIFEST_FORMAT",
    "CompiledModel",
    "CompiledRepository",
    "compile_model",
    "compile_repository",
    "load_model",
    "read_model_config",
]


# --- errors: position and stage -------------------------------------------------------------------


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


def locate(exc: ModelError, model: ModelDirectory, stage: str) -> ModelError:
    """Fill in the model, stage, file and line of an error raised while compiling `model`."""
    if exc.model is None:
        exc.model = model.name
    if exc.stage is None:
        exc.stage = stage
    if exc.file is None and model.has_config:
        exc.file = str(model.config_path)
    if exc.line is None and exc.hint and exc.file == str(model.config_path):
        for token in exc.hint if isinstance(exc.hint, tuple) else (exc.hint,):
            exc.line = _line_of(model.config_path, token)
            if exc.line is not None:
                break
    return exc


# --- config stage ---------------------------------------------------------------------------------


def _read_config(model: ModelDirectory, auto_complete: bool) -> Message:
    absolute = model.config_path.absolute()
    if model.has_config:
        try:
            return read_config_file(model.config_path)
        except ConfigParseError as exc:
            # tritonserver says only this (the protobuf parser's explanation goes to its log).
            raise ModelError(
                f"failed to read text proto from {absolute}",
                file=exc.file,
                line=exc.line,
                column=exc.column,
                detail=exc.message,
            ) from None
    if not auto_complete:
        reason = "Is a directory" if model.config_path.is_dir() else "No such file or directory"
        raise ModelError(
            f"failed to open text file for read {absolute}: {reason}",
            file=str(model.config_path),
            detail="with --disable-auto-complete-config every model needs a config.pbtxt",
        )
    return ModelConfig()


def read_model_config(model: ModelDirectory, auto_complete: bool = True) -> Message:
    """The config stage: what tritonserver does with a model when it polls the repository."""
    try:
        config = _read_config(model, auto_complete)
        if model.has_config:  # tritonserver runs the agents of a config it read, before normalizing it
            run_repository_agents(model.path, config)
        autocomplete_backend_fields(model.name, model.path, config)
        normalize_model_config(config)
        validate_model_config(config)
        if not auto_complete:
            validate_model_io_config(config)
        if config.name != model.name:
            raise ModelError(
                f"unexpected directory name '{model.name}' for model '{config.name}', directory name must "
                "equal model name",
                hint="name",
            )
    except ModelError as exc:
        raise locate(exc, model, STAGE_CONFIG) from None
    return config


# --- load stage -----------------------------------------------------------------------------------


def load_versions(model: ModelDirectory, config: Message, warnings: list[str]) -> list[int]:
    """VersionsToLoad: the versions the policy selects, with tritonserver's log lines as warnings."""
    try:
        scan = model.scan_versions()
        warnings.extend(scan.warnings)
        available = sorted(scan.versions)
        policy = to_triton_json(config)["version_policy"]
        warnings.extend(
            f"version {v} is specified for model '{model.name}', but the version directory is not present"
            for v in missing_specific_versions(available, policy)
        )
        return select_versions(model.name, available, policy)
    except ModelError as exc:
        raise locate(exc, model, STAGE_LOAD) from None


def _defines_auto_complete_config(model_py: Path) -> bool | None:
    """Whether model.py's TritonPythonModel defines `auto_complete_config` (the file is read,
    never run); None when that cannot be told from the source (it does not parse, the class is
    not a plain class statement...)."""
    try:
        tree = ast.parse(model_py.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "TritonPythonModel"]
    if len(classes) != 1 or classes[0].bases:
        return None
    return any(
        isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "auto_complete_config"
        for item in classes[0].body
    )


def _check_python_source(model: ModelDirectory, model_files: dict[int, str]) -> None:
    """What tritonserver's python stub hits when it imports model.py, found without running it:
    a syntax error, or no `TritonPythonModel` at module level. The messages are the stub's
    (module `<version>.model`), with the file and line."""
    for version, relative in sorted(model_files.items()):
        path = model.path / relative
        try:
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source, filename=path.name)
        except SyntaxError as exc:
            raise ModelError(
                f"SyntaxError: {exc.msg} ({path.name}, line {exc.lineno})",
                file=str(path), line=exc.lineno, column=exc.offset,
                detail=f"model.py of version {version} cannot be imported",
            ) from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise ModelError(f"failed to read {path}: {exc}", file=str(path)) from None
        names: set[str] = set()
        star_import = False
        for node in tree.body:
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    star_import |= alias.name == "*"
                    names.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                star_import = True  # definitions under a condition: cannot tell without running it
        if "TritonPythonModel" not in names and not star_import:
            raise ModelError(
                f"AttributeError: module '{version}.model' has no attribute 'TritonPythonModel'",
                file=str(path),
                detail="model.py must define class TritonPythonModel",
            )


def _python_auto_complete(model: ModelDirectory, config: Message, versions: list[int], where: str) -> str | None:
    """The python backend's auto-complete: model.py's `auto_complete_config` (python_autocomplete.py
    runs it in a process of its own). Without one, tritonserver keeps the config as it is, so a
    model.py that plainly has none is not started.

    With `where` AUTOCOMPLETE_IMAGE, a model whose auto_complete_config imports a module that is
    not installed here is left for the image build (its requirements.txt is installed there):
    the reason is returned and `config` is unchanged."""
    version_dir = model.version_path(max(versions))
    model_py = version_dir / (config.default_model_filename or "model.py")
    if not model_py.is_file() or _defines_auto_complete_config(model_py) is not True:
        # A missing model.py is reported with the model files; one that does not parse or has
        # no plain TritonPythonModel class fails when its instances load (the stub's error):
        # user code runs at build time only when auto_complete_config needs it.
        return None
    from . import python_autocomplete

    try:
        python_autocomplete.autocomplete(config, model.path, version_dir, model_file=model_py)
    except python_autocomplete.MissingDependencyError as exc:
        if where != AUTOCOMPLETE_IMAGE:
            raise
        what = f"'{exc.module}'" if exc.module else "a module"
        return f"its auto_complete_config imports {what}, which is not installed here"
    return None


def load_model(
    model: ModelDirectory,
    config: Message,
    device: Device,
    auto_complete: bool = True,
    versions: list[int] | None = None,
    warnings: list[str] | None = None,
    python_autocomplete: str = AUTOCOMPLETE_HOST,
) -> CompiledModel:
    """The load stage: what tritonserver checks while it loads a model whose config it accepted."""
    warnings = [] if warnings is None else warnings
    try:
        if versions is None:
            versions = load_versions(model, config, warnings)
        if config.platform == ENSEMBLE_PLATFORM:
            return CompiledModel(model.name, model.path, to_triton_json(config), versions, {}, warnings)
        try:
            return _load_backend_model(model, config, device, auto_complete, versions, warnings, python_autocomplete)
        except ModelError as exc:
            if exc.versions is None:
                exc.versions = list(versions)
            raise
    except ModelError as exc:
        raise locate(exc, model, STAGE_LOAD) from None


def _load_backend_model(
    model: ModelDirectory,
    config: Message,
    device: Device,
    auto_complete: bool,
    versions: list[int],
    warnings: list[str],
    python_autocomplete: str = AUTOCOMPLETE_HOST,
) -> CompiledModel:
    backend = config.backend
    servable = backend in SUPPORTED_BACKENDS

    report = NormalizeReport()
    normalize_instance_groups(config, device, report)
    warnings.extend(report.warnings)
    validate_instance_groups(config, set(device.gpus))

    model_files: dict[int, str] = {}

    def find_files() -> None:
        for v in versions:
            path = find_model_file(model, v, config.default_model_filename, backend)
            model_files[v] = path.relative_to(model.path).as_posix()

    signatures: dict[int, Any] = {}

    def read_signatures() -> None:
        libraries = _op_libraries(config, model, warnings)
        for v, f in model_files.items():
            signatures[v] = onnx_autocomplete.read_signature(model.path / f, model.name, libraries)

    deferred: str | None = None  # why auto_complete_config is left for the image build
    if backend == ONNXRUNTIME_BACKEND and auto_complete:
        # The backend's model init reads the model and auto-completes the config.
        find_files()
        read_signatures()
        # Triton auto-completes per loaded version; they share one config, so the newest wins.
        inputs, outputs = signatures[max(signatures)]
        onnx_autocomplete.autocomplete(config, inputs, outputs)
        normalize_model_config(config)
    elif backend == PYTHON_BACKEND:
        find_files()
        _check_python_source(model, model_files)
        if auto_complete:
            deferred = _python_auto_complete(model, config, versions, python_autocomplete)
    elif backend == fil.FIL_BACKEND:
        fil_parameters = fil.read_parameters(config, warnings)  # FIL's model initialisation
    elif backend == PYTORCH_BACKEND:
        torchscript.check_parameters(to_triton_json(config))  # no auto-complete: the config stays as written
    elif backend == OPENVINO_BACKEND:
        from . import openvino_model

        found = openvino_model.find_model_files(model, versions, config.default_model_filename)
        model_files.update({v: p.relative_to(model.path).as_posix() for v, p in found.items()})
        if auto_complete:
            openvino_model.autocomplete(config, found[max(found)], model.name, warnings)
            normalize_model_config(config)

    # A model left for the image build: what depends on its completed inputs and outputs is
    # checked there (handlers/backends/python/complete.py), after auto_complete_config.
    if deferred is None:
        validate_model_io_config(config)
        check_label_files(config, model.path)

    if backend == fil.FIL_BACKEND:
        model_files.update(fil.check_model(model, config, fil_parameters, versions, warnings))
    if servable and not model_files:
        find_files()  # the instances load the model file
    if backend == ONNXRUNTIME_BACKEND:
        if not signatures:
            read_signatures()
        for inputs, outputs in signatures.values():
            onnx_autocomplete.validate_against_model(config, inputs, outputs)
    elif backend == PYTORCH_BACKEND:
        torchscript.check_model(to_triton_json(config), {v: model.path / f for v, f in model_files.items()}, warnings)
    elif backend == OPENVINO_BACKEND:
        from . import openvino_model

        openvino_model.check(config, model, {v: model.path / f for v, f in model_files.items()}, warnings)

    if deferred is None:
        validate_warmup(config, model.path, warnings)
        warnings.extend(duplicate_tensor_warnings(config))
    check_supported(config)
    if backend == PYTHON_BACKEND:
        check_execution_environment(config, model.path)
    if config.sequence_batching.state:
        try:  # the sequence batcher's load-time checks of implicit state and its initial data
            state_specs(to_triton_json(config), model.path)
        except ValueError as exc:
            raise ModelError(str(exc), model=model.name, hint=("initial_state", "state")) from None
    if config.response_cache.enable:
        warnings.append(
            "response_cache is enabled: responses are cached where the server runs with a cache, as with "
            "tritonserver's --cache-config: set TOOLKIT_CACHE_CONFIG=local,size=BYTES in the service "
            "(toolkit serve --cache-config)"
        )

    return CompiledModel(
        name=model.name,
        path=model.path,
        config=to_triton_json(config),
        versions=versions,
        model_files=model_files,
        warnings=warnings,
        autocomplete=AUTOCOMPLETE_IMAGE if deferred else None,
        autocomplete_reason=deferred,
    )


def _op_libraries(config: ModelConfig, model: ModelDirectory, warnings: list[str]) -> list[Path]:
    """An ONNX model's custom-op libraries (`model_operations`) as its instances will register
    them (handlers/backends/onnxruntime.py, `op_libraries`), with a warning for each that is not a
    file here: the image must then provide it at that path."""
    names = list(config.model_operations.op_library_filename)
    found = op_libraries({"model_operations": {"op_library_filename": names}}, model.path)
    for name, path in zip(names, found):
        if not Path(path).is_file():
            warnings.append(
                f"custom-op library '{name}' of model '{model.name}' (model_operations) is not a file on this machine: "
                "the image must provide it there; a library kept in the model's directory and named relative to it "
                "is copied with the model"
            )
    return [Path(p) for p in found]


def compile_model(model: ModelDirectory, device: Device, auto_complete: bool = True) -> CompiledModel:
    """Compile one (non-ensemble) model directory, raising `ModelError` at the first problem."""
    config = read_model_config(model, auto_complete)
    return load_model(model, config, device, auto_complete)


# --- repository -----------------------------------------------------------------------------------


def _without_deferred_steps(ensembles: dict[str, Message], result: CompiledRepository) -> dict[str, Message]:
    """The ensemble configs to resolve: an ensemble's steps that call a model left for the image
    build are left out of the copy that is checked here (their tensors are checked in the image,
    against the completed config); the other steps, dependencies and versions are checked here.
    Steps that require a version the model does not load stay, so that error is reported here."""
    deferred = {n for n, m in result.models.items() if m.autocomplete == AUTOCOMPLETE_IMAGE}
    checked: dict[str, Message] = {}
    for name, config in ensembles.items():
        steps = config.ensemble_scheduling.step
        strip = {s.model_name for s in steps if s.model_name in deferred} - {
            s.model_name
            for s in steps
            if s.model_name in deferred and s.model_version != -1
            and s.model_version not in result.models[s.model_name].versions
        }
        if not strip:
            checked[name] = config
            continue
        copy = ModelConfig()
        copy.CopyFrom(config)
        del copy.ensemble_scheduling.step[:]
        copy.ensemble_scheduling.step.extend(s for s in steps if s.model_name not in strip)
        checked[name] = copy
    return checked


def compile_repository(
    root: Path | str,
    models: Iterable[str] | None = None,
    device: Device | str = "cpu",
    auto_complete: bool = True,
    python_autocomplete: str = AUTOCOMPLETE_HOST,
) -> CompiledRepository:
    """Compile a repository. `models` mirrors tritonserver's `--load-model` (explicit mode):
    only those models, plus the composing models of selected ensembles (nested ones too).

    `python_autocomplete`: AUTOCOMPLETE_HOST runs python models' auto_complete_config here, and a
    module it cannot import is an error (`toolkit validate`, `serve`); AUTOCOMPLETE_IMAGE (`toolkit
    build`) leaves such models for the image build, marked `"autocomplete": "image"` in the
    manifest, and skips the checks that need their completed inputs and outputs: IO, label files
    and warmup (CompiledModel.autocomplete), and the tensors that ensembles exchange with them.
    The image build's completion step runs those (handlers/backends/python/complete.py)."""
    root = Path(root)
    if isinstance(device, str):
        device = Device.parse(device)
    if python_autocomplete not in (AUTOCOMPLETE_HOST, AUTOCOMPLETE_IMAGE):
        raise ValueError(f"python_autocomplete must be '{AUTOCOMPLETE_HOST}' or '{AUTOCOMPLETE_IMAGE}', not {python_autocomplete!r}")
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

    # Config stage for every selected model; ensembles pull in their composing models.
    configs: dict[str, Message] = {}
    pending = list(wanted)
    seen: set[str] = set()
    while pending:
        name = pending.pop(0)
        if name in seen:
            continue
        seen.add(name)
        result.selected.append(name)
        try:
            config = read_model_config(directories[name], auto_complete)
        except ModelError as exc:
            result.failures[name] = exc
            continue
        configs[name] = config
        if config.platform == ENSEMBLE_PLATFORM:
            for step in config.ensemble_scheduling.step:
                if step.model_name in directories and step.model_name not in seen:
                    pending.append(step.model_name)

    # Load stage of the other models.
    for name in result.selected:
        config = configs.get(name)
        if config is None or config.platform == ENSEMBLE_PLATFORM:
            continue
        try:
            result.models[name] = load_model(
                directories[name], config, device, auto_complete, python_autocomplete=python_autocomplete
            )
        except ModelError as exc:
            result.failures[name] = exc

    # Ensembles: dependency graph, composing models, then their own load.
    ensembles = {n: c for n, c in configs.items() if c.platform == ENSEMBLE_PLATFORM}
    checked = _without_deferred_steps(ensembles, result)

    def load_ensemble(name: str, warnings: list[str]) -> CompiledModel:
        if checked[name] is not configs[name]:  # resolve_ensembles set the policy on the copy it checked
            configs[name].model_transaction_policy.CopyFrom(checked[name].model_transaction_policy)
        return load_model(directories[name], configs[name], device, auto_complete, warnings=warnings)

    resolve_ensembles(result, checked, set(configs), load_ensemble)
    for name, error in result.failures.items():
        if error.stage == STAGE_ENSEMBLE:
            locate(error, directories[name], STAGE_ENSEMBLE)
    return result
