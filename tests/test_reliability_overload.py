"""Overload and faults through the real runtime process: a full queue answers 503 at once, queue
timeouts are honoured, a failing batch fails exactly its own requests and the model keeps
serving, one bad request never fails its batch neighbours, nested BLS under load never deadlocks.

Gated Python models make the timing deterministic: their `execute` records the batch it got and
then blocks until the test creates the model's gate file, so the test knows which request is
executing and which are queued instead of guessing with sleeps. (Model load failures, start-up
exit and `--no-exit-on-error`: tests/test_lifecycle.py::test_failed_model_fails_startup_by_default.)
"""

from __future__ import annotations

import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import model_builders as mb
from conftest import write_config
from test_reliability_harness import (
    compile_manifest,
    error_message,
    python_model,
    runtime,
    wait_until,
)

GATED_MODEL = '''
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Y = 2 * X. Records each batch's X values, then waits for the gate file; a batch holding a
    negative X raises (a model bug that fails the whole batch, as in Triton)."""

    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.gate = parameters["GATE"]["string_value"]
        self.log = parameters["LOG"]["string_value"]

    def execute(self, requests):
        tags = [int(pb_utils.get_input_tensor_by_name(r, "X").as_numpy().reshape(-1)[0]) for r in requests]
        with open(self.log, "a") as log:
            log.write(json.dumps(tags) + "\\n")
        deadline = time.monotonic() + 120
        while not os.path.exists(self.gate) and time.monotonic() < deadline:
            time.sleep(0.002)
        if any(tag < 0 for tag in tags):
            raise ValueError(f"poisoned batch {tags}")
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2)])
            for r in requests
        ]
'''

