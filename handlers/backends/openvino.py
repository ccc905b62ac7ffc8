"""OpenVINO backend: Triton's openvino_backend, run by the OpenVINO runtime (PyPI `openvino`).

A model is an IR, `model.xml` with its weights `model.bin` beside it (the default file name), or
any other file OpenVINO reads, e.g. `default_model_filename: "model.onnx"`. As in the backend
(openvino_backend src/openvino.cc):

- one `ov.Core` and one compiled model per model version, shared by its instances; each instance
  has its own infer request, so `instance_group { count: N }` puts N requests in flight on the
  streams the compiled model has (NUM_STREAMS / PERFORMANCE_HINT decide those);
- the config's data types may differ from the model's: the model converts them
  (PrePostProcessor), as the backend's ValidateInputs / ValidateOutputs do;
- `parameters`: PERFORMANCE_HINT, NUM_STREAMS, INFERENCE_NUM_THREADS, COMPILATION_NUM_THREADS and
  HINT_BF16 are set on the target device; SKIP_OV_DYNAMIC_BATCHSIZE (the auto-batching hint),
  ENABLE_BATCH_PADDING, RESHAPE_IO_LAYERS, TARGET_DEVICE and CPU_EXTENSION_PATH as the backend
  reads them, with its messages for values it refuses;
- KIND_CPU instances only;
- CPU threads: INFERENCE_NUM_THREADS where the config sets it (the CPU budget's
  `explicit_threads` hook reports each instance's part); otherwise the CPU budget's shares of
  the version's instances together (handlers/cpu_budget.py), where Triton leaves OpenVINO's
  default (every core).

Batching (max_batch_size > 0): the backend compiles the model for exactly max_batch_size and
fails every execution of another batch size unless ENABLE_BATCH_PADDING pads it. Here the batch
dimension is compiled as [1, max_batch_size], so every batch the batcher forms runs as it is;
with ENABLE_BATCH_PADDING the model is compiled for max_batch_size and smaller batches are padded
with zeros, as the backend does (docs/triton-compatibility.md lists both).

`read_model`, `parse_settings` and `prepare_model` are also the build's checks
(toolkit/repository/openvino_model.py): one implementation of each rule.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..batching.merge import (
    batch_responses, batch_sizes, merge_inputs, refuse_alone, requested_output_names, run_batch, split_outputs, stamp_compute,
)
from ..errors import InferenceError, internal, invalid_argument
from ..inference import InferOutcome, InferRequest
from ..manifest import ModelSpec

log = logging.getLogger("handlers.openvino")

DEFAULT_MODEL_FILENAME = "model.xml"
INVALID_ARG = "INVALID_ARG"
INTERNAL = "INTERNAL"
UNAVAILABLE = "UNAVAILABLE"

# Config data types the backend maps to OpenVINO element types (openvino_utils.cc); FP64, BF16
# and BYTES are refused ("unsupported datatype").
CONFIG_ELEMENTS = {
    "TYPE_BOOL": "boolean", "TYPE_UINT8": "u8", "TYPE_UINT16": "u16", "TYPE_UINT32": "u32",
    "TYPE_UINT64": "u64", "TYPE_INT8": "i8", "TYPE_INT16": "i16", "TYPE_INT32": "i32",
    "TYPE_INT64": "i64", "TYPE_FP16": "f16", "TYPE_FP32": "f32",
}
ELEMENT_CONFIG_TYPES = {element: config for config, element in CONFIG_ELEMENTS.items()}

# Parameters set on the device (ModelState::ParseParameters(device)), in the backend's order.
DEVICE_PARAMETERS = ("INFERENCE_NUM_THREADS", "COMPILATION_NUM_THREADS", "HINT_BF16", "NUM_STREAMS", "PERFORMANCE_HINT")
_OV_LOCATION = re.compile(r"^(Exception from \S+|Check '.*' failed at \S+)$")


class OpenVINOError(Exception):
    """The model cannot be loaded as configured. `code` is the backend's TRITONSERVER error code."""

    def __init__(self, message: str, code: str = INVALID_ARG) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def openvino():
    """The `openvino` module, or a clear error where it is not installed."""
    try:
        import openvino as ov
    except ImportError as exc:
        raise OpenVINOError(
            "the OpenVINO runtime is not installed: pip install 'triton-serverless-toolkit[openvino]' "
            "(toolkit build puts it into the images of repositories with openvino models)",
            UNAVAILABLE,
        ) from exc
    return ov


