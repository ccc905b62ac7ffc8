"""Stateful models: `sequence_batching` (handlers/batching/sequence_batcher.py).

First what tritonclient's own sequence examples check (simple_{http,grpc}_sequence_sync_infer_client,
simple_grpc{,_aio}_sequence_stream_infer_client, with and without `-d`), against `toolkit serve`
on samples/triton-examples' sequence models (the ONNX simple_sequence and simple_dyna_sequence of
Triton's example repository, and a python simple_string_dyna_sequence), with the real tritonclient
over HTTP, gRPC and a gRPC stream. Run unchanged from a client checkout they print PASS
(docs/triton-compatibility.md). Then the scheduler's rules with a python model that reports what
it was given: control tensor values, Triton's errors, the idle timeout, the backlog, direct slots
with null requests, and oldest batching. Implicit state with ONNX models, and with the libtorch
models of Triton's own qa/common/gen_qa_implicit_models.py."""

from __future__ import annotations

import queue
import random
import re
import shutil
import subprocess
import textwrap
import threading
import time
import uuid
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from cli_runner import invoke
from onnx import TensorProto, helper
from python_models.repository import python_model
from torch_models import save_script, write_model

import model_builders as mb
from tools import perf_analyzer
from tritonclient.utils import InferenceServerException

from handlers.batching.sequence_batcher import SequenceBatcher
from handlers.batching.sequence_policy import SEQUENCE_END, SEQUENCE_START, SequencePolicy
from handlers.errors import InferenceError
from handlers.inference import InferRequest, InferResponse
from serving import ROOT, serve
from toolkit.build.report import target_warnings
from toolkit.build.targets import TARGETS
from toolkit.repository.compile import compile_repository
from toolkit.repository.model_config import parse_config_text, to_triton_json

EXAMPLES = ROOT / "samples" / "triton-examples"
VALUES = [11, 7, 5, 3, 2, 0, 1]


@pytest.fixture(scope="module")
def examples():
    with serve(EXAMPLES, "--device", "cpu") as running:
        yield running


def _expected(dyna: bool, sequence_id: int, first: int, sign: int) -> list[int]:
    """The examples' expectations for an integer sequence: the first request adds 1 (START);
    with `-d` the last adds the correlation ID."""
    expected = [first + 1] + [sign * v for v in VALUES]
    if dyna:
        expected[-1] += sequence_id
    return expected


def _string_expected(dyna: bool, results: list[int], sequence_id: str) -> list[int]:
    if not dyna:
        return [21] + [-v for v in VALUES]
    expected = [20]
    for i, v in enumerate(VALUES, start=1):
        expected.append(-v + results[i - 1])
    expected[-1] += int(sequence_id)
    return expected


def _http_send(client, model: str, values: list[int], sequence_id) -> list[int]:
    results = []
    for count, value in enumerate(values, start=1):
        tensor = httpclient.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.full((1, 1), value, np.int32))
        result = client.infer(model, [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT")],
                              sequence_id=sequence_id, sequence_start=count == 1, sequence_end=count == len(values))
        results.append(int(result.as_numpy("OUTPUT")[0][0]))
    return results


@pytest.mark.parametrize("dyna", [False, True], ids=["simple_sequence", "dyna"])
def test_the_http_sequence_example(examples, dyna):
    client = httpclient.InferenceServerClient(examples.url)
    try:
        model = "simple_dyna_sequence" if dyna else "simple_sequence"
        string_model = "simple_string_dyna_sequence" if dyna else "simple_sequence"
        string_id = "1002" if dyna else str(uuid.uuid4())
        first = _http_send(client, model, [0, *VALUES], 1000)
        second = _http_send(client, model, [100, *(-v for v in VALUES)], 1001)
        strings = _http_send(client, string_model, [20, *(-v for v in VALUES)], string_id)
    finally:
        client.close()
    assert first == _expected(dyna, 1000, 0, 1)
    assert second == _expected(dyna, 1001, 100, -1)
    assert strings == _string_expected(dyna, strings, string_id)


@pytest.mark.parametrize("dyna", [False, True], ids=["simple_sequence", "dyna"])
def test_the_grpc_stream_sequence_example(examples, dyna):
    """simple_grpc_sequence_stream_infer_client: three sequences interleaved on one stream."""
    client = grpcclient.InferenceServerClient(examples.grpc)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put(error or result), answers))
    model = "simple_dyna_sequence" if dyna else "simple_sequence"
    string_model = "simple_string_dyna_sequence" if dyna else "simple_sequence"
    string_id = "1002" if dyna else str(uuid.uuid4())
    sequences = [(model, 1000, [0, *VALUES]), (model, 1001, [100, *(-v for v in VALUES)]),
                 (string_model, string_id, [20, *(-v for v in VALUES)])]
    try:
        for step in range(len(VALUES) + 1):
            for name, sequence_id, values in sequences:
                tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                tensor.set_data_from_numpy(np.full((1, 1), values[step], np.int32))
                client.async_stream_infer(name, [tensor], request_id=f"{sequence_id}_{step}", sequence_id=sequence_id,
                                          sequence_start=step == 0, sequence_end=step == len(VALUES))
        results: dict[str, dict[int, int]] = {}
        for _ in range(3 * (len(VALUES) + 1)):
            result = answers.get(timeout=30)
            assert not isinstance(result, Exception), result
            sequence_id, step = result.get_response().id.rsplit("_", 1)
            results.setdefault(sequence_id, {})[int(step)] = int(result.as_numpy("OUTPUT")[0][0])
    finally:
        client.stop_stream()
        client.close()
    ordered = {k: [v[i] for i in range(len(VALUES) + 1)] for k, v in results.items()}
    assert ordered["1000"] == _expected(dyna, 1000, 0, 1)
    assert ordered["1001"] == _expected(dyna, 1001, 100, -1)
    assert ordered[string_id] == _string_expected(dyna, ordered[string_id], string_id)


