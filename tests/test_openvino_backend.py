"""The openvino backend (Triton's openvino_backend on the OpenVINO runtime).

Models are made by OpenVINO itself (tests/openvino_models.py: convert_model + save_model from an
ONNX file built here). Covered: the build's checks and auto-complete with the backend's messages,
the parameters, batching (a gated batcher over real OpenVINO instances), instances, warmup, bad
input; `toolkit serve` driven by tritonclient and perf_analyzer, with outputs compared to
OpenVINO's own and ONNX Runtime's. The image (and the onnxruntime OpenVINO accelerator, which
needs onnxruntime-openvino instead of onnxruntime) is tested in test_openvino_image.py.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import threading
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import model_builders as mb
import openvino_models as ovm
from conftest import write_config
from serving import serve
from tools import perf_analyzer

from handlers.backends import openvino as backend
from handlers.batching import DynamicBatcher
from handlers.inference import InferRequest, InferResponse
from handlers.instance_group import InstanceSlot
from handlers.manifest import Manifest, ModelSpec
from toolkit.build.runtime_deps import (
    ONNXRUNTIME_CPU,
    ONNXRUNTIME_OPENVINO,
    OPENVINO,
    runtime_backends,
    runtime_requirements,
)
from toolkit.repository.compile import compile_repository

WAIT = 30.0

ADD_SUB = """
    backend: "openvino"
    max_batch_size: 8
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""


def add_sub_model(repo: Path, name: str = "add_sub", config: str = ADD_SUB, **kwargs) -> Path:
    ovm.add_sub_ir(repo / name / "1" / "model.xml", **kwargs)
    if config is not None:
        write_config(repo, name, config)
    return repo / name


def failure(repo: Path, name: str, device: str = "cpu"):
    result = compile_repository(repo, device=device)
    assert name in result.failures, f"{name} compiled: {result.models.get(name)}"
    return result.failures[name]


def spec_of(repo: Path, name: str) -> ModelSpec:
    result = compile_repository(repo)
    assert result.ok, result.failure_lines()
    return Manifest.from_dict(result.manifest(), repo).models[name]


def feeds(batch: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal((batch, 16)).astype(np.float32) for n in ("INPUT0", "INPUT1")}


# -- build-time: auto-complete ---------------------------------------------------------------------


def test_auto_complete_fills_inputs_and_outputs_from_the_ir(repo):
    """No config.pbtxt: backend and model file from model.xml (AutoCompleteBackendFields), then the
    backend's auto-complete: the IR has no layout, so max_batch_size stays 0 and dims are the
    model's own, -1 where they vary."""
    add_sub_model(repo, config=None)
    config = compile_repository(repo).models["add_sub"].config
    assert config["backend"] == "openvino" and config["default_model_filename"] == "model.xml"
    assert config["max_batch_size"] == 0 and "dynamic_batching" not in config
    assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
        ("INPUT0", "TYPE_FP32", [-1, 16]), ("INPUT1", "TYPE_FP32", [-1, 16])]
    assert [(o["name"], o["data_type"], o["dims"]) for o in config["output"]] == [
        ("OUTPUT0", "TYPE_FP32", [-1, 16]), ("OUTPUT1", "TYPE_FP32", [-1, 16])]
    assert [(g["kind"], g["count"]) for g in config["instance_group"]] == [("KIND_CPU", 1)]


def test_auto_complete_batches_a_model_whose_layout_has_a_batch_dimension(repo):
    add_sub_model(repo, config=None, batch_layout=True)
    model = compile_repository(repo).models["add_sub"]
    assert model.config["max_batch_size"] == 4 and model.config["dynamic_batching"]["preferred_batch_size"] == [4]
    assert [i["dims"] for i in model.config["input"]] == [[16], [16]]
    assert any("autofilled max_batch_size to 4 for model 'add_sub'" in w for w in model.warnings)


