"""How Triton's pytorch backend reads a model config, without torch: parameters, tensor naming,
datatypes. One implementation, used by the instances (instance.py) and by toolkit's compile-time
checks (toolkit/repository/torchscript.py), so `toolkit validate` and the image agree.

The rules and messages are those of tritonserver 2.51's pytorch_backend (src/libtorch.cc, r24.10):

- parameters (ModelState::ParseParameters, in its order): DISABLE_OPTIMIZED_EXECUTION,
  ENABLE_CACHE_CLEANING, INFERENCE_MODE, DISABLE_CUDNN, ENABLE_TENSOR_FUSER,
  ENABLE_WEIGHT_SHARING, ENABLE_JIT_PROFILING, ENABLE_JIT_EXECUTOR, INTRA_OP_THREAD_COUNT,
  INTER_OP_THREAD_COUNT; booleans as backend_common's ParseBoolValue reads them, counts as
  std::stoi does (a count <= 0 is ignored);
- inputs (ValidateInputs): a forward taking one `Dict[str, Tensor]` gets every input under its
  config name; otherwise every forward argument must be a Tensor or a List, their number must
  equal the config's inputs, and config names map to arguments by one convention for all inputs:
  the forward's argument names when every config name is one, else `<name>__<index>` when every
  config name has that form, else the config's order (with tritonserver's warning);
- outputs (ValidateOutputs): `<name>__<index>` when every output has that form, else the config's
  order; there is no auto-complete, so a config without inputs or outputs is refused;
- datatypes: BOOL, UINT8, INT8, INT16, INT32, INT64, FP16, FP32, FP64 and STRING (a
  one-dimensional `List[str]`, batch dimension included).

Where tritonserver misbehaves, this refuses at load time instead (docs/triton-compatibility.md):
an `INPUT__<n>` index beyond the forward's arguments, or two inputs mapped to one argument (an
out-of-range write or a silently unset argument there), and a thread count std::stoi cannot hold
(an uncaught exception there).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...batching.sequence_policy import control_input_names

# Triton datatype -> torch dtype name (libtorch_utils.cc ModelConfigDataTypeToTorchType).
TORCH_DTYPES = {
    "TYPE_BOOL": "bool",
    "TYPE_UINT8": "uint8",
    "TYPE_INT8": "int8",
    "TYPE_INT16": "int16",
    "TYPE_INT32": "int32",
    "TYPE_INT64": "int64",
    "TYPE_FP16": "float16",
    "TYPE_FP32": "float32",
    "TYPE_FP64": "float64",
}
STRING = "TYPE_STRING"
DEFAULT_FILENAME = "model.pt"

# TRITONSERVER_Error_Code names (handlers.errors.ErrorCode values).
INTERNAL, INVALID_ARG, UNAVAILABLE = "INTERNAL", "INVALID_ARG", "UNAVAILABLE"

FORWARD_ARGUMENT = "FORWARD_ARGUMENT"
NAMED_INDEX = "NAMED_INDEX"
STRICT_CONFIG_ORDERING = "STRICT_CONFIG_ORDERING"


class ConfigError(Exception):
    """The backend refuses the model; `code` is the TRITONSERVER_Error_Code tritonserver uses."""

    def __init__(self, message: str, code: str = INTERNAL) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


# --- parameters -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Parameters:
    """The backend's settings of one model (ModelState's members, with their defaults)."""

    optimized_execution: bool = True
    inference_mode: bool = True
    cudnn: bool = True
    cache_cleaning: bool = False
    weight_sharing: bool = False
    # None: not set in the config, torch's process-wide setting is left alone.
    tensor_fuser: bool | None = None
    jit_profiling: bool | None = None
    jit_executor: bool | None = None
    intra_op_threads: int | None = None  # > 0 when set
    inter_op_threads: int | None = None


def _parameter(parameters: dict[str, Any], key: str) -> str | None:
    value = parameters.get(key)
    if value is None:
        return None
    return value.get("string_value", "") if isinstance(value, dict) else str(value)


def parse_bool(text: str) -> bool:
    """backend_common's ParseBoolValue."""
    lowered = text.lower()
    if lowered in ("true", "on", "1"):
        return True
    if lowered in ("false", "off", "0"):
        return False
    raise ConfigError(f"failed to convert '{text}' to boolean", INVALID_ARG)


