"""Triton's model configuration checks, with Triton's messages.

Each function mirrors one of tritonserver's checks (core/src/model_config_utils.cc unless noted)
and raises `ModelError` with the message Triton would give, so users can search for it. The first
problem found is reported, as Triton does.
"""

from __future__ import annotations

from google.protobuf.message import Message

# Triton's GetElementCount, one definition shared with the runtime's checks.
from handlers.backends.python.config_checks import element_count

from .backend_fields import ENSEMBLE_PLATFORM, KNOWN_BACKENDS, PLATFORM_BACKENDS, TENSORRT_PLATFORM
from .errors import ModelError
from .model_config import ModelInput, ModelInstanceGroup, pb2

WILDCARD_DIM = -1
TYPE_INVALID = pb2.TYPE_INVALID
TYPE_STRING = pb2.TYPE_STRING


def _fail(config: Message, message: str, hint: str | None = None) -> ModelError:
    return ModelError(message, model=config.name or None, hint=hint)


# --- ValidateModelConfig ------------------------------------------------------------------------


def validate_model_config(config: Message) -> None:
    name = config.name
    if not name:
        raise _fail(config, "model configuration must specify 'name'")

    if not config.backend:
        if config.platform != ENSEMBLE_PLATFORM:
            raise _fail(config, f"unexpected platform type '{config.platform}' for {name}", "platform")
    elif config.platform == ENSEMBLE_PLATFORM:
        raise _fail(
            config,
            f"Ensemble model '{name}' must have platform type '{config.platform}' and empty backend type",
            "backend",
        )

    if not config.platform and not config.backend:
        raise _fail(config, f"must specify 'platform' or 'backend' for '{name}'")

    if config.backend in KNOWN_BACKENDS and PLATFORM_BACKENDS.get(config.platform) != config.backend:
        raise _fail(
            config,
            f"unexpected 'platform' and 'backend' pair, got:{config.platform}, {config.backend}",
            "platform" if config.platform else "backend",
        )

    if config.max_batch_size < 0:
        raise _fail(config, f"'max_batch_size' must be non-negative value for {name}", "max_batch_size")

    if not config.HasField("version_policy"):
        raise _fail(config, f"must specify 'version policy' for {name}")

    if config.HasField("dynamic_batching"):
        db = config.dynamic_batching
        for size in db.preferred_batch_size:
            if size <= 0:
                raise _fail(config, f"dynamic batching preferred size must be positive for {name}", "preferred_batch_size")
            if size > config.max_batch_size:
                raise _fail(config, f"dynamic batching preferred size must be <= max batch size for {name}", "preferred_batch_size")
        levels = db.priority_levels
        if levels != 0:
            if db.default_priority_level == 0 or db.default_priority_level > levels:
                raise _fail(config, f"default priority level must be in range [1, {levels}] for {name}", "priority_levels")
            for level in db.priority_queue_policy:
                if level == 0 or level > levels:
                    raise _fail(
                        config,
                        f"priority queue policy must have priority level in range [1, {levels}] for {name}",
                        "priority_queue_policy",
                    )
        if db.preserve_ordering:
            if levels > 1:
                raise _fail(
                    config,
                    f"Only one priority level is allowed when 'preserve_ordering' is true for {name}",
                    "priority_levels",
                )
            policies = [db.default_queue_policy, *db.priority_queue_policy.values()]
            for policy in policies:
                if policy.default_timeout_microseconds != 0 and policy.timeout_action == pb2.ModelQueuePolicy.DELAY:
                    raise _fail(
                        config,
                        "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is "
                        f"true for {name}",
                        "DELAY",
                    )

    if config.HasField("sequence_batching"):
        _validate_sequence_batching(config)

    if config.HasField("ensemble_scheduling"):
        validate_ensemble_scheduling(config)
    elif config.platform == ENSEMBLE_PLATFORM:
        raise _fail(
            config,
            f"ensemble scheduling must be set for ensemble {name} whose platform is {ENSEMBLE_PLATFORM}",
            "platform",
        )

    if config.model_transaction_policy.decoupled and config.response_cache.enable:
        raise _fail(
            config,
            f"Response Cache does not currently support model {name} with 'decoupled' transaction "
            "policy. Please disable the response cache.",
            "response_cache",
        )

    if config.HasField("model_metrics"):
        for control in config.model_metrics.metric_control:
            if not control.HasField("metric_identifier"):
                raise _fail(config, "metric control must specify 'metric_identifier'")
            if not control.metric_identifier.family:
                raise _fail(config, "metric identifier must specify non-empty 'family'")
            if not control.HasField("histogram_options"):
                raise _fail(config, "metric control must specify 'histogram_options'")
            if len(control.histogram_options.buckets) == 0:
                raise _fail(config, "histogram options must specify non-empty 'buckets'")