def test_a_batching_config_on_a_model_without_layout_only_warns(repo):
    add_sub_model(repo, config='backend: "openvino"\nmax_batch_size: 8\n')
    model = compile_repository(repo).models["add_sub"]
    assert model.config["max_batch_size"] == 8 and [i["dims"] for i in model.config["input"]] == [[16], [16]]
    assert any("does not support batching while non-zero max_batch_size is specified" in w for w in model.warnings)


def test_onnx_file_read_by_openvino(repo):
    mb.add_sub(repo / "ov_onnx" / "1" / "model.onnx")
    write_config(repo, "ov_onnx", 'backend: "openvino"\ndefault_model_filename: "model.onnx"\n')
    config = compile_repository(repo).models["ov_onnx"].config
    assert config["backend"] == "openvino" and [i["name"] for i in config["input"]] == ["INPUT0", "INPUT1"]


# -- build-time: the backend's checks and messages -------------------------------------------------


def test_missing_bin_beside_the_xml_is_a_clear_error(repo, tmp_path):
    ovm.matmul_relu_ir(repo / "relu" / "1" / "model.xml", tmp_path / "relu.onnx")  # weights: W
    (repo / "relu" / "1" / "model.bin").unlink()
    error = failure(repo, "relu")
    assert error.message.startswith("openvino error in reading model : ")
    assert "bin file cannot be found" in error.message  # OpenVINO's own words, without its source lines
    assert "the IR's weights file 'model.bin' is missing beside 'model.xml'" in error.message
    assert error.file == str(repo / "relu" / "1" / "model.xml") and error.stage == "load"


def test_corrupt_ir_and_missing_model_file(repo):
    add_sub_model(repo)
    (repo / "add_sub" / "1" / "model.xml").write_text("<net><layers><layer")
    assert "openvino error in reading model : Unable to read the model" in failure(repo, "add_sub").message
    shutil.rmtree(repo / "add_sub" / "1")
    (repo / "add_sub" / "1").mkdir()
    error = failure(repo, "add_sub")
    assert error.message == f"unable to find '{repo / 'add_sub' / '1' / 'model.xml'}' for model 'add_sub'"


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.replace('name: "INPUT1"', 'name: "IN1"'), "unexpected inference input 'IN1', allowed inputs are: INPUT0, INPUT1"),
    (lambda c: c.replace('name: "OUTPUT1"', 'name: "OUT1"'),
     "unexpected inference output 'OUT1', allowed outputs are: OUTPUT0, OUTPUT1"),
    (lambda c: c.replace(', { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }', ""),
     "unable to load model 'add_sub', configuration expects 1 inputs, model provides 2"),
    (lambda c: c.replace('"INPUT0" data_type: TYPE_FP32 dims: [ 16 ]', '"INPUT0" data_type: TYPE_FP32 dims: [ 4, 4 ]'),
     "model 'add_sub', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) but the model configuration "
     "specifies 3 dimensions (an initial batch dimension because max_batch_size > 0 followed by the explicit tensor "
     "shape, making complete shape [8,4,4])"),
    (lambda c: c.replace('"OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ]', '"OUTPUT0" data_type: TYPE_FP32 dims: [ 15 ]'),
     "model 'add_sub', tensor 'OUTPUT0': the model expects 2 dimensions (shape [-1,16]) but the model configuration "
     "specifies 2 dimensions (an initial batch dimension because max_batch_size > 0 followed by the explicit tensor "
     "shape, making complete shape [8,15])"),
    (lambda c: c.replace('"INPUT0" data_type: TYPE_FP32', '"INPUT0" data_type: TYPE_FP64'),
     "unsupported datatype TYPE_FP64 for input 'INPUT0' for model 'add_sub'"),
    (lambda c: c + 'parameters { key: "NUM_STREAMS" value: { string_value: "many" } }',
     "expected the parameter 'NUM_STREAMS' to be either AUTO/NUMA/<int_value>, got many"),
    (lambda c: c + 'parameters { key: "PERFORMANCE_HINT" value: { string_value: "fast" } }',
     "expected the parameter 'PERFORMANCE_HINT' to be LATENCY/THROUGHPUT/CUMULATIVE_THROUGHPUT, got fast"),
    (lambda c: c + 'parameters { key: "INFERENCE_NUM_THREADS" value: { string_value: "-2" } }',
     "expected the parameter 'INFERENCE_NUM_THREADS' to be a non-negative number, got -2"),
    (lambda c: c + 'parameters { key: "HINT_BF16" value: { string_value: "maybe" } }',
     "expected the parameter 'HINT_BF16' to be YES, got maybe"),
])
def test_config_against_the_model_with_the_backends_messages(repo, edit, message):
    add_sub_model(repo, config=edit(ADD_SUB))
    assert failure(repo, "add_sub").message == message


