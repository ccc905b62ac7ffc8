"""The Lambda handler with real Function URL / API Gateway v2 / v1 event documents.

Requests are built by tritonclient's own encoder and responses decoded by tritonclient's
InferResult, so the bytes are what real clients send and read. No Lambda service runs here: the
events are the documented payload formats handed to the handler as Lambda's runtime would.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.http import InferResult
from tritonclient.http._utils import _get_inference_request

import model_builders as mb
from conftest import write_config
from handlers.entrypoints.lambda_handler import LambdaHandler
from toolkit.repository.compile import compile_repository
from handlers.manifest import Manifest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def manifest_path(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("lambda") / "models"
    mb.add_sub(repo / "add_sub" / "1" / "model.onnx", dims=("N", "M"))
    write_config(repo, "add_sub", """
        backend: "onnxruntime"
        max_batch_size: 64
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
                { name: "INPUT1" data_type: TYPE_FP32 dims: [ -1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] },
                 { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ -1 ] } ]
        dynamic_batching { max_queue_delay_microseconds: 100000 }
        instance_group [ { count: 1 kind: KIND_GPU } ]
    """)
    result = compile_repository(repo, device="cpu")
    assert result.ok, result.failures
    return result.write_manifest(repo / "models.json")


@pytest.fixture(scope="module")
def handler(manifest_path):
    h = LambdaHandler.from_manifest(Manifest.load(manifest_path))
    yield h
    h.repository.stop()


def _infer_body(a: np.ndarray, b: np.ndarray, binary: bool) -> tuple[bytes, int | None]:
    inputs = [httpclient.InferInput("INPUT0", a.shape, "FP32"), httpclient.InferInput("INPUT1", b.shape, "FP32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
    body, json_size = _get_inference_request(inputs, "req-7", outputs, 0, False, False, 0, None, None)
    return body, json_size


def function_url_event(method: str, path: str, body: bytes | None = None, headers: dict | None = None) -> dict:
    encoded = body is not None and not body.isascii()
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": "",
        "headers": {"host": "abcdefg.lambda-url.us-east-1.on.aws", "user-agent": "tritonclient", **(headers or {})},
        "requestContext": {
            "accountId": "123456789012",
            "apiId": "abcdefg",
            "domainName": "abcdefg.lambda-url.us-east-1.on.aws",
            "domainPrefix": "abcdefg",
            "http": {"method": method, "path": path, "protocol": "HTTP/1.1", "sourceIp": "203.0.113.7", "userAgent": "tritonclient"},
            "requestId": "c6af9ac6-7b61-11e6-9a41-93e8deadbeef",
            "routeKey": "$default",
            "stage": "$default",
            "time": "22/Nov/2026:07:00:00 +0000",
            "timeEpoch": 1795331200000,
        },
        "body": (base64.b64encode(body).decode() if encoded else body.decode()) if body is not None else None,
        "isBase64Encoded": encoded,
    }


def api_gateway_v1_event(method: str, path: str, body: bytes | None = None, headers: dict | None = None) -> dict:
    encoded = body is not None and not body.isascii()
    all_headers = {"Host": "abc.execute-api.us-east-1.amazonaws.com", **(headers or {})}
    return {
        "resource": "/{proxy+}",
        "path": path,
        "httpMethod": method,
        "headers": all_headers,
        "multiValueHeaders": {k: [v] for k, v in all_headers.items()},
        "queryStringParameters": None,
        "multiValueQueryStringParameters": None,
        "pathParameters": {"proxy": path.lstrip("/")},
        "stageVariables": None,
        "requestContext": {
            "resourcePath": "/{proxy+}",
            "httpMethod": method,
            "path": f"/prod{path}",
            "stage": "prod",
            "requestId": "d0d37a8f-0000-4f4e-b7f2-0123456789ab",
            "identity": {"sourceIp": "203.0.113.7", "userAgent": "tritonclient"},
            "accountId": "123456789012",
            "apiId": "abc",
        },
        "body": (base64.b64encode(body).decode() if encoded else body.decode()) if body is not None else None,
        "isBase64Encoded": encoded,
    }


def _read(response: dict) -> tuple[bytes, dict]:
    body = response["body"] or ""
    raw = base64.b64decode(body) if response.get("isBase64Encoded") else body.encode()
    headers = {k.lower(): v for k, v in (response.get("headers") or {}).items()}
    return raw, headers


@pytest.mark.parametrize("event_kind", ["function_url", "api_gateway_v1"])
@pytest.mark.parametrize("binary", [True, False])
def test_infer_through_events(handler, event_kind, binary):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.full((2, 3), 0.5, np.float32)
    body, json_size = _infer_body(a, b, binary)
    headers = {"content-type": "application/octet-stream" if binary else "application/json"}
    if json_size is not None:
        headers["inference-header-content-length"] = str(json_size)
    make = function_url_event if event_kind == "function_url" else api_gateway_v1_event
    response = handler(make("POST", "/v2/models/add_sub/infer", body, headers), None)
    assert response["statusCode"] == 200
    raw, out_headers = _read(response)
    assert response["isBase64Encoded"] is binary
    length = out_headers.get("inference-header-content-length")
    result = InferResult.from_response_body(raw, header_length=int(length) if length else None)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    assert result.get_response()["id"] == "req-7"


def test_metadata_health_and_errors(handler):
    ready = handler(function_url_event("GET", "/v2/health/ready"), None)
    assert ready["statusCode"] == 200
    meta = handler(function_url_event("GET", "/v2/models/add_sub"), None)
    assert json.loads(meta["body"])["inputs"][0]["shape"] == [-1, -1]
    config = json.loads(handler(function_url_event("GET", "/v2/models/add_sub/config"), None)["body"])
    # KIND_GPU compiled for the CPU-only Lambda target
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    missing = handler(function_url_event("GET", "/v2/models/nope"), None)
    assert missing["statusCode"] == 404
    assert json.loads(missing["body"]) == {"error": "Request for unknown model: 'nope' is not found"}
    bad = handler(function_url_event("POST", "/v2/models/add_sub/infer", b"{not json", {"content-type": "application/json"}), None)
    assert bad["statusCode"] == 400 and "error" in json.loads(bad["body"])


def test_oversize_response_is_a_clear_413(handler):
    # 2 x 64 x 20,000 FP32 in binary = 10 MB of output, 13.6 MB in base64: over Lambda's 6 MB
    a = np.ones((64, 20_000), np.float32)
    body, json_size = _infer_body(a, a, True)
    headers = {"content-type": "application/octet-stream", "inference-header-content-length": str(json_size)}
    response = handler(function_url_event("POST", "/v2/models/add_sub/infer", body, headers), None)
    assert response["statusCode"] == 413
    error = json.loads(response["body"])["error"]
    assert "6 MB" in error and "smaller batch" in error and "Cloud Run" in error


def test_no_queue_delay_on_lambda(handler):
    # max_queue_delay_microseconds is 100 ms in the config; on Lambda a lone request must not wait
    import time

    a = np.ones((1, 4), np.float32)
    body, json_size = _infer_body(a, a, True)
    headers = {"content-type": "application/octet-stream", "inference-header-content-length": str(json_size)}
    handler(function_url_event("POST", "/v2/models/add_sub/infer", body, headers), None)
    started = time.perf_counter()
    for _ in range(5):
        assert handler(function_url_event("POST", "/v2/models/add_sub/infer", body, headers), None)["statusCode"] == 200
    assert (time.perf_counter() - started) / 5 < 0.1


def test_module_loads_models_once_at_import(manifest_path):
    """The module as Lambda's runtime imports it: models load in init, never per invocation."""
    script = r"""
import json, sys
from handlers.entrypoints import aws_lambda as entry
from handlers.model_repository import ModelRepository
loads = []
original = ModelRepository.load
ModelRepository.load = lambda self, **kw: (loads.append(1), original(self, **kw))[1]
event = json.loads(sys.argv[1])
codes = [entry.handler(event, None)["statusCode"] for _ in range(25)]
model = entry.handler.repository.get("add_sub")
print(json.dumps({"codes": sorted(set(codes)), "loads_after_import": len(loads),
                  "invocations": entry.handler.invocations, "instances": len(model.instances)}))
"""
    event = function_url_event("GET", "/v2/models/add_sub/ready")
    env = {**os.environ, "TOOLKIT_MANIFEST": str(manifest_path), "TOOLKIT_LOG_LEVEL": "warning"}
    out = subprocess.run([sys.executable, "-c", script, json.dumps(event)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # loaded during import (before the patch could see it), never again over 25 invocations
    assert result == {"codes": [200], "loads_after_import": 0, "invocations": 25, "instances": 1}


LAZY_APP_SCRIPT = r"""
import json, sys
from handlers.entrypoints import aws_lambda as entry
seen = {"after_init": "fastapi" in sys.modules}
infer, ready = json.loads(sys.argv[1]), json.loads(sys.argv[2])
answer = entry.handler(infer, None)
seen["after_infer"] = "fastapi" in sys.modules
seen["infer_status"] = answer["statusCode"]
seen["outputs"] = json.loads(answer["body"])["outputs"][0]["data"]
seen["ready_status"] = entry.handler(ready, None)["statusCode"]
seen["after_ready"] = "fastapi" in sys.modules
print(json.dumps(seen))
"""


@pytest.mark.parametrize("initialization", ["on-demand", "provisioned-concurrency", "snap-start"])
def test_on_demand_init_makes_the_app_only_when_an_event_needs_it(manifest_path, initialization):
    """Lambda's init as its runtime runs it: on an on-demand init, inference events take the direct
    path and FastAPI is not even imported; the first other event (readiness) makes the app and is
    answered. Where init runs ahead of traffic, the app is made in init."""
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},
                                  {"name": "INPUT1", "shape": [1, 3], "datatype": "FP32", "data": [1, 1, 1]}],
                       "outputs": [{"name": "OUTPUT0"}]}).encode()
    infer = function_url_event("POST", "/v2/models/add_sub/infer", body, {"content-type": "application/json"})
    ready = function_url_event("GET", "/v2/health/ready")
    env = {**os.environ, "TOOLKIT_MANIFEST": str(manifest_path), "TOOLKIT_LOG_LEVEL": "warning",
           "AWS_LAMBDA_INITIALIZATION_TYPE": initialization}
    env.pop("TOOLKIT_LAMBDA_DIRECT", None)
    out = subprocess.run([sys.executable, "-c", LAZY_APP_SCRIPT, json.dumps(infer), json.dumps(ready)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    ahead = initialization != "on-demand"
    assert seen == {"after_init": ahead, "after_infer": ahead, "infer_status": 200, "outputs": [2.0, 3.0, 4.0],
                    "ready_status": 200, "after_ready": True}



LOAD_ORDER_SCRIPT = r"""
import json, sys, threading
from handlers.entrypoints import lambda_handler
from handlers.model_repository import ModelRepository
loading, seen = threading.Event(), {}
load, get = ModelRepository.load, lambda_handler._App.get
def probe_load(self, **kwargs):
    loading.set()
    seen["load_thread"] = threading.current_thread().name
    return load(self, **kwargs)
def probe_get(self):
    if self.made is None:
        seen["app_thread"] = threading.current_thread().name
        seen["loading_before_app"] = loading.wait(10)  # made before the loading starts: waits out the 10 s
    return get(self)
ModelRepository.load, lambda_handler._App.get = probe_load, probe_get
from handlers.entrypoints import aws_lambda as entry
seen["made_in_init"] = entry.handler._app.made is not None
seen["ready_after_init"] = entry.handler.repository.ready()
seen["ready_status"] = entry.handler(json.loads(sys.argv[1]), None)["statusCode"]
print(json.dumps(seen))
"""


@pytest.mark.parametrize("initialization,direct", [("provisioned-concurrency", "1"), ("on-demand", "0")])
def test_where_init_makes_the_app_it_is_made_while_the_models_load(manifest_path, initialization, direct):
    """Where init makes the app (ahead of traffic, or without the direct path), FastAPI's imports
    run on a thread of their own while the models load on init's thread (docs/cold-start.md); init
    ends with both done, and the app answers."""
    env = {**os.environ, "TOOLKIT_MANIFEST": str(manifest_path), "TOOLKIT_LOG_LEVEL": "warning",
           "AWS_LAMBDA_INITIALIZATION_TYPE": initialization, "TOOLKIT_LAMBDA_DIRECT": direct}
    out = subprocess.run([sys.executable, "-c", LOAD_ORDER_SCRIPT, json.dumps(function_url_event("GET", "/v2/health/ready"))],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {"load_thread": "MainThread", "app_thread": "app-maker", "loading_before_app": True,
                    "made_in_init": True, "ready_after_init": True, "ready_status": 200}



def test_a_failure_to_make_the_app_in_init_is_raised_by_init(manifest_path, monkeypatch):
    """The app made on its thread fails: init makes it again on its own thread, so the error
    reaches Lambda's init (and the function's INIT report), not only the thread's output."""
    from handlers.entrypoints import lambda_handler

    monkeypatch.setenv("AWS_LAMBDA_INITIALIZATION_TYPE", "provisioned-concurrency")
    calls = []

    def broken(self):
        calls.append(threading.current_thread().name)
        raise ImportError("no fastapi here")

    monkeypatch.setattr(lambda_handler._App, "get", broken)
    monkeypatch.setattr(threading, "excepthook", lambda args: None)  # the maker thread's own report
    loaded = []
    load = lambda_handler.ModelRepository.load

    def recorded_load(self, **kwargs):
        loaded.append(self)  # to stop its batchers afterwards
        return load(self, **kwargs)

    monkeypatch.setattr(lambda_handler.ModelRepository, "load", recorded_load)
    with pytest.raises(ImportError, match="no fastapi here"):
        LambdaHandler.from_manifest(Manifest.load(manifest_path))
    loaded[0].stop()
    assert calls == ["app-maker", "MainThread"]


METRICS_SCRIPT = r"""
import json, sys
from handlers.entrypoints import aws_lambda as entry
infer, ready, scrape = (json.loads(a) for a in sys.argv[1:4])
seen = {"after_init": "prometheus_client" in sys.modules}
seen["codes"] = [entry.handler(infer, None)["statusCode"], entry.handler(ready, None)["statusCode"]]
seen["before_scrape"] = "prometheus_client" in sys.modules
answer = entry.handler(scrape, None)
seen["scrape_status"] = answer["statusCode"]
seen["content_type"] = answer["headers"]["content-type"]
seen["text"] = answer["body"]
seen["after_scrape"] = "prometheus_client" in sys.modules
print(json.dumps(seen))
"""


@pytest.mark.parametrize("initialization", ["on-demand", "provisioned-concurrency"])
def test_prometheus_client_is_imported_on_the_first_scrape_and_counts_what_came_before(manifest_path, initialization):
    """handlers.metrics counts without prometheus-client; handlers.exposition (prometheus-client's
    ~20 ms of imports) comes with the first `/metrics` event, not in init, even where init makes the
    app; the scrape then shows the requests answered before it, in Triton's text."""
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},
                                  {"name": "INPUT1", "shape": [1, 3], "datatype": "FP32", "data": [1, 1, 1]}]}).encode()
    events = [function_url_event("POST", "/v2/models/add_sub/infer", body, {"content-type": "application/json"}),
              function_url_event("GET", "/v2/health/ready"), function_url_event("GET", "/metrics")]
    env = {**os.environ, "TOOLKIT_MANIFEST": str(manifest_path), "TOOLKIT_LOG_LEVEL": "warning",
           "AWS_LAMBDA_INITIALIZATION_TYPE": initialization}
    out = subprocess.run([sys.executable, "-c", METRICS_SCRIPT, *map(json.dumps, events)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert (seen["after_init"], seen["codes"], seen["before_scrape"]) == (False, [200, 200], False)
    assert (seen["scrape_status"], seen["after_scrape"]) == (200, True)
    assert seen["content_type"].startswith("text/plain; version=0.0.4")
    lines = seen["text"].splitlines()
    assert 'nv_inference_request_success{model="add_sub",version="1"} 1.0' in lines
    assert 'nv_inference_count{model="add_sub",version="1"} 1.0' in lines
    assert "# TYPE nv_inference_count counter" in lines and "nv_inference_count_total" not in seen["text"]
    assert any(line.startswith("nv_cpu_utilization ") for line in lines)

def test_without_the_direct_path_the_app_is_made_in_init(manifest_path, monkeypatch):
    monkeypatch.setenv("AWS_LAMBDA_INITIALIZATION_TYPE", "on-demand")
    handler = LambdaHandler.from_manifest(Manifest.load(manifest_path), direct=False)
    try:
        assert handler._app.made is not None
        assert handler(function_url_event("GET", "/v2/health/ready"), None)["statusCode"] == 200
    finally:
        handler.repository.stop()
