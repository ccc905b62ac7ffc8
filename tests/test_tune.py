"""`toolkit tune`: short sweeps on a tiny model against the real runtime (real `toolkit serve`
processes under generated HTTP load), the tuned config file, the frontier and the prices."""

from __future__ import annotations

import math
import textwrap

import cli_runner
import model_builders as mb
import pytest
from google.protobuf import text_format

from toolkit.repository.compile import compile_repository
from toolkit.repository.model_config import ModelConfig, parse_config_text
from toolkit.tune import pricing, space
from toolkit.tune.frontier import Measurement, best, frontier
from toolkit.tune.load import Level
from toolkit.tune.tuned_config import TUNED_FILENAME, top_level_fields, tuned_text

TINY = """
# tiny: a 16x16 MatMul -- comments of the user's own
name: "tiny"
backend: "onnxruntime"
max_batch_size: 8  # the batch limit
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
"""


def tiny_repository(repo):
    mb.matmul_relu(repo / "tiny" / "1" / "model.onnx", size=16)
    path = repo / "tiny" / "config.pbtxt"
    path.write_text(textwrap.dedent(TINY).lstrip())
    return path


def invoke(*args: str):
    return cli_runner.invoke(["tune", *args], columns=220)


SHORT = ("--warmup", "0.2", "--window", "0.6")


def compiles_as_config(repo, model: str, text: str, tmp_path) -> dict:
    """The tuned file, used as a model's config.pbtxt, compiles (as toolkit serve would)."""
    copy = tmp_path / "check"
    (copy / model / "1").mkdir(parents=True)
    (copy / model / "1" / "model.onnx").symlink_to((repo / model / "1" / "model.onnx").resolve())
    (copy / model / "config.pbtxt").write_text(text)
    result = compile_repository(copy, [model], "cpu")
    assert result.ok, result.failures
    return result.models[model].config


def test_cloud_run_sweep_measures_with_the_real_runtime_and_writes_config_tuned(repo, tmp_path):
    original = tiny_repository(repo)
    before = original.read_bytes()
    result = invoke(str(repo), "tiny", "--max-batch-sizes", "4,8", "--instance-counts", "1", "--queue-delays-us", "500",
                    "--concurrency", "1,4", "--latency-budget-ms", "2000", *SHORT)
    assert result.exit_code == 0, result.output
    out = result.output
    # baseline + 2 (stage 1) + 2 (stage 2: delay 500 without and with preferred size), 2 levels each
    assert "Measured (10 points)" in out
    assert "baseline: max_batch_size 8, no dynamic batching, 1 instance(s), 1 intra-op thread(s)" in out
    assert "max_batch_size 4, delay 0 us, 1 instance(s)" in out
    assert "delay 500 us, preferred" in out
    assert "Throughput-latency frontier (p99)" in out
    assert "best: " in out and "per million inferences (Cloud Run" in out
    assert "no GPU was measured" in out

    # the user's file is untouched; the tuned file keeps its comments and compiles
    assert original.read_bytes() == before
    tuned_path = repo / "tiny" / TUNED_FILENAME
    assert f"wrote {tuned_path}" in out.replace("\n", "")
    tuned = tuned_path.read_text()
    assert "# tiny: a 16x16 MatMul -- comments of the user's own" in tuned
    assert tuned.startswith("# config.tuned.pbtxt: written by `toolkit tune`")
    config = compiles_as_config(repo, "tiny", tuned, tmp_path)
    assert config["max_batch_size"] in (4, 8)
    assert [g["count"] for g in config["instance_group"]] == [1]
    # what the file says was chosen is what it contains
    chosen = next(line for line in tuned.splitlines() if line.startswith("# Chosen: "))
    assert f"max_batch_size {config['max_batch_size']}," in chosen
    if "delay 500 us" in chosen:
        assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 500


def test_every_measured_point_has_real_throughput_and_ordered_percentiles(repo):
    tiny_repository(repo)
    result = invoke(str(repo), "tiny", "--max-batch-sizes", "8", "--instance-counts", "1", "--queue-delays-us", "0",
                    "--concurrency", "2", "--no-write", *SHORT)
    assert result.exit_code == 0, result.output
    rows = [line.split("│") for line in result.output.splitlines() if "max_batch_size 8" in line and "│" in line]
    assert rows
    for cells in rows:
        throughput, p50, p99, batch = (float(cells[i].strip()) for i in (3, 4, 5, 6))
        assert throughput > 50  # a 16x16 MatMul served locally: far more than 50 infer/s
        assert 0 < p50 <= p99
        assert 1.0 <= batch <= 2.0  # concurrency 2, batch-1 requests
    assert not (repo / "tiny" / TUNED_FILENAME).exists()