def test_kind_gpu_is_refused_on_a_gpu_target_and_mapped_to_cpu_on_a_cpu_target(repo):
    add_sub_model(repo, config=ADD_SUB + "instance_group [ { kind: KIND_GPU } ]\n")
    error = failure(repo, "add_sub", device="gpu")
    assert error.message == "unable to load model 'add_sub', Triton OpenVINO backend supports only Kind CPU and AUTO"
    assert compile_repository(repo, device="cpu").ok
    # no instance_group: the backend prefers CPU instances even where a GPU exists
    write_config(repo, "add_sub", ADD_SUB)
    groups = compile_repository(repo, device="gpu").models["add_sub"].config["instance_group"]
    assert [(g["kind"], g["count"]) for g in groups] == [("KIND_CPU", 1)]


def test_other_model_formats_are_refused_with_the_way_forward(repo):
    (repo / "tf" / "1" / "model.pdmodel").parent.mkdir(parents=True)
    (repo / "tf" / "1" / "model.pdmodel").write_bytes(b"\0")
    write_config(repo, "tf", 'backend: "openvino"\ndefault_model_filename: "model.pdmodel"\n')
    error = failure(repo, "tf")
    assert "is not an OpenVINO IR (.xml) or ONNX (.onnx) file" in error.message and "ovc" in error.detail


def test_validate_names_the_file_and_exits_1(repo):
    add_sub_model(repo, config=ADD_SUB + 'parameters { key: "NUM_STREAMS" value: { string_value: "x" } }\n')
    from typer.testing import CliRunner

    from toolkit.cli import app

    result = CliRunner().invoke(app, ["validate", str(repo), "--json"], env={"COLUMNS": "200"})
    assert result.exit_code == 1
    assert "expected the parameter 'NUM_STREAMS' to be either AUTO/NUMA/<int_value>, got x" in result.stdout
    assert str(repo / "add_sub" / "config.pbtxt") in result.stdout


# -- the runtime: parameters, batching, instances ----------------------------------------------------


def instances(spec: ModelSpec, count: int = 1) -> list[backend.OpenVINOInstance]:
    return [backend.create_instance(spec, 1, InstanceSlot(f"{spec.name}_{i}", "KIND_CPU", 0)) for i in range(count)]


def test_instances_share_one_compiled_model_and_its_parameters(repo):
    add_sub_model(repo, config=ADD_SUB + """
        parameters { key: "NUM_STREAMS" value: { string_value: "2" } }
        parameters { key: "PERFORMANCE_HINT" value: { string_value: "throughput" } }
        parameters { key: "INFERENCE_NUM_THREADS" value: { string_value: "2" } }
    """)
    made = instances(spec_of(repo, "add_sub"), 2)
    try:
        assert made[0].compiled is made[1].compiled and made[0].request is not made[1].request
        compiled = made[0].compiled
        assert compiled.get_property("NUM_STREAMS") == 2
        assert str(compiled.get_property("PERFORMANCE_HINT")).endswith("THROUGHPUT")
        assert compiled.get_property("INFERENCE_NUM_THREADS") == 2
        assert str(compiled.inputs[0].get_partial_shape()) == "[1..8,16]"  # any batch up to max_batch_size
    finally:
        for instance in made:
            instance.close()
    assert not backend._compiled  # the last instance closed releases the compiled model


