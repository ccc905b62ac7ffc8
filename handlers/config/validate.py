"""Triton's model configuration checks on Triton's config JSON, with Triton's messages.

Each function mirrors one of tritonserver 2.51's checks (core/src/model_config_utils.cc unless
noted) and raises `ConfigError` with the message Triton gives, at the first problem, as Triton
does; `hint` names the config.pbtxt token the compiler points at. The config is the dict Triton's
JSON printer gives (`GET /v2/models/M/config`): every field without presence printed, messages
with presence only when set, enums by name, 64-bit integers as numbers, map keys as strings.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .ensemble import ENSEMBLE_PLATFORM, validate_ensemble_scheduling
from .errors import CODE_INTERNAL, ConfigError

Config = Mapping[str, Any]

WILDCARD_DIM = -1
TENSORRT_PLATFORM = "tensorrt_plan"
# The backends ValidateModelConfig knows, and the backend each known platform implies
# (GetBackendTypeFromPlatform): a known backend must come with its platform.
PLATFORM_BACKENDS = {
    "tensorflow_graphdef": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
    TENSORRT_PLATFORM: "tensorrt",
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
}
KNOWN_BACKENDS = frozenset(PLATFORM_BACKENDS.values())
_CORRID_TYPES = ("TYPE_UINT64", "TYPE_INT64", "TYPE_UINT32", "TYPE_INT32", "TYPE_STRING")


def element_count(dims: Sequence[int]) -> int:
    """Triton's GetElementCount: -1 when any dimension is variable."""
    count = 1
    for d in dims:
        if d == WILDCARD_DIM:
            return -1
        count *= d
    return count


# --- ValidateModelConfig ------------------------------------------------------------------------


def validate_model_config(config: Config) -> None:
    name = config.get("name", "")
    if not name:
        raise ConfigError("model configuration must specify 'name'")
    platform = config.get("platform", "")
    backend = config.get("backend", "")

    if not backend:
        if platform != ENSEMBLE_PLATFORM:
            raise ConfigError(f"unexpected platform type '{platform}' for {name}", hint="platform")
    elif platform == ENSEMBLE_PLATFORM:
        raise ConfigError(
            f"Ensemble model '{name}' must have platform type '{platform}' and empty backend type", hint="backend"
        )

    if not platform and not backend:
        raise ConfigError(f"must specify 'platform' or 'backend' for '{name}'")

    if backend in KNOWN_BACKENDS and PLATFORM_BACKENDS.get(platform) != backend:
        raise ConfigError(
            f"unexpected 'platform' and 'backend' pair, got:{platform}, {backend}",
            hint="platform" if platform else "backend",
        )

    max_batch_size = int(config.get("max_batch_size", 0))
    if max_batch_size < 0:
        raise ConfigError(f"'max_batch_size' must be non-negative value for {name}", hint="max_batch_size")

    if "version_policy" not in config:
        raise ConfigError(f"must specify 'version policy' for {name}")

    if "dynamic_batching" in config:
        _validate_dynamic_batching(config["dynamic_batching"], name, max_batch_size)

    if "sequence_batching" in config:
        _validate_sequence_batching(config, name, max_batch_size)

    if "ensemble_scheduling" in config:
        validate_ensemble_scheduling(config)
    elif platform == ENSEMBLE_PLATFORM:
        raise ConfigError(
            f"ensemble scheduling must be set for ensemble {name} whose platform is {ENSEMBLE_PLATFORM}",
            hint="platform",
        )

    decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled", False))
    if decoupled and config.get("response_cache", {}).get("enable", False):
        raise ConfigError(
            f"Response Cache does not currently support model {name} with 'decoupled' transaction "
            "policy. Please disable the response cache.",
            hint="response_cache",
        )

    if "model_metrics" in config:
        for control in config["model_metrics"].get("metric_control", []):
            if "metric_identifier" not in control:
                raise ConfigError("metric control must specify 'metric_identifier'")
            if not control["metric_identifier"].get("family", ""):
                raise ConfigError("metric identifier must specify non-empty 'family'")
            if "histogram_options" not in control:
                raise ConfigError("metric control must specify 'histogram_options'")
            if not control["histogram_options"].get("buckets", []):
                raise ConfigError("histogram options must specify non-empty 'buckets'")