def test_lambda_measures_one_request_at_a_time_and_sweeps_vcpus(repo, tmp_path):
    tiny_repository(repo)
    result = invoke(str(repo), "tiny", "--target", "lambda", "--latency-budget-ms", "1000", *SHORT)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "one request at a time per execution environment" in out
    assert "per million inferences (Lambda x86 " in out and "1 intra-op thread(s)" in out  # the baseline
    # the vCPU sweep: the runtime on 1..N CPUs, its CPU budget giving the one instance all of them
    assert "1 CPU(s): 1 thread(s) per instance (CPU budget)" in out
    levels = {line.split("│")[2].strip() for line in out.splitlines()
              if ("intra-op" in line or "CPU budget" in line) and "│" in line}
    assert levels == {"1"}
    tuned = (repo / "tiny" / TUNED_FILENAME).read_text()
    config = compiles_as_config(repo, "tiny", tuned, tmp_path)
    assert [g["count"] for g in config["instance_group"]] == [1]
    chosen = next(line for line in tuned.splitlines() if line.startswith("# Chosen: "))
    if "baseline" in chosen:
        assert config["parameters"]["intra_op_thread_count"]["string_value"] == "1"
    else:  # the budget sets the threads from the function's vCPUs: no explicit count is written
        assert "intra_op_thread_count" not in config.get("parameters", {})
        assert "MB of memory (" in tuned and "CPU budget" in chosen


def test_a_budget_no_configuration_meets_is_reported_and_nothing_is_written(repo):
    tiny_repository(repo)
    result = invoke(str(repo), "tiny", "--max-batch-sizes", "8", "--instance-counts", "1", "--queue-delays-us", "0",
                    "--concurrency", "1", "--latency-budget-ms", "0.001", *SHORT)
    assert result.exit_code == 1
    assert "no configuration met p99 <= 0.001 ms" in result.output
    assert not (repo / "tiny" / TUNED_FILENAME).exists()


