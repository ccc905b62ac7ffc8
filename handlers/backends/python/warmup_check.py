"""`model_warmup` checked against a completed config, where the toolkit's compiler could not.

For a python model completed in the image build (`complete.py`) the compiler never saw its
inputs, so it left all warmup checks to this step. They follow tritonserver's order and messages,
as the compiler's do (toolkit/repository/warmup.py, verified against tritonserver 2.51):

1. TritonModelInstance::GenerateWarmupData: variable-size dimensions, the data source of each
   input, `input_data_file` inside the model's `warmup/` folder and large enough; plus the
   compiler's guards where Triton is fragile (negative dimensions, samples over
   MAX_WARMUP_SAMPLE_BYTES), checked before any data is allocated;
2. InferenceRequest::PrepareForInference: the requests handlers/warmup.py builds for each sample
   go through `validate_request`, exactly as the runtime sends them at load (input count, data
   types, shapes); sample inputs that are not model inputs are left out with a warning (Triton
   hands them to the backend as extra inputs);
3. the backend's execute: the `batch_size` requests of a sample form one batch, which must not
   exceed max_batch_size (1 when the model does not batch).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ...config.errors import CODE_INTERNAL, ConfigError
from ...config.validate import element_count
from ...datatypes import element_size, from_config_type
from ...errors import InferenceError
from ...inference import InferRequest
from ...manifest import ModelSpec
from ...protocol.validation import validate_request
from ...warmup import WARMUP_FOLDER, WarmupError, warmup_samples

# The synthetic data of one warmup sample (all inputs, all batch_size requests) must fit here
# (toolkit/repository/warmup.py uses the same limit).
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
    size = count * (element_size(datatype) if datatype != "BYTES" else 0)
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
        _generate_data_checks(spec, setting)
        try:
            (sample,) = warmup_samples(replace(spec, config={**config, "model_warmup": [setting]}))
        except WarmupError as exc:
            raise ConfigError(str(exc)) from None
        originals = {n: a for n, a in sample.inputs.items() if n in model_inputs}
        warnings.extend(
            f"model_warmup sample '{sample.name}' gives input '{n}', which is not an input of model '{spec.name}': "
            "tritonserver hands it to the backend as an extra input, this runtime ignores it"
            for n in sample.inputs
            if n not in model_inputs
        )
        request = InferRequest(spec.name, version, dict(originals), id="", batch_size=1)
        try:
            validate_request(config, request)
        except InferenceError as exc:
            raise ConfigError(exc.message) from None
        if sample.batch_size != 1 and sample.batch_size > max_batch_size:
            instance = f"{config['instance_group'][0]['name']}_0" if config.get("instance_group") else spec.name
            one = f"batch size {sample.batch_size} for '{instance}', max allowed is {max_batch_size}; "
            raise ConfigError(f"failed to run warmup sample '{sample.name}': " + one * sample.batch_size)
    return warnings


__all__ = ["MAX_WARMUP_SAMPLE_BYTES", "REQUEST_PREFIX", "check_warmup", "join_path"]
