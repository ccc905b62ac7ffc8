"""TorchScript models served by `toolkit serve` (a real process), driven by tritonclient and the
real perf_analyzer (2.51); every output is compared with torch's own output for the same inputs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
import torch_models as tm
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from serving import ROOT, serve
from tools import perf_analyzer

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

F32 = "TYPE_FP32"


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("torch") / "models"
    # traced, batching: two instances, a short queue delay so concurrent requests meet, warmup
    tm.write_model(
        repo, "linear",
        tm.config("linear", [tm.tensor("x", F32, [16])], [tm.tensor("y", F32, [4])], max_batch_size=8, extra="""
dynamic_batching { max_queue_delay_microseconds: 2000 }
instance_group [ { count: 2 kind: KIND_CPU } ]
model_warmup [ { name: "zeros" batch_size: 2 inputs { key: "x" value { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } } } ]
parameters { key: "INTRA_OP_THREAD_COUNT" value { string_value: "1" } }
"""),
        lambda p: tm.save_trace(tm.Linear(), torch.zeros(1, 16), p),
    )
    # scripted, inputs by forward-argument name, outputs by index, no batching
    tm.write_model(
        repo, "add_sub",
        tm.config("add_sub", [tm.tensor("y", F32, [-1]), tm.tensor("x", F32, [-1])],
                  [tm.tensor("OUTPUT__0", F32, [-1]), tm.tensor("OUTPUT__1", F32, [-1])]),
        lambda p: tm.save_script(tm.AddSub(), p),
    )
    tm.write_model(
        repo, "upper",
        tm.config("upper", [tm.tensor("INPUT__0", "TYPE_STRING", [-1])],
                  [tm.tensor("OUTPUT__0", "TYPE_STRING", [-1]), tm.tensor("OUTPUT__1", "TYPE_INT64", [-1])]),
        lambda p: tm.save_script(tm.Upper(), p),
    )
    tm.write_model(
        repo, "dict_in",
        tm.config("dict_in", [tm.tensor("a", F32, [3]), tm.tensor("b", F32, [3])], [tm.tensor("y", F32, [3])], max_batch_size=4),
        lambda p: tm.save_script(tm.DictInput(), p),
    )
    tm.write_model(
        repo, "raises",
        tm.config("raises", [tm.tensor("x", F32, [4])], [tm.tensor("y", F32, [4])], max_batch_size=4),
        lambda p: tm.save_script(tm.Raises(), p),
    )
    return repo


@pytest.fixture(scope="module")
def server(repository):
    with serve(repository, "--device", "cpu") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return httpclient.InferenceServerClient(server.url, concurrency=16)


def _module(repository: Path, name: str):
    return torch.jit.load(str(repository / name / "1" / "model.pt"))


def _input(name: str, array: np.ndarray, datatype: str, binary: bool = True) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def _stats(server, model: str) -> dict:
    with urllib.request.urlopen(f"{server.http}/v2/models/{model}/stats") as response:
        return json.load(response)["model_stats"][0]


def test_metadata_and_config(client, server):
    metadata = client.get_model_metadata("linear")
    assert metadata["platform"] == "pytorch_libtorch" and metadata["versions"] == ["1"]
    assert metadata["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 16]}]
    config = client.get_model_config("add_sub")
    assert config["backend"] == "pytorch" and config["platform"] == "pytorch_libtorch"
    with urllib.request.urlopen(f"{server.http}/metrics") as response:
        metrics = response.read().decode()
    warmup = re.search(r'toolkit_model_warmup_duration_seconds\{model="linear",version="1"\} (\S+)', metrics)
    assert warmup and float(warmup.group(1)) > 0  # model_warmup ran on both instances before ready


def test_outputs_equal_torchs_own(client, repository):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 16)).astype(np.float32)
    result = client.infer("linear", [_input("x", x, "FP32")])
    np.testing.assert_allclose(result.as_numpy("y"), _module(repository, "linear")(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)

    x, y = rng.standard_normal(5).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    result = client.infer("add_sub", [_input("y", y, "FP32", binary=False), _input("x", x, "FP32")])
    total, difference = _module(repository, "add_sub")(torch.from_numpy(x), torch.from_numpy(y))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__0"), total.numpy())
    np.testing.assert_array_equal(result.as_numpy("OUTPUT__1"), difference.numpy())

    words = np.array([b"dynamic", b"batching", b""], dtype=object)
    result = client.infer("upper", [_input("INPUT__0", words, "BYTES", binary=False)])
    upper, lengths = _module(repository, "upper")([w.decode() for w in words])
    assert result.as_numpy("OUTPUT__0").tolist() == [w.encode() for w in upper]
    assert result.as_numpy("OUTPUT__1").tolist() == lengths.tolist()

    a, b = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)
    result = client.infer("dict_in", [_input("a", a, "FP32"), _input("b", b, "FP32")])
    expected = _module(repository, "dict_in")({"a": torch.from_numpy(a), "b": torch.from_numpy(b)})
    np.testing.assert_allclose(result.as_numpy("y"), expected.numpy(), rtol=1e-6)


def test_concurrent_requests_are_batched_and_each_gets_its_own_rows(server, repository):
    module = _module(repository, "linear")
    rng = np.random.default_rng(7)
    cases = [rng.standard_normal((1 + i % 3, 16)).astype(np.float32) for i in range(96)]
    before = _stats(server, "linear")

    # 16 tritonclient clients at once, each on its own connection (one client's async_infer
    # sends its requests one at a time on one connection: strace shows it, so nothing could merge)
    clients = threading.local()

    def infer(x: np.ndarray) -> np.ndarray:
        if not hasattr(clients, "client"):
            clients.client = httpclient.InferenceServerClient(server.url)
        return clients.client.infer("linear", [_input("x", x, "FP32")]).as_numpy("y")

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(infer, cases))
    for x, y in zip(cases, results):
        np.testing.assert_allclose(y, module(torch.from_numpy(x)).detach().numpy(), rtol=1e-5, atol=1e-6)
    after = _stats(server, "linear")
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == sum(len(x) for x in cases)
    assert executions < len(cases)  # requests were merged into batches
    batches = {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}
    assert max(batches) > 3 and max(batches) <= 8


def test_bad_requests_get_clear_errors_and_nothing_breaks(client, repository):
    with pytest.raises(InferenceServerException) as shape:
        client.infer("linear", [_input("x", np.zeros((2, 15), np.float32), "FP32")])
    assert shape.value.status() == "400" and "unexpected shape for input 'x' for model 'linear'" in shape.value.message()
    with pytest.raises(InferenceServerException) as dtype:
        client.infer("linear", [_input("x", np.zeros((2, 16), np.float64), "FP64")])
    assert dtype.value.status() == "400" and "data-type is 'FP64', but model 'linear' expects 'FP32'" in dtype.value.message()
    with pytest.raises(InferenceServerException) as raised:
        client.infer("raises", [_input("x", np.full((1, 4), 1000, np.float32), "FP32")])
    assert raised.value.status() == "500"
    assert raised.value.message().startswith("PyTorch execute failure:") and "input too large for this model" in raised.value.message()
    # the same model, the same instance, serves the next request
    ok = client.infer("raises", [_input("x", np.ones((1, 4), np.float32), "FP32")])
    np.testing.assert_array_equal(ok.as_numpy("y"), np.full((1, 4), 3, np.float32))
    assert client.is_server_live() and client.is_model_ready("linear")


def test_perf_analyzer_drives_a_torchscript_model(server):
    before = _stats(server, "linear")
    out = subprocess.run(
        [perf_analyzer(), "-u", server.url, "-m", "linear", "-b", "2", "--shape", "x:16", "--concurrency-range", "2:8:6",
         "--measurement-interval", "500", "--stability-percentage", "999", "--max-trials", "5"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    measured = [int(n) for n in re.findall(r"Client: \n\s+Request count: (\d+)", out.stdout)]
    assert len(measured) == 2 and all(n > 0 for n in measured), out.stdout
    after = _stats(server, "linear")
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"]
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] >= sum(measured)


def test_serve_refuses_a_file_that_is_not_torchscript(tmp_path):
    repo = tmp_path / "models"
    directory = tm.write_model(repo, "m", tm.config("m", [tm.tensor("x", F32, [4])], [tm.tensor("y", F32, [4])]))
    torch.save(torch.nn.Linear(4, 4).state_dict(), directory / "1" / "model.pt")
    out = subprocess.run([sys.executable, "-m", "toolkit.cli", "serve", str(repo), "--port", "0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1
    assert "failed to load model 'm': model.pt is a zip file without the TorchScript records" in out.stderr
