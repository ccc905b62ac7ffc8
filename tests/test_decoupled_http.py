"""Decoupled models over HTTP, through a real `toolkit serve`: Triton's generate extension
(`/generate`, `/generate_stream` as server-sent events) with its JSON mapping and error behaviour
(measured on tritonserver 2.51; deviations in docs/triton-compatibility.md), `/infer` on a
decoupled model, events that reach the client as they are sent, a client that disconnects, the
request limits, a fuzzed generate surface, and AWS Lambda's answers through the Lambda handler."""

from __future__ import annotations

import base64
import http.client
import json
import time
import urllib.request

import pytest
from decoupled_repository import write_repository
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from serving import serve

from handlers.entrypoints.lambda_handler import LambdaHandler
from handlers.manifest import Manifest
from toolkit.repository.compile import compile_repository

LIMIT = 256 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = write_repository(tmp_path_factory.mktemp("decoupled-http") / "models")
    with serve(repo, env={"TOOLKIT_MAX_REQUEST_BYTES": str(LIMIT)}) as running:
        yield running


def post(server, path: str, body: bytes | str | dict, headers: dict | None = None) -> tuple[int, dict, bytes]:
    data = body if isinstance(body, bytes) else (json.dumps(body) if isinstance(body, dict) else body).encode()
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.request("POST", path, body=data, headers={"content-type": "application/json", **(headers or {})})
    response = connection.getresponse()
    payload = response.read()
    connection.close()
    return response.status, {k.lower(): v for k, v in response.getheaders()}, payload


def events(payload: bytes) -> list[dict]:
    """The `data:` events of a server-sent event stream."""
    assert payload == b"" or payload.endswith(b"\n\n"), payload
    chunks = [c for c in payload.split(b"\n\n") if c]
    assert all(c.startswith(b"data: ") for c in chunks), payload
    return [json.loads(c[len(b"data: "):]) for c in chunks]


# -- generate and generate_stream ------------------------------------------------------------------


def test_generate_stream_sends_every_response_as_an_event(server):
    status, headers, body = post(server, "/v2/models/repeat/generate_stream", {"IN": [4, 2, 0, 1], "DELAY": [1, 2, 3, 4], "WAIT": 5})
    assert status == 200 and headers["content-type"] == "text/event-stream; charset=utf-8"
    assert headers["cache-control"] == "no-cache" and headers["x-accel-buffering"] == "no"
    assert events(body) == [{"IDX": i, "OUT": v, "model_name": "repeat", "model_version": "1"} for i, v in enumerate([4, 2, 0, 1])]
    assert post(server, "/v2/models/square/versions/1/generate_stream", {"IN": 0})[:3:2] == (200, b"")


def test_generate_maps_keys_to_inputs_and_parameters_as_triton(server):
    status, _, body = post(server, "/v2/models/generate/generate_stream", {
        "id": "7", "text_input": "hello world foo", "max_tokens": 3, "vector": [1, 2.5], "flag": True,
        "matrix": [1, 2, 3, 4], "parameters": {"temperature": 0.5, "stream": True, "top": "k", "timeout": 5},
    })
    assert status == 200
    sent = events(body)
    assert [(e["text_output"], e["index"], e["scores"]) for e in sent] == [
        ("hello", 0, 0.0), ("world", 1, [0.0, 1.0]), ("foo", 2, [0.0, 1.0, 2.0])
    ]
    assert list(sent[0]) == ["id", "index", "info", "model_name", "model_version", "scores", "text_output"]  # byte order
    info = json.loads(sent[0]["info"])
    # the id is also a parameter, as tritonserver passes it; the frontend consumes no parameter
    assert info["parameters"] == {"id": "7", "temperature": 0.5, "stream": True, "top": "k", "timeout": 5}
    assert info["inputs"] == {"flag": [1], "matrix": [2, 2], "max_tokens": [1], "text_input": [1], "vector": [2]}
    # inputs may also come inside "parameters"
    status, _, body = post(server, "/v2/models/generate/generate", {"text_input": "a b", "parameters": {"max_tokens": 1}})
    assert status == 200 and json.loads(body)["text_output"] == "a"
    assert json.loads(json.loads(body)["info"])["inputs"]["max_tokens"] == [1]


