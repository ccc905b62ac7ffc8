"""Decoupled Python models (model_transaction_policy { decoupled: true }) in the runtime, in both
instance modes (a model process of its own, and in-process): python_backend's response sender
rules and messages (measured on tritonserver 2.51), responses sent after `execute` returned, BLS
`exec(decoupled=True)`, cancellation, dynamic batching, statistics; and what the compiler and the
build report say about them. The HTTP side (generate, generate_stream, infer) is
test_decoupled_http.py."""

from __future__ import annotations

import asyncio
import json
import time

import numpy as np
import pytest
from decoupled_repository import write_repository
from python_models.repository import close, load

import model_builders as mb
from handlers.errors import ErrorCode
from handlers.inference import InferRequest
from handlers.protocol.validation import validate_request
from handlers.streaming import StreamEvent
from toolkit.build.report import target_warnings
from toolkit.build.targets import TARGETS
from toolkit.repository.compile import compile_repository

FAILED = "Failed to process the request(s) for model 'probe_0_0', message: "


@pytest.fixture(scope="module", params=["process", "inprocess"])
def repository(request, tmp_path_factory):
    repo = write_repository(tmp_path_factory.mktemp(f"decoupled-{request.param}") / "models", request.param)
    loaded = load(repo)
    assert all(m.ready for by_version in loaded.models.values() for m in by_version.values()), loaded.index()
    yield loaded
    close(loaded)


def run(repository, model: str, timeout: float = 60, **inputs) -> list[StreamEvent]:
    """Every event of one request, read from its response stream."""
    return asyncio.run(_events(repository, model, timeout, inputs))


async def _events(repository, model, timeout, inputs, request_id="r1"):
    loaded = repository.get(model)
    request = InferRequest(model, loaded.version, {k: np.asarray(v) for k, v in inputs.items()}, id=request_id)
    validate_request(loaded.spec.config, request)
    return await asyncio.wait_for(loaded.stream(request).collect(), timeout)


def outputs(event: StreamEvent) -> dict:
    return {name: np.asarray(a).tolist() for name, a in event.response.outputs.items()} if event.response else {}


def texts(events) -> list:
    """Each event as (OUT texts or the error, its code, final)."""
    out = []
    for e in events:
        if e.error is not None:
            out.append((e.error.message, e.error.code.name, e.final))
        elif e.response is not None:
            out.append(([x.decode() for x in e.response.outputs["OUT"].reshape(-1)], None, e.final))
        else:
            out.append((None, None, e.final))
    return out


def probe(repository, mode: int, count: int | None = None) -> list:
    inputs = {"MODE": np.array([mode], np.int32)}
    if count is not None:
        inputs["COUNT"] = np.array([count], np.int32)
    return texts(run(repository, "probe", **inputs))


# -- the examples' behaviours ---------------------------------------------------------------------


def test_repeat_sends_one_response_per_element_from_its_thread(repository):
    events = run(repository, "repeat", IN=np.array([4, 2, 0, 1], np.int32), DELAY=np.array([1, 2, 3, 4], np.uint32),
                 WAIT=np.array([5], np.uint32))
    assert [outputs(e) for e in events[:-1]] == [{"IDX": [i], "OUT": [v]} for i, v in enumerate([4, 2, 0, 1])]
    assert [e.final for e in events] == [False] * 4 + [True] and events[-1].response is None and events[-1].error is None
    assert run(repository, "repeat", IN=np.array([], np.int32), DELAY=np.array([], np.uint32),
               WAIT=np.array([0], np.uint32)) == [StreamEvent(None, None, True)]


def test_square_answers_n_times_and_requests_interleave_on_one_instance(repository):
    async def several():
        return await asyncio.gather(*(
            _events(repository, "square", 60, {"IN": np.array([n], np.int32)}, request_id=str(i))
            for i, n in enumerate([4, 2, 0, 1])
        ))

    results = asyncio.run(several())
    for n, events in zip([4, 2, 0, 1], results):
        assert [outputs(e) for e in events[:-1]] == [{"OUT": [n]}] * n
        assert events[-1] == StreamEvent(None, None, True)
    # the repeat model returns from execute before its responses are sent: a second request runs
    # on the same (single) instance while the first one is still streaming
    async def overlapping():
        slow = _events(repository, "repeat", 60, {"IN": np.array([1, 2], np.int32), "DELAY": np.array([300, 300], np.uint32),
                                                   "WAIT": np.array([0], np.uint32)}, "slow")
        fast = _events(repository, "repeat", 60, {"IN": np.array([9], np.int32), "DELAY": np.array([0], np.uint32),
                                                   "WAIT": np.array([0], np.uint32)}, "fast")
        finished = []

        async def timed(name, coroutine):
            events = await coroutine
            finished.append(name)
            return events

        return await asyncio.gather(timed("slow", slow), timed("fast", fast)), finished

    (slow, fast), finished = asyncio.run(overlapping())
    assert finished == ["fast", "slow"]
    assert [outputs(e)["OUT"] for e in slow[:-1]] == [[1], [2]] and [outputs(e)["OUT"] for e in fast[:-1]] == [[9]]


