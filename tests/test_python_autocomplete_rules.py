"""The shared auto-complete rules on Triton's config JSON (handlers/backends/python/config_update.py)
and the config checks the compiler and the image build's completion step share (handlers/config):
what tritonserver keeps of auto_complete_config's result, its normalisation, and the checks run on
the completed config. The checks exist once; the compiler runs them on its protobuf message
rendered by Triton's JSON printer (to_triton_json), the image on the config as config_update
renders it, so both renderings must give the same verdict (message for message), and the
rendering must be exactly what Triton's JSON printer gives for the same message."""

from __future__ import annotations

import copy

import pytest

from handlers.backends.python import config_update
from handlers.backends.python.config_update import update_model_config
from handlers.config import ensemble as ensemble_rules
from handlers.config import support as support_rules
from handlers.config import validate as rules
from handlers.config.errors import ConfigError
from toolkit.repository.ensemble import validate_ensemble_config as toolkit_validate_ensemble_config
from toolkit.repository.errors import ModelError
from toolkit.repository.model_config import (
    ModelConfig,
    from_triton_json,
    parse_config_text,
    pb2,
    to_triton_json,
)
from toolkit.repository.normalize import normalize_model_config
from toolkit.repository.support import check_supported as toolkit_check_supported
from toolkit.repository.validate import validate_model_config, validate_model_io_config


def base(text: str = "") -> dict:
    """Triton's JSON of a python model's config as auto_complete_config receives it (normalised)."""
    config = parse_config_text('name: "m"\nbackend: "python"\n' + text)
    normalize_model_config(config)
    config.instance_group.add(name="m", kind=pb2.ModelInstanceGroup.KIND_CPU, count=1)
    return to_triton_json(config)


def returned_from(config: dict, **changes) -> dict:
    """What a model returns: the config it got (as_dict()), changed."""
    out = copy.deepcopy(config)
    out.update(changes)
    return out


def round_trips(config: dict) -> bool:
    """True when `config` is exactly what Triton's JSON printer gives for it."""
    return to_triton_json(from_triton_json(config)) == config and list(to_triton_json(from_triton_json(config))) == list(config)


# --- the message tables match Triton's ModelConfig protobuf -------------------------------------------


def test_message_tables_match_tritons_model_config_proto():
    assert config_update.CONFIG_FIELDS == tuple(f.name for f in ModelConfig.DESCRIPTOR.fields)
    oneof = ModelConfig.DESCRIPTOR.oneofs_by_name["scheduling_choice"]
    assert config_update.SCHEDULERS == {f.name: f.number for f in oneof.fields}
    assert config_update.DATA_TYPES == tuple(v.name for v in sorted(pb2.DataType.DESCRIPTOR.values, key=lambda v: v.number))
    assert [v.number for v in pb2.DataType.DESCRIPTOR.values] == list(range(len(config_update.DATA_TYPES)))
    descriptor = pb2.DESCRIPTOR
    for name, fields in config_update.MESSAGES.items():
        proto = descriptor.message_types_by_name[name]
        assert [f.name for f in fields] == [f.name for f in proto.fields], name
        for ours, theirs in zip(fields, proto.fields):
            assert ours.json_name == theirs.json_name
            is_map = theirs.message_type is not None and theirs.message_type.GetOptions().map_entry
            assert (ours.kind == "map") == is_map, ours.name
            assert ours.repeated == (theirs.is_repeated and not is_map), ours.name
            assert ours.presence == (theirs.has_presence and theirs.message_type is not None), ours.name
            if theirs.enum_type is not None:
                assert config_update.ENUMS[ours.type] == tuple(v.name for v in theirs.enum_type.values)
            elif theirs.message_type is not None:
                assert ours.type == (is_map and theirs.message_type.fields_by_name["value"].message_type.name
                                     or theirs.message_type.name)


# --- UpdateModelConfig ----------------------------------------------------------------------------------


