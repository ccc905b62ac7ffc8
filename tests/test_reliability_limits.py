"""Request limits with safe defaults (handlers/limits.py), error bodies without stack traces, and
names and paths that cannot leave the repository.

The runtime runs as a process with small limits (TOOLKIT_MAX_REQUEST_BYTES=1 MiB,
TOOLKIT_MAX_TENSOR_ELEMENTS=4096) so that the 413s are cheap to reach; the defaults are checked
on `Limits` itself. Lambda's own 6 MB limits: requests over 6 MB never reach the handler (Lambda
answers 413 itself); responses over it get a clear 413 from the handler
(tests/test_aws_lambda.py::test_oversize_response_is_a_clear_413), and the limits here apply
through the Lambda handler too (test below).
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import model_builders as mb
from conftest import write_config
from test_reliability_harness import (
    ROOT,
    RawClient,
    compile_manifest,
    error_message,
    python_model,
    runtime,
)

LIMIT_ENV = {"TOOLKIT_MAX_REQUEST_BYTES": str(1 << 20), "TOOLKIT_MAX_TENSOR_ELEMENTS": "4096"}

WRONG_OUTPUT_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Declares an FP32 output and returns text in it: a model bug the runtime must survive."""

    def execute(self, requests):
        out = np.array([["not a number"]], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", out)]) for _ in requests]
'''


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("limits") / "models"
    mb.identity(repo / "vector" / "1" / "model.onnx", {"X": ("FP32", ["N", -1])}, ["Y"])
    write_config(repo, "vector", """
        backend: "onnxruntime"
        max_batch_size: 4
        input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ]
    """)
    python_model(repo, "wrong_output", WRONG_OUTPUT_MODEL, """
        backend: "python"
        max_batch_size: 0
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1, 1 ] } ]
    """)
    return repo


@pytest.fixture(scope="module")
def server(repo):
    with runtime(compile_manifest(repo), env=LIMIT_ENV) as running:
        yield running


def vector_body(count: int, binary: bool = True) -> tuple[bytes, dict[str, str]]:
    x = np.arange(count, dtype=np.float32).reshape(1, count)
    tensor: dict = {"name": "X", "datatype": "FP32", "shape": [1, count]}
    if not binary:
        tensor["data"] = x.ravel().tolist()
        return json.dumps({"inputs": [tensor]}).encode(), {}
    tensor["parameters"] = {"binary_data_size": x.nbytes}
    header = json.dumps({"inputs": [tensor]}).encode()
    return header + x.tobytes(), {"Inference-Header-Content-Length": str(len(header))}


def test_default_limits_and_bad_values():
    from handlers.limits import DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_TENSOR_ELEMENTS, Limits

    assert Limits.from_environment({}) == Limits(64 * 1024 * 1024, 1 << 26)
    assert (DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_TENSOR_ELEMENTS) == (67_108_864, 67_108_864)
    assert Limits.from_environment({"TOOLKIT_MAX_REQUEST_BYTES": "6_291_456"}).max_request_bytes == 6_291_456
    for bad in ("abc", "0", "-5", "1.5"):
        with pytest.raises(ValueError, match=f"TOOLKIT_MAX_TENSOR_ELEMENTS must be a positive integer, got '{bad}'"):
            Limits.from_environment({"TOOLKIT_MAX_TENSOR_ELEMENTS": bad})


def test_bad_limit_fails_startup_with_its_name(repo, tmp_path):
    env = {**os.environ, "TOOLKIT_MANIFEST": str(repo / "models.json"), "TOOLKIT_MAX_REQUEST_BYTES": "lots",
           "PORT": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-m", "handlers.entrypoints.container"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "TOOLKIT_MAX_REQUEST_BYTES must be a positive integer, got 'lots'" in done.stderr


def test_declared_body_over_the_limit_is_413_before_it_is_read(server):
    client = RawClient(server.port)
    body, headers = vector_body(300_000)  # 1.2 MB > 1 MiB
    started = time.perf_counter()
    status, _, payload = client.request("POST", "/v2/models/vector/infer", body, headers)
    assert status == 413
    assert error_message(payload) == (
        f"request body of {len(body)} bytes exceeds the limit of 1048576 bytes; send a smaller batch, or raise "
        "TOOLKIT_MAX_REQUEST_BYTES"
    )
    assert time.perf_counter() - started < 10
    # the rest of the body was discarded: the same connection serves the next request
    small, small_headers = vector_body(4)
    status, _, payload = client.request("POST", "/v2/models/vector/infer", small, small_headers)
    assert status == 200 and len(payload) > 0
    client.close()


def test_chunked_body_over_the_limit_is_413(server):
    import http.client

    body, headers = vector_body(300_000)
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    chunks = (body[i : i + 65536] for i in range(0, len(body), 65536))
    connection.request("POST", "/v2/models/vector/infer", body=chunks, headers=headers, encode_chunked=True)
    response = connection.getresponse()
    assert response.status == 413
    assert error_message(response.read()).startswith("request body exceeds the limit of 1048576 bytes")
    connection.close()


def test_compressed_body_inflating_over_the_limit_is_413(server):
    header = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2_000_000],
                                     "parameters": {"binary_data_size": 8_000_000}}]}).encode()
    headers = {"Inference-Header-Content-Length": str(len(header))}
    bomb = gzip.compress(header + bytes(8_000_000))  # a few kB that inflate to 8 MB
    assert len(bomb) < 100_000
    status, _, payload = RawClient(server.port).request(
        "POST", "/v2/models/vector/infer", bomb, {**headers, "Content-Encoding": "gzip"})
    assert status == 413
    assert error_message(payload) == (
        "request body inflates to more than the limit of 1048576 bytes; send a smaller batch, or raise "
        "TOOLKIT_MAX_REQUEST_BYTES"
    )


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tensor_element_limit_is_413(server, binary):
    client = RawClient(server.port)
    body, headers = vector_body(4097, binary)
    status, _, payload = client.request("POST", "/v2/models/vector/infer", body, headers)
    assert status == 413
    assert error_message(payload) == (
        "input 'X' has 4097 elements, more than the limit of 4096 per tensor; send a smaller batch, or raise "
        "TOOLKIT_MAX_TENSOR_ELEMENTS"
    )
    body, headers = vector_body(4096, binary)
    assert client.request("POST", "/v2/models/vector/infer", body, headers)[0] == 200


def test_huge_declared_shapes_are_refused_without_allocating(server):
    client = RawClient(server.port)
    before = server.rss()
    for shape in ([1, 2**40], [2**31, 2**31], [1, 2**63 - 1], [0, 2**64 - 1]):
        body = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": shape, "data": [1.0]}]}).encode()
        status, _, payload = client.request("POST", "/v2/models/vector/infer", body)
        assert status == 400, payload
        error_message(payload)
    header = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 2**40],
                                     "parameters": {"binary_data_size": 16}}]}).encode()
    status, _, payload = client.request("POST", "/v2/models/vector/infer", header + bytes(16),
                                        {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400 and "Expected 4398046511104, got 16" in error_message(payload)
    assert server.rss() - before < 32 << 20  # nothing sized by the declared shape was allocated


def test_model_bug_answers_500_without_a_stack_trace(server):
    body = json.dumps({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [1.0]}]}).encode()
    status, _, payload = RawClient(server.port).request("POST", "/v2/models/wrong_output/infer", body)
    assert status == 500
    message = error_message(payload)
    assert "Traceback" not in message and 'File "' not in message and "/handlers/" not in message
    assert server.alive()
    # the operator gets the error, in the log (a 5xx is the model's or the server's fault)
    assert "inference of model 'wrong_output' failed (500)" in server.output()
    assert "could not convert string to float" in server.output()


@pytest.mark.parametrize("path", [
    "/v2/models/..%2F..%2Fetc%2Fpasswd/config",
    "/v2/models/%2e%2e/config",
    "/v2/models/../../etc/passwd/config",
    "/v2/models/vector%2F..%2F..%2Fwrong_output/config",
    "/v2/models/%00/infer",
    "/v2/models/models.json/config",
    "/v2/models/vector%2Fconfig.pbtxt/config",
])
def test_model_names_cannot_reach_files(server, path):
    """Model names are looked up among the served models, never used as paths."""
    method = "POST" if path.endswith("/infer") else "GET"
    status, _, payload = RawClient(server.port).request(method, path, b"{}" if method == "POST" else None)
    assert status == 404, payload
    message = error_message(payload)
    assert message == "Not Found" or message.startswith("Request for unknown model: "), message


def test_warmup_and_label_files_cannot_leave_the_model_directory(tmp_path):
    """The runtime joins `input_data_file` and `label_filename` as Triton's JoinPath does (a
    leading '/' stays inside the model directory) and refuses what resolves outside it, like the
    compiler (handlers/config/warmup.py; tests/test_validation_oracle.py covers the compile
    side of warmup files)."""
    from handlers.manifest import ModelSpec
    from handlers.model_repository import LoadedModel
    from handlers.warmup import WarmupError, warmup_samples

    secret = tmp_path / "secret.bin"
    secret.write_bytes(np.arange(4, dtype=np.float32).tobytes())
    model_dir = tmp_path / "models" / "m"
    (model_dir / "warmup").mkdir(parents=True)
    (model_dir / "warmup" / "inside.bin").write_bytes(np.ones(4, np.float32).tobytes())
    (model_dir / "labels.txt").write_text("a\nb\n")

    def spec(data_file: str | None = None, label_file: str | None = None) -> ModelSpec:
        config = {
            "name": "m", "max_batch_size": 0,
            "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [4]}],
            "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [4], **({"label_filename": label_file} if label_file else {})}],
        }
        if data_file:
            config["model_warmup"] = [{"name": "w", "batch_size": 1, "inputs": {
                "X": {"data_type": "TYPE_FP32", "dims": [4], "input_data_file": data_file}}}]
        return ModelSpec("m", model_dir, (1,), {}, config)

    assert warmup_samples(spec("inside.bin"))[0].inputs["X"].tolist() == [1.0] * 4
    assert warmup_samples(spec("/inside.bin"))[0].inputs["X"].tolist() == [1.0] * 4  # JoinPath, not absolute
    with pytest.raises(WarmupError, match="outside the model's warmup directory"):
        warmup_samples(spec("../../secret.bin"))
    with pytest.raises(FileNotFoundError):  # looked for under warmup/, never at the absolute path
        warmup_samples(spec(str(secret)))
    (model_dir / "warmup" / "link.bin").symlink_to(secret)
    with pytest.raises(WarmupError, match="outside the model's warmup directory"):
        warmup_samples(spec("link.bin"))

    model = LoadedModel(spec(label_file="labels.txt"), 1)
    model.load_labels()
    assert model.labels == {"Y": ["a", "b"]}
    with pytest.raises(RuntimeError, match="outside the model directory"):
        LoadedModel(spec(label_file="../../secret.bin"), 1).load_labels()
    with pytest.raises(FileNotFoundError) as missing:  # under the model directory, not the absolute path
        LoadedModel(spec(label_file=str(secret)), 1).load_labels()
    assert Path(missing.value.filename).is_relative_to(model_dir.resolve())


def test_limits_apply_through_the_lambda_handler(repo, monkeypatch):
    from handlers import limits
    from handlers.entrypoints.lambda_handler import LambdaHandler
    from handlers.manifest import Manifest

    monkeypatch.setattr(limits, "LIMITS", limits.Limits(max_request_bytes=4096, max_tensor_elements=64))
    handler = LambdaHandler.from_manifest(Manifest.load(repo / "models.json"))
    try:
        def event(body: bytes, headers: dict) -> dict:
            return {
                "version": "2.0", "routeKey": "$default", "rawPath": "/v2/models/vector/infer", "rawQueryString": "",
                "headers": {"host": "x.lambda-url.us-east-1.on.aws", **headers},
                "requestContext": {"http": {"method": "POST", "path": "/v2/models/vector/infer", "protocol": "HTTP/1.1",
                                            "sourceIp": "203.0.113.7", "userAgent": "t"},
                                   "requestId": "r", "routeKey": "$default", "stage": "$default"},
                "body": base64.b64encode(body).decode(), "isBase64Encoded": True,
            }

        body, headers = vector_body(2000)
        response = handler(event(body, headers), None)
        assert response["statusCode"] == 413 and "exceeds the limit of 4096 bytes" in json.loads(response["body"])["error"]
        body, headers = vector_body(65)
        response = handler(event(gzip.compress(body), {**headers, "content-encoding": "gzip"}), None)
        assert response["statusCode"] == 413 and "65 elements" in json.loads(response["body"])["error"]
        body, headers = vector_body(64)
        assert handler(event(body, headers), None)["statusCode"] == 200
    finally:
        handler.repository.stop(drain=False)