# -- response sender rules (response_sender.cc, pb_stub.cc), as tritonserver 2.51 answers ----------


def test_responses_and_the_final_flag(repository):
    assert probe(repository, 0) == [(["r0"], None, False), (["r1"], None, False), (None, None, True)]
    assert probe(repository, 1) == [(["r0"], None, False), (["r1"], None, True)]
    assert probe(repository, 14) == [(None, None, True)]
    assert probe(repository, 11, 100) == [(["late"], None, True)]  # sent after execute returned


def test_errors_end_the_stream_or_not_as_in_triton(repository):
    raised = probe(repository, 2)
    assert raised[0] == (["before raise"], None, False)
    assert raised[1][0].startswith(FAILED + "ValueError: boom after one response\n\nAt:\n")
    assert raised[1][1:] == ("INTERNAL", True) and len(raised) == 2
    first = probe(repository, 13)
    assert len(first) == 1 and first[0][0].startswith(FAILED + "RuntimeError: raised before sending") and first[0][2]
    none_only = FAILED + "Python model 'probe_0_0' is using the decoupled mode and the execute function must return None."
    assert probe(repository, 3) == [(none_only, "INTERNAL", True)]
    assert probe(repository, 17) == [(none_only, "INTERNAL", True)]
    # an error response does not end the stream; its code is the model's
    assert probe(repository, 8) == [("first failed", "INTERNAL", False), (["after error"], None, False), (None, None, True)]
    assert probe(repository, 9) == [("only error", "INVALID_ARG", True)]


def test_sender_misuse_raises_tritons_exceptions(repository):
    assert probe(repository, 4) == [(["final"], None, True)]
    assert probe(repository, 5) == [([
        "TritonModelException: Inference Response object must be provided when the response flags is set to zero. | "
        "TritonModelException: Unable to send response. Unsupported flag provided. | "
        "TypeError: send(): incompatible function arguments. The following argument types are supported:"
    ], None, True)]
    log = json.loads(probe(repository, 6)[0][0][0])
    assert log[:2] == ["TritonModelException: Unable to send response. Response sender has been closed."] * 2


def test_a_dropped_sender_ends_the_stream_instead_of_leaving_it_open(repository):
    # tritonserver never answers such a request; here the stream ends with an error
    assert probe(repository, 7) == [(
        "Python model 'probe_0_0' released the response sender of this request without sending "
        "TRITONSERVER_RESPONSE_COMPLETE_FINAL: no further response will come", "INTERNAL", True,
    )]


def test_cancelling_a_stream_tells_the_model(repository):
    async def cancel_after_first():
        loaded = repository.get("probe")
        request = InferRequest("probe", 1, {"MODE": np.array([10], np.int32)}, id="c")
        stream = loaded.stream(request)
        first = await asyncio.wait_for(anext(stream), 30)
        stream.cancel()
        return first, [e async for e in stream]

    first, rest = asyncio.run(cancel_after_first())
    assert texts([first]) == [(["waiting for cancellation"], None, False)] and rest == []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        log = json.loads(probe(repository, 6)[0][0][0])
        if "cancelled: request True sender True" in log:
            break
        time.sleep(0.05)
    assert "cancelled: request True sender True" in log


def test_a_queued_request_that_is_cancelled_frees_its_slot(repository):
    async def scenario():
        loaded = repository.get("probe")
        busy = loaded.stream(InferRequest("probe", 1, {"MODE": np.array([19], np.int32)}, id="busy"))
        while loaded.scheduler.queued():  # until the instance executes "busy" (which waits for its cancel)
            await asyncio.sleep(0.01)
        queued = loaded.stream(InferRequest("probe", 1, {"MODE": np.array([0], np.int32)}, id="queued"))
        assert loaded.scheduler.queued() == 1
        before = loaded.statistics.as_dict()["inference_stats"]["fail"]["count"]
        queued.cancel()
        assert loaded.scheduler.queued() == 0
        failed = loaded.statistics.as_dict()["inference_stats"]["fail"]["count"] - before
        busy.cancel()  # the model's execute sees it and returns
        return failed, [e async for e in queued]

    failed, rest = asyncio.run(scenario())
    assert failed == 1 and rest == []
    assert probe(repository, 0, 1) == [(["r0"], None, False), (None, None, True)]  # the instance is free again


