"""Triton's checks of a model config that auto-complete changed, on Triton's config JSON.

After the backend's auto-complete, tritonserver's `Model::Init` runs ValidateModelConfig and
ValidateModelIOConfig again (core model.cc, model_config_utils.cc). The toolkit's compiler runs
its protobuf versions of them (toolkit/repository/validate.py); the image build's completion
step (`complete.py`), which has no protobuf, runs these instead, with the same messages:

- `validate_updated_config`: ValidateModelConfig's checks of the fields an update can change:
  max_batch_size, dynamic batching, an ensemble scheduler on a model that is not an ensemble, a
  decoupled policy with the response cache (sequence batching is refused by `check_supported`);
- `validate_model_io_config`: ValidateModelIOConfig (inputs, outputs, reshape, batch inputs and
  outputs);
- `check_supported`: what this product refuses in a valid config (toolkit/repository/support.py)
  that an update can introduce: sequence batching (a Python model may make itself decoupled).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .config_update import ConfigError

WILDCARD_DIM = -1
TENSORRT_PLATFORM = "tensorrt_plan"
ENSEMBLE_PLATFORM = "ensemble"
CODE_UNSUPPORTED = "Unsupported"

Config = Mapping[str, Any]


def element_count(dims: Sequence[int]) -> int:
    """Triton's GetElementCount: -1 when any dimension is variable."""
    count = 1
    for d in dims:
        if d == WILDCARD_DIM:
            return -1
        count *= d
    return count


# --- ValidateModelConfig (the parts an update changes) --------------------------------------------


def validate_updated_config(config: Config) -> None:
    name = config.get("name", "")
    max_batch_size = int(config.get("max_batch_size", 0))
    if max_batch_size < 0:
        raise ConfigError(f"'max_batch_size' must be non-negative value for {name}")

    dynamic = config.get("dynamic_batching")
    if isinstance(dynamic, Mapping):
        for size in dynamic.get("preferred_batch_size", []):
            if size <= 0:
                raise ConfigError(f"dynamic batching preferred size must be positive for {name}")
            if size > max_batch_size:
                raise ConfigError(f"dynamic batching preferred size must be <= max batch size for {name}")
        levels = int(dynamic.get("priority_levels", 0))
        queue_policies: Mapping[str, Any] = dynamic.get("priority_queue_policy", {})
        if levels != 0:
            default_level = int(dynamic.get("default_priority_level", 0))
            if default_level == 0 or default_level > levels:
                raise ConfigError(f"default priority level must be in range [1, {levels}] for {name}")
            for level in queue_policies:
                if int(level) == 0 or int(level) > levels:
                    raise ConfigError(
                        f"priority queue policy must have priority level in range [1, {levels}] for {name}"
                    )
        if dynamic.get("preserve_ordering", False):
            if levels > 1:
                raise ConfigError(f"Only one priority level is allowed when 'preserve_ordering' is true for {name}")
            policies = [dynamic.get("default_queue_policy", {}), *queue_policies.values()]
            for policy in policies:
                if int(policy.get("default_timeout_microseconds", 0)) != 0 and policy.get("timeout_action") == "DELAY":
                    raise ConfigError(
                        "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for "
                        f"{name}"
                    )

    platform = config.get("platform", "")
    if "ensemble_scheduling" in config and platform != ENSEMBLE_PLATFORM:
        raise ConfigError(
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not {ENSEMBLE_PLATFORM}"
        )

    decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled", False))
    if decoupled and config.get("response_cache", {}).get("enable", False):
        raise ConfigError(
            f"Response Cache does not currently support model {name} with 'decoupled' transaction policy. "
            "Please disable the response cache."
        )


# --- ValidateModelIOConfig ------------------------------------------------------------------------------


def _trunks(shape: Sequence[int]) -> list[int]:
    out, current = [], 1
    for d in shape:
        if d != WILDCARD_DIM:
            current *= d
        else:
            out.append(current)
            current = 1
    out.append(current)
    return out


def _io_shape_problem(io: Config, max_batch_size: int, prefix: str) -> str | None:
    if not io.get("name"):
        return prefix + "must specify 'name'"
    named = f"{prefix}'{io['name']}' "
    if io.get("data_type", "TYPE_INVALID") == "TYPE_INVALID":
        return named + "must specify 'data_type'"
    dims = list(io.get("dims", []))
    if not dims:
        return named + "must specify 'dims'"
    reshape = io.get("reshape")
    shape = list(reshape.get("shape", [])) if reshape is not None else []
    if reshape is not None and not shape and max_batch_size == 0:
        return named + "cannot have empty reshape for non-batching model as scalar tensors are not supported"
    for d in dims:
        if d < 1 and d != WILDCARD_DIM:
            return named + "dimension must be integer >= 1, or -1 to indicate a variable-size dimension"
    if reshape is not None:
        for d in shape:
            if d < 1 and d != WILDCARD_DIM:
                return named + "reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension"
        dims_size = element_count(dims)
        reshape_size = element_count(shape) if shape else 0
        if dims_size != reshape_size and (reshape_size != 0 or dims_size != 1):
            return named + "has different size for dims and reshape"
        if dims_size == -1:
            a, b = _trunks(dims), _trunks(shape)
            if len(a) != len(b):
                return named + "has different number of variable-size dimensions for dims and reshape"
            if a != b:
                return named + "has different size for dims and reshape"
    return None


