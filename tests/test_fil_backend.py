"""The fil backend in-process: FIL's parameter rules and messages, the checks `toolkit validate`
runs on a fil model (Triton's where it has them, and the ones it leaves to fail on every request),
batches through the real DynamicBatcher with real instances, and the thread budget."""

from __future__ import annotations

import asyncio
import json
import queue
import shutil
import threading
from pathlib import Path

import fil_models
import numpy as np
import pytest
from typer.testing import CliRunner

from handlers.backends.fil import tensors
from handlers.backends.fil.errors import FilModelError
from handlers.backends.fil.instance import FilInstance
from handlers.backends.fil.parameters import parse_parameters
from handlers.batching import DynamicBatcher
from handlers.errors import InferenceError
from handlers.inference import InferRequest, InferResponse
from handlers.manifest import ModelSpec
from toolkit.build.runtime_deps import runtime_requirements
from toolkit.cli import app
from toolkit.repository.compile import compile_repository

WAIT = 10.0


def params(**values: str) -> dict:
    return {"name": "m", "parameters": {k: {"string_value": v} for k, v in values.items()}}


# -- parameters: FIL's reading rules and messages --------------------------------------------------


def test_defaults_and_required_is_classifier():
    with pytest.raises(FilModelError) as info:
        parse_parameters(params())
    assert info.value.message == "Required parameter is_classifier not found in config"
    assert info.value.code == "Invalid argument"
    p = parse_parameters(params(is_classifier="false"))
    assert (p.model_type, p.predict_proba, p.threshold, p.cpu_nthread) == ("xgboost", False, 0.5, -1)
    assert p.default_filename == "xgboost.model"


def test_classifier_needs_a_threshold():
    with pytest.raises(FilModelError, match="^Required parameter threshold not found in config$"):
        parse_parameters(params(is_classifier="true"))
    with pytest.raises(FilModelError, match="^Bad input for parameter threshold$"):
        parse_parameters(params(is_classifier="true", threshold="high"))
    assert parse_parameters(params(is_classifier="true", threshold=" 0.3x")).threshold == pytest.approx(0.3)


def test_booleans_are_exactly_true_or_false():
    with pytest.raises(FilModelError) as info:
        parse_parameters(params(is_classifier="false", predict_proba="True"))
    assert info.value.message == "Expected 'true' or 'false' for parameter 'predict_proba', got: 'True'"
    assert info.value.code == "Internal"
    assert info.value.key == "predict_proba"


def test_model_type_values_and_words():
    with pytest.raises(FilModelError) as info:
        parse_parameters(params(model_type="catboost", is_classifier="false"))
    assert info.value.message == "catboost not recognized as a valid serialization format."
    assert info.value.code == "Unsupported"
    # read like `istringstream >> string`: the first word; an empty value takes the default
    assert parse_parameters(params(model_type=" lightgbm extra", is_classifier="false")).model_type == "lightgbm"
    assert parse_parameters(params(model_type="", is_classifier="false")).model_type == "xgboost"


def test_output_class_the_name_tritonserver_2_51_reads():
    p = parse_parameters(params(output_class="true", threshold="0.4"))
    assert p.is_classifier and p.threshold == pytest.approx(0.4)
    assert any("output_class" in note for note in p.notes)
    # as in FIL, output_class wins over is_classifier when it is true or false
    assert parse_parameters(params(output_class="false", is_classifier="true")).is_classifier is False


def test_gpu_only_parameters_are_accepted_with_a_note():
    p = parse_parameters(params(is_classifier="false", algo="TREE_REORG", storage_type="SPARSE", blocks_per_sm="2",
                                threads_per_tree="4", transfer_threshold="2", chunk_size="8", layout="nowhere",
                                use_experimental_optimizations="true"))
    notes = "\n".join(p.notes)
    for name in ("algo", "storage_type", "blocks_per_sm", "threads_per_tree", "transfer_threshold", "chunk_size", "layout"):
        assert f"parameter '{name}' tunes FIL on GPUs" in notes
    assert "Unknown nvForest layout name: nowhere" in notes  # what tritonserver would say on a GPU
    assert "use_experimental_optimizations" in notes
    assert parse_parameters(params(is_classifier="false", cpu_nthread="3x")).cpu_nthread == 3
    assert parse_parameters(params(is_classifier="false", cpu_nthread="many")).cpu_nthread == -1  # default kept


