"""`toolkit serve` as a real process, driven by the real `tritonclient.http`, outputs compared with
onnxruntime run directly on the same ONNX files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import model_builders as mb
from conftest import write_config
from serving import serve


def _ort_run(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("serve") / "models"
    mb.add_sub(repo / "add_sub" / "1" / "model.onnx")
    write_config(repo, "add_sub", """
        name: "add_sub"
        backend: "onnxruntime"
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
                { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
                 { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        dynamic_batching { max_queue_delay_microseconds: 500 }
        instance_group [ { count: 2 kind: KIND_CPU } ]
    """)
    # no config.pbtxt at all: auto-completed from the ONNX file
    mb.identity(repo / "strings" / "1" / "model.onnx", {"TEXT": ("BYTES", ["N", 3])}, ["ECHO"])
    mb.identity(repo / "halves" / "1" / "model.onnx", {"H": ("FP16", ["N", 4])}, ["H_OUT"])
    # two versions, both served
    mb.matmul_relu(repo / "versioned" / "1" / "model.onnx", size=8, batch=2, seed=1)
    mb.matmul_relu(repo / "versioned" / "2" / "model.onnx", size=8, batch=2, seed=2)
    write_config(repo, "versioned", """
        backend: "onnxruntime"
        max_batch_size: 0
        version_policy: { all { } }
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2, 8 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2, 8 ] } ]
    """)
    # classification extension: top-N with labels
    mb.identity(repo / "scores" / "1" / "model.onnx", {"LOGITS": ("FP32", ["N", 4])}, ["PROBS"])
    (repo / "scores" / "labels.txt").write_text("cat\ndog\nbird\nfish\n")
    write_config(repo, "scores", """
        backend: "onnxruntime"
        max_batch_size: 4
        input [ { name: "LOGITS" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "PROBS" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" } ]
    """)
    # ensemble: two add_sub steps, the second fed by both outputs of the first
    write_config(repo, "pipe", """
        platform: "ensemble"
        max_batch_size: 8
        input [ { name: "A" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "SUM2" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "DIFF" data_type: TYPE_FP32 dims: [ 16 ] } ]
        ensemble_scheduling { step [
          { model_name: "add_sub" model_version: -1
            input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
            output_map { key: "OUTPUT0" value: "S" } output_map { key: "OUTPUT1" value: "DIFF" } },
          { model_name: "add_sub" model_version: 1
            input_map { key: "INPUT0" value: "S" } input_map { key: "INPUT1" value: "DIFF" }
            output_map { key: "OUTPUT0" value: "SUM2" } }
        ] }
    """)
    (repo / "pipe" / "1").mkdir()
    return repo


@pytest.fixture(scope="module")
def server(repository):
    with serve(repository, "--device", "cpu") as s:
        yield s


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(server.url)
    yield c
    c.close()


def test_health_and_server_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert "binary_tensor_data" in meta["extensions"] and "model_configuration" in meta["extensions"]


def test_model_metadata_and_config(client):
    meta = client.get_model_metadata("add_sub")
    assert meta["versions"] == ["1"] and meta["platform"] == "onnxruntime_onnx"
    assert meta["inputs"] == [
        {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]},
        {"name": "INPUT1", "datatype": "FP32", "shape": [-1, 16]},
    ]
    config = client.get_model_config("add_sub")
    assert config["max_batch_size"] == 8 and config["dynamic_batching"]["preferred_batch_size"] == [8]
    assert [g["count"] for g in config["instance_group"]] == [2]
    # auto-completed model: Triton's defaults
    auto = client.get_model_config("strings")
    assert auto["max_batch_size"] == 4 and auto["input"][0]["data_type"] == "TYPE_STRING"
    assert client.get_model_metadata("versioned")["versions"] == ["1", "2"]
    assert client.get_model_metadata("versioned")["inputs"][0]["shape"] == [2, 8]


@pytest.mark.parametrize("binary_in", [True, False])
@pytest.mark.parametrize("binary_out", [True, False])
def test_add_sub_matches_onnxruntime(client, repository, binary_in, binary_out):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 16), dtype=np.float32)
    b = rng.standard_normal((3, 16), dtype=np.float32)
    inputs = [httpclient.InferInput("INPUT0", a.shape, "FP32"), httpclient.InferInput("INPUT1", b.shape, "FP32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary_in)
    inputs[1].set_data_from_numpy(b, binary_data=binary_in)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary_out) for n in ("OUTPUT0", "OUTPUT1")]
    result = client.infer("add_sub", inputs, outputs=outputs, request_id="r-1")
    expected = _ort_run(repository / "add_sub" / "1" / "model.onnx", {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected["OUTPUT0"])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), expected["OUTPUT1"])
    assert result.get_response()["id"] == "r-1"


def test_requested_output_subset(client):
    a = np.ones((1, 16), np.float32)
    inputs = [httpclient.InferInput("INPUT0", a.shape, "FP32"), httpclient.InferInput("INPUT1", a.shape, "FP32")]
    for i in inputs:
        i.set_data_from_numpy(a)
    result = client.infer("add_sub", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT1")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), np.zeros((1, 16), np.float32))


@pytest.mark.parametrize("binary", [True, False])
def test_bytes_round_trip(client, binary):
    data = np.array([[b"hello", "h\u00e9llo".encode(), b""], [b"a", b"bb", b"ccc"]], dtype=object)
    inp = httpclient.InferInput("TEXT", data.shape, "BYTES")
    inp.set_data_from_numpy(data, binary_data=binary)
    result = client.infer("strings", [inp], outputs=[httpclient.InferRequestedOutput("ECHO", binary_data=binary)])
    out = result.as_numpy("ECHO")
    # tritonclient returns JSON BYTES as str, binary BYTES as bytes
    as_bytes = [x.encode() if isinstance(x, str) else x for x in out.reshape(-1)]
    assert out.shape == data.shape and as_bytes == list(data.reshape(-1))


def test_fp16(client, repository):
    h = np.arange(8, dtype=np.float16).reshape(2, 4) / 3
    inp = httpclient.InferInput("H", h.shape, "FP16")
    inp.set_data_from_numpy(h, binary_data=True)
    result = client.infer("halves", [inp])
    out = result.as_numpy("H_OUT")
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, h)


def test_versions_are_distinct_models(client, repository):
    x = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    for version in ("1", "2"):
        inp = httpclient.InferInput("INPUT0", x.shape, "FP32")
        inp.set_data_from_numpy(x)
        result = client.infer("versioned", [inp], model_version=version)
        expected = _ort_run(repository / "versioned" / version / "model.onnx", {"INPUT0": x})["OUTPUT0"]
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected, rtol=1e-6)
        assert result.get_response()["model_version"] == version
    # no version: the latest
    inp = httpclient.InferInput("INPUT0", x.shape, "FP32")
    inp.set_data_from_numpy(x)
    assert client.infer("versioned", [inp]).get_response()["model_version"] == "2"


def test_errors_as_triton(client):
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("nope")
    assert "Request for unknown model: 'nope' is not found" in str(info.value)
    assert info.value.status() == "404" or "404" in str(info.value.status())
    with pytest.raises(InferenceServerException, match="version 7 is not found"):
        client.get_model_metadata("add_sub", model_version="7")
    a = np.ones((9, 16), np.float32)
    inputs = [httpclient.InferInput("INPUT0", a.shape, "FP32"), httpclient.InferInput("INPUT1", a.shape, "FP32")]
    for i in inputs:
        i.set_data_from_numpy(a)
    with pytest.raises(InferenceServerException, match="batch-size must be <= 8"):
        client.infer("add_sub", inputs)
    assert not client.is_model_ready("nope")
    assert client.is_model_ready("add_sub")


@pytest.mark.parametrize("binary", [True, False])
def test_classification_extension(client, binary):
    logits = np.array([[0.1, 0.7, 0.05, 0.15], [0.9, 0.0, 0.3, 0.2]], np.float32)
    inp = httpclient.InferInput("LOGITS", logits.shape, "FP32")
    inp.set_data_from_numpy(logits)
    out = httpclient.InferRequestedOutput("PROBS", binary_data=binary, class_count=2)
    result = client.infer("scores", [inp], outputs=[out])
    top = result.as_numpy("PROBS")
    assert top.shape == (2, 2)
    rows = [[x.decode() if isinstance(x, bytes) else x for x in row] for row in top]
    assert rows == [["0.700000:1:dog", "0.150000:3:fish"], ["0.900000:0:cat", "0.300000:2:bird"]]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_request_and_response_compression(client, algorithm):
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    inputs = [httpclient.InferInput("INPUT0", a.shape, "FP32"), httpclient.InferInput("INPUT1", a.shape, "FP32")]
    for i in inputs:
        i.set_data_from_numpy(a, binary_data=True)
    result = client.infer(
        "add_sub", inputs, request_compression_algorithm=algorithm, response_compression_algorithm=algorithm
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def test_ensemble_pipeline(client):
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    b = np.full((2, 16), 3, np.float32)
    inputs = [httpclient.InferInput("A", a.shape, "FP32"), httpclient.InferInput("B", b.shape, "FP32")]
    inputs[0].set_data_from_numpy(a, binary_data=True)
    inputs[1].set_data_from_numpy(b)
    before = client.get_inference_statistics("pipe")["model_stats"][0]
    result = client.infer("pipe", inputs, request_id="e1")
    # step 2 computes (a + b) + (a - b)
    np.testing.assert_array_equal(result.as_numpy("SUM2"), 2 * a)
    np.testing.assert_array_equal(result.as_numpy("DIFF"), a - b)
    assert client.get_model_metadata("pipe")["platform"] == "ensemble"
    after = client.get_inference_statistics("pipe")["model_stats"][0]
    # tritonserver 2.51's ensemble statistics: one execution per request, batch size as inference count
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 1
    assert after["execution_count"] - before["execution_count"] == 1
    assert after["inference_count"] - before["inference_count"] == 2


def test_ensemble_step_error_fails_the_request(client):
    a = np.ones((9, 16), np.float32)  # over the ensemble's max_batch_size
    inputs = [httpclient.InferInput("A", a.shape, "FP32"), httpclient.InferInput("B", a.shape, "FP32")]
    for i in inputs:
        i.set_data_from_numpy(a)
    with pytest.raises(InferenceServerException, match="batch-size must be <= 8 for 'pipe'"):
        client.infer("pipe", inputs)


def _metric(server, line_prefix: str) -> float:
    import urllib.request

    with urllib.request.urlopen(f"{server.http}/metrics") as r:
        text = r.read().decode()
    values = [float(l.rsplit(" ", 1)[1]) for l in text.splitlines() if l.startswith(line_prefix)]
    assert len(values) == 1, (line_prefix, text)
    return values[0]


def test_statistics_and_metrics_deltas_match_the_requests_sent(client, server):
    labels = '{model="add_sub",version="1"}'
    stats_before = client.get_inference_statistics("add_sub")["model_stats"][0]
    success_before = _metric(server, f"nv_inference_request_success{labels}")
    count_before = _metric(server, f"nv_inference_count{labels}")
    failure_before = _metric(server, 'nv_inference_request_failure{model="add_sub",reason="BACKEND",version="1"}')
    a = np.ones((3, 16), np.float32)
    inputs = [httpclient.InferInput("INPUT0", a.shape, "FP32"), httpclient.InferInput("INPUT1", a.shape, "FP32")]
    for i in inputs:
        i.set_data_from_numpy(a, binary_data=True)
    for _ in range(7):
        client.infer("add_sub", inputs)
    stats_after = client.get_inference_statistics("add_sub")["model_stats"][0]
    assert stats_after["inference_stats"]["success"]["count"] - stats_before["inference_stats"]["success"]["count"] == 7
    assert stats_after["inference_count"] - stats_before["inference_count"] == 21
    assert _metric(server, f"nv_inference_request_success{labels}") - success_before == 7
    assert _metric(server, f"nv_inference_count{labels}") - count_before == 21
    assert _metric(server, 'nv_inference_request_failure{model="add_sub",reason="BACKEND",version="1"}') == failure_before
    assert _metric(server, f"nv_inference_pending_request_count{labels}") == 0
