"""The real perf_analyzer (2.51, scripts/tools/perf_analyzer) against `toolkit serve`."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest

import model_builders as mb
from conftest import write_config
from serving import serve
from tools import perf_analyzer



def _perf(url: str, *args: str, timeout: float = 300) -> str:
    out = subprocess.run([perf_analyzer(), "-u", url, *args], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _stats(http: str, model: str) -> dict:
    with urllib.request.urlopen(f"{http}/v2/models/{model}/stats") as r:
        return json.load(r)["model_stats"][0]


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("perf") / "models"
    mb.add_sub(repo / "add_sub" / "1" / "model.onnx")
    write_config(repo, "add_sub", """
        backend: "onnxruntime"
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        dynamic_batching { }
        instance_group [ { count: 2 kind: KIND_CPU } ]
    """)
    mb.text_recognition(repo / "text_recognition" / "1" / "model.onnx")
    write_config(repo, "text_recognition", """
        name: "text_recognition"
        backend: "onnxruntime"
        max_batch_size : 8
        input [ { name: "input.1" data_type: TYPE_FP32 dims: [ 1, 32, 100 ] } ]
        output [ { name: "308" data_type: TYPE_FP32 dims: [ 26, 37 ] } ]
        dynamic_batching { }
        instance_group [ { count: 2 kind: KIND_CPU } ]
    """)
    return repo


@pytest.fixture(scope="module")
def server(repository):
    with serve(repository, "--device", "cpu") as s:
        yield s


def test_perf_analyzer_concurrency_range(server):
    """`-b 2 --concurrency-range 2:8:2` with loose stability: it succeeds, every request it measured
    was counted by the server, none failed, and it printed our server-side breakdown."""
    before = _stats(server.http, "add_sub")
    out = _perf(
        server.url, "-m", "add_sub", "-b", "2", "--shape", "INPUT0:16", "--shape", "INPUT1:16",
        "--concurrency-range", "2:8:2", "--measurement-interval", "500", "--stability-percentage", "999",
        "--max-trials", "10",
    )
    after = _stats(server.http, "add_sub")
    measured = [int(n) for n in re.findall(r"Client: \n\s+Request count: (\d+)", out)]
    assert len(measured) == 4, out
    served = after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"]
    assert served >= sum(measured)
    assert after["inference_count"] - before["inference_count"] == 2 * served  # -b 2
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"]
    assert re.search(r"Avg request latency: \d+ usec \(overhead \d+ usec \+ queue \d+ usec \+ compute input \d+ usec "
                     r"\+ compute infer \d+ usec \+ compute output \d+ usec\)", out), out


@pytest.mark.parametrize("concurrency", [2, 4, 6, 8])
def test_server_counts_exactly_what_perf_analyzer_sent(server, concurrency):
    """Count mode (--request-count, one concurrency per run): the server's own statistics must
    count exactly the requests perf_analyzer sent, and twice as many inferences (-b 2)."""
    before = _stats(server.http, "add_sub")
    sent = 120
    out = _perf(
        server.url, "-m", "add_sub", "-b", "2", "--shape", "INPUT0:16", "--shape", "INPUT1:16",
        "--concurrency-range", str(concurrency), "--request-count", str(sent),
    )
    after = _stats(server.http, "add_sub")
    assert [int(n) for n in re.findall(r"Request count: (\d+)", out)] == [sent], out
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == sent
    assert after["inference_count"] - before["inference_count"] == 2 * sent


def test_seeds_command_on_text_recognition(server):
    """The seeds' command, verbatim apart from the URL and looser stability for 2 shared cores."""
    out = _perf(
        server.url, "-m", "text_recognition", "-b", "2", "--shape", "input.1:1,32,100",
        "--concurrency-range", "2:16:2", "--percentile=95",
        "--measurement-interval", "800", "--stability-percentage", "999", "--max-trials", "10",
    )
    summary = re.findall(r"Concurrency: (\d+), throughput: ([\d.]+) infer/sec, latency (\d+) usec", out)
    assert [int(c) for c, _, _ in summary] == [2, 4, 6, 8, 10, 12, 14, 16], out
    assert all(float(t) > 0 for _, t, _ in summary)
    stats = _stats(server.http, "text_recognition")
    # dynamic batching formed batches larger than one request's batch of 2
    assert max(b["batch_size"] for b in stats["batch_stats"]) > 2


@pytest.mark.parametrize("concurrency", [1, 4, 8])
def test_server_counts_exactly_what_perf_analyzer_sent_over_grpc(server, concurrency):
    """`perf_analyzer -i grpc` against the gRPC port: the server counts exactly the requests it
    sent, and twice as many inferences (-b 2); none failed."""
    before = _stats(server.http, "add_sub")
    sent = 120
    out = _perf(
        server.grpc, "-i", "grpc", "-m", "add_sub", "-b", "2", "--shape", "INPUT0:16", "--shape", "INPUT1:16",
        "--concurrency-range", str(concurrency), "--request-count", str(sent),
    )
    after = _stats(server.http, "add_sub")
    assert [int(n) for n in re.findall(r"Request count: (\d+)", out)] == [sent], out
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == sent
    assert after["inference_count"] - before["inference_count"] == 2 * sent
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"]


def test_perf_analyzer_grpc_streaming(server):
    """`-i grpc --streaming` (ModelStreamInfer) on text_recognition: every request answered."""
    before = _stats(server.http, "text_recognition")
    sent = 60
    out = _perf(
        server.grpc, "-i", "grpc", "--streaming", "-m", "text_recognition", "--shape", "input.1:1,32,100",
        "--concurrency-range", "4", "--request-count", str(sent),
    )
    after = _stats(server.http, "text_recognition")
    assert [int(n) for n in re.findall(r"Request count: (\d+)", out)] == [sent], out
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == sent
