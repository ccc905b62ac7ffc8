"""Several server processes on the same ports (`toolkit serve --workers N`, handlers/workers).

Real `toolkit serve` processes with real clients (HTTP requests each on a new connection, so the
kernel spreads them over the workers; tritonclient.grpc). What must hold with N workers:
- statistics (HTTP and gRPC) and `/metrics` (HTTP port and metrics port) count every request
  exactly once: the sum of what each worker counted, asked directly on its own socket;
- the server is ready only when every worker is (a worker whose instance loads slowly keeps
  `/v2/health/ready` at 400 on every connection, and gRPC ServerReady false);
- SIGTERM to the parent drains every worker: requests in flight complete, the parent exits 0;
- a worker that fails takes the server down (exit 1); too many workers or a taken port is a
  clear error.
No timing thresholds: waits are bounded, outcomes are what is asserted.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from handlers.manifest import Manifest
from handlers.workers.peers import merge_statistics
from handlers.workers.plan import WorkerPlanError, WorkerSlot, worker_count
from serving import ROOT, TOOLKIT, free_port, serve
from toolkit.repository.compile import compile_repository

QUICKSTART = ROOT / "samples" / "quickstart"  # add_sub: dynamic batching, 2 instances, 1 warmup sample

SLOW_MODEL = '''
import json, os, time
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        value = lambda key: float(parameters.get(key, {}).get("string_value", "0"))
        self.exec_delay = value("exec_delay")
        if args["model_instance_name"].endswith("_1"):
            if value("fail_instance_1"):
                raise RuntimeError("instance 1 refuses to start")
            time.sleep(value("load_delay_instance_1"))

    def execute(self, requests):
        time.sleep(self.exec_delay)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
                for r in requests]
'''


def slow_repository(root: Path, **parameters: float) -> Path:
    model = root / "repo" / "slow"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(SLOW_MODEL)
    params = "\n".join(f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}' for k, v in parameters.items())
    (model / "config.pbtxt").write_text(f'''
backend: "python"
max_batch_size: 4
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
{params}
''')
    return root / "repo"


def get(port: int, path: str) -> tuple[int, bytes]:
    """One request on a new connection (so SO_REUSEPORT may pick either worker)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def infer(port: int, model: str, body: dict) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request("POST", f"/v2/models/{model}/infer", body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


ADD_SUB = {"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 16], "data": list(range(16))} for n in ("INPUT0", "INPUT1")]}
SLOW = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}


def ask_worker(directory: Path, index: int, question: dict) -> object:
    async def ask() -> object:
        reader, writer = await asyncio.open_unix_connection(str(directory / f"worker-{index}.sock"))
        writer.write(json.dumps(question).encode() + b"\n")
        await writer.drain()
        line = await reader.readline()
        writer.close()
        return json.loads(line)

    return asyncio.run(ask())


def metric(text: str, name: str, model: str) -> float:
    match = re.search(rf'^{name}{{model="{model}",version="1"}} (\S+)$', text, re.M)
    assert match, text
    return float(match.group(1))


def worker_pids(parent: int) -> list[int]:
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    return [int(pid) for pid in children]


# -- the plan -----------------------------------------------------------------------------------


def test_worker_count_splits_instances_never_multiplies(tmp_path):
    manifest = Manifest.from_dict(compile_repository(QUICKSTART).manifest(), QUICKSTART)
    assert worker_count(manifest, "1", cpus=8) == 1
    assert worker_count(manifest, 2, cpus=8) == 2
    assert worker_count(manifest, "auto", cpus=8) == 2  # add_sub has 2 instances
    assert worker_count(manifest, "auto", cpus=1) == 1
    with pytest.raises(WorkerPlanError, match="3 workers need at least 3 instances of every model, and model 'add_sub' has 2"):
        worker_count(manifest, 3, cpus=8)
    for bad in ("0", "-1", "two"):
        with pytest.raises(WorkerPlanError, match="positive integer or 'auto'"):
            worker_count(manifest, bad, cpus=8)


def test_instances_are_dealt_round_robin_with_their_config_names():
    from handlers.instance_group import InstanceSlot

    slots = [InstanceSlot(f"m_0_{i}", "KIND_CPU", 0) for i in range(5)]
    assert [s.name for s in WorkerSlot(0, 2).mine(slots)] == ["m_0_0", "m_0_2", "m_0_4"]
    assert [s.name for s in WorkerSlot(1, 2).mine(slots)] == ["m_0_1", "m_0_3"]
    assert WorkerSlot.parse("1/3") == WorkerSlot(1, 3)
    with pytest.raises(ValueError):
        WorkerSlot.parse("3/3")


def test_statistics_of_two_workers_add_up():
    a = {"name": "m", "version": "1", "last_inference": 5, "inference_count": 3, "execution_count": 2,
         "inference_stats": {"success": {"count": 3, "ns": 30}, "fail": {"count": 0, "ns": 0}},
         "batch_stats": [{"batch_size": 1, "compute_infer": {"count": 1, "ns": 7}},
                         {"batch_size": 2, "compute_infer": {"count": 1, "ns": 9}}], "memory_usage": []}
    b = {"name": "m", "version": "1", "last_inference": 9, "inference_count": 4, "execution_count": 3,
         "inference_stats": {"success": {"count": 4, "ns": 40}, "fail": {"count": 1, "ns": 2}},
         "batch_stats": [{"batch_size": 2, "compute_infer": {"count": 2, "ns": 11}},
                         {"batch_size": 4, "compute_infer": {"count": 1, "ns": 3}}], "memory_usage": []}
    assert merge_statistics(a, b) == {
        "name": "m", "version": "1", "last_inference": 9, "inference_count": 7, "execution_count": 5,
        "inference_stats": {"success": {"count": 7, "ns": 70}, "fail": {"count": 1, "ns": 2}},
        "batch_stats": [{"batch_size": 1, "compute_infer": {"count": 1, "ns": 7}},
                        {"batch_size": 2, "compute_infer": {"count": 3, "ns": 20}},
                        {"batch_size": 4, "compute_infer": {"count": 1, "ns": 3}}], "memory_usage": []}


# -- real servers ---------------------------------------------------------------------------------


def test_every_request_is_counted_once_across_workers(tmp_path):
    directory = tmp_path / "workers"
    metrics_port = free_port()
    with serve(QUICKSTART, "--workers", "2", "--metrics-port", str(metrics_port),
               env={"TOOLKIT_WORKER_DIR": str(directory)}) as server:
        http_requests, grpc_requests = 40, 10
        for _ in range(http_requests):
            status, body = infer(server.port, "add_sub", ADD_SUB)
            assert status == 200, body
        a = np.arange(16, dtype=np.float32).reshape(1, 16)
        for _ in range(grpc_requests):
            client = grpcclient.InferenceServerClient(server.grpc)  # a new channel each time
            inputs = [grpcclient.InferInput(n, [1, 16], "FP32") for n in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_data_from_numpy(a)
            assert np.array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), a * 2)
            client.close()

        per_worker = [ask_worker(directory, i, {"op": "stats", "models": [["add_sub", 1]]})[0] for i in range(2)]
        counts = [w["inference_stats"]["success"]["count"] for w in per_worker]
        executions = sum(w["execution_count"] for w in per_worker)
        assert all(c > 1 for c in counts), counts  # both workers served (beyond their own warmup)
        expected = http_requests + grpc_requests + 2  # + one warmup execution per instance
        assert sum(counts) == expected

        for _ in range(6):  # whichever worker answers, the answer is the sum
            status, body = get(server.port, "/v2/models/add_sub/stats")
            assert status == 200
            stats = json.loads(body)["model_stats"][0]
            assert stats["inference_stats"]["success"]["count"] == expected
            assert stats["execution_count"] == executions
            assert sum(b["compute_infer"]["count"] for b in stats["batch_stats"]) == executions
            status, body = get(server.port, "/v2/models/stats")
            assert json.loads(body)["model_stats"][0]["inference_count"] == expected
            grpc_stats = grpcclient.InferenceServerClient(server.grpc).get_inference_statistics("add_sub", as_json=True)
            assert int(grpc_stats["model_stats"][0]["inference_stats"]["success"]["count"]) == expected
            for port in (server.port, metrics_port):
                status, body = get(port, "/metrics")
                assert status == 200
                text = body.decode()
                assert metric(text, "nv_inference_request_success", "add_sub") == expected
                assert metric(text, "nv_inference_exec_count", "add_sub") == executions
                assert text.count("# TYPE nv_cpu_utilization gauge") == 1
        # each worker holds its own instance of add_sub (the config's two, split, names kept)
        states = [ask_worker(directory, i, {"op": "state"}) for i in range(2)]
        assert [state["instances"] for state in states] == [{"add_sub": ["add_sub_0_0"]}, {"add_sub": ["add_sub_0_1"]}]
        assert sorted(state["pid"] for state in states) == sorted(worker_pids(server.process.pid))


