"""Compiling whole repositories: the seeds' documented configs, model selection like
tritonserver's --load-model, ensembles across models, and the manifest the runtime reads."""

from __future__ import annotations

import json
import textwrap

import model_builders as mb
import pytest
from oracle import onnx_models

from toolkit.repository.compile import MANIFEST_FORMAT, compile_repository
from toolkit.repository.errors import RepositoryError

TEXT_RECOGNITION = """
name: "text_recognition"
backend: "onnxruntime"
max_batch_size: 8
input [
  {
    name: "input.1"
    data_type: TYPE_FP32
    dims: [ 1, 32, 100 ]
  }
]
output [
  {
    name: "308"
    data_type: TYPE_FP32
    dims: [ 26, 37 ]
  }
]
"""
TEXT_DETECTION = """
name: "text_detection"
backend: "onnxruntime"
max_batch_size : 256
input [
  {
    name: "input_images:0"
    data_type: TYPE_FP32
    dims: [ -1, -1, -1, 3 ]
  }
]
output [
  {
    name: "feature_fusion/Conv_7/Sigmoid:0"
    data_type: TYPE_FP32
    dims: [ -1, -1, -1, 1 ]
  }
]
output [
  {
    name: "feature_fusion/concat_3:0"
    data_type: TYPE_FP32
    dims: [ -1, -1, -1, 5 ]
  }
]
"""
WARMUP = """
model_warmup [
  {
    name: "random_sample"
    batch_size: 8
    inputs {
      key: "input.1"
      value: {
        data_type: TYPE_FP32
        dims: [ 1, 32, 100 ]
        random_data: true
      }
    }
  }
]
"""


def text_recognition(repo, extra: str = "", name: str = "text_recognition"):
    mb.text_recognition(repo / name / "1" / "model.onnx")
    text = textwrap.dedent(TEXT_RECOGNITION).replace("text_recognition", name) + textwrap.dedent(extra)
    (repo / name / "config.pbtxt").write_text(text)


@pytest.mark.parametrize("auto_complete", [True, False])
def test_seed_text_recognition_variants(repo, auto_complete):
    text_recognition(repo)
    text_recognition(repo, "dynamic_batching { }\n", name="tr_dynamic")
    text_recognition(repo, "dynamic_batching { }\ninstance_group [ { count: 3 kind: KIND_CPU } ]\n", name="tr_instances")
    text_recognition(repo, WARMUP, name="tr_warmup")
    result = compile_repository(repo, device="cpu", auto_complete=auto_complete)
    assert result.ok, result.failures
    plain = result.models["text_recognition"].config
    assert "dynamic_batching" not in plain
    assert [(g["kind"], g["count"]) for g in plain["instance_group"]] == [("KIND_CPU", 2)]
    dynamic = result.models["tr_dynamic"].config["dynamic_batching"]
    assert dynamic["preferred_batch_size"] == [8] and dynamic["max_queue_delay_microseconds"] == 0
    groups = result.models["tr_instances"].config["instance_group"]
    assert [(g["name"], g["kind"], g["count"]) for g in groups] == [("tr_instances_0", "KIND_CPU", 3)]
    warmup = result.models["tr_warmup"].config["model_warmup"][0]
    assert warmup["batch_size"] == 8 and warmup["inputs"]["input.1"]["random_data"] is True


def test_seed_text_detection_two_output_blocks(repo):
    onnx_models.text_detection(repo / "text_detection" / "1" / "model.onnx")
    (repo / "text_detection" / "config.pbtxt").write_text(textwrap.dedent(TEXT_DETECTION))
    model = compile_repository(repo).models["text_detection"]
    assert [o["name"] for o in model.config["output"]] == ["feature_fusion/Conv_7/Sigmoid:0", "feature_fusion/concat_3:0"]
    assert model.config["input"][0]["dims"] == [-1, -1, -1, 3] and model.config["max_batch_size"] == 256


def test_seed_warmup_with_a_wrong_batch_size_fails_at_build_time(repo):
    text_recognition(repo, WARMUP.replace("batch_size: 8", "batch_size: 16"))
    error = compile_repository(repo).failures["text_recognition"]
    assert error.message.startswith(
        "failed to run warmup sample 'random_sample': batch size 16 for 'text_recognition_0', max allowed is 8; "
    )


# --- --model selection -----------------------------------------------------------------------------


def ensemble(repo, name, steps, version_dir=True):
    body = "\n".join(
        f'  step [ {{ model_name: "{m}" model_version: -1 input_map {{ key: "{i}" value: "X" }} output_map {{ key: "{o}" value: "Y" }} }} ]'
        for m, i, o in steps
    )
    text = (
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 4\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        f"ensemble_scheduling {{\n{body}\n}}\n"
    )
    (repo / name).mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(text)
    if version_dir:
        (repo / name / "1").mkdir()