_STOI = re.compile(r"^[ \t\n\v\f\r]*([+-]?\d+)")
_INT_MAX = 2**31 - 1


def parse_int(text: str) -> int:
    """backend_common's ParseIntValue (std::stoi: leading blanks, a sign, the leading digits)."""
    match = _STOI.match(text)
    if match is None:
        raise ConfigError(f"failed to convert '{text}' to integral number", INVALID_ARG)
    value = int(match[1])
    if not -_INT_MAX - 1 <= value <= _INT_MAX:
        raise ConfigError(f"failed to convert '{text}' to integral number: out of range", INVALID_ARG)
    return value


def parse_parameters(config: dict[str, Any]) -> Parameters:
    """ModelState::ParseParameters: the first bad value is the error."""
    parameters = config.get("parameters") or {}
    values: dict[str, Any] = {}

    def flag(key: str) -> bool | None:
        text = _parameter(parameters, key)
        return None if text is None else parse_bool(text)

    disable = flag("DISABLE_OPTIMIZED_EXECUTION")
    values["optimized_execution"] = not disable if disable is not None else True
    cleaning = flag("ENABLE_CACHE_CLEANING")
    if cleaning is not None:
        values["cache_cleaning"] = cleaning
    inference = flag("INFERENCE_MODE")
    if inference is not None:
        values["inference_mode"] = inference
    no_cudnn = flag("DISABLE_CUDNN")
    if no_cudnn is not None:
        values["cudnn"] = not no_cudnn
    values["tensor_fuser"] = flag("ENABLE_TENSOR_FUSER")
    sharing = flag("ENABLE_WEIGHT_SHARING")
    if sharing is not None:
        values["weight_sharing"] = sharing
    values["jit_profiling"] = flag("ENABLE_JIT_PROFILING")
    values["jit_executor"] = flag("ENABLE_JIT_EXECUTOR")
    for key, name in (("INTRA_OP_THREAD_COUNT", "intra_op_threads"), ("INTER_OP_THREAD_COUNT", "inter_op_threads")):
        text = _parameter(parameters, key)
        if text is not None:
            count = parse_int(text)
            if count > 0:
                values[name] = count
    return Parameters(**values)


# --- the forward signature ------------------------------------------------------------------------


@dataclass(frozen=True)
class Argument:
    """One argument of the module's `forward` (torch's FunctionSchema, as plain data)."""

    name: str
    kind: str  # c10::TypeKind name: ClassType, TensorType, ListType, DictType, ...
    type: str  # as torch prints it: Tensor, List[str], Dict[str, Tensor], ...


@dataclass(frozen=True)
class Signature:
    arguments: tuple[Argument, ...]
    returns: str  # the return type as torch prints it (Tensor, Tuple[Tensor, Tensor], ...)

    @property
    def inputs(self) -> tuple[Argument, ...]:
        """The arguments requests fill (`self`, a ClassType first argument, is left out)."""
        if self.arguments and self.arguments[0].kind == "ClassType":
            return self.arguments[1:]
        return self.arguments


# --- tensor naming --------------------------------------------------------------------------------


def _index_suffix(name: str) -> str | None:
    """The digits after the first '__' (possibly none), or None when the name does not follow
    `<name>__<index>` (as the backend reads it: std::string::find, then isdigit on the rest)."""
    position = name.find("__")
    if position < 0:
        return None
    suffix = name[position + 2 :]
    return suffix if all(c in "0123456789" for c in suffix) else None


def _index(name: str) -> int:
    suffix = name[name.find("__") + 2 :]
    return int(suffix) if suffix else 0  # std::atoi("") is 0