def _validate_sequence_batching(config: Message) -> None:
    name = config.name
    sb = config.sequence_batching
    if config.response_cache.enable:
        raise _fail(
            config,
            f"Response Cache does not currently support model {name} with sequence batching scheduler. "
            "Please disable the response cache.",
            "response_cache",
        )
    for kind in ("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_READY"):
        _sequence_control(config, kind, typed=False)
    corrid_type = _sequence_control(config, "CONTROL_SEQUENCE_CORRID", typed=True)
    if corrid_type is not None and corrid_type not in _CORRID_TYPES:
        raise _fail(
            config,
            f"unexpected data type for control CONTROL_SEQUENCE_CORRID for {name}. Allowed data types are "
            "TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING",
            "CONTROL_SEQUENCE_CORRID",
        )
    if sb.HasField("oldest"):
        for size in sb.oldest.preferred_batch_size:
            if size <= 0:
                raise _fail(config, f"sequence batching preferred batch size must be positive for {name}", "preferred_batch_size")
            if size > config.max_batch_size:
                raise _fail(
                    config, f"sequence batching preferred batch size must be <= max batch size for {name}", "preferred_batch_size"
                )
    if sb.HasField("direct"):
        utilization = sb.direct.minimum_slot_utilization
        if utilization < 0.0 or utilization > 1.0:
            raise _fail(
                config,
                f"sequence batching minimum slot utilization must be in range (0.0, 1.0] for {name}",
                "minimum_slot_utilization",
            )


_CORRID_TYPES = {pb2.TYPE_UINT64, pb2.TYPE_INT64, pb2.TYPE_UINT32, pb2.TYPE_INT32, pb2.TYPE_STRING}


def _sequence_control(config: Message, kind: str, typed: bool) -> int | None:
    """GetBooleanSequenceControlProperties / GetTypedSequenceControlProperties (not required):
    the checks, in Triton's order; returns the control's data type when it is present."""
    name = config.name
    kind_value = pb2.ModelSequenceBatching.Control.Kind.Value(kind)
    seen_tensors: set[str] = set()
    found: int | None = None
    for control_input in config.sequence_batching.control_input:
        tensor = control_input.name
        if not tensor:
            raise _fail(config, f"sequence batching control tensor must have a name for {name}", "control_input")
        if tensor in seen_tensors:
            raise _fail(
                config,
                f"sequence batching control tensor '{tensor}' is specified for multiple control kinds for {name}",
                f'"{tensor}"',
            )
        seen_tensors.add(tensor)
        for control in control_input.control:
            if control.kind != kind_value:
                continue
            if found is not None:
                raise _fail(config, f"sequence batching specifies multiple {kind} tensors for {name}", kind)
            given = [
                field
                for field in ("int32_false_true", "fp32_false_true", "bool_false_true")
                if len(getattr(control, field)) > 0
            ]
            if typed:
                found = control.data_type
                if given:
                    raise _fail(
                        config,
                        "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
                        f"'bool_false_true' for {kind} for {name}",
                        kind,
                    )
                continue
            if not given:
                raise _fail(
                    config,
                    "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
                    f"'bool_false_true' for {kind} for {name}",
                    kind,
                )
            if len(given) > 1:
                raise _fail(
                    config,
                    "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and "
                    f"'bool_false_true' for {kind} for {name}",
                    kind,
                )
            field = given[0]
            if len(getattr(control, field)) != 2:
                raise _fail(
                    config, f"sequence batching control '{field}' must have exactly 2 entries for {kind} for {name}", kind
                )
            found = {"int32_false_true": pb2.TYPE_INT32, "fp32_false_true": pb2.TYPE_FP32}.get(field, pb2.TYPE_BOOL)
    return found


