"""`toolkit serve`'s gRPC port (inference.GRPCInferenceService) driven by the real
`tritonclient.grpc` (unary, async callback, asyncio and stream clients) and by raw protobuf calls.

Expected codes and messages were measured against the real tritonserver 2.51 gRPC port: the same
repository (ONNX models served by scripts' Triton anchor, tritonserver 2.51.0 with the python
backend running ONNX Runtime), the same requests sent with grpcio, each answer recorded. Where this
server deliberately answers differently, the test says so and docs/grpc.md lists it.
"""

from __future__ import annotations

import asyncio
import queue
import struct
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pbg
from tritonclient.utils import InferenceServerException

import model_builders as mb
from conftest import write_config
from serving import serve


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("grpc") / "models"
    mb.add_sub(repo / "add_sub" / "1" / "model.onnx")
    write_config(repo, "add_sub", """
        name: "add_sub"
        backend: "onnxruntime"
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        dynamic_batching { max_queue_delay_microseconds: 500 }
    """)
    mb.add_sub(repo / "simple" / "1" / "model.onnx", dtype="INT32")
    write_config(repo, "simple", """
        name: "simple"
        backend: "onnxruntime"
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
    """)
    mb.identity(repo / "strings" / "1" / "model.onnx", {"TEXT": ("BYTES", ["N", 3])}, ["ECHO"])
    write_config(repo, "strings", """
        name: "strings"
        backend: "onnxruntime"
        max_batch_size: 4
        input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 3 ] } ]
        output [ { name: "ECHO" data_type: TYPE_STRING dims: [ 3 ] } ]
    """)
    mb.identity(repo / "halves" / "1" / "model.onnx", {"H": ("FP16", ["N", 4])}, ["H_OUT"])
    write_config(repo, "halves", """
        name: "halves"
        backend: "onnxruntime"
        max_batch_size: 4
        input [ { name: "H" data_type: TYPE_FP16 dims: [ 4 ] } ]
        output [ { name: "H_OUT" data_type: TYPE_FP16 dims: [ 4 ] } ]
    """)
    mb.matmul_relu(repo / "versioned" / "1" / "model.onnx", size=8, batch=2, seed=1)
    mb.matmul_relu(repo / "versioned" / "2" / "model.onnx", size=8, batch=2, seed=2)
    write_config(repo, "versioned", """
        backend: "onnxruntime"
        max_batch_size: 0
        version_policy: { all { } }
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2, 8 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2, 8 ] } ]
    """)
    mb.identity(repo / "scores" / "1" / "model.onnx", {"LOGITS": ("FP32", ["N", 4])}, ["PROBS"])
    (repo / "scores" / "labels.txt").write_text("cat\ndog\nbird\nfish\n")
    write_config(repo, "scores", """
        backend: "onnxruntime"
        max_batch_size: 4
        input [ { name: "LOGITS" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "PROBS" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" } ]
    """)
    return repo


@pytest.fixture(scope="module")
def server(repository):
    with serve(repository, "--device", "cpu") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    c = grpcclient.InferenceServerClient(server.grpc)
    yield c
    c.close()


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(server.grpc) as channel:
        yield pbg.GRPCInferenceServiceStub(channel)


def _f32(n: int, value: float = 1.0) -> bytes:
    return np.full(n, value, np.float32).tobytes()


def _tensor(name: str, datatype: str, shape: list[int], **contents) -> pb.ModelInferRequest.InferInputTensor:
    tensor = pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape)
    for field, values in contents.items():
        getattr(tensor.contents, field).extend(values)
    return tensor


def _request(model="add_sub", shape=(1, 16), raw=None, inputs=None, version="", params=None, outputs=(), rid=""):
    request = pb.ModelInferRequest(model_name=model, model_version=version, id=rid)
    if inputs is None:
        for name in ("INPUT0", "INPUT1"):
            request.inputs.add(name=name, datatype="FP32", shape=shape)
        raw = [_f32(int(np.prod(shape)))] * 2 if raw is None else raw
    else:
        request.inputs.extend(inputs)
    request.raw_input_contents.extend(raw or [])
    for key, value in (params or {}).items():
        parameter = request.parameters[key]
        if isinstance(value, bool):
            parameter.bool_param = value
        elif isinstance(value, int):
            parameter.int64_param = value
        elif isinstance(value, float):
            parameter.double_param = value
        else:
            parameter.string_param = value
    for name in outputs:
        request.outputs.add(name=name)
    return request


