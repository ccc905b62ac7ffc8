"""The Lambda handler's direct path for inference answers exactly as the way through Mangum does.

`LambdaHandler` sends `POST .../infer` events straight to the runtime (no event loop, no ASGI
cycle: handlers/entrypoints/lambda_handler.py); every other event goes through Mangum and the app.
Two handlers over one loaded repository, one with the direct path and one without, get every event
of a wide set (event kinds x paths x request bodies, errors included) and must return the same
response document: status, headers, body and its base64 flag. Requests come from tritonclient's
own encoder and the Function URL event codec the toolkit's front uses.
(Under AWS's RIE the entry point runs with the direct path on: tests/test_lambda_rie.py.)
"""

from __future__ import annotations

import base64
import gzip
import json

import numpy as np
import pytest
import tritonclient.http as httpclient

from handlers import limits
from handlers.entrypoints.lambda_handler import DIRECT_ENV, LambdaHandler
from handlers.manifest import Manifest
from handlers.model_repository import ModelRepository
from serving import ROOT
from test_aws_lambda import api_gateway_v1_event
from toolkit.deploy.function_url import request_event
from toolkit.repository.compile import compile_repository


@pytest.fixture(scope="module")
def handlers(tmp_path_factory):
    """samples/quickstart (add_sub: dynamic batching, 2 instances) loaded once, as on Lambda."""
    out = tmp_path_factory.mktemp("direct")
    compiled = compile_repository(ROOT / "samples" / "quickstart")
    assert compiled.ok, compiled.failures
    manifest = Manifest.load(compiled.write_manifest(out / "models.json"), ROOT / "samples" / "quickstart")
    repository = ModelRepository(manifest, no_queue_delay=True, serial=True)
    repository.load()
    yield LambdaHandler(repository, direct=True), LambdaHandler(repository, direct=False)
    repository.stop()


def binary_body(batch: int = 2) -> tuple[bytes, dict[str, str]]:
    a = np.arange(batch * 16, dtype=np.float32).reshape(batch, 16)
    inputs = []
    for name, data in (("INPUT0", a), ("INPUT1", a * 2)):
        tensor = httpclient.InferInput(name, list(data.shape), "FP32")
        tensor.set_data_from_numpy(data, binary_data=True)
        inputs.append(tensor)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True),
               httpclient.InferRequestedOutput("OUTPUT1", binary_data=False)]
    body, length = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    return bytes(body), {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(length)}


def json_body(**extra) -> bytes:
    data = list(range(16))
    return json.dumps({"id": "r1", "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": data},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": data},
    ], **extra}).encode()


CASES = {
    "json": (json_body(), {"Content-Type": "application/json"}),
    "json without content-type": (json_body(), {}),
    "json, one output, parameters": (json_body(outputs=[{"name": "OUTPUT1"}], parameters={"x": 1}), {}),
    "binary": binary_body(),
    "binary, batch 8": binary_body(8),
    "gzip request, gzip reply": (gzip.compress(json_body()), {"Content-Encoding": "gzip", "Accept-Encoding": "gzip"}),
    "deflate reply": (json_body(), {"Accept-Encoding": "deflate"}),
    "empty body (400)": (b"", {}),
    "malformed JSON (400)": (b"{not json", {"Content-Type": "application/json"}),
    "unknown input (400)": (json.dumps({"inputs": [{"name": "NOPE", "datatype": "FP32", "shape": [1, 16],
                                                    "data": list(range(16))}]}).encode(), {}),
    "wrong shape (400)": (json.dumps({"inputs": [{"name": n, "datatype": "FP32", "shape": [1, 15], "data": list(range(15))}
                                                 for n in ("INPUT0", "INPUT1")]}).encode(), {}),
    "batch over max_batch_size (400)": binary_body(9),
    "bad header length (400)": (json_body(), {"Inference-Header-Content-Length": "99999"}),
    "unsupported encoding (501)": (json_body(), {"Content-Encoding": "br"}),
    "corrupt gzip (400)": (b"\x1f\x8b not gzip", {"Content-Encoding": "gzip"}),
}

PATHS = ["/v2/models/add_sub/infer", "/v2/models/add_sub/versions/1/infer", "/v2/models/missing/infer",
         "/v2/models/add_sub/versions/7/infer"]


def alb_event(method: str, path: str, body: bytes, headers: dict[str, str]) -> dict:
    encoded = bool(body) and not body.isascii()
    return {
        "requestContext": {"elb": {"targetGroupArn": "arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/t/1"}},
        "httpMethod": method, "path": path, "queryStringParameters": {},
        "headers": {"host": "lb.example.com", **{k.lower(): v for k, v in headers.items()}},
        "body": base64.b64encode(body).decode() if encoded else body.decode(), "isBase64Encoded": encoded,
    }