def ov_message(exc: BaseException) -> str:
    """OpenVINO's exception text without its source-location lines ("Exception from src/...:84:")."""
    lines = [line.strip() for line in str(exc).splitlines()]
    kept = [line for line in lines if line and not _OV_LOCATION.match(line.rstrip(":").rsplit(":", 1)[0])]
    return " ".join(kept) or str(exc).strip() or type(exc).__name__


def _openvino_error(what: str, exc: BaseException) -> OpenVINOError:
    # RETURN_IF_OPENVINO_ERROR's message: "openvino error in <what> : <exception>"
    return OpenVINOError(f"openvino error in {what} : {ov_message(exc)}", INTERNAL)


# -- parameters ------------------------------------------------------------------------------------


def _parameter(config: dict, key: str) -> str:
    value = config.get("parameters", {}).get(key)
    if value is None:
        return ""
    return value.get("string_value", "") if isinstance(value, dict) else str(value)


@dataclass(frozen=True)
class Settings:
    """The backend's parameters, read as ModelState::ParseParameters reads them."""

    skip_dynamic_batch_size: bool = False
    batch_padding: bool = False
    reshape_io_layers: bool = False
    target_device: str = "CPU"
    cpu_extension_path: str = ""
    device_properties: tuple[tuple[str, str], ...] = ()  # (parameter, lower-cased value), checked


def _non_negative(key: str, value: str) -> None:
    if not value.isdigit() or not value.isascii():
        raise OpenVINOError(f"expected the parameter '{key}' to be a non-negative number, got {value}")
    if int(value) > 2**31 - 1:  # std::stoi throws here: tritonserver reports an unknown exception
        raise OpenVINOError(f"expected the parameter '{key}' to be a non-negative number, got {value} (out of range)")


def _check_device_parameter(key: str, value: str) -> None:
    """ParseParameterHelper: the values each device parameter takes (value lower-cased)."""
    if key in ("INFERENCE_NUM_THREADS", "COMPILATION_NUM_THREADS"):
        _non_negative(key, value)
    elif key == "HINT_BF16":
        if value != "yes":
            raise OpenVINOError(f"expected the parameter '{key}' to be YES, got {value}")
    elif key == "NUM_STREAMS":
        if value not in ("auto", "numa") and not (value.isdigit() and value.isascii()):
            raise OpenVINOError(f"expected the parameter '{key}' to be either AUTO/NUMA/<int_value>, got {value}")
        if value.isdigit():
            _non_negative(key, value)
    elif key == "PERFORMANCE_HINT":
        if value not in ("latency", "throughput", "cumulative_throughput"):
            raise OpenVINOError(
                f"expected the parameter '{key}' to be LATENCY/THROUGHPUT/CUMULATIVE_THROUGHPUT, got {value}"
            )


def parse_settings(config: dict) -> Settings:
    """The backend's parameters; a value it refuses raises OpenVINOError with its message."""
    yes = {key: _parameter(config, key).lower() == "yes" for key in (
        "SKIP_OV_DYNAMIC_BATCHSIZE", "ENABLE_BATCH_PADDING", "RESHAPE_IO_LAYERS")}
    properties = []
    for key in DEVICE_PARAMETERS:
        value = _parameter(config, key).lower()
        if value:
            _check_device_parameter(key, value)
            properties.append((key, value))
    return Settings(
        skip_dynamic_batch_size=yes["SKIP_OV_DYNAMIC_BATCHSIZE"],
        batch_padding=yes["ENABLE_BATCH_PADDING"],
        reshape_io_layers=yes["RESHAPE_IO_LAYERS"],
        target_device=_parameter(config, "TARGET_DEVICE").upper() or "CPU",
        cpu_extension_path=_parameter(config, "CPU_EXTENSION_PATH"),
        device_properties=tuple(properties),
    )