def test_cpu_budget_hook_reports_explicit_inference_threads_per_instance(repo):
    """INFERENCE_NUM_THREADS is the version's total (one compiled model for its instances): the CPU
    budget's hook reports each instance's part; unset, the budget has nothing fixed to count."""
    add_sub_model(repo, config=ADD_SUB + "instance_group [ { count: 2 kind: KIND_CPU } ]\n")
    spec = spec_of(repo, "add_sub")
    assert backend.explicit_threads(spec.config) is None
    explicit = {**spec.config, "parameters": {"INFERENCE_NUM_THREADS": {"string_value": "4"}}}
    assert backend.explicit_threads(explicit) == 2


def test_cpu_budget_share_sets_inference_threads_unless_the_config_does(repo):
    """Unset, the compiled model gets its instances' budget shares together; the config's
    INFERENCE_NUM_THREADS wins over the budget."""
    add_sub_model(repo, config=ADD_SUB + "instance_group [ { count: 2 kind: KIND_CPU } ]\n")
    spec = spec_of(repo, "add_sub")
    made = [backend.create_instance(spec, 1, InstanceSlot(f"add_sub_{i}", "KIND_CPU", 0, threads=1)) for i in range(2)]
    try:
        assert made[0].compiled.get_property("INFERENCE_NUM_THREADS") == 2
    finally:
        for instance in made:
            instance.close()
    explicit = ModelSpec(**{**spec.__dict__, "config": {**spec.config, "parameters": {
        "INFERENCE_NUM_THREADS": {"string_value": "1"}}}})
    (instance,) = [backend.create_instance(explicit, 1, InstanceSlot("add_sub_0", "KIND_CPU", 0, threads=3))]
    try:
        assert instance.compiled.get_property("INFERENCE_NUM_THREADS") == 1
    finally:
        instance.close()


def test_instances_warming_up_together_finish(repo):
    """Two instances' first inferences at once (as warmup runs them) both finish: pybind11's
    one-time numpy initialisation deadlocked when two threads reached it together."""
    import subprocess
    import sys

    add_sub_model(repo, config=ADD_SUB + "instance_group [ { count: 2 kind: KIND_CPU } ]\n")
    # a fresh process each time: the initialisation happens once per process
    script = f"""
import sys, concurrent.futures
sys.path[:0] = {[str(Path(__file__).parent), str(Path(__file__).parent.parent)]!r}
import test_openvino_backend as t
from pathlib import Path
made = t.instances(t.spec_of(Path({str(repo)!r}), "add_sub"), 2)
requests = [[t.InferRequest("add_sub", 1, t.feeds(2, seed=i), id=str(i), batch_size=2)] for i in range(2)]
with concurrent.futures.ThreadPoolExecutor(2) as pool:
    outcomes = list(pool.map(lambda pair: pair[0].execute(pair[1]), zip(made, requests)))
assert all(isinstance(o[0], t.InferResponse) for o in outcomes), outcomes
print("ok")
"""
    for attempt in range(6):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_batch_padding_compiles_for_max_batch_size_and_pads(repo):
    add_sub_model(repo, config=ADD_SUB + 'parameters { key: "ENABLE_BATCH_PADDING" value: { string_value: "YES" } }\n')
    (instance,) = instances(spec_of(repo, "add_sub"))
    try:
        assert str(instance.compiled.inputs[0].get_partial_shape()) == "[8,16]"
        requests = [InferRequest("add_sub", 1, feeds(n, seed=n), id=str(n), batch_size=n) for n in (1, 2)]
        for request, outcome in zip(requests, instance.execute(requests)):
            assert outcome.outputs["OUTPUT0"].shape == (request.batch_size, 16)
            np.testing.assert_allclose(outcome.outputs["OUTPUT0"], request.inputs["INPUT0"] + request.inputs["INPUT1"], rtol=1e-6)
    finally:
        instance.close()