def test_ready_only_when_every_worker_is(tmp_path):
    directory = tmp_path / "workers"
    repo = slow_repository(tmp_path, load_delay_instance_1=6)
    with serve(repo, "--workers", "2", env={"TOOLKIT_WORKER_DIR": str(directory)}, wait_ready=False) as server:
        deadline = time.monotonic() + 60
        # both workers' control sockets exist (worker 1 may start a moment after worker 0) and
        # worker 0 is ready
        while (not all((directory / f"worker-{i}.sock").exists() for i in range(2))
               or not ask_worker(directory, 0, {"op": "state"})["ready"]):
            assert server.process.poll() is None and time.monotonic() < deadline, server.output()
            time.sleep(0.05)
        # worker 0 has loaded its instance; worker 1 still sleeps in initialize()
        if not ask_worker(directory, 1, {"op": "state"})["ready"]:
            for _ in range(8):
                assert get(server.port, "/v2/health/ready")[0] == 400
            assert grpcclient.InferenceServerClient(server.grpc).is_server_ready() is False
        while get(server.port, "/v2/health/ready")[0] != 200:
            assert server.process.poll() is None and time.monotonic() < deadline, server.output()
            time.sleep(0.1)
        assert ask_worker(directory, 1, {"op": "state"})["ready"] is True
        for _ in range(8):
            assert get(server.port, "/v2/health/ready")[0] == 200
        assert grpcclient.InferenceServerClient(server.grpc).is_server_ready() is True