# -- tensors ----------------------------------------------------------------------------------------


def io(name="input__0", dtype="TYPE_FP32", dims=(8,), out="output__0", out_dtype="TYPE_FP32", out_dims=(1,), mbs=8):
    return {"name": "m", "max_batch_size": mbs, "input": [{"name": name, "data_type": dtype, "dims": list(dims)}],
            "output": [{"name": out, "data_type": out_dtype, "dims": list(out_dims)}]}


def test_response_dims_drop_ones_as_rapids_triton_does():
    assert tensors.tensor_layout(io(out_dims=(1,))).response_dims == ()
    assert tensors.tensor_layout(io(out_dims=(3,))).response_dims == (3,)
    assert tensors.tensor_layout(io(out_dims=(1, 3))).response_dims == (3,)
    layout = tensors.tensor_layout(io(dims=(-1, 8), out_dims=(-1, 2), mbs=0))  # no batching: rows first
    assert (layout.features, layout.output_dims) == (8, (2,))


@pytest.mark.parametrize("config, words", [
    (io(name="features"), "has no input 'input__0'"),
    (io(dtype="TYPE_FP64"), "is TYPE_FP64: the fil backend reads input__0 as TYPE_FP32"),
    (io(dims=(2, 4)), "has shape [2, 4]: the fil backend reads it as rows of features"),
    (io(out="scores"), "has no output 'output__0'"),
    (io(out_dtype="TYPE_INT32"), "is TYPE_INT32: the fil backend writes output__0 as TYPE_FP32"),
    (io(out_dims=(-1,)), "has a variable dimension"),
])
def test_tensor_mistakes_tritonserver_leaves_to_every_request(config, words):
    with pytest.raises(FilModelError) as info:
        tensors.tensor_layout(config)
    assert words in info.value.message


# -- what `toolkit validate` says about fil models --------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, dict[str, fil_models.FilCase]]:
    repo = tmp_path_factory.mktemp("trained") / "models"
    cases = {c.name: c for c in [*fil_models.xgboost_models(repo), *fil_models.lightgbm_models(repo)]}
    return repo, cases


def one_model(trained, tmp_path: Path, source: str, name: str = "m") -> Path:
    """A copy of trained model `source` as model `name` in a repository of its own."""
    repo = tmp_path / "models"
    shutil.copytree(trained[0] / source, repo / name)
    return repo


def edit(repo: Path, old: str, new: str, name: str = "m") -> None:
    path = repo / name / "config.pbtxt"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def failure(repo: Path):
    result = compile_repository(repo)
    assert not result.ok, "the model compiled"
    return next(iter(result.failures.values()))


def test_trained_models_compile_with_their_model_files(trained):
    result = compile_repository(trained[0])
    assert result.ok, result.failure_lines()
    assert result.models["xgb_binary_pair"].model_files == {1: "1/xgboost.ubj"}
    assert result.models["xgb_regressor"].model_files == {1: "1/model.json"}  # default_model_filename
    assert result.models["lgb_multiclass"].model_files == {1: "1/model.txt"}


def test_wrong_feature_count(trained, tmp_path):
    repo = one_model(trained, tmp_path, "xgb_multiclass")
    edit(repo, "dims: [ 8 ]", "dims: [ 7 ]")
    error = failure(repo)
    assert "input 'input__0' of model 'm' has 7 features per row, but the model was trained on 8 features" in error.message
    assert error.line == 3 and "set its dims to [ 8 ]" in error.detail


def test_output_dims_that_do_not_fit_the_model(trained, tmp_path):
    repo = one_model(trained, tmp_path, "xgb_multiclass")
    edit(repo, "dims: [ 3 ]", "dims: [ 2 ]")
    error = failure(repo)
    assert ("output 'output__0' of model 'm' has 2 values per row (dims [2]), but this multiclass classifier, "
            "3 classes gives 3 with is_classifier true and predict_proba true") in error.message
    assert "set its dims to [ 3 ]" in error.detail