def test_reshape_io_layers_and_config_data_types_convert(repo, tmp_path):
    """RESHAPE_IO_LAYERS reshapes a model with free dims to the config's; a config data type other
    than the model's (FP16 here, the model is FP32) is converted by the model, as the backend does."""
    ovm.add_sub_ir(repo / "free" / "1" / "model.xml", dims=("N", "W"))
    write_config(repo, "free", ADD_SUB.replace("TYPE_FP32", "TYPE_FP16")
                 + 'parameters { key: "RESHAPE_IO_LAYERS" value: { string_value: "yes" } }\n')
    (instance,) = instances(spec_of(repo, "free"))
    try:
        assert str(instance.compiled.inputs[0].get_partial_shape()) == "[1..8,16]"
        x = {k: v.astype(np.float16) for k, v in feeds(3).items()}
        (outcome,) = instance.execute([InferRequest("free", 1, x, batch_size=3)])
        assert outcome.outputs["OUTPUT1"].dtype == np.float16
        np.testing.assert_allclose(outcome.outputs["OUTPUT1"], x["INPUT0"] - x["INPUT1"], rtol=1e-3)
    finally:
        instance.close()


def test_a_request_the_model_cannot_take_is_refused_alone(repo):
    """dims -1 in the config, 16 in the model: a request of width 15 passes the config but not
    the model; it gets INVALID_ARG with the shapes, the rest of its batch runs."""
    add_sub_model(repo, config=ADD_SUB.replace("[ 16 ]", "[ -1 ]", 2))
    (instance,) = instances(spec_of(repo, "add_sub"))
    try:
        bad = InferRequest("add_sub", 1, {n: np.ones((2, 15), np.float32) for n in ("INPUT0", "INPUT1")}, batch_size=2)
        good = InferRequest("add_sub", 1, feeds(1), batch_size=1)
        refused, answered = instance.execute([bad, good])
        assert refused.code.name == "INVALID_ARG"
        assert refused.message == ("input 'INPUT0' of model 'add_sub' has shape [2,15], which the OpenVINO model does "
                                   "not take: it expects [16] after the batch dimension")
        np.testing.assert_allclose(answered.outputs["OUTPUT0"], good.inputs["INPUT0"] + good.inputs["INPUT1"], rtol=1e-6)
    finally:
        instance.close()


class Gated:
    """A real OpenVINO instance that reports each batch it starts and holds it until released."""

    def __init__(self, instance: backend.OpenVINOInstance, started: list) -> None:
        self.inner = instance
        self.name = instance.name
        self.started: list[tuple[str, list[str]]] = started
        self.gate = threading.Semaphore(0)
        self.event = threading.Condition()

    def execute(self, requests):
        with self.event:
            self.started.append((self.name, [r.id for r in requests]))
            self.event.notify_all()
        assert self.gate.acquire(timeout=60), "the test never released this batch"
        return self.inner.execute(requests)


def _wait_for(gated: list[Gated], count: int) -> None:
    condition = gated[0].event
    with condition:
        assert condition.wait_for(lambda: len(gated[0].started) >= count, timeout=WAIT), gated[0].started