def _bytes(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(x)) + x for x in items)


def _error(stub, method: str, request) -> tuple[str, str]:
    with pytest.raises(grpc.RpcError) as info:
        getattr(stub, method)(request, timeout=30)
    return info.value.code().name, info.value.details()


# (method, request, code, details): tritonserver 2.51's answers, measured (module doc).
MEASURED = {
    "model_metadata_unknown": ("ModelMetadata", pb.ModelMetadataRequest(name="nope"), "NOT_FOUND",
                               "Request for unknown model: 'nope' is not found"),
    "model_metadata_bad_version": ("ModelMetadata", pb.ModelMetadataRequest(name="add_sub", version="7"), "NOT_FOUND",
                                   "Request for unknown model: 'add_sub' version 7 is not found"),
    "model_metadata_not_a_number": (
        "ModelMetadata", pb.ModelMetadataRequest(name="add_sub", version="x"), "INVALID_ARGUMENT",
        "failed to get model version from specified version string 'x' (details: stol), version should be an "
        "integral value > 0"),
    "model_metadata_negative": ("ModelMetadata", pb.ModelMetadataRequest(name="add_sub", version="-1"),
                                "INVALID_ARGUMENT",
                                "invalid model version specified '-1' , version should be an integral value > 0"),
    "model_config_unknown": ("ModelConfig", pb.ModelConfigRequest(name="nope"), "NOT_FOUND",
                             "Request for unknown model: 'nope' is not found"),
    "statistics_unknown": ("ModelStatistics", pb.ModelStatisticsRequest(name="nope"), "INVALID_ARGUMENT",
                           "requested model 'nope' is not available"),
    "statistics_bad_version": ("ModelStatistics", pb.ModelStatisticsRequest(name="add_sub", version="7"),
                               "INVALID_ARGUMENT", "requested model version is not available for model 'add_sub'"),
    "index_repository_name": ("RepositoryIndex", pb.RepositoryIndexRequest(repository_name="other"), "UNIMPLEMENTED",
                              "'repository_name' specification is not supported"),
    "load": ("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="add_sub"), "UNAVAILABLE",
             "explicit model load / unload is not allowed if polling is enabled"),
    "unload": ("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name="add_sub"), "UNAVAILABLE",
               "explicit model load / unload is not allowed if polling is enabled"),
    "system_shm_status_name": ("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest(name="r"), "NOT_FOUND",
                               "Unable to find system shared memory region: 'r'"),
    "trace_unknown_model": ("TraceSetting", pb.TraceSettingRequest(model_name="nope"), "INVALID_ARGUMENT",
                            "Request for unknown model : nope"),
    "infer_unknown_model": ("ModelInfer", _request(model="nope"), "NOT_FOUND",
                            "Request for unknown model: 'nope' is not found"),
    "infer_bad_version": ("ModelInfer", _request(version="7"), "NOT_FOUND",
                          "Request for unknown model: 'add_sub' version 7 is not found"),
    "infer_raw_short": ("ModelInfer", _request(raw=[_f32(15), _f32(16)]), "INVALID_ARGUMENT",
                        "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'add_sub'. "
                        "Expected 64, got 60"),
    "infer_raw_long": ("ModelInfer", _request(raw=[_f32(17), _f32(16)]), "INVALID_ARGUMENT",
                       "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'add_sub'. "
                       "Expected 64, got 68"),
    "infer_raw_missing": ("ModelInfer", _request(raw=[_f32(16)]), "INVALID_ARGUMENT",
                          "unable to find data for input tensor 'INPUT1' for model 'add_sub' in request."),
    "infer_batch_too_big": ("ModelInfer", _request(shape=(9, 16)), "INVALID_ARGUMENT",
                            "[request id: <id_unknown>] inference request batch-size must be <= 8 for 'add_sub'"),
    "infer_no_inputs": ("ModelInfer", _request(inputs=[], raw=[]), "INVALID_ARGUMENT",
                        "[request id: <id_unknown>] expected 2 inputs but got 0 inputs for model 'add_sub'. Got "
                        "input(s) [], but missing required input(s) ['INPUT0','INPUT1']. Please provide all required "
                        "input(s)."),
    "infer_unknown_input": ("ModelInfer", _request(inputs=[_tensor("INPUT0", "FP32", [1, 16]),
                                                           _tensor("X", "FP32", [1, 16])], raw=[_f32(16)] * 2),
                            "INVALID_ARGUMENT", "unexpected inference input 'X' for model 'add_sub'"),
    "infer_duplicate_input": ("ModelInfer", _request(inputs=[_tensor("INPUT0", "FP32", [1, 16])] * 2,
                                                     raw=[_f32(16)] * 2),
                              "INVALID_ARGUMENT", "[request id: <id_unknown>] input 'INPUT0' already exists in request"),
    "infer_invalid_datatype": ("ModelInfer", _request(inputs=[_tensor("INPUT0", "FP99", [1, 16]),
                                                              _tensor("INPUT1", "FP32", [1, 16])], raw=[_f32(16)] * 2),
                               "INVALID_ARGUMENT", "[request id: <id_unknown>] inference input 'INPUT0' data-type is "
                               "'<invalid>', but model 'add_sub' expects 'FP32'"),
    "infer_wrong_datatype": ("ModelInfer", _request(inputs=[_tensor("INPUT0", "INT32", [1, 16]),
                                                            _tensor("INPUT1", "FP32", [1, 16])], raw=[_f32(16)] * 2),
                             "INVALID_ARGUMENT", "[request id: <id_unknown>] inference input 'INPUT0' data-type is "
                             "'INT32', but model 'add_sub' expects 'FP32'"),
    "infer_unknown_output": ("ModelInfer", _request(outputs=["NOPE"]), "INVALID_ARGUMENT",
                             "unexpected inference output 'NOPE' for model 'add_sub'"),
    "infer_typed_short": ("ModelInfer", _request(inputs=[_tensor("INPUT0", "FP32", [1, 16], fp32_contents=[1.0] * 15),
                                                         _tensor("INPUT1", "FP32", [1, 16], fp32_contents=[2.0] * 16)],
                                                 raw=[]),
                          "INVALID_ARGUMENT", "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' "
                          "for model 'add_sub'. Expected 64, got 60"),
    "infer_typed_wrong_field": ("ModelInfer", _request(inputs=[_tensor("INPUT0", "FP32", [1, 16], int_contents=[1] * 16),
                                                               _tensor("INPUT1", "FP32", [1, 16], fp32_contents=[2.0] * 16)],
                                                       raw=[]),
                                "INVALID_ARGUMENT", "unexpected explicit tensor data for input tensor 'INPUT0' for model "
                                "'add_sub' of type 'INT32', expected datatype 'FP32'"),
    "infer_typed_and_raw": ("ModelInfer", _request(inputs=[_tensor("INPUT0", "FP32", [1, 16], fp32_contents=[1.0] * 16),
                                                           _tensor("INPUT1", "FP32", [1, 16])], raw=[_f32(16)]),
                            "INVALID_ARGUMENT", "contents field must not be specified when using raw_input_contents for "
                            "'INPUT0' for model 'add_sub'"),
    "infer_typed_two_fields": ("ModelInfer", _request(inputs=[
        _tensor("INPUT0", "FP32", [1, 16], fp32_contents=[1.0] * 16, fp64_contents=[1.0] * 16),
        _tensor("INPUT1", "FP32", [1, 16], fp32_contents=[2.0] * 16)], raw=[]),
        "INVALID_ARGUMENT", "unexpected explicit tensor data for input tensor 'INPUT0' for model 'add_sub', binary data "
        "was already supplied."),
    "infer_no_data": ("ModelInfer", _request(inputs=[_tensor("INPUT0", "FP32", [1, 16]), _tensor("INPUT1", "FP32", [1, 16])],
                                             raw=[]),
                      "INVALID_ARGUMENT", "unable to find data for input tensor 'INPUT0' for model 'add_sub' in request."),
    "infer_reserved_parameter": ("ModelInfer", _request(params={"triton_x": 1}), "INVALID_ARGUMENT",
                                 "parameter keys starting with 'triton_' are reserved for Triton usage. Only the "
                                 "following keys starting with 'triton_' are allowed: triton_enable_empty_final_response"),
    "infer_sequence_id_bool": ("ModelInfer", _request(params={"sequence_id": True}), "INVALID_ARGUMENT",
                               "invalid value type for 'sequence_id' parameter, expected int64_param or string_param."),
    "infer_priority_negative": ("ModelInfer", _request(params={"priority": -1}), "INVALID_ARGUMENT",
                                "invalid value for 'priority', expected value >= 0."),
    "infer_timeout_string": ("ModelInfer", _request(params={"timeout": "x"}), "INVALID_ARGUMENT",
                             "invalid value type for 'timeout' parameter, expected int64_param."),
    "infer_half_typed": ("ModelInfer", _request(model="halves", inputs=[_tensor("H", "FP16", [1, 4], fp32_contents=[1.0] * 4)],
                                                raw=[]),
                         "INVALID_ARGUMENT", "unexpected explicit tensor data for input tensor 'H' for model 'halves' "
                         "of type 'FP32', expected datatype 'FP16'"),
    "infer_strings_fewer": ("ModelInfer", _request(model="strings", inputs=[_tensor("TEXT", "BYTES", [1, 3])],
                                                   raw=[_bytes([b"a", b"bc"])]),
                            "INVALID_ARGUMENT", "[request id: <id_unknown>] expected 3 string elements for inference "
                            "input 'TEXT' for model 'strings', got 2"),
    "infer_strings_more": ("ModelInfer", _request(model="strings", inputs=[_tensor("TEXT", "BYTES", [1, 3])],
                                                  raw=[_bytes([b"a", b"bc", b"d", b"e"])]),
                           "INVALID_ARGUMENT", "[request id: <id_unknown>] unexpected number of string elements 4 for "
                           "inference input 'TEXT' for model 'strings', expecting 3"),
    "infer_strings_truncated": ("ModelInfer", _request(model="strings", inputs=[_tensor("TEXT", "BYTES", [1, 3])],
                                                       raw=[_bytes([b"a", b"bc"]) + b"\x05\x00\x00\x00ab"]),
                                "INVALID_ARGUMENT", "incomplete string data for inference input 'TEXT', expecting string "
                                "of length 5 but only 2 bytes available"),
    "infer_strings_typed_count": ("ModelInfer", _request(model="strings", inputs=[
        _tensor("TEXT", "BYTES", [1, 3], bytes_contents=[b"a", b"bc"])], raw=[]),
        "INVALID_ARGUMENT", "[request id: <id_unknown>] expected 3 string elements for inference input 'TEXT' for "
        "model 'strings', got 2"),
    "infer_shared_memory_input": ("ModelInfer", None, "NOT_FOUND", "Unable to find shared memory region: 'reg'"),
    "log_settings_wrong_type": ("LogSettings", None, "INVALID_ARGUMENT", "expect boolean for 'log_info'"),
}


