"""The behaviours Triton's gRPC example clients (client repository, src/python/examples) rely on,
asserted with tritonclient.grpc against `toolkit serve` serving the models they expect, built by
scripts/grpc_examples.py (which runs the examples themselves from a user's checkout; docs/grpc.md
records a run)."""

from __future__ import annotations

import asyncio
import importlib.util
import queue
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from serving import serve

ROOT = Path(__file__).resolve().parents[1]


def _examples_module():
    spec = importlib.util.spec_from_file_location("grpc_examples", ROOT / "scripts" / "grpc_examples.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = _examples_module().build_repository(tmp_path_factory.mktemp("examples"))
    with serve(repo, "--device", "cpu") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    c = grpcclient.InferenceServerClient(server.grpc, keepalive_options=grpcclient.KeepAliveOptions(
        keepalive_time_ms=2**31 - 1, keepalive_timeout_ms=20000, keepalive_permit_without_calls=False,
        http2_max_pings_without_data=2))
    yield c
    c.close()


def _simple_inputs(datatype: str = "INT32") -> tuple[list, np.ndarray, np.ndarray]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int32)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], datatype), grpcclient.InferInput("INPUT1", [1, 16], datatype)]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs, a, b


def test_simple_infer_with_headers_and_statistics(client):
    """simple_grpc_infer_client / custom_args / keepalive: outputs, custom headers, statistics."""
    inputs, a, b = _simple_inputs()
    outputs = [grpcclient.InferRequestedOutput("OUTPUT0"), grpcclient.InferRequestedOutput("OUTPUT1")]
    result = client.infer("simple", inputs, outputs=outputs, headers={"test": "1"}, client_timeout=30)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    statistics = client.get_inference_statistics(model_name="simple")
    assert len(statistics.model_stats) == 1 and statistics.model_stats[0].inference_count >= 1


def test_async_and_aio_infer(server, client):
    inputs, a, b = _simple_inputs()
    done: queue.Queue = queue.Queue()
    client.async_infer("simple", inputs, lambda result, error: done.put((result, error)))
    result, error = done.get(timeout=30)
    assert error is None and (result.as_numpy("OUTPUT0") == a + b).all()

    async def run() -> np.ndarray:
        async with aioclient.InferenceServerClient(server.grpc) as c:
            return (await c.infer("simple", inputs)).as_numpy("OUTPUT1")

    np.testing.assert_array_equal(asyncio.run(run()), a - b)


def test_health_metadata_as_the_example_checks_it(client):
    assert client.is_server_live(headers={"test": "1", "dummy": "2"}) and client.is_server_ready()
    assert client.is_model_ready("simple")
    assert client.get_model_metadata("simple", headers={"test": "1"}).name == "simple"
    with pytest.raises(grpcclient.InferenceServerException, match="Request for unknown model"):
        client.get_model_metadata("wrong_model_name")
    assert client.get_model_config("simple").config.name == "simple"


def test_strings_as_text_integers_and_binary_blobs(client):
    """simple_grpc_string_infer_client: BYTES integers through simple_string, then simple_identity
    with embedded NUL characters and with 4-byte binary blobs."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    texts = [np.array([str(x).encode() for x in v.reshape(-1)], dtype=object).reshape(1, 16) for v in (a, np.ones_like(a))]
    inputs = [grpcclient.InferInput(f"INPUT{i}", [1, 16], "BYTES") for i in (0, 1)]
    for tensor, data in zip(inputs, texts):
        tensor.set_data_from_numpy(data)
    result = client.infer("simple_string", inputs)
    assert [int(x) for x in result.as_numpy("OUTPUT0").reshape(-1)] == (a + 1).reshape(-1).tolist()
    assert [int(x) for x in result.as_numpy("OUTPUT1").reshape(-1)] == (a - 1).reshape(-1).tolist()
    for data in (np.array([b"he\x00llo"] * 16, dtype=object).reshape(1, 16),
                 np.array([b"\x00\x01\x02\x03"] * 16, dtype=object).reshape(1, 16)):
        tensor = grpcclient.InferInput("INPUT0", list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data)
        np.testing.assert_array_equal(client.infer("simple_identity", [tensor]).as_numpy("OUTPUT0"), data)


@pytest.mark.parametrize("model, datatype, field, dtype", [
    ("simple", "INT32", "int_contents", np.int32),
    ("simple_int8", "INT8", "int_contents", np.int8),
])
def test_explicit_typed_contents(server, model, datatype, field, dtype):
    """grpc_explicit_int_content_client / int8: a raw ModelInferRequest with typed contents,
    outputs read from raw_output_contents."""
    import grpc

    a = list(range(16))
    request = service_pb2.ModelInferRequest(model_name=model)
    for name, values in (("INPUT0", a), ("INPUT1", [1] * 16)):
        tensor = request.inputs.add(name=name, datatype=datatype, shape=[1, 16])
        getattr(tensor.contents, field).extend(values)
    request.outputs.add(name="OUTPUT0")
    request.outputs.add(name="OUTPUT1")
    with grpc.insecure_channel(server.grpc) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    got = {o.name: np.frombuffer(raw, dtype) for o, raw in zip(response.outputs, response.raw_output_contents)}
    assert got["OUTPUT0"].tolist() == [x + 1 for x in a] and got["OUTPUT1"].tolist() == [x - 1 for x in a]


def test_explicit_byte_contents(server):
    import grpc

    request = service_pb2.ModelInferRequest(model_name="simple_string")
    for name, values in (("INPUT0", [str(x).encode() for x in range(16)]), ("INPUT1", [b"1"] * 16)):
        request.inputs.add(name=name, datatype="BYTES", shape=[1, 16]).contents.bytes_contents.extend(values)
    with grpc.insecure_channel(server.grpc) as channel:
        response = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    from tritonclient.utils import deserialize_bytes_tensor

    outputs = {o.name: deserialize_bytes_tensor(raw) for o, raw in zip(response.outputs, response.raw_output_contents)}
    assert [int(x) for x in outputs["OUTPUT0"]] == [x + 1 for x in range(16)]


def test_what_the_unsupported_examples_get(client):
    """model_control, shm: clear errors rather than silence (the examples exit 1 on them)."""
    with pytest.raises(grpcclient.InferenceServerException) as info:
        client.load_model("simple")
    assert info.value.status() == "StatusCode.UNAVAILABLE"
    with pytest.raises(grpcclient.InferenceServerException) as info:
        client.register_system_shared_memory("input_data", "/input_simple", 128)
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