def test_gated_batcher_forms_batches_over_real_openvino_instances(repo):
    """Requests a and b take one free instance each, at once; c..f, queued while both are busy,
    run as ONE batch on the first instance to finish; every output equals OpenVINO's own."""
    add_sub_model(repo, config=ADD_SUB + "dynamic_batching { }\ninstance_group [ { count: 2 kind: KIND_CPU } ]\n")
    spec = spec_of(repo, "add_sub")
    started: list = []
    gated = [Gated(i, started) for i in instances(spec, 2)]
    for g in gated[1:]:
        g.event = gated[0].event
    batcher = DynamicBatcher("add_sub", spec.config, gated)
    batcher.start()
    outcomes: dict[str, object] = {}
    done = threading.Event()

    def callback(name):
        def record(outcome):
            outcomes[name] = outcome
            if len(outcomes) == 6:
                done.set()
        return record

    requests = {n: InferRequest("add_sub", 1, feeds(2, seed=i), id=n, batch_size=2) for i, n in enumerate("abcdef")}
    try:
        batcher.submit(requests["a"], callback("a"))
        _wait_for(gated, 1)
        batcher.submit(requests["b"], callback("b"))
        _wait_for(gated, 2)
        assert [batch for _, batch in started] == [["a"], ["b"]] and started[1][0] != started[0][0]
        for name in "cdef":  # both instances busy: these wait together
            batcher.submit(requests[name], callback(name))
        next(g for g in gated if g.name == started[0][0]).gate.release()
        _wait_for(gated, 3)  # the instance that ran a takes everything queued: 4 x 2 = 8 = max_batch_size
        assert started[2] == (started[0][0], ["c", "d", "e", "f"])
        for g in gated:
            g.gate.release(2)
        assert done.wait(WAIT)
    finally:
        for g in gated:
            g.gate.release(10)
        batcher.stop(drain=False, timeout=WAIT)
        for g in gated:
            g.inner.close()
    xml = repo / "add_sub" / "1" / "model.xml"
    for name, request in requests.items():
        expected = ovm.openvino_outputs(xml, request.inputs)
        assert isinstance(outcomes[name], InferResponse), outcomes[name]
        for output in ("OUTPUT0", "OUTPUT1"):
            np.testing.assert_allclose(outcomes[name].outputs[output], expected[output], rtol=1e-6)


def test_concurrent_load_on_two_instances(repo):
    add_sub_model(repo, config=ADD_SUB + "dynamic_batching { }\ninstance_group [ { count: 2 kind: KIND_CPU } ]\n")
    spec = spec_of(repo, "add_sub")
    made = instances(spec, 2)
    batcher = DynamicBatcher("add_sub", spec.config, made)
    batcher.start()
    cases = [InferRequest("add_sub", 1, feeds(1 + i % 4, seed=i), id=str(i), batch_size=1 + i % 4) for i in range(200)]

    async def run():
        return await asyncio.gather(*(batcher.infer(r) for r in cases))

    try:
        for case, response in zip(cases, asyncio.run(run())):
            assert response.id == case.id
            np.testing.assert_allclose(response.outputs["OUTPUT0"], case.inputs["INPUT0"] + case.inputs["INPUT1"], rtol=1e-6)
    finally:
        batcher.stop(drain=True, timeout=WAIT)
        for instance in made:
            instance.close()


# -- image contents ---------------------------------------------------------------------------------


def test_openvino_models_bring_openvino_and_the_accelerator_replaces_onnxruntime():
    openvino_model = {"name": "m", "backend": "openvino"}
    accelerated = {"name": "a", "backend": "onnxruntime", "instance_group": [{"kind": "KIND_CPU"}],
                   "optimization": {"execution_accelerators": {"cpu_execution_accelerator": [{"name": "openvino"}]}}}
    plain = {"name": "p", "backend": "onnxruntime"}
    python = {"name": "py", "backend": "python"}

    def no_deps(*configs, gpu=None):
        keys = runtime_backends(configs, gpu=gpu is not None)
        return runtime_requirements(server=True, aws_lambda=False, runtime_client=False, gpu_cuda=gpu, backends=keys)

    assert no_deps(openvino_model).no_deps == (OPENVINO,)
    assert "openvino/libs/libopenvino_intel_gpu_plugin.so" in no_deps(openvino_model).prune
    assert no_deps(plain).no_deps == (ONNXRUNTIME_CPU,)
    assert no_deps(plain, accelerated, python).no_deps == (ONNXRUNTIME_OPENVINO,)  # never both
    assert set(no_deps(openvino_model, accelerated).no_deps) == {OPENVINO, ONNXRUNTIME_OPENVINO}
    gpu = {**accelerated, "instance_group": [{"kind": "KIND_GPU"}]}
    assert [r.name for r in no_deps(gpu, gpu=12).no_deps] == ["onnxruntime-gpu"]
    with pytest.raises(ValueError, match="onnxruntime-gpu, which has no OpenVINO provider"):
        no_deps(accelerated, gpu=12)