def _non_linear_problem(io: Config, platform: str, is_input: bool) -> str | None:
    if not io.get("is_non_linear_format_io", False):
        return None
    if platform != TENSORRT_PLATFORM:
        return "Non-linear IO format is only supported for the TensorRT platform"
    if len(io.get("dims", [])) != 3:
        return f"Non-linear IO format {'input' if is_input else 'output'} requires 3 dims"
    return None


def validate_model_io_config(config: Config) -> None:
    name = config.get("name", "")
    platform = config.get("platform", "")
    max_batch_size = int(config.get("max_batch_size", 0))
    for io in config.get("input", []):
        problem = _io_shape_problem(io, max_batch_size, "model input ")
        if problem is None and io.get("format") in ("FORMAT_NHWC", "FORMAT_NCHW") and len(io.get("dims", [])) != 3:
            problem = "model input NHWC/NCHW require 3 dims"
        if problem is None and platform != TENSORRT_PLATFORM and io.get("is_shape_tensor", False):
            problem = "shape tensors are only supported for TensorRT platform"
        problem = problem or _non_linear_problem(io, platform, True)
        if problem:
            raise ConfigError(f"{problem} for {name}")
    for io in config.get("output", []):
        problem = _io_shape_problem(io, max_batch_size, "model output ")
        if problem is None and platform != TENSORRT_PLATFORM and io.get("is_shape_tensor", False):
            problem = "shape tensors are only supported for TensorRT platform"
        problem = problem or _non_linear_problem(io, platform, False)
        if problem:
            raise ConfigError(f"{problem} for {name}")
    problem = _batch_io_problem(config)
    if problem:
        raise ConfigError(f"{problem} for {name}")


def _batch_io_problem(config: Config) -> str | None:
    inputs = {io.get("name") for io in config.get("input", [])}
    outputs = {io.get("name") for io in config.get("output", [])}
    for batch_input in config.get("batch_input", []):
        kind = batch_input.get("kind", "BATCH_ELEMENT_COUNT")
        sources = batch_input.get("source_input", [])
        if len(sources) != 1:
            return f"batch input kind '{kind}' expects 1 source input, got {len(sources)}"
        if batch_input.get("data_type", "TYPE_INVALID") not in ("TYPE_INT32", "TYPE_FP32"):
            return "batch input data type must be TYPE_INT32 or TYPE_FP32"
        for source in sources:
            if source not in inputs:
                return f"unknown source input name '{source}'"
    for batch_output in config.get("batch_output", []):
        kind = batch_output.get("kind", "BATCH_SCATTER_WITH_INPUT_SHAPE")
        sources = batch_output.get("source_input", [])
        if len(sources) != 1:
            return f"batch output kind '{kind}' expects 1 source input, got {len(sources)}"
        for source in sources:
            if source not in inputs:
                return f"unknown source input name '{source}'"
        seen: set[str] = set()
        for target in batch_output.get("target_name", []):
            if target not in outputs:
                return f"unknown target output name '{target}'"
            if target in seen:
                return f"target output name '{target}' can only be specified once"
            seen.add(target)
    return None


# --- this product's support checks ---------------------------------------------------------------------


def check_supported(config: Config) -> None:
    """What an update can bring in that this product refuses (toolkit/repository/support.py has
    the full list and the same messages)."""
    name = config.get("name", "")
    if "sequence_batching" in config:
        raise ConfigError(
            f"model '{name}' uses sequence_batching: stateful models need every request of a sequence "
            "routed to the same instance (sticky routing), which serverless platforms do not provide; "
            "keep the state in the client or an external store and use dynamic_batching",
            code=CODE_UNSUPPORTED,
        )


def decoupled_ensemble_message(name: str, steps: Sequence[str] = ()) -> str:
    """This product's refusal of an ensemble that a decoupled step makes decoupled (Triton's
    ValidateEnsembleConfig marks such an ensemble decoupled)."""
    which = f" ('{steps[0]}')" if steps else ""
    return (
        f"ensemble '{name}' is decoupled (a step's model{which} has model_transaction_policy {{ decoupled: true }}): "
        "streaming responses through an ensemble is not supported; call the decoupled model directly "
        "(generate_stream, gRPC ModelStreamInfer) or from a Python model with BLS exec(decoupled=True)"
    )


def duplicate_tensor_warnings(config: Config) -> list[str]:
    """tritonserver accepts two inputs (or outputs) with the same name; requests see the first."""
    warnings = []
    for kind in ("input", "output"):
        seen: set[str] = set()
        for io in config.get(kind, []):
            if io.get("name") in seen:
                warnings.append(
                    f"model '{config.get('name', '')}' declares {kind} '{io['name']}' more than once: tritonserver "
                    "accepts it and checks requests against the first declaration; so does this runtime"
                )
            seen.add(io.get("name"))
    return warnings


__all__ = [
    "check_supported",
    "decoupled_ensemble_message",
    "duplicate_tensor_warnings",
    "element_count",
    "validate_model_io_config",
    "validate_updated_config",
]