def v1_event(method: str, path: str, body: bytes, headers: dict[str, str]) -> dict:
    return api_gateway_v1_event(method, path, body, headers)


def url_event(method: str, path: str, body: bytes, headers: dict[str, str]) -> dict:
    return request_event(method, path, headers, body)


EVENTS = {"function URL": url_event, "API Gateway REST (v1)": v1_event, "ALB": alb_event}


def both(handlers, event: dict) -> tuple[dict, dict, int]:
    direct, mangum = handlers
    before = direct.direct_invocations
    fast = direct(json.loads(json.dumps(event)), None)
    slow = mangum(json.loads(json.dumps(event)), None)
    assert mangum.direct_invocations == 0
    return fast, slow, direct.direct_invocations - before


@pytest.mark.parametrize("kind", list(EVENTS))
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("path", PATHS)
def test_direct_path_answers_as_mangum(handlers, kind, case, path):
    body, headers = CASES[case]
    fast, slow, taken = both(handlers, EVENTS[kind]("POST", path, body, headers))
    assert taken == 1
    assert fast == slow
    if "missing" in path or "versions/7" in path:
        assert fast["statusCode"] == 404  # unknown model / version, before the body is read
    elif "(" in case:
        assert fast["statusCode"] == int(case[case.index("(") + 1:case.index(")")]), fast
    else:
        assert fast["statusCode"] == 200, fast


@pytest.mark.parametrize("kind", list(EVENTS))
def test_direct_path_result_is_the_models(handlers, kind):
    body, headers = CASES["binary"]
    fast, slow, _ = both(handlers, EVENTS[kind]("POST", "/v2/models/add_sub/infer", body, headers))
    assert fast == slow and fast["isBase64Encoded"] is True
    raw = base64.b64decode(fast["body"])
    length = int({k.lower(): v for k, v in fast["headers"].items()}["inference-header-content-length"])
    result = httpclient.InferResult.from_response_body(raw, header_length=length)
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a * 3)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - a * 2)


@pytest.mark.parametrize("method, target", [
    ("POST", "/v2/models/add_sub/infer?x=1"),  # a query string: the app's route, as over HTTP
    ("GET", "/v2/models/add_sub/infer"),  # 405
    ("POST", "/v2/models/add_sub/infer/"),
    ("POST", "/v2/models/add_sub/versions/one/infer"),
    ("GET", "/v2/models/add_sub/stats"),
    ("GET", "/v2/health/ready"),
])
def test_other_requests_go_through_mangum(handlers, method, target):
    body, headers = CASES["json"] if method == "POST" else (b"", {})
    fast, slow, taken = both(handlers, url_event(method, target, body, headers))
    assert taken == 0
    if target.endswith("/stats"):  # the counts move between the two calls
        assert fast["statusCode"] == slow["statusCode"] == 200
    else:
        assert fast == slow


def test_a_body_over_the_limit_is_refused_alike(handlers, monkeypatch):
    monkeypatch.setattr(limits, "LIMITS", limits.Limits(max_request_bytes=256, max_tensor_elements=1024))
    body, headers = CASES["binary, batch 8"]
    for declared in (True, False):
        event = url_event("POST", "/v2/models/add_sub/infer", body, headers)
        if declared:
            event["headers"]["content-length"] = str(len(body))
        fast, slow, taken = both(handlers, event)
        assert taken == 1 and fast == slow
        assert fast["statusCode"] == 413 and "exceeds the limit of 256 bytes" in json.loads(fast["body"])["error"]


def test_statistics_count_direct_requests(handlers):
    direct, _ = handlers
    model = direct.repository.get("add_sub")
    before = model.statistics.as_dict()["inference_stats"]["success"]["count"]
    body, headers = CASES["binary"]
    for _ in range(3):
        assert direct(url_event("POST", "/v2/models/add_sub/infer", body, headers), None)["statusCode"] == 200
    assert model.statistics.as_dict()["inference_stats"]["success"]["count"] == before + 3


def test_direct_path_setting(monkeypatch, handlers):
    repository = handlers[0].repository
    monkeypatch.delenv(DIRECT_ENV, raising=False)
    assert LambdaHandler(repository).direct is True
    monkeypatch.setenv(DIRECT_ENV, "0")
    assert LambdaHandler(repository).direct is False
    assert LambdaHandler(repository, direct=True).direct is True
