"""`model_warmup` checks, made at compile time so a bad warmup fails `toolkit validate`, not a
cold start.

tritonserver checks a warmup sample in three places, and this module follows them in order, with
their messages (verified against tritonserver 2.51, tests/oracle):

1. TritonModelInstance::GenerateWarmupData (backend_model_instance.cc): variable-size
   dimensions, the data source of each input, `input_data_file` read from the model's `warmup/`
   folder and its size;
2. InferenceRequest::PrepareForInference (infer_request.cc), as for a client request: the number
   of inputs, then each input's data type and shape (warmup dims are the *config* dims, not the
   reshape; a batch dimension of 1 is prepended when max_batch_size > 0);
3. the backend's execute (the same code in the onnxruntime and python backends): the `batch_size`
   requests of a sample run as one batch, which must not exceed max_batch_size (1 when the model
   does not batch). Every request fails, so Triton repeats the error once per request.

Samples with batch_size 0 are skipped; `count` does not matter (Triton runs a sample at least
once). Warmup inputs that are not model inputs are passed by Triton as "override" inputs to the
backend without a check: a warning here.

Where tritonserver is fragile we refuse cleanly instead (docs/triton-compatibility.md):
an `input_data_file` that resolves outside `warmup/` (Triton reads any file), negative
dimensions, and samples over `MAX_WARMUP_SAMPLE_BYTES` (a dims of [2^40] made tritonserver abort
while allocating).
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf.message import Message

# Triton's primitives and limits, shared with the image-side check of python models completed in
# the build (handlers/backends/python/warmup_check.py): one definition of each.
from handlers.backends.python.warmup_check import MAX_WARMUP_SAMPLE_BYTES, REQUEST_PREFIX, join_path
from handlers.config.validate import element_count
from handlers.warmup import WARMUP_FOLDER

from .discover import within
from .errors import CODE_INTERNAL, ModelError
from .model_config import DataType, pb2
_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
    "prepended to each input shape. If you want to specify the full shape including the batch dim in "
    "your input dims config, try setting max_batch_size to zero. See the model configuration docs for "
    "more info on max_batch_size."
)
TYPE_STRING = DataType.Value("TYPE_STRING")


def _shape(dims) -> str:
    """triton::common::DimsListToString."""
    return "[" + ",".join(str(d) for d in dims) + "]"


def protocol_type_name(data_type: int) -> str:
    """triton::common::DataTypeToProtocolString (TYPE_FP32 -> FP32, TYPE_STRING -> BYTES)."""
    if data_type == TYPE_STRING:
        return "BYTES"
    name = DataType.Name(data_type)
    return "<invalid>" if name == "TYPE_INVALID" else name[len("TYPE_"):]


def first_instance_name(config: Message) -> str:
    """The name of the first model instance (the one whose warmup fails first): tritonserver 2.51
    names instance c of a group "<group name>_<c>", also when the group has one instance."""
    return f"{config.instance_group[0].name}_0"


_BYTE_SIZES = {
    pb2.TYPE_BOOL: 1, pb2.TYPE_UINT8: 1, pb2.TYPE_INT8: 1,
    pb2.TYPE_UINT16: 2, pb2.TYPE_INT16: 2, pb2.TYPE_FP16: 2, pb2.TYPE_BF16: 2,
    pb2.TYPE_UINT32: 4, pb2.TYPE_INT32: 4, pb2.TYPE_FP32: 4,
    pb2.TYPE_UINT64: 8, pb2.TYPE_INT64: 8, pb2.TYPE_FP64: 8,
}


def data_type_byte_size(data_type: int) -> int:
    """Bytes per element; 0 for TYPE_STRING (variable) and TYPE_INVALID."""
    return _BYTE_SIZES.get(data_type, 0)


def _input_byte_size(data_type: int, dims) -> int:
    """GenerateWarmupData's batch-1 byte size (4 bytes per element for BYTES)."""
    count = element_count(dims)
    size = count * data_type_byte_size(data_type)
    return size if size else count * 4


def _fail(config: Message, message: str, sample: Message, **kw) -> ModelError:
    return ModelError(
        message,
        model=config.name,
        hint=f'"{sample.name}"' if sample.name else "model_warmup",
        **kw,
    )


