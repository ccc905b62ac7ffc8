"""ValidateEnsembleConfig (core ensemble_utils.cc) on Triton's config JSON.

An ensemble's steps must fit the models they call: the ensemble's max_batch_size, the input and
output maps, and one data type and a compatible shape per ensemble tensor along the data flow.
The compiler (toolkit/repository/ensemble.py) and the image build's completion step (for ensembles
calling a python model completed in the image) both run this one; messages are tritonserver
2.51's, and `hint` names the token the compiler points at in config.pbtxt.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .config_update import ConfigError

Config = Mapping[str, Any]


def _shape(dims: list[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


class _Tensor:
    """TensorNode: a tensor's type and shape and the model it was inferred from."""

    def __init__(self, model: str, batching: bool, data_type: str, dims: list[int]):
        self.model = model
        self.data_type = data_type
        self.dims = list(dims)
        self.full_dims = ([-1] if batching else []) + self.dims


def _dims_match(a: list[int], b: list[int]) -> bool:
    """CompareDimsWithWildcard."""
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b))


def _consistent(lhs: _Tensor, rhs: _Tensor, prefix: str, tensor: str) -> None:
    """ValidateTensorConsistency."""
    if lhs.data_type != rhs.data_type:
        raise ConfigError(
            f"{prefix}inconsistent data type: {lhs.data_type} is inferred from model {lhs.model} while "
            f"{rhs.data_type} is inferred from model {rhs.model}",
            hint=tensor,
        )
    if not _dims_match(lhs.dims, rhs.dims) and not _dims_match(lhs.full_dims, rhs.full_dims):
        raise ConfigError(
            f"{prefix}inconsistent shape: {_shape(lhs.full_dims)} is inferred from model {lhs.model} while "
            f"{_shape(rhs.full_dims)} is inferred from model {rhs.model}",
            hint=tensor,
        )


def _io_dims(io: Config) -> list[int]:
    if "reshape" in io:
        return list(io["reshape"].get("shape", []))
    return list(io.get("dims", []))


def validate_ensemble_config(ensemble: Config, composing: Mapping[str, Config]) -> None:
    """ConfigError with Triton's message when `ensemble`'s steps do not fit the `composing`
    models' configs (by model name)."""
    name = ensemble["name"]
    ensemble_mbs = int(ensemble.get("max_batch_size", 0))
    batching = ensemble_mbs > 0
    tensors: dict[str, _Tensor] = {}
    for io in [*ensemble.get("input", []), *ensemble.get("output", [])]:
        tensors.setdefault(io["name"], _Tensor(name, batching, io["data_type"], _io_dims(io)))

    for step in ensemble["ensemble_scheduling"]["step"]:
        model = step["model_name"]
        config = composing[model]
        mbs = int(config.get("max_batch_size", 0))
        if mbs != 0 and mbs < ensemble_mbs:
            raise ConfigError(
                f"ensemble {name} allows maximum batch size {ensemble_mbs}, but it contains model {model} which "
                f"only allows maximum batch size to be {mbs}",
                hint=model,
            )
        step_batching = mbs > 0
        input_map: Mapping[str, str] = step.get("input_map", {})
        output_map: Mapping[str, str] = step.get("output_map", {})
        prefix = f"in ensemble {name}, "

        input_names = {io["name"] for io in config.get("input", [])}
        for model_input, tensor in input_map.items():
            if model_input not in input_names:
                raise ConfigError(
                    f"{prefix}ensemble tensor {tensor} is mapping to non-existing input {model_input} in model {model}",
                    hint=model_input,
                )
        for io in config.get("input", []):
            if io["name"] in input_map:
                tensor = input_map[io["name"]]
                node = _Tensor(model, step_batching, io["data_type"], list(io.get("dims", [])))
                if tensor in tensors:
                    _consistent(tensors[tensor], node, f"{prefix}ensemble tensor {tensor}: ", tensor)
                else:
                    tensors[tensor] = node
            elif not io.get("optional", False):
                raise ConfigError(
                    f"{prefix}input {io['name']} in model {model} is not mapped to any ensemble tensors", hint=model
                )

        outputs = {io["name"]: io for io in config.get("output", [])}
        for model_output, tensor in output_map.items():
            if model_output not in outputs:
                raise ConfigError(
                    f"{prefix}ensemble tensor {tensor} is mapped from non-existing output {model_output} in model {model}",
                    hint=model_output,
                )
        for model_output, tensor in output_map.items():
            io = outputs[model_output]
            node = _Tensor(model, step_batching, io["data_type"], list(io.get("dims", [])))
            if tensor in tensors:
                _consistent(tensors[tensor], node, f"{prefix}ensemble tensor {tensor}: ", tensor)
            else:
                tensors[tensor] = node


__all__ = ["validate_ensemble_config"]
