"""Triton's `ModelConfig` protobuf message: text-format parsing and Triton's JSON rendering.

The message class is the one tritonclient ships (`tritonclient/grpc/model_config_pb2.py`). It is
loaded from its file rather than through `import tritonclient.grpc`, whose package `__init__`
imports grpcio (hundreds of milliseconds for a CLI that never speaks gRPC). If something imports
`tritonclient.grpc` later, Python finds this same module in `sys.modules`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from google.protobuf import descriptor as _descriptor
from google.protobuf import json_format, text_format
from google.protobuf.message import Message

from .errors import ConfigParseError

_PB2_NAME = "tritonclient.grpc.model_config_pb2"


def _load_pb2() -> ModuleType:
    module = sys.modules.get(_PB2_NAME)
    if module is not None:
        return module
    spec = importlib.util.find_spec("tritonclient")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("tritonclient is not installed; it provides Triton's model_config_pb2")
    path = Path(next(iter(spec.submodule_search_locations))) / "grpc" / "model_config_pb2.py"
    file_spec = importlib.util.spec_from_file_location(_PB2_NAME, path)
    assert file_spec is not None and file_spec.loader is not None
    module = importlib.util.module_from_spec(file_spec)
    sys.modules[_PB2_NAME] = module
    try:
        file_spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[_PB2_NAME]
        raise
    return module


pb2 = _load_pb2()
ModelConfig = pb2.ModelConfig
ModelInput = pb2.ModelInput
ModelOutput = pb2.ModelOutput
ModelInstanceGroup = pb2.ModelInstanceGroup
DataType = pb2.DataType

CONFIG_FILENAME = "config.pbtxt"


def parse_config_text(text: str, source: str | Path = CONFIG_FILENAME) -> Message:
    """Parse config.pbtxt text into a `ModelConfig`, as Triton's TextFormat parser does.

    Unknown fields, bad enum names and a non-repeated field given twice are errors; the error
    names the file, line and column.
    """
    config = ModelConfig()
    try:
        text_format.Parse(text, config, allow_unknown_extension=False)
    except text_format.ParseError as exc:
        line, column = exc.GetLine(), exc.GetColumn()
        message = str(exc)
        prefix = f"{line}:{column} : "
        if message.startswith(prefix):
            message = message[len(prefix):]
        raise ConfigParseError(str(source), line, column, message) from None
    return config


def read_config_file(path: Path) -> Message:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigParseError(str(path), None, None, f"not UTF-8 text ({exc.reason})") from None
    return parse_config_text(text, path)


def data_type_name(value: int) -> str:
    return DataType.Name(value)


# --- Triton's JSON rendering ---------------------------------------------------------------------
#
# Triton renders configs with protobuf's JSON printer (proto field names, fields without presence
# always printed, unset messages omitted) and then turns 64-bit integers back into JSON numbers.
# Fields appear in declaration order, as the C++ printer emits them.

_INT64_TYPES = {
    _descriptor.FieldDescriptor.TYPE_INT64,
    _descriptor.FieldDescriptor.TYPE_UINT64,
    _descriptor.FieldDescriptor.TYPE_SINT64,
    _descriptor.FieldDescriptor.TYPE_FIXED64,
    _descriptor.FieldDescriptor.TYPE_SFIXED64,
}


def _is_map(field: _descriptor.FieldDescriptor) -> bool:
    return (
        field.type == _descriptor.FieldDescriptor.TYPE_MESSAGE
        and field.message_type.GetOptions().map_entry
    )


# 64-bit fields Triton's ModelConfigToJson leaves as protobuf's JSON strings (it fixes up a fixed
# list of fields; these two are not on it).
_INT64_KEPT_AS_STRING = {
    "inference.ModelInstanceGroup.SecondaryDevice.device_id",
    "inference.ModelOptimizationPolicy.Cuda.GraphSpec.Shape.dim",
}


def _convert_value(field: _descriptor.FieldDescriptor, value: Any) -> Any:
    if field.type == _descriptor.FieldDescriptor.TYPE_MESSAGE:
        return _ordered(value, field.message_type)
    if field.type in _INT64_TYPES and field.full_name not in _INT64_KEPT_AS_STRING:
        return int(value)
    return value


def _ordered(data: dict[str, Any], desc: _descriptor.Descriptor) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in desc.fields:
        if field.name not in data:
            continue
        value = data[field.name]
        if _is_map(field):
            value_field = field.message_type.fields_by_name["value"]
            # Sorted: protobuf map order is arbitrary (it differs between processes), and the
            # compiled JSON must be byte-identical for identical inputs (reproducible builds).
            out[field.name] = {k: _convert_value(value_field, value[k]) for k in sorted(value)}
        elif field.is_repeated:
            out[field.name] = [_convert_value(field, v) for v in value]
        else:
            out[field.name] = _convert_value(field, value)
    return out


def to_triton_json(config: Message) -> dict[str, Any]:
    """The dict Triton returns from `GET /v2/models/{m}/config` for this config."""
    data = json_format.MessageToDict(
        config,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
    )
    return _ordered(data, config.DESCRIPTOR)


def from_triton_json(data: dict[str, Any]) -> Message:
    """Inverse of `to_triton_json` (used by tests and by `toolkit` reading compiled output)."""
    return json_format.ParseDict(data, ModelConfig())


def to_text(config: Message) -> str:
    return text_format.MessageToString(config)