def naming_convention(names: Sequence[str], allowed: Sequence[str], kind: str, model: str, warnings: list[str]) -> str:
    """GetNamingConvention for inputs (`allowed`: the forward's argument names) or outputs."""
    convention = NAMED_INDEX
    if kind == "input" and all(name in allowed for name in names):
        convention = FORWARD_ARGUMENT
    if convention == NAMED_INDEX:
        for name in names:
            if "__" not in name:
                return STRICT_CONFIG_ORDERING
            if _index_suffix(name) is None:
                if kind == "input":
                    warnings.append(
                        f"input '{name}' or previous input(s) are neither an input argument to the model '{model}' nor "
                        "do they follow the <name>__<index> naming convention. Falling back to enforcing strict "
                        "ordering from model configuration."
                    )
                else:
                    warnings.append(
                        f"output '{name}' or previous output(s) of the model '{model}' do not follow the <name>__<index> "
                        "naming convention. Falling back to enforcing strict ordering from model configuration."
                    )
                return STRICT_CONFIG_ORDERING
    return convention


def _check_datatype(io: dict[str, Any], kind: str, model: str, batching: bool) -> None:
    name, dtype = io.get("name", ""), io.get("data_type", "TYPE_INVALID")
    if dtype not in TORCH_DTYPES and dtype != STRING:
        raise ConfigError(f"unsupported datatype {dtype} for {kind} '{name}' for model '{model}'")
    if dtype == STRING:
        dims = io["reshape"].get("shape", []) if "reshape" in io else io.get("dims", [])
        if len(dims) + (1 if batching else 0) > 1:
            raise ConfigError(
                f"Triton only supports 1 dimensional List of String as {kind} for '{name}' for model '{model}'"
            )


@dataclass(frozen=True)
class InputLayout:
    """How a request's inputs become the forward's arguments."""

    dict_input: bool  # forward(self, Dict[str, Tensor]): every input under its config name
    positions: dict[str, int]  # config input name -> argument index (not used for dict_input)
    arity: int  # number of forward arguments (besides self)
    convention: str | None = None


def input_layout(config: dict[str, Any], signature: Signature | None, warnings: list[str]) -> InputLayout:
    """ValidateInputs. Without `signature` (torch is not installed where this runs) only what the
    config alone decides is checked, and the layout is provisional."""
    model = config.get("name", "")
    inputs = config.get("input", [])
    batching = int(config.get("max_batch_size", 0)) > 0
    controls = _sequence_controls(config)
    states = _states(config)
    expected = len(inputs) + len(config.get("batch_input", [])) + len(controls) + len(states)
    arguments = signature.inputs if signature is not None else None
    dict_input = False
    allowed: list[str] = []
    if arguments is not None:
        if len(arguments) == 1 and arguments[0].kind == "DictType":
            dict_input = True
        elif arguments:
            if any(argument.kind == "DictType" for argument in arguments[1:]):
                raise ConfigError(
                    "Multiple inputs of kind DictType were detected. Only a single input of type Dict(str, Tensor) "
                    "is supported."
                )
            for argument in arguments:
                if argument.kind not in ("TensorType", "ListType"):
                    raise ConfigError(
                        f"An input of type '{argument.type}' was detected in the model. Only a single input of type "
                        "Dict(str, Tensor) or input(s) of type Tensor are supported."
                    )
                allowed.append(argument.name)
            if len(arguments) != expected:
                raise ConfigError(
                    f"unable to load model '{model}', configuration expects {expected} inputs, model provides "
                    f"{len(arguments)}",
                    INVALID_ARG,
                )
    if not inputs:
        raise ConfigError("model configuration must contain at least one input, none were specified.")
    names = [io.get("name", "") for io in inputs]
    convention = None
    positions: dict[str, int] = {}
    if not dict_input:
        convention = naming_convention(names, allowed, "input", model, warnings)
        if convention == FORWARD_ARGUMENT and arguments is None:
            convention = None  # decided by the forward's argument names, unknown here
    for position, io in enumerate(inputs):
        name = io.get("name", "")
        if convention == FORWARD_ARGUMENT:
            positions[name] = allowed.index(name)
        elif convention == NAMED_INDEX:
            positions[name] = _index(name)
        elif convention == STRICT_CONFIG_ORDERING or dict_input:
            positions[name] = position
        _check_datatype(io, "input", model, batching)
    _place_batch_inputs(config, positions, allowed, convention, dict_input)
    _place_state_inputs(config, positions, allowed, convention, dict_input)
    positions.update(controls)
    arity = len(arguments) if arguments is not None else len(inputs)
    if not dict_input and convention is not None:
        _check_positions(positions, arity, model, convention)
    return InputLayout(dict_input, positions, arity, convention)