# --- Ensemble scheduling (ValidateEnsembleSchedulingConfig) --------------------------------------


def validate_ensemble_scheduling(config: Message) -> None:
    name = config.name
    if config.platform != ENSEMBLE_PLATFORM:
        raise _fail(
            config,
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not {ENSEMBLE_PLATFORM}",
            "ensemble_scheduling",
        )
    if len(config.instance_group) != 0:
        raise _fail(config, f"instance group should not be specified for ensemble '{name}'", "instance_group")
    if config.HasField("optimization"):
        raise _fail(config, f"optimization should not be specified for ensemble '{name}'", "optimization")
    if len(config.model_warmup) != 0:
        raise _fail(config, f"model_warmup can not be specified for ensemble '{name}'", "model_warmup")
    steps = config.ensemble_scheduling.step
    if len(steps) == 0:
        raise _fail(config, f"must specify 'step' for ensemble '{name}'", "ensemble_scheduling")

    # Build the data-flow graph: node = ensemble tensor.
    is_output: dict[str, bool] = {}
    prev: dict[str, list[str]] = {}
    nxt: dict[str, list[str]] = {}
    order: list[str] = []

    def node(tensor: str, output: bool) -> None:
        if tensor not in is_output:
            is_output[tensor] = output
            prev[tensor] = []
            nxt[tensor] = []
            order.append(tensor)

    for idx, step in enumerate(steps):
        if not step.model_name:
            raise _fail(config, f"must specify 'model_name' in step {idx} of ensemble '{name}'", "step")
        if len(step.input_map) == 0:
            raise _fail(config, f"must specify 'input_map' in step {idx} of ensemble '{name}'", "step")
        if len(step.output_map) == 0:
            raise _fail(config, f"must specify 'output_map' in step {idx} of ensemble '{name}'", "step")
        produced: list[str] = []
        for _, tensor in sorted(step.output_map.items()):
            if tensor in is_output:
                if is_output[tensor]:
                    raise _fail(
                        config,
                        f"ensemble tensor '{tensor}' can appear in an output map only once for ensemble "
                        f"'{name}' step {idx}",
                        f'"{tensor}"',
                    )
                is_output[tensor] = True
            else:
                node(tensor, True)
            produced.append(tensor)
        for _, tensor in sorted(step.input_map.items()):
            node(tensor, False)
            for out in produced:
                prev[out].append(tensor)
                nxt[tensor].append(out)

    ready = {t: False for t in order}
    queue: list[str] = []
    for inp in config.input:
        if inp.name not in ready:
            raise _fail(config, f"ensemble input '{inp.name}' for ensemble {name}' is not used", f'"{inp.name}"')
        ready[inp.name] = True
        queue.append(inp.name)
    while queue:
        current = queue.pop(0)
        for candidate in nxt[current]:
            if ready[candidate]:
                continue
            if all(ready[p] for p in prev[candidate]):
                ready[candidate] = True
                queue.append(candidate)

    outputs: set[str] = set()
    for out in config.output:
        if out.name not in ready:
            raise _fail(config, f"ensemble output '{out.name}' for ensemble {name}' is not used", f'"{out.name}"')
        if not ready[out.name]:
            message = f"output '{out.name}' for ensemble '{name}' is not written"
            last = out.name
            seen: set[str] = set()
            frontier = prev[out.name]
            while frontier:
                following = None
                for p in frontier:
                    if not ready[p] and p not in seen:
                        seen.add(p)
                        last = p
                        following = prev[p]
                        break
                frontier = following or []
            if last != out.name:
                message += f": at least one of its depending tensors, '{last}', is not connected"
            raise _fail(config, message, f'"{out.name}"')
        outputs.add(out.name)

    for tensor in sorted(order):
        if tensor in outputs:
            continue
        if not ready[tensor] or not nxt[tensor]:
            raise _fail(config, f"ensemble tensor '{tensor}' is unused in ensemble '{name}'", f'"{tensor}"')


