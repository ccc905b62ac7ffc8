"""What Triton's onnxruntime backend does with a model's config: auto-complete and IO checks.

Follows triton-inference-server/onnxruntime_backend (`ModelState::AutoCompleteConfig`,
`AutoCompleteMaxBatch`, `AutoCompleteIO`, `ModelInstanceState::ValidateInputs/ValidateOutputs`)
and backend_common's `CompareDimsSupported`, reading the model's signature with the `onnx`
package (graph inputs that are not initializers, symbolic or unknown dimensions as -1).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import Message

from .errors import ModelError
from .model_config import DataType

# Triton's --backend-config=default-max-batch-size default.
DEFAULT_MAX_BATCH_SIZE = 4


@dataclass(frozen=True)
class TensorInfo:
    name: str
    data_type: str  # TYPE_* name, TYPE_INVALID when the ONNX type has no Triton equivalent
    dims: tuple[int, ...]
    optional: bool = False  # a graph input that also has an initializer (a default value)


_ONNX_TO_TRITON = {
    "FLOAT": "TYPE_FP32", "UINT8": "TYPE_UINT8", "INT8": "TYPE_INT8", "UINT16": "TYPE_UINT16",
    "INT16": "TYPE_INT16", "INT32": "TYPE_INT32", "INT64": "TYPE_INT64", "STRING": "TYPE_STRING",
    "BOOL": "TYPE_BOOL", "FLOAT16": "TYPE_FP16", "DOUBLE": "TYPE_FP64", "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64", "BFLOAT16": "TYPE_BF16",
}


def _model_file(path: Path) -> Path:
    """`model.onnx` may be a directory holding `model.onnx` plus external weights."""
    if path.is_dir():
        inner = path / "model.onnx"
        if inner.is_file():
            return inner
        raise ModelError(f"ONNX model directory '{path}' does not contain model.onnx", file=str(path))
    return path


def read_signature(path: Path, model_name: str) -> tuple[list[TensorInfo], list[TensorInfo]]:
    import onnx  # build-time only: never imported by the runtime

    file = _model_file(path)
    try:
        model = onnx.load(str(file), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError and others for corrupt files
        raise ModelError(
            f"failed to load ONNX model '{file}' for model '{model_name}': {exc}", model=model_name, file=str(file)
        ) from None
    initializers = {init.name for init in model.graph.initializer}

    def info(value, optional: bool) -> TensorInfo:
        kind = value.type.WhichOneof("value")
        if kind != "tensor_type":
            return TensorInfo(value.name, "TYPE_INVALID", (), optional)
        tensor = value.type.tensor_type
        elem = onnx.TensorProto.DataType.Name(tensor.elem_type)
        dims: tuple[int, ...] = ()
        if tensor.HasField("shape"):
            dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim)
        return TensorInfo(value.name, _ONNX_TO_TRITON.get(elem, "TYPE_INVALID"), dims, optional)

    inputs = [info(v, v.name in initializers) for v in model.graph.input]
    outputs = [info(v, False) for v in model.graph.output]
    return inputs, outputs


def _shape(dims) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def autocomplete(config: Message, inputs: list[TensorInfo], outputs: list[TensorInfo]) -> None:
    """Fill max_batch_size, dynamic_batching, inputs and outputs the way the backend does."""
    input_count = len(config.input) + len(config.batch_input)
    output_count = len(config.output)
    if input_count > 0 and output_count > 0:
        return
    required_inputs = [t for t in inputs if not t.optional]

    can_batch = all(len(t.dims) > 0 and t.dims[0] == -1 for t in [*required_inputs, *outputs])
    if can_batch:
        if config.max_batch_size == 0:
            config.max_batch_size = DEFAULT_MAX_BATCH_SIZE
        if config.max_batch_size > 1:
            if not config.HasField("sequence_batching") and not config.HasField("dynamic_batching"):
                config.dynamic_batching.SetInParent()
    elif config.max_batch_size != 0:
        raise ModelError(
            f"autofill failed for model '{config.name}': model does not support batching while non-zero "
            "max_batch_size is specified",
            model=config.name,
        )

    def fill(target, infos: list[TensorInfo]) -> None:
        del target[:]
        for t in infos:
            io = target.add()
            io.name = t.name
            io.data_type = DataType.Value(t.data_type)
            dims = list(t.dims[1:] if config.max_batch_size > 0 else t.dims)
            if not dims:
                dims = [1]
                if config.max_batch_size > 0:
                    io.reshape.SetInParent()
            io.dims.extend(dims)

    if input_count == 0:
        fill(config.input, required_inputs)
    if output_count == 0:
        fill(config.output, outputs)


def compare_dims(model_name: str, tensor: str, model_shape, dims, max_batch_size: int) -> None:
    """backend_common's CompareDimsSupported (compare_exact = False)."""
    model_shape = list(model_shape)
    dims = list(dims)
    if max_batch_size > 0:
        if not model_shape or model_shape[0] != -1:
            raise ModelError(
                f"model '{model_name}', tensor '{tensor}': for the model to support batching the shape "
                "should have at least 1 dimension and the first dimension must be -1; but shape expected "
                f"by the model is {_shape(model_shape)}",
                model=model_name,
            )
        full = [-1, *dims]
        ok = len(model_shape) == len(full) and all(
            m == f for m, f in zip(model_shape, full) if m != -1 and f != -1
        )
        if not ok:
            raise ModelError(
                f"model '{model_name}', tensor '{tensor}': the model expects {len(model_shape)} dimensions "
                f"(shape {_shape(model_shape)}) but the model configuration specifies {len(full)} dimensions "
                "(an initial batch dimension because max_batch_size > 0 followed by the explicit tensor "
                f"shape, making complete shape {_shape(full)})",
                model=model_name,
            )
    else:
        ok = len(model_shape) == len(dims) and all(
            m == d for m, d in zip(model_shape, dims) if m != -1 and d != -1
        )
        if not ok:
            raise ModelError(
                f"model '{model_name}', tensor '{tensor}': the model expects {len(model_shape)} dimensions "
                f"(shape {_shape(model_shape)}) but the model configuration specifies {len(dims)} dimensions "
                f"(shape {_shape(dims)})",
                model=model_name,
            )