def _sequence_controls(config: dict[str, Any]) -> dict[str, int]:
    """ValidateBooleanSequenceControl / ValidateTypedSequenceControl: each control tensor of
    `sequence_batching` is a forward argument named `<name>__<index>`, at that index."""
    positions: dict[str, int] = {}
    for name in dict.fromkeys(control_input_names(config)):
        if _index_suffix(name) is None:
            raise ConfigError(f"input '{name}' does not follow <name>__<index> naming convention.")
        positions[name] = _index(name)
    return positions


def _states(config: dict[str, Any]) -> list[dict[str, Any]]:
    return list((config.get("sequence_batching") or {}).get("state", []))


def _atoi(text: str) -> int:
    """std::atoi: an optional sign and the leading digits, else 0."""
    sign, rest = (-1 if text[:1] == "-" else 1, text[1:]) if text[:1] in ("+", "-") else (1, text)
    number = ""
    for character in rest:
        if not character.isdigit():
            break
        number += character
    return sign * int(number) if number else 0


def _place_state_inputs(
    config: dict[str, Any], positions: dict[str, int], allowed: list[str], convention: str | None, dict_input: bool
) -> None:
    """Implicit state (`sequence_batching { state }`): each state's input takes a forward argument
    by the inputs' convention, as ValidateInputs' AddInputToMap places it (by name, by its
    `__<index>`, or at the state's own index)."""
    model = config.get("name", "")
    for index, state in enumerate(_states(config)):
        name, dtype = state.get("input_name", ""), state.get("data_type", "TYPE_INVALID")
        if dtype not in TORCH_DTYPES and dtype != STRING:
            raise ConfigError(f"unsupported datatype {dtype} for input state '{name}' for model '{model}'")
        _place(positions, name, index, model, allowed, convention, dict_input,
               kind="state input", field="a state's input_name", example="INPUT_STATE__1")


def _place_batch_inputs(
    config: dict[str, Any], positions: dict[str, int], allowed: list[str], convention: str | None, dict_input: bool
) -> None:
    """Each batch input's target names take an argument by the inputs' convention (ValidateInputs'
    AddInputToMap): by name, by its `__<index>`, or after the config's inputs in order."""
    model, count = config.get("name", ""), len(config.get("input", []))
    targets = [str(t) for entry in config.get("batch_input", []) for t in entry.get("target_name", [])]
    for index, target in enumerate(targets):
        _place(positions, target, count + index, model, allowed, convention, dict_input,
               kind="batch input", field="a batch input's target_name", example="INDEX__1")


def _place(
    positions: dict[str, int], name: str, strict_position: int, model: str, allowed: list[str],
    convention: str | None, dict_input: bool, *, kind: str, field: str, example: str,
) -> None:
    """AddInputToMap for a tensor the config adds to the inputs (`kind`): its argument by name, by
    its `__<index>`, or at `strict_position`. Where tritonserver would pass it nowhere or to
    argument 0 (std::atoi of a name without an index), refused with the reason."""
    if dict_input or convention == STRICT_CONFIG_ORDERING:
        positions[name] = strict_position
    elif convention == FORWARD_ARGUMENT:
        if name not in allowed:
            raise ConfigError(
                f"{kind} '{name}' of model '{model}' is not an argument of forward ({', '.join(allowed)}): "
                f"the inputs are named after forward's arguments, so {field} must be one too",
                INVALID_ARG,
            )
        positions[name] = allowed.index(name)
    elif convention == NAMED_INDEX:
        if _index_suffix(name) is None:
            raise ConfigError(
                f"{kind} '{name}' of model '{model}' does not follow the <name>__<index> convention of the "
                f"model's inputs: name it after the forward argument it fills, as {example}",
                INVALID_ARG,
            )
        positions[name] = _index(name)


