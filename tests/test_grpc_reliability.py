"""The gRPC port keeps the REST port's guarantees: size limits, malformed protobufs and absurd
shapes answered with INVALID_ARGUMENT (never a crash, never INTERNAL), fuzzing with hypothesis,
cancelled calls and streams free their queue slots, and SIGTERM drains the streams in flight.
"""

from __future__ import annotations

import queue
import signal
import struct
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg

import model_builders as mb
from conftest import write_config
from serving import serve

SLOW_MODEL = '''
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            time.sleep(float(x.reshape(-1)[0]))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return responses
'''

ALLOWED = {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "RESOURCE_EXHAUSTED"}


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("grpc-reliability") / "models"
    mb.add_sub(repo / "add_sub" / "1" / "model.onnx")
    write_config(repo, "add_sub", """
        backend: "onnxruntime"
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        dynamic_batching { }
    """)
    mb.identity(repo / "strings" / "1" / "model.onnx", {"TEXT": ("BYTES", ["N", 3])}, ["ECHO"])
    write_config(repo, "strings", """
        backend: "onnxruntime"
        max_batch_size: 4
        input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 3 ] } ]
        output [ { name: "ECHO" data_type: TYPE_STRING dims: [ 3 ] } ]
    """)
    (repo / "slow" / "1").mkdir(parents=True)
    (repo / "slow" / "1" / "model.py").write_text(SLOW_MODEL)
    write_config(repo, "slow", """
        backend: "python"
        max_batch_size: 1
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
        dynamic_batching { default_queue_policy { max_queue_size: 2 } }
        instance_group [ { count: 1 kind: KIND_CPU } ]
    """)
    return repo


LIMIT_ENV = {"TOOLKIT_MAX_REQUEST_BYTES": str(256 * 1024), "TOOLKIT_MAX_TENSOR_ELEMENTS": "4096"}


@pytest.fixture(scope="module")
def server(repository):
    with serve(repository, "--device", "cpu", env=LIMIT_ENV) as s:
        yield s


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.grpc) as channel:
        yield channel


def _add_sub(rows: int = 1, value: float = 1.0, rid: str = "") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="add_sub", id=rid)
    for name in ("INPUT0", "INPUT1"):
        request.inputs.add(name=name, datatype="FP32", shape=[rows, 16])
        request.raw_input_contents.append(np.full((rows, 16), value, np.float32).tobytes())
    return request


def _slow(seconds: float, rid: str = "") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="slow", id=rid)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 1])
    request.raw_input_contents.append(np.array([[seconds]], np.float32).tobytes())
    return request


def _check_alive(channel) -> None:
    stub = pbg.GRPCInferenceServiceStub(channel)
    assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live
    response = stub.ModelInfer(_add_sub(value=2.0), timeout=30)
    assert np.frombuffer(response.raw_output_contents[0], np.float32).tolist() == [4.0] * 16


@pytest.mark.parametrize("payload", [b"\xff\xff\xff\xff", b"\x0a\x05ab", b"\x12\x80\x80\x80\x80\x10", b"\x0a" * 3])
@pytest.mark.parametrize("method", ["ModelInfer", "ModelMetadata", "ServerReady", "RepositoryIndex"])
def test_malformed_protobufs_are_invalid_argument(channel, method, payload):
    call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}", request_serializer=None, response_deserializer=None)
    with pytest.raises(grpc.RpcError) as info:
        call(payload, timeout=10)
    # deliberate: tritonserver answers INTERNAL "Unable to parse request"
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "failed to parse the request" in info.value.details()


def test_malformed_protobuf_in_a_stream_is_an_error_response(channel):
    call = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer", request_serializer=None,
                                 response_deserializer=pb.ModelStreamInferResponse.FromString)
    responses = list(call(iter([b"\xff\xff", _add_sub(rid="after").SerializeToString()]), timeout=30))
    assert "failed to parse the request" in responses[0].error_message
    assert responses[1].error_message == "" and responses[1].infer_response.id == "after"
    _check_alive(channel)


def test_huge_shapes_are_refused_without_allocating(channel):
    stub = pbg.GRPCInferenceServiceStub(channel)
    for shape in ([1, 2**40], [2**40, 16], [2**62, 2**62], [2**63 - 1, 16], [0, 2**62]):
        request = pb.ModelInferRequest(model_name="add_sub")
        for name in ("INPUT0", "INPUT1"):
            request.inputs.add(name=name, datatype="FP32", shape=shape)
            request.raw_input_contents.append(b"\0" * 64)
        with pytest.raises(grpc.RpcError) as info:
            stub.ModelInfer(request, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (shape, info.value.details())
    strings = pb.ModelInferRequest(model_name="strings")
    strings.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 2**40])
    strings.raw_input_contents.append(struct.pack("<I", 1) + b"a")
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(strings, timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    _check_alive(channel)


def test_size_limits(channel):
    stub = pbg.GRPCInferenceServiceStub(channel)
    with pytest.raises(grpc.RpcError) as info:  # over TOOLKIT_MAX_REQUEST_BYTES: grpcio refuses it
        stub.ModelInfer(_oversized(), timeout=10)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    big = pb.ModelInferRequest(model_name="strings")  # 6000 elements > TOOLKIT_MAX_TENSOR_ELEMENTS
    big.inputs.add(name="TEXT", datatype="BYTES", shape=[2000, 3])
    big.raw_input_contents.append((struct.pack("<I", 1) + b"a") * 6000)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(big, timeout=10)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "TOOLKIT_MAX_TENSOR_ELEMENTS" in info.value.details()
    _check_alive(channel)


def _oversized() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="add_sub")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    request.raw_input_contents.append(b"\0" * (300 * 1024))
    return request