# --- ValidateModelIOConfig -----------------------------------------------------------------------


def _validate_io_shape(io: Message, max_batch_size: int, prefix: str) -> str | None:
    if not io.name:
        return prefix + "must specify 'name'"
    named = f"{prefix}'{io.name}' "
    if io.data_type == TYPE_INVALID:
        return named + "must specify 'data_type'"
    if len(io.dims) == 0:
        return named + "must specify 'dims'"
    if io.HasField("reshape") and len(io.reshape.shape) == 0 and max_batch_size == 0:
        return named + "cannot have empty reshape for non-batching model as scalar tensors are not supported"
    for d in io.dims:
        if d < 1 and d != WILDCARD_DIM:
            return named + "dimension must be integer >= 1, or -1 to indicate a variable-size dimension"
    if io.HasField("reshape"):
        for d in io.reshape.shape:
            if d < 1 and d != WILDCARD_DIM:
                return named + "reshape dimensions must be integer >= 1, or -1 to indicate a variable-size dimension"
        dims_size = element_count(io.dims)
        reshape_size = element_count(io.reshape.shape) if len(io.reshape.shape) else 0
        if dims_size != reshape_size and (reshape_size != 0 or dims_size != 1):
            return named + "has different size for dims and reshape"
        if dims_size == -1:
            def trunks(shape) -> list[int]:
                out, current = [], 1
                for d in shape:
                    if d != WILDCARD_DIM:
                        current *= d
                    else:
                        out.append(current)
                        current = 1
                out.append(current)
                return out

            a, b = trunks(io.dims), trunks(io.reshape.shape)
            if len(a) != len(b):
                return named + "has different number of variable-size dimensions for dims and reshape"
            if a != b:
                return named + "has different size for dims and reshape"
    return None


def _validate_non_linear(io: Message, platform: str, is_input: bool) -> str | None:
    if not io.is_non_linear_format_io:
        return None
    if platform != TENSORRT_PLATFORM:
        return "Non-linear IO format is only supported for the TensorRT platform"
    if len(io.dims) != 3:
        return f"Non-linear IO format {'input' if is_input else 'output'} requires 3 dims"
    return None


def validate_model_io_config(config: Message) -> None:
    for io in config.input:
        problem = _validate_io_shape(io, config.max_batch_size, "model input ")
        if problem is None and io.format in (ModelInput.FORMAT_NHWC, ModelInput.FORMAT_NCHW) and len(io.dims) != 3:
            problem = "model input NHWC/NCHW require 3 dims"
        if problem is None and config.platform != TENSORRT_PLATFORM and io.is_shape_tensor:
            problem = "shape tensors are only supported for TensorRT platform"
        problem = problem or _validate_non_linear(io, config.platform, True)
        if problem:
            raise _fail(config, f"{problem} for {config.name}", f'"{io.name}"' if io.name else "input")
    for io in config.output:
        problem = _validate_io_shape(io, config.max_batch_size, "model output ")
        if problem is None and config.platform != TENSORRT_PLATFORM and io.is_shape_tensor:
            problem = "shape tensors are only supported for TensorRT platform"
        problem = problem or _validate_non_linear(io, config.platform, False)
        if problem:
            raise _fail(config, f"{problem} for {config.name}", f'"{io.name}"' if io.name else "output")
    problem = _validate_batch_io(config)
    if problem:
        raise _fail(config, f"{problem} for {config.name}")