def test_model_selection_brings_in_composing_models_of_nested_ensembles(repo):
    mb.matmul_relu(repo / "inner_model" / "1" / "model.onnx")
    mb.matmul_relu(repo / "unrelated" / "1" / "model.onnx")
    ensemble(repo, "inner", [("inner_model", "INPUT0", "OUTPUT0")])
    ensemble(repo, "outer", [("inner", "X", "Y")])
    result = compile_repository(repo, ["outer"])
    assert result.selected == ["outer", "inner", "inner_model"]
    assert result.ok and set(result.models) == {"outer", "inner", "inner_model"}
    assert result.models["outer"].model_files == {} and result.models["outer"].versions == [1]
    with pytest.raises(RepositoryError, match=r"model\(s\) not found in repository .*: nope \(available: "):
        compile_repository(repo, ["nope"])


def test_ensemble_of_a_model_this_product_cannot_serve(repo):
    (repo / "trt" / "1").mkdir(parents=True)
    (repo / "trt" / "1" / "model.plan").write_bytes(b"\0")
    (repo / "trt" / "config.pbtxt").write_text(
        'name: "trt"\nplatform: "tensorrt_plan"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
    )
    ensemble(repo, "ens", [("trt", "INPUT0", "OUTPUT0")])
    result = compile_repository(repo)
    error = result.failures["ens"]
    assert error.unsupported and error.stage == "ensemble"
    assert error.message.startswith("ensemble 'ens' depends on 'trt', which cannot be served here: model 'trt' uses backend")
    assert error.line == 7  # the step naming "trt"


def test_ensemble_errors_point_at_the_step(repo):
    ensemble(repo, "ens", [("missing", "INPUT0", "OUTPUT0")])
    error = compile_repository(repo).failures["ens"]
    assert error.message == "ensemble ens contains models that are not available or ambiguous: missing"
    assert (error.stage, error.line) == ("ensemble", 7)


def test_ensemble_versions_are_checked_after_its_dependencies(repo):
    ensemble(repo, "ens", [("missing", "INPUT0", "OUTPUT0")], version_dir=False)
    assert "not available" in compile_repository(repo).failures["ens"].message
    mb.matmul_relu(repo / "missing" / "1" / "model.onnx")
    error = compile_repository(repo).failures["ens"]
    assert error.message == "at least one version must be available under the version policy of model 'ens'"
    assert error.stage == "load"


def test_circular_dependencies_are_reported_on_every_ensemble_of_the_cycle(repo):
    ensemble(repo, "a", [("b", "X", "Y")])
    ensemble(repo, "b", [("c", "X", "Y")])
    ensemble(repo, "c", [("a", "X", "Y")])
    ensemble(repo, "d", [("b", "X", "Y")])  # depends on the cycle without being in it
    failures = compile_repository(repo).failures
    # Triton checks a, b, c in name order; checking c overwrites a's message (tests/oracle).
    assert failures["a"].message == "circular dependency between ensembles: c -> ... -> b -> c"
    assert failures["b"].message == "circular dependency between ensembles: a -> ... -> c -> a"
    assert failures["c"].message == "circular dependency between ensembles: c -> ... -> b -> c"
    assert failures["d"].message.startswith("ensemble 'd' depends on 'b' which is not valid. Model 'b' failed with error: ")


# --- the manifest ----------------------------------------------------------------------------------


def test_manifest_holds_tritons_json_and_model_files(repo, tmp_path):
    text_recognition(repo)
    mb.add_sub(repo / "add_sub" / "2" / "model.onnx")
    ensemble(repo, "ens", [("text_recognition", "input.1", "308")])
    result = compile_repository(repo, ["text_recognition", "add_sub"], device="gpu")
    path = result.write_manifest(tmp_path / "models.json")
    doc = json.loads(path.read_text())
    assert doc["format"] == MANIFEST_FORMAT and doc["device"] == "gpu"
    entries = {m["name"]: m for m in doc["models"]}
    assert set(entries) == {"text_recognition", "add_sub"}
    assert entries["add_sub"]["path"] == "add_sub"
    assert entries["add_sub"]["versions"] == [2] and entries["add_sub"]["model_files"] == {"2": "2/model.onnx"}
    assert entries["text_recognition"]["config"] == result.models["text_recognition"].config
    assert entries["text_recognition"]["config"]["instance_group"][0]["kind"] == "KIND_GPU"
