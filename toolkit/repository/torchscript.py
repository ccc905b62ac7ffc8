"""The pytorch backend's load-time checks (platform `pytorch_libtorch`), run at compile time.

What tritonserver 2.51's pytorch_backend checks while it loads a model, in its order and with its
messages; the rules live in handlers/backends/pytorch/config.py, which the runtime applies too:

1. model init (ModelState::Create): the backend has no auto-complete (tritonserver logs "skipping
   model configuration auto-complete ... not supported for pytorch backend" and keeps the config
   as written), then its parameters (ParseParameters);
2. each instance (ModelInstanceState): the model file of each version (`unable to find ...`),
   `torch.jit.load` (`failed to load model ...`), the forward's arguments against the config's
   inputs (ValidateInputs), the outputs (ValidateOutputs). A config without inputs or outputs is
   refused there.

torch is imported only to open model files. Where it is not installed, what the config alone
decides is still checked, the file is checked to be a TorchScript archive (a zip holding
`constants.pkl`, `data.pkl` and `code/`), and the forward's arguments are left to the image's
start, with a warning saying so.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

from handlers.backends.pytorch.config import (
    DEFAULT_FILENAME,
    INVALID_ARG,
    ConfigError,
    Signature,
    input_layout,
    output_layout,
    parse_parameters,
    return_warning,
)

from .errors import CODE_INTERNAL, CODE_INVALID_ARG, ModelError

_CODES = {INVALID_ARG: CODE_INVALID_ARG}

_NOT_TORCHSCRIPT = (
    "a TorchScript file is what torch.jit.script(model).save(path) or torch.jit.trace(model, example).save(path) "
    "writes; torch.save of a module or a state_dict is not one"
)


def _error(exc: ConfigError, **fields: Any) -> ModelError:
    return ModelError(exc.message, code=_CODES.get(exc.code, CODE_INTERNAL), **fields)


def check_parameters(config: dict[str, Any]) -> None:
    """ModelState::ParseParameters."""
    try:
        parse_parameters(config)
    except ConfigError as exc:
        raise _error(exc, hint="parameters") from None


def model_file(version_dir: Path, filename: str, model_name: str) -> Path:
    """ModelState::LoadModel: the version's file (`default_model_filename`, else model.pt)."""
    path = version_dir / (filename or DEFAULT_FILENAME)
    if not path.is_file():
        raise ModelError(f"unable to find '{path}' for model instance '{model_name}'", model=model_name, file=str(path))
    return path


def _archive_problem(path: Path) -> str | None:
    """Why `path` is not a TorchScript archive (without torch), or None."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError) as exc:
        return f"{path.name} is not a TorchScript archive (not a zip file: {exc})"
    records = {name.split("/", 1)[1] for name in names if "/" in name}
    missing = [r for r in ("constants.pkl", "data.pkl") if r not in records]
    if missing or not any(r.startswith("code/") for r in records):
        what = ", ".join(missing) or "code/"
        return f"{path.name} is a zip file without the TorchScript records ({what} missing)"
    return None


def _signature(path: Path, model_name: str) -> Signature | None:
    """The forward signature as the backend sees it after torch.jit.load (on the CPU here: the
    signature does not depend on the device); None when torch is not installed."""
    try:
        import torch
    except ImportError:
        return None
    from handlers.backends.pytorch.instance import load_module, signature_of

    try:
        module = load_module(torch, path, torch.device("cpu"), True)
    except Exception as exc:  # torch raises RuntimeError for archives it cannot read
        raise ModelError(
            f"failed to load model '{model_name}': {str(exc).splitlines()[0] if str(exc) else exc!r}",
            file=str(path), code=CODE_INTERNAL, detail=_NOT_TORCHSCRIPT,
        ) from None
    return signature_of(module)


def check_model(config: dict[str, Any], model_files: dict[int, Path], warnings: list[str]) -> None:
    """The instances' checks for every version's file (ModelInstanceState's constructor)."""
    name = config.get("name", "")
    without_torch = False
    for version in sorted(model_files):
        path = model_files[version]
        problem = _archive_problem(path)
        if problem is not None:
            raise ModelError(
                f"failed to load model '{name}': {problem}", file=str(path), code=CODE_INTERNAL, detail=_NOT_TORCHSCRIPT
            )
        signature = _signature(path, name)
        without_torch |= signature is None
        notes: list[str] = []
        try:
            input_layout(config, signature, notes)
            output_layout(config, notes)
        except ConfigError as exc:
            hint = ("batch_input",) if exc.message.startswith("batch input") else ("input [", "input:", "output [", "output:")
            raise _error(exc, hint=hint, detail=f"version {version}: {path.name}") from None
        if signature is not None and (note := return_warning(signature, name)) is not None:
            notes.append(note)
        warnings.extend(n for n in notes if n not in warnings)
    if without_torch:
        warnings.append(
            f"torch is not installed here, so the forward of model '{name}' was not read: its arguments are checked "
            "against the config's inputs when the image starts (pip install torch to check them now)"
        )