def _validate_dynamic_batching(dynamic: Config, name: str, max_batch_size: int) -> None:
    for size in dynamic.get("preferred_batch_size", []):
        if size <= 0:
            raise ConfigError(f"dynamic batching preferred size must be positive for {name}", hint="preferred_batch_size")
        if size > max_batch_size:
            raise ConfigError(
                f"dynamic batching preferred size must be <= max batch size for {name}", hint="preferred_batch_size"
            )
    levels = int(dynamic.get("priority_levels", 0))
    queue_policies: Mapping[str, Any] = dynamic.get("priority_queue_policy", {})
    if levels != 0:
        default_level = int(dynamic.get("default_priority_level", 0))
        if default_level == 0 or default_level > levels:
            raise ConfigError(f"default priority level must be in range [1, {levels}] for {name}", hint="priority_levels")
        for level in queue_policies:
            if int(level) == 0 or int(level) > levels:
                raise ConfigError(
                    f"priority queue policy must have priority level in range [1, {levels}] for {name}",
                    hint="priority_queue_policy",
                )
    if dynamic.get("preserve_ordering", False):
        if levels > 1:
            raise ConfigError(
                f"Only one priority level is allowed when 'preserve_ordering' is true for {name}", hint="priority_levels"
            )
        for policy in [dynamic.get("default_queue_policy", {}), *queue_policies.values()]:
            if int(policy.get("default_timeout_microseconds", 0)) != 0 and policy.get("timeout_action") == "DELAY":
                raise ConfigError(
                    f"Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for {name}",
                    hint="DELAY",
                )


def _validate_sequence_batching(config: Config, name: str, max_batch_size: int) -> None:
    sequence = config["sequence_batching"]
    if config.get("response_cache", {}).get("enable", False):
        raise ConfigError(
            f"Response Cache does not currently support model {name} with sequence batching scheduler. "
            "Please disable the response cache.",
            hint="response_cache",
        )
    for kind in ("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_READY"):
        _sequence_control(sequence, name, kind, typed=False)
    corrid_type = _sequence_control(sequence, name, "CONTROL_SEQUENCE_CORRID", typed=True)
    if corrid_type is not None and corrid_type not in _CORRID_TYPES:
        raise ConfigError(
            f"unexpected data type for control CONTROL_SEQUENCE_CORRID for {name}. Allowed data types are "
            "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
            hint="CONTROL_SEQUENCE_CORRID",
        )
    if "oldest" in sequence:
        for size in sequence["oldest"].get("preferred_batch_size", []):
            if size <= 0:
                raise ConfigError(
                    f"sequence batching preferred batch size must be positive for {name}", hint="preferred_batch_size"
                )
            if size > max_batch_size:
                raise ConfigError(
                    f"sequence batching preferred batch size must be <= max batch size for {name}",
                    hint="preferred_batch_size",
                )
    if "direct" in sequence:
        utilization = float(sequence["direct"].get("minimum_slot_utilization", 0.0))  # "NaN" stays NaN
        if utilization < 0.0 or utilization > 1.0:
            raise ConfigError(
                f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {name}",
                hint="minimum_slot_utilization",
            )


_FALSE_TRUE_TYPES = {"int32_false_true": "TYPE_INT32", "fp32_false_true": "TYPE_FP32", "bool_false_true": "TYPE_BOOL"}


def _sequence_control(sequence: Config, name: str, kind: str, typed: bool) -> str | None:
    """GetBooleanSequenceControlProperties / GetTypedSequenceControlProperties (not required):
    the checks, in Triton's order; returns the control's data type when it is present."""
    seen_tensors: set[str] = set()
    found: str | None = None
    for control_input in sequence.get("control_input", []):
        tensor = control_input.get("name", "")
        if not tensor:
            raise ConfigError(f"sequence batching control tensor must have a name for {name}", hint="control_input")
        if tensor in seen_tensors:
            raise ConfigError(
                f"sequence batching control tensor '{tensor}' is specified for multiple control kinds for {name}",
                hint=f'"{tensor}"',
            )
        seen_tensors.add(tensor)
        for control in control_input.get("control", []):
            if control.get("kind", "CONTROL_SEQUENCE_START") != kind:
                continue
            if found is not None:
                raise ConfigError(f"sequence batching specifies multiple {kind} tensors for {name}", hint=kind)
            given = [field for field in _FALSE_TRUE_TYPES if control.get(field)]
            if typed:
                found = control.get("data_type", "TYPE_INVALID")
                if given:
                    raise ConfigError(
                        "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
                        f"'bool_false_true' for {kind} for {name}",
                        hint=kind,
                    )
                continue
            if not given:
                raise ConfigError(
                    "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
                    f"'bool_false_true' for {kind} for {name}",
                    hint=kind,
                )
            if len(given) > 1:
                raise ConfigError(
                    "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and "
                    f"'bool_false_true' for {kind} for {name}",
                    hint=kind,
                )
            field = given[0]
            if len(control[field]) != 2:
                raise ConfigError(
                    f"sequence batching control '{field}' must have exactly 2 entries for {kind} for {name}", hint=kind
                )
            found = _FALSE_TRUE_TYPES[field]
    return found