def test_generate_needs_exactly_one_response(server):
    status, headers, body = post(server, "/v2/models/square/generate", {"IN": 1})
    assert (status, headers["content-type"], body) == (
        200, "application/json", b'{"OUT":1,"model_name":"square","model_version":"1"}'
    )
    message = {"error": "generate expects model to produce exactly 1 response, use generate stream for model that generates "
                        "various number of responses"}
    for value in (0, 2):  # tritonserver answers these 200 with the error; here the error's status
        status, headers, body = post(server, "/v2/models/square/generate", {"IN": value})
        assert (status, headers["content-type"], json.loads(body)) == (500, "application/json", message)
    # a model that is not decoupled, batching: the batch dimension is 1
    status, _, body = post(server, "/v2/models/echo/generate", {"text_input": "hi", "id": "x"})
    assert status == 200 and json.loads(body) == {"id": "x", "model_name": "echo", "model_version": "1", "text_output": "hi"}


def test_errors_in_the_stream(server):
    status, _, body = post(server, "/v2/models/probe/generate_stream", {"MODE": 2})
    sent = events(body)
    assert status == 200 and sent[0]["OUT"] == "before raise" and len(sent) == 2
    assert sent[1]["error"].startswith("Failed to process the request(s) for model 'probe_0_0', message: ValueError: boom")
    status, _, body = post(server, "/v2/models/probe/generate_stream", {"MODE": 8})
    assert status == 500 and [list(e) for e in events(body)] == [["error"], ["IDX", "OUT", "model_name", "model_version"]]
    status, _, body = post(server, "/v2/models/probe/generate_stream", {"MODE": 9})
    assert status == 400 and events(body) == [{"error": "only error"}]
    status, _, body = post(server, "/v2/models/probe/generate", {"MODE": 9})
    assert (status, json.loads(body)) == (400, {"error": "only error"})
    status, _, body = post(server, "/v2/models/probe/generate_stream", {"MODE": 7})
    assert status == 500 and "without sending TRITONSERVER_RESPONSE_COMPLETE_FINAL" in events(body)[0]["error"]


def test_infer_refuses_decoupled_models_as_tritonserver(server):
    message = {"error": "HTTP end point doesn't support models with decoupled transaction policy"}
    body = {"inputs": [{"name": "IN", "shape": [1], "datatype": "INT32", "data": [2]}]}
    for path, payload in (("/v2/models/square/infer", body), ("/v2/models/square/versions/1/infer", "garbage"),
                          ("/v2/models/square/infer?x=1", body)):
        status, _, answer = post(server, path, payload)
        assert (status, json.loads(answer)) == (501, message)
    assert post(server, "/v2/models/nope/infer", {})[0] == 404