def test_output_dims_message_names_the_classifier_parameter_the_config_uses(trained, tmp_path):
    repo = one_model(trained, tmp_path, "xgb_multiclass")
    edit(repo, "dims: [ 3 ]", "dims: [ 2 ]")
    edit(repo, 'key: "is_classifier"', 'key: "output_class"')  # tritonserver 2.51's FIL reads this name
    error = failure(repo)
    assert "gives 3 with output_class true and predict_proba true" in error.message


@pytest.mark.parametrize("source, model_type, looks_like", [
    ("xgb_multiclass", "lightgbm", "xgboost_json"),  # an XGBoost JSON file under the wrong model_type
    ("xgb_binary_pair", "xgboost_json", "xgboost_ubj"),
    ("lgb_regressor", "xgboost_json", "lightgbm"),
    ("lgb_regressor", "xgboost", "lightgbm"),
])
def test_a_model_file_under_the_wrong_model_type(trained, tmp_path, source, model_type, looks_like):
    repo = one_model(trained, tmp_path, source)
    text = (repo / "m" / "config.pbtxt").read_text()
    current = text.split('key: "model_type" value: { string_value: "')[1].split('"')[0]
    edit(repo, f'string_value: "{current}"', f'string_value: "{model_type}"')
    from handlers.backends.fil.parameters import DEFAULT_FILENAMES
    (repo / "m" / "1" / next((repo / "m" / "1").iterdir()).name).rename(repo / "m" / "1" / DEFAULT_FILENAMES[model_type])
    error = failure(repo)
    assert f"but model_type is '{model_type}'" in error.message
    assert error.detail == f'set model_type to "{looks_like}"'
    assert error.hint == "model_type" and error.line is not None


def test_a_damaged_model_file_gets_treelites_reason(trained, tmp_path):
    repo = one_model(trained, tmp_path, "xgb_multiclass")
    path = repo / "m" / "1" / "xgboost.json"
    path.write_text(path.read_text()[:500])  # truncated JSON
    error = failure(repo)
    assert "Provided JSON could not be parsed as XGBoost model" in error.message
    assert error.code == "Unknown"
    assert "Treelite could not read 'xgboost.json' as an XGBoost JSON model" in error.detail


def test_missing_model_file_names_the_file_fil_reads(trained, tmp_path):
    repo = one_model(trained, tmp_path, "lgb_regressor")
    (repo / "m" / "1" / "model.txt").unlink()
    error = failure(repo)
    assert error.message.startswith("Check failed: std::filesystem::exists(path): Path ")
    assert error.message.endswith('/m/1/model.txt" does not exist')
    assert "model_type 'lightgbm' reads 'model.txt'" in error.detail


def test_missing_checkpoint_gets_fils_own_message(trained, tmp_path):
    repo = one_model(trained, tmp_path, "lgb_regressor")
    edit(repo, 'string_value: "lightgbm"', 'string_value: "treelite_checkpoint"')
    error = failure(repo)
    assert error.message == f'Could not open model file "{repo / "m" / "1" / "checkpoint.tl"}"'
    assert error.code == "Unavailable"


def test_unknown_model_type_and_shap_output_through_the_cli(trained, tmp_path):
    repo = one_model(trained, tmp_path, "lgb_regressor", "bad_type")
    edit(repo, 'string_value: "lightgbm"', 'string_value: "light_gbm"', name="bad_type")
    shutil.copytree(trained[0] / "lgb_regressor", repo / "shap")
    edit(repo, 'output [ {', 'output [ { name: "treeshap_output" data_type: TYPE_FP32 dims: [ 9 ] }, {', name="shap")
    result = CliRunner().invoke(app, ["validate", str(repo), "--json"])
    assert result.exit_code == 1
    models = {m["name"]: m for m in json.loads(result.stdout)["models"]}
    assert models["bad_type"]["error"] == "light_gbm not recognized as a valid serialization format."
    assert models["bad_type"]["line"] == 8  # the model_type line
    assert "declares output 'treeshap_output': FIL's SHAP values are not computed by this backend" in models["shap"]["error"]