# --- ValidateModelIOConfig -----------------------------------------------------------------------


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
            raise ConfigError(f"{problem} for {name}", hint=f'"{io["name"]}"' if io.get("name") else "input")
    for io in config.get("output", []):
        problem = _io_shape_problem(io, max_batch_size, "model output ")
        if problem is None and platform != TENSORRT_PLATFORM and io.get("is_shape_tensor", False):
            problem = "shape tensors are only supported for TensorRT platform"
        problem = problem or _non_linear_problem(io, platform, False)
        if problem:
            raise ConfigError(f"{problem} for {name}", hint=f'"{io["name"]}"' if io.get("name") else "output")
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


# --- ValidateInstanceGroup -----------------------------------------------------------------------


def validate_instance_groups(config: Config, supported_gpus: set[int]) -> None:
    """ValidateInstanceGroup of a normalised config; `supported_gpus`: the target's GPU ids."""
    if "ensemble_scheduling" in config:
        return
    name = config.get("name", "")
    platform = config.get("platform", "")
    groups = config.get("instance_group", [])
    if not groups:
        raise ConfigError(f"must specify one or more 'instance group's for {name}")
    for group in groups:
        group_name = group.get("name", "")
        kind = group.get("kind", "KIND_AUTO")
        gpus = list(group.get("gpus", []))
        profiles = list(group.get("profile", []))
        prefix = f"instance group {group_name} of model {name}"
        # the group's line: its name when the config gives one, else its kind
        hint = (f'"{group_name}"', kind, "instance_group")
        if kind == "KIND_MODEL":
            if gpus:
                raise ConfigError(f"{prefix} has kind KIND_MODEL but specifies one or more GPUs", hint=hint)
        elif kind == "KIND_GPU":
            if not gpus:
                if not supported_gpus:
                    raise ConfigError(f"{prefix} has kind KIND_GPU but no GPUs are available", hint=hint)
                raise ConfigError(f"{prefix} has kind KIND_GPU but specifies no GPUs", hint=hint)
            for gid in gpus:
                if gid not in supported_gpus:
                    available = ", ".join(str(g) for g in sorted(supported_gpus))
                    raise ConfigError(
                        f"{prefix} specifies invalid or unsupported gpu id {gid}. GPUs with at least the "
                        f"minimum required CUDA compute compatibility of 6.000000 are: {available}",
                        hint=("gpus", *hint),
                    )
        elif kind == "KIND_CPU":
            if gpus:
                raise ConfigError(f"{prefix} has kind KIND_CPU but specifies one or more GPUs", hint=hint)
        else:
            raise ConfigError(f"{prefix} has unexpected kind KIND_AUTO", hint=hint)
        if platform != TENSORRT_PLATFORM and profiles:
            raise ConfigError(
                f"{prefix} and platform {platform}specifies profile field which is only supported for TensorRT models",
                hint="profile",
            )
        for profile in profiles:
            if not profile:
                raise ConfigError("profile name must not be empty", hint="profile")
            index = _stoi(profile)
            if index is None:
                raise ConfigError(f"unable to parse '{profile}': stoi", hint="profile")
            if index < 0:
                raise ConfigError(
                    f"{prefix} and platform {platform} specifies invalid profile {profile}. The field "
                    "should contain the string representation of a non-negative integer.",
                    hint="profile",
                )


def _stoi(text: str) -> int | None:
    """std::stoi's value, None where it throws invalid_argument."""
    stripped = text.lstrip(" \t\n\v\f\r")
    sign = stripped[:1] if stripped[:1] in "+-" else ""
    digits = ""
    for ch in stripped[len(sign):]:
        if not "0" <= ch <= "9":
            break
        digits += ch
    return int(sign + digits) if digits else None


# --- Model::Init: label files; what tritonserver accepts but requests do not see -----------------


def check_label_files(config: Config, model_dir: Path) -> None:
    """Each output's `label_filename`, read by Model::Init from the model directory."""
    for output in config.get("output", []):
        label = output.get("label_filename", "")
        if not label:
            continue
        # Triton's JoinPath appends even an absolute name to the model directory
        path = Path(model_dir).absolute() / label.lstrip("/")
        if not path.resolve().is_relative_to(Path(model_dir).resolve()):
            raise ConfigError(
                f"label_filename '{label}' of output '{output['name']}' resolves to '{path.resolve()}', outside the "
                "model directory",
                hint=f'"{label}"',
                detail="label files must stay inside the model directory (the runtime refuses others)",
            )
        if not path.is_file():
            raise ConfigError(
                f"failed to open text file for read {path}: No such file or directory",
                hint=f'"{label}"',
                code=CODE_INTERNAL,
                detail=f"label_filename of output '{output['name']}' is relative to the model directory",
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
    "KNOWN_BACKENDS",
    "PLATFORM_BACKENDS",
    "TENSORRT_PLATFORM",
    "check_label_files",
    "duplicate_tensor_warnings",
    "element_count",
    "validate_instance_groups",
    "validate_model_config",
    "validate_model_io_config",
]
