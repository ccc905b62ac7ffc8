"""The response cache (handlers/response_cache.py): a model's `response_cache { enable: true }`
served with a cache (`toolkit serve --cache-config local,size=BYTES`, TOOLKIT_CACHE_CONFIG in
images; tritonserver's --cache-config). A python model that counts its executions shows which
requests reached it; tritonclient reads the answers, the statistics and /metrics over HTTP and
gRPC. Then the cache alone: its key, its byte bound, least recently used eviction."""

from __future__ import annotations

import textwrap
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from cli_runner import invoke
from python_models.repository import python_model
from tritonclient.utils import InferenceServerException

from handlers.inference import InferRequest, InferResponse, RequestedOutput
from handlers.response_cache import ResponseCache, parse_cache_config
from serving import serve

COUNTER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.executions = 0

    def execute(self, requests):
        out = []
        for request in requests:
            self.executions += 1
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x < 0).any():
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("negative input")))
                continue
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", x * 2),
                pb_utils.Tensor("RUN", np.full((x.shape[0], 1), self.executions, np.int64))]))
        return out
"""
CONFIG = """
name: "counter"
backend: "python"
max_batch_size: 4
input [ { name: "X" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] }, { name: "RUN" data_type: TYPE_INT64 dims: [ 1 ] } ]
response_cache { enable: true }
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("cache") / "models"
    python_model(repo, "counter", None, textwrap.dedent(CONFIG), source=COUNTER)
    return repo


@pytest.fixture(scope="module")
def cached(repository):
    with serve(repository, "--device", "cpu", "--cache-config", "local,size=1048576", "--metrics-port", "0") as running:
        yield running


