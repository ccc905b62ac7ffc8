"""The python backend with real model processes and a real ModelRepository: Triton python-backend
model.py files (tests/python_models) executed through the runtime's batchers, BLS against Python
and ONNX models, errors with Triton's messages and codes, both instance modes."""

from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import model_builders as mb
import numpy as np
import pytest
from python_models.repository import FIXTURES, close, load, python_model

from handlers.backends.python import PythonModelLoadError, new_instance as create_instance
from handlers.backends.python.inprocess_instance import InProcessInstance
from handlers.backends.python.process_instance import ProcessInstance
from handlers.errors import ErrorCode, InferenceError
from handlers.inference import InferRequest, RequestedOutput

MODE = "TOOLKIT_PYTHON_INSTANCE_MODE"


def _line(fixture: str, text: str) -> int:
    """The line of a fixture model.py that contains `text` (1-based)."""
    lines = (FIXTURES / fixture).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def _mode(mode: str) -> str:
    return f'parameters {{ key: "{MODE}" value: {{ string_value: "{mode}" }} }}'


ADD_SUB = """
    backend: "python"
    max_batch_size: 8
    input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }}, {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }} ]
    output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }}, {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }} ]
    {extra}
"""
BLS_SYNC = """
    backend: "python"
    max_batch_size: 0
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1, 4 ] },
            { name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]
"""
ENSEMBLE = """
platform: "ensemble"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [ { model_name: "add_sub_onnx" model_version: -1
  input_map { key: "INPUT0" value: "INPUT0" } input_map { key: "INPUT1" value: "INPUT1" }
  output_map { key: "OUTPUT0" value: "OUTPUT0" } output_map { key: "OUTPUT1" value: "OUTPUT1" } } ] }
"""
PROBE = """
    backend: "python"
    max_batch_size: 8
    input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 2 ] }} ]
    output [ {{ name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] }}, {{ name: "ECHO" data_type: TYPE_INT32 dims: [ 2 ] }},
             {{ name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }} ]
    dynamic_batching {{ preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 5000000 }}
    {extra}
"""
ERRORS = """
    backend: "python"
    max_batch_size: 0
    input [ {{ name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    {extra}
"""
CHAIN = """
    backend: "python"
    max_batch_size: 0
    input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    parameters [ {{ key: "NEXT" value: {{ string_value: "{next}" }} }}, {{ key: "{mode_key}" value: {{ string_value: "{mode}" }} }} ]
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("python_backend") / "models"
    python_model(repo, "add_sub", "add_sub.py", ADD_SUB.format(extra="instance_group [ { count: 2 kind: KIND_CPU } ]"))
    mb.add_sub(repo / "add_sub_onnx" / "1" / "model.onnx", dims=("N", 4))
    (repo / "add_sub_ensemble" / "1").mkdir(parents=True)
    (repo / "add_sub_ensemble" / "config.pbtxt").write_text(ENSEMBLE)
    python_model(repo, "bls_sync", "bls_sync.py", BLS_SYNC)  # one instance: in-process (auto)
    python_model(repo, "bls_sync_process", "bls_sync.py", BLS_SYNC + _mode("process"))
    python_model(repo, "bls_async", "bls_async.py", ADD_SUB.format(extra=_mode("process")))
    python_model(repo, "probe", "batch_probe.py", PROBE.format(extra=_mode("process")))
    python_model(repo, "probe_inprocess", "batch_probe.py", PROBE.format(extra=""))
    python_model(repo, "errors", "errors.py", ERRORS.format(extra=_mode("process")))
    python_model(repo, "errors_inprocess", "errors.py", ERRORS.format(extra=""))
    for name, following, mode in (("chain_a", "chain_b", "process"), ("chain_b", "chain_c", "process"), ("chain_c", "", "inprocess")):
        python_model(repo, name, "chain.py", CHAIN.format(next=following, mode_key=MODE, mode=mode))
    repository = load(repo)
    failed = {name: m.reason for name, by in repository.models.items() for m in by.values() if not m.ready}
    assert not failed
    yield repository
    close(repository)


def infer(repository, model: str, inputs: dict, outputs: list[str] | None = None, **fields) -> object:
    request = InferRequest(model, 1, inputs, [RequestedOutput(n) for n in outputs] if outputs else None, **fields)
    from handlers.protocol.validation import validate_request

    loaded = repository.get(model)
    validate_request(loaded.spec.config, request)
    return loaded.infer_sync(request, timeout=60)


def _rows(first: int) -> np.ndarray:
    """A probe input of 4 rows: the probe's preferred batch size, so it runs without waiting for
    the 5 s queue delay (test_execute_receives_the_batch_the_batcher_formed needs that delay)."""
    rows = np.zeros((4, 2), np.int32)
    rows[0, 0] = first
    return rows


def _instances(repository, model: str) -> list:
    return repository.get(model).instances


# --- execution ---------------------------------------------------------------------------------------


def test_add_sub_runs_in_two_model_processes(repository):
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.ones((2, 4), np.float32)
    response = infer(repository, "add_sub", {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(response.outputs["OUTPUT0"], a + b)
    np.testing.assert_array_equal(response.outputs["OUTPUT1"], a - b)
    instances = _instances(repository, "add_sub")
    assert [type(i) for i in instances] == [ProcessInstance, ProcessInstance]
    pids = {i.pid for i in instances}
    assert len(pids) == 2 and os.getpid() not in pids


def test_auto_mode_runs_single_instances_in_process(repository):
    assert isinstance(_instances(repository, "bls_sync")[0], InProcessInstance)
    assert isinstance(_instances(repository, "probe_inprocess")[0], InProcessInstance)
    assert isinstance(_instances(repository, "bls_sync_process")[0], ProcessInstance)


@pytest.mark.parametrize("model", ["probe", "probe_inprocess"])
def test_initialize_receives_tritons_args(repository, model):
    response = infer(repository, model, {"INPUT0": _rows(-1)})
    info = json.loads(response.outputs["INFO"][0][0])
    loaded = repository.get(model)
    args = info["args"]
    assert set(args) == {
        "model_config", "model_instance_kind", "model_instance_name", "model_instance_device_id",
        "model_repository", "model_version", "model_name",
    }
    assert json.loads(args["model_config"]) == loaded.spec.config
    assert args["model_instance_kind"] == "CPU" and args["model_instance_device_id"] == "0"
    assert args["model_instance_name"] == loaded.instances[0].name
    assert args["model_repository"] == str(loaded.spec.directory) and args["model_version"] == "1"
    assert args["model_name"] == model
    assert info["model_dir"] == str(loaded.spec.directory / "1")  # pb_utils.get_model_dir()
    assert (info["pid"] == os.getpid()) == (model == "probe_inprocess")


@pytest.mark.parametrize("model", ["probe", "probe_inprocess"])
def test_execute_receives_the_batch_the_batcher_formed(repository, model):
    scheduler = repository.get(model).scheduler
    done = threading.Event()
    outcomes = []

    def finished(outcome):
        outcomes.append(outcome)
        if len(outcomes) == 4:
            done.set()

    for i in range(4):  # preferred_batch_size 4 and a 5 s queue delay: the four run as one batch
        scheduler.submit(InferRequest(model, 1, {"INPUT0": np.array([[i, i]], np.int32)}, batch_size=1), finished)
    assert done.wait(60)
    assert sorted(int(o.outputs["ECHO"][0][0]) for o in outcomes) == [0, 2, 4, 6]
    assert [int(o.outputs["BATCH"][0][0]) for o in outcomes] == [4, 4, 4, 4]


@pytest.mark.parametrize("model", ["probe", "probe_inprocess"])
def test_request_fields_reach_the_model(repository, model):
    response = infer(
        repository,
        model,
        {"INPUT0": np.frombuffer(_rows(3).tobytes(), np.int32).reshape(4, 2)},  # read-only
        ["INFO", "BATCH"],
        id="req-7",
        correlation_id="seq-9",
        flags=1,
        timeout_us=5_000_000,
        parameters={"custom": "x", "n": 3, "b": False, "timeout": 5_000_000, "sequence_id": "seq-9", "binary_data_output": True},
    )
    assert set(response.outputs) == {"INFO", "BATCH"}  # pruned to the requested outputs
    info = json.loads(response.outputs["INFO"][0][0])
    assert info["request_id"] == "req-7" and info["correlation_id"] == "seq-9"
    assert info["flags"] == 1 and info["timeout"] == 5_000_000
    assert info["parameters"] == '{"custom":"x","n":3,"b":false}'  # the frontend's own keys hidden
    assert info["requested"] == ["BATCH", "INFO"]
    assert info["writeable"] is True  # a read-only request buffer still reaches the model writable


def test_all_outputs_when_the_request_names_none(repository):
    response = infer(repository, "probe", {"INPUT0": _rows(1)})
    assert set(response.outputs) == {"BATCH", "ECHO", "INFO"}
    assert json.loads(response.outputs["INFO"][0][0])["requested"] == ["BATCH", "ECHO", "INFO"]


# --- errors --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["errors", "errors_inprocess"])
@pytest.mark.parametrize(
    "mode, code, message",
    [
        (1, ErrorCode.INVALID_ARG, "error with code INVALID_ARG"),
        (2, ErrorCode.NOT_FOUND, "error with code NOT_FOUND"),
        (3, ErrorCode.UNAVAILABLE, "error with code UNAVAILABLE"),
        (4, ErrorCode.UNSUPPORTED, "error with code UNSUPPORTED"),
        (5, ErrorCode.INTERNAL, "error with code INTERNAL"),
        (6, ErrorCode.INTERNAL, "default code"),
    ],
)
def test_response_errors_keep_their_code(repository, model, mode, code, message):
    with pytest.raises(InferenceError) as info:
        infer(repository, model, {"MODE": np.array([mode], np.int32)})
    assert info.value.code is code and info.value.message == message


@pytest.mark.parametrize("model", ["errors", "errors_inprocess"])
def test_execute_failures_fail_the_batch_with_tritons_messages(repository, model):
    instance = _instances(repository, model)[0].name
    source = repository.get(model).spec.model_files[1]
    with pytest.raises(InferenceError) as raised:
        infer(repository, model, {"MODE": np.array([10], np.int32)})
    assert raised.value.code is ErrorCode.INTERNAL
    assert raised.value.message == (
        f"Failed to process the request(s) for model '{instance}', message: ValueError: mode 10 makes execute raise"
        f"\n\nAt:\n  {source}({_line('errors.py', 'mode 10 makes')}): execute\n"
    )
    with pytest.raises(InferenceError) as raised:
        infer(repository, model, {"MODE": np.array([11], np.int32)})
    assert raised.value.message.startswith(
        f"Failed to process the request(s) for model '{instance}', message: TritonModelException: mode 11 raises"
    )
    with pytest.raises(InferenceError) as raised:
        infer(repository, model, {"MODE": np.array([12], np.int32)})
    assert raised.value.message == (
        f"Failed to process the request(s) for model '{instance}', message: Number of InferenceResponse objects "
        "do not match the number of InferenceRequest objects. InferenceRequest(s) size is:1, and "
        "InferenceResponse(s) size is:0\n"
    )
    assert infer(repository, model, {"MODE": np.array([0], np.int32)}).outputs["OUT"].tolist() == [0]


def test_a_dead_model_process_fails_its_batch_and_is_restarted(repository):
    instance = _instances(repository, "errors")[0]
    first_pid = instance.pid
    with pytest.raises(InferenceError) as raised:
        infer(repository, "errors", {"MODE": np.array([13], np.int32)})  # os._exit in execute
    assert raised.value.code is ErrorCode.INTERNAL
    assert raised.value.message == f"Stub process '{instance.name}' is not healthy."
    assert infer(repository, "errors", {"MODE": np.array([0], np.int32)}).outputs["OUT"].tolist() == [0]
    assert instance.pid != first_pid


# --- BLS ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("caller", ["bls_sync", "bls_sync_process"])
@pytest.mark.parametrize("target", ["add_sub", "add_sub_onnx", "add_sub_ensemble"])
def test_bls_sync_calls_python_onnx_and_ensemble_models(repository, caller, target):
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    b = np.full((1, 4), 0.5, np.float32)
    name = np.array([target.encode()], dtype=object)
    response = infer(repository, caller, {"INPUT0": a, "INPUT1": b, "MODEL_NAME": name})
    np.testing.assert_array_equal(response.outputs["OUTPUT0"], a + b)
    np.testing.assert_array_equal(response.outputs["OUTPUT1"], a - b)


@pytest.mark.parametrize("caller", ["bls_sync", "bls_sync_process"])
def test_bls_errors_come_back_in_the_response_with_tritons_wording(repository, caller):
    a = np.zeros((1, 4), np.float32)
    with pytest.raises(InferenceError) as raised:
        infer(repository, caller, {"INPUT0": a, "INPUT1": a, "MODEL_NAME": np.array([b"nope"], dtype=object)})
    assert "message: TritonModelException: Model nope - Error when running inference: Failed for execute the " \
           "inference request. Model 'nope' is not ready." in raised.value.message
    # the called model's own validation, as a client request would get it
    with pytest.raises(InferenceError) as raised:
        infer(repository, caller, {"INPUT0": a, "INPUT1": a, "MODEL_NAME": np.array([b"errors"], dtype=object)})
    assert "Model errors - Error when running inference: unexpected inference output 'OUTPUT0' for model 'errors'" in raised.value.message


def test_bls_async_gathers_two_models(repository):
    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    b = np.ones((2, 4), np.float32)
    response = infer(repository, "bls_async", {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(response.outputs["OUTPUT0"], a + b)  # from the ONNX model
    np.testing.assert_array_equal(response.outputs["OUTPUT1"], a - b)  # from the Python model


def test_nested_bls_chain_with_busy_single_instances_does_not_deadlock(repository):
    results: list = []
    errors: list = []

    def call(i: int) -> None:
        try:
            results.append(int(infer(repository, "chain_a", {"X": np.array([i], np.int32)}).outputs["Y"][0]))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and not any(t.is_alive() for t in threads)
    assert sorted(results) == [3, 4, 5, 6, 7, 8]  # three +1 steps: a (process) -> b (process) -> c (in-process)


# --- metrics and logs -----------------------------------------------------------------------------------------


def test_custom_metrics_reach_the_runtime_registry(repository):
    from handlers import exposition

    infer(repository, "probe", {"INPUT0": _rows(1)})
    infer(repository, "probe", {"INPUT0": _rows(1)})
    text = exposition.text().decode()
    counts = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line.startswith("probe_")}
    assert counts['probe_requests{model="probe"}'] >= 2
    assert counts['probe_requests{model="probe_inprocess"}'] >= 1
    assert counts["probe_batch_size_count"] >= 3 and counts['probe_batch_size_bucket{le="+Inf"}'] == counts["probe_batch_size_count"]


def test_model_logs_reach_the_serving_process_log_with_the_model_location(repository, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="handlers.python_model")
    spec = repository.get("probe").spec
    instance = ProcessInstance(spec, 1, "probe_logger")
    try:
        records = [r for r in caplog.records if r.getMessage() == "probe initialized as probe_logger"]
        assert records and records[0].pathname == str(spec.model_files[1]) and records[0].lineno == _line("batch_probe.py", "Logger.log_info")
        assert records[0].levelname == "INFO"
    finally:
        instance.close()


# --- lifecycle -------------------------------------------------------------------------------------------------


LIFECYCLE = """
    backend: "python"
    max_batch_size: 0
    input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    output [ {{ name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }}, {{ name: "TEXT" data_type: TYPE_STRING dims: [ 2 ] }} ]
    parameters [ {{ key: "MARKER" value: {{ string_value: "{marker}" }} }}, {{ key: "{mode_key}" value: {{ string_value: "{mode}" }} }} ]
