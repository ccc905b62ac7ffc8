"""`model_warmup` checked against a completed config, so a bad warmup fails `toolkit validate`
(or the image build, for a python model completed there), not a cold start.

One implementation for both callers: the compiler (toolkit/repository/warmup.py renders its
protobuf config as Triton's JSON and calls `check_warmup`) and the image build's completion step
of python models whose inputs only `auto_complete_config` knows
(handlers/backends/python/complete.py). The checks follow tritonserver's order and messages
(verified against tritonserver 2.51, tests/oracle):

1. TritonModelInstance::GenerateWarmupData: variable-size dimensions, the data source of each
   input, `input_data_file` inside the model's `warmup/` folder and large enough; plus the
   compiler's guards where Triton is fragile (negative dimensions, samples over
   MAX_WARMUP_SAMPLE_BYTES), checked before any data is allocated;
2. InferenceRequest::PrepareForInference, as for a client request: the number of inputs, then
   each input's data type and shape (warmup dims are the *config* dims, not the reshape; a batch
   dimension of 1 is prepended when max_batch_size > 0); sample inputs that are not model inputs
   are left out with a warning (Triton hands them to the backend as extra inputs), except a
   sequence model's control inputs, which reach the model as Triton passes them;
3. the backend's execute: the `batch_size` requests of a sample form one batch, which must not
   exceed max_batch_size (1 when the model does not batch).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..batching.sequence_policy import control_input_names
from ..datatypes import PROTOCOL_DATATYPES, element_size, from_config_type
from ..manifest import ModelSpec
from ..warmup import WARMUP_FOLDER
from .errors import CODE_INTERNAL, ConfigError
from .validate import element_count

# The synthetic data of one warmup sample (all inputs, all batch_size requests) must fit here.
MAX_WARMUP_SAMPLE_BYTES = 1 << 30
REQUEST_PREFIX = "[request id: <id_unknown>] "  # InferenceRequest::LogRequest() of a warmup request


def _shape(dims: list[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def join_path(*segments: str) -> str:
    """Triton's JoinPath: an absolute segment is appended, not substituted ('/x' -> 'dir/x')."""
    joined = ""
    for segment in segments:
        if not joined:
            joined = segment
        elif segment.startswith("/"):
            joined += segment[1:] if joined.endswith("/") else segment
        else:
            joined += segment if joined.endswith("/") else "/" + segment
    return joined


def _input_byte_size(data_type: str, dims: list[int]) -> int:
    """GenerateWarmupData's batch-1 byte size (4 bytes per element for BYTES)."""
    count = element_count(dims)
    datatype = from_config_type(data_type)
    known = datatype != "BYTES" and datatype in PROTOCOL_DATATYPES  # TYPE_INVALID: 0 bytes each
    size = count * (element_size(datatype) if known else 0)
    return size if size else count * 4


def _generate_data_checks(spec: ModelSpec, sample: Mapping[str, Any]) -> None:
    name = spec.name
    batch_size = int(sample.get("batch_size", 0))
    metas: Mapping[str, Mapping[str, Any]] = sample.get("inputs", {})
    total = 0
    for input_name, meta in metas.items():
        dims = [int(d) for d in meta.get("dims", [])]
        if element_count(dims) == -1:
            raise ConfigError(f"warmup setting expects all variable-size dimensions are specified for input '{input_name}'")
        if any(d < 0 for d in dims):
            raise ConfigError(
                f"warmup setting of sample '{sample.get('name', '')}' gives input '{input_name}' the dims "
                f"{_shape(dims)}: dimensions must be >= 0",
                detail="tritonserver does not check this and computes a negative byte size",
            )
        total += _input_byte_size(meta.get("data_type", "TYPE_INVALID"), dims)
    if total * batch_size > MAX_WARMUP_SAMPLE_BYTES:
        raise ConfigError(
            f"warmup sample '{sample.get('name', '')}' of model '{name}' needs {total * batch_size} bytes of input "
            f"data (batch_size {batch_size}), more than the {MAX_WARMUP_SAMPLE_BYTES} a warmup sample may use",
            detail="tritonserver allocates it at load and aborts when it cannot",
        )

    warmup_dir = spec.directory / WARMUP_FOLDER
    for input_name, meta in metas.items():
        if not any(key in meta for key in ("zero_data", "random_data", "input_data_file")):
            raise ConfigError(REQUEST_PREFIX + f"warmup setting expects input '{input_name}' to have input_data_type set")
        if "input_data_file" not in meta:
            continue
        filename = str(meta["input_data_file"])
        text = join_path(str(spec.directory.absolute()), WARMUP_FOLDER, filename)
        path = Path(text)
        if not path.resolve().is_relative_to(warmup_dir.resolve()):
            raise ConfigError(
                f"warmup input_data_file '{filename}' of input '{input_name}' resolves to '{path.resolve()}', "
                f"outside the model's warmup directory '{warmup_dir}'",
                detail="tritonserver reads any file a warmup sample names; this toolkit only ships the model directory",
            )
        if not path.is_file():
            reason = "Is a directory" if path.is_dir() else "No such file or directory"
            raise ConfigError(f"failed to open text file for read {text}: {reason}", code=CODE_INTERNAL)
        size = path.stat().st_size
        data_type = meta.get("data_type", "TYPE_INVALID")
        expected = _input_byte_size(data_type, [int(d) for d in meta.get("dims", [])])
        if data_type != "TYPE_STRING" and expected > size:
            raise ConfigError(
                REQUEST_PREFIX + f"warmup setting expects {expected} bytes, but the data provided from "
                f"{filename}only has {size} bytes"
            )


