"""`toolkit validate` and `toolkit config` through typer's CliRunner (the real command line)."""

from __future__ import annotations

import json
import textwrap

import cli_runner
import model_builders as mb


TEXT_RECOGNITION = """
name: "text_recognition"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "input.1" data_type: TYPE_FP32 dims: [ 1, 32, 100 ] } ]
output [ { name: "308" data_type: TYPE_FP32 dims: [ 26, 37 ] } ]
"""


def seed_repository(repo):
    """text_recognition (valid), bad_batch (preferred size > max), trt (TensorRT: unsupported)."""
    mb.text_recognition(repo / "text_recognition" / "1" / "model.onnx")
    (repo / "text_recognition" / "config.pbtxt").write_text(textwrap.dedent(TEXT_RECOGNITION) + "dynamic_batching { }\n")
    mb.text_recognition(repo / "bad_batch" / "1" / "model.onnx")
    (repo / "bad_batch" / "config.pbtxt").write_text(
        textwrap.dedent(TEXT_RECOGNITION).replace("text_recognition", "bad_batch")
        + "dynamic_batching {\n  preferred_batch_size: [ 4, 16 ]\n}\n"
    )
    (repo / "trt" / "1").mkdir(parents=True)
    (repo / "trt" / "1" / "model.plan").write_bytes(b"\0")
    (repo / "trt" / "config.pbtxt").write_text('name: "trt"\nplatform: "tensorrt_plan"\nmax_batch_size: 8\n')


def invoke(*args: str):
    return cli_runner.invoke(list(args), columns=200)


def test_validate_table_errors_and_exit_code(repo):
    seed_repository(repo)
    result = invoke("validate", str(repo))
    assert result.exit_code == 1
    table = result.stdout
    assert "text_recognition" in table and "onnxruntime" in table and "2 x CPU" in table
    assert "dynamic (max 8, preferred [8]" in table
    rows = {line.split("│")[1].strip(): line for line in table.splitlines() if line.count("│") >= 6}
    assert "OK" in rows["text_recognition"] and "INVALID" in rows["bad_batch"] and "UNSUPPORTED" in rows["trt"]
    config = repo / "bad_batch" / "config.pbtxt"
    assert f"error: bad_batch: {config}:8: dynamic batching preferred size must be <= max batch size for bad_batch" in result.stderr
    assert "unsupported: trt:" in result.stderr and "TensorRT plans" in result.stderr
    assert "2 of 3 model(s) cannot be served" in result.stderr


def test_validate_json(repo):
    seed_repository(repo)
    result = invoke("validate", str(repo), "--json")
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    assert (doc["device"], doc["auto_complete"], doc["ok"]) == ("cpu", True, False)
    models = {m["name"]: m for m in doc["models"]}
    assert models["text_recognition"]["status"] == "READY"
    assert models["text_recognition"]["instances"] == [
        {"name": "text_recognition", "kind": "KIND_CPU", "count": 2, "gpus": []}
    ]
    bad = models["bad_batch"]
    assert bad["status"] == "INVALID" and bad["stage"] == "config" and bad["line"] == 8
    assert bad["error"] == "dynamic batching preferred size must be <= max batch size for bad_batch"
    assert models["trt"]["status"] == "UNSUPPORTED" and models["trt"]["stage"] == "load"


def test_validate_ok_repository_exits_0(repo):
    seed_repository(repo)
    result = invoke("validate", str(repo), "--model", "text_recognition", "--device", "gpu")
    assert result.exit_code == 0, result.output
    assert "1 x GPU" in result.stdout and "bad_batch" not in result.stdout
    assert "1 model(s) valid for device gpu" in result.stderr


def test_model_names_are_not_truncated(repo):
    name = "a_very_long_model_name_that_would_not_fit_in_a_narrow_table_column_at_all"
    mb.add_sub(repo / name / "1" / "model.onnx")
    result = cli_runner.invoke(["validate", str(repo)], columns=60)
    assert result.exit_code == 0, result.output
    assert name in result.stdout


def test_parse_error_names_file_line_and_column(repo):
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    (repo / "m" / "config.pbtxt").write_text('name: "m"\nbackend: "python"\nmax_batch_size: 8 8\n')
    result = invoke("validate", str(repo))
    assert result.exit_code == 1
    config = repo / "m" / "config.pbtxt"
    assert f"error: m: {config}:3:19: failed to read text proto from {config.absolute()}" in result.stderr
    assert 'has no field named "8"' in result.stderr  # the protobuf parser's explanation


def test_strict_mode_and_unknown_models(repo):
    mb.add_sub(repo / "add_sub" / "1" / "model.onnx")
    assert invoke("validate", str(repo)).exit_code == 0
    result = invoke("validate", str(repo), "--disable-auto-complete-config", "--json")
    assert result.exit_code == 1
    model = json.loads(result.stdout)["models"][0]
    assert model["error"].startswith("failed to open text file for read ")
    result = invoke("validate", str(repo), "--model", "nope")
    assert result.exit_code == 2
    assert "model(s) not found in repository" in result.stderr and "available: add_sub" in result.stderr
    assert invoke("validate", str(repo / "missing")).exit_code == 2
    assert invoke("validate", str(repo), "--device", "tpu").exit_code == 2


def test_config_prints_tritons_json(repo):
    seed_repository(repo)
    result = invoke("config", str(repo), "text_recognition")
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)
    assert config["name"] == "text_recognition" and config["max_batch_size"] == 8
    assert config["dynamic_batching"]["preferred_batch_size"] == [8]
    assert config["input"][0]["dims"] == [1, 32, 100]
    gpu = json.loads(invoke("config", str(repo), "text_recognition", "--device", "gpu").stdout)
    assert [(g["kind"], g["count"], g["gpus"]) for g in gpu["instance_group"]] == [("KIND_GPU", 1, [0])]
    failed = invoke("config", str(repo), "bad_batch")
    assert failed.exit_code == 1 and "preferred size must be <= max batch size" in failed.stderr