def test_images_whose_openvino_wheels_do_not_exist_are_refused_before_downloading():
    from toolkit.build.runtime_deps import ONNXRUNTIME_OPENVINO_KEY, check_wheels_exist

    check_wheels_exist({"onnxruntime", ONNXRUNTIME_OPENVINO_KEY, "openvino"}, "x86_64", "3.12", (2, 34))
    with pytest.raises(ValueError, match="wheels for x86_64 .* only, not aarch64"):
        check_wheels_exist({ONNXRUNTIME_OPENVINO_KEY}, "aarch64", "3.12", (2, 36))
    with pytest.raises(ValueError, match="not x86_64 with Python 3.14"):
        check_wheels_exist({ONNXRUNTIME_OPENVINO_KEY}, "x86_64", "3.14", (2, 36))
    check_wheels_exist({"openvino"}, "aarch64", "3.12", (2, 36))
    with pytest.raises(ValueError, match="glibc 2.35 or newer only; the base image has glibc 2.34"):
        check_wheels_exist({"openvino"}, "aarch64", "3.12", (2, 34))


# -- toolkit serve, tritonclient, perf_analyzer -------------------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("openvino")
    repo = root / "models"
    add_sub_model(repo, config=ADD_SUB + """
        dynamic_batching { }
        instance_group [ { count: 2 kind: KIND_CPU } ]
        model_warmup [ { name: "zeros" batch_size: 2 inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ]
          zero_data: true } } inputs { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } } } ]
    """)
    ovm.matmul_relu_ir(repo / "relu" / "1" / "model.xml", root / "relu.onnx")  # no config: auto-complete
    add_sub_model(repo, "loose", ADD_SUB.replace("[ 16 ]", "[ -1 ]", 2))
    mb.add_sub(repo / "add_sub_onnx" / "1" / "model.onnx")
    write_config(repo, "add_sub_onnx", 'backend: "openvino"\ndefault_model_filename: "model.onnx"\nmax_batch_size: 4\n')
    with serve(repo, "--device", "cpu") as server:
        yield server, repo, root


