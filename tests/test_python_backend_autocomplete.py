"""Compile-time auto-complete of Python models: the model's `auto_complete_config` runs in a
process of its own and Triton's `TritonModel::UpdateModelConfig` rules decide what is kept.
Expected values were recorded from tritonserver 2.51 (`scripts/tools/tritonserver validate
--autofill --json --configs`: the verdicts and the configs it serves, docs/tools.md) for the same
model.py files."""

from __future__ import annotations

import json

import pytest
from python_models.repository import python_model

from toolkit.repository.backend_fields import autocomplete_backend_fields
from toolkit.repository.errors import CODE_INTERNAL, ModelError
from toolkit.repository.model_config import ModelConfig, parse_config_text, to_triton_json
from toolkit.repository.normalize import normalize_model_config
from toolkit.repository.python_autocomplete import autocomplete, update_model_config


def _prepared(model_dir, text: str | None):
    """The config as Triton has it when the python backend auto-completes: read, backend fields
    completed, normalised."""
    config = parse_config_text(text) if text else ModelConfig()
    autocomplete_backend_fields(model_dir.name, model_dir, config)
    normalize_model_config(config)
    return config


def _run(tmp_path, source: str, config_text: str | None = None, fixture: str | None = None):
    model_py = python_model(tmp_path / "models", "m", fixture, None, source=source if fixture is None else None)
    config = _prepared(model_py.parent.parent, config_text)
    autocomplete(config, model_py.parent.parent, model_py.parent)
    return to_triton_json(config), model_py


def test_the_auto_complete_example_without_config_pbtxt(tmp_path):
    config, _ = _run(tmp_path, "", fixture="auto_complete.py")
    assert config["backend"] == "python" and config["max_batch_size"] == 4
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("INPUT0", "TYPE_FP32", [4]), ("INPUT1", "TYPE_FP32", [4])
    ]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [
        ("OUTPUT0", "TYPE_FP32", [4]), ("OUTPUT1", "TYPE_FP32", [4])
    ]
    # normalised again after the update, as Triton does: preferred batch size = max_batch_size
    assert config["dynamic_batching"]["preferred_batch_size"] == [4]


def test_only_what_triton_keeps_is_kept(tmp_path):
    source = """
        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(c):
                d = c.as_dict()
                d["parameters"] = {"x": {"string_value": "y"}}
                d["instance_group"] = [{"count": 3, "kind": "KIND_CPU"}]
                d["max_batch_size"] = 2
                d["input"].append({"name": "IN9", "data_type": "TYPE_FP32", "dims": [1], "optional": True})
                c.set_dynamic_batching()
                return c
    """
    config, _ = _run(tmp_path, source, """
        backend: "python"
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    """)
    # tritonserver 2.51 reports for this model: max_batch_size 2, IN9 optional added, dynamic
    # batching with preferred [2], parameters and instance_group untouched
    assert config["max_batch_size"] == 2
    assert [(t["name"], t["optional"]) for t in config["input"]] == [("IN", False), ("IN9", True)]
    assert config["dynamic_batching"]["preferred_batch_size"] == [2]
    assert config["parameters"] == {} and config["instance_group"] == []


def test_the_model_sees_the_normalised_config_and_prints_do_not_interfere(tmp_path):
    source = """
        import json
        print("printing during import")

        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(c):
                print("printing in auto_complete_config")
                d = c.as_dict()
                c.add_output({"name": "SEEN", "data_type": "TYPE_STRING",
                              "dims": [len(json.dumps(d))]})
                c.add_input({"name": d["name"] + "_" + d["backend"], "data_type": "TYPE_FP32",
                             "dims": [d["version_policy"]["latest"]["num_versions"]]})
                return c
    """
    config, _ = _run(tmp_path, source)
    assert config["input"][0]["name"] == "m_python" and config["input"][0]["dims"] == [1]
    assert config["output"][0]["dims"][0] > 100


