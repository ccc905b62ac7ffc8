"""What Triton keeps of a python model's `auto_complete_config` result, on Triton's config JSON.

One implementation for both places the toolkit completes python models: the compiler
(toolkit/repository/python_autocomplete.py converts its protobuf config to JSON and back around
`update_model_config`) and the image build's completion step (`complete.py`), where no protobuf
is installed.

`TritonModel::UpdateModelConfig` (core backend_model.cc, tritonserver 2.51) keeps, from the
config the model returns:

- `max_batch_size`, `input` and `output`, replaced as a whole (absent ones become 0 / empty);
- the scheduler (`dynamic_batching` / `sequence_batching` / `ensemble_scheduling`) only when the
  config had none; a config that had one and gets another (or none) back fails with
  "Cannot update scheduling choice from N to N when auto-completing." (N: the field number of
  the config's own choice, printed twice by Triton);
- `model_transaction_policy.decoupled` when the returned config has the policy;

and runs NormalizeModelConfig again: of its defaults, those an update can change are filled in
here (`preferred_batch_size` = [max_batch_size] for a dynamic batcher without one; a sequence
batcher's idle timeout and `oldest` preferred size). Everything else the model writes into
`as_dict()` is dropped.

The returned dict comes from user code, so every kept field is checked against Triton's
ModelConfig message (field names, JSON types, enum names, integer ranges; protobuf's JSON
spellings are accepted: camelCase names, integers as strings, enum numbers) and rendered as
Triton renders configs (every field without presence printed, declaration order), so the host
and the image produce the same JSON. Unknown top-level fields and more than one scheduler are
errors too. Deviation: tritonserver 2.51 keeps the unchanged config when the returned one does
not parse; here it is an error naming the field (docs/python-backend.md).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...config.errors import CODE_INTERNAL, ConfigError

# --- Triton's ModelConfig message, the parts an update touches (model_config.proto) -------------------

DATA_TYPES = (
    "TYPE_INVALID", "TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64", "TYPE_INT8",
    "TYPE_INT16", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32", "TYPE_FP64", "TYPE_STRING", "TYPE_BF16",
)  # the index is the enum number
FORMATS = ("FORMAT_NONE", "FORMAT_NHWC", "FORMAT_NCHW")
TIMEOUT_ACTIONS = ("REJECT", "DELAY")
ENUMS: dict[str, tuple[str, ...]] = {"DataType": DATA_TYPES, "Format": FORMATS, "TimeoutAction": TIMEOUT_ACTIONS}

# Top-level fields of ModelConfig in declaration order (the order Triton prints them in).
CONFIG_FIELDS = (
    "name", "platform", "backend", "runtime", "version_policy", "max_batch_size", "input", "output",
    "batch_input", "batch_output", "optimization", "dynamic_batching", "sequence_batching",
    "ensemble_scheduling", "instance_group", "default_model_filename", "cc_model_filenames", "metric_tags",
    "parameters", "model_warmup", "model_operations", "model_transaction_policy", "model_repository_agents",
    "response_cache", "model_metrics",
)
# The scheduling_choice oneof: field name -> field number (what Triton's message prints).
SCHEDULERS = {"dynamic_batching": 11, "sequence_batching": 13, "ensemble_scheduling": 15}

_INT_RANGES = {
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint64": (0, 2**64 - 1),
}


@dataclass(frozen=True)
class Field:
    name: str
    kind: str  # "string", "bool", an integer kind of _INT_RANGES, "enum", "message" or "map"
    repeated: bool = False
    type: str | None = None  # the enum or message type (map: the value's message type)
    presence: bool = False  # a message field: printed only when set

    @property
    def json_name(self) -> str:
        head, *rest = self.name.split("_")
        return head + "".join(part.capitalize() for part in rest)


MESSAGES: dict[str, tuple[Field, ...]] = {
    "ModelInput": (
        Field("name", "string"),
        Field("data_type", "enum", type="DataType"),
        Field("format", "enum", type="Format"),
        Field("dims", "int64", repeated=True),
        Field("reshape", "message", type="ModelTensorReshape", presence=True),
        Field("is_shape_tensor", "bool"),
        Field("allow_ragged_batch", "bool"),
        Field("optional", "bool"),
        Field("is_non_linear_format_io", "bool"),
    ),
    "ModelOutput": (
        Field("name", "string"),
        Field("data_type", "enum", type="DataType"),
        Field("dims", "int64", repeated=True),
        Field("reshape", "message", type="ModelTensorReshape", presence=True),
        Field("label_filename", "string"),
        Field("is_shape_tensor", "bool"),
        Field("is_non_linear_format_io", "bool"),
    ),
    "ModelTensorReshape": (Field("shape", "int64", repeated=True),),
    "ModelDynamicBatching": (
        Field("preferred_batch_size", "int32", repeated=True),
        Field("max_queue_delay_microseconds", "uint64"),
        Field("preserve_ordering", "bool"),
        Field("priority_levels", "uint64"),
        Field("default_priority_level", "uint64"),
        Field("default_queue_policy", "message", type="ModelQueuePolicy", presence=True),
        Field("priority_queue_policy", "map", type="ModelQueuePolicy"),  # map<uint64, ModelQueuePolicy>
    ),
    "ModelQueuePolicy": (
        Field("timeout_action", "enum", type="TimeoutAction"),
        Field("default_timeout_microseconds", "uint64"),
        Field("allow_timeout_override", "bool"),
        Field("max_queue_size", "uint32"),
    ),
    "ModelTransactionPolicy": (Field("decoupled", "bool"),),
}


class _Invalid(Exception):
    """A value that does not fit the message; the text names where (`input[1].dims[0]: ...`)."""


def _integer(value: Any, kind: str, path: str) -> int:
    if isinstance(value, bool):
        raise _Invalid(f"{path}: expected an integer, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    elif isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise _Invalid(f"{path}: expected an integer, got {value!r}") from None
    if not isinstance(value, int):
        raise _Invalid(f"{path}: expected an integer, got {value!r}")
    low, high = _INT_RANGES[kind]
    if not low <= value <= high:
        raise _Invalid(f"{path}: {value} is out of range for {kind}")
    return value


def _enum(value: Any, type_name: str, path: str) -> str:
    names = ENUMS[type_name]
    if isinstance(value, str) and value in names:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
        return names[value]
    raise _Invalid(f"{path}: {value!r} is not a {type_name} ({', '.join(names)})")


def _default(field: Field) -> Any:
    """The value Triton prints for a field without presence that is not set."""
    if field.repeated:
        return []
    if field.kind == "enum":
        assert field.type is not None
        return ENUMS[field.type][0]
    return {"string": "", "bool": False, "map": {}}.get(field.kind, 0)


def _single(field: Field, value: Any, path: str) -> Any:
    if field.kind == "string":
        if not isinstance(value, str):
            raise _Invalid(f"{path}: expected a string, got {value!r}")
        return value
    if field.kind == "bool":
        if not isinstance(value, bool):
            raise _Invalid(f"{path}: expected true or false, got {value!r}")
        return value
    if field.kind == "enum":
        assert field.type is not None
        return _enum(value, field.type, path)
    if field.kind == "message":
        assert field.type is not None
        return render_message(value, field.type, path)
    return _integer(value, field.kind, path)


def render_message(value: Any, type_name: str, path: str) -> dict[str, Any]:
    """`value` checked against message `type_name` and printed as Triton prints it; raises
    `_Invalid` naming the first problem."""
    if not isinstance(value, Mapping):
        raise _Invalid(f"{path}: expected an object, got {value!r}")
    fields = MESSAGES[type_name]
    by_key = {f.name: f for f in fields} | {f.json_name: f for f in fields}
    given: dict[str, Any] = {}
    for key, item in value.items():
        field = by_key.get(key) if isinstance(key, str) else None
        if field is None:
            raise _Invalid(f"{path}: {type_name} has no field {key!r}")
        if field.name in given:
            raise _Invalid(f"{path}: field '{field.name}' is given twice")
        given[field.name] = item
    out: dict[str, Any] = {}
    for field in fields:
        item = given.get(field.name)
        where = f"{path}.{field.name}" if path else field.name
        if item is None:  # absent, or JSON null: unset, as protobuf's JSON parser takes it
            if not field.presence:
                out[field.name] = _default(field)
            continue
        if field.kind == "map":
            if not isinstance(item, Mapping):
                raise _Invalid(f"{where}: expected an object, got {item!r}")
            assert field.type is not None
            out[field.name] = {
                str(_integer(k, "uint64", f"{where} key")): render_message(v, field.type, f"{where}[{k!r}]")
                for k, v in item.items()
            }
        elif field.repeated:
            if not isinstance(item, list):
                raise _Invalid(f"{where}: expected a list, got {item!r}")
            out[field.name] = [_single(field, v, f"{where}[{i}]") for i, v in enumerate(item)]
        else:
            out[field.name] = _single(field, item, where)
    return out


def order_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config's top-level fields in Triton's (declaration) order."""
    ordered = {k: config[k] for k in CONFIG_FIELDS if k in config}
    ordered.update((k, v) for k, v in config.items() if k not in ordered)
    return ordered


