"""`model_warmup` checks, made at compile time so a bad warmup fails `toolkit validate`, not a
cold start. Messages follow Triton's `TritonModelInstance::GenerateWarmupData` and the request
checks each warmup request then goes through (infer_request.cc).

Warmup data files live in the model's `warmup/` directory (Triton's kWarmupDataFolder) and must
stay inside it: a path that escapes it is refused (Triton would read any file).
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf.message import Message

from .discover import within
from .errors import ModelError
from .model_config import DataType
from .validate import element_count, warmup_input_byte_size

WARMUP_FOLDER = "warmup"


def _shape(dims) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _type_name(data_type: int) -> str:
    """Triton's protocol datatype name (TYPE_FP32 -> FP32, TYPE_STRING -> BYTES)."""
    name = DataType.Name(data_type)[len("TYPE_"):]
    return "BYTES" if name == "STRING" else name


def validate_warmup(config: Message, model_path: Path) -> None:
    name = config.name
    inputs = {io.name: io for io in config.input}
    warmup_dir = model_path / WARMUP_FOLDER
    for sample in config.model_warmup:
        if sample.batch_size == 0:
            continue  # Triton skips batch-0 samples
        for input_name, meta in sample.inputs.items():
            if element_count(meta.dims) == -1:
                raise ModelError(
                    "warmup setting expects all variable-size dimensions are specified for input "
                    f"'{input_name}'",
                    model=name,
                )
        for input_name, meta in sample.inputs.items():
            byte_size = warmup_input_byte_size(meta.data_type, meta.dims)
            kind = meta.WhichOneof("input_data_type")
            if kind is None:
                raise ModelError(f"warmup setting expects input '{input_name}' to have input_data_type set", model=name)
            if kind == "input_data_file":
                data_path = warmup_dir / meta.input_data_file
                if not within(warmup_dir, data_path):
                    raise ModelError(
                        f"warmup input_data_file '{meta.input_data_file}' of input '{input_name}' escapes the "
                        f"model's warmup directory '{warmup_dir}'",
                        model=name,
                    )
                if not data_path.is_file():
                    raise ModelError(f"failed to open text file for read {data_path}: No such file or directory", model=name)
                size = data_path.stat().st_size
                if meta.data_type != DataType.Value("TYPE_STRING") and byte_size > size:
                    raise ModelError(
                        f"warmup setting expects {byte_size} bytes, but the data provided from "
                        f"{meta.input_data_file}only has {size} bytes",
                        model=name,
                    )

            io = inputs.get(input_name)
            if io is None:
                raise ModelError(f"unexpected inference input '{input_name}' for model '{name}'", model=name)
            if io.data_type != meta.data_type:
                raise ModelError(
                    f"inference input '{input_name}' data-type is '{_type_name(meta.data_type)}', but model "
                    f"'{name}' expects '{_type_name(io.data_type)}'",
                    model=name,
                )
            expected = list(io.dims)
            given = list(meta.dims)
            if len(expected) != len(given) or any(e != -1 and e != g for e, g in zip(expected, given)):
                full_expected = ([-1] if config.max_batch_size > 0 else []) + expected
                full_given = ([1] if config.max_batch_size > 0 else []) + given
                raise ModelError(
                    f"unexpected shape for input '{input_name}' for model '{name}'. Expected "
                    f"{_shape(full_expected)}, got {_shape(full_given)}",
                    model=name,
                )
        required = [io.name for io in config.input if not io.optional]
        missing = [n for n in required if n not in sample.inputs]
        if missing:
            given = ", ".join(f"'{n}'" for n in sample.inputs)
            raise ModelError(
                f"expected {len(required)} inputs but got {len(sample.inputs)} inputs for model '{name}'. "
                f"Got input(s) [{given}], but missing required input(s) "
                f"[{', '.join(repr(n) for n in missing)}]. Please provide all required input(s).",
                model=name,
            )