def _late_requests() -> None:
    request = _request()
    request.inputs[0].parameters["shared_memory_region"].string_param = "reg"
    request.inputs[0].parameters["shared_memory_byte_size"].int64_param = 64
    MEASURED["infer_shared_memory_input"] = (*MEASURED["infer_shared_memory_input"][:1], request,
                                             *MEASURED["infer_shared_memory_input"][2:])
    settings = pb.LogSettingsRequest()
    settings.settings["log_info"].string_param = "x"
    MEASURED["log_settings_wrong_type"] = ("LogSettings", settings, *MEASURED["log_settings_wrong_type"][2:])


_late_requests()


@pytest.mark.parametrize("case", sorted(MEASURED))
def test_errors_are_tritons(stub, case):
    method, request, code, details = MEASURED[case]
    assert _error(stub, method, request) == (code, details)


def test_health_metadata_and_readiness(client, stub):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("add_sub") and client.is_model_ready("versioned", "1")
    # measured: an unknown model or version is not ready (OK, ready=false), not an error
    assert not client.is_model_ready("nope") and not client.is_model_ready("add_sub", "7")
    assert _error(stub, "ModelReady", pb.ModelReadyRequest(name="add_sub", version="x"))[0] == "INVALID_ARGUMENT"
    metadata = client.get_server_metadata(as_json=True)
    assert metadata["name"] == "triton" and "binary_tensor_data" in metadata["extensions"]
    model = client.get_model_metadata("add_sub", as_json=True)
    assert model == {
        "name": "add_sub", "versions": ["1"], "platform": "onnxruntime_onnx",
        "inputs": [{"name": f"INPUT{i}", "datatype": "FP32", "shape": ["-1", "16"]} for i in (0, 1)],
        "outputs": [{"name": f"OUTPUT{i}", "datatype": "FP32", "shape": ["-1", "16"]} for i in (0, 1)],
    }
    assert client.get_model_metadata("versioned", as_json=True)["versions"] == ["1", "2"]
    config = client.get_model_config("add_sub").config
    assert config.max_batch_size == 8 and config.dynamic_batching.max_queue_delay_microseconds == 500
    assert [i.name for i in config.input] == ["INPUT0", "INPUT1"]