"""


@pytest.mark.parametrize("mode", ["process", "inprocess"])
def test_lifecycle_readiness_sender_and_bls_rules(tmp_path, mode):
    repo = tmp_path / "models"
    marker = tmp_path / "marker.txt"
    python_model(repo, "lifecycle", "lifecycle.py", LIFECYCLE.format(marker=marker, mode_key=MODE, mode=mode))
    python_model(repo, "add_sub", "add_sub.py", ADD_SUB.format(extra=""))
    repository = load(repo)
    try:
        assert repository.get("lifecycle").ready, repository.get("lifecycle").reason
        instance = repository.get("lifecycle").instances[0]
        assert isinstance(instance, ProcessInstance if mode == "process" else InProcessInstance)
        assert instance.is_ready() is False  # the model's own is_ready()
        Path(str(marker) + ".ready").touch()
        assert instance.is_ready() is True
        response = infer(repository, "lifecycle", {"IN": np.array([1], np.int32)})
        info = json.loads(response.outputs["INFO"][0])
        assert info["bls_in_initialize"] == "BLS is only supported during the 'execute' function."
        assert info["ready"] == {"add_sub": True, "add_sub/1": True, "add_sub/7": False, "nope": False}
        assert response.outputs["TEXT"].tolist() == ["héllo".encode(), b"7"]  # str elements become UTF-8 bytes
    finally:
        close(repository)
    lines = marker.read_text().splitlines()
    assert lines[0].startswith("initialize lifecycle_0 ")  # Triton names instances <group>_<i> and lines[-1] == "finalize"


def _compiled_spec(tmp_path: Path, name: str, source: str, extra: str = ""):
    from handlers.manifest import Manifest
    from toolkit.repository.compile import compile_repository

    repo = tmp_path / "models"
    python_model(repo, name, None, ERRORS.format(extra=extra), source=source)
    result = compile_repository(repo)
    assert result.ok, {k: str(v) for k, v in result.failures.items()}
    return Manifest.from_dict(result.manifest(), root=result.root).models[name]


@pytest.mark.parametrize(
    "source, process_message",
    [
        (
            "class TritonPythonModel:\n    def initialize(self, args):\n        raise RuntimeError('init failed here')\n",
            "RuntimeError: init failed here\n\nAt:\n  {file}(3): initialize\n",
        ),
        ("X = 1\n", "AttributeError: module '1.model' has no attribute 'TritonPythonModel'"),
        ("class TritonPythonModel:\n    def execute(self, requests)\n        return []\n", "SyntaxError: expected ':' (model.py, line 2)"),
    ],
    ids=["initialize-raises", "no-class", "syntax-error"],
)
def test_load_failures_carry_tritons_message(tmp_path, source, process_message):
    # compiled from a valid model.py (`toolkit validate` refuses the broken sources), then broken
    spec = _compiled_spec(tmp_path, "broken", "class TritonPythonModel:\n    pass\n", _mode("process"))
    spec.model_files[1].write_text(source)
    with pytest.raises(PythonModelLoadError) as raised:
        create_instance(spec, 1, "broken_0")
    assert raised.value.args[0].startswith(process_message.format(file=spec.model_files[1]))


def test_bad_instance_modes_are_refused(tmp_path):
    spec = _compiled_spec(tmp_path, "plain", "class TritonPythonModel:\n    pass\n")
    config = dict(spec.config, parameters={MODE: {"string_value": "threads"}})
    bad = type(spec)(spec.name, spec.directory, spec.versions, spec.model_files, config)
    with pytest.raises(PythonModelLoadError, match="must be 'auto', 'process' or 'inprocess', got 'threads'"):
        create_instance(bad, 1, "plain_0")


def test_in_process_models_with_clashing_helper_modules_get_processes(tmp_path):
    repo = tmp_path / "models"
    for name, helpers in (("first", "helpers_a"), ("second", "helpers_b")):
        model_py = python_model(repo, name, "helpers_model.py", """
            backend: "python"
            max_batch_size: 0
            input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
            output [ { name: "WHO" data_type: TYPE_STRING dims: [ 3 ] } ]
        """)
        shutil.copy(FIXTURES / helpers / "helpers.py", model_py.parent / "helpers.py")
    repository = load(repo)
    try:
        kinds = sorted(type(repository.get(n).instances[0]).__name__ for n in ("first", "second"))
        # both define `helpers`: one process holds one sys.modules, so one of them gets a process
        assert kinds == ["InProcessInstance", "ProcessInstance"]
        for name, who in (("first", b"a"), ("second", b"b")):
            out = infer(repository, name, {"IN": np.array([0], np.int32)}).outputs["WHO"].tolist()
            assert out[:2] == [who, who]
            if isinstance(repository.get(name).instances[0], ProcessInstance):
                assert out[2] == b"1.model"  # Triton's module name for model.py
    finally:
        close(repository)