def test_a_model_process_that_dies_ends_its_open_streams(tmp_path):
    # a model process (Triton's layout) can die without the server: tritonserver 2.51 leaves a
    # decoupled model broken ("TODO: Implement restart on decoupled"); here its streams end with
    # the error and the next batch starts a fresh process
    repository = load(write_repository(tmp_path / "models", "process", models=("probe",)))
    try:
        events = probe(repository, 18)
        assert events == [(["before exit"], None, False), ("Stub process 'probe_0_0' is not healthy.", "INTERNAL", True)]
        assert probe(repository, 0, 1) == [(["r0"], None, False), (None, None, True)]
    finally:
        close(repository)


# -- async execute, BLS -----------------------------------------------------------------------------


def test_async_execute_streams_in_the_background(repository):
    events = run(repository, "async", X=np.array([3], np.int32))
    assert [outputs(e) for e in events[:-1]] == [{"Y": [0]}, {"Y": [1]}, {"Y": [2]}] and events[-1].final
    failed = run(repository, "async", X=np.array([-1], np.int32))
    assert outputs(failed[0]) == {"Y": [0]} and failed[1].final and failed[1].error.code is ErrorCode.INTERNAL
    assert failed[1].error.message.startswith(
        "Failed to process the request(s) for model 'async_0', message: ValueError: async execute failed mid-stream"
    )
    streamed = run(repository, "async_bls", X=np.array([3], np.int32))
    assert [outputs(e) for e in streamed[:-1]] == [{"Y": [3]}] * 3 and streamed[-1].final


def bls(repository, which: int) -> tuple[int, list]:
    (event,) = run(repository, "bls", IN=np.array([3], np.int32), WHICH=np.array([which], np.int32))
    return int(event.response.outputs["SUM"][0]), json.loads(event.response.outputs["LOG"][0])


def test_bls_exec_decoupled_iterates_every_response(repository):
    # values recorded from tritonserver 2.51 for the same calls
    assert bls(repository, 0) == (9, [[None, ["OUT"]], [None, ["OUT"]], [None, ["OUT"]], [None, []]])
    _, log = bls(repository, 1)
    assert log == [[
        "Model square - Error when running inference: Model square is using the decoupled. The current BLS request call "
        "doesn't support models using the decoupled transaction policy. Please use 'decoupled=True' argument to the "
        "'exec' or 'async_exec' calls for decoupled models.'", []
    ]]
    assert bls(repository, 2)[1] == [[None, ["text_output"]]]
    assert bls(repository, 3)[1] == [[
        "Model nope - Error when running inference: Failed for execute the inference request. Model 'nope' is not ready.", []
    ]]
    # error responses travel in the iterator (tritonserver 2.51 hangs on these calls)
    errors = bls(repository, 4)[1]
    assert errors[0] == [8, "first failed", []] and errors[1] == [8, None, ["OUT"]] and errors[2] == [8, None, []]
    assert errors[3] == [2, None, ["OUT"]]
    assert errors[4][1].startswith(FAILED + "ValueError: boom after one response") and errors[5] == [9, "only error", []]
    # iterating again starts over from the first response (ResponseIterator::Iter)
    assert bls(repository, 5)[1] == [[1, 1, 1, 0], [1, 1, 1, 0]]


# -- dynamic batching and statistics ---------------------------------------------------------------


def settled(loaded, key: str, value: int) -> dict:
    """The statistics once `key` reached `value` (they are reported when execute returns)."""
    deadline = time.monotonic() + 30
    while True:
        stats = loaded.statistics.as_dict()
        if stats[key] >= value or time.monotonic() > deadline:
            return stats
        time.sleep(0.01)


def test_dynamic_batching_batches_decoupled_requests_and_counts_them_as_triton(repository):
    loaded = repository.get("batched")
    before = loaded.statistics.as_dict()

    async def three():
        return await asyncio.gather(*(
            _events(repository, "batched", 60, {"IN": np.array([[n]], np.int32)}, request_id=str(n)) for n in (1, 2, 3)
        ))

    for n, events in zip((1, 2, 3), asyncio.run(three())):
        assert [outputs(e) for e in events[:-1]] == [{"OUT": [[n]]}] * n and events[-1].final
    # a request is counted when its execute returns, which may be after its last response
    after = settled(loaded, "execution_count", before["execution_count"] + 1)
    assert after["execution_count"] - before["execution_count"] == 1
    assert after["inference_count"] - before["inference_count"] == 3
    assert {b["batch_size"]: b["compute_infer"]["count"] for b in after["batch_stats"]}[3] == 1
    assert after["response_stats"] == {}  # the python backend reports no per-response statistics