def test_the_grpc_sync_sequence_example_and_its_errors(examples):
    client = grpcclient.InferenceServerClient(examples.grpc)
    try:
        def send(value, sequence_id, start=False, end=False):
            tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.full((1, 1), value, np.int32))
            return int(client.infer("simple_sequence", [tensor], sequence_id=sequence_id, sequence_start=start,
                                    sequence_end=end).as_numpy("OUTPUT")[0][0])

        assert [send(5, 77, start=True), send(6, 77), send(7, 77, end=True)] == [6, 6, 7]
        with pytest.raises(InferenceServerException) as caught:
            send(1, 77)  # the sequence ended
        assert "inference request for sequence 77 to model 'simple_sequence' must specify the START flag on the " \
               "first request of the sequence" in str(caught.value)
        assert "INVALID_ARGUMENT" in str(caught.value.status())
        with pytest.raises(InferenceServerException) as caught:
            send(1, 0, start=True)
        assert "inference request to model 'simple_sequence' must specify a non-zero or non-empty correlation ID" \
               in str(caught.value)
        tensor = grpcclient.InferInput("INPUT", [2, 1], "INT32")
        tensor.set_data_from_numpy(np.ones((2, 1), np.int32))
        with pytest.raises(InferenceServerException) as caught:
            client.infer("simple_sequence", [tensor], sequence_id=78, sequence_start=True)
        assert "must specify batch-size 1 due to requirements of sequence batcher" in str(caught.value)
    finally:
        client.close()


# -- the rules, with a python model that reports what it was given ---------------------------------

REPORTER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        out = []
        for position, request in enumerate(requests):
            get = lambda n: pb_utils.get_input_tensor_by_name(request, n).as_numpy().reshape(-1)[0]
            start, end, ready, corrid = int(get("START")), int(get("END")), int(get("READY")), int(get("CORRID"))
            total = 0
            if ready:
                self.sums[corrid] = (0 if start else self.sums.get(corrid, 0)) + int(get("IN"))
                total = self.sums[corrid]
            seen = [start, end, ready, corrid, len(requests), position]
            out.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUT", np.array(SHAPE_OUT, np.int32).reshape(SHAPE)),
                pb_utils.Tensor("SEEN", np.array(seen, np.int64).reshape(SEEN_SHAPE))]))
        return out
"""
CONTROLS = """
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
"""


def _reporter(repo: Path, name: str, max_batch_size: int, scheduling: str) -> None:
    batched = max_batch_size > 0
    source = REPORTER.replace("SHAPE_OUT", "[total]").replace("SEEN_SHAPE", "(1, 6)" if batched else "(6,)").replace(
        "SHAPE", "(1, 1)" if batched else "(1,)")
    python_model(repo, name, None, textwrap.dedent(f"""
        name: "{name}"
        backend: "python"
        max_batch_size: {max_batch_size}
        input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }}, {{ name: "SEEN" data_type: TYPE_INT64 dims: [ 6 ] }} ]
        sequence_batching {{
          {scheduling}
          {CONTROLS}
        }}
        """), source=source)


@pytest.fixture(scope="module")
def reporters(tmp_path_factory):
    repo = tmp_path_factory.mktemp("sequences") / "models"
    _reporter(repo, "single", 0, "max_sequence_idle_microseconds: 300000")
    _reporter(repo, "one_slot", 0, "max_sequence_idle_microseconds: 5000000")
    _reporter(repo, "slots", 2, "max_sequence_idle_microseconds: 5000000 "
                                "direct { max_queue_delay_microseconds: 1000000 minimum_slot_utilization: 1.0 }")
    _reporter(repo, "oldest", 4, "max_sequence_idle_microseconds: 5000000 "
                                 "oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 300000 }")
    with serve(repo, "--device", "cpu") as running:
        yield running


def _send(server, model: str, value: int, sequence_id, *, start=False, end=False, batched=False):
    client = httpclient.InferenceServerClient(server.url)
    try:
        shape = [1, 1] if batched else [1]
        tensor = httpclient.InferInput("IN", shape, "INT32")
        tensor.set_data_from_numpy(np.full(shape, value, np.int32))
        result = client.infer(model, [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end)
        return int(result.as_numpy("OUT").reshape(-1)[0]), result.as_numpy("SEEN").reshape(-1).tolist()
    finally:
        client.close()


def test_each_request_gets_its_control_tensors(reporters):
    assert _send(reporters, "single", 5, 41, start=True) == (5, [1, 0, 1, 41, 1, 0])
    assert _send(reporters, "single", 3, 41) == (8, [0, 0, 1, 41, 1, 0])
    assert _send(reporters, "single", 2, 41, end=True) == (10, [0, 1, 1, 41, 1, 0])
    assert _send(reporters, "single", 7, 42, start=True, end=True) == (7, [1, 1, 1, 42, 1, 0])


def test_an_idle_sequence_loses_its_slot(reporters):
    """max_sequence_idle_microseconds 300000: after 0.8 s without a request the sequence is over."""
    _send(reporters, "single", 1, 43, start=True)
    time.sleep(0.8)
    with pytest.raises(InferenceServerException) as caught:
        _send(reporters, "single", 1, 43)
    assert "must specify the START flag on the first request of the sequence" in str(caught.value)
    assert _send(reporters, "single", 4, 43, start=True)[0] == 4  # it may start again


def test_a_sequence_without_a_free_slot_waits_in_the_backlog_until_one_ends(reporters):
    """One instance without batching has one slot: B's first request waits until A has ended."""
    _send(reporters, "one_slot", 1, 51, start=True)
    answered = threading.Event()
    b_result: list = []

    def start_b():
        b_result.append(_send(reporters, "one_slot", 100, 52, start=True))
        answered.set()

    thread = threading.Thread(target=start_b)
    thread.start()
    assert not answered.wait(0.5)  # A still holds the only slot
    assert _send(reporters, "one_slot", 2, 51)[0] == 3
    assert _send(reporters, "one_slot", 3, 51, end=True)[0] == 6
    assert answered.wait(10)
    thread.join()
    assert b_result == [(100, [1, 0, 1, 52, 1, 0])]
    assert _send(reporters, "one_slot", 1, 52, end=True)[0] == 101


