"""Triton's logging, trace and shared-memory extensions over REST, answering as the gRPC service
does (tests/test_grpc_protocol.py): tritonclient.http's own calls, unchanged, against `toolkit
serve`. Clients copied from Triton's shared-memory examples unregister every region first; that
now succeeds over HTTP too, and `register` fails with the reason."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from python_models.repository import python_model
from serving import serve
from tritonclient.utils import InferenceServerException

IDENTITY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("http-admin") / "models"
    python_model(repo, "identity", None, """
        name: "identity"
        backend: "python"
        max_batch_size: 0
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]
        """, source=IDENTITY)
    with serve(repo, "--device", "cpu") as running:
        yield running


@pytest.fixture
def client(server):
    client = httpclient.InferenceServerClient(server.url)
    yield client
    client.close()


def _raw(server, method: str, path: str, body: bytes | None = None) -> tuple[int, str]:
    request = urllib.request.Request(f"{server.http}{path}", data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_log_settings_are_read_and_changed_and_both_protocols_see_one_setting(server, client):
    settings = client.get_log_settings()
    assert set(settings) == {"log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format"}
    assert settings["log_file"] == "" and settings["log_format"] == "default"
    changed = client.update_log_settings({"log_verbose_level": 1, "log_format": "ISO8601"})
    assert changed["log_verbose_level"] == 1 and changed["log_format"] == "ISO8601"
    grpc = grpcclient.InferenceServerClient(server.grpc)
    try:
        seen = grpc.get_log_settings(as_json=True)["settings"]
        assert seen["log_verbose_level"]["uint32_param"] == 1 and seen["log_format"]["string_param"] == "ISO8601"
    finally:
        grpc.close()
    assert client.update_log_settings({"log_verbose_level": 0, "log_format": "default"})["log_verbose_level"] == 0
    with pytest.raises(InferenceServerException) as caught:
        client.update_log_settings({"log_file": "x.log"})
    assert caught.value.status() == "501"
    assert "log file location can not be updated through network protocol" in caught.value.message()
    with pytest.raises(InferenceServerException, match="expect boolean for 'log_info'"):
        client.update_log_settings({"log_info": "yes"})
    assert _raw(server, "POST", "/v2/logging", b"[1]")[0] == 400


def test_trace_settings_read_as_tritonservers_without_tracing_and_refuse_changes(client):
    expected = {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1", "log_frequency": "0",
                "trace_file": "", "trace_mode": "triton"}
    assert client.get_trace_settings() == expected
    assert client.get_trace_settings(model_name="identity") == expected
    assert client.update_trace_settings(settings={"trace_rate": "1000"}) == expected  # no change
    with pytest.raises(InferenceServerException) as caught:
        client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
    assert caught.value.status() == "501" and "this server does not trace requests" in caught.value.message()
    with pytest.raises(InferenceServerException, match="Request for unknown model : nowhere"):
        client.get_trace_settings(model_name="nowhere")


def test_shared_memory_status_and_unregister_answer_and_register_says_why_not(server, client):
    assert client.get_system_shared_memory_status() == []
    assert client.get_cuda_shared_memory_status() == []
    client.unregister_system_shared_memory()
    client.unregister_system_shared_memory("region0")
    client.unregister_cuda_shared_memory()
    with pytest.raises(InferenceServerException) as caught:
        client.register_system_shared_memory("region0", "/key0", 64)
    assert caught.value.status() == "501"
    assert caught.value.message().startswith("system shared memory is not supported by this server")
    with pytest.raises(InferenceServerException, match="CUDA shared memory is not supported by this server"):
        client.register_cuda_shared_memory("region0", b"aGFuZGxl", 0, 64)
    status, body = _raw(server, "GET", "/v2/systemsharedmemory/region/r1/status")
    assert (status, json.loads(body)) == (404, {"error": "Unable to find system shared memory region: 'r1'"})
    status, body = _raw(server, "GET", "/v2/cudasharedmemory/region/r1/status")
    assert (status, json.loads(body)) == (404, {"error": "Unable to find cuda shared memory region: 'r1'"})
