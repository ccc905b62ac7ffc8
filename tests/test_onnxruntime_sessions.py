"""ONNX Runtime sessions per instance: CPU instances of one intra-op thread, and on AWS Lambda's
serial plan all CPU-provider instances, share their version's session
(handlers/backends/onnxruntime.py), every other instance has its own, as in Triton; and
the registry the shared sessions (and the pytorch backend's shared modules) are kept in
(handlers/backends/sharing.py)."""

from __future__ import annotations

import gc
import re
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import onnx
import pytest

from handlers.backends import onnxruntime as backend
from handlers.backends.sharing import Shared
from handlers.inference import InferRequest
from handlers.instance_group import InstanceSlot
from handlers.manifest import Manifest, ModelSpec
from model_builders import matmul_relu
from serving import serve
from toolkit.repository.compile import compile_repository

CONFIG = """
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
dynamic_batching { }
"""
CPU = ["CPUExecutionProvider"]


def _params(**values: str) -> dict:
    return {"parameters": {k: {"string_value": v} for k, v in values.items()}}


def make_repo(root: Path, config: str = CONFIG, versions: tuple[int, ...] = (1,)) -> Path:
    for version in versions:
        matmul_relu(root / "m" / str(version) / "model.onnx", seed=version)
    (root / "m" / "config.pbtxt").write_text(config)
    return root


def spec_of(repo: Path) -> ModelSpec:
    result = compile_repository(repo, device="cpu")
    assert result.ok, result.failure_lines()
    return Manifest.from_dict(result.manifest(), repo).models["m"]


def instances(spec: ModelSpec, threads: int | None, version: int = 1, count: int = 2, serial: bool = False) -> list:
    return [backend.create_instance(spec, version, InstanceSlot(f"m_0_{i}", "KIND_CPU", 0, threads, serial))
            for i in range(count)]


def weights(path: Path) -> np.ndarray:
    return onnx.numpy_helper.to_array(onnx.load(path).graph.initializer[0])


# -- the registry ------------------------------------------------------------------------------------


class _Made:
    """A shared object (weak references allowed)."""


def test_the_first_caller_makes_the_object_while_the_others_wait_and_get_it():
    shared = Shared()
    calls = []
    release = threading.Event()

    def make():
        calls.append(threading.current_thread().name)
        release.wait(5)  # the other callers arrive while this one makes it
        return _Made()

    got: dict[str, tuple] = {}
    threads = [threading.Thread(target=lambda n=n: got.__setitem__(n, shared.get("k", make)), name=f"t{n}") for n in range(4)]
    for thread in threads:
        thread.start()
    while not calls:
        time.sleep(0.01)
    time.sleep(0.2)  # the others reach the key meanwhile (those that come later find the object: the same result)
    release.set()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    objects = {id(obj) for obj, _ in got.values()}
    assert len(objects) == 1
    assert sorted(reused for _, reused in got.values()) == [False, True, True, True]


def test_a_failed_make_is_its_callers_error_and_the_next_caller_tries_again():
    shared = Shared()
    attempts = []

    def failing():
        attempts.append(1)
        raise RuntimeError("cannot load")

    for _ in range(2):
        with pytest.raises(RuntimeError, match="cannot load"):
            shared.get("k", failing)
    assert len(attempts) == 2 and "k" not in shared
    obj, reused = shared.get("k", _Made)
    assert isinstance(obj, _Made) and not reused


def test_the_object_lives_while_it_is_held_and_a_new_one_is_made_after():
    shared = Shared()
    first, _ = shared.get("k", _Made)
    again, reused = shared.get("k", _Made)
    assert again is first and reused
    gone = weakref.ref(first)
    del first, again
    gc.collect()
    assert gone() is None and "k" not in shared
    third, reused = shared.get("k", _Made)
    assert not reused


# -- the rule --------------------------------------------------------------------------------------


def test_only_cpu_instances_of_one_intra_op_thread_share(monkeypatch):
    monkeypatch.delenv(backend.SHARED_SESSION_ENV, raising=False)
    assert backend.shares_session({}, "KIND_CPU", CPU, 1)  # the CPU budget's one thread
    assert backend.shares_session(_params(intra_op_thread_count="1"), "KIND_CPU", CPU, None)  # the config's
    assert backend.shares_session(_params(intra_op_thread_count="1"), "KIND_CPU", CPU, 4)  # explicit wins
    assert not backend.shares_session({}, "KIND_CPU", CPU, 2)  # two runs would contend for one pool
    assert not backend.shares_session(_params(intra_op_thread_count="2"), "KIND_CPU", CPU, 1)
    assert not backend.shares_session(_params(intra_op_thread_count="0"), "KIND_CPU", CPU, 1)  # ORT's default: every core
    assert not backend.shares_session({}, "KIND_CPU", CPU, None)  # no plan: ORT's default
    assert not backend.shares_session(_params(execution_mode="1"), "KIND_CPU", CPU, 1)  # parallel: an inter-op pool
    assert not backend.shares_session({}, "KIND_GPU", [("CUDAExecutionProvider", {"device_id": 0}), *CPU], 1)
    assert not backend.shares_session({}, "KIND_CPU", [("OpenVINOExecutionProvider", {"device_type": "CPU"}), *CPU], 1)
    monkeypatch.setenv(backend.SHARED_SESSION_ENV, "0")
    assert not backend.shares_session({}, "KIND_CPU", CPU, 1)  # a session per instance, as Triton
    assert not backend.shares_session({}, "KIND_CPU", CPU, 2, serial=True)