def test_direct_slots_keep_their_position_and_null_requests_fill_the_gaps(reporters):
    """max_batch_size 2 gives the instance two slots. Sequence 61 takes slot 0, 62 slot 1; with
    minimum_slot_utilization 1.0 and a 1 s delay a batch waits for both slots, then runs
    whatever is ready: when only 62 has a request, slot 0 holds a null request (READY 0)."""
    with_both = {}

    def send(key, *args, **kwargs):
        with_both[key] = _send(reporters, "slots", *args, batched=True, **kwargs)

    first = [threading.Thread(target=send, args=("a", 1, 61), kwargs={"start": True}),
             threading.Thread(target=send, args=("b", 10, 62), kwargs={"start": True})]
    first[0].start()
    # 62 starts only once 61 is queued, so 61 holds slot 0 (a fixed head start was not always enough);
    # 61's batch waits for slot 1 up to the 1 s delay
    deadline = time.monotonic() + 0.8
    while reporters.metric('nv_inference_pending_request_count{model="slots"') < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    first[1].start()
    for thread in first:
        thread.join()
    assert with_both["a"] == (1, [1, 0, 1, 61, 2, 0])  # both in one batch of 2, at their slots
    assert with_both["b"] == (10, [1, 0, 1, 62, 2, 1])
    # only 62 has a request: after the delay it runs at slot 1, a null request at slot 0
    assert _send(reporters, "slots", 5, 62, end=True, batched=True) == (15, [0, 1, 1, 62, 2, 1])
    assert _send(reporters, "slots", 2, 61, end=True, batched=True) == (3, [0, 1, 1, 61, 1, 0])


def test_oldest_batches_the_oldest_requests_of_several_sequences(reporters):
    results = {}

    def send(sequence_id):
        results[sequence_id] = _send(reporters, "oldest", sequence_id, sequence_id, start=True, end=True, batched=True)

    threads = [threading.Thread(target=send, args=(i,)) for i in (71, 72, 73, 74)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # four candidate sequences, max_batch_size 4: one batch of four
    assert sorted(r[1][4] for r in results.values()) == [4, 4, 4, 4]
    assert sorted(r[1][5] for r in results.values()) == [0, 1, 2, 3]
    assert all(results[i][0] == i for i in results)


def test_the_statistics_count_sequence_requests(reporters):
    client = httpclient.InferenceServerClient(reporters.url)
    try:
        before = client.get_inference_statistics("single")["model_stats"][0]
        for step in range(4):
            _send(reporters, "single", 1, 81, start=step == 0, end=step == 3)
        after = client.get_inference_statistics("single")["model_stats"][0]
    finally:
        client.close()
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 4
    assert after["execution_count"] - before["execution_count"] == 4


# -- control tensors --------------------------------------------------------------------------------


def _policy(controls: str, max_batch_size: int = 0) -> SequencePolicy:
    config = to_triton_json(parse_config_text(f'name: "m" backend: "python" max_batch_size: {max_batch_size} '
                                              f"sequence_batching {{ {controls} }}"))
    return SequencePolicy.from_model_config(config)


def test_control_tensors_take_each_kinds_values_and_type():
    policy = _policy("""control_input [
        { name: "S" control [ { kind: CONTROL_SEQUENCE_START fp32_false_true: [ -1.5, 2.5 ] } ] },
        { name: "E" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
        { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT32 } ] } ]""", max_batch_size=4)
    request = InferRequest("m", 1, {}, correlation_id=(1 << 32) + 5, flags=SEQUENCE_START)
    tensors = policy.controls_for(request)
    assert tensors["S"].dtype == np.float32 and tensors["S"].tolist() == [[2.5]]
    assert tensors["E"].dtype == np.bool_ and tensors["E"].tolist() == [[False]]
    assert tensors["C"].dtype == np.int32 and tensors["C"].tolist() == [[5]]  # the id's low 32 bits, as Triton copies it
    null = policy.controls_for(InferRequest("m", 1, {}, correlation_id=9, flags=SEQUENCE_END), ready=False)
    assert null["S"].tolist() == [[-1.5]] and null["E"].tolist() == [[False]] and null["C"].tolist() == [[0]]


def test_a_string_corrid_is_sent_as_bytes():
    policy = _policy('control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] } ]')
    tensor = policy.controls_for(InferRequest("m", 1, {}, correlation_id="abc-1", flags=SEQUENCE_END))["C"]
    assert tensor.dtype == object and tensor.tolist() == [b"abc-1"]


def test_the_strategies_and_their_slots():
    direct = _policy("", max_batch_size=4)
    assert (direct.strategy, direct.slots_per_instance, direct.idle_us) == ("direct", 4, 1_000_000)
    oldest = _policy("max_sequence_idle_microseconds: 250 oldest { max_candidate_sequences: 16 preferred_batch_size: [ 2, 4 ] }",
                     max_batch_size=4)
    assert (oldest.strategy, oldest.slots_per_instance, oldest.idle_us, oldest.preferred_batch_sizes) == (
        "oldest", 16, 250, (2, 4))


def test_the_build_says_where_a_sequence_stays_in_one_container():
    compiled = compile_repository(EXAMPLES, models=["simple_sequence", "simple"])
    assert compiled.ok, compiled.failures
    on_lambda = " ".join(target_warnings(TARGETS["lambda"], compiled, []))
    assert "simple_sequence: stateful model(s) (sequence_batching) keep each sequence in one container" in on_lambda
    assert "reserved concurrency 1" in on_lambda and "simple," not in on_lambda
    on_cloudrun = " ".join(target_warnings(TARGETS["cloudrun"], compiled, []))
    assert "one gRPC stream" in on_cloudrun and "session affinity" in on_cloudrun


class Stepper(torch.nn.Module):
    """OUTPUT__0 = READY * (INPUT + START + END * CORRID), the controls named <name>__<index>."""

    def forward(self, INPUT__0, START__1, END__2, READY__3, CORRID__4):  # noqa: N803 (Triton's names)
        return READY__3 * (INPUT__0 + START__1 + END__2 * CORRID__4.to(torch.int32))


TORCH_CONTROLS = CONTROLS.replace('"START"', '"START__1"').replace('"END"', '"END__2"').replace(
    '"READY"', '"READY__3"').replace('"CORRID"', '"CORRID__4"').replace("TYPE_UINT64", "TYPE_INT64")


def _torch_sequence(repo: Path, name: str, controls: str) -> None:
    write_model(repo, name, textwrap.dedent(f"""
        name: "{name}"
        platform: "pytorch_libtorch"
        max_batch_size: 8
        input [ {{ name: "INPUT__0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT__0" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        sequence_batching {{ {controls} }}
        """), lambda path: save_script(Stepper(), path))


def test_a_torchscript_sequence_model_takes_its_controls_by_index(tmp_path):
    repo = tmp_path / "models"
    _torch_sequence(repo, "stepper", TORCH_CONTROLS)
    with serve(repo, "--device", "cpu") as running:
        client = grpcclient.InferenceServerClient(running.grpc)
        try:
            def send(value, start=False, end=False):
                tensor = grpcclient.InferInput("INPUT__0", [1, 1], "INT32")
                tensor.set_data_from_numpy(np.full((1, 1), value, np.int32))
                result = client.infer("stepper", [tensor], sequence_id=500, sequence_start=start, sequence_end=end)
                return int(result.as_numpy("OUTPUT__0")[0][0])

            assert [send(10, start=True), send(20), send(30, end=True)] == [11, 20, 530]
        finally:
            client.close()


def test_a_torchscript_control_without_an_index_is_refused_with_the_backends_message(tmp_path):
    repo = tmp_path / "models"
    _torch_sequence(repo, "stepper", TORCH_CONTROLS.replace('"END__2"', '"END"'))
    result = invoke(["validate", str(repo)])
    assert result.exit_code != 0
    assert "input 'END' does not follow <name>__<index> naming convention." in result.output


# -- the batcher alone ------------------------------------------------------------------------------


class Recorder:
    """A model instance that answers each request with its IN and records the batches it ran."""

    name = "recorder_0"

    def __init__(self) -> None:
        self.batches: list[list[tuple[int, int]]] = []

    def execute(self, requests):
        self.batches.append([(int(r.correlation_id), int(r.inputs["READY"].reshape(-1)[0])) for r in requests])
        return [InferResponse(r.model_name, r.model_version, {"OUT": r.inputs["IN"]}) for r in requests]


def _batcher(max_batch_size: int = 0, scheduling: str = "") -> tuple[SequenceBatcher, Recorder]:
    config = to_triton_json(parse_config_text(
        f'name: "m" backend: "python" max_batch_size: {max_batch_size} '
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ] output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ] '
        f"sequence_batching {{ {scheduling} "
        'control_input [ { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] } ] }'))
    recorder = Recorder()
    return SequenceBatcher("m", config, [recorder]), recorder


