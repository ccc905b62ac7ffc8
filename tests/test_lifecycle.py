"""Process lifecycle of `toolkit serve`: readiness gated by load + warmup, SIGTERM drain, and
what happens when a model fails to load (fail fast by default, or keep serving the others)."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

import model_builders as mb
from conftest import write_config
from serving import serve

SIZE = 1024


def _status(url: str, method: str = "GET", body: bytes | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except urllib.error.URLError:
        return 0, b""  # not listening (yet)


@pytest.fixture(scope="module")
def slow_repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("lifecycle") / "models"
    mb.slow_chain(repo / "slow" / "1" / "model.onnx", SIZE, 32, batch=256)
    # no batching: every request runs alone, ~0.1-0.3 s each for [256, 1024]
    write_config(repo, "slow", f"""
        backend: "onnxruntime"
        max_batch_size: 0
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 256, {SIZE} ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 256, {SIZE} ] }} ]
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
        parameters {{ key: "intra_op_thread_count" value: {{ string_value: "1" }} }}
    """)
    mb.slow_chain(repo / "warming" / "1" / "model.onnx", SIZE, 32)
    write_config(repo, "warming", f"""
        backend: "onnxruntime"
        max_batch_size: 256
        input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {SIZE} ] }} ]
        output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {SIZE} ] }} ]
        instance_group [ {{ count: 1 kind: KIND_CPU }} ]
        parameters {{ key: "intra_op_thread_count" value: {{ string_value: "1" }} }}
        model_warmup [ {{ name: "long" batch_size: 128 count: 40
          inputs {{ key: "INPUT0" value: {{ data_type: TYPE_FP32 dims: [ {SIZE} ] random_data: true }} }} }} ]
    """)
    return repo


def test_not_ready_until_warmed_up(slow_repo):
    with serve(slow_repo, "--device", "cpu", "--model", "warming", wait_ready=False) as server:
        deadline = time.monotonic() + 60
        while _status(f"{server.http}/v2/health/live")[0] != 200:
            assert time.monotonic() < deadline, server.output()
            time.sleep(0.02)
        # live, but warming up: not ready, and requests are refused cleanly with a JSON error
        assert _status(f"{server.http}/v2/health/ready")[0] == 400
        assert _status(f"{server.http}/v2/models/warming/ready")[0] == 400
        x = np.ones((1, SIZE), np.float32)
        body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, SIZE], "data": x.ravel().tolist()}]}).encode()
        code, payload = _status(f"{server.http}/v2/models/warming/infer", "POST", body)
        assert code == 503 and "'warming'" in json.loads(payload)["error"]
        while _status(f"{server.http}/v2/health/ready")[0] != 200:
            assert time.monotonic() < deadline, server.output()
            time.sleep(0.05)
        assert _status(f"{server.http}/v2/models/warming/infer", "POST", body)[0] == 200
        stats = json.loads(_status(f"{server.http}/v2/models/warming/stats")[1])["model_stats"][0]
        # warmup counted as Triton counts it: 40 executions of 128 batch-1 requests, plus ours
        assert stats["execution_count"] == 41 and stats["inference_count"] == 40 * 128 + 1
        metrics = _status(f"{server.http}/metrics")[1].decode()
        warmup = [l for l in metrics.splitlines() if l.startswith("toolkit_model_warmup_duration_seconds{")]
        assert warmup and float(warmup[0].rsplit(" ", 1)[1]) > 0


def test_sigterm_drains_in_flight_requests(slow_repo):
    x = np.random.default_rng(0).standard_normal((256, SIZE), dtype=np.float32)
    results: list = []

    with serve(slow_repo, "--device", "cpu", "--model", "slow") as server:
        def call() -> None:
            client = httpclient.InferenceServerClient(server.url, network_timeout=120)
            inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
            inp.set_data_from_numpy(x, binary_data=True)
            try:
                results.append(client.infer("slow", [inp]).as_numpy("OUTPUT0"))
            except Exception as exc:  # recorded, asserted below
                results.append(exc)

        threads = [threading.Thread(target=call) for _ in range(6)]
        for t in threads:
            t.start()
        # wait until the server has all six: one executing, the others queued or done (queued +
        # done >= 5; waiting for five queued could miss them when the first finishes before the
        # last arrives, and fewer would let SIGTERM refuse a late one)
        deadline = time.monotonic() + 30
        while True:
            metrics = _status(f"{server.http}/metrics")[1].decode()
            counts = {}
            for line in metrics.splitlines():
                for name in ("nv_inference_pending_request_count", "nv_inference_request_success"):
                    if line.startswith(name + '{model="slow"'):
                        counts[name] = float(line.rsplit(" ", 1)[1])
            if sum(counts.values()) >= 5:
                break
            assert time.monotonic() < deadline, "requests never queued"
            time.sleep(0.01)
        started = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        # new connections are refused once the drain started
        with pytest.raises(OSError):
            urllib.request.urlopen(f"{server.http}/v2/health/live", timeout=2)
        for t in threads:
            t.join(60)
        assert server.process.wait(30) == 0
        elapsed = time.monotonic() - started
    assert len(results) == 6 and not [r for r in results if isinstance(r, Exception)], results
    expected = results[0]
    assert all(np.array_equal(r, expected) for r in results)
    assert elapsed < 30


def test_failed_model_fails_startup_by_default(slow_repo, tmp_path):
    repo = tmp_path / "models"
    mb.add_sub(repo / "add_sub" / "1" / "model.onnx")
    write_config(repo, "add_sub", """
        backend: "onnxruntime"
        max_batch_size: 4
        instance_group [ { count: 1 kind: KIND_CPU } ]
    """)
    mb.add_sub(repo / "on_gpu" / "1" / "model.onnx")
    write_config(repo, "on_gpu", """
        backend: "onnxruntime"
        max_batch_size: 4
        instance_group [ { count: 1 kind: KIND_GPU } ]
    """)
    # compiled for a GPU target, run where onnxruntime has no CUDA provider
    with serve(repo, "--device", "gpu", wait_ready=False) as server:
        assert server.process.wait(60) == 1
        assert "no GPU execution provider" in server.output() and "--device cpu" in server.output()
    with serve(repo, "--device", "gpu", "--no-exit-on-error", wait_ready=False) as server:
        deadline = time.monotonic() + 60
        while True:
            code, body = _status(f"{server.http}/v2/repository/index", "POST", b"{}")
            if code == 200 and all(m["state"] != "LOADING" for m in json.loads(body)):
                break
            assert time.monotonic() < deadline and server.process.poll() is None, server.output()
            time.sleep(0.05)
        index = {m["name"]: m for m in json.loads(body)}
        assert index["add_sub"]["state"] == "READY"
        assert index["on_gpu"]["state"] == "UNAVAILABLE" and "no GPU execution provider" in index["on_gpu"]["reason"]
        assert _status(f"{server.http}/v2/models/add_sub/ready")[0] == 200
        assert _status(f"{server.http}/v2/models/on_gpu/ready")[0] == 400
        assert _status(f"{server.http}/v2/health/ready")[0] == 400  # not every model is ready


def test_warmup_inputs_the_model_does_not_have_are_ignored(tmp_path):
    """Triton accepts them (the compiler warns); the runtime must load the model anyway."""
    repo = tmp_path / "models"
    mb.add_sub(repo / "add_sub" / "1" / "model.onnx")
    write_config(repo, "add_sub", """
        backend: "onnxruntime"
        max_batch_size: 4
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        model_warmup [ { name: "w" batch_size: 2
          inputs { key: "INPUT0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } }
          inputs { key: "INPUT1" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } }
          inputs { key: "EXTRA" value: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } } ]
    """)
    with serve(repo, "--device", "cpu") as server:
        stats = json.loads(_status(f"{server.http}/v2/models/add_sub/stats")[1])["model_stats"][0]
        assert stats["inference_count"] == 2 * 2  # two instances warmed with two batch-1 requests each


LOAD_ORDER_SCRIPT = r"""
import json, os, signal, sys, threading
from pathlib import Path
from handlers.entrypoints import server
imported_at_start = "fastapi" in sys.modules
from handlers.manifest import Manifest
from handlers.model_repository import ModelRepository
loading, seen = threading.Event(), {}
load, http_app = server._Runner._load, server._Runner._http_app
def probe_load(self, loop):
    loading.set()
    return load(self, loop)