def _validate_batch_io(config: Message) -> str | None:
    inputs = {io.name for io in config.input}
    outputs = {io.name for io in config.output}
    for bi in config.batch_input:
        kind = pb2.BatchInput.Kind.Name(bi.kind)
        if len(bi.source_input) != 1:
            return f"batch input kind '{kind}' expects 1 source input, got {len(bi.source_input)}"
        if bi.data_type not in (pb2.TYPE_INT32, pb2.TYPE_FP32):
            return "batch input data type must be TYPE_INT32 or TYPE_FP32"
        for source in bi.source_input:
            if source not in inputs:
                return f"unknown source input name '{source}'"
    for bo in config.batch_output:
        kind = pb2.BatchOutput.Kind.Name(bo.kind)
        if len(bo.source_input) != 1:
            return f"batch output kind '{kind}' expects 1 source input, got {len(bo.source_input)}"
        for source in bo.source_input:
            if source not in inputs:
                return f"unknown source input name '{source}'"
        seen: set[str] = set()
        for target in bo.target_name:
            if target not in outputs:
                return f"unknown target output name '{target}'"
            if target in seen:
                return f"target output name '{target}' can only be specified once"
            seen.add(target)
    return None


# --- ValidateInstanceGroup -----------------------------------------------------------------------


def validate_instance_groups(config: Message, supported_gpus: set[int]) -> None:
    if config.HasField("ensemble_scheduling"):
        return
    name = config.name
    if len(config.instance_group) == 0:
        raise _fail(config, f"must specify one or more 'instance group's for {name}")
    for group in config.instance_group:
        prefix = f"instance group {group.name} of model {name}"
        # the group's line: its name when the config gives one, else its kind
        hint = (f'"{group.name}"', ModelInstanceGroup.Kind.Name(group.kind), "instance_group")
        if group.kind == ModelInstanceGroup.KIND_MODEL:
            if len(group.gpus) > 0:
                raise _fail(config, f"{prefix} has kind KIND_MODEL but specifies one or more GPUs", hint)
        elif group.kind == ModelInstanceGroup.KIND_GPU:
            if len(group.gpus) == 0:
                if not supported_gpus:
                    raise _fail(config, f"{prefix} has kind KIND_GPU but no GPUs are available", hint)
                raise _fail(config, f"{prefix} has kind KIND_GPU but specifies no GPUs", hint)
            for gid in group.gpus:
                if gid not in supported_gpus:
                    available = ", ".join(str(g) for g in sorted(supported_gpus))
                    raise _fail(
                        config,
                        f"{prefix} specifies invalid or unsupported gpu id {gid}. GPUs with at least the "
                        f"minimum required CUDA compute compatibility of 6.000000 are: {available}",
                        ("gpus", *hint),
                    )
        elif group.kind == ModelInstanceGroup.KIND_CPU:
            if len(group.gpus) > 0:
                raise _fail(config, f"{prefix} has kind KIND_CPU but specifies one or more GPUs", hint)
        else:
            raise _fail(config, f"{prefix} has unexpected kind KIND_AUTO", hint)
        if config.platform != TENSORRT_PLATFORM and len(group.profile) > 0:
            raise _fail(
                config,
                f"{prefix} and platform {config.platform}specifies profile field which is only "
                "supported for TensorRT models",
                "profile",
            )
        for profile in group.profile:
            if not profile:
                raise _fail(config, "profile name must not be empty", "profile")
            index = _stoi(profile)
            if index is None:
                raise _fail(config, f"unable to parse '{profile}': stoi", "profile")
            if index < 0:
                raise _fail(
                    config,
                    f"{prefix} and platform {config.platform} specifies invalid profile {profile}. The field "
                    "should contain the string representation of a non-negative integer.",
                    "profile",
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


# --- Sizes -----------------------------------------------------------------------------------------


_BYTE_SIZES = {
    pb2.TYPE_BOOL: 1, pb2.TYPE_UINT8: 1, pb2.TYPE_INT8: 1,
    pb2.TYPE_UINT16: 2, pb2.TYPE_INT16: 2, pb2.TYPE_FP16: 2, pb2.TYPE_BF16: 2,
    pb2.TYPE_UINT32: 4, pb2.TYPE_INT32: 4, pb2.TYPE_FP32: 4,
    pb2.TYPE_UINT64: 8, pb2.TYPE_INT64: 8, pb2.TYPE_FP64: 8,
}


def data_type_byte_size(data_type: int) -> int:
    """Bytes per element; 0 for TYPE_STRING (variable) and TYPE_INVALID."""
    return _BYTE_SIZES.get(data_type, 0)