def _request(sequence_id: int, flags: int = 0, batched: bool = False) -> InferRequest:
    shape = (1, 1) if batched else (1,)
    return InferRequest("m", 1, {"IN": np.full(shape, sequence_id, np.int32)}, correlation_id=sequence_id, flags=flags)


def test_stopping_with_drain_runs_backlogged_sequences_and_returns():
    """Sequence 1 holds the only slot and never ends; 2 waits in the backlog. Draining gives 1's
    slot to 2 (no request can join 1 any more), runs 2's request, and stop returns."""
    batcher, recorder = _batcher()
    batcher.start()
    outcomes: queue.Queue = queue.Queue()
    batcher.submit(_request(1, SEQUENCE_START), outcomes.put)
    assert outcomes.get(timeout=5).outputs["OUT"].tolist() == [1]
    batcher.submit(_request(2, SEQUENCE_START), outcomes.put)
    assert batcher.queued() == 1
    assert batcher.stop(drain=True, timeout=10)
    assert outcomes.get(timeout=1).outputs["OUT"].tolist() == [2]
    assert recorder.batches == [[(1, 1)], [(2, 1)]]


def test_stopping_without_drain_fails_what_waits():
    batcher, recorder = _batcher()
    batcher.start()
    outcomes: queue.Queue = queue.Queue()
    batcher.submit(_request(1, SEQUENCE_START), outcomes.put)
    outcomes.get(timeout=5)
    batcher.submit(_request(2, SEQUENCE_START), outcomes.put)
    assert batcher.stop(drain=False, timeout=10)
    error = outcomes.get(timeout=1)
    assert "Server is stopping" in error.message
    with pytest.raises(InferenceError, match="Server is stopping"):
        batcher.submit(_request(3, SEQUENCE_START), outcomes.put)


def test_a_backlogged_sequence_whose_timeout_expires_is_refused():
    """Sequence 1 holds the only slot; 2 waits in the backlog with a request timeout of 100 ms:
    the reaper refuses its requests with tritonserver's UNAVAILABLE, and 2 is forgotten (its next
    request needs START again). A backlogged request without a timeout waits on."""
    batcher, recorder = _batcher()
    batcher.start()
    outcomes: queue.Queue = queue.Queue()
    try:
        batcher.submit(_request(1, SEQUENCE_START), outcomes.put)
        outcomes.get(timeout=5)
        waiting = _request(3, SEQUENCE_START)
        batcher.submit(waiting, outcomes.put)
        timed = _request(2, SEQUENCE_START)
        timed.timeout_us = 100_000
        started = time.monotonic()
        batcher.submit(timed, outcomes.put)
        batcher.submit(_request(2), outcomes.put)  # a later request of the same backlogged sequence
        refused = [outcomes.get(timeout=5), outcomes.get(timeout=5)]
        assert 0.09 < time.monotonic() - started < 2
        assert [(e.code.name, e.message) for e in refused] == [
            ("UNAVAILABLE", "timeout of the corresponding sequence has been expired")
        ] * 2
        with pytest.raises(InferenceError, match="must specify the START flag"):
            batcher.submit(_request(2), outcomes.put)
        assert batcher.queued() == 1  # sequence 3, without a timeout, still waits for the slot
        batcher.submit(_request(1, SEQUENCE_END), outcomes.put)
        assert outcomes.get(timeout=5).outputs["OUT"].tolist() == [1]
        assert outcomes.get(timeout=5).outputs["OUT"].tolist() == [3]
    finally:
        batcher.stop()
    assert [batch[0][0] for batch in recorder.batches] == [1, 1, 3]


