"""The hot path's shortcuts answer exactly as the long way round does.

- The ASGI fast path for `POST .../infer` (handlers/app.py) and the FastAPI route give the same
  status, headers and body, errors included: a real `toolkit serve` process gets every request
  twice, once plainly (fast path) and once with a query string (which the fast path leaves to
  FastAPI).
- Requests made from a header's plan (handlers/protocol/plans.py) answer with their own data.
- `merge._concatenate` (one bytes.join under 1 MiB) equals np.concatenate.
- Batcher workers run at a lower CPU priority (TOOLKIT_INSTANCE_NICE), checked on the real
  threads through the kernel's per-thread niceness.
"""

from __future__ import annotations

import gzip
import http.client
import json
import os
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from handlers.batching import merge
from handlers.batching.batcher import DEFAULT_INSTANCE_NICE, INSTANCE_NICE_ENV, instance_niceness
from serving import ROOT, serve


@pytest.fixture(scope="module")
def server():
    """The bundled quickstart sample: add_sub with dynamic batching and two instances."""
    with serve(ROOT / "samples" / "quickstart") as running:
        yield running


def post(port: int, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        payload = response.read()
        kept = {k.lower(): v for k, v in response.getheaders() if k.lower() not in ("date", "server")}
        return response.status, kept, payload
    finally:
        connection.close()


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
    return bytes(body), {"Inference-Header-Content-Length": str(length)}


def json_body(**extra) -> bytes:
    data = list(range(16))
    return json.dumps({"id": "r1", "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": data},
        {"name": "INPUT1", "datatype": "FP32", "shape": [1, 16], "data": data},
    ], **extra}).encode()


CASES = {
    "json": (json_body(), {"Content-Type": "application/json"}),
    "binary": binary_body(),
    "gzip request, gzip reply": (gzip.compress(json_body()),
                                 {"Content-Encoding": "gzip", "Accept-Encoding": "gzip"}),
    "malformed JSON (400)": (b"{not json", {}),
    "unknown input (400)": (json.dumps({"inputs": [{"name": "NOPE", "datatype": "FP32", "shape": [1, 16],
                                                    "data": list(range(16))}]}).encode(), {}),
    "bad header length (400)": (json_body(), {"Inference-Header-Content-Length": "99999"}),
    "unsupported encoding (501)": (json_body(), {"Content-Encoding": "br"}),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("path", ["/v2/models/add_sub/infer", "/v2/models/add_sub/versions/1/infer",
                                  "/v2/models/missing/infer", "/v2/models/add_sub/versions/7/infer"])
def test_fast_path_answers_as_the_fastapi_route(server, case, path):
    body, headers = CASES[case]
    fast = post(server.port, path, body, headers)
    routed = post(server.port, path + "?via=fastapi", body, headers)
    assert fast == routed
    status, reply_headers, payload = fast
    assert reply_headers["content-length"] == str(len(payload))
    if "missing" in path or "versions/7" in path:
        assert status == 404, payload  # unknown model / version, before the body is read
        assert "Request for unknown model" in json.loads(payload)["error"]
    elif "(" not in case:
        assert status == 200, payload


def test_fast_path_result_is_the_models(server):
    body, headers = CASES["binary"]
    status, reply_headers, payload = post(server.port, "/v2/models/add_sub/infer", body, headers)
    assert status == 200
    length = int(reply_headers["inference-header-content-length"])
    header = json.loads(payload[:length])
    outputs = {o["name"]: o for o in header["outputs"]}
    a = np.arange(32, dtype=np.float32).reshape(2, 16)
    assert np.array_equal(np.frombuffer(payload[length:], dtype=np.float32).reshape(2, 16), a * 3)
    assert outputs["OUTPUT1"]["data"] == (a - a * 2).reshape(-1).tolist()


def test_requests_with_one_header_each_get_their_own_data(server):
    """tritonclient repeats a request's JSON header when only the tensor data changes: after the
    first, the runtime makes such requests from the header's plan (handlers/protocol/plans.py).
    Each answer is its own request's, with one client and with several in parallel."""
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.port}", concurrency=4)

    def send(seed: int):
        a = np.random.default_rng(seed).standard_normal((2, 16)).astype(np.float32)
        b = np.random.default_rng(seed + 1000).standard_normal((2, 16)).astype(np.float32)
        inputs = []
        for name, data in (("INPUT0", a), ("INPUT1", b)):
            tensor = httpclient.InferInput(name, [2, 16], "FP32")
            tensor.set_data_from_numpy(data, binary_data=True)
            inputs.append(tensor)
        return a, b, client.async_infer("add_sub", inputs)

    try:
        for seed in range(3):
            a, b, pending = send(seed)
            result = pending.get_result()
            assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
            assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)
        sent = [send(seed) for seed in range(10, 42)]
        for a, b, pending in sent:
            result = pending.get_result()
            assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
            assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)
    finally:
        client.close()


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8, np.bool_])
def test_concatenate_by_join_equals_numpy(dtype):
    rng = np.random.default_rng(1)
    arrays = [(rng.random((n, 3, 5)) * 100).astype(dtype) for n in (1, 4, 2)]
    merged = merge._concatenate(arrays)
    expected = np.concatenate(arrays, axis=0)
    assert merged.dtype == expected.dtype and merged.shape == expected.shape
    assert np.array_equal(merged, expected)
    assert not merged.flags.writeable  # read-only, like the request tensors


def test_concatenate_falls_back_to_numpy_for_objects_large_and_strided_arrays():
    strings = [np.array([[b"a"]], dtype=object), np.array([[b"bc"]], dtype=object)]
    assert merge._concatenate(strings).tolist() == [[b"a"], [b"bc"]]
    big = [np.ones((1, 1 << 18), dtype=np.float32)] * 2  # 2 MiB: over the join limit
    assert np.array_equal(merge._concatenate(big), np.ones((2, 1 << 18), dtype=np.float32))
    strided = [np.arange(12, dtype=np.float32).reshape(2, 6)[:, ::2], np.zeros((1, 3), dtype=np.float32)]
    assert np.array_equal(merge._concatenate(strided), np.concatenate(strided))


def test_instance_niceness_setting():
    assert instance_niceness({}) == DEFAULT_INSTANCE_NICE
    assert instance_niceness({INSTANCE_NICE_ENV: "0"}) == 0
    assert instance_niceness({INSTANCE_NICE_ENV: " 19 "}) == 19
    for bad in ("-1", "20", "ten"):
        with pytest.raises(ValueError, match="TOOLKIT_INSTANCE_NICE must be an integer from 0 to 19"):
            instance_niceness({INSTANCE_NICE_ENV: bad})


@pytest.mark.skipif(not os.uname().sysname == "Linux", reason="per-thread niceness is Linux's")
def test_batcher_workers_run_at_a_lower_priority(server):
    """The serving process's instance threads have the default niceness added; the event loop's
    thread (the main thread) keeps the process's own."""
    pid = server.process.pid
    status = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        name = (task / "comm").read_text().strip()
        status[int(task.name)] = (name, int(fields[16]))  # field 19 of stat: nice
    main_nice = status[pid][1]
    lowered = [name for tid, (name, nice) in status.items() if nice == min(19, main_nice + DEFAULT_INSTANCE_NICE)]
    assert lowered, status  # the add_sub instance's worker
    assert main_nice == os.getpriority(os.PRIO_PROCESS, pid)