def test_tritonclient_outputs_equal_openvino_and_onnxruntime(served):
    server, repo, root = served
    client = httpclient.InferenceServerClient(server.url)
    assert client.is_model_ready("add_sub") and client.is_model_ready("relu")
    metadata = client.get_model_metadata("add_sub")
    assert metadata["platform"] == "openvino" and metadata["versions"] == ["1"]
    x = feeds(3, seed=7)
    inputs = [httpclient.InferInput(n, [3, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for i, name in zip(inputs, ("INPUT0", "INPUT1")):
        i.set_data_from_numpy(x[name], binary_data=True)
    result = client.infer("add_sub", inputs)
    own = ovm.openvino_outputs(repo / "add_sub" / "1" / "model.xml", x)
    for output in ("OUTPUT0", "OUTPUT1"):
        np.testing.assert_allclose(result.as_numpy(output), own[output], rtol=1e-6)
    np.testing.assert_allclose(client.infer("add_sub_onnx", inputs).as_numpy("OUTPUT0"), x["INPUT0"] + x["INPUT1"], rtol=1e-6)

    relu_in = httpclient.InferInput("INPUT0", [5, 16], "FP32")
    data = np.random.default_rng(3).standard_normal((5, 16)).astype(np.float32)
    relu_in.set_data_from_numpy(data)
    served_out = client.infer("relu", [relu_in]).as_numpy("OUTPUT0")
    np.testing.assert_allclose(served_out, ovm.openvino_outputs(repo / "relu" / "1" / "model.xml", {"INPUT0": data})["OUTPUT0"], rtol=1e-6)
    # OpenVINO's CPU plugin computes FP32 models in bfloat16 where the CPU has bf16 instructions
    # (its default inference precision; tritonserver's backend keeps that default too)
    tolerance = 3e-2 if ovm.cpu_inference_precision() == "bf16" else 1e-5
    np.testing.assert_allclose(served_out, ovm.onnxruntime_outputs(root / "relu.onnx", {"INPUT0": data})["OUTPUT0"],
                               rtol=tolerance, atol=tolerance)


def test_bad_requests_get_clear_errors_and_the_server_keeps_serving(served):
    server, _, _ = served
    client = httpclient.InferenceServerClient(server.url)
    wrong = httpclient.InferInput("INPUT0", [2, 15], "FP32")
    wrong.set_data_from_numpy(np.ones((2, 15), np.float32))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("relu", [wrong])  # auto-completed dims [-1,16]: refused before the model
    assert "unexpected shape for input 'INPUT0' for model 'relu'. Expected [-1,16], got [2,15]" in str(caught.value)
    loose = [httpclient.InferInput(n, [2, 15], "FP32") for n in ("INPUT0", "INPUT1")]
    for i in loose:
        i.set_data_from_numpy(np.ones((2, 15), np.float32))
    with pytest.raises(InferenceServerException) as caught:
        client.infer("loose", loose)  # config dims [-1]: the model's own shape refuses it
    assert "OpenVINO model does not take" in str(caught.value) and caught.value.status() == "400"
    too_big = [httpclient.InferInput(n, [9, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    for i in too_big:
        i.set_data_from_numpy(np.ones((9, 16), np.float32))
    with pytest.raises(InferenceServerException, match="batch-size must be <= 8 for .add_sub."):
        client.infer("add_sub", too_big)
    assert client.is_server_ready() and client.is_model_ready("relu")


def test_perf_analyzer_drives_the_openvino_model(served):
    server, _, _ = served

    def stats():
        with urllib.request.urlopen(f"{server.http}/v2/models/add_sub/stats") as r:
            return json.load(r)["model_stats"][0]

    before = stats()
    out = subprocess.run(
        [perf_analyzer(), "-u", server.url, "-m", "add_sub", "--concurrency-range", "4", "--measurement-interval", "500",
         "--stability-percentage", "999", "--max-trials", "6"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    after = stats()
    measured = [int(n) for n in re.findall(r"Client: \n\s+Request count: (\d+)", out.stdout)]
    served_count = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    assert measured and served_count >= sum(measured) > 0
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"]
    assert after["execution_count"] - before["execution_count"] <= served_count


def test_dockerfile_leaves_the_pruned_files_out_and_passes_hadolint(tmp_path):
    from test_build_context import HADOLINT

    from toolkit.build.base_image import known_base_image
    from toolkit.build.context import ImagePlan, render_dockerfile
    from toolkit.build.targets import OPT_LAYOUT, TARGETS
    from toolkit.build.wheelhouse import Wheel, Wheelhouse

    keys = runtime_backends([{"name": "m", "backend": "openvino"}, {"name": "a", "backend": "onnxruntime", "optimization": {
        "execution_accelerators": {"cpu_execution_accelerator": [{"name": "openvino"}]}}}])
    runtime = runtime_requirements(server=True, aws_lambda=False, runtime_client=False, gpu_cuda=None, backends=keys)
    base = known_base_image("python:3.12-slim-bookworm", "x86_64")
    plan = ImagePlan(TARGETS["cloudrun"], base, "cpu", OPT_LAYOUT, runtime, "m")
    pip = Wheel("pip-25.0-py3-none-any.whl", "pip", "25.0", "0" * 64, 1)
    dockerfile = render_dockerfile(plan, Wheelhouse(tmp_path, [], pip, "key"), {"a": "b"}, None)
    line = next(line for line in dockerfile.splitlines() if "rm -rf" in line)
    assert line.strip().startswith(f"rm -rf {OPT_LAYOUT.deps_dir}/")
    deps = OPT_LAYOUT.deps_dir
    assert f"{deps}/openvino/libs/libopenvino_intel_gpu_plugin.so" in line
    assert f"{deps}/onnxruntime/capi/libopenvino.so.2025.4.1" in line
    assert "libopenvino.so.2641" not in line and "libopenvino_intel_cpu_plugin.so" not in line
    path = tmp_path / "Dockerfile"
    path.write_text(dockerfile)
    result = subprocess.run([HADOLINT, "--no-color", str(path)], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr + dockerfile