def test_a_direct_batch_pads_the_slots_it_skips_with_null_requests():
    """Two slots; sequence 1 in slot 0 ends, 2 stays in slot 1: its next request runs at position
    1 behind a null request (READY 0, correlation ID 0)."""
    batcher, recorder = _batcher(max_batch_size=2)
    batcher.start()
    outcomes: queue.Queue = queue.Queue()
    try:
        batcher.submit(_request(1, SEQUENCE_START | SEQUENCE_END, batched=True), outcomes.put)
        outcomes.get(timeout=5)
        batcher.submit(_request(2, SEQUENCE_START, batched=True), outcomes.put)  # slot 0 again (the lowest free)
        outcomes.get(timeout=5)
        batcher.submit(_request(3, SEQUENCE_START, batched=True), outcomes.put)  # slot 1
        outcomes.get(timeout=5)
        batcher.submit(_request(3, SEQUENCE_END, batched=True), outcomes.put)
        assert outcomes.get(timeout=5).outputs["OUT"].tolist() == [[3]]
    finally:
        batcher.stop()
    assert recorder.batches == [[(1, 1)], [(2, 1)], [(0, 0), (3, 1)], [(0, 0), (3, 1)]]


@pytest.mark.parametrize("protocol", ["http", "grpc-streaming"])
def test_perf_analyzer_drives_sequences(examples, protocol):
    """perf_analyzer reads the model's sequence_batching and sends sequences of its own (START,
    END, correlation IDs): every request succeeds, and the direct batcher batches across them."""
    before = _model_stats(examples, "simple_sequence")
    args = ["-u", examples.url] if protocol == "http" else ["-u", examples.grpc, "-i", "grpc", "--streaming"]
    out = subprocess.run(
        [perf_analyzer(), *args, "-m", "simple_sequence", "--concurrency-range", "4", "--request-count", "200",
         "--sequence-length", "10"],
        capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    sent = sum(int(n) for n in re.findall(r"Request count: (\d+)", out.stdout))
    after = _model_stats(examples, "simple_sequence")
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] >= sent >= 200
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"]
    assert after["execution_count"] - before["execution_count"] < sent  # sequences shared batches


def _model_stats(server, model: str) -> dict:
    client = httpclient.InferenceServerClient(server.url)
    try:
        return client.get_inference_statistics(model)["model_stats"][0]
    finally:
        client.close()


STREAMER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        for request in requests:
            get = lambda n: int(pb_utils.get_input_tensor_by_name(request, n).as_numpy().reshape(-1)[0])
            corrid = request.correlation_id()
            self.sums[corrid] = (0 if get("START") else self.sums.get(corrid, 0)) + get("IN")
            sender = request.get_response_sender()
            for factor in (1, 10):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([self.sums[corrid] * factor], np.int32))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def test_a_decoupled_sequence_model_streams_each_requests_responses(tmp_path):
    repo = tmp_path / "models"
    python_model(repo, "streamer", None, textwrap.dedent("""
        name: "streamer"
        backend: "python"
        max_batch_size: 0
        model_transaction_policy { decoupled: true }
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        sequence_batching {
          control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
        }
        """), source=STREAMER)
    with serve(repo, "--device", "cpu") as running:
        client = grpcclient.InferenceServerClient(running.grpc)
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=partial(lambda q, result, error: q.put(error or result), answers))
        try:
            for step, value in enumerate((1, 2, 3)):
                tensor = grpcclient.InferInput("IN", [1], "INT32")
                tensor.set_data_from_numpy(np.array([value], np.int32))
                client.async_stream_infer("streamer", [tensor], sequence_id="s-1", sequence_start=step == 0,
                                          sequence_end=step == 2, enable_empty_final_response=False)
            got = []
            for _ in range(6):
                result = answers.get(timeout=30)
                assert not isinstance(result, Exception), result
                got.append(int(result.as_numpy("OUT")[0]))
        finally:
            client.stop_stream()
            client.close()
    assert got == [1, 10, 3, 30, 6, 60]


def test_validate_shows_the_sequence_batcher():
    result = invoke(["validate", str(EXAMPLES)], columns=240)
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if line.count("│") > 3}
    assert "sequence, direct (max 8)" in rows["simple_sequence"]
    assert "sequence, oldest (max 8)" in rows["simple_dyna_sequence"]


class Journal:
    """A model instance that records, per batch, each real request's (sequence, step, START, END)."""

    def __init__(self, name: str, log: list) -> None:
        self.name = name
        self._log = log
        self._lock = threading.Lock()

    def execute(self, requests):
        rows = []
        for r in requests:
            if int(r.inputs["READY"].reshape(-1)[0]):
                rows.append((int(r.correlation_id), int(r.inputs["IN"].reshape(-1)[0]),
                             int(r.inputs["START"].reshape(-1)[0]), int(r.inputs["END"].reshape(-1)[0])))
        time.sleep(0.001)
        with self._lock:
            self._log.append((self.name, rows))
        return [InferResponse(r.model_name, r.model_version, {"OUT": r.inputs["IN"]}) for r in requests]


@pytest.mark.parametrize("scheduling", ["", "oldest { max_candidate_sequences: 3 max_queue_delay_microseconds: 500 }"],
                         ids=["direct", "oldest"])