# --- UpdateModelConfig ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Returned:
    """What Triton reads from the config auto_complete_config returned, checked."""

    max_batch_size: int
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    scheduler: str | None
    scheduler_config: Any
    decoupled: bool | None  # None: the returned config has no model_transaction_policy


def read_returned(name: str, returned: Any) -> Returned:
    """The fields UpdateModelConfig keeps, checked; ConfigError naming the problem otherwise."""
    try:
        return _read_returned(returned)
    except _Invalid as exc:
        raise ConfigError(
            f"auto_complete_config of model '{name}' returned an invalid model configuration",
            detail=str(exc),
            code=CODE_INTERNAL,
        ) from None


def _read_returned(returned: Any) -> Returned:
    if not isinstance(returned, Mapping):
        raise _Invalid(f"expected an object, got {returned!r}")
    camel = {Field(n, "string").json_name: n for n in CONFIG_FIELDS}
    data: dict[str, Any] = {}
    for key, value in returned.items():
        field = key if key in CONFIG_FIELDS else camel.get(key) if isinstance(key, str) else None
        if field is None:
            raise _Invalid(f"ModelConfig has no field {key!r}")
        if field in data:
            raise _Invalid(f"field '{field}' is given twice")
        if value is not None:
            data[field] = value

    max_batch_size = _integer(data["max_batch_size"], "int32", "max_batch_size") if "max_batch_size" in data else 0
    ios: dict[str, list[dict[str, Any]]] = {}
    for kind, type_name in (("input", "ModelInput"), ("output", "ModelOutput")):
        items = data.get(kind, [])
        if not isinstance(items, list):
            raise _Invalid(f"{kind}: expected a list, got {items!r}")
        ios[kind] = [render_message(item, type_name, f"{kind}[{i}]") for i, item in enumerate(items)]

    chosen = [s for s in SCHEDULERS if s in data]
    if len(chosen) > 1:
        raise _Invalid(f"more than one scheduler of the oneof scheduling_choice: {', '.join(chosen)}")
    scheduler = chosen[0] if chosen else None
    scheduler_config: Any = None
    if scheduler == "dynamic_batching":
        scheduler_config = render_message(data[scheduler], "ModelDynamicBatching", scheduler)
    elif scheduler is not None:
        # Kept as given: the product serves neither (the support checks refuse them after
        # Triton's checks); the compiler's protobuf parse checks their content.
        if not isinstance(data[scheduler], Mapping):
            raise _Invalid(f"{scheduler}: expected an object, got {data[scheduler]!r}")
        scheduler_config = copy.deepcopy(dict(data[scheduler]))

    decoupled = None
    if "model_transaction_policy" in data:
        policy = render_message(data["model_transaction_policy"], "ModelTransactionPolicy", "model_transaction_policy")
        decoupled = policy["decoupled"]
    return Returned(max_batch_size, ios["input"], ios["output"], scheduler, scheduler_config, decoupled)