def test_a_model_without_auto_complete_config_changes_nothing(tmp_path):
    text = """
        backend: "python"
        max_batch_size: 4
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    """
    model_py = python_model(tmp_path / "models", "m", None, None, source="class TritonPythonModel:\n    pass\n")
    before = to_triton_json(_prepared(model_py.parent.parent, text))
    config, _ = _run(tmp_path, "class TritonPythonModel:\n    pass\n", text)
    assert config == before


def test_decoupled_policy_is_kept_for_the_support_check(tmp_path):
    source = """
        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(c):
                c.set_model_transaction_policy({"decoupled": True})
                return c
    """
    config, _ = _run(tmp_path, source, 'backend: "python"')
    assert config["model_transaction_policy"] == {"decoupled": True}


@pytest.mark.parametrize(
    "body, message",
    [
        (
            'c.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [1]})\n        return c',
            ("ValueError: unable to load model 'm', configuration expects datatype TYPE_INT32 for input 'IN', "
            "model provides TYPE_FP32\n\nAt:\n  {file}(4): auto_complete_config\n"),
        ),
        (
            "c.set_max_batch_size(2)\n        return c",
            ("ValueError: configuration specified max_batch_size 4, but in auto-complete-config function for model "
            "'m' specified max_batch_size 2\n\nAt:\n  {file}(4): auto_complete_config\n"),
        ),
        ("return None", "auto_complete_config function in model 'm' must return a valid pb.ModelConfig object."),
        ('raise ValueError("ac failed")', "ValueError: ac failed\n\nAt:\n  {file}(4): auto_complete_config\n"),
    ],
    ids=["input-type-clash", "max-batch-size", "returns-none", "raises"],
)
def test_model_errors_have_tritons_message(tmp_path, body, message):
    source = f"class TritonPythonModel:\n    @staticmethod\n    def auto_complete_config(c):\n        {body}\n"
    with pytest.raises(ModelError) as raised:
        _run(tmp_path, source, """
            backend: "python"
            max_batch_size: 4
            input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
            output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        """)
    model_py = tmp_path / "models" / "m" / "1" / "model.py"
    assert raised.value.message == message.format(file=model_py)
    assert raised.value.code == CODE_INTERNAL and raised.value.file == str(model_py)


def test_import_errors_name_the_missing_module(tmp_path):
    with pytest.raises(ModelError) as raised:
        _run(tmp_path, "import not_a_real_module_xyz\n", 'backend: "python"')
    assert raised.value.message.startswith(
        "ModuleNotFoundError: No module named 'not_a_real_module_xyz'\n\nAt:\n"
        f"  {tmp_path / 'models' / 'm' / '1' / 'model.py'}(1): <module>\n"
    )


def test_a_returned_config_that_is_not_a_model_config_is_an_error(tmp_path):
    # tritonserver 2.51 silently keeps the old config here; the toolkit says what is wrong
    source = """
        class TritonPythonModel:
            @staticmethod
            def auto_complete_config(c):
                c.add_output({"name": "OUT2", "data_type": "TYPE_NOPE", "dims": [1]})
                return c
    """
    with pytest.raises(ModelError) as raised:
        _run(tmp_path, source, 'backend: "python"')
    assert raised.value.message == "auto_complete_config of model 'm' returned an invalid model configuration"
    assert "TYPE_NOPE" in raised.value.detail


def test_scheduler_rules_of_update_model_config():
    config = parse_config_text('name: "m" max_batch_size: 4 dynamic_batching { }')
    returned = to_triton_json(config)
    del returned["dynamic_batching"]
    with pytest.raises(ModelError) as raised:
        update_model_config(config, returned)
    number = ModelConfig.DESCRIPTOR.fields_by_name["dynamic_batching"].number
    assert raised.value.message == f"Cannot update scheduling choice from {number} to {number} when auto-completing."
    fresh = parse_config_text('name: "m" max_batch_size: 4')
    update_model_config(fresh, json.loads(json.dumps({**to_triton_json(fresh), "sequence_batching": {}})))
    assert fresh.HasField("sequence_batching")