def _check_positions(positions: dict[str, int], arity: int, model: str, convention: str) -> None:
    """Refused here, undefined in tritonserver: indices beyond the forward's arguments, or two
    inputs for one argument."""
    taken: dict[int, str] = {}
    for name, index in positions.items():
        if index >= arity:
            raise ConfigError(
                f"input '{name}' of model '{model}' names forward argument {index} (<name>__<index> convention), "
                f"but forward takes {arity} input(s): number inputs from 0, as INPUT__0, INPUT__1, ...",
                INVALID_ARG,
            )
        if index in taken:
            raise ConfigError(
                f"inputs '{taken[index]}' and '{name}' of model '{model}' both name forward argument {index} "
                f"({convention.lower().replace('_', ' ')} convention)",
                INVALID_ARG,
            )
        taken[index] = name


@dataclass(frozen=True)
class OutputLayout:
    positions: dict[str, int] = field(default_factory=dict)  # config output name -> index in the outputs
    datatypes: dict[str, str] = field(default_factory=dict)  # config output name -> TYPE_*


def output_layout(config: dict[str, Any], warnings: list[str]) -> OutputLayout:
    """ValidateOutputs."""
    model = config.get("name", "")
    outputs = config.get("output", [])
    batching = int(config.get("max_batch_size", 0)) > 0
    if not outputs:
        raise ConfigError("model configuration must contain at least one output, none were specified.")
    names = [io.get("name", "") for io in outputs]
    convention = naming_convention(names, [], "output", model, warnings)
    positions: dict[str, int] = {}
    datatypes: dict[str, str] = {}
    for position, io in enumerate(outputs):
        name = io.get("name", "")
        _check_datatype(io, "output", model, batching)
        positions[name] = _index(name) if convention == NAMED_INDEX else position
        datatypes[name] = io.get("data_type", "TYPE_INVALID")
    for state in _states(config):  # a state's output is found by its `__<index>`, whatever the outputs' convention
        name, dtype = state.get("output_name", ""), state.get("data_type", "TYPE_INVALID")
        if dtype not in TORCH_DTYPES and dtype != STRING:
            raise ConfigError(f"unsupported datatype {dtype} for state '{name}' for model '{model}'")
        if dtype == STRING and len(state.get("dims", [])) + (1 if batching else 0) > 1:
            raise ConfigError(
                f"Triton only supports 1 dimensional List of String as output for '{name}' for model '{model}'"
            )
        position = name.find("__")
        positions[name] = _atoi(name[position + 2 :] if position >= 0 else name[1:])
        datatypes[name] = dtype
    return OutputLayout(positions, datatypes)


def return_warning(signature: Signature, model: str) -> str | None:
    """A warning for a forward whose declared return type every execution would refuse
    (tritonserver loads such a model, then fails each request: see instance.py `outputs`)."""
    returns = signature.returns.replace(" ", "")
    if returns == "Tensor" or returns == "List[str]":
        return None
    if returns.startswith("Tuple["):
        return None  # checked per element when it runs
    return (
        f"the forward of model '{model}' returns {signature.returns}: the pytorch backend (as tritonserver's) "
        "serves only a Tensor, a List[str] or a tuple of them, so every request will fail with \"output must be of "
        "type Tensor, List[str] or Tuple containing one of these two types\"; return a tuple in the order of the "
        "config's outputs"
    )