def test_many_interleaved_sequences_each_run_in_order_on_one_instance(scheduling):
    """Twelve sequences of 1-6 requests from twelve threads, on two instances of two slots each
    (so some wait in the backlog): every request runs once, in its sequence's order, with START
    on the first and END on the last, never two of one sequence in a batch, all on one instance."""
    config = to_triton_json(parse_config_text(
        'name: "m" backend: "python" max_batch_size: 2 '
        'input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ] output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ] '
        f"sequence_batching {{ max_sequence_idle_microseconds: 30000000 {scheduling} control_input [ "
        '{ name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }, '
        '{ name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] }, '
        '{ name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] } ] }'))
    log: list = []
    batcher = SequenceBatcher("m", config, [Journal("m_0", log), Journal("m_1", log)])
    batcher.start()
    rng = np.random.default_rng(7)
    lengths = {100 + i: int(rng.integers(1, 7)) for i in range(12)}
    answers: dict[int, list[int]] = {}

    def run(sequence_id: int, length: int) -> None:
        jitter = random.Random(sequence_id)
        got = []
        for step in range(length):
            flags = (SEQUENCE_START if step == 0 else 0) | (SEQUENCE_END if step == length - 1 else 0)
            request = InferRequest("m", 1, {"IN": np.full((1, 1), step, np.int32)}, correlation_id=sequence_id, flags=flags)
            got.append(int(batcher.infer_sync(request, timeout=30).outputs["OUT"].reshape(-1)[0]))
            time.sleep(jitter.random() * 0.003)
        answers[sequence_id] = got

    threads = [threading.Thread(target=run, args=item) for item in lengths.items()]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        assert batcher.stop(timeout=10)
    assert answers == {s: list(range(n)) for s, n in lengths.items()}
    seen: dict[int, list[tuple]] = {}
    where: dict[int, set[str]] = {}
    for instance, rows in log:
        assert len({row[0] for row in rows}) == len(rows)  # one request per sequence in a batch
        for sequence_id, step, start, end in rows:
            seen.setdefault(sequence_id, []).append((step, start, end))
            where.setdefault(sequence_id, set()).add(instance)
    for sequence_id, length in lengths.items():
        assert seen[sequence_id] == [(k, int(k == 0), int(k == length - 1)) for k in range(length)]
        assert len(where[sequence_id]) == 1


WARMUP = """
model_warmup [ {
  name: "sequence_start"
  batch_size: 1
  inputs { key: "INPUT" value: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } }
  inputs { key: "START" value: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } }
  inputs { key: "READY" value: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } }
} ]
"""


def test_a_sequence_models_warmup_hands_its_control_inputs_to_the_model(tmp_path):
    """Warmup runs on the instance, not through the sequence batcher: as in tritonserver, the
    sample gives the control tensors, and they reach the model (no 'not an input' warning)."""
    repo = tmp_path / "models"
    shutil.copytree(EXAMPLES / "simple_sequence", repo / "simple_sequence")
    config = repo / "simple_sequence" / "config.pbtxt"
    config.write_text(config.read_text() + WARMUP)
    result = invoke(["validate", str(repo)])
    assert result.exit_code == 0, result.output
    assert "not an input" not in result.output
    with serve(repo, "--device", "cpu") as running:
        client = httpclient.InferenceServerClient(running.url)
        try:
            stats = client.get_inference_statistics("simple_sequence")["model_stats"][0]
            assert stats["execution_count"] == 1  # the warmup sample ran
            assert _http_send(client, "simple_sequence", [3, 4], 900) == [4, 4]
        finally:
            client.close()


# -- implicit state (onnxruntime) -------------------------------------------------------------------


def _accumulator(repo: Path, name: str, *, max_batch_size: int = 0, initial: str = "", outputs_state: bool = False) -> None:
    """An ONNX model with implicit state: OUTPUT = INPUT + STATE_IN, STATE_OUT = OUTPUT."""
    batch = ["N"] if max_batch_size else []
    mb.save_graph(
        repo / name / "1" / "model.onnx",
        [helper.make_tensor_value_info("INPUT", TensorProto.INT32, [*batch, 1]),
         helper.make_tensor_value_info("STATE_IN", TensorProto.INT32, [*batch, 1])],
        [helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, [*batch, 1]),
         helper.make_tensor_value_info("STATE_OUT", TensorProto.INT32, [*batch, 1])],
        [helper.make_node("Add", ["INPUT", "STATE_IN"], ["OUTPUT"]), helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"])],
    )
    extra_output = ', { name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ] }' if outputs_state else ""
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(f"""
        name: "{name}"
        backend: "onnxruntime"
        max_batch_size: {max_batch_size}
        input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }}{extra_output} ]
        sequence_batching {{
          max_sequence_idle_microseconds: 5000000
          state [ {{ input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ] {initial} }} ]
        }}
        """).lstrip())


INITIAL_100 = 'initial_state: { name: "hundred" data_type: TYPE_INT32 dims: [ 1 ] data_file: "hundred" }'


@pytest.fixture(scope="module")
def stateful(tmp_path_factory):
    repo = tmp_path_factory.mktemp("state") / "models"
    _accumulator(repo, "sum_zero", initial='initial_state: { name: "zero" data_type: TYPE_INT32 dims: [ 1 ] zero_data: true }')
    _accumulator(repo, "sum_hundred", initial=INITIAL_100, outputs_state=True)
    (repo / "sum_hundred" / "initial_state").mkdir()
    (repo / "sum_hundred" / "initial_state" / "hundred").write_bytes(np.array([100], np.int32).tobytes())
    _accumulator(repo, "sum_batched", max_batch_size=4)
    with serve(repo, "--device", "cpu") as running:
        yield running