def validate_warmup(config: Message, model_path: Path, warnings: list[str] | None = None) -> None:
    """Check every `model_warmup` sample the way tritonserver prepares and runs it."""
    name = config.name
    config_inputs = {io.name: io for io in config.input}
    warmup_dir = model_path / WARMUP_FOLDER
    for sample in config.model_warmup:
        if sample.batch_size == 0:
            continue  # "Skipping batch 0 warmup sample"
        metas = list(sample.inputs.items())

        # GenerateWarmupData, first pass.
        total = 0
        for input_name, meta in metas:
            if element_count(meta.dims) == -1:
                raise _fail(
                    config,
                    f"warmup setting expects all variable-size dimensions are specified for input '{input_name}'",
                    sample,
                )
            if any(d < 0 for d in meta.dims):
                raise _fail(
                    config,
                    f"warmup setting of sample '{sample.name}' gives input '{input_name}' the dims "
                    f"{_shape(meta.dims)}: dimensions must be >= 0",
                    sample,
                    detail="tritonserver does not check this and computes a negative byte size",
                )
            total += _input_byte_size(meta.data_type, meta.dims)
        if total * sample.batch_size > MAX_WARMUP_SAMPLE_BYTES:
            raise _fail(
                config,
                f"warmup sample '{sample.name}' of model '{name}' needs {total * sample.batch_size} bytes of "
                f"input data (batch_size {sample.batch_size}), more than the {MAX_WARMUP_SAMPLE_BYTES} a "
                "warmup sample may use",
                sample,
                detail="tritonserver allocates it at load and aborts when it cannot",
            )

        # GenerateWarmupData, second pass: the data of each input.
        for input_name, meta in metas:
            kind = meta.WhichOneof("input_data_type")
            if kind is None:
                raise _fail(
                    config, REQUEST_PREFIX + f"warmup setting expects input '{input_name}' to have input_data_type set", sample
                )
            if kind != "input_data_file":
                continue
            text = join_path(str(model_path.absolute()), WARMUP_FOLDER, meta.input_data_file)
            data_path = Path(text)
            if not within(warmup_dir, data_path):
                raise _fail(
                    config,
                    f"warmup input_data_file '{meta.input_data_file}' of input '{input_name}' resolves to "
                    f"'{data_path.resolve()}', outside the model's warmup directory '{warmup_dir}'",
                    sample,
                    detail="tritonserver reads any file a warmup sample names; this toolkit only ships the "
                    "model directory",
                )
            if not data_path.is_file():
                reason = "Is a directory" if data_path.is_dir() else "No such file or directory"
                raise _fail(config, f"failed to open text file for read {text}: {reason}", sample, code=CODE_INTERNAL)
            size = data_path.stat().st_size
            expected = _input_byte_size(meta.data_type, meta.dims)
            if meta.data_type != TYPE_STRING and expected > size:
                raise _fail(
                    config,
                    REQUEST_PREFIX + f"warmup setting expects {expected} bytes, but the data provided from "
                    f"{meta.input_data_file}only has {size} bytes",
                    sample,
                )

        # PrepareForInference: inputs that are not model inputs become override inputs.
        originals = [(n, m) for n, m in metas if n in config_inputs]
        for input_name, _ in metas:
            if input_name not in config_inputs and warnings is not None:
                warnings.append(
                    f"model_warmup sample '{sample.name}' gives input '{input_name}', which is not an input of "
                    f"model '{name}': tritonserver hands it to the backend as an extra input, this runtime "
                    "ignores it"
                )
        _check_input_count(config, sample, [n for n, _ in originals])
        for input_name, meta in originals:
            io = config_inputs[input_name]
            if io.data_type != meta.data_type:
                raise _fail(
                    config,
                    REQUEST_PREFIX + f"inference input '{input_name}' data-type is '{protocol_type_name(meta.data_type)}', "
                    f"but model '{name}' expects '{protocol_type_name(io.data_type)}'",
                    sample,
                )
            expected_dims, given = list(io.dims), list(meta.dims)
            if len(expected_dims) != len(given) or any(e != -1 and e != g for e, g in zip(expected_dims, given)):
                batching = config.max_batch_size > 0
                full_expected = ([-1] if batching else []) + expected_dims
                full_given = ([1] if batching else []) + given
                raise _fail(
                    config,
                    REQUEST_PREFIX + f"unexpected shape for input '{input_name}' for model '{name}'. Expected "
                    f"{_shape(full_expected)}, got {_shape(full_given)}. " + (_BATCH_NOTE if batching else ""),
                    sample,
                )

        # The backend's execute: the sample's requests form one batch.
        total_batch = sample.batch_size
        if total_batch != 1 and total_batch > config.max_batch_size:
            one = f"batch size {total_batch} for '{first_instance_name(config)}', max allowed is {config.max_batch_size}; "
            raise _fail(config, f"failed to run warmup sample '{sample.name}': " + one * total_batch, sample)


def _check_input_count(config: Message, sample: Message, originals: list[str]) -> None:
    """InferenceRequest::Normalize's input count check (tritonserver 2.51's wording)."""
    required = [io.name for io in config.input if not io.optional]
    total = len(config.input)
    if len(originals) <= total and len(originals) >= len(required):
        return
    missing = [n for n in required if n not in originals]
    # Triton builds "['a','b']" by appending "'x'," and dropping the last character: with nothing
    # missing that drops the '[' and prints "]".
    missing_text = ("[" + "".join(f"'{n}'," for n in missing))[:-1] + "]"
    given_text = "[" + ",".join(f"'{n}'" for n in originals) + "]"
    if total == len(required):
        expected = f"expected {total} inputs"
    else:
        expected = f"expected number of inputs between {len(required)} and {total}"
    raise _fail(
        config,
        REQUEST_PREFIX + f"{expected} but got {len(originals)} inputs for model '{config.name}'. Got input(s) "
        f"{given_text}, but missing required input(s) {missing_text}. Please provide all required input(s).",
        sample,
    )