def _http(server, x: np.ndarray, outputs: list[str] | None = None) -> tuple[np.ndarray, int]:
    client = httpclient.InferenceServerClient(server.url)
    try:
        tensor = httpclient.InferInput("X", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        requested = None if outputs is None else [httpclient.InferRequestedOutput(n) for n in outputs]
        result = client.infer("counter", [tensor], outputs=requested, request_id="r-1")
        assert result.get_response()["id"] == "r-1"
        run = result.as_numpy("RUN")
        return result.as_numpy("Y"), int(run[0][0]) if run is not None else -1
    finally:
        client.close()


def _stats(server) -> dict:
    client = httpclient.InferenceServerClient(server.url)
    try:
        return client.get_inference_statistics("counter")["model_stats"][0]
    finally:
        client.close()


def test_a_repeated_request_is_answered_from_the_cache(cached):
    before = _stats(cached)
    x = np.array([[1, 2, 3]], np.float32)
    y, first = _http(cached, x)
    again, second = _http(cached, x)
    np.testing.assert_array_equal(again, y)
    assert second == first  # the model did not run again
    other, third = _http(cached, x + 1)  # other bytes: a miss
    assert third == first + 1 and other.tolist() == [[4, 6, 8]]
    after = _stats(cached)
    delta = lambda *path: _get(after, path) - _get(before, path)  # noqa: E731
    assert delta("inference_stats", "cache_hit", "count") == 1
    assert delta("inference_stats", "cache_miss", "count") == 2
    assert delta("inference_stats", "success", "count") == 3  # a hit is a success
    assert delta("inference_count") == 2 and delta("execution_count") == 2  # but no inference


def _get(stats: dict, path: tuple) -> int:
    for key in path:
        stats = stats[key]
    return int(stats)


def test_other_shapes_and_other_outputs_are_other_entries(cached):
    """tritonserver's key is names and bytes only; here the shape and the outputs asked for count."""
    x = np.arange(6, dtype=np.float32).reshape(2, 3) + 100
    _, first = _http(cached, x)
    _, same = _http(cached, x)
    assert same == first
    _, single = _http(cached, x[:1])  # the first row alone: another shape, another entry
    assert single == first + 1
    y_only, _ = _http(cached, x, outputs=["Y"])  # asks for Y alone: its own entry, RUN absent
    np.testing.assert_array_equal(y_only, x * 2)
    assert _http(cached, x, outputs=["Y"])[1] == -1


def test_a_failed_request_is_not_cached(cached):
    client = httpclient.InferenceServerClient(cached.url)
    try:
        tensor = httpclient.InferInput("X", [1, 3], "FP32")
        tensor.set_data_from_numpy(np.array([[-1, 0, 1]], np.float32))
        for _ in range(2):
            with pytest.raises(InferenceServerException, match="negative input"):
                client.infer("counter", [tensor])
    finally:
        client.close()
    assert _stats(cached)["inference_stats"]["fail"]["count"] == 2


def test_grpc_meets_the_same_cache(cached):
    x = np.array([[7, 8, 9]], np.float32)
    _, over_http = _http(cached, x)
    client = grpcclient.InferenceServerClient(cached.grpc)
    try:
        tensor = grpcclient.InferInput("X", [1, 3], "FP32")
        tensor.set_data_from_numpy(x)
        result = client.infer("counter", [tensor], request_id="g-1")
        assert int(result.as_numpy("RUN")[0][0]) == over_http
        assert result.get_response().id == "g-1"
    finally:
        client.close()


def test_the_cache_metrics(cached):
    _http(cached, np.array([[5, 5, 5]], np.float32))
    _http(cached, np.array([[5, 5, 5]], np.float32))
    with urllib.request.urlopen(f"{cached.http}/metrics") as answer:
        text = answer.read().decode()
    hits = [line for line in text.splitlines() if line.startswith('nv_cache_num_hits_per_model{model="counter",version="1"}')]
    assert hits and float(hits[0].split()[-1]) >= 1
    assert "# TYPE nv_cache_miss_duration_per_model counter" in text


def test_without_a_cache_every_request_runs_and_validate_says_why(repository):
    result = invoke(["validate", str(repository)])
    assert result.exit_code == 0
    assert "TOOLKIT_CACHE_CONFIG=local,size=BYTES" in " ".join(result.output.split())
    with serve(repository, "--device", "cpu") as running:
        x = np.array([[1, 1, 1]], np.float32)
        assert _http(running, x)[1] + 1 == _http(running, x)[1]
        with urllib.request.urlopen(f"{running.http}/metrics") as answer:
            assert "nv_cache_num_hits_per_model{" in answer.read().decode()  # the model enables it: at 0


def test_a_cache_config_that_is_not_triton_s_is_refused(repository):
    result = invoke(["serve", str(repository), "--cache-config", "redis,host=x"])
    assert result.exit_code == 2
    assert "is not 'local,size=BYTES'" in result.output


# -- the cache alone ---------------------------------------------------------------------------------


def _request(x: np.ndarray, outputs: list[str] | None = None) -> InferRequest:
    requested = None if outputs is None else [RequestedOutput(n) for n in outputs]
    return InferRequest("m", 1, {"X": x}, requested_outputs=requested)


def test_the_key_takes_datatype_shape_bytes_and_the_outputs_asked_for():
    x = np.arange(6, dtype=np.float32)
    keys = {
        ResponseCache.key(_request(x)),
        ResponseCache.key(_request(x.reshape(2, 3))),
        ResponseCache.key(_request(x.view(np.int32))),
        ResponseCache.key(_request(x + 1)),
        ResponseCache.key(_request(x, ["Y"])),
    }
    assert len(keys) == 5
    assert ResponseCache.key(_request(x.copy())) == ResponseCache.key(_request(x))
    strings = np.array([b"a", b"bc"], dtype=object)
    assert ResponseCache.key(_request(strings)) != ResponseCache.key(_request(np.array([b"ab", b"c"], dtype=object)))


def test_the_least_recently_used_response_goes_first_and_the_bytes_stay_bounded():
    cache = ResponseCache(capacity=100)
    response = lambda n: InferResponse("m", 1, {"Y": np.zeros(n, np.uint8)})  # noqa: E731
    assert cache.insert(b"a", response(40)) and cache.insert(b"b", response(40))
    assert cache.lookup(b"a") is not None  # a is now the most recent
    assert cache.insert(b"c", response(40))  # evicts b
    assert cache.lookup(b"b") is None and cache.lookup(b"a") is not None and cache.lookup(b"c") is not None
    assert cache.used == 80
    assert not cache.insert(b"d", response(101))  # larger than the cache: not kept
    stored = cache.lookup(b"a").outputs["Y"]
    assert not stored.flags.writeable


@pytest.mark.parametrize("text, size", [("local,size=1048576", 1048576), (" local,size=0 ", 0)])
def test_tritons_cache_config(text, size):
    assert parse_cache_config(text) == size


@pytest.mark.parametrize("text", ["local", "local,size=-1", "local,size=1k", "redis,host=x", "size=10"])
def test_other_cache_configs_are_refused(text):
    with pytest.raises(ValueError, match="local,size=BYTES"):
        parse_cache_config(text)