def update_model_config(config: Mapping[str, Any], returned: Any) -> dict[str, Any]:
    """`config` (Triton's JSON of the config auto_complete_config received) updated with what
    Triton keeps of `returned`, normalised again. `config` is not modified."""
    name = str(config.get("name", ""))
    kept = read_returned(name, returned)
    updated = copy.deepcopy(dict(config))
    updated["max_batch_size"] = kept.max_batch_size
    updated["input"] = kept.inputs
    updated["output"] = kept.outputs
    current = next((s for s in SCHEDULERS if s in updated), None)
    if current is None:
        if kept.scheduler is not None:
            updated[kept.scheduler] = kept.scheduler_config
    elif current != kept.scheduler:
        number = SCHEDULERS[current]
        raise ConfigError(
            f"Cannot update scheduling choice from {number} to {number} when auto-completing.", code=CODE_INTERNAL
        )
    if kept.decoupled is not None:
        updated["model_transaction_policy"] = {"decoupled": kept.decoupled}
    normalize_update(updated)
    return order_config(updated)


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def normalize_update(config: dict[str, Any]) -> None:
    """NormalizeModelConfig's defaults for the fields an update can change (in place)."""
    max_batch_size = int(config.get("max_batch_size", 0))
    dynamic = config.get("dynamic_batching")
    if isinstance(dynamic, dict) and not dynamic.get("preferred_batch_size") and max_batch_size > 0:
        dynamic["preferred_batch_size"] = [max_batch_size]
    sequence = config.get("sequence_batching")
    if isinstance(sequence, dict):
        if not _as_int(sequence.get("max_sequence_idle_microseconds", 0)):
            sequence["max_sequence_idle_microseconds"] = 1_000_000
        oldest = sequence.get("oldest")
        if isinstance(oldest, dict) and not oldest.get("preferred_batch_size") and max_batch_size > 0:
            oldest["preferred_batch_size"] = [max_batch_size]


__all__ = [
    "CONFIG_FIELDS",
    "DATA_TYPES",
    "MESSAGES",
    "SCHEDULERS",
    "Field",
    "Returned",
    "normalize_update",
    "order_config",
    "read_returned",
    "render_message",
    "update_model_config",
]