def test_failed_executions_count_as_failures_not_inferences(repository):
    loaded = repository.get("probe")
    before = loaded.statistics.as_dict()
    probe(repository, 13)  # execute raises
    probe(repository, 0)
    after = settled(loaded, "execution_count", before["execution_count"] + 2)
    assert after["execution_count"] - before["execution_count"] == 2
    assert after["inference_count"] - before["inference_count"] == 1
    assert after["inference_stats"]["fail"]["count"] - before["inference_stats"]["fail"]["count"] == 1
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] == 1


def test_one_response_apis_refuse_decoupled_models(repository):
    loaded = repository.get("square")
    request = InferRequest("square", 1, {"IN": np.array([1], np.int32)})
    with pytest.raises(Exception, match="HTTP end point doesn't support models with decoupled transaction policy"):
        asyncio.run(loaded.infer(request))
    # a model that is not decoupled streams its one response as a final event
    events = run(repository, "echo", text_input=np.array([[b"hi"]], dtype=object))
    assert len(events) == 1 and events[0].final and outputs(events[0]) == {"text_output": [[b"hi"]]}


# -- compiler and build report ---------------------------------------------------------------------


def test_compiler_serves_decoupled_python_models_and_refuses_the_rest(tmp_path):
    repo = write_repository(tmp_path / "models", models=("square",))
    mb.add_sub(repo / "onnx_dec" / "1" / "model.onnx")
    (repo / "onnx_dec" / "config.pbtxt").write_text(
        'backend: "onnxruntime"\nmax_batch_size: 0\nmodel_transaction_policy { decoupled: true }\n'
    )
    (repo / "chain" / "1").mkdir(parents=True)
    (repo / "chain" / "config.pbtxt").write_text("""
        platform: "ensemble"
        max_batch_size: 0
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        ensemble_scheduling { step [ { model_name: "square" model_version: -1
          input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "OUT" } } ] }
    """)
    result = compile_repository(repo)
    assert result.models["square"].config["model_transaction_policy"] == {"decoupled": True}
    assert result.failures["onnx_dec"].unsupported
    assert "decoupled (streaming) models are served for backend \"python\" only" in result.failures["onnx_dec"].message
    # a decoupled step makes the ensemble decoupled (ValidateEnsembleConfig): it streams (test_decoupled_ensembles.py)
    assert "chain" not in result.failures
    assert result.models["chain"].config["model_transaction_policy"] == {"decoupled": True}


def test_build_report_says_what_lambda_does_with_decoupled_models(tmp_path):
    compiled = compile_repository(write_repository(tmp_path / "models", models=("square", "echo")))
    assert compiled.ok, compiled.failures
    lambda_notes = "\n".join(target_warnings(TARGETS["lambda"], compiled, []))
    assert "square: decoupled (streaming) model(s) on AWS Lambda" in lambda_notes
    assert "generate_stream is refused (501)" in lambda_notes and "6 MB" in lambda_notes and "echo:" not in lambda_notes
    cloudrun = "\n".join(target_warnings(TARGETS["cloudrun"], compiled, []))
    assert "square: decoupled (streaming) model(s) stream server-sent events" in cloudrun
    plain = compile_repository(write_repository(tmp_path / "plain", models=("echo",)))
    assert "decoupled" not in "\n".join(target_warnings(TARGETS["lambda"], plain, []))


def test_a_decoupled_model_of_another_backend_does_not_load(tmp_path):
    # the compiler refuses it; a manifest edited by hand must not hang its clients either
    from handlers.manifest import Manifest
    from handlers.model_repository import ModelRepository

    repo = tmp_path / "models"
    mb.add_sub(repo / "add_sub" / "1" / "model.onnx")
    (repo / "add_sub" / "config.pbtxt").write_text('backend: "onnxruntime"\nmax_batch_size: 0\n')
    compiled = compile_repository(repo)
    document = compiled.manifest()
    document["models"][0]["config"]["model_transaction_policy"] = {"decoupled": True}
    repository = ModelRepository(Manifest.from_dict(document, root=compiled.root))
    repository.load(exit_on_error=False)
    model = repository.models["add_sub"][1]
    assert not model.ready and model.reason == (
        "backend 'onnxruntime' does not serve decoupled models (model_transaction_policy { decoupled: true }); "
        "only backend 'python' does"
    )
