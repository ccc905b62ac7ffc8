"""Compile-time checks of `backend: "fil"` models: what Triton's FIL backend checks when it
loads one (its parameters, the model file of each version, Treelite's loading), plus what it
leaves to fail on every request (tensor names, data types, feature and value counts; see
handlers/backends/fil/tensors.py). The rules live in handlers/backends/fil; this module runs them
on a model directory (each model file loaded in a child process: handlers/backends/fil/probe.py)
and turns their errors into ModelErrors with the config line.
"""

from __future__ import annotations

from google.protobuf.message import Message

from handlers.backends.fil.errors import FilModelError
from handlers.backends.fil.model import model_path
from handlers.backends.fil.parameters import FilParameters, parse_parameters
from handlers.backends.fil.probe import probe
from handlers.backends.fil.tensors import tensor_layout

from .discover import ModelDirectory
from .errors import ModelError
from .model_config import to_triton_json

FIL_BACKEND = "fil"


def _model_error(exc: FilModelError) -> ModelError:
    return ModelError(exc.message, code=exc.code, hint=exc.key, detail=exc.detail,
                      file=exc.file if exc.key is None else None)


def read_parameters(config: Message, warnings: list[str]) -> FilParameters:
    """FIL's model initialisation: the parameters (its first errors), notes as warnings."""
    try:
        params = parse_parameters(to_triton_json(config))
    except FilModelError as exc:
        raise _model_error(exc) from None
    warnings.extend(params.notes)
    return params


def check_model(model: ModelDirectory, config: Message, params: FilParameters, versions: list[int],
                warnings: list[str]) -> dict[int, str]:
    """Each version's model file, loaded with Treelite and checked against the config; returns
    version -> model file relative to the model directory."""
    data = to_triton_json(config)
    try:
        layout = tensor_layout(data)
    except FilModelError as exc:
        raise _model_error(exc) from None
    for name in layout.ignored_inputs:
        warnings.append(f"input '{name}' is not read by the fil backend (it reads input__0 only), yet requests must send it")
    for name in layout.ignored_outputs:
        warnings.append(f"output '{name}' is never produced by the fil backend (it writes output__0 only)")
    if any(g.kind == g.KIND_GPU for g in config.instance_group):
        warnings.append("KIND_GPU instances of the fil backend predict on the CPU here (Treelite's GTIL)")
    files: dict[int, str] = {}
    for version in versions:
        path = model_path(model.version_path(version), config.default_model_filename, params.model_type)
        try:
            probe(data, path)  # Treelite reads the file in a process of its own (probe.py)
        except FilModelError as exc:
            raise _model_error(exc) from None
        files[version] = path.relative_to(model.path).as_posix()
    return files