def test_validate_lists_notes_for_gpu_parameters(trained, tmp_path):
    repo = one_model(trained, tmp_path, "lgb_regressor")
    edit(repo, "parameters [\n", 'parameters [\n  { key: "storage_type" value: { string_value: "DENSE" } },\n')
    edit(repo, 'dynamic_batching { }', 'dynamic_batching { }\ninstance_group [ { kind: KIND_GPU } ]')
    result = compile_repository(repo, device="gpu")
    assert result.ok, result.failure_lines()
    warnings = "\n".join(result.models["m"].warnings)
    assert "parameter 'storage_type' tunes FIL on GPUs" in warnings
    assert "KIND_GPU instances of the fil backend predict on the CPU here" in warnings


# -- instances behind the real batcher ---------------------------------------------------------------


def spec_of(repo: Path, name: str) -> ModelSpec:
    compiled = compile_repository(repo, models=[name])
    assert compiled.ok, compiled.failure_lines()
    model = compiled.models[name]
    return ModelSpec(name, model.path, tuple(model.versions), {v: model.path / f for v, f in model.model_files.items()},
                     model.config)


class Gated:
    """A real FilInstance that reports each batch it starts and holds it until released."""

    def __init__(self, instance: FilInstance, events: queue.Queue) -> None:
        self.instance = instance
        self.name = instance.name
        self.events = events
        self.gate = threading.Semaphore(0)

    def execute(self, requests):
        self.events.put((self.name, [r.id for r in requests]))
        assert self.gate.acquire(timeout=60), "the test never released this batch"
        return self.instance.execute(requests)


def rows_request(name: str, model: str, rows: np.ndarray) -> InferRequest:
    return InferRequest(model, 1, {"input__0": rows}, id=name, batch_size=rows.shape[0])


def test_gated_batches_on_two_real_instances(trained):
    """Requests queued while both instances are busy are merged into one batch (up to
    max_batch_size rows); two instances run at once; every request gets its own rows' answer."""
    repo, cases = trained
    spec = spec_of(repo, "lgb_multiclass")  # instance_group count 2, max_batch_size 64
    case = cases["lgb_multiclass"]
    events: queue.Queue = queue.Queue()
    instances = [Gated(FilInstance(spec, 1, f"lgb_multiclass_0_{i}"), events) for i in range(2)]
    batcher = DynamicBatcher("lgb_multiclass", spec.config, instances)
    results: dict[str, object] = {}
    done = threading.Event()

    def callback(name):
        def record(outcome):
            results[name] = outcome
            if len(results) == 6:
                done.set()
        return record

    slices = {"a": (0, 3), "b": (3, 4), "c": (4, 10), "d": (10, 12), "e": (12, 20), "f": (20, 21)}
    batcher.start()
    try:
        for name in ("a", "b"):
            start, stop = slices[name]
            batcher.submit(rows_request(name, "lgb_multiclass", case.rows[start:stop]), callback(name))
            assert events.get(timeout=WAIT)[1] == [name]  # each instance took one request
        for name in ("c", "d", "e", "f"):  # both instances busy: these wait together
            start, stop = slices[name]
            batcher.submit(rows_request(name, "lgb_multiclass", case.rows[start:stop]), callback(name))
        for instance in instances:
            instance.gate.release(3)
        merged = events.get(timeout=WAIT)[1]
        assert merged == ["c", "d", "e", "f"]  # one batch of 17 rows
        assert done.wait(WAIT)
    finally:
        batcher.stop(drain=False, timeout=WAIT)
    for name, (start, stop) in slices.items():
        outcome = results[name]
        assert isinstance(outcome, InferResponse), outcome
        fil_models.assert_matches(name, outcome.outputs["output__0"], case.expected[start:stop])