def probe_app(self):
    seen["loading_before_app"] = loading.wait(10)  # the old order (app, then loader) would wait out the 10 s
    return http_app(self)
server._Runner._load, server._Runner._http_app = probe_load, probe_app
repository = ModelRepository(Manifest.load(Path(sys.argv[1]), Path(sys.argv[3])))
def listening(listeners):
    def stop():
        # ready, and the server's SIGTERM handler in place
        while not repository.ready() or signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            threading.Event().wait(0.05)
        os.kill(os.getpid(), signal.SIGTERM)
    threading.Thread(target=stop, daemon=True).start()
code = server.serve(repository, "127.0.0.1", int(sys.argv[2]), on_listening=listening, log_level="warning")
print(json.dumps({"imported_at_start": imported_at_start, **seen, "code": code}))
"""


def test_models_start_loading_before_the_http_app_is_made(slow_repo, tmp_path):
    """Start-up order (docs/cold-start.md): importing the server module imports no FastAPI, and the
    model loader runs before the HTTP app is made, so FastAPI's ~170 ms of imports overlap the
    loading; the server then serves, gets ready and stops as before."""
    import os
    import subprocess
    import sys

    from serving import free_port
    from toolkit.repository.compile import compile_repository

    manifest = tmp_path / "models.json"
    compile_repository(slow_repo, None, "cpu").write_manifest(manifest)
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", LOAD_ORDER_SCRIPT, str(manifest), str(free_port()), str(slow_repo)],
                         cwd=root, env={**os.environ, "TOOLKIT_LOG_LEVEL": "warning"}, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"imported_at_start": False, "loading_before_app": True, "code": 0}