# --- hypothesis ---------------------------------------------------------------------------------------

DATATYPES = ["FP32", "FP16", "INT32", "INT64", "BYTES", "BOOL", "UINT8", "BF16", "FP99", ""]
DIMS = st.one_of(st.integers(-3, 20), st.sampled_from([0, 16, 2**31, 2**40, 2**62, 2**63 - 1, -(2**63)]))
TYPED = ["fp32_contents", "int_contents", "int64_contents", "bytes_contents", "bool_contents", "uint_contents",
         "fp64_contents", "uint64_contents"]


def _typed_values(draw, field: str) -> list:
    size = draw(st.integers(0, 40))
    if field == "bytes_contents":
        return draw(st.lists(st.binary(max_size=6), min_size=size, max_size=size))
    if field == "bool_contents":
        return draw(st.lists(st.booleans(), min_size=size, max_size=size))
    if field in ("fp32_contents", "fp64_contents"):
        return draw(st.lists(st.floats(allow_nan=True, width=32), min_size=size, max_size=size))
    bits = {"int_contents": 31, "int64_contents": 63, "uint_contents": 32, "uint64_contents": 64}[field]
    low = 0 if field.startswith("uint") else -(2**bits)
    high = 2**bits - 1
    return draw(st.lists(st.integers(low, high), min_size=size, max_size=size))


@st.composite
def infer_requests(draw) -> tuple[bytes, bool]:
    """A ModelInferRequest: valid add_sub / strings requests, and mutations of every field. Returns
    the wire bytes (sometimes cut or garbled) and whether the request is a valid add_sub one."""
    model = draw(st.sampled_from(["add_sub", "add_sub", "strings", "nope", ""]))
    rows = draw(st.integers(1, 8))
    valid = model == "add_sub" and draw(st.booleans())
    request = pb.ModelInferRequest(model_name=model, id=draw(st.text(max_size=8)))
    if valid:
        a = np.array(draw(st.lists(st.floats(-1e3, 1e3, width=32), min_size=16 * rows, max_size=16 * rows)), np.float32)
        for name in ("INPUT0", "INPUT1"):
            request.inputs.add(name=name, datatype="FP32", shape=[rows, 16])
            request.raw_input_contents.append(a.tobytes())
        return request.SerializeToString(), True
    request.model_version = draw(st.sampled_from(["", "", "1", "2", "x", "-1", "99999999999999999999", " 1", "1a"]))
    for _ in range(draw(st.integers(0, 3))):
        tensor = request.inputs.add(
            name=draw(st.sampled_from(["INPUT0", "INPUT1", "TEXT", "X", ""])),
            datatype=draw(st.sampled_from(DATATYPES)),
            shape=draw(st.lists(DIMS, max_size=4)),
        )
        if draw(st.booleans()):
            field = draw(st.sampled_from(TYPED))
            getattr(tensor.contents, field).extend(_typed_values(draw, field))
        if draw(st.integers(0, 5)) == 0:
            tensor.parameters["shared_memory_region"].string_param = "r"
    for _ in range(draw(st.integers(0, 3))):
        request.raw_input_contents.append(draw(st.binary(max_size=200)))
    for _ in range(draw(st.integers(0, 2))):
        key = draw(st.sampled_from(["priority", "timeout", "sequence_id", "sequence_start", "triton_x",
                                    "triton_enable_empty_final_response", "custom"]))
        parameter = request.parameters[key]
        kind = draw(st.sampled_from(["int64", "uint64", "bool", "string", "double", "none"]))
        if kind == "int64":
            parameter.int64_param = draw(st.integers(-(2**63), 2**63 - 1))
        elif kind == "uint64":
            parameter.uint64_param = draw(st.integers(0, 2**64 - 1))
        elif kind == "bool":
            parameter.bool_param = draw(st.booleans())
        elif kind == "string":
            parameter.string_param = draw(st.text(max_size=4))
        elif kind == "double":
            parameter.double_param = draw(st.floats())
    for _ in range(draw(st.integers(0, 2))):
        output = request.outputs.add(name=draw(st.sampled_from(["OUTPUT0", "ECHO", "NOPE"])))
        if draw(st.booleans()):
            output.parameters["classification"].int64_param = draw(st.integers(-2, 5))
    wire = request.SerializeToString()
    garble = draw(st.sampled_from(["none", "none", "truncate", "append", "flip"]))
    if garble == "truncate" and wire:
        wire = wire[: draw(st.integers(0, len(wire) - 1))]
    elif garble == "append":
        wire += draw(st.binary(min_size=1, max_size=8))
    elif garble == "flip" and wire:
        index = draw(st.integers(0, len(wire) - 1))
        wire = wire[:index] + bytes([wire[index] ^ 0xFF]) + wire[index + 1:]
    return wire, False


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=infer_requests())
def test_fuzzed_infer_requests(channel, case):
    wire, valid = case
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer", request_serializer=None,
                               response_deserializer=pb.ModelInferResponse.FromString)
    try:
        response = call(wire, timeout=30)
        code = "OK"
    except grpc.RpcError as error:
        code, response = error.code().name, error.details()
    assert code in ALLOWED, (code, response)
    if valid:
        assert code == "OK", response
        request = pb.ModelInferRequest.FromString(wire)
        a = np.frombuffer(request.raw_input_contents[0], np.float32)
        outputs = {o.name: np.frombuffer(r, np.float32) for o, r in zip(response.outputs, response.raw_output_contents)}
        np.testing.assert_array_equal(outputs["OUTPUT0"], a + a)
        np.testing.assert_array_equal(outputs["OUTPUT1"], a - a)
    elif code != "OK":
        assert response and "Traceback" not in response