def test_tritons_auto_complete_example_without_config_pbtxt():
    config = base()
    returned = returned_from(
        config,
        max_batch_size=4,
        input=[{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}, {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]}],
        output=[{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        dynamic_batching={},
    )
    updated = update_model_config(config, returned)
    assert updated["max_batch_size"] == 4
    assert [(t["name"], t["dims"], t["optional"], t["format"]) for t in updated["input"]] == [
        ("INPUT0", [4], False, "FORMAT_NONE"), ("INPUT1", [4], False, "FORMAT_NONE")
    ]
    # NormalizeModelConfig again: the dynamic batcher's preferred size defaults to max_batch_size
    assert updated["dynamic_batching"]["preferred_batch_size"] == [4]
    assert round_trips(updated)
    assert config["input"] == [] and "dynamic_batching" not in config  # the input is not modified


def test_only_what_triton_keeps_is_kept():
    config = base('input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')
    returned = returned_from(
        config,
        max_batch_size=2,
        parameters={"x": {"string_value": "y"}},
        instance_group=[{"count": 3, "kind": "KIND_CPU"}],
        default_model_filename="other.py",
        input=[*config["input"], {"name": "IN9", "data_type": "TYPE_FP32", "dims": [1], "optional": True}],
    )
    updated = update_model_config(config, returned)
    assert updated["max_batch_size"] == 2 and [t["optional"] for t in updated["input"]] == [False, True]
    for unchanged in ("parameters", "instance_group", "default_model_filename", "optimization", "version_policy"):
        assert updated[unchanged] == config[unchanged], unchanged
    assert round_trips(updated)


def test_fields_missing_from_the_returned_config_are_reset_as_in_triton():
    config = base('max_batch_size: 8\ninput [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]\n')
    updated = update_model_config(config, {"name": "m"})
    assert (updated["max_batch_size"], updated["input"], updated["output"]) == (0, [], [])


def test_scheduler_rules():
    with_batcher = base("max_batch_size: 4\ndynamic_batching { max_queue_delay_microseconds: 100 }\n")
    assert with_batcher["dynamic_batching"]["preferred_batch_size"] == [4]
    without = {k: v for k, v in with_batcher.items() if k != "dynamic_batching"}
    with pytest.raises(ConfigError) as raised:
        update_model_config(with_batcher, without)
    assert raised.value.message == "Cannot update scheduling choice from 11 to 11 when auto-completing."
    assert raised.value.code == "Internal"
    with pytest.raises(ConfigError) as raised:
        update_model_config(with_batcher, returned_from(without, sequence_batching={}))
    assert raised.value.message == "Cannot update scheduling choice from 11 to 11 when auto-completing."
    # the same choice: the config's own scheduler stays (Triton does not copy the returned one)
    kept = update_model_config(with_batcher, returned_from(with_batcher, dynamic_batching={"max_queue_delay_microseconds": 7}))
    assert kept["dynamic_batching"] == with_batcher["dynamic_batching"]
    # no scheduler yet: the returned one is taken, then normalised
    fresh = base("max_batch_size: 4\n")
    taken = update_model_config(fresh, returned_from(fresh, sequence_batching={"oldest": {}}))
    assert taken["sequence_batching"]["max_sequence_idle_microseconds"] == 1_000_000
    assert taken["sequence_batching"]["oldest"]["preferred_batch_size"] == [4]
    assert list(taken).index("sequence_batching") == list(taken).index("optimization") + 1  # declaration order


def test_transaction_policy_is_taken_only_when_returned():
    config = base()
    assert "model_transaction_policy" not in update_model_config(config, returned_from(config))
    decoupled = update_model_config(config, returned_from(config, model_transaction_policy={"decoupled": True}))
    assert decoupled["model_transaction_policy"] == {"decoupled": True} and round_trips(decoupled)
    empty = update_model_config(config, returned_from(config, model_transaction_policy={}))
    assert empty["model_transaction_policy"] == {"decoupled": False}


def test_protobuf_json_spellings_are_accepted_and_rendered_as_triton_renders_them():
    config = base()
    returned = returned_from(
        config,
        maxBatchSize="8",
        input=[{"name": "IN", "dataType": 11, "dims": ["3", 4.0], "allowRaggedBatch": True, "reshape": {"shape": [12]}}],
        output=[{"name": "OUT", "data_type": "TYPE_STRING", "dims": [-1], "labelFilename": None}],
        dynamicBatching={"priorityQueuePolicy": {"1": {"timeoutAction": 1, "maxQueueSize": 3}}, "priorityLevels": 2,
                         "defaultPriorityLevel": "1"},
    )
    del returned["max_batch_size"]
    updated = update_model_config(config, returned)
    assert updated["max_batch_size"] == 8
    assert updated["input"] == [{
        "name": "IN", "data_type": "TYPE_FP32", "format": "FORMAT_NONE", "dims": [3, 4], "reshape": {"shape": [12]},
        "is_shape_tensor": False, "allow_ragged_batch": True, "optional": False, "is_non_linear_format_io": False,
    }]
    assert updated["dynamic_batching"]["priority_queue_policy"] == {
        "1": {"timeout_action": "DELAY", "default_timeout_microseconds": 0, "allow_timeout_override": False, "max_queue_size": 3}
    }
    assert updated["dynamic_batching"]["preferred_batch_size"] == [8]
    assert round_trips(updated)
    # the protobuf parser reads the returned pieces the same way
    parsed = from_triton_json({"name": "m", "input": returned["input"]})
    assert to_triton_json(parsed)["input"] == updated["input"]


@pytest.mark.parametrize(
    "change, detail",
    [
        ({"output": [{"name": "O", "data_type": "TYPE_NOPE", "dims": [1]}]}, "output[0].data_type: 'TYPE_NOPE' is not a DataType"),
        ({"input": [{"name": "I", "data_type": "TYPE_FP32", "dims": ["x"]}]}, "input[0].dims[0]: expected an integer, got 'x'"),
        ({"input": [{"name": "I", "data_type": "TYPE_FP32", "dims": [1.5]}]}, "input[0].dims[0]: expected an integer, got 1.5"),
        ({"input": [{"name": "I", "data_type": "TYPE_FP32", "dims": [True]}]}, "input[0].dims[0]: expected an integer, got True"),
        ({"input": [{"name": "I", "data_type": "TYPE_FP32", "dims": [2**63]}]}, "input[0].dims[0]: 9223372036854775808 is out of range for int64"),
        ({"input": [{"name": "I", "data_type": "TYPE_FP32", "dims": [1], "shape": [1]}]}, "input[0]: ModelInput has no field 'shape'"),
        ({"input": [{"name": "I", "dataType": "TYPE_FP32", "data_type": "TYPE_FP32"}]}, "input[0]: field 'data_type' is given twice"),
        ({"input": {"name": "I"}}, "input: expected a list, got {'name': 'I'}"),
        ({"output": [["O"]]}, "output[0]: expected an object, got ['O']"),
        ({"output": [{"name": 7}]}, "output[0].name: expected a string, got 7"),
        ({"input": [{"name": "I", "optional": "yes"}]}, "input[0].optional: expected true or false, got 'yes'"),
        ({"max_batch_size": 2**31}, "max_batch_size: 2147483648 is out of range for int32"),
        ({"inputs": []}, "ModelConfig has no field 'inputs'"),
        ({"dynamic_batching": {}, "sequence_batching": {}}, "more than one scheduler of the oneof scheduling_choice: dynamic_batching, sequence_batching"),
        ({"dynamic_batching": {"preferred_batch_size": [-1], "max_queue_delay_microseconds": -5}}, "dynamic_batching.max_queue_delay_microseconds: -5 is out of range for uint64"),
        ({"dynamic_batching": {"priority_queue_policy": {"x": {}}}}, "dynamic_batching.priority_queue_policy key: expected an integer, got 'x'"),
        ({"model_transaction_policy": {"decoupled": 1}}, "model_transaction_policy.decoupled: expected true or false, got 1"),
    ],
)
def test_a_returned_config_that_is_not_a_model_config_is_an_error_naming_the_field(change, detail):
    config = base()
    with pytest.raises(ConfigError) as raised:
        update_model_config(config, returned_from(config, **change))
    assert raised.value.message == "auto_complete_config of model 'm' returned an invalid model configuration"
    assert raised.value.detail.startswith(detail), raised.value.detail
    assert raised.value.code == "Internal"
    if "given twice" not in detail:  # protobuf's Python parser takes the last of the two spellings
        with pytest.raises(Exception):  # protobuf's own parser refuses the same returned config
            from_triton_json(returned_from(config, **change))


def test_a_returned_value_that_is_not_a_dict_is_an_error():
    with pytest.raises(ConfigError) as raised:
        update_model_config(base(), ["not", "a", "config"])
    assert raised.value.detail == "expected an object, got ['not', 'a', 'config']"


# --- ValidateModelConfig / ValidateModelIOConfig: the same verdicts as the compiler's ----------------------

IO_CASES = [
    'input [ { name: "I" data_type: TYPE_FP32 dims: [ 2 ] } ] output [ { name: "O" data_type: TYPE_FP32 dims: [ 2 ] } ]',
    'input [ { data_type: TYPE_FP32 dims: [ 2 ] } ]',
    'input [ { name: "I" dims: [ 2 ] } ]',
    'input [ { name: "I" data_type: TYPE_FP32 } ]',
    'input [ { name: "I" data_type: TYPE_FP32 dims: [ 0 ] } ]',
    'input [ { name: "I" data_type: TYPE_FP32 dims: [ -2 ] } ]',
    'input [ { name: "I" data_type: TYPE_FP32 dims: [ 2 ] reshape { } } ]',
    'max_batch_size: 2 input [ { name: "I" data_type: TYPE_FP32 dims: [ 1 ] reshape { } } ]',
    'input [ { name: "I" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 3 ] } } ]',
    'input [ { name: "I" data_type: TYPE_FP32 dims: [ 2, -1, 6 ] reshape { shape: [ 2, -1, 2, 3 ] } } ]',
    'input [ { name: "I" data_type: TYPE_FP32 dims: [ 2, -1 ] reshape { shape: [ -1, -1 ] } } ]',
    'input [ { name: "I" data_type: TYPE_FP32 dims: [ 2, -1, 4 ] reshape { shape: [ 4, -1, 2 ] } } ]',
    'input [ { name: "I" data_type: TYPE_FP32 dims: [ 2 ] reshape { shape: [ 0 ] } } ]',
    'input [ { name: "I" data_type: TYPE_FP32 format: FORMAT_NHWC dims: [ 2 ] } ]',
    'input [ { name: "I" data_type: TYPE_INT32 dims: [ 2 ] is_shape_tensor: true } ]',
    'input [ { name: "I" data_type: TYPE_INT32 dims: [ 2 ] is_non_linear_format_io: true } ]',
    'output [ { name: "O" data_type: TYPE_FP32 dims: [ 2 ] is_non_linear_format_io: true } ]',
    'output [ { name: "" data_type: TYPE_FP32 dims: [ 2 ] } ]',
    'output [ { name: "O" data_type: TYPE_FP32 dims: [ 2 ] is_shape_tensor: true } ]',
    'input [ { name: "I" data_type: TYPE_FP32 dims: [ 2 ] } ] batch_input [ { kind: BATCH_ELEMENT_COUNT source_input: [ "X" ] } ]',
    'input [ { name: "I" data_type: TYPE_FP32 dims: [ 2 ] } ] batch_input [ { kind: BATCH_ELEMENT_COUNT data_type: TYPE_INT64 source_input: [ "I" ] } ]',
    'input [ { name: "I" data_type: TYPE_FP32 dims: [ 2 ] } ] batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT data_type: TYPE_INT32 } ]',
    'input [ { name: "I" data_type: TYPE_FP32 dims: [ 2 ] } ] batch_output [ { target_name: [ "O" ] source_input: [ "I" ] } ]',
    'input [ { name: "I" data_type: TYPE_FP32 dims: [ 2 ] } ] output [ { name: "O" data_type: TYPE_FP32 dims: [ 2 ] } ] '
    'batch_output [ { target_name: [ "O", "O" ] source_input: [ "I" ] } ]',
    'input [ { name: "I" data_type: TYPE_FP32 dims: [ 2 ] } ] batch_output [ { source_input: [ ] } ]',
]


def _outcome(check, config) -> str | None:
    try:
        check(config)
    except (ConfigError, ModelError) as exc:
        return exc.message
    return None


def image_rendering(config: dict) -> dict:
    """The same config as the image build's completion step holds it: rendered by config_update
    (a model that returns the config it got)."""
    return update_model_config(config, copy.deepcopy(config))


@pytest.mark.parametrize("text", IO_CASES)
def test_io_checks_give_one_verdict_on_the_compilers_and_the_images_config(text):
    config = base(text)
    compiler = _outcome(validate_model_io_config, from_triton_json(config))  # protobuf -> to_triton_json -> rule
    image = _outcome(rules.validate_model_io_config, image_rendering(config))
    assert compiler == image
    assert (compiler is None) == (IO_CASES.index(text) in (0, 7, 9))  # valid: plain, scalar reshape, matching trunks


CONFIG_CASES = [
    "max_batch_size: 4 dynamic_batching { }",
    "max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 8 ] }",
    "max_batch_size: 4 dynamic_batching { preferred_batch_size: [ 0 ] }",
    "max_batch_size: 4 dynamic_batching { priority_levels: 2 }",
    "max_batch_size: 4 dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
    "max_batch_size: 4 dynamic_batching { priority_levels: 2 default_priority_level: 1 priority_queue_policy { key: 3 value { } } }",
    "max_batch_size: 4 dynamic_batching { priority_levels: 2 default_priority_level: 1 preserve_ordering: true }",
    "max_batch_size: 4 dynamic_batching { preserve_ordering: true default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5 } }",
    "max_batch_size: 4 dynamic_batching { preserve_ordering: true priority_levels: 1 default_priority_level: 1 "
    "priority_queue_policy { key: 1 value { timeout_action: DELAY default_timeout_microseconds: 5 } } }",
    "max_batch_size: 4 dynamic_batching { preserve_ordering: true default_queue_policy { timeout_action: DELAY } }",
    "model_transaction_policy { decoupled: true } response_cache { enable: true }",
]


@pytest.mark.parametrize("text", CONFIG_CASES)
def test_config_checks_give_one_verdict_on_the_compilers_and_the_images_config(text):
    config = base(text)
    compiler = _outcome(validate_model_config, from_triton_json(config))
    assert compiler == _outcome(rules.validate_model_config, image_rendering(config))
    assert (compiler is None) == (CONFIG_CASES.index(text) in (0, 9))  # valid: plain, DELAY without a timeout


def test_config_checks_of_what_only_an_update_can_bring():
    config = base()
    negative = returned_from(config, max_batch_size=-2)
    # a config.pbtxt cannot get here (its ValidateModelConfig fails first); a returned config can
    assert _outcome(rules.validate_model_config, update_model_config(config, negative)) == (
        "'max_batch_size' must be non-negative value for m"
    )
    scheduled = update_model_config(config, returned_from(config, ensemble_scheduling={"step": []}))
    assert _outcome(rules.validate_model_config, scheduled) == (
        "ensemble scheduling cannot be set for model 'm' whose platform is not ensemble"
    )
    assert _outcome(rules.validate_model_config, scheduled) == _outcome(validate_model_config, from_triton_json(scheduled))


IMPLICIT_STATE = {"state": [{"input_name": "S_IN", "output_name": "S_OUT", "data_type": "TYPE_FP32", "dims": [1]}]}


@pytest.mark.parametrize(
    "change, refused",
    [
        ({"sequence_batching": IMPLICIT_STATE}, True),
        ({"sequence_batching": {}, "model_transaction_policy": {"decoupled": True}}, False),
        ({"sequence_batching": {}}, False),
        ({"model_transaction_policy": {"decoupled": True}}, False),
        ({}, False),
    ],
    ids=["implicit-state", "decoupled-sequence", "sequence", "decoupled", "supported"],
)
def test_support_checks_give_one_verdict_on_the_compilers_and_the_images_config(change, refused):
    config = base()
    updated = update_model_config(config, returned_from(config, **change))
    image = _outcome(support_rules.check_supported, updated)
    assert image == _outcome(toolkit_check_supported, from_triton_json(updated))
    assert (image is not None) == refused


def test_the_compiler_turns_a_refusal_into_an_unsupported_model_error():
    config = base()
    with pytest.raises(ModelError) as raised:
        toolkit_check_supported(
            from_triton_json(update_model_config(config, returned_from(config, sequence_batching=IMPLICIT_STATE))))
    assert raised.value.unsupported and raised.value.model == "m"


def test_duplicate_tensor_warning():
    config = base('input [ { name: "I" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "I" data_type: TYPE_FP32 dims: [ 3 ] } ]')
    (warning,) = rules.duplicate_tensor_warnings(config)
    assert warning.startswith("model 'm' declares input 'I' more than once")


# --- ValidateEnsembleConfig: the same verdicts as the compiler's --------------------------------------------


def _io(name: str, data_type: str = "TYPE_FP32", dims: list[int] | None = None, **more) -> dict:
    return {"name": name, "data_type": data_type, "dims": dims or [4], **more}


ENSEMBLE = {
    "name": "ens", "platform": "ensemble", "max_batch_size": 4,
    "input": [_io("RAW")], "output": [_io("OUT")],
    "ensemble_scheduling": {"step": [
        {"model_name": "pre", "model_version": -1, "input_map": {"IN": "RAW"}, "output_map": {"FEAT": "mid"}},
        {"model_name": "post", "model_version": -1, "input_map": {"X": "mid"}, "output_map": {"Y": "OUT"}},
    ]},
}


@pytest.mark.parametrize(
    "pre, post",
    [
        ({"max_batch_size": 8, "input": [_io("IN")], "output": [_io("FEAT")]}, {"max_batch_size": 4, "input": [_io("X")], "output": [_io("Y")]}),
        ({"max_batch_size": 2, "input": [_io("IN")], "output": [_io("FEAT")]}, {"max_batch_size": 4, "input": [_io("X")], "output": [_io("Y")]}),
        ({"max_batch_size": 4, "input": [_io("IN2")], "output": [_io("FEAT")]}, {"max_batch_size": 4, "input": [_io("X")], "output": [_io("Y")]}),
        ({"max_batch_size": 4, "input": [_io("IN"), _io("EXTRA")], "output": [_io("FEAT")]}, {"max_batch_size": 4, "input": [_io("X")], "output": [_io("Y")]}),
        ({"max_batch_size": 4, "input": [_io("IN"), _io("EXTRA", optional=True)], "output": [_io("FEAT")]},
         {"max_batch_size": 4, "input": [_io("X")], "output": [_io("Y")]}),
        ({"max_batch_size": 4, "input": [_io("IN")], "output": [_io("OTHER")]}, {"max_batch_size": 4, "input": [_io("X")], "output": [_io("Y")]}),
        ({"max_batch_size": 4, "input": [_io("IN", "TYPE_INT32")], "output": [_io("FEAT")]}, {"max_batch_size": 4, "input": [_io("X")], "output": [_io("Y")]}),
        ({"max_batch_size": 4, "input": [_io("IN")], "output": [_io("FEAT", dims=[8])]}, {"max_batch_size": 4, "input": [_io("X")], "output": [_io("Y")]}),
        ({"max_batch_size": 0, "input": [_io("IN", dims=[-1, 4])], "output": [_io("FEAT")]}, {"max_batch_size": 4, "input": [_io("X")], "output": [_io("Y")]}),
        ({"max_batch_size": 4, "input": [_io("IN")], "output": [_io("FEAT", dims=[-1])]}, {"max_batch_size": 4, "input": [_io("X", dims=[2, 2])], "output": [_io("Y")]}),
    ],
)
def test_ensemble_checks_agree_with_the_compilers(pre, post):
    composing = {"pre": {"name": "pre", **pre}, "post": {"name": "post", **post}}
    assert _outcome(lambda c: ensemble_rules.validate_ensemble_config(ENSEMBLE, c), composing) == _outcome(
        lambda c: toolkit_validate_ensemble_config(ENSEMBLE, c), composing
    )
