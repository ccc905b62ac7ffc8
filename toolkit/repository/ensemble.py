"""Cross-model ensemble checks: composing models present, loaded in the required versions, and
their tensors consistent with the ensemble's data flow (Triton's model repository manager
dependency checks and ensemble_utils' ValidateEnsembleConfig).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .backend_fields import ENSEMBLE_PLATFORM
from .errors import ModelError

if TYPE_CHECKING:
    from .compile import CompiledRepository
    from .discover import ModelDirectory


def _shape(dims) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


class _Tensor:
    def __init__(self, model: str, batching: bool, data_type: str, dims: list[int]):
        self.model = model
        self.data_type = data_type
        self.dims = list(dims)
        self.full_dims = ([-1] if batching else []) + self.dims


def _dims_match(a: list[int], b: list[int]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b))


def _consistent(lhs: _Tensor, rhs: _Tensor, prefix: str) -> None:
    if lhs.data_type != rhs.data_type:
        raise ModelError(
            f"{prefix}inconsistent data type: {lhs.data_type} is inferred from model {lhs.model} while "
            f"{rhs.data_type} is inferred from model {rhs.model}"
        )
    if not _dims_match(lhs.dims, rhs.dims) and not _dims_match(lhs.full_dims, rhs.full_dims):
        raise ModelError(
            f"{prefix}inconsistent shape: {_shape(lhs.full_dims)} is inferred from model {lhs.model} while "
            f"{_shape(rhs.full_dims)} is inferred from model {rhs.model}"
        )


def _io_dims(io: dict[str, Any]) -> list[int]:
    if "reshape" in io:
        return list(io["reshape"].get("shape", []))
    return list(io.get("dims", []))


def validate_ensemble_config(ensemble: dict[str, Any], composing: dict[str, dict[str, Any]]) -> None:
    name = ensemble["name"]
    batching = ensemble.get("max_batch_size", 0) > 0
    tensors: dict[str, _Tensor] = {}
    for io in ensemble.get("input", []):
        tensors[io["name"]] = _Tensor(name, batching, io["data_type"], _io_dims(io))
    for io in ensemble.get("output", []):
        tensors[io["name"]] = _Tensor(name, batching, io["data_type"], _io_dims(io))

    for step in ensemble["ensemble_scheduling"]["step"]:
        model = step["model_name"]
        cfg = composing[model]
        mbs = cfg.get("max_batch_size", 0)
        if mbs != 0 and mbs < ensemble.get("max_batch_size", 0):
            raise ModelError(
                f"ensemble {name} allows maximum batch size {ensemble['max_batch_size']}, but it contains "
                f"model {model} which only allows maximum batch size to be {mbs}"
            )
        step_batching = mbs > 0
        input_map = step.get("input_map", {})
        output_map = step.get("output_map", {})
        inputs = {io["name"]: io for io in cfg.get("input", [])}
        for model_input, tensor in input_map.items():
            if model_input not in inputs:
                raise ModelError(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing input "
                    f"{model_input} in model {model}"
                )
        for io in cfg.get("input", []):
            if io["name"] in input_map:
                tensor = input_map[io["name"]]
                node = _Tensor(model, step_batching, io["data_type"], list(io.get("dims", [])))
                if tensor in tensors:
                    _consistent(tensors[tensor], node, f"in ensemble {name}, ensemble tensor {tensor}: ")
                else:
                    tensors[tensor] = node
            elif not io.get("optional", False):
                raise ModelError(
                    f"in ensemble {name}, input {io['name']} in model {model} is not mapped to any ensemble tensors"
                )
        outputs = {io["name"]: io for io in cfg.get("output", [])}
        for model_output, tensor in output_map.items():
            if model_output not in outputs:
                raise ModelError(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapped from non-existing output "
                    f"{model_output} in model {model}"
                )
            io = outputs[model_output]
            node = _Tensor(model, step_batching, io["data_type"], list(io.get("dims", [])))
            if tensor in tensors:
                _consistent(tensors[tensor], node, f"in ensemble {name}, ensemble tensor {tensor}: ")
            else:
                tensors[tensor] = node


def validate_ensembles(result: "CompiledRepository", directories: dict[str, "ModelDirectory"]) -> None:
    """Check every compiled ensemble against its composing models; failures move the ensemble
    from `result.models` to `result.failures`. Nested ensembles are checked after their parts."""
    changed = True
    while changed:
        changed = False
        for name in sorted(result.models):
            compiled = result.models[name]
            config = compiled.config
            if config.get("platform") != ENSEMBLE_PLATFORM:
                continue
            try:
                composing: dict[str, dict[str, Any]] = {}
                for step in config["ensemble_scheduling"]["step"]:
                    dep = step["model_name"]
                    if dep not in directories:
                        raise ModelError(f"ensemble '{name}' depends on '{dep}' which is not found")
                    if dep in result.failures:
                        raise ModelError(
                            f"ensemble '{name}' depends on '{dep}' which is not valid. Model '{dep}' failed "
                            f"with error: {result.failures[dep].message}"
                        )
                    dep_model = result.models[dep]
                    version = int(step.get("model_version", -1))
                    if version != -1 and version not in dep_model.versions:
                        raise ModelError(
                            f"ensemble '{name}' depends on '{dep}' whose required version {version} is not loaded"
                        )
                    composing[dep] = dep_model.config
                validate_ensemble_config(config, composing)
            except ModelError as exc:
                exc.model = name
                result.failures[name] = exc
                del result.models[name]
                changed = True