GATED_CONFIG = """
    backend: "python"
    max_batch_size: {max_batch}
    input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    dynamic_batching {{ {batching} }}
    instance_group [ {{ count: 1 kind: KIND_CPU }} ]
    parameters [ {{ key: "GATE" value: {{ string_value: "{gate}" }} }},
                 {{ key: "LOG" value: {{ string_value: "{log}" }} }} ]
"""
GATED = {
    "queue_full": (1, "default_queue_policy { max_queue_size: 2 }"),
    "queue_timeout": (1, "default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 2000000 "
                         "allow_timeout_override: true }"),
    "poison": (8, ""),
}
CHAIN = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Y = X + 1, then passed on by BLS to the model named by NEXT (if any)."""

    def initialize(self, args):
        self.next = json.loads(args["model_config"])["parameters"].get("NEXT", {}).get("string_value", "")

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy() + 1
            if self.next:
                answer = pb_utils.InferenceRequest(
                    model_name=self.next, requested_output_names=["Y"], inputs=[pb_utils.Tensor("X", x)]
                ).exec()
                if answer.has_error():
                    responses.append(pb_utils.InferenceResponse(error=answer.error()))
                    continue
                x = pb_utils.get_output_tensor_by_name(answer, "Y").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return responses
'''
CHAIN_CONFIG = """
    backend: "python"
    max_batch_size: 4
    input [ {{ name: "X" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    output [ {{ name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }} ]
    dynamic_batching {{ }}
    instance_group [ {{ count: {count} kind: KIND_CPU }} ]
    parameters [ {{ key: "NEXT" value: {{ string_value: "{next}" }} }},
                 {{ key: "TOOLKIT_PYTHON_INSTANCE_MODE" value: {{ string_value: "{mode}" }} }} ]
"""


def _lookup_model(path: Path) -> Path:
    """OUT = table[IDX] (Gather over a 10-entry table): an index out of range makes ONNX Runtime
    fail the execution, i.e. an error raised inside the backend for the whole batch."""
    table = numpy_helper.from_array((np.arange(10) * 1.5).astype(np.float32), "TABLE")
    vin = [helper.make_tensor_value_info("IDX", TensorProto.INT64, ["N", 1])]
    vout = [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["N", 1])]
    node = helper.make_node("Gather", ["TABLE", "IDX"], ["OUT"], axis=0)
    return mb.save_graph(path, vin, vout, [node], [table])


def build_overload_repository(work: Path) -> Path:
    repo = work / "models"
    for name, (max_batch, batching) in GATED.items():
        python_model(repo, name, GATED_MODEL, GATED_CONFIG.format(
            max_batch=max_batch, batching=batching, gate=work / f"{name}.gate", log=work / f"{name}.log"))
    for name, following, count, mode in (("chain_a", "chain_b", 2, "process"), ("chain_b", "chain_c", 1, "inprocess"),
                                         ("chain_c", "", 1, "process")):
        python_model(repo, name, CHAIN, CHAIN_CONFIG.format(next=following, count=count, mode=mode))
    _lookup_model(repo / "lookup" / "1" / "model.onnx")
    write_config(repo, "lookup", """
        backend: "onnxruntime"
        max_batch_size: 8
        input [ { name: "IDX" data_type: TYPE_INT64 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
        dynamic_batching { max_queue_delay_microseconds: 300000 }
    """)
    mb.identity(repo / "strings" / "1" / "model.onnx", {"TEXT": ("BYTES", ["N", 1])}, ["ECHO"])
    write_config(repo, "strings", """
        backend: "onnxruntime"
        max_batch_size: 8
        input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "ECHO" data_type: TYPE_STRING dims: [ 1 ] } ]
        dynamic_batching { preferred_batch_size: [ 6 ] max_queue_delay_microseconds: 2000000 }
    """)
    return repo


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    work = tmp_path_factory.mktemp("overload")
    with runtime(compile_manifest(build_overload_repository(work))) as server:
        yield server, work


def post(port: int, model: str, document: dict, *, body: bytes | None = None,
         headers: dict | None = None) -> tuple[int, bytes, float]:
    """One request on its own connection: (status, body, seconds)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=180)
    started = time.perf_counter()
    try:
        connection.request("POST", f"/v2/models/{model}/infer", body=body if body is not None else json.dumps(document),
                           headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read(), time.perf_counter() - started
    finally:
        connection.close()


def x_request(value: int, **parameters) -> dict:
    document: dict = {"id": f"x{value}", "inputs": [{"name": "X", "datatype": "INT32", "shape": [1, 1], "data": [value]}]}
    if parameters:
        document["parameters"] = parameters
    return document


def y_of(payload: bytes) -> int:
    return json.loads(payload)["outputs"][0]["data"][0]


def batches(log: Path) -> list[list[int]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def pending(port: int, model: str) -> float:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    connection.close()
    for line in text.splitlines():
        if line.startswith(f'nv_inference_pending_request_count{{model="{model}"'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@dataclass
class QueueFull:
    refused: list[tuple[int, bytes, float]]  # status, body, seconds of each refused request
    served: list[tuple[int, bytes, float]]  # the executing request and the two queued ones
    executed: list[int]

    def latencies_ms(self) -> dict[str, float]:
        seconds = sorted(r[2] for r in self.refused)
        return {"refused": len(seconds), "p50_ms": round(seconds[len(seconds) // 2] * 1000, 2),
                "p99_ms": round(seconds[int(len(seconds) * 0.99)] * 1000, 2), "max_ms": round(seconds[-1] * 1000, 2)}


def queue_full(port: int, work: Path, refusals: int) -> QueueFull:
    """One request executing (held by the gate), two queued (max_queue_size 2), then `refusals`
    more sent one after the other while the queue is full."""
    log, gate = work / "queue_full.log", work / "queue_full.gate"
    log.unlink(missing_ok=True)
    gate.unlink(missing_ok=True)
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(post, port, "queue_full", x_request(1))
        wait_until(lambda: batches(log) == [[1]], 30, "the first request never started executing")
        queued = [pool.submit(post, port, "queue_full", x_request(v)) for v in (2, 3)]
        wait_until(lambda: pending(port, "queue_full") == 2, 30, "requests never queued")
        refused = [post(port, "queue_full", x_request(10 + v)) for v in range(refusals)]
        gate.touch()
        served = [first.result(), *(f.result() for f in queued)]
    return QueueFull(refused, served, sorted(v for b in batches(log) for v in b))


def check_queue_full(result: QueueFull, max_seconds: float = 1.0) -> None:
    for status, payload, seconds in result.refused:
        assert status == 503, payload
        assert error_message(payload).endswith("] Exceeds maximum queue size"), payload
        assert seconds < max_seconds, seconds  # answered at once, not when the queue moves
    assert [a[0] for a in result.served] == [200, 200, 200] and [y_of(a[1]) for a in result.served] == [2, 4, 6]
    assert result.executed == [1, 2, 3]  # refused requests never ran


def test_full_queue_answers_503_in_milliseconds(setup):
    server, work = setup
    check_queue_full(queue_full(server.port, work, refusals=6))


def test_queue_timeouts_are_honoured(setup):
    server, work = setup
    log = work / "queue_timeout.log"
    with ThreadPoolExecutor(8) as pool:
        first = pool.submit(post, server.port, "queue_timeout", x_request(1))
        wait_until(lambda: batches(log) == [[1]], 30, "the first request never started executing")
        expiring = [pool.submit(post, server.port, "queue_timeout", x_request(v)) for v in (2, 3)]
        # a request's own `timeout` (µs) replaces the default when shorter (allow_timeout_override)
        short = pool.submit(post, server.port, "queue_timeout", x_request(4, timeout=1000))
        wait_until(lambda: pending(server.port, "queue_timeout") == 3, 30, "requests never queued")
        time.sleep(2.2)  # the time itself is what is tested: the 2 s default timeout passes
        fresh = pool.submit(post, server.port, "queue_timeout", x_request(5))
        wait_until(lambda: pending(server.port, "queue_timeout") == 4, 30, "request 5 never queued")
        (work / "queue_timeout.gate").touch()
        results = {v: f.result() for v, f in zip((1, 2, 3, 4, 5), [first, *expiring, short, fresh])}
    for value in (2, 3, 4):
        status, payload, seconds = results[value]
        assert status == 503 and error_message(payload) == "Request timeout expired", payload
        assert seconds >= 2.0
    for value in (1, 5):
        assert results[value][0] == 200 and y_of(results[value][1]) == 2 * value
    assert sorted(v for b in batches(log) for v in b) == [1, 5]  # expired requests never ran


def test_exception_fails_exactly_its_batch_and_the_model_keeps_serving(setup):
    server, work = setup
    log = work / "poison.log"
    # 29 requests run as 4 batches (at most 8 each); -13 and -26 poison theirs, so at least two
    # batches are clean whatever order the requests reach the queue in
    values = [v if v % 13 else -v for v in range(1, 30)]
    with ThreadPoolExecutor(32) as pool:
        blocker = pool.submit(post, server.port, "poison", x_request(100))
        wait_until(lambda: batches(log) == [[100]], 30, "the first request never started executing")
        futures = {v: pool.submit(post, server.port, "poison", x_request(v)) for v in values}
        wait_until(lambda: pending(server.port, "poison") == len(values), 30, "requests never queued")
        (work / "poison.gate").touch()  # the queue now runs as batches of up to 8
        results = {v: f.result() for v, f in futures.items()}
    assert blocker.result()[0] == 200
    executed = batches(log)[1:]
    assert sorted(v for b in executed for v in b) == sorted(values) and max(map(len, executed)) > 1
    doomed = {v for batch in executed if any(x < 0 for x in batch) for v in batch}
    for value, (status, payload, _) in results.items():
        if value in doomed:
            message = error_message(payload)
            assert status == 500 and message.startswith("Failed to process the request(s) for model 'poison"), payload
            assert "ValueError: poisoned batch" in message and "Traceback" not in message
        else:
            assert status == 200 and y_of(payload) == 2 * value, (value, status, payload)
    assert len(doomed) < len(values)  # batches without a poisoned request were served
    # the model keeps serving
    assert [y_of(post(server.port, "poison", x_request(v))[1]) for v in (41, 42)] == [82, 84]


def test_backend_error_fails_its_batch_only_and_the_model_keeps_serving(setup):
    server, _ = setup

    def lookup(index: int) -> tuple[int, bytes, float]:
        return post(server.port, "lookup", {"inputs": [{"name": "IDX", "datatype": "INT64", "shape": [1, 1], "data": [index]}]})

    status, payload, _ = lookup(1000)
    assert status == 500 and error_message(payload).startswith("onnx runtime error: "), payload
    with ThreadPoolExecutor(12) as pool:  # within the 300 ms queue delay: batched together
        results = list(pool.map(lookup, [1, 2, 3, 4, 5, 1000, 6, 7, 8, 9, 2000, 0]))
    for index, (status, payload, _) in zip([1, 2, 3, 4, 5, 1000, 6, 7, 8, 9, 2000, 0], results):
        if index >= 10:
            assert status == 500, payload
        assert status in (200, 500), payload
        if status == 200:
            assert json.loads(payload)["outputs"][0]["data"] == [index * 1.5]
        else:
            assert error_message(payload).startswith("onnx runtime error: ")
    assert [json.loads(lookup(i)[1])["outputs"][0]["data"] for i in (3, 4)] == [[4.5], [6.0]]


def test_a_bad_request_never_fails_its_batch_neighbours(setup):
    """Non-UTF-8 BYTES cannot reach ONNX Runtime (its Python API takes text): that request is
    refused (400) and the requests batched with it are served."""
    server, _ = setup

    def send(text: bytes) -> tuple[int, bytes, float]:
        header = json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1],
                                         "parameters": {"binary_data_size": 4 + len(text)}}]}).encode()
        body = header + len(text).to_bytes(4, "little") + text
        return post(server.port, "strings", {}, body=body, headers={"Inference-Header-Content-Length": str(len(header))})

    texts = [b"alpha", b"beta", b"\xff\xfe", b"gamma", b"delta", b"eps"]
    with ThreadPoolExecutor(6) as pool:  # preferred batch 6, 2 s delay: one batch of all six
        results = list(pool.map(send, texts))
    for text, (status, payload, _) in zip(texts, results):
        if text == b"\xff\xfe":
            assert status == 400 and "is not valid UTF-8" in error_message(payload)
        else:
            assert status == 200, payload
            assert json.loads(payload)["outputs"][0]["data"] == [text.decode()]
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    connection.request("GET", "/v2/models/strings/stats")
    stats = json.loads(connection.getresponse().read())["model_stats"][0]
    assert stats["batch_stats"] and max(int(b["batch_size"]) for b in stats["batch_stats"]) > 1, stats


def test_nested_bls_under_load_never_deadlocks(setup):
    """chain_a (2 model processes) -> chain_b (in-process, 1 instance) -> chain_c (1 model
    process): every instance busy while the calls nest, 48 requests at once."""
    server, _ = setup
    with ThreadPoolExecutor(48) as pool:
        results = list(pool.map(lambda v: post(server.port, "chain_a", x_request(v)), range(48)))
    assert [(status, y_of(payload)) for status, payload, _ in results] == [(200, v + 3) for v in range(48)]