def test_on_a_serial_plan_every_cpu_provider_instance_shares(monkeypatch):
    """AWS Lambda serves one request at a time: a version's instances never run together, so they
    share one session whatever their threads; accelerators and GPU instances still do not."""
    monkeypatch.delenv(backend.SHARED_SESSION_ENV, raising=False)
    assert backend.shares_session({}, "KIND_CPU", CPU, 2, serial=True)  # Lambda's 2 vCPUs for each instance
    assert backend.shares_session(_params(intra_op_thread_count="4"), "KIND_CPU", CPU, 2, serial=True)
    assert backend.shares_session(_params(execution_mode="1"), "KIND_CPU", CPU, 2, serial=True)
    assert backend.shares_session({}, "KIND_CPU", CPU, None, serial=True)
    assert not backend.shares_session({}, "KIND_CPU", [("OpenVINOExecutionProvider", {"device_type": "CPU"}), *CPU], 2,
                                      serial=True)
    assert not backend.shares_session({}, "KIND_GPU", [("CUDAExecutionProvider", {"device_id": 0}), *CPU], 1, serial=True)


# -- instances ---------------------------------------------------------------------------------------


def test_a_versions_one_thread_instances_share_one_session_which_lives_as_long_as_they_do(tmp_path, monkeypatch):
    monkeypatch.delenv(backend.SHARED_SESSION_ENV, raising=False)
    spec = spec_of(make_repo(tmp_path, CONFIG + "version_policy: { all { } }\n", versions=(1, 2)))
    first, second = instances(spec, threads=1)
    assert first.shared and second.shared and first.session is second.session
    assert first.intra_op_threads == 1
    other_version = instances(spec, threads=1, version=2, count=1)[0]
    assert other_version.session is not first.session  # each version has its own
    budget_two = instances(spec, threads=2)
    assert not budget_two[0].shared and budget_two[0].session is not budget_two[1].session
    assert budget_two[0].intra_op_threads == 2

    session = weakref.ref(first.session)
    del first
    gc.collect()
    assert session() is second.session  # still held by the other instance
    del second
    gc.collect()
    assert session() is None  # the last one gone: the session is freed
    again = instances(spec, threads=1, count=1)[0]
    assert again.shared and again.session is not None


def test_on_a_serial_plan_instances_of_several_threads_share_one_session(tmp_path, monkeypatch):
    monkeypatch.delenv(backend.SHARED_SESSION_ENV, raising=False)
    spec = spec_of(make_repo(tmp_path))
    first, second = instances(spec, threads=2, serial=True)
    assert first.shared and second.shared and first.session is second.session
    assert first.intra_op_threads == 2  # the session keeps the plan's threads
    rows = np.random.default_rng(3).standard_normal((3, 16)).astype(np.float32)
    w = weights(tmp_path / "m" / "1" / "model.onnx")
    for instance in (first, second):
        outcome = instance.execute([InferRequest("m", 1, {"INPUT0": rows}, id="r", batch_size=3)])[0]
        np.testing.assert_allclose(outcome.outputs["OUTPUT0"], np.maximum(rows @ w, 0), rtol=1e-5, atol=1e-5)


def test_the_lambda_handler_loads_one_session_for_a_versions_instances(tmp_path, monkeypatch):
    """The Lambda entry point's repository plans serially: with 2 CPUs each instance gets both
    (a 2-vCPU function), and the two still share one session."""
    from handlers.entrypoints.lambda_handler import LambdaHandler

    monkeypatch.delenv(backend.SHARED_SESSION_ENV, raising=False)
    monkeypatch.setenv("TOOLKIT_CPUS", "2")
    repo = make_repo(tmp_path)
    result = compile_repository(repo, device="cpu")
    assert result.ok, result.failure_lines()
    handler = LambdaHandler.from_manifest(Manifest.from_dict(result.manifest(), repo))
    try:
        first, second = handler.repository.models["m"][1].instances
        assert handler.repository.cpu_plan.serial and handler.repository.cpu_plan.cpus.cpus == 2
        assert first.intra_op_threads == second.intra_op_threads == 2
        assert first.shared and first.session is second.session
    finally:
        handler.repository.stop(drain=False)