def _sum(server, model: str, values: list[int], sequence_id, batched: bool = False, outputs=None) -> list:
    client = httpclient.InferenceServerClient(server.url)
    try:
        got = []
        for step, value in enumerate(values):
            shape = [1, 1] if batched else [1]
            tensor = httpclient.InferInput("INPUT", shape, "INT32")
            tensor.set_data_from_numpy(np.full(shape, value, np.int32))
            requested = None if outputs is None else [httpclient.InferRequestedOutput(n) for n in outputs]
            result = client.infer(model, [tensor], outputs=requested, sequence_id=sequence_id,
                                  sequence_start=step == 0, sequence_end=step == len(values) - 1)
            got.append({o["name"]: int(result.as_numpy(o["name"]).reshape(-1)[0]) for o in result.get_response()["outputs"]})
        return got
    finally:
        client.close()


def test_the_state_carries_from_request_to_request_and_stays_inside(stateful):
    assert _sum(stateful, "sum_zero", [1, 2, 3], 10) == [{"OUTPUT": 1}, {"OUTPUT": 3}, {"OUTPUT": 6}]
    assert _sum(stateful, "sum_zero", [5], 10) == [{"OUTPUT": 5}]  # a new sequence starts from zero


def test_the_initial_state_comes_from_its_data_file_and_a_config_output_may_show_it(stateful):
    assert _sum(stateful, "sum_hundred", [1, 2], 11) == [{"OUTPUT": 101, "STATE_OUT": 101}, {"OUTPUT": 103, "STATE_OUT": 103}]
    assert _sum(stateful, "sum_hundred", [1], 12, outputs=["OUTPUT"]) == [{"OUTPUT": 101}]  # not asked for: not sent