def test_variable_feature_count_is_checked_per_request(trained, tmp_path):
    """With dims [ -1 ] the config cannot say the feature count: a request with the wrong count
    is refused alone, the others of its batch are answered."""
    repo = one_model(trained, tmp_path, "xgb_binary_pair")
    edit(repo, "dims: [ 8 ]", "dims: [ -1 ]")
    spec = spec_of(repo, "m")
    case = trained[1]["xgb_binary_pair"]
    instance = FilInstance(spec, 1, "m_0")
    good = rows_request("good", "m", case.rows[:5])
    bad = rows_request("bad", "m", np.zeros((2, 7), np.float32))
    outcomes = instance.execute([good, bad, rows_request("also", "m", case.rows[5:6])])
    assert isinstance(outcomes[1], InferenceError)
    assert outcomes[1].message == "input 'input__0' of model 'm' has 7 features per row; the model was trained on 8 features"
    fil_models.assert_matches("good", outcomes[0].outputs["output__0"], case.expected[:5])
    fil_models.assert_matches("also", outcomes[2].outputs["output__0"], case.expected[5:6])


def test_model_without_batching_takes_rows_as_its_first_dimension(trained, tmp_path):
    repo = one_model(trained, tmp_path, "xgb_multiclass")
    edit(repo, "max_batch_size: 64", "max_batch_size: 0")
    edit(repo, "dims: [ 8 ]", "dims: [ -1, 8 ]")
    edit(repo, "dims: [ 3 ]", "dims: [ -1, 3 ]")
    edit(repo, "dynamic_batching { }", "")
    spec = spec_of(repo, "m")
    case = trained[1]["xgb_multiclass"]
    [outcome] = FilInstance(spec, 1, "m_0").execute([InferRequest("m", 1, {"input__0": case.rows[:7]}, id="x")])
    fil_models.assert_matches("no batching", outcome.outputs["output__0"], case.expected[:7])


def test_real_batcher_under_concurrent_load(trained):
    repo, cases = trained
    spec = spec_of(repo, "xgb_binary_positive")
    case = cases["xgb_binary_positive"]
    instances = [FilInstance(spec, 1, f"i{i}") for i in range(2)]
    batcher = DynamicBatcher("xgb_binary_positive", spec.config, instances)
    batcher.start()
    try:
        requests = [rows_request(str(i), "xgb_binary_positive", case.rows[i % 40 : i % 40 + 1]) for i in range(200)]

        async def run():
            return await asyncio.gather(*(batcher.infer(r) for r in requests))

        for i, response in enumerate(asyncio.run(run())):
            fil_models.assert_matches(str(i), response.outputs["output__0"], case.expected[i % 40 : i % 40 + 1])
    finally:
        batcher.stop(timeout=WAIT)


# -- threads and image contents ---------------------------------------------------------------------


def test_threads_come_from_the_cpu_budget_unless_cpu_nthread_sets_them(trained, tmp_path):
    """The container's CPUs are shared by the instances (handlers/cpu_budget.py); FIL's
    cpu_nthread is an explicit count the budget sets aside first."""
    from handlers import backends, cpu_budget
    from handlers.backends.fil.instance import prediction_threads

    repo = one_model(trained, tmp_path, "lgb_multiclass", "shared")  # 2 instances
    shutil.copytree(trained[0] / "xgb_regressor", repo / "fixed")
    edit(repo, "parameters [\n", 'parameters [\n  { key: "cpu_nthread" value: { string_value: "3" } },\n', name="fixed")
    compiled = compile_repository(repo)
    assert compiled.ok, compiled.failure_lines()
    assert backends.backend_module("fil").explicit_threads(compiled.models["fixed"].config) == 3
    assert backends.backend_module("fil").explicit_threads(compiled.models["shared"].config) is None
    plan = cpu_budget.plan(compiled.models.values(), cpu_budget.for_target(8, "8 CPUs"))
    threads = {(s.model, s.instance): (s.threads, s.source) for s in plan.shares}
    # 8 CPUs: 3 set aside for cpu_nthread, the other 5 shared by the 2 budgeted instances
    assert threads == {("fixed", "fixed_0"): (3, "explicit"), ("shared", "shared_0_0"): (3, "budget"),
                       ("shared", "shared_0_1"): (2, "budget")}
    assert prediction_threads(-1, 2) == 2 and prediction_threads(4, 2) == 4 and prediction_threads(-1, None) == -1