def test_turned_off_every_instance_has_its_own_session(tmp_path, monkeypatch):
    monkeypatch.setenv(backend.SHARED_SESSION_ENV, "0")
    first, second = instances(spec_of(make_repo(tmp_path)), threads=1)
    assert not first.shared and first.session is not second.session
    assert first.intra_op_threads == second.intra_op_threads == 1


def test_instances_on_the_shared_session_run_at_once_and_each_gets_its_own_results(tmp_path, monkeypatch):
    """Two instance threads run batches on the one session at the same time, for 2 s; every
    request's rows come back as relu(rows @ W) of its own rows."""
    monkeypatch.delenv(backend.SHARED_SESSION_ENV, raising=False)
    repo = make_repo(tmp_path)
    w = weights(repo / "m" / "1" / "model.onnx")
    pair = instances(spec_of(repo), threads=1)
    assert pair[0].session is pair[1].session
    errors: list[str] = []
    done = [0, 0]
    start = threading.Barrier(2)

    def work(index: int) -> None:
        rng = np.random.default_rng(index)
        start.wait()
        deadline = threading.Event()
        timer = threading.Timer(2.0, deadline.set)
        timer.start()
        try:
            while not deadline.is_set():
                sizes = rng.integers(1, 5, size=int(rng.integers(1, 4)))
                requests = [InferRequest("m", 1, {"INPUT0": rng.standard_normal((int(n), 16)).astype(np.float32)},
                                         id=f"{index}-{k}", batch_size=int(n)) for k, n in enumerate(sizes)]
                outcomes = pair[index].execute(requests)
                for request, outcome in zip(requests, outcomes):
                    expected = np.maximum(request.inputs["INPUT0"] @ w, 0)
                    got = outcome.outputs["OUTPUT0"]
                    if not np.allclose(got, expected, rtol=1e-5, atol=1e-5):
                        errors.append(f"instance {index} request {request.id}: wrong rows")
                done[index] += 1
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(f"instance {index}: {exc!r}")
        finally:
            timer.cancel()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:5]
    assert min(done) > 10, done


def test_a_model_that_fails_to_load_fails_each_sharing_instance_with_its_reason(tmp_path, monkeypatch):
    monkeypatch.delenv(backend.SHARED_SESSION_ENV, raising=False)
    spec = spec_of(make_repo(tmp_path))
    (tmp_path / "m" / "1" / "model.onnx").write_bytes(b"not an onnx file")  # damaged after the compile
    for slot in range(2):
        with pytest.raises(backend.ModelLoadError, match=r"failed to load model 'm' version 1: .*"):
            backend.create_instance(spec, 1, InstanceSlot(f"m_0_{slot}", "KIND_CPU", 0, 1))


# -- a real server --------------------------------------------------------------------------------------


@pytest.mark.parametrize("shared", ["1", "0"])
def test_toolkit_serve_shares_the_session_where_the_budget_gives_one_thread(tmp_path, shared):
    """2 CPUs (TOOLKIT_CPUS) for 2 instances: one thread each, so they share one session (the log
    says so), unless TOOLKIT_ORT_SHARED_SESSION=0; concurrent requests are answered right either way."""
    import tritonclient.http as httpclient

    repo = make_repo(tmp_path / "repo")
    w = weights(repo / "m" / "1" / "model.onnx")
    env = {"TOOLKIT_CPUS": "2", backend.SHARED_SESSION_ENV: shared}
    with serve(repo, "--device", "cpu", "--log-level", "info", env=env) as server:
        client = httpclient.InferenceServerClient(server.url, concurrency=8)
        rng = np.random.default_rng(1)
        sent = []
        for _ in range(6):
            rows = rng.standard_normal((2, 16)).astype(np.float32)
            inputs = [httpclient.InferInput("INPUT0", [2, 16], "FP32")]
            inputs[0].set_data_from_numpy(rows)
            sent.append((rows, client.async_infer("m", inputs)))
        for rows, pending in sent:
            np.testing.assert_allclose(pending.get_result().as_numpy("OUTPUT0"), np.maximum(rows @ w, 0), rtol=1e-5, atol=1e-5)
        log = server.output()
    lines = re.findall(r"model 'm' version 1 instance (m_0_\d): ONNX Runtime intra-op threads 1, inter-op \d+ "
                       r"\(CPU budget\)(, the version's shared session)?", log)
    assert sorted(name for name, _ in lines) == ["m_0_0", "m_0_1"], log
    assert all(bool(note) == (shared == "1") for _, note in lines), lines
    assert "m: 2 instances x 1 thread (budget)" in log