def validate_against_model(config: Message, inputs: list[TensorInfo], outputs: list[TensorInfo]) -> None:
    """The backend's ValidateInputs / ValidateOutputs at model load."""
    name = config.name
    model_inputs = {t.name: t for t in inputs}
    model_outputs = {t.name: t for t in outputs}
    required = [t for t in inputs if not t.optional]

    config_input_names = {io.name for io in config.input}
    if len(config.input) < len(required) or len(config.input) > len(inputs):
        missing = [t.name for t in required if t.name not in config_input_names]
        if missing or len(config.input) > len(inputs):
            raise ModelError(
                f"unable to load model '{name}', configuration expects {len(config.input)} inputs, "
                f"model provides {len(inputs)}",
                model=name,
            )
    for io in config.input:
        _check_io(config, io, model_inputs, "input")
    for io in config.output:
        _check_io(config, io, model_outputs, "output")
    for t in required:
        if t.name not in config_input_names:
            raise ModelError(
                f"unable to load model '{name}', configuration expects {len(config.input)} inputs, "
                f"model provides {len(inputs)}",
                model=name,
            )


def _check_io(config: Message, io: Message, model_ios: dict[str, TensorInfo], kind: str) -> None:
    name = config.name
    info = model_ios.get(io.name)
    if info is None:
        allowed = ", ".join(sorted(model_ios))
        raise ModelError(f"unexpected inference {kind} '{io.name}', allowed {kind}s are: {allowed}", model=name)
    configured = DataType.Name(io.data_type)
    if info.data_type != configured:
        raise ModelError(
            f"unable to load model '{name}', configuration expects datatype {configured} for {kind} "
            f"'{io.name}', model provides {info.data_type}",
            model=name,
        )
    dims = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
    compare_dims(name, io.name, info.dims, dims, config.max_batch_size)