@pytest.mark.parametrize(
    "path, body, status, message",
    [
        ("generate", "garbage", 400, "failed to parse the request JSON buffer: "),
        ("generate", "", 400, "failed to parse the request JSON buffer: "),
        ("generate", "[1, 2]", 400, "the generate request must be a JSON object, got an array"),
        ("generate", {"text_input": "x", "id": 5}, 400, "Unable to parse 'id': expected a string, got a number"),
        ("generate", {"text_input": "x", "parameters": 5}, 400, "Expected JSON object for keyword: 'parameters': got a number"),
        ("generate", {"text_input": "x", "other": [1]}, 400,
         "parameter 'other' has invalid type. It should be either 'int', 'bool', or 'string'."),
        ("generate", {"text_input": "x", "parameters": {"a": None}}, 400,
         "Converting keyword: 'parameters': parameter 'a' has invalid type. It should be either 'int', 'bool', or 'string'."),
        ("generate", {"text_input": ["a", "b"]}, 400, "The schema can not convert input 'text_input' to tensor with proper shape"),
        ("generate", {"text_input": "x", "matrix": [1, 2, 3]}, 400,
         "The schema can not convert input 'matrix' to tensor with proper shape"),
        ("generate", {"text_input": "x", "vector": [[1, 2], [3, 4]]}, 400,
         "Unable to parse 'data': Shape does not match true shape of 'data' field"),
        ("generate", {"text_input": 5}, 400, "Unable to parse JSON bytes array: input 'text_input' needs strings, got integer"),
        ("generate_stream", {"text_input": "x", "vector": "abc"}, 400, "Unable to parse 'data': FP32 input 'vector' needs numbers"),
        ("generate_stream", {"text_input": "x", "parameters": {"text_input": "y"}}, 400,
         "Converting keyword: 'parameters': [request id: <id_unknown>] input 'text_input' already exists in request"),
        ("generate_stream", {"max_tokens": 2}, 400, "[request id: <id_unknown>] expected number of inputs between 1 and 5"),
        ("generate_stream", {"text_input": "x", "vector": [0.5] * (LIMIT // 4)}, 413, "request body of "),
    ],
)
def test_malformed_generate_requests_are_client_errors(server, path, body, status, message):
    answered, headers, payload = post(server, f"/v2/models/generate/{path}", body)
    assert (answered, headers["content-type"]) == (status, "application/json")
    assert json.loads(payload)["error"].startswith(message)


def test_generate_refuses_what_tritonserver_refuses(server):
    status, _, body = post(server, "/v2/models/echo/generate", {"text_input": "hi"}, {"content-encoding": "gzip"})
    assert (status, json.loads(body)) == (400, {"error": "Unsupported content-encoding, only 'identity' is supported."})
    assert post(server, "/v2/models/nope/generate_stream", {}) == (
        404, post(server, "/v2/models/nope/generate_stream", {})[1], b'{"error":"Request for unknown model: \'nope\' is not found"}'
    )
    request = urllib.request.Request(f"{server.http}/v2/models/echo/generate", method="GET")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 405


# -- streaming for real: no buffering, disconnects --------------------------------------------------


def _log(server) -> list[str]:
    status, _, body = post(server, "/v2/models/probe/generate", {"MODE": 6})
    assert status == 200, body
    return json.loads(json.loads(body)["OUT"])


def test_events_arrive_while_the_stream_is_open_and_a_disconnect_cancels(server):
    # the model sends one response, then waits until its request is cancelled: the event can only
    # be read here if nothing buffers the stream, and only a disconnect ends the wait
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    connection.request("POST", "/v2/models/probe/generate_stream", body=json.dumps({"MODE": 10}))
    response = connection.getresponse()
    assert response.status == 200
    first = b""
    while not first.endswith(b"\n\n"):
        first += response.read1(4096)
    assert json.loads(first[len(b"data: "):])["OUT"] == "waiting for cancellation"
    connection.close()
    deadline = time.monotonic() + 30
    while "cancelled: request True sender True" not in _log(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "cancelled: request True sender True" in _log(server)


def test_a_client_that_leaves_while_queued_frees_its_slot(server):
    cancelled = 'nv_inference_request_failure{model="probe",reason="CANCELED"'
    before = server.metric(cancelled)
    busy = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    busy.request("POST", "/v2/models/probe/generate_stream", body=json.dumps({"MODE": 19}))  # holds the instance
    held = busy.getresponse()
    assert held.status == 200 and b"holding the instance" in held.read1(4096)
    queued = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    queued.request("POST", "/v2/models/probe/generate_stream", body=json.dumps({"MODE": 0}))
    deadline = time.monotonic() + 30
    while server.metric('nv_inference_pending_request_count{model="probe"') < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.metric('nv_inference_pending_request_count{model="probe"') == 1
    queued.close()
    while server.metric(cancelled) == before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.metric(cancelled) == before + 1
    assert server.metric('nv_inference_pending_request_count{model="probe"') == 0
    busy.close()  # the model sees the cancellation and returns
    assert events(post(server, "/v2/models/probe/generate_stream", {"MODE": 14})[2]) == []


# -- fuzz -------------------------------------------------------------------------------------------

_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
_KEYS = st.sampled_from(["text_input", "max_tokens", "vector", "matrix", "flag", "parameters", "id", "x", "triton_x"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(document=st.dictionaries(_KEYS, _VALUES, max_size=6), stream=st.booleans())
def test_fuzzed_generate_requests_get_an_answer_never_a_crash(server, document, stream):
    path = "/v2/models/generate/" + ("generate_stream" if stream else "generate")
    status, _, body = post(server, path, document)
    if status == 200:
        answers = events(body) if stream else [json.loads(body)]
        assert all("error" not in a and a["model_name"] == "generate" for a in answers)
    else:
        assert status in (400, 413) or (status == 500 and not stream and b"exactly 1 response" in body), (status, body)
        assert list(json.loads(body)) == ["error"]


def test_the_server_survives_the_fuzz(server):
    assert server.process.poll() is None
    assert events(post(server, "/v2/models/square/generate_stream", {"IN": 2})[2]) == [
        {"OUT": 2, "model_name": "square", "model_version": "1"}
    ] * 2


# -- AWS Lambda -------------------------------------------------------------------------------------


def test_lambda_collects_generate_and_refuses_generate_stream(tmp_path):
    from test_aws_lambda import function_url_event

    repo = write_repository(tmp_path / "models", models=("square", "echo"))
    compiled = compile_repository(repo)
    assert compiled.ok, compiled.failures
    handler = LambdaHandler.from_manifest(Manifest.load(compiled.write_manifest(repo / "models.json")))
    try:
        def call(path, body):
            response = handler(function_url_event("POST", path, json.dumps(body).encode()), None)
            raw = base64.b64decode(response["body"]) if response.get("isBase64Encoded") else response["body"].encode()
            return response["statusCode"], json.loads(raw)

        assert call("/v2/models/square/generate", {"IN": 1}) == (200, {"OUT": 1, "model_name": "square", "model_version": "1"})
        assert call("/v2/models/echo/generate", {"text_input": "hi"})[1]["text_output"] == "hi"
        status, answer = call("/v2/models/square/generate_stream", {"IN": 3})
        assert status == 501 and answer["error"].startswith("generate_stream is not available on AWS Lambda")
        refused = call("/v2/models/square/infer", {})  # Lambda's direct path (handlers/entrypoints/lambda_handler.py)
        assert refused == (501, {"error": "HTTP end point doesn't support models with decoupled transaction policy"})
        through_app = LambdaHandler(handler.repository, direct=False)  # the same answer through Mangum and the app
        response = through_app(function_url_event("POST", "/v2/models/square/infer", b"{}"), None)
        raw = base64.b64decode(response["body"]) if response.get("isBase64Encoded") else response["body"].encode()
        assert (response["statusCode"], json.loads(raw)) == refused
    finally:
        handler.repository.stop()  # finalizes the instances too


def test_the_signing_proxy_relays_events_as_they_arrive(server):
    # toolkit proxy in front of a deployment (here the local server, unsigned): the first event
    # reaches the client while the model still waits, and the client leaving cancels the request
    from toolkit.deploy.proxy import SigningProxy
    from toolkit.deploy.signing import NoSigner

    with SigningProxy(server.http, NoSigner(), port=0) as proxy:
        host, port = proxy.address
        connection = http.client.HTTPConnection(host, port, timeout=60)
        connection.request("POST", "/v2/models/probe/generate_stream", body=json.dumps({"MODE": 10}))
        response = connection.getresponse()
        assert response.status == 200 and response.getheader("content-type") == "text/event-stream; charset=utf-8"
        first = b""
        while not first.endswith(b"\n\n"):
            first += response.read1(4096)
        assert json.loads(first[len(b"data: "):])["OUT"] == "waiting for cancellation"
        count = len([line for line in _log(server) if line.startswith("cancelled")])
        connection.close()
        deadline = time.monotonic() + 30
        while len([line for line in _log(server) if line.startswith("cancelled")]) == count and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len([line for line in _log(server) if line.startswith("cancelled")]) == count + 1
        status, _, body = post(type("Address", (), {"port": port})(), "/v2/models/square/generate_stream", {"IN": 2})
        assert status == 200 and len(events(body)) == 2