def explicit_threads(config: dict) -> int | None:
    """The CPU budget's hook (handlers/cpu_budget.py): the threads one instance uses because the
    config sets INFERENCE_NUM_THREADS. The version's instances share one compiled model, which
    uses that many threads for all of them together."""
    value = _parameter(config, "INFERENCE_NUM_THREADS").strip()
    if not (value.isdigit() and value.isascii()) or int(value) == 0:
        return None  # unset, or 0 (OpenVINO's default): the budget decides
    from ..instance_group import instance_slots

    count = max(1, len(instance_slots(config)))
    return max(1, -(-int(value) // count))


def device_properties(settings: Settings) -> dict:
    """The OpenVINO properties of `settings.device_properties` (ov::Core::set_property)."""
    ov = openvino()
    import openvino.properties as props
    import openvino.properties.hint as hints

    pairs = []
    for key, value in settings.device_properties:
        if key == "INFERENCE_NUM_THREADS":
            pairs.append(props.inference_num_threads(int(value)))
        elif key == "COMPILATION_NUM_THREADS":
            pairs.append(props.compilation_num_threads(int(value)))
        elif key == "HINT_BF16":
            pairs.append(hints.inference_precision(ov.Type.bf16))
        elif key == "NUM_STREAMS":
            number = {"auto": props.streams.Num.AUTO, "numa": props.streams.Num.NUMA}.get(value)
            pairs.append(props.streams.num(number if number is not None else props.streams.Num(int(value))))
        elif key == "PERFORMANCE_HINT":
            mode = {"latency": "LATENCY", "throughput": "THROUGHPUT", "cumulative_throughput": "CUMULATIVE_THROUGHPUT"}
            pairs.append(hints.performance_mode(getattr(hints.PerformanceMode, mode[value])))
    return dict(pairs)


# -- reading and preparing the model ---------------------------------------------------------------


def read_model(core: Any, path: Path, model_name: str) -> Any:
    """ModelState::ReadModel: the model file must exist; OpenVINO reads it (an IR's weights come
    from the .bin file of the same name)."""
    path = Path(path)
    if not path.exists():
        raise OpenVINOError(f"unable to find '{path}' for model '{model_name}'", UNAVAILABLE)
    try:
        return core.read_model(str(path))
    except Exception as exc:  # noqa: BLE001 - OpenVINO raises RuntimeError and its own types
        error = _openvino_error("reading model", exc)
        weights = path.with_suffix(".bin")
        if path.suffix == ".xml" and not weights.exists():
            error.message += (
                f" (the IR's weights file '{weights.name}' is missing beside '{path.name}': an IR is the .xml file "
                "and its .bin file, both written by openvino.save_model or ovc)"
            )
            error.args = (error.message,)
        raise error from None


def tensor_names(ports) -> dict[str, Any]:
    """Every name of every port (a tensor may have several) -> the port."""
    found: dict[str, Any] = {}
    for port in ports:
        for name in sorted(port.get_names()):
            found.setdefault(name, port)
    return found


def signed_shape(shape) -> list[int]:
    """ConvertToSignedShape: dynamic dimensions as -1."""
    return [d.get_length() if d.is_static else -1 for d in shape]


def _shape_text(dims) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _matches(dim, value: int) -> bool:
    """A model dimension against a config dimension: static ones are equal; a dynamic one takes
    -1 or any size within its bounds (the backend's doesMatch, with inclusive bounds)."""
    if dim.is_static:
        return dim.get_length() == value
    if value == -1:
        return True
    high = dim.get_max_length()
    return dim.get_min_length() <= value and (high < 0 or value <= high)


def compare_dims(model_name: str, name: str, shape, dims: list[int], max_batch_size: int, exact: bool) -> None:
    """CompareDimsSupported: the config's dims (with the batch dimension when batching) against
    the model's; inputs skip the batch dimension and the config's -1 (`exact` False)."""
    if shape.rank.is_dynamic:
        return  # any rank: OpenVINO checks each request's shape
    model_dims = signed_shape(shape)
    if max_batch_size > 0:
        if not model_dims:
            raise OpenVINOError(
                f"model '{model_name}', tensor '{name}': for the model to support batching the shape should "
                "have at least 1 dimension"
            )
        full = [max_batch_size, *dims]
        ok = len(model_dims) == len(full) and all(
            _matches(shape[i], full[i]) for i in range(len(full)) if exact or (i != 0 and full[i] != -1)
        )
        if not ok:
            raise OpenVINOError(
                f"model '{model_name}', tensor '{name}': the model expects {len(model_dims)} dimensions (shape "
                f"{_shape_text(model_dims)}) but the model configuration specifies {len(full)} dimensions (an initial "
                "batch dimension because max_batch_size > 0 followed by the explicit tensor shape, making complete "
                f"shape {_shape_text(full)})"
            )
    else:
        ok = len(model_dims) == len(dims) and all(_matches(shape[i], dims[i]) for i in range(len(dims)))
        if not ok:
            raise OpenVINOError(
                f"model '{model_name}', tensor '{name}': the model expects {len(model_dims)} dimensions (shape "
                f"{_shape_text(model_dims)}) but the model configuration specifies {len(dims)} dimensions (shape "
                f"{_shape_text(dims)})"
            )


def _configured_dims(io: dict) -> list[int]:
    """The dims the model sees: `reshape.shape` when the config has a reshape, else `dims`."""
    if "reshape" in io:
        return [int(d) for d in io["reshape"].get("shape", [])]
    return [int(d) for d in io.get("dims", [])]


def _element(ov, io: dict, kind: str, model_name: str):
    name = CONFIG_ELEMENTS.get(io.get("data_type", ""))
    if name is None:
        raise OpenVINOError(
            f"unsupported datatype {io.get('data_type', 'TYPE_INVALID')} for {kind} '{io['name']}' for model "
            f"'{model_name}'",
            INTERNAL,
        )
    return getattr(ov.Type, name)


@dataclass
class PreparedModel:
    """A model read and configured as the config says, ready to compile."""

    model: Any  # ov.Model
    static_batch: bool  # compiled for exactly max_batch_size; smaller batches are padded


def prepare_model(model: Any, config: dict, settings: Settings, model_name: str) -> PreparedModel:
    """ValidateConfigureModel: the config's inputs and outputs against the model (count, names,
    data types, dims), the data-type conversions the config asks for, the IO reshape
    (RESHAPE_IO_LAYERS) and the batch dimension. Raises OpenVINOError with the backend's messages."""
    ov = openvino()
    from openvino.preprocess import PrePostProcessor

    inputs = config.get("input", [])
    outputs = config.get("output", [])
    max_batch = int(config.get("max_batch_size", 0))
    model_inputs = list(model.inputs)
    if len(model_inputs) != len(inputs):
        raise OpenVINOError(
            f"unable to load model '{model_name}', configuration expects {len(inputs)} inputs, model provides "
            f"{len(model_inputs)}"
        )
    by_name = tensor_names(model_inputs)
    allowed = ", ".join(sorted(p.get_any_name() for p in model_inputs))
    ppp = PrePostProcessor(model)
    shapes: dict[str, Any] = {}
    for io in inputs:
        name = io["name"]
        port = by_name.get(name)
        if port is None:
            raise OpenVINOError(f"unexpected inference input '{name}', allowed inputs are: {allowed}")
        element = _element(ov, io, "input", model_name)
        try:
            ppp.input(name).tensor().set_element_type(element)
        except Exception as exc:  # noqa: BLE001
            raise _openvino_error(f"setting precision for {name}", exc) from None
        dims = _configured_dims(io)
        shape = port.get_partial_shape()
        if settings.reshape_io_layers:
            if any(d != -1 and d <= 0 for d in dims):
                raise OpenVINOError(
                    "openvino backend does not support dimensions values other than `-1` or positive integers", INTERNAL
                )
            batch = [ov.Dimension()] if max_batch > 0 else []
            shape = ov.PartialShape(batch + [ov.Dimension() if d == -1 else ov.Dimension(d) for d in dims])
        else:
            compare_dims(model_name, name, shape, dims, max_batch, exact=False)
        shapes[name] = shape
    try:
        model = ppp.build()
    except Exception as exc:  # noqa: BLE001
        raise _openvino_error("apply model input preprocessing", exc) from None

    static_batch = max_batch > 0 and settings.batch_padding
    if max_batch > 0 or settings.reshape_io_layers:
        new_shapes = {}
        for name, shape in shapes.items():
            dims = list(shape) if shape.rank.is_static else None
            if max_batch > 0 and dims:
                dims[0] = ov.Dimension(max_batch) if static_batch else ov.Dimension(1, max_batch)
            new_shapes[name] = ov.PartialShape(dims) if dims is not None else shape
        what = "setting max batch size" if max_batch > 0 else "reshaping IO layers"
        try:
            model.reshape(new_shapes)
        except Exception as exc:  # noqa: BLE001
            error = _openvino_error(what, exc)
            if max_batch > 0 and not static_batch:
                error.message += (
                    f" (the model's batch dimension cannot vary from 1 to max_batch_size {max_batch}: set parameter "
                    "ENABLE_BATCH_PADDING to YES to compile it for exactly max_batch_size and pad smaller batches)"
                )
                error.args = (error.message,)
            raise error from None

    model_outputs = list(model.outputs)
    out_by_name = tensor_names(model_outputs)
    allowed = ", ".join(sorted(p.get_any_name() for p in model_outputs))
    ppp = PrePostProcessor(model)
    for io in outputs:
        name = io["name"]
        port = out_by_name.get(name)
        if port is None:
            raise OpenVINOError(f"unexpected inference output '{name}', allowed outputs are: {allowed}")
        element = _element(ov, io, "output", model_name)
        try:
            ppp.output(name).tensor().set_element_type(element)
        except Exception as exc:  # noqa: BLE001
            raise _openvino_error(f"setting precision for {name}", exc) from None
        compare_dims(model_name, name, port.get_partial_shape(), _configured_dims(io), max_batch, exact=True)
    try:
        model = ppp.build()
    except Exception as exc:  # noqa: BLE001
        raise _openvino_error("apply model output preprocessing", exc) from None
    return PreparedModel(model, static_batch)


# -- the compiled model, shared by a version's instances ------------------------------------------


class ModelLoadError(Exception):
    """A model instance cannot be created; the message says why."""


@dataclass
class _Compiled:
    compiled: Any  # ov.CompiledModel
    static_batch: bool
    input_shapes: dict[str, Any]  # config input name -> the compiled model's PartialShape
    load_seconds: float
    users: int = 0


_compiled: dict[tuple, _Compiled] = {}
_first_inference = threading.Lock()
_primed = False  # an inference has completed in this process (see OpenVINOInstance._infer)
_compiled_lock = threading.Lock()
_key_locks: dict[tuple, threading.Lock] = {}


def _model_path(spec: ModelSpec, version: int) -> Path:
    path = spec.model_files.get(version)
    if path is None:
        filename = spec.config.get("default_model_filename") or DEFAULT_MODEL_FILENAME
        path = spec.directory / str(version) / filename
    return Path(path)


def compile_model(spec: ModelSpec, version: int, threads: int | None = None) -> _Compiled:
    """Read, check, configure and compile one model version (ModelInstanceState's first instance).
    `threads`: INFERENCE_NUM_THREADS from the CPU budget where the config sets none."""
    ov = openvino()
    started = time.perf_counter()
    config = spec.config
    settings = parse_settings(config)
    core = ov.Core()
    if settings.cpu_extension_path:
        extension = Path(settings.cpu_extension_path)
        if not extension.is_absolute():
            extension = spec.directory / extension  # relative to the model directory (the image's paths differ)
        try:
            core.add_extension(str(extension))
        except Exception as exc:  # noqa: BLE001
            raise _openvino_error(" loading custom CPU extensions", exc) from None
    model = read_model(core, _model_path(spec, version), spec.name)
    prepared = prepare_model(model, config, settings, spec.name)
    device = settings.target_device
    properties = device_properties(settings)
    if threads is not None:
        import openvino.properties as props

        properties.update(dict([props.inference_num_threads(threads)]))
    try:
        if properties:
            core.set_property(device, properties)
    except Exception as exc:  # noqa: BLE001
        raise _openvino_error("configuring openvino core", exc) from None
    import openvino.properties.hint as hints

    auto_batching = int(config.get("max_batch_size", 0)) != 0 and not settings.skip_dynamic_batch_size
    try:
        compiled = core.compile_model(prepared.model, device, dict([hints.allow_auto_batching(auto_batching)]))
    except Exception as exc:  # noqa: BLE001
        error = _openvino_error("loading model", exc)
        if device not in core.available_devices:
            error.message += f" (device '{device}' is not available here; available: {', '.join(core.available_devices)})"
            error.args = (error.message,)
        raise error from None
    by_name = tensor_names(compiled.inputs)
    shapes = {io["name"]: by_name[io["name"]].get_partial_shape() for io in config.get("input", [])}
    return _Compiled(compiled, prepared.static_batch, shapes, time.perf_counter() - started)


def _cache_key(spec: ModelSpec, version: int) -> tuple:
    import json

    return (str(spec.directory), spec.name, version, json.dumps(spec.config, sort_keys=True))


def version_threads(spec: ModelSpec, share: int | None) -> int | None:
    """INFERENCE_NUM_THREADS for a version's compiled model from the CPU budget: its instances'
    shares together (they run on the one compiled model), or None where the config sets the
    parameter (explicit parameters win) or no plan applies."""
    if share is None or _parameter(spec.config, "INFERENCE_NUM_THREADS").strip():
        return None
    from ..instance_group import instance_slots

    return share * max(1, len(instance_slots(spec.config)))


def _acquire(spec: ModelSpec, version: int, share: int | None = None) -> tuple[tuple, _Compiled]:
    key = _cache_key(spec, version)
    with _compiled_lock:
        lock = _key_locks.setdefault(key, threading.Lock())
    with lock:  # the first instance compiles; the others of the version wait for it and share it
        with _compiled_lock:
            entry = _compiled.get(key)
        if entry is None:
            try:
                entry = compile_model(spec, version, version_threads(spec, share))
            except OpenVINOError as exc:
                raise ModelLoadError(exc.message) from None
            with _compiled_lock:
                _compiled[key] = entry
        with _compiled_lock:
            entry.users += 1
    return key, entry


def _release(key: tuple) -> None:
    with _compiled_lock:
        entry = _compiled.get(key)
        if entry is not None:
            entry.users -= 1
            if entry.users <= 0:
                del _compiled[key]
                _key_locks.pop(key, None)


def create_instance(spec: ModelSpec, version: int, slot: Any) -> "OpenVINOInstance":
    """One instance (the backend contract, handlers/backends/__init__.py)."""
    if slot.kind != "KIND_CPU":
        raise ModelLoadError(f"unable to load model '{spec.name}', Triton OpenVINO backend supports only Kind CPU and AUTO")
    return OpenVINOInstance(spec, version, slot.name, getattr(slot, "threads", None))


class OpenVINOInstance:
    """One model instance: an infer request on its version's compiled model, used by one batcher
    worker thread at a time."""

    def __init__(self, spec: ModelSpec, version: int, name: str, threads: int | None = None) -> None:
        started = time.perf_counter()
        self.name = name
        self.kind = "KIND_CPU"
        self.spec = spec
        self.version = version
        self._key, entry = _acquire(spec, version, threads)
        self._closed = False
        try:
            self.request = entry.compiled.create_infer_request()
        except Exception as exc:  # noqa: BLE001
            _release(self._key)
            raise ModelLoadError(f"openvino error in creating infer request object : {ov_message(exc)}") from None
        self.compiled = entry.compiled
        self.static_batch = entry.static_batch
        self._input_shapes = entry.input_shapes
        self.load_seconds = time.perf_counter() - started
        self.inference_threads = self.compiled.get_property("INFERENCE_NUM_THREADS")
        log.info(
            "model '%s' version %d instance %s: OpenVINO inference threads %d (shared by the version's instances)",
            spec.name, version, name, self.inference_threads,
        )
        config = spec.config
        self.max_batch_size = int(config.get("max_batch_size", 0))
        self.batching = self.max_batch_size > 0
        self._output_names = [io["name"] for io in config.get("output", [])]
        self._ports = tensor_names(self.compiled.outputs)
        # per input, (min, max) of each dimension after the batch one (max -1: unbounded); None: any rank
        self._bounds = {name: _dimension_bounds(shape, self.batching) for name, shape in self._input_shapes.items()}

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.request = None
            _release(self._key)

    # -- execution ------------------------------------------------------------------------------

    def execute(self, requests: list[InferRequest]) -> list[InferOutcome]:
        """Run a batch: a request whose shapes the compiled model cannot take is refused alone
        (INVALID_ARG); the others run together (each on its own for a non-batching model)."""
        refused = refuse_alone(requests, self._incompatible, self.execute)
        if refused is not None:
            return refused
        return run_batch(requests, self._run, batching=self.batching)

    def _incompatible(self, request: InferRequest) -> InferenceError | None:
        for name, array in request.inputs.items():
            bounds = self._bounds.get(name)
            if bounds is None:
                continue  # any rank
            dims = array.shape[1:] if self.batching else array.shape  # the batcher checks the batch size
            if len(dims) != len(bounds) or not all(low <= d and (high < 0 or d <= high) for d, (low, high) in zip(dims, bounds)):
                shape = self._input_shapes[name]
                shown = _shape_text(signed_shape(shape)[1:] if self.batching else signed_shape(shape))
                return invalid_argument(
                    f"input '{name}' of model '{self.spec.name}' has shape {_shape_text(array.shape)}, which the "
                    f"OpenVINO model does not take: it expects {shown}"
                    + (" after the batch dimension" if self.batching else "")
                )
        return None

    def _run(self, requests: list[InferRequest]) -> list[InferOutcome]:
        start = time.monotonic_ns()
        try:
            feeds = merge_inputs(requests, batching=self.batching)
        except InferenceError as exc:
            return [exc] * len(requests)
        sizes = batch_sizes(requests, batching=self.batching)
        total = sum(sizes)
        if self.static_batch and total < self.max_batch_size:
            feeds = {name: _pad(array, self.max_batch_size) for name, array in feeds.items()}
        names = requested_output_names(requests, self._output_names)
        input_end = time.monotonic_ns()
        try:
            arrays = self._infer(feeds, names)
        except Exception as exc:  # noqa: BLE001 - OpenVINO raises RuntimeError and its own types
            return [internal(f"openvino error in running inference : {ov_message(exc)}")] * len(requests)
        infer_end = time.monotonic_ns()
        if self.static_batch and total < self.max_batch_size:
            arrays = {name: array[:total] for name, array in arrays.items()}
        try:
            parts = split_outputs(arrays, sizes)
        except ValueError as exc:
            return [internal(f"model '{self.spec.name}': {exc}")] * len(requests)
        outcomes: list[InferOutcome] = list(batch_responses(requests, parts))
        stamp_compute(requests, start, input_end, infer_end, time.monotonic_ns())
        return outcomes

    def _infer(self, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        global _primed
        if not _primed:
            # The process's first inference runs alone: pybind11 initialises its numpy API on the
            # first array OpenVINO converts, and two threads doing that at once deadlock (one
            # waits for the GIL inside the one-time initialisation, the other holds the GIL
            # waiting for it; seen as two instances warming up together never finishing).
            with _first_inference:
                if not _primed:
                    result = self.request.infer(feeds, share_inputs=True)
                    arrays = {name: result[self._ports[name]] for name in names}
                    _primed = True
                    return arrays
        result = self.request.infer(feeds, share_inputs=True)
        return {name: result[self._ports[name]] for name in names}


def _pad(array: np.ndarray, size: int) -> np.ndarray:
    """ENABLE_BATCH_PADDING: zeros after the batch's rows up to max_batch_size."""
    padded = np.zeros((size, *array.shape[1:]), dtype=array.dtype)
    padded[: array.shape[0]] = array
    return padded


def _dimension_bounds(shape, batching: bool) -> tuple[tuple[int, int], ...] | None:
    if shape.rank.is_dynamic:
        return None
    dims = list(shape)[1:] if batching else list(shape)
    return tuple((d.get_length(), d.get_length()) if d.is_static else (d.get_min_length(), d.get_max_length()) for d in dims)
