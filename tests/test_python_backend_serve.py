"""Triton python-backend models served by a real `toolkit serve` process and called with the real
`tritonclient.http`: the add_sub example with its client's logic, dynamic batching on and off
(execute sees the batched request lists), BLS to an ONNX model (sync and async), errors with
their HTTP statuses, auto_complete_config without config.pbtxt, custom metrics on /metrics."""

from __future__ import annotations

import urllib.request

import model_builders as mb
import numpy as np
import pytest
import tritonclient.http as httpclient
from python_models.repository import python_model
from serving import serve
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

ADD_SUB = """
    backend: "python"
    max_batch_size: {mbs}
    input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }}, {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }} ]
    output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }}, {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] }} ]
    {extra}
"""
PROBE = """
    backend: "python"
    max_batch_size: 8
    input [ {{ name: "INPUT0" data_type: TYPE_INT32 dims: [ 2 ] }} ]
    output [ {{ name: "BATCH" data_type: TYPE_INT32 dims: [ 1 ] }}, {{ name: "ECHO" data_type: TYPE_INT32 dims: [ 2 ] }},
             {{ name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }} ]
    {extra}
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    repo = tmp_path_factory.mktemp("python_serve") / "models"
    python_model(repo, "add_sub_example", "add_sub.py", ADD_SUB.format(mbs=0, extra=""))
    python_model(repo, "add_sub", "add_sub.py", ADD_SUB.format(
        mbs=8, extra="dynamic_batching { max_queue_delay_microseconds: 2000 }\ninstance_group [ { count: 2 kind: KIND_CPU } ]"))
    python_model(repo, "probe_batching", "batch_probe.py", PROBE.format(
        extra="dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 5000000 }"))
    python_model(repo, "probe_no_batching", "batch_probe.py", PROBE.format(extra=""))
    mb.add_sub(repo / "add_sub_onnx" / "1" / "model.onnx", dims=("N", 4))
    python_model(repo, "bls_sync", "bls_sync.py", """
        backend: "python"
        max_batch_size: 0
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 1, 4 ] },
                { name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1, 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 1, 4 ] } ]
    """)
    python_model(repo, "bls_async", "bls_async.py", ADD_SUB.format(mbs=8, extra=""))
    python_model(repo, "errors", "errors.py", """
        backend: "python"
        max_batch_size: 0
        input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
    """)
    return repo


@pytest.fixture(scope="module")
def server(repository):
    with serve(repository, "--device", "cpu") as s:
        yield s


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(server.url, concurrency=8)
    yield c
    c.close()


def _add_sub_inputs(a: np.ndarray, b: np.ndarray) -> list:
    inputs = [
        httpclient.InferInput("INPUT0", a.shape, np_to_triton_dtype(a.dtype)),
        httpclient.InferInput("INPUT1", b.shape, np_to_triton_dtype(b.dtype)),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def test_add_sub_example_client(client):
    # python_backend/examples/add_sub/client.py
    shape = [4]
    input0_data = np.random.rand(*shape).astype(np.float32)
    input1_data = np.random.rand(*shape).astype(np.float32)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1")]
    response = client.infer("add_sub_example", _add_sub_inputs(input0_data, input1_data), request_id=str(1), outputs=outputs)
    assert response.get_response()["id"] == "1"
    assert np.allclose(input0_data + input1_data, response.as_numpy("OUTPUT0"))
    assert np.allclose(input0_data - input1_data, response.as_numpy("OUTPUT1"))


def test_add_sub_batched_over_two_instances(client):
    rng = np.random.default_rng(0)
    pairs = [(rng.random((n, 4), dtype=np.float32), rng.random((n, 4), dtype=np.float32)) for n in (1, 3, 2, 1, 4, 2)]
    pending = [client.async_infer("add_sub", _add_sub_inputs(a, b)) for a, b in pairs]
    for (a, b), result in zip(pairs, pending):
        response = result.get_result()
        np.testing.assert_array_equal(response.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(response.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("model, expected", [("probe_batching", 4), ("probe_no_batching", 1)])
def test_execute_receives_batched_request_lists(client, model, expected):
    def one(i: int):
        x = np.array([[i, i]], np.int32)
        inputs = [httpclient.InferInput("INPUT0", x.shape, "INT32")]
        inputs[0].set_data_from_numpy(x)
        return client.async_infer(model, inputs, outputs=[httpclient.InferRequestedOutput("BATCH")])

    results = [one(i).get_result() for i in range(4)] if expected == 1 else [r.get_result() for r in [one(i) for i in range(4)]]
    # dynamic batching on: the four concurrent requests reach execute() as one list of 4;
    # off (Triton's default scheduler): one request per execute()
    assert [int(r.as_numpy("BATCH")[0][0]) for r in results] == [expected] * 4


def test_bls_to_an_onnx_model(client):
    a = np.random.rand(1, 4).astype(np.float32)
    b = np.random.rand(1, 4).astype(np.float32)
    inputs = _add_sub_inputs(a, b)
    name = httpclient.InferInput("MODEL_NAME", [1], "BYTES")
    name.set_data_from_numpy(np.array([b"add_sub_onnx"], dtype=object))
    response = client.infer("bls_sync", inputs + [name])
    np.testing.assert_allclose(response.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_allclose(response.as_numpy("OUTPUT1"), a - b)


def test_bls_error_reaches_the_client(client):
    a = np.zeros((1, 4), np.float32)
    name = httpclient.InferInput("MODEL_NAME", [1], "BYTES")
    name.set_data_from_numpy(np.array([b"missing_model"], dtype=object))
    with pytest.raises(InferenceServerException) as raised:
        client.infer("bls_sync", _add_sub_inputs(a, a) + [name])
    assert raised.value.status() == "500"
    assert (
        "message: TritonModelException: Model missing_model - Error when running inference: Failed for execute the "
        "inference request. Model 'missing_model' is not ready." in raised.value.message()
    )


def test_async_bls_gathers_onnx_and_python_models(client):
    a = np.random.rand(3, 4).astype(np.float32)
    b = np.random.rand(3, 4).astype(np.float32)
    response = client.infer("bls_async", _add_sub_inputs(a, b))
    np.testing.assert_allclose(response.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_allclose(response.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize(
    "mode, status, message",
    [
        (1, "400", "error with code INVALID_ARG"),
        (2, "404", "error with code NOT_FOUND"),
        (3, "503", "error with code UNAVAILABLE"),
        (4, "501", "error with code UNSUPPORTED"),
        (6, "500", "default code"),
    ],
)
def test_triton_errors_keep_their_http_status(client, mode, status, message):
    x = np.array([mode], np.int32)
    inputs = [httpclient.InferInput("MODE", x.shape, "INT32")]
    inputs[0].set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as raised:
        client.infer("errors", inputs)
    assert raised.value.status() == status and raised.value.message() == message


def test_exception_in_execute_is_a_500_with_tritons_message(client):
    x = np.array([10], np.int32)
    inputs = [httpclient.InferInput("MODE", x.shape, "INT32")]
    inputs[0].set_data_from_numpy(x)
    with pytest.raises(InferenceServerException) as raised:
        client.infer("errors", inputs)
    assert raised.value.status() == "500"
    assert raised.value.message().startswith("Failed to process the request(s) for model 'errors")
    assert "message: ValueError: mode 10 makes execute raise\n\nAt:\n" in raised.value.message()


def test_custom_metrics_on_the_metrics_endpoint(client, server):
    x = np.array([[1, 1]], np.int32)
    inputs = [httpclient.InferInput("INPUT0", x.shape, "INT32")]
    inputs[0].set_data_from_numpy(x)
    client.infer("probe_no_batching", inputs)
    with urllib.request.urlopen(f"{server.http}/metrics", timeout=10) as r:
        text = r.read().decode()
    assert 'probe_requests{model="probe_no_batching"}' in text
    assert "probe_batch_size_bucket" in text
    # as tritonserver writes them (python_backend's custom_metrics example checks these lines):
    # a counter keeps its name in HELP and TYPE, no `_total` anywhere
    assert "# HELP probe_requests requests seen by the probe\n# TYPE probe_requests counter\n" in text
    assert "# TYPE probe_batch_size histogram\n" in text
    assert "# TYPE nv_inference_request_success counter\n" in text
    assert "_total" not in text.replace("nv_cpu_memory_total_bytes", "").replace("nv_gpu_memory_total_bytes", "")


def test_auto_complete_config_without_config_pbtxt(tmp_path):
    repo = tmp_path / "models"
    python_model(repo, "auto_complete", "auto_complete.py", None)  # no config.pbtxt at all
    with serve(repo, "--device", "cpu") as server:
        client = httpclient.InferenceServerClient(server.url)
        try:
            config = client.get_model_config("auto_complete")
            assert config["backend"] == "python" and config["max_batch_size"] == 4
            assert [(i["name"], i["data_type"], i["dims"]) for i in config["input"]] == [
                ("INPUT0", "TYPE_FP32", [4]), ("INPUT1", "TYPE_FP32", [4])
            ]
            assert [o["name"] for o in config["output"]] == ["OUTPUT0", "OUTPUT1"]
            assert config["dynamic_batching"]["preferred_batch_size"] == [4]
            a = np.random.rand(2, 4).astype(np.float32)
            response = client.infer("auto_complete", _add_sub_inputs(a, a))
            np.testing.assert_allclose(response.as_numpy("OUTPUT0"), a + a)
        finally:
            client.close()
