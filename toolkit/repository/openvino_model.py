"""What Triton's openvino backend does with a model when it loads it, checked at build time.

Mirrors triton-inference-server/openvino_backend (src/openvino.cc):

* `find_model_files`: ModelState::ReadModel's file check, per version;
* `autocomplete`: ModelState::AutoCompleteConfig (enabled unless --disable-auto-complete-config):
  max_batch_size and dynamic_batching from the model's layouts (a model batches when every input
  and output layout has a batch dimension 'N'), inputs and outputs from the model where the
  config has none;
* `check`: each instance's checks, with the backend's messages: KIND_CPU only, the model read by
  OpenVINO, the parameters, the config's inputs and outputs against the model
  (ValidateConfigureModel). The checks are the runtime's own (handlers/backends/openvino.py), run
  on this machine's OpenVINO, which the `openvino` extra installs.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf.message import Message

from handlers.backends.openvino import (
    DEFAULT_MODEL_FILENAME,
    ELEMENT_CONFIG_TYPES,
    OpenVINOError,
    openvino,
    parse_settings,
    prepare_model,
    read_model,
)

from .discover import ModelDirectory
from .errors import CODE_INTERNAL, CODE_INVALID_ARG, ModelError
from .model_config import DataType, ModelInstanceGroup, to_triton_json
from .onnx_autocomplete import DEFAULT_MAX_BATCH_SIZE

CODE_UNAVAILABLE = "Unavailable"
_CODES = {"INVALID_ARG": CODE_INVALID_ARG, "INTERNAL": CODE_INTERNAL, "UNAVAILABLE": CODE_UNAVAILABLE}
# Model formats OpenVINO reads that the image does not carry a reader (frontend) for.
IMAGE_FORMATS = (".xml", ".onnx")


def _error(exc: OpenVINOError, model_name: str, file: Path | None = None, hint: str | None = None) -> ModelError:
    return ModelError(exc.message, model=model_name, file=str(file) if file else None, hint=hint, code=_CODES[exc.code])


def model_path(model: ModelDirectory, version: int, filename: str) -> Path:
    return model.version_path(version) / (filename or DEFAULT_MODEL_FILENAME)


def find_model_files(model: ModelDirectory, versions: list[int], filename: str) -> dict[int, Path]:
    """The model file of each version ("unable to find '<path>' for model '<name>'")."""
    files = {}
    for version in versions:
        path = model_path(model, version, filename)
        if not path.exists():
            raise ModelError(
                f"unable to find '{path}' for model '{model.name}'",
                model=model.name,
                file=str(path),
                code=CODE_UNAVAILABLE,
                detail=f"version {version} of an openvino model needs '{filename or DEFAULT_MODEL_FILENAME}' "
                "(an IR: model.xml with model.bin beside it; or set default_model_filename, e.g. \"model.onnx\")",
            )
        if path.suffix not in IMAGE_FORMATS:
            raise ModelError(
                f"model '{model.name}': '{path.name}' is not an OpenVINO IR (.xml) or ONNX (.onnx) file; the images "
                "carry OpenVINO's IR and ONNX readers only",
                model=model.name,
                file=str(path),
                hint="default_model_filename",
                detail="convert the model to IR once (ovc MODEL, or openvino.convert_model + openvino.save_model) "
                "and serve model.xml",
            )
        files[version] = path
    return files


def _read(path: Path, model_name: str):
    try:
        ov = openvino()
    except OpenVINOError as exc:
        raise ModelError(
            f"model '{model_name}' uses backend 'openvino': reading it needs the OpenVINO runtime on this machine",
            model=model_name,
            detail=exc.message,
        ) from None
    try:
        return read_model(ov.Core(), path, model_name)
    except OpenVINOError as exc:
        raise _error(exc, model_name, path) from None


def _has_batch(port) -> bool:
    from openvino import layout_helpers

    return layout_helpers.has_batch(layout_helpers.get_layout(port))


def _add_io(config: Message, target, ports) -> None:
    for port in ports:
        io = target.add()
        io.name = port.get_any_name()
        io.data_type = DataType.Value(ELEMENT_CONFIG_TYPES.get(port.get_element_type().get_type_name(), "TYPE_INVALID"))
        shape = port.get_partial_shape()
        dims = [d.get_length() if d.is_static else -1 for d in shape] if shape.rank.is_static else [-1]
        io.dims.extend(dims[1:] if config.max_batch_size > 0 else dims)


def autocomplete(config: Message, path: Path, model_name: str, warnings: list[str]) -> None:
    """ModelState::AutoCompleteConfig on the model at `path` (the newest version's)."""
    model = _read(path, model_name)
    inputs, outputs = list(model.inputs), list(model.outputs)
    if all(_has_batch(port) for port in [*inputs, *outputs]):
        if config.max_batch_size == 0:
            config.max_batch_size = max(DEFAULT_MAX_BATCH_SIZE, 1)
            warnings.append(
                f"autofilled max_batch_size to {config.max_batch_size} for model '{model_name}' since batching is "
                "supported but no max_batch_size is specified in model configuration. Must specify max_batch_size to "
                "utilize autofill with a larger max batch size"
            )
        if config.max_batch_size > 1 and not (config.HasField("dynamic_batching") or config.HasField("sequence_batching")):
            config.dynamic_batching.SetInParent()
    elif config.max_batch_size != 0:
        warnings.append(
            f"model layout for model {model_name} does not support batching while non-zero max_batch_size is specified"
        )
    if len(config.input) == 0:
        _add_io(config, config.input, inputs)
    if len(config.output) == 0:
        _add_io(config, config.output, outputs)


def check(config: Message, model: ModelDirectory, files: dict[int, Path], warnings: list[str]) -> None:
    """The instances' checks (ModelInstanceState), for every version."""
    for group in config.instance_group:
        if group.kind != ModelInstanceGroup.KIND_CPU:
            raise ModelError(
                f"unable to load model '{model.name}', Triton OpenVINO backend supports only Kind CPU and AUTO",
                model=model.name,
                hint="kind",
                detail="OpenVINO runs on the CPU here: use instance_group { kind: KIND_CPU }",
            )
    data = to_triton_json(config)
    try:
        settings = parse_settings(data)
    except OpenVINOError as exc:
        raise _error(exc, model.name, hint="parameters") from None
    if settings.target_device not in ("CPU", "AUTO") and not settings.target_device.startswith(("HETERO:CPU", "MULTI:CPU")):
        warnings.append(
            f"model '{model.name}' sets TARGET_DEVICE {settings.target_device}: serverless platforms have no Intel GPU "
            "or NPU, so it loads only where that device exists (CPU is the default)"
        )
    if settings.cpu_extension_path and not Path(settings.cpu_extension_path).is_absolute():
        extension = model.path / settings.cpu_extension_path
        if not extension.is_file():
            raise ModelError(
                f"CPU_EXTENSION_PATH '{settings.cpu_extension_path}' of model '{model.name}' does not exist "
                f"('{extension}'; a relative path is relative to the model directory)",
                model=model.name,
                hint="CPU_EXTENSION_PATH",
            )
    for version, path in sorted(files.items()):
        ov_model = _read(path, model.name)
        try:
            prepare_model(ov_model, data, settings, model.name)
        except OpenVINOError as exc:
            raise _error(exc, model.name) from None  # the config against the model: config.pbtxt