def _interleaved(send, sequences: dict[int, list]) -> dict[int, list]:
    """`send(values, sequence_id)` for each sequence at once, on a thread each: what each returned."""
    results: dict[int, list] = {}

    def run(sequence_id, values):
        results[sequence_id] = send(values, sequence_id)

    threads = [threading.Thread(target=run, args=item) for item in sequences.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_interleaved_sequences_keep_their_own_state_in_one_batch(stateful):
    """Two sequences in the slots of one batching instance: each its own running sum."""
    results = _interleaved(lambda values, sequence_id: _sum(stateful, "sum_batched", values, sequence_id, batched=True),
                           {20: [1, 1, 1, 1], 21: [10, 10, 10]})
    assert [r["OUTPUT"] for r in results[20]] == [1, 2, 3, 4]
    assert [r["OUTPUT"] for r in results[21]] == [10, 20, 30]


@pytest.mark.parametrize("initial, message", [
    ('initial_state: { name: "x" data_type: TYPE_FP32 dims: [ 1 ] zero_data: true }',
     "The data type used for 'initial_state' field of state 'STATE_IN' does not match the state data type."),
    ('initial_state: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true }',
     "Field 'name' must be set when using initial_state for state input 'STATE_IN'."),
    ('initial_state: { name: "x" data_type: TYPE_INT32 dims: [ 2 ] zero_data: true }',
     "'initial_state' dim for input name 'STATE_IN' doesn't match 'state' dim description. 2 != 1"),
    ('initial_state: { name: "x" data_type: TYPE_INT32 dims: [ 1, 1 ] zero_data: true }',
     "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for state input 'STATE_IN'. 2 != 1"),
    (INITIAL_100, "failed to read initial state file"),
])
def test_an_initial_state_tritonserver_refuses_is_refused_with_its_message(tmp_path, initial, message):
    repo = tmp_path / "models"
    _accumulator(repo, "bad", initial=initial)
    result = invoke(["validate", str(repo)])
    assert result.exit_code != 0
    assert message in " ".join(result.output.split())


def test_implicit_state_of_a_python_model_is_refused(tmp_path):
    repo = tmp_path / "models"
    python_model(repo, "p", None, textwrap.dedent("""
        name: "p"
        backend: "python"
        max_batch_size: 0
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        sequence_batching { state [ { input_name: "S" output_name: "T" data_type: TYPE_FP32 dims: [ 1 ] } ] }
        """), source=STREAMER)
    result = invoke(["validate", str(repo)])
    assert result.exit_code != 0
    assert "implicit state" in result.output and 'backends "onnxruntime" and "pytorch"' in " ".join(result.output.split())


# -- implicit state (pytorch): Triton's qa/common/gen_qa_implicit_models.py libtorch models ----------


class ImplicitSequenceNet(torch.nn.Module):
    """gen_qa_implicit_models.py's libtorch model without an initial state: the state counts
    only where the request is READY and not a START."""

    def forward(self, input0, input0_state, start0, ready0):
        use_state = torch.logical_and(ready0, torch.logical_not(start0))
        result = torch.mul(use_state, input0_state)
        result += input0
        return result, result


class ImplicitSequenceNetZero(torch.nn.Module):
    """The same model for `initial_state` zero_data: the state is always added."""

    def forward(self, input0, input0_state, start0, ready0):
        result = input0_state + input0
        return result, result


class ImplicitStringNet(torch.nn.Module):
    """gen_qa_implicit_models.py's List[str] libtorch model (initial state zero_data)."""

    def forward(
        self, input0: list[str], input0_state: list[str], start0, ready0
    ) -> tuple[list[str], list[str]]:
        input0_state_int = torch.tensor([int("0" + i) for i in input0_state], device=start0.device)
        input0_int = torch.tensor([int("0" + i) for i in input0], device=start0.device)
        result_int = (input0_state_int + input0_int).cpu()
        result = [str(i.item()) for i in result_int]
        return result, result


def _libtorch_implicit(repo: Path, name: str, module: torch.nn.Module, *, max_batch: int, dtype: str = "TYPE_INT32",
                       initial: bool = False, state_input: str = "INPUT_STATE__1", input_name: str = "INPUT__0") -> None:
    """gen_qa_implicit_models.py's create_libtorch_modelconfig (KIND_GPU as it writes it: a CPU target runs it on the CPU)."""
    initial_state = (f'initial_state: {{ data_type: {dtype} dims: [ 1 ] zero_data: true name: "initial_state" }}'
                     if initial else "")
    write_model(repo, name, textwrap.dedent(f"""
        name: "{name}"
        platform: "pytorch_libtorch"
        max_batch_size: {max_batch}
        input [ {{ name: "{input_name}" data_type: {dtype} dims: [ 1 ] }} ]
        output [ {{ name: "OUTPUT__0" data_type: {dtype} dims: [ 1 ] }} ]
        instance_group [ {{ kind: KIND_GPU }} ]
        sequence_batching {{
          max_sequence_idle_microseconds: 5000000
          control_input [
            {{ name: "START__2" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
            {{ name: "READY__3" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }}
          ]
          state [ {{ input_name: "{state_input}" output_name: "OUTPUT_STATE__1" data_type: {dtype} dims: [ 1 ] {initial_state} }} ]
        }}
        """).lstrip(), lambda path: save_script(module, path))


@pytest.fixture(scope="module")
def libtorch_stateful(tmp_path_factory):
    repo = tmp_path_factory.mktemp("libtorch-state") / "models"
    _libtorch_implicit(repo, "libtorch_sequence_int32", ImplicitSequenceNet(), max_batch=8)
    _libtorch_implicit(repo, "libtorch_nobatch_sequence_int32", ImplicitSequenceNet(), max_batch=0)
    _libtorch_implicit(repo, "libtorch_zero_sequence_int32", ImplicitSequenceNetZero(), max_batch=8, initial=True)
    _libtorch_implicit(repo, "libtorch_nobatch_sequence_object", ImplicitStringNet(), max_batch=0, dtype="TYPE_STRING",
                       initial=True)
    # inputs named after forward's arguments: the state input takes its argument by name too
    _libtorch_implicit(repo, "libtorch_named_sequence_int32", ImplicitSequenceNet(), max_batch=8, input_name="input0",
                       state_input="input0_state")
    with serve(repo, "--device", "cpu") as running:
        yield running


def _libtorch_sums(server, model: str, values: list, sequence_id: int, *, batched: bool, string: bool = False) -> list:
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        got = []
        for step, value in enumerate(values):
            shape = [1, 1] if batched else [1]
            name = "input0" if "named" in model else "INPUT__0"
            tensor = grpcclient.InferInput(name, shape, "BYTES" if string else "INT32")
            tensor.set_data_from_numpy(np.full(shape, value, object if string else np.int32))
            result = client.infer(model, [tensor], sequence_id=sequence_id, sequence_start=step == 0,
                                  sequence_end=step == len(values) - 1)
            assert result.get_response().outputs[0].name == "OUTPUT__0" and len(result.get_response().outputs) == 1
            out = result.as_numpy("OUTPUT__0").reshape(-1)[0]
            got.append(out.decode() if string else int(out))
        return got
    finally:
        client.close()


@pytest.mark.parametrize("model, batched", [
    ("libtorch_sequence_int32", True), ("libtorch_nobatch_sequence_int32", False), ("libtorch_zero_sequence_int32", True),
    ("libtorch_named_sequence_int32", True),
])
def test_a_torchscript_model_carries_its_implicit_state_from_request_to_request(libtorch_stateful, model, batched):
    assert _libtorch_sums(libtorch_stateful, model, [1, 2, 3], 30, batched=batched) == [1, 3, 6]
    assert _libtorch_sums(libtorch_stateful, model, [7, 1], 30, batched=batched) == [7, 8]  # a new sequence starts over


def test_a_torchscript_string_state(libtorch_stateful):
    assert _libtorch_sums(libtorch_stateful, "libtorch_nobatch_sequence_object", [b"1", b"2", b"30"], 31,
                          batched=False, string=True) == ["1", "3", "33"]


def test_interleaved_torchscript_sequences_keep_their_own_state_in_one_batch(libtorch_stateful):
    results = _interleaved(
        lambda values, sequence_id: _libtorch_sums(libtorch_stateful, "libtorch_sequence_int32", values, sequence_id,
                                                   batched=True),
        {40: [1, 1, 1, 1], 41: [10, 10, 10]},
    )
    assert results == {40: [1, 2, 3, 4], 41: [10, 20, 30]}


@pytest.mark.parametrize("state_input, message", [
    ("INPUT_STATE", "state input 'INPUT_STATE' of model 'bad' does not follow the <name>__<index> convention"),
    ("INPUT_STATE__0", "inputs 'INPUT__0' and 'INPUT_STATE__0' of model 'bad' both name forward argument 0"),
])
def test_a_torchscript_state_input_tritonserver_would_misplace_is_refused(tmp_path, state_input, message):
    repo = tmp_path / "models"
    _libtorch_implicit(repo, "bad", ImplicitSequenceNet(), max_batch=8, state_input=state_input)
    result = invoke(["validate", str(repo)])
    assert result.exit_code != 0
    assert message in " ".join(result.output.split())


def test_a_torchscript_state_output_is_found_by_its_index_as_the_backend_reads_it():
    from handlers.backends.pytorch.config import ConfigError, output_layout

    def layout(output_name: str, dtype: str = "TYPE_INT32"):
        config = {"name": "m", "max_batch_size": 8, "output": [{"name": "OUTPUT__0", "data_type": "TYPE_INT32", "dims": [1]}],
                  "sequence_batching": {"state": [{"input_name": "S__1", "output_name": output_name,
                                                   "data_type": dtype, "dims": [1]}]}}
        return output_layout(config, [])

    assert layout("OUTPUT_STATE__1").positions == {"OUTPUT__0": 0, "OUTPUT_STATE__1": 1}
    assert layout("OUTPUT_STATE__12x").positions["OUTPUT_STATE__12x"] == 12  # std::atoi reads the leading digits
    assert layout("OUTPUT_STATE").positions["OUTPUT_STATE"] == 0  # no "__": std::atoi of the name less its first letter
    with pytest.raises(ConfigError, match="unsupported datatype TYPE_UINT32 for state 'T__1' for model 'm'"):
        layout("T__1", "TYPE_UINT32")
    with pytest.raises(ConfigError, match="Triton only supports 1 dimensional List of String as output for 'T__1'"):
        layout("T__1", "TYPE_STRING")
