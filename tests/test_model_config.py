"""config.pbtxt parsing (protobuf text format, Triton's ModelConfig) and Triton's JSON form."""

import json
import os
import subprocess
import sys

import pytest

from toolkit.repository.errors import ConfigParseError
from toolkit.repository.model_config import parse_config_text, to_triton_json, from_triton_json


def test_unknown_field_names_file_line_and_column():
    text = 'name: "m"\nmax_batch_size: 8\ninput [ { name: "x" data_type: TYPE_FP32 dimz: [ 1 ] } ]\n'
    with pytest.raises(ConfigParseError) as info:
        parse_config_text(text, "models/m/config.pbtxt")
    err = info.value
    assert (err.file, err.line) == ("models/m/config.pbtxt", 3)
    assert err.column == 42  # 1-based: the "d" of dimz
    assert 'no field named "dimz"' in err.message
    assert str(err).startswith("models/m/config.pbtxt:3:42: ")


def test_bad_enum_and_repeated_scalar_are_errors():
    with pytest.raises(ConfigParseError, match="TYPE_FLOAT32"):
        parse_config_text('input [ { name: "x" data_type: TYPE_FLOAT32 dims: [1] } ]')
    with pytest.raises(ConfigParseError, match="max_batch_size"):
        parse_config_text("max_batch_size: 1\nmax_batch_size: 2\n")


def test_triton_style_syntax_parses():
    # both list forms, colon-less messages, comments, enum by name, dims with -1
    text = """
    name: "text_detection"   # comment
    backend: "onnxruntime"
    max_batch_size : 256
    input [ { name: "input_images:0" data_type: TYPE_FP32 dims: [ -1, -1, -1, 3 ] } ]
    output [ { name: "a" data_type: TYPE_FP32 dims: [ -1, -1, -1, 1 ] } ]
    output [ { name: "b" data_type: TYPE_FP32 dims: [ -1, -1, -1, 5 ] } ]
    dynamic_batching { preferred_batch_size: 4 preferred_batch_size: [ 8 ] }
    parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
    """
    config = parse_config_text(text)
    assert [o.name for o in config.output] == ["a", "b"]
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8]


def test_json_has_int64_as_numbers_and_declaration_order():
    config = parse_config_text(
        'name: "m" max_batch_size: 8 version_policy { specific { versions: [1, 3] } }'
        ' input [ { name: "x" data_type: TYPE_FP32 dims: [ -1, 16 ] reshape { shape: [ 16 ] } } ]'
        ' dynamic_batching { max_queue_delay_microseconds: 100 default_queue_policy { default_timeout_microseconds: 5 } }'
        ' model_warmup [ { name: "w" batch_size: 1 inputs { key: "x" value { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } } } ]'
        ' instance_group [ { kind: KIND_GPU secondary_devices [ { kind: KIND_NVDLA device_id: 2 } ] } ]'
    )
    doc = to_triton_json(config)
    assert list(doc)[:6] == ["name", "platform", "backend", "runtime", "version_policy", "max_batch_size"]
    assert doc["input"][0]["dims"] == [-1, 16]
    assert doc["input"][0]["reshape"] == {"shape": [16]}
    assert doc["version_policy"] == {"specific": {"versions": [1, 3]}}
    assert doc["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert doc["dynamic_batching"]["default_queue_policy"]["default_timeout_microseconds"] == 5
    assert doc["model_warmup"][0]["inputs"]["x"]["dims"] == [16]
    # Triton's ModelConfigToJson does not fix this 64-bit field up: it stays a string there too
    assert doc["instance_group"][0]["secondary_devices"][0]["device_id"] == "2"
    # fields without presence are always printed, unset messages are not
    assert doc["output"] == [] and doc["parameters"] == {} and "sequence_batching" not in doc
    assert to_triton_json(from_triton_json(doc)) == doc


MAP_CONFIG = '''name: "m"
parameters { key: "b" value: { string_value: "1" } }
parameters { key: "a" value: { string_value: "2" } }
parameters { key: "c" value: { string_value: "3" } }
model_warmup [ { name: "w" batch_size: 1
  inputs { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [1] zero_data: true } }
  inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [1] zero_data: true } } } ]
'''


def test_map_fields_are_written_in_key_order_whatever_the_hash_seed():
    """Protobuf map order differs between processes; the compiled JSON (and so the build context
    and the image tag) must not: maps come out sorted by key."""
    script = (
        "import json, sys; from toolkit.repository.model_config import parse_config_text, to_triton_json; "
        "print(json.dumps(to_triton_json(parse_config_text(sys.stdin.read()))))"
    )
    outputs = {
        subprocess.run([sys.executable, "-c", script], input=MAP_CONFIG, capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout
        for seed in range(6)
    }
    assert len(outputs) == 1
    document = json.loads(outputs.pop())
    assert list(document["parameters"]) == ["a", "b", "c"]
    assert list(document["model_warmup"][0]["inputs"]) == ["INPUT0", "INPUT1"]