def test_repository_index_and_statistics(client, stub):
    index = client.get_model_repository_index(as_json=True)["models"]
    assert {(m["name"], m["version"], m["state"]) for m in index} >= {("add_sub", "1", "READY"), ("versioned", "2", "READY")}
    assert stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True)).models
    before = client.get_inference_statistics("simple").model_stats[0]
    inputs = [grpcclient.InferInput(f"INPUT{i}", [2, 16], "INT32") for i in (0, 1)]
    for tensor in inputs:
        tensor.set_data_from_numpy(np.ones((2, 16), np.int32))
    for _ in range(3):
        client.infer("simple", inputs)
    after = client.get_inference_statistics("simple").model_stats[0]
    assert after.inference_stats.success.count - before.inference_stats.success.count == 3
    assert after.inference_count - before.inference_count == 6
    everything = client.get_inference_statistics()
    assert {m.name for m in everything.model_stats} >= {"add_sub", "simple", "strings", "versioned"}


def test_unary_infer_raw_typed_and_bytes(client, stub):
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    b = np.full((1, 16), 2.0, np.float32)
    inputs = [grpcclient.InferInput("INPUT0", [1, 16], "FP32"), grpcclient.InferInput("INPUT1", [1, 16], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("add_sub", inputs, request_id="r1",
                          outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
    assert result.get_response().id == "r1"
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    # typed contents (what grpc_explicit_int_content_client.py sends)
    response = stub.ModelInfer(_request(model="simple", inputs=[
        _tensor("INPUT0", "INT32", [1, 16], int_contents=list(range(16))),
        _tensor("INPUT1", "INT32", [1, 16], int_contents=[1] * 16)], raw=[]))
    outputs = {o.name: np.frombuffer(raw, np.int32) for o, raw in zip(response.outputs, response.raw_output_contents)}
    np.testing.assert_array_equal(outputs["OUTPUT0"], np.arange(16) + 1)
    np.testing.assert_array_equal(outputs["OUTPUT1"], np.arange(16) - 1)
    # BYTES, raw and typed, empty elements included
    strings = np.array([[b"a", b"", b"\xe2\x82\xac"]], dtype=object)
    text = grpcclient.InferInput("TEXT", [1, 3], "BYTES")
    text.set_data_from_numpy(strings)
    np.testing.assert_array_equal(client.infer("strings", [text]).as_numpy("ECHO"), strings)
    response = stub.ModelInfer(_request(model="strings", inputs=[
        _tensor("TEXT", "BYTES", [1, 3], bytes_contents=[b"a", b"bc", b""])], raw=[]))
    assert response.raw_output_contents[0] == _bytes([b"a", b"bc", b""])
    # FP16 (raw only: gRPC has no typed field for it)
    halves = np.array([[0.5, -1.0, 2.0, 65504.0]], np.float16)
    h = grpcclient.InferInput("H", [1, 4], "FP16")
    h.set_data_from_numpy(halves)
    np.testing.assert_array_equal(client.infer("halves", [h]).as_numpy("H_OUT"), halves)
    # a version chosen by the request
    x = grpcclient.InferInput("INPUT0", [2, 8], "FP32")
    x.set_data_from_numpy(np.ones((2, 8), np.float32))
    one = client.infer("versioned", [x], model_version="1").as_numpy("OUTPUT0")
    two = client.infer("versioned", [x], model_version="2").as_numpy("OUTPUT0")
    assert not np.array_equal(one, two)


def test_classification_and_parameters(client, stub):
    logits = grpcclient.InferInput("LOGITS", [1, 4], "FP32")
    logits.set_data_from_numpy(np.array([[0.1, 0.7, 0.05, 0.15]], np.float32))
    result = client.infer("scores", [logits], outputs=[grpcclient.InferRequestedOutput("PROBS", class_count=2)])
    assert result.as_numpy("PROBS").tolist() == [[b"0.700000:1:dog", b"0.150000:3:fish"]]
    # parameters Triton accepts reach the model; unset or uint64 values are refused (measured)
    assert stub.ModelInfer(_request(params={"custom": "x", "n": 3, "f": 1.5})).model_name == "add_sub"
    request = _request()
    request.parameters["u"].uint64_param = 5
    assert _error(stub, "ModelInfer", request) == (
        "INVALID_ARGUMENT", "invalid value type for 'u' parameter, expected int64_param, bool_param, or string_param.")


def test_settings_and_shared_memory(client, stub):
    log = client.get_log_settings(as_json=True)["settings"]
    assert set(log) == {"log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format"}
    changed = client.update_log_settings({"log_verbose_level": 1}, as_json=True)["settings"]
    assert changed["log_verbose_level"]["uint32_param"] == 1
    client.update_log_settings({"log_verbose_level": 0})
    assert _error(stub, "LogSettings", _log_request("log_file", "x.log")) == (
        "UNIMPLEMENTED", "log file location can not be updated through network protocol")
    trace = client.get_trace_settings(as_json=True)["settings"]
    assert trace["trace_level"]["value"] == ["OFF"] and trace["trace_rate"]["value"] == ["1000"]
    # tritonserver without tracing configured refuses to turn it on too (there: no trace file)
    with pytest.raises(InferenceServerException) as info:
        client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
    assert info.value.status() == "StatusCode.UNIMPLEMENTED" and "does not trace" in info.value.message()
    assert client.get_system_shared_memory_status(as_json=True) == {}
    client.unregister_system_shared_memory()
    with pytest.raises(InferenceServerException) as info:
        client.register_system_shared_memory("r", "/key", 64)
    # deliberate: tritonserver tries to open the region (INTERNAL); here no client shares the host
    assert info.value.status() == "StatusCode.UNIMPLEMENTED" and "not supported" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.register_cuda_shared_memory("r", b"aGFuZGxl", 0, 64)
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"


def _log_request(key: str, value: str) -> pb.LogSettingsRequest:
    request = pb.LogSettingsRequest()
    request.settings[key].string_param = value
    return request


def test_async_callback_and_aio_clients(server):
    client = grpcclient.InferenceServerClient(server.grpc)
    results: queue.Queue = queue.Queue()
    inputs = [grpcclient.InferInput(f"INPUT{i}", [1, 16], "FP32") for i in (0, 1)]
    for k, tensor in enumerate(inputs):
        tensor.set_data_from_numpy(np.full((1, 16), k + 1, np.float32))
    for n in range(8):
        client.async_infer("add_sub", inputs, lambda result, error: results.put((result, error)), request_id=str(n))
    answers = [results.get(timeout=30) for _ in range(8)]
    assert all(error is None for _, error in answers)
    assert sorted(int(r.get_response().id) for r, _ in answers) == list(range(8))
    assert all((r.as_numpy("OUTPUT0") == 3).all() for r, _ in answers)
    client.close()

    async def aio() -> list:
        async with aioclient.InferenceServerClient(server.grpc) as c:
            assert await c.is_server_ready()
            answers = await asyncio.gather(*(c.infer("add_sub", inputs, request_id=str(n)) for n in range(8)))
            return [(a.get_response().id, a.as_numpy("OUTPUT1")) for a in answers]

    for n, (rid, diff) in enumerate(asyncio.run(aio())):
        assert rid == str(n) and (diff == -1).all()


def test_stream_answers_in_request_order_with_errors_inline(server):
    """Non-decoupled responses come back in request order, each marked final; an error answers
    its own request and the stream goes on (tritonserver's stream, measured)."""
    client = grpcclient.InferenceServerClient(server.grpc)
    answers: queue.Queue = queue.Queue()
    client.start_stream(lambda result, error: answers.put((result, error)))
    good = [grpcclient.InferInput(f"INPUT{i}", [1, 16], "FP32") for i in (0, 1)]
    for tensor in good:
        tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
    for n in range(6):
        client.async_stream_infer("add_sub", good, request_id=f"s{n}")
    client.async_stream_infer("nope", good, request_id="bad")
    client.async_stream_infer("add_sub", good, request_id="last", enable_empty_final_response=True)
    received = [answers.get(timeout=30) for _ in range(8)]
    client.stop_stream()
    client.close()
    ids = [r.get_response().id if r is not None else None for r, _ in received]
    assert ids[:6] == [f"s{n}" for n in range(6)] and ids[7] == "last"
    result, error = received[6]
    assert result is None and "Request for unknown model: 'nope' is not found" in str(error)
    final = received[7][0].get_response().parameters["triton_final_response"]
    assert final.bool_param is True


def test_grpc_health_service(server):
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(server.grpc) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService"):
            answer = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as info:
            health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
        assert info.value.code() == grpc.StatusCode.NOT_FOUND


def test_rest_and_grpc_share_statistics(server, client):
    """One runtime behind both ports: requests over gRPC and REST land in the same counters."""
    import json
    import urllib.request

    def count() -> int:
        with urllib.request.urlopen(f"{server.http}/v2/models/halves/stats") as r:
            return json.load(r)["model_stats"][0]["inference_stats"]["success"]["count"]

    before = count()
    h = grpcclient.InferInput("H", [1, 4], "FP16")
    h.set_data_from_numpy(np.ones((1, 4), np.float16))
    client.infer("halves", [h])
    body = json.dumps({"inputs": [{"name": "H", "datatype": "FP16", "shape": [1, 4], "data": [1, 1, 1, 1]}]}).encode()
    urllib.request.urlopen(urllib.request.Request(f"{server.http}/v2/models/halves/infer", data=body)).read()
    assert count() - before == 2
    assert client.get_inference_statistics("halves").model_stats[0].inference_stats.success.count == count()


def test_ports_like_tritonserver(repository):
    """HTTP, gRPC and metrics ports as tritonserver's (each optional; a busy port fails start-up
    with a clear message); the metrics port serves GET /metrics only."""
    import socket
    import subprocess
    import sys
    import urllib.error
    import urllib.request

    from serving import ROOT, free_port

    metrics_port = free_port()
    with serve(repository, "--device", "cpu", "--model", "halves", "--metrics-port", str(metrics_port)) as s:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as r:
            assert b"nv_inference_request_success" in r.read()
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/v2/health/ready", timeout=10)
        assert info.value.code == 404
        with urllib.request.urlopen(f"{s.http}/metrics", timeout=10) as r:  # also on the HTTP port
            assert r.status == 200
        assert "gRPC 127.0.0.1:" in s.output() and f"metrics http://127.0.0.1:{metrics_port}/metrics" in s.output()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        out = subprocess.run(
            [sys.executable, "-m", "toolkit.cli", "serve", str(repository), "--model", "halves", "--device", "cpu",
             "--http-port", str(free_port()), "--grpc-port", str(port), "--metrics-port", "0"],
            capture_output=True, text=True, cwd=ROOT, timeout=120,
        )
    assert out.returncode == 1 and f"cannot listen for gRPC on 127.0.0.1:{port}" in out.stderr, out.stderr
    with serve(repository, "--device", "cpu", "--model", "halves", "--grpc-port", "0") as s:
        assert s.grpc_port == 0 and "gRPC" not in s.output()