def test_treelite_floor_is_the_same_in_images_and_the_fil_extra():
    import tomllib

    from toolkit.build.runtime_deps import TREELITE

    extra = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert extra["project"]["optional-dependencies"]["fil"] == [TREELITE.spec]


def test_images_of_fil_repositories_carry_treelite_alone():
    fil = runtime_requirements(server=True, aws_lambda=False, runtime_client=False, gpu_cuda=None, backends={"fil"})
    names = [r.name for r in [*fil.resolved, *fil.no_deps]]
    assert [r.name for r in fil.no_deps] == ["treelite"] and fil.no_deps[0].no_deps  # without scipy
    assert not any(n.startswith(("nvidia", "scipy", "xgboost", "lightgbm", "onnxruntime", "openvino")) for n in names)
    onnx = runtime_requirements(server=True, aws_lambda=False, runtime_client=False, gpu_cuda=None)
    assert "treelite" not in [r.name for r in onnx.no_deps]


def test_repository_loads_fil_models_with_warmup(trained):
    """The runtime's ModelRepository loads fil models like any other: xgb_regressor has a
    model_warmup sample (4 random rows), which runs on its instance before it is READY."""
    from handlers.manifest import Manifest
    from handlers.model_repository import ModelRepository

    repo = trained[0]
    compiled = compile_repository(repo, models=["xgb_regressor", "lgb_multiclass"])
    assert compiled.ok, compiled.failure_lines()
    repository = ModelRepository(Manifest.from_dict(compiled.manifest(), repo))
    repository.load()
    try:
        regressor = repository.models["xgb_regressor"][1]
        assert regressor.state.name == "READY" and regressor.warmup_seconds > 0
        assert len(repository.models["lgb_multiclass"][1].instances) == 2
        assert all(i.threads >= 1 for i in repository.models["lgb_multiclass"][1].instances)
    finally:
        repository.stop(drain=False)


# -- damaged model files never crash the toolkit or the server ---------------------------------------


def test_a_damaged_checkpoint_is_refused_before_it_can_crash_a_prediction(tmp_path):
    """A checkpoint whose tree points at a node that does not exist loads in Treelite, and GTIL
    would crash the first prediction that reaches it: `validate` refuses it (the damage is made
    with Treelite's own field accessors)."""
    import treelite.sklearn
    from sklearn.ensemble import RandomForestClassifier

    repo = tmp_path / "models"
    X, y, _ = fil_models._data(9, classes=3, missing=False)
    forest = treelite.sklearn.import_model(RandomForestClassifier(n_estimators=3, max_depth=4, random_state=0).fit(X, y))
    tree = forest.get_tree_accessor(1)
    left = tree.get_field("cleft").copy()
    left[0] = 100_000
    tree.set_field("cleft", left)
    target = fil_models.write_model(repo, "m", "checkpoint.tl", {"model_type": "treelite_checkpoint",
                                    "is_classifier": "true", "predict_proba": "true", "threshold": "0.5"}, out_dims=[3])
    target.parent.mkdir(parents=True)
    forest.serialize(str(target))
    error = failure(repo)
    assert error.message == f"model file '{target}' is damaged: tree 1: a child node is out of range"
    assert "would crash the server" in error.detail


@pytest.mark.parametrize("behaviour, words", [
    ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "Treelite crashed (SIGSEGV) while reading model file"),
    ("import time; time.sleep(30)", "Treelite did not finish reading model file"),
])
def test_the_probe_process_reports_a_crash_or_a_hang(monkeypatch, tmp_path, behaviour, words):
    """The compiler reads model files in a child process (probe.py). Here that child really
    crashes or hangs (a module standing in for a damaged file's effect on Treelite, since no
    file is known to crash every Treelite version): the parent reports it as the model's error."""
    from handlers.backends.fil import probe

    (tmp_path / "bad_probe.py").write_text(behaviour + "\n")
    monkeypatch.setattr(probe, "PROBE_MODULE", "bad_probe")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with pytest.raises(FilModelError) as info:
        probe.probe({"name": "m"}, tmp_path / "model.txt", timeout=5)
    assert words in info.value.message
    assert info.value.file == str(tmp_path / "model.txt")