def test_refusals_before_measuring(repo):
    tiny_repository(repo)
    assert "model(s) not found" in invoke(str(repo), "nope").output
    assert "unknown target 'gke'" in invoke(str(repo), "tiny", "--target", "gke").output
    assert "not a local repository directory" in invoke("s3://bucket/models", "tiny").output
    assert "--batch-size must be between 1" in invoke(str(repo), "tiny", "-b", "9").output
    variable = repo / "var"
    mb.identity(variable / "1" / "model.onnx", {"INPUT0": ("FP32", ["N", -1])}, ["OUTPUT0"])
    (variable / "config.pbtxt").write_text(
        'name: "var"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    )
    out = invoke(str(repo), "var").output
    assert "give its shape with --shape INPUT0:D1,D2,..." in out


# --- config.tuned.pbtxt without a server ------------------------------------------------------------

USER_TEXT = """# header comment
name: "m"   # trailing comment
max_batch_size: 8
input [ { name: "x#1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [ { count: 1 kind: KIND_CPU }, { count: 3, kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
parameters: { key: "other" value: { string_value: "a}b # not a comment" } }
# closing comment
"""


def test_top_level_fields_are_found_by_protobufs_tokenizer():
    spans = top_level_fields(USER_TEXT)
    assert [s.name for s in spans] == ["name", "max_batch_size", "input", "output", "instance_group", "parameters",
                                       "parameters"]
    assert USER_TEXT[spans[-1].start:spans[-1].end] == \
        'parameters: { key: "other" value: { string_value: "a}b # not a comment" } }'


def test_tuned_text_replaces_only_the_tuned_fields_and_keeps_comments():
    original = parse_config_text(USER_TEXT)
    candidate = space.Candidate(max_batch_size=16, dynamic_batching=True, instance_count=2,
                                preferred_batch_sizes=(16,), max_queue_delay_us=500, intra_op_threads=2)
    tuned = space.apply(candidate, original)
    result = tuned_text(USER_TEXT, tuned, ["max_batch_size", "dynamic_batching", "instance_group"],
                        ["intra_op_thread_count"], "# tuned\n")
    assert result.kept_comments
    assert parse_config_text(result.text) == tuned
    for kept in ("# header comment", 'name: "m"   # trailing comment', "# closing comment",
                 'parameters: { key: "other" value: { string_value: "a}b # not a comment" } }'):
        assert kept in result.text
    assert "max_batch_size: 16" in result.text and "max_batch_size: 8" not in result.text
    assert result.text.count("instance_group") == 1
    parsed = parse_config_text(result.text)
    assert [(g.count) for g in parsed.instance_group] == [2]
    assert parsed.dynamic_batching.max_queue_delay_microseconds == 500
    assert list(parsed.dynamic_batching.preferred_batch_size) == [16]
    assert parsed.parameters["intra_op_thread_count"].string_value == "2"
    assert parsed.parameters["other"].string_value == "a}b # not a comment"


def test_tuned_text_for_a_model_without_config_pbtxt_holds_the_tuned_fields():
    tuned = space.apply(space.Candidate(8, True, 2), ModelConfig(), batching=True)
    result = tuned_text("", tuned, ["max_batch_size", "dynamic_batching", "instance_group"], [], "# tuned\n")
    parsed = parse_config_text(result.text)
    assert parsed.max_batch_size == 8 and parsed.HasField("dynamic_batching")
    assert [g.count for g in parsed.instance_group] == [2]


def test_apply_keeps_other_dynamic_batching_fields_and_can_turn_batching_off():
    config = parse_config_text(
        'name: "m"\nmax_batch_size: 8\ndynamic_batching { priority_levels: 2 default_priority_level: 1 }\n')
    tuned = space.apply(space.Candidate(4, True, 1, (4,), 100), config)
    assert tuned.dynamic_batching.priority_levels == 2 and tuned.dynamic_batching.default_priority_level == 1
    assert list(tuned.dynamic_batching.preferred_batch_size) == [4]
    off = space.apply(space.Candidate(4, False, 1), config)
    assert not off.HasField("dynamic_batching") and off.max_batch_size == 4
    assert text_format.MessageToString(space.apply(space.baseline(config), config)) == \
        text_format.MessageToString(config)


# --- frontier, choice and prices ------------------------------------------------------------------------


def point(throughput: float, p99: float, usd: float = 1.0) -> Measurement:
    level = Level(concurrency=1, throughput=throughput, requests=100, p50_ms=p99 / 2, p95_ms=p99 * 0.9, p99_ms=p99,
                  mean_ms=p99 / 2, batch_size=1.0)
    return Measurement(space.Candidate(8, True, 1), level, pricing.Cost(usd, "test"))


def test_frontier_keeps_only_points_nothing_beats_on_both_axes():
    a, b, c, d = point(100, 5), point(300, 10), point(200, 12), point(400, 30)
    assert frontier([c, d, a, b], 99) == [a, b, d]  # c is beaten by b (more throughput, less latency)


def test_best_under_budget_most_throughput_or_cheapest():
    a, b, d = point(100, 5, usd=3.0), point(300, 10, usd=1.0), point(400, 30, usd=0.5)
    assert best([a, b, d], 99, 12, cheapest=False) is b
    assert best([a, b, d], 99, None, cheapest=False) is d
    assert best([a, b, d], 99, 12, cheapest=True) is b
    assert best([a, b, d], 99, 1, cheapest=False) is None


def test_lambda_cost_bills_whole_milliseconds_at_the_memory_of_the_vcpus():
    cost = pricing.lambda_cost(latency_ms=10.2, batch=1, vcpus=1)
    # 11 ms billed at 1,769 MB, plus the request fee, per million requests
    expected = (0.011 * 1769 / 1024 * 0.0000166667 + 0.20 / 1e6) * 1e6
    assert math.isclose(cost.usd_per_million, expected, rel_tol=1e-9)
    assert math.isclose(cost.usd_per_million, 0.5167, rel_tol=1e-3)
    assert pricing.lambda_cost(10.2, batch=2, vcpus=1).usd_per_million == pytest.approx(expected / 2)
    assert pricing.lambda_memory_mb(2) == 3538 and pricing.lambda_memory_mb(8) == 10240


def test_cloud_run_cost_is_instance_seconds_per_inference_plus_request_fees():
    cost = pricing.cloud_run_cost(throughput=500.0, batch=1, vcpus=2, memory_gib=4)
    per_second = 2 * 0.000024 + 4 * 0.0000025
    assert cost.usd_per_million == pytest.approx(1e6 / 500 * per_second + 0.40)
    assert "Cloud Run (2 vCPU, 4 GiB)" in cost.basis and pricing.PRICES_AS_OF in cost.basis


def test_candidates_leave_threads_to_the_cpu_budget_and_the_tuned_file_drops_the_explicit_count():
    original = textwrap.dedent(TINY).lstrip()
    config = parse_config_text(original)
    stage = space.stage_one(config, [8], [1, 2], cpus=4)
    assert [c.budget_threads for c in stage] == [4, 2]
    assert stage[1].label() == ("max_batch_size 8, delay 0 us, 2 instance(s), 4 CPU(s): 2 thread(s) per instance "
                                "(CPU budget)")
    tuned = space.apply(stage[1], config)
    assert "intra_op_thread_count" not in tuned.parameters  # the runtime divides the CPUs
    assert space.apply(space.baseline(config), config).parameters["intra_op_thread_count"].string_value == "1"
    fields = ["max_batch_size", "dynamic_batching", "instance_group"]
    text = tuned_text(original, tuned, fields, ["intra_op_thread_count"], "# tuned\n").text
    assert "intra_op_thread_count" not in text and "# tiny: a 16x16 MatMul" in text
    assert parse_config_text(text) == tuned
    lambdas = space.lambda_candidates(config, 3)
    assert [(c.cpus, c.budget_threads, c.instance_count) for c in lambdas] == [(1, 1, 1), (2, 2, 1), (3, 3, 1)]