def check_warmup(spec: ModelSpec, version: int) -> list[str]:
    """Check every `model_warmup` sample of `spec` (its config completed) the way tritonserver
    prepares and runs it; ConfigError at the first problem, else the warnings."""
    config = spec.config
    warnings: list[str] = []
    model_inputs = {io["name"] for io in config.get("input", [])}
    max_batch_size = int(config.get("max_batch_size", 0))
    for setting in config.get("model_warmup", []):
        if int(setting.get("batch_size", 0)) == 0:
            continue  # "Skipping batch 0 warmup sample"
        try:
            warnings.extend(_check_sample(spec, version, setting, model_inputs, max_batch_size))
        except ConfigError as exc:
            if exc.hint is None:  # the compiler points at the sample's line in config.pbtxt
                exc.hint = f'"{setting["name"]}"' if setting.get("name") else "model_warmup"
            raise
    return warnings


_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be "
    "prepended to each input shape. If you want to specify the full shape including the batch dim in "
    "your input dims config, try setting max_batch_size to zero. See the model configuration docs for "
    "more info on max_batch_size."
)


def _protocol_type(data_type: str) -> str:
    """triton::common::DataTypeToProtocolString (TYPE_FP32 -> FP32, TYPE_STRING -> BYTES)."""
    name = from_config_type(data_type)
    return "<invalid>" if name not in PROTOCOL_DATATYPES else name


def _check_sample(spec: ModelSpec, version: int, setting: Mapping[str, Any], model_inputs: set[str],
                  max_batch_size: int) -> list[str]:
    """One sample: GenerateWarmupData's checks, then the request as PrepareForInference checks it
    (input count, data types, shapes: the config's dims, not the reshape, with a batch dimension
    of 1 when batching), then the batch the backend's execute runs; the warnings (sample inputs
    that are not model inputs)."""
    config = spec.config
    name = spec.name
    sample_name = str(setting.get("name", ""))
    _generate_data_checks(spec, setting)
    metas: Mapping[str, Mapping[str, Any]] = setting.get("inputs", {})
    config_inputs = {io["name"]: io for io in config.get("input", [])}
    controls = set(control_input_names(config))  # handed to the model with the sample, as Triton does
    warnings = [
        f"model_warmup sample '{sample_name}' gives input '{n}', which is not an input of model '{name}': "
        "tritonserver hands it to the backend as an extra input, this runtime ignores it"
        for n in metas
        if n not in config_inputs and n not in controls
    ]
    originals = [n for n in metas if n in config_inputs]
    _check_input_count(config, name, originals)
    for input_name in originals:
        io, meta = config_inputs[input_name], metas[input_name]
        given_type = str(meta.get("data_type", "TYPE_INVALID"))
        expected_type = str(io.get("data_type", "TYPE_INVALID"))
        if given_type != expected_type:
            raise ConfigError(
                REQUEST_PREFIX + f"inference input '{input_name}' data-type is '{_protocol_type(given_type)}', "
                f"but model '{name}' expects '{_protocol_type(expected_type)}'"
            )
        expected_dims = [int(d) for d in io.get("dims", [])]
        given = [int(d) for d in meta.get("dims", [])]
        if len(expected_dims) != len(given) or any(e != -1 and e != g for e, g in zip(expected_dims, given)):
            batching = max_batch_size > 0
            full_expected = ([-1] if batching else []) + expected_dims
            full_given = ([1] if batching else []) + given
            raise ConfigError(
                REQUEST_PREFIX + f"unexpected shape for input '{input_name}' for model '{name}'. Expected "
                f"{_shape(full_expected)}, got {_shape(full_given)}. " + (_BATCH_NOTE if batching else "")
            )
    batch_size = int(setting.get("batch_size", 0))
    if batch_size != 1 and batch_size > max_batch_size:
        instance = f"{config['instance_group'][0]['name']}_0" if config.get("instance_group") else name
        one = f"batch size {batch_size} for '{instance}', max allowed is {max_batch_size}; "
        raise ConfigError(f"failed to run warmup sample '{sample_name}': " + one * batch_size)
    return warnings


def _check_input_count(config: Mapping[str, Any], name: str, originals: list[str]) -> None:
    """InferenceRequest::Normalize's input count check (tritonserver 2.51's wording)."""
    inputs = config.get("input", [])
    required = [io["name"] for io in inputs if not io.get("optional", False)]
    total = len(inputs)
    if len(required) <= len(originals) <= total:
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
    raise ConfigError(
        REQUEST_PREFIX + f"{expected} but got {len(originals)} inputs for model '{name}'. Got input(s) "
        f"{given_text}, but missing required input(s) {missing_text}. Please provide all required input(s)."
    )


__all__ = ["MAX_WARMUP_SAMPLE_BYTES", "REQUEST_PREFIX", "check_warmup", "join_path"]