def test_sigterm_drains_every_worker(tmp_path):
    repo = slow_repository(tmp_path, exec_delay=1.5)
    with serve(repo, "--workers", "2", env={"TOOLKIT_WORKER_DIR": str(tmp_path / "w")}) as server:
        workers = worker_pids(server.process.pid)
        assert len(workers) == 2
        results: list[int] = []
        threads = [threading.Thread(target=lambda: results.append(infer(server.port, "slow", SLOW)[0])) for _ in range(8)]
        for thread in threads:
            thread.start()
        time.sleep(0.6)  # the requests are in flight (each takes 1.5 s)
        server.process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(60)
        assert server.process.wait(60) == 0, server.output()
        assert results == [200] * 8, server.output()
        for pid in workers:
            assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()


def test_a_failing_worker_stops_the_server(tmp_path):
    repo = slow_repository(tmp_path, fail_instance_1=1)
    log = tmp_path / "serve.log"
    with open(log, "w") as handle:
        process = subprocess.run([*TOOLKIT, "serve", str(repo), "--port", str(free_port()), "--grpc-port", "0",
                                  "--metrics-port", "0", "--workers", "2"], cwd=ROOT, stdout=handle,
                                 stderr=subprocess.STDOUT, timeout=120)
    output = log.read_text()
    assert process.returncode == 1, output
    assert "instance 1 refuses to start" in output and "worker 1 exited with status 1" in output


def test_too_many_workers_and_a_taken_port_are_clear_errors(tmp_path):
    out = subprocess.run([*TOOLKIT, "serve", str(QUICKSTART), "--port", str(free_port()), "--grpc-port", "0",
                          "--metrics-port", "0", "--workers", "3"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "3 workers need at least 3 instances of every model, and model 'add_sub' has 2" in " ".join(out.stderr.split())
    # TOOLKIT_WORKERS, the images' variable, is `toolkit serve`'s default for --workers too
    out = subprocess.run([*TOOLKIT, "serve", str(QUICKSTART), "--port", str(free_port()), "--grpc-port", "0",
                          "--metrics-port", "0"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TOOLKIT_WORKERS": "3"})
    assert out.returncode == 2
    assert "3 workers need at least 3 instances of every model, and model 'add_sub' has 2" in " ".join(out.stderr.split())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run([*TOOLKIT, "serve", str(QUICKSTART), "--port", str(port), "--grpc-port", "0",
                              "--metrics-port", "0", "--workers", "2"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert f"cannot listen for HTTP on 127.0.0.1:{port}" in out.stdout + out.stderr


def test_container_entry_point_runs_workers(tmp_path):
    """Images: `python -m handlers.entrypoints.container` with TOOLKIT_WORKERS=2 on $PORT."""
    compiled = compile_repository(QUICKSTART)
    manifest = compiled.write_manifest(tmp_path / "models.json")
    port = free_port()
    env = {**os.environ, "PORT": str(port), "TOOLKIT_MANIFEST": str(manifest), "TOOLKIT_MODEL_ROOT": str(QUICKSTART),
           "TOOLKIT_HOST": "127.0.0.1", "TOOLKIT_WORKERS": "2", "TOOLKIT_LOG_LEVEL": "warning"}
    log = tmp_path / "container.log"
    with open(log, "w") as handle:
        process = subprocess.Popen([os.sys.executable, "-m", "handlers.entrypoints.container"], cwd=ROOT, env=env,
                                   stdout=handle, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                if get(port, "/v2/health/ready")[0] == 200:
                    break
            except OSError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert len(worker_pids(process.pid)) == 2
        for _ in range(12):
            assert infer(port, "add_sub", ADD_SUB)[0] == 200
        stats = json.loads(get(port, "/v2/models/add_sub/stats")[1])["model_stats"][0]
        assert stats["inference_stats"]["success"]["count"] == 12 + 2
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(60) == 0, log.read_text()
