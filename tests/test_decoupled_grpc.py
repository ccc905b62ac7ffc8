"""Decoupled models over gRPC ModelStreamInfer, through a real `toolkit serve` and tritonclient's
own stream client: responses as the model sends them, `triton_final_response` on each and the
empty final response on request, error responses inline with the model name and id, ModelInfer
refused, decoupled and ordinary requests on one stream, and a cancelled stream that tells the
model and frees its queue slot. Expected messages and message shapes were measured on tritonserver
2.51's gRPC port."""

from __future__ import annotations

import json
import queue
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from decoupled_repository import write_repository
from serving import serve
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg
from tritonclient.utils import InferenceServerException


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with serve(write_repository(tmp_path_factory.mktemp("decoupled-grpc") / "models")) as running:
        yield running


def _request(model: str, rid: str = "r1", empty_final: bool = False, **inputs: np.ndarray) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name=model, id=rid)
    for name, array in inputs.items():
        datatype = {np.dtype(np.int32): "INT32", np.dtype(np.uint32): "UINT32", np.dtype(object): "BYTES"}[array.dtype]
        message.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        if datatype == "BYTES":
            message.raw_input_contents.append(b"".join(len(x).to_bytes(4, "little") + x for x in array.reshape(-1)))
        else:
            message.raw_input_contents.append(array.tobytes())
    if empty_final:
        message.parameters["triton_enable_empty_final_response"].bool_param = True
    return message


def _stream(server, *requests: pb.ModelInferRequest, count: int | None = None, timeout: float = 60) -> list:
    """The stream's responses for `requests` (`count` of them, else until the stream ends)."""
    with grpc.insecure_channel(server.grpc) as channel:
        stub = pbg.GRPCInferenceServiceStub(channel)
        call = stub.ModelStreamInfer(iter(requests), timeout=timeout)
        answers = []
        for answer in call:
            answers.append(answer)
            if count is not None and len(answers) == count:
                call.cancel()
                break
        return answers


def _final(response) -> bool:
    return response.infer_response.parameters["triton_final_response"].bool_param


def _probe(mode: int, **fields) -> pb.ModelInferRequest:
    return _request("probe", MODE=np.array([mode], np.int32), **fields)


def test_each_response_carries_the_final_flag_and_the_empty_final_is_on_request(server):
    answers = _stream(server, _probe(0))
    assert [(a.infer_response.id, a.infer_response.model_version, _final(a)) for a in answers] == [("r1", "1", False)] * 2
    answers = _stream(server, _probe(0, empty_final=True))
    assert [_final(a) for a in answers] == [False, False, True]
    empty = answers[-1].infer_response
    assert (empty.model_name, empty.id, empty.model_version, list(empty.outputs)) == ("probe", "r1", "", [])
    answers = _stream(server, _probe(1, empty_final=True))  # the final flag came with the last response
    assert [(len(a.infer_response.outputs), _final(a)) for a in answers] == [(2, False), (2, True)]
    assert [_final(a) for a in _stream(server, _probe(14, empty_final=True))] == [True]
    assert _stream(server, _probe(14)) == []


def test_errors_are_stream_responses_with_model_name_and_id(server):
    answers = _stream(server, _probe(2, empty_final=True))
    assert answers[0].error_message == "" and not _final(answers[0])
    assert answers[1].error_message.startswith(
        "Failed to process the request(s) for model 'probe_0_0', message: ValueError: boom after one response"
    )
    error = answers[1].infer_response
    assert (error.model_name, error.id, error.model_version, _final(answers[1])) == ("probe", "r1", "", True)
    assert len(answers) == 2  # no empty final after an error that ends the request
    answers = _stream(server, _probe(8))
    assert [(a.error_message, _final(a)) for a in answers] == [("first failed", False), ("", False)]
    answers = _stream(server, _probe(9, empty_final=True))
    assert [(a.error_message, _final(a)) for a in answers] == [("only error", True)]


def test_model_infer_refuses_a_decoupled_model(server):
    client = grpcclient.InferenceServerClient(server.grpc)
    tensor = grpcclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], np.int32))
    with pytest.raises(InferenceServerException) as refused:
        client.infer("square", [tensor])
    assert refused.value.status() == "StatusCode.UNIMPLEMENTED"
    assert refused.value.message() == "ModelInfer RPC doesn't support models with decoupled transaction policy"
    client.close()


def test_tritonclient_stream_with_decoupled_and_ordinary_requests(server):
    received: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc)
    client.start_stream(callback=lambda result, error: received.put(error or result))
    for index, value in enumerate([3, 0, 2]):
        tensor = grpcclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([value], np.int32))
        client.async_stream_infer("square", [tensor], request_id=f"square-{index}")
    text = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"hi"]], dtype=object))
    client.async_stream_infer("echo", [text], request_id="echo")
    results = [received.get(timeout=60) for _ in range(3 + 2 + 1)]
    client.stop_stream()
    client.close()
    assert not [r for r in results if isinstance(r, Exception)]
    by_id: dict[str, list] = {}
    for result in results:
        by_id.setdefault(result.get_response().id, []).append(result.as_numpy(result.get_response().outputs[0].name).tolist())
    assert by_id == {"square-0": [[3]] * 3, "square-2": [[2]] * 2, "echo": [[[b"hi"]]]}


def test_a_cancelled_stream_tells_the_model_and_frees_the_queue(server):
    # the model sends one response and waits for the cancellation; the client reads it and cancels
    answers = _stream(server, _probe(10), count=1)
    assert answers[0].infer_response.outputs[0].name in ("OUT", "IDX")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        response = _stream(server, _probe(6))[0].infer_response
        out = [o.name for o in response.outputs].index("OUT")
        log = json.loads(response.raw_output_contents[out][4:])  # one BYTES element: length, then the text
        if "cancelled: request True sender True" in log:
            break
        time.sleep(0.05)
    assert "cancelled: request True sender True" in log
    # one stream holds the instance (mode 19 waits for its cancellation) while another waits in the
    # queue; cancelling both frees the instance and the queue
    failed = failures(server)
    with grpc.insecure_channel(server.grpc) as channel:
        stub = pbg.GRPCInferenceServiceStub(channel)
        holding = stub.ModelStreamInfer(iter([_probe(19)]), timeout=60)
        assert next(holding).infer_response.id == "r1"
        waiting = stub.ModelStreamInfer(iter([_probe(0, rid="queued")]), timeout=60)
        until(lambda: pending(server) == 1)
        waiting.cancel()
        until(lambda: failures(server) == failed + 1)
        assert pending(server) == 0 and failures(server) == failed + 1  # CANCELED, out of the queue
        holding.cancel()
    answers = _stream(server, _probe(0, empty_final=True))
    assert [_final(a) for a in answers] == [False, False, True]
    assert failures(server) == failed + 1


def until(condition, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)


def pending(server) -> float:
    return server.metric('nv_inference_pending_request_count{model="probe"')


def failures(server) -> float:
    return server.metric('nv_inference_request_failure{model="probe",reason="CANCELED"')