def test_server_survives_the_fuzzing(channel):
    _check_alive(channel)


# --- cancellation and drain ---------------------------------------------------------------------------


def _two_more_are_accepted(stub) -> None:
    """Two new requests to `slow` at once are both answered (a full queue would refuse one:
    UNAVAILABLE)."""
    results: list = []

    def infer(rid: str) -> None:
        try:
            results.append(stub.ModelInfer(_slow(0.01, rid), timeout=30).id)
        except grpc.RpcError as error:
            results.append((error.code().name, error.details()))

    threads = [threading.Thread(target=infer, args=(f"u{n}",)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(results) == ["u0", "u1"], results


def test_cancelled_stream_frees_its_queue_slots(server, channel):
    """`slow` runs one request at a time with a queue of 2: a stream fills it (one executing, two
    queued), then the client cancels the stream. The two queued requests must leave the queue at
    once: two new requests are accepted (a full queue would refuse them: UNAVAILABLE)."""
    stub = pbg.GRPCInferenceServiceStub(channel)
    requests: queue.Queue = queue.Queue()
    call = stub.ModelStreamInfer(iter(requests.get, None))
    for n in range(3):
        requests.put(_slow(1.5, rid=f"s{n}"))
    time.sleep(0.6)  # all three received: one executing, two queued
    call.cancel()
    requests.put(None)
    time.sleep(0.2)
    _two_more_are_accepted(stub)


def test_cancelled_unary_calls_free_their_queue_slots(server, channel):
    """As the stream above, with ModelInfer calls (which the native front end queues without a
    task: InferenceService.queue_model_infer): one executing and two queued, then the client
    cancels the queued two; they leave the queue at once and two new requests are accepted."""
    stub = pbg.GRPCInferenceServiceStub(channel)
    running = stub.ModelInfer.future(_slow(1.5, rid="r0"), timeout=30)
    time.sleep(0.3)  # executing
    queued = [stub.ModelInfer.future(_slow(1.5, rid=f"q{n}"), timeout=30) for n in range(2)]
    time.sleep(0.3)  # both queued
    for call in queued:
        call.cancel()
    time.sleep(0.2)
    _two_more_are_accepted(stub)
    assert running.result().id == "r0"
    assert all(call.cancelled() for call in queued)


def test_sigterm_drains_streams_in_flight(repository):
    """Requests received on a stream before SIGTERM are all answered; a request sent while the
    server drains gets an error response; the stream then ends and the process exits 0."""
    with serve(repository, "--device", "cpu") as server:
        with grpc.insecure_channel(server.grpc) as channel:
            stub = pbg.GRPCInferenceServiceStub(channel)
            requests: queue.Queue = queue.Queue()
            answers: list = []
            call = stub.ModelStreamInfer(iter(requests.get, None), timeout=60)
            reader = threading.Thread(target=lambda: answers.extend(call), daemon=True)
            reader.start()
            for n in range(2):  # within `slow`'s queue of 2 even before the first one starts executing
                requests.put(_slow(0.6, rid=f"d{n}"))
            time.sleep(0.4)
            server.process.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            requests.put(_slow(0.01, rid="late"))
            reader.join(30)
            requests.put(None)
            assert server.process.wait(timeout=30) == 0, server.output()
    by_id = {a.infer_response.id: a for a in answers}
    for n in range(2):
        assert by_id[f"d{n}"].error_message == "", by_id[f"d{n}"].error_message
        assert np.frombuffer(by_id[f"d{n}"].infer_response.raw_output_contents[0], np.float32).tolist() == [0.6000000238418579]
    assert "Server is stopping" in by_id["late"].error_message
    assert call.code() == grpc.StatusCode.OK


# Decoupled models on a stream (responses as they come, the others in request order):
# tests/test_decoupled_grpc.py, with real decoupled Python models.
