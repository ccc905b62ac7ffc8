"""The threaded DynamicBatcher with real worker threads and test instances.

Batch formation is observed deterministically: a `GatedInstance` reports every batch it starts
and holds it until the test releases it, so the test knows exactly which instances are busy when
it submits the next requests. Requests queued before start() count as arriving together (like
tritonserver's TRITONSERVER_DELAY_SCHEDULER). Nothing here sleeps to synchronise; the only real
timing assertion (the queue delay) uses the requests' own timestamps and generous bounds.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable

import model_builders as mb
import numpy as np
import onnxruntime as ort
import pytest

from handlers.batching import BatchExecution, DynamicBatcher, FailureReason, OnLoop, merge_inputs, split_outputs
from handlers.batching.batcher import BatcherState
from handlers.errors import ErrorCode, InferenceError, invalid_argument
from handlers.inference import InferOutcome, InferRequest, InferResponse

WAIT = 10.0  # seconds: generous bound for anything that should happen at once


def config(max_batch_size: int = 8, dims=(4,), dynamic_batching: dict | None = None) -> dict:
    data = {
        "name": "m",
        "max_batch_size": max_batch_size,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": list(dims)}],
    }
    if dynamic_batching is not None:
        data["dynamic_batching"] = dynamic_batching
    return data


def request(name: str, batch_size: int = 1, *, width: int = 4, **fields) -> InferRequest:
    x = np.full((batch_size, width), float(len(name)), np.float32)
    return InferRequest("m", 1, {"x": x}, id=name, batch_size=batch_size, **fields)


def echo(requests: list[InferRequest]) -> list[InferOutcome]:
    return [InferResponse(r.model_name, r.model_version, {"y": r.inputs["x"]}, id=r.id) for r in requests]


class GatedInstance:
    """Reports each batch it starts (to its own queue and to a shared one) and, when gated,
    holds it until the test calls release()."""

    def __init__(
        self,
        name: str,
        events: queue.Queue | None = None,
        *,
        gated: bool = True,
        behaviour: Callable[[list[InferRequest]], list[InferOutcome]] = echo,
    ) -> None:
        self.name = name
        self.gated = gated
        self.behaviour = behaviour
        self.batches: list[list[str]] = []
        self.started: queue.Queue[list[str]] = queue.Queue()
        self.events = events
        self._gate = threading.Semaphore(0)

    def execute(self, requests: list[InferRequest]) -> list[InferOutcome]:
        ids = [r.id for r in requests]
        self.batches.append(ids)
        self.started.put(ids)
        if self.events is not None:
            self.events.put((self.name, ids))
        if self.gated and not self._gate.acquire(timeout=60):
            raise RuntimeError("the test never released this batch")
        return self.behaviour(requests)

    def release(self, batches: int = 1) -> None:
        for _ in range(batches):
            self._gate.release()

    def next_batch(self) -> list[str]:
        return self.started.get(timeout=WAIT)


class Results:
    """Callbacks that record each request's outcome (and the order outcomes arrive in)."""

    def __init__(self) -> None:
        self.outcomes: dict[str, InferOutcome] = {}
        self.order: list[str] = []
        self.threads: dict[str, str] = {}
        self._cv = threading.Condition()

    def callback(self, name: str) -> Callable[[InferOutcome], None]:
        def record(outcome: InferOutcome) -> None:
            with self._cv:
                assert name not in self.outcomes, f"{name} answered twice"
                self.outcomes[name] = outcome
                self.order.append(name)
                self.threads[name] = threading.current_thread().name
                self._cv.notify_all()

        return record

    def wait(self, *names: str) -> list[InferOutcome]:
        with self._cv:
            assert self._cv.wait_for(lambda: all(n in self.outcomes for n in names), timeout=WAIT), (
                f"no outcome for {[n for n in names if n not in self.outcomes]}"
            )
            return [self.outcomes[n] for n in names]


def submit(batcher: DynamicBatcher, results: Results, name: str, batch_size: int = 1, **fields):
    return batcher.submit(request(name, batch_size, **fields), results.callback(name))


@pytest.fixture
def batchers():
    made: list[DynamicBatcher] = []
    yield made
    for batcher in made:
        for instance in batcher.instances:
            if isinstance(instance, GatedInstance):
                instance.gated = False
                instance.release(100)
        batcher.stop(drain=False, timeout=WAIT)


def make(batchers, cfg: dict, instances, **kwargs) -> DynamicBatcher:
    batcher = DynamicBatcher("m", cfg, instances, **kwargs)
    batchers.append(batcher)
    return batcher


# -- the seeds' example: A,B,C,D,E with batch sizes 4,2,2,6,2, max batch 8 -------------------------


def test_seeds_example_one_instance_without_delay(batchers):
    instance = GatedInstance("m_0")
    batcher = make(batchers, config(dynamic_batching={}), [instance])
    results = Results()
    submit(batcher, results, "A", 4)  # A and C arrive together
    submit(batcher, results, "C", 2)
    batcher.start()
    assert instance.next_batch() == ["A", "C"]
    submit(batcher, results, "B", 2)  # B, D, E arrive while A,C execute
    submit(batcher, results, "D", 6)
    submit(batcher, results, "E", 2)
    instance.release()
    assert instance.next_batch() == ["B", "D"]
    instance.release()
    assert instance.next_batch() == ["E"]
    instance.release()
    for name, outcome in zip("ACBDE", results.wait(*"ACBDE")):
        assert isinstance(outcome, InferResponse) and outcome.id == name


def test_seeds_example_two_instances_without_delay(batchers):
    events: queue.Queue = queue.Queue()
    instances = [GatedInstance("m_0", events), GatedInstance("m_1", events)]
    batcher = make(batchers, config(dynamic_batching={}), instances)
    results = Results()
    submit(batcher, results, "A", 4)
    submit(batcher, results, "C", 2)
    batcher.start()
    first, batch = events.get(timeout=WAIT)
    assert batch == ["A", "C"]
    submit(batcher, results, "B", 2)  # the second instance is free: B runs at once, alone
    second, batch = events.get(timeout=WAIT)
    assert batch == ["B"] and second != first
    submit(batcher, results, "D", 6)  # both instances busy
    submit(batcher, results, "E", 2)
    by_name = {i.name: i for i in instances}
    by_name[first].release()
    assert events.get(timeout=WAIT) == (first, ["D", "E"])  # the instance that ran A,C takes D,E
    by_name[second].release()
    by_name[first].release()
    results.wait(*"ABCDE")


def _wait_until_free(batcher: DynamicBatcher, workers: int) -> None:
    """Until `workers` workers wait for requests (the batcher's own counts, read under its lock)."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        with batcher._lock:
            if batcher._idle_workers + batcher._leading == workers:
                return
        time.sleep(0.001)
    raise AssertionError(f"{workers} worker(s) never became free")


def test_free_instances_take_requests_as_they_arrive(batchers):
    """Two free instances, two requests submitted back to back by one thread (as the event loop
    submits what one turn read): each goes to its own instance at once, alone. The batch is formed
    in submit, as tritonserver's batcher thread forms it when a request wakes it; a woken worker
    would only look at the queue after the submitting thread let it run, and find both."""
    events: queue.Queue = queue.Queue()
    instances = [GatedInstance("m_0", events), GatedInstance("m_1", events)]
    batcher = make(batchers, config(dynamic_batching={}), instances)
    results = Results()
    batcher.start()
    _wait_until_free(batcher, 2)
    submit(batcher, results, "a", 2)
    assert batcher.queued() == 0  # taken at arrival, before submit returned
    submit(batcher, results, "b", 2)
    assert batcher.queued() == 0
    started = sorted([events.get(timeout=WAIT), events.get(timeout=WAIT)])
    assert sorted(batch for _, batch in started) == [["a"], ["b"]]  # one each, either way round
    assert {name for name, _ in started} == {"m_0", "m_1"}
    submit(batcher, results, "c", 2)  # both busy: c waits in the queue for the first free one
    assert batcher.queued() == 1
    instances[1].release()
    assert events.get(timeout=WAIT) == ("m_1", ["c"])
    instances[0].release()
    instances[1].release()
    results.wait("a", "b", "c")


def test_a_free_instance_still_waits_out_the_queue_delay(batchers):
    """Formed at arrival or not, a batch under max_queue_delay waits for company: the request
    stays queued, and the next one joins it."""
    instance = GatedInstance("m_0")
    batcher = make(batchers, config(dynamic_batching={"max_queue_delay_microseconds": 60_000_000,
                                                      "preferred_batch_size": [4]}), [instance])
    results = Results()
    batcher.start()
    _wait_until_free(batcher, 1)
    submit(batcher, results, "a", 2)
    assert batcher.queued() == 1
    submit(batcher, results, "b", 2)  # preferred size 4 reached: sent at once, both together
    assert batcher.queued() == 0
    assert instance.next_batch() == ["a", "b"]
    instance.release()
    results.wait("a", "b")


def test_seeds_example_one_instance_with_delay(batchers):
    # A long delay: A,C (6 of 8) wait for company; B completes a batch of 8, which goes at once.
    instance = GatedInstance("m_0")
    batcher = make(
        batchers, config(dynamic_batching={"max_queue_delay_microseconds": 60_000_000}), [instance]
    )
    results = Results()
    submit(batcher, results, "A", 4)
    submit(batcher, results, "C", 2)
    batcher.start()
    submit(batcher, results, "B", 2)
    assert instance.next_batch() == ["A", "C", "B"]
    submit(batcher, results, "D", 6)
    submit(batcher, results, "E", 2)
    instance.release()
    assert instance.next_batch() == ["D", "E"]
    instance.release()
    results.wait(*"ABCDE")


def test_seeds_example_two_instances_with_delay(batchers):
    events: queue.Queue = queue.Queue()
    instances = [GatedInstance("m_0", events), GatedInstance("m_1", events)]
    batcher = make(batchers, config(dynamic_batching={"max_queue_delay_microseconds": 60_000_000}), instances)
    results = Results()
    submit(batcher, results, "A", 4)
    submit(batcher, results, "C", 2)
    batcher.start()
    submit(batcher, results, "B", 2)
    first, batch = events.get(timeout=WAIT)
    assert batch == ["A", "C", "B"]
    submit(batcher, results, "D", 6)
    submit(batcher, results, "E", 2)
    second, batch = events.get(timeout=WAIT)  # while A,C,B still execute
    assert batch == ["D", "E"] and second != first
    for instance in instances:
        instance.release()
    results.wait(*"ABCDE")


def test_without_dynamic_batching_requests_run_alone_in_parallel(batchers):
    events: queue.Queue = queue.Queue()
    instances = [GatedInstance("m_0", events), GatedInstance("m_1", events)]
    batcher = make(batchers, config(), instances)
    results = Results()
    for name in "abc":
        submit(batcher, results, name)
    batcher.start()
    started = dict(events.get(timeout=WAIT) for _ in range(2))
    assert sorted(started) == ["m_0", "m_1"]  # both instances busy at once
    assert sorted(started.values()) == [["a"], ["b"]]
    for instance in instances:
        instance.release(2)
    results.wait("a", "b", "c")
    assert sorted(b for i in instances for b in i.batches) == [["a"], ["b"], ["c"]]


# -- delay -----------------------------------------------------------------------------------------------


def test_queue_delay_is_respected(batchers):
    delay_us = 250_000
    instance = GatedInstance("m_0", gated=False)
    batcher = make(batchers, config(dynamic_batching={"max_queue_delay_microseconds": delay_us}), [instance])
    results = Results()
    first = request("a")
    batcher.submit(first, results.callback("a"))
    submit(batcher, results, "b")
    batcher.start()
    results.wait("a", "b")
    assert instance.batches == [["a", "b"]]  # sent together, as is, once the delay ran out
    waited_ns = first.compute_start_ns - first.queue_start_ns
    assert delay_us * 1000 <= waited_ns < delay_us * 1000 + WAIT * 1e9


def test_a_preferred_size_cuts_the_delay_short(batchers):
    instance = GatedInstance("m_0", gated=False)
    cfg = config(dynamic_batching={"preferred_batch_size": [2], "max_queue_delay_microseconds": 60_000_000})
    batcher = make(batchers, cfg, [instance])
    batcher.start()
    results = Results()
    submit(batcher, results, "a")
    submit(batcher, results, "b")
    results.wait("a", "b")  # well before the 60 s delay
    assert instance.batches == [["a", "b"]]


def test_no_queue_delay_sends_requests_at_once(batchers):
    instance = GatedInstance("m_0", gated=False)
    cfg = config(dynamic_batching={"max_queue_delay_microseconds": 60_000_000})
    batcher = make(batchers, cfg, [instance], no_queue_delay=True)
    batcher.start()
    results = Results()
    submit(batcher, results, "a")
    results.wait("a")
    assert instance.batches == [["a"]]


# -- shapes, priorities, queue policies ----------------------------------------------------------------


def test_requests_with_different_shapes_are_not_mixed(batchers):
    instance = GatedInstance("m_0", gated=False)
    batcher = make(batchers, config(dims=(-1,), dynamic_batching={}), [instance])
    results = Results()
    for name, width in [("a", 3), ("b", 3), ("c", 5), ("d", 3)]:
        submit(batcher, results, name, width=width)
    batcher.start()
    results.wait(*"abcd")
    assert instance.batches == [["a", "b"], ["c"], ["d"]]


def test_priorities_let_requests_bypass_lower_ones(batchers):
    instance = GatedInstance("m_0", gated=False)
    cfg = config(max_batch_size=2, dynamic_batching={"priority_levels": 2, "default_priority_level": 2})
    batcher = make(batchers, cfg, [instance])
    results = Results()
    submit(batcher, results, "low1", priority=2)
    submit(batcher, results, "low2", priority=0)  # the default level
    submit(batcher, results, "low3", priority=9)  # out of range: the default level
    submit(batcher, results, "high", priority=1)
    batcher.start()
    results.wait("low1", "low2", "low3", "high")
    assert instance.batches == [["high", "low1"], ["low2", "low3"]]


def test_queue_full_is_refused_synchronously(batchers):
    instance = GatedInstance("m_0")
    cfg = config(dynamic_batching={"default_queue_policy": {"max_queue_size": 1}})
    batcher = make(batchers, cfg, [instance])
    batcher.start()
    results = Results()
    submit(batcher, results, "running")
    assert instance.next_batch() == ["running"]
    submit(batcher, results, "queued")
    with pytest.raises(InferenceError) as err:
        submit(batcher, results, "r2")
    assert err.value.code is ErrorCode.UNAVAILABLE and err.value.http_status == 503
    assert err.value.message == "[request id: r2] Exceeds maximum queue size"

    async def via_infer():
        with pytest.raises(
            InferenceError, match=r"^\[request id: <id_unknown>\] Exceeds maximum queue size$"
        ):
            await batcher.infer(request(""))

    asyncio.run(via_infer())
    instance.release()
    assert instance.next_batch() == ["queued"]
    instance.release()
    results.wait("running", "queued")
    assert "r2" not in results.outcomes


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000_000_000
        self._lock = threading.Lock()

    def __call__(self) -> int:
        with self._lock:
            return self.now

    def advance(self, ns: int) -> None:
        with self._lock:
            self.now += ns


class Recorder:
    """A BatcherObserver that records every event."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self._lock = threading.Lock()

    def _add(self, *event) -> None:
        with self._lock:
            self.events.append(event)

    def request_queued(self, request):
        self._add("queued", request.id)

    def batch_started(self, instance, requests):
        self._add("started", instance, [r.id for r in requests])

    def batch_executed(self, execution: BatchExecution):
        self._add("executed", execution)

    def request_succeeded(self, instance, request):
        self._add("succeeded", instance, request.id)

    def request_failed(self, instance, request, error, reason):
        self._add("failed", instance, request.id, error.message, reason)


def test_queue_timeout_rejects_with_tritons_error(batchers):
    clock = FakeClock()
    recorder = Recorder()
    instance = GatedInstance("m_0")
    cfg = config(
        dynamic_batching={
            "default_queue_policy": {"timeout_action": "REJECT", "default_timeout_microseconds": 1000}
        }
    )
    batcher = make(batchers, cfg, [instance], clock=clock, observer=recorder)
    batcher.start()
    results = Results()
    submit(batcher, results, "running")
    assert instance.next_batch() == ["running"]
    submit(batcher, results, "late")
    clock.advance(1_000_001)  # just past its 1 ms queue timeout
    submit(batcher, results, "fresh")
    instance.release()
    assert instance.next_batch() == ["fresh"]
    instance.release()
    late, fresh = results.wait("late", "fresh")
    assert isinstance(late, InferenceError)
    assert (late.code, late.http_status, late.message) == (
        ErrorCode.UNAVAILABLE,
        503,
        "Request timeout expired",
    )
    assert isinstance(fresh, InferResponse)
    assert ("failed", None, "late", "Request timeout expired", FailureReason.REJECTED) in recorder.events


def test_queue_timeout_delay_moves_the_request_behind(batchers):
    clock = FakeClock()
    instance = GatedInstance("m_0")
    cfg = config(
        dynamic_batching={
            "default_queue_policy": {"timeout_action": "DELAY", "default_timeout_microseconds": 1000}
        }
    )
    batcher = make(batchers, cfg, [instance], clock=clock)
    batcher.start()
    results = Results()
    submit(batcher, results, "running")
    assert instance.next_batch() == ["running"]
    submit(batcher, results, "late")
    clock.advance(2_000_000)
    submit(batcher, results, "fresh")
    instance.release()
    assert instance.next_batch() == ["fresh", "late"]
    instance.release()
    assert all(isinstance(o, InferResponse) for o in results.wait("running", "late", "fresh"))


def test_request_timeout_override(batchers):
    clock = FakeClock()
    instance = GatedInstance("m_0")
    cfg = config(
        dynamic_batching={
            "default_queue_policy": {
                "default_timeout_microseconds": 60_000_000,
                "allow_timeout_override": True,
            }
        }
    )
    batcher = make(batchers, cfg, [instance], clock=clock)
    batcher.start()
    results = Results()
    submit(batcher, results, "running")
    assert instance.next_batch() == ["running"]
    submit(batcher, results, "short", timeout_us=100)
    submit(batcher, results, "default")
    clock.advance(200_000)
    instance.release()
    assert instance.next_batch() == ["default"]
    instance.release()
    short, default = results.wait("short", "default")
    assert isinstance(short, InferenceError) and short.message == "Request timeout expired"
    assert isinstance(default, InferResponse)


# -- ordering ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("preserve", [True, False])
def test_preserve_ordering_across_instances(batchers, preserve):
    events: queue.Queue = queue.Queue()
    instances = [GatedInstance("m_0", events), GatedInstance("m_1", events)]
    cfg = config(max_batch_size=1, dynamic_batching={"preserve_ordering": preserve})
    batcher = make(batchers, cfg, instances)
    results = Results()
    submit(batcher, results, "r1")
    submit(batcher, results, "r2")
    batcher.start()
    started = dict(events.get(timeout=WAIT) for _ in range(2))
    by_request = {batch[0]: name for name, batch in started.items()}
    by_name = {i.name: i for i in instances}
    # r2 finishes first; its worker then takes r3, so it is done handling r2's outcome.
    by_name[by_request["r2"]].release()
    submit(batcher, results, "r3")
    assert events.get(timeout=WAIT) == (by_request["r2"], ["r3"])
    assert results.order == ([] if preserve else ["r2"])
    by_name[by_request["r1"]].release()
    results.wait("r1", "r2")
    assert results.order[:2] == (["r1", "r2"] if preserve else ["r2", "r1"])
    by_name[by_request["r2"]].release()
    results.wait("r3")


# -- failures -------------------------------------------------------------------------------------


def test_an_instance_that_raises_fails_the_batch_and_keeps_serving(batchers):
    calls = []

    def flaky(requests):
        calls.append(len(requests))
        if len(calls) == 1:
            raise RuntimeError("boom")
        if len(calls) == 2:
            raise invalid_argument("bad batch")
        if len(calls) == 3:
            return []  # no outcome for its request
        return echo(requests)

    recorder = Recorder()
    instance = GatedInstance("m_0", gated=False, behaviour=flaky)
    batcher = make(batchers, config(dynamic_batching={}), [instance], observer=recorder)
    results = Results()
    submit(batcher, results, "a")
    submit(batcher, results, "b")
    batcher.start()
    a, b = results.wait("a", "b")
    for outcome in (a, b):
        assert isinstance(outcome, InferenceError)
        assert (outcome.code, outcome.message) == (ErrorCode.INTERNAL, "boom")
    assert a is not b
    assert ("failed", "m_0", "a", "boom", FailureReason.BACKEND) in recorder.events
    assert not any(e[0] == "executed" for e in recorder.events)
    submit(batcher, results, "c")
    (c,) = results.wait("c")
    assert isinstance(c, InferenceError) and c.code is ErrorCode.INVALID_ARG and c.message == "bad batch"
    submit(batcher, results, "d")
    (d,) = results.wait("d")
    assert isinstance(d, InferenceError) and d.code is ErrorCode.INTERNAL
    assert d.message == "model instance 'm_0' returned 0 outcome(s) for 1 request(s)"
    submit(batcher, results, "e")
    (e,) = results.wait("e")
    assert isinstance(e, InferResponse)


def test_a_failing_callback_does_not_stop_the_worker(batchers):
    instance = GatedInstance("m_0", gated=False)
    batcher = make(batchers, config(dynamic_batching={}), [instance])
    batcher.start()

    def bad_callback(outcome):
        raise ValueError("callback bug")

    batcher.submit(request("a"), bad_callback)
    results = Results()
    submit(batcher, results, "b")
    assert isinstance(results.wait("b")[0], InferResponse)


def test_batch_size_above_max_is_refused(batchers):
    batcher = make(
        batchers, config(max_batch_size=4, dynamic_batching={}), [GatedInstance("m_0", gated=False)]
    )
    with pytest.raises(InferenceError) as err:
        batcher.submit(request("big", 5), lambda outcome: None)
    assert err.value.code is ErrorCode.INVALID_ARG
    assert err.value.message == "[request id: big] inference request batch-size must be <= 4 for 'm'"


# -- lifecycle -------------------------------------------------------------------------------------


STOPPING = "Server is stopping, scheduler for model has stopped accepting new inference requests"


def test_stop_with_drain_finishes_the_queue_and_refuses_new_requests(batchers):
    instance = GatedInstance("m_0")
    batcher = make(batchers, config(max_batch_size=1, dynamic_batching={}), [instance])
    batcher.start()
    results = Results()
    submit(batcher, results, "running")
    assert instance.next_batch() == ["running"]
    submit(batcher, results, "q1")
    submit(batcher, results, "q2")
    assert batcher.stop(drain=True, timeout=0) is False  # still busy
    assert batcher.state is BatcherState.STOPPING
    with pytest.raises(InferenceError) as err:
        submit(batcher, results, "new")
    assert err.value.code is ErrorCode.UNAVAILABLE
    assert err.value.message == f"[request id: new] {STOPPING}"
    instance.gated = False
    instance.release(3)
    assert batcher.stop(drain=True, timeout=WAIT) is True
    assert batcher.state is BatcherState.STOPPED
    assert all(isinstance(o, InferResponse) for o in results.wait("running", "q1", "q2"))
    assert instance.batches == [["running"], ["q1"], ["q2"]]


def test_stop_without_drain_fails_queued_requests(batchers):
    recorder = Recorder()
    instance = GatedInstance("m_0")
    batcher = make(batchers, config(dynamic_batching={}), [instance], observer=recorder)
    batcher.start()
    results = Results()
    submit(batcher, results, "running")
    assert instance.next_batch() == ["running"]
    submit(batcher, results, "queued")
    assert batcher.stop(drain=False, timeout=0) is False
    (queued,) = results.wait("queued")
    assert isinstance(queued, InferenceError) and queued.code is ErrorCode.UNAVAILABLE
    assert queued.message == f"[request id: queued] {STOPPING}"
    assert ("failed", None, "queued", queued.message, FailureReason.OTHER) in recorder.events
    instance.release()
    assert batcher.stop(timeout=WAIT) is True
    assert isinstance(results.wait("running")[0], InferResponse)  # the executing batch finished


def test_requests_queued_before_start_fail_if_it_never_starts(batchers):
    batcher = make(batchers, config(dynamic_batching={}), [GatedInstance("m_0")])
    results = Results()
    submit(batcher, results, "a")
    assert batcher.stop() is True
    (a,) = results.wait("a")
    assert isinstance(a, InferenceError) and a.code is ErrorCode.UNAVAILABLE
    with pytest.raises(RuntimeError):
        batcher.start()


def test_start_twice_is_an_error(batchers):
    batcher = make(batchers, config(dynamic_batching={}), [GatedInstance("m_0", gated=False)])
    batcher.start()
    with pytest.raises(RuntimeError):
        batcher.start()


def test_a_model_needs_an_instance():
    with pytest.raises(ValueError):
        DynamicBatcher("m", config(), [])


# -- infer / infer_sync / cancel ----------------------------------------------------------------------


def test_async_infer_returns_the_response_and_raises_errors(batchers):
    def maybe_fail(requests):
        return [invalid_argument("no") if r.id == "bad" else echo([r])[0] for r in requests]

    batcher = make(
        batchers, config(dynamic_batching={}), [GatedInstance("m_0", gated=False, behaviour=maybe_fail)]
    )
    batcher.start()

    async def main():
        response = await batcher.infer(request("good"))
        assert response.id == "good"
        with pytest.raises(InferenceError, match="^no$"):
            await batcher.infer(request("bad"))

    asyncio.run(main())


def test_on_loop_callbacks_run_on_the_loop_after_one_wake_up_per_batch(batchers):
    """`OnLoop` (the native HTTP front end's answers): a batch's outcomes reach their functions on
    the loop's thread, in order, through one call_soon_threadsafe for the whole batch; a closed
    loop drops them."""
    instance = GatedInstance("m_0")
    batcher = make(batchers, config(dynamic_batching={}), [instance])
    batcher.start()
    results = Results()
    submit(batcher, results, "first")  # the instance is busy: the next three queue and form one batch
    assert instance.next_batch() == ["first"]
    loop = asyncio.new_event_loop()
    wake_ups = []
    call_soon_threadsafe = loop.call_soon_threadsafe

    def counted(callback, *args, **kwargs):
        wake_ups.append(threading.current_thread().name)
        return call_soon_threadsafe(callback, *args, **kwargs)

    loop.call_soon_threadsafe = counted
    answered: list[tuple[str, str, int]] = []
    for name in ("a", "b", "c"):
        batcher.submit(request(name), OnLoop(loop, lambda outcome, name=name: answered.append(
            (name, outcome.id, threading.get_ident()))))
    instance.release()
    assert instance.next_batch() == ["a", "b", "c"]
    instance.release()

    async def until_answered():
        while len(answered) < 3:
            await asyncio.sleep(0.001)

    try:
        loop.run_until_complete(asyncio.wait_for(until_answered(), WAIT))
    finally:
        loop.close()
    here = threading.get_ident()
    assert answered == [("a", "a", here), ("b", "b", here), ("c", "c", here)]
    assert wake_ups == ["batcher-m-m_0"]
    results.wait("first")
    batcher.submit(request("late"), OnLoop(loop, lambda outcome: answered.append(("late", outcome.id, 0))))
    instance.release()
    assert instance.next_batch() == ["late"]
    batcher.stop(drain=True, timeout=WAIT)  # delivered to a closed loop: dropped, the worker goes on
    assert len(answered) == 3


def test_cancelled_async_infer_leaves_the_queue(batchers):
    recorder = Recorder()
    instance = GatedInstance("m_0")
    batcher = make(batchers, config(dynamic_batching={}), [instance], observer=recorder)
    batcher.start()
    results = Results()
    submit(batcher, results, "running")
    assert instance.next_batch() == ["running"]

    async def main():
        task = asyncio.create_task(batcher.infer(request("abandoned")))
        while batcher.queued() == 0:
            await asyncio.sleep(0)  # let the task submit
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert batcher.queued() == 0
    failed = [e for e in recorder.events if e[0] == "failed"]
    assert failed == [
        (
            "failed",
            None,
            "abandoned",
            "[request id: abandoned] inference request cancelled",
            FailureReason.CANCELED,
        )
    ]
    instance.release()
    results.wait("running")
    assert instance.batches == [["running"]]


def test_infer_sync_from_another_thread_and_its_timeout(batchers):
    instance = GatedInstance("m_0")
    batcher = make(batchers, config(dynamic_batching={}), [instance])
    batcher.start()
    results = Results()
    submit(batcher, results, "running")
    assert instance.next_batch() == ["running"]
    with pytest.raises(InferenceError) as err:
        batcher.infer_sync(request("slow"), timeout=0.05)
    assert err.value.code is ErrorCode.UNAVAILABLE
    assert "did not complete within 0.05 s" in err.value.message
    assert batcher.queued() == 0  # cancelled while still queued
    instance.gated = False
    instance.release()
    response = batcher.infer_sync(request("quick"), timeout=WAIT)
    assert response.id == "quick"
    assert instance.batches == [["running"], ["quick"]]


def test_cancel_after_execution_started_is_refused(batchers):
    instance = GatedInstance("m_0")
    batcher = make(batchers, config(dynamic_batching={}), [instance])
    batcher.start()
    results = Results()
    pending = submit(batcher, results, "a")
    assert instance.next_batch() == ["a"]
    assert pending.cancel() is False
    instance.release()
    assert isinstance(results.wait("a")[0], InferResponse)


# -- observer --------------------------------------------------------------------------------------


def test_observer_sees_queue_compute_and_batch_statistics(batchers):
    recorder = Recorder()

    def timed(requests):
        for r in requests:
            r.compute_input_end_ns = r.compute_start_ns + 10
            r.compute_infer_end_ns = r.compute_start_ns + 30
        return echo(requests)

    instance = GatedInstance("m_0", gated=False, behaviour=timed)
    batcher = make(batchers, config(dynamic_batching={}), [instance], observer=recorder)
    results = Results()
    a = request("a", 2)
    b = request("b", 3)
    batcher.submit(a, results.callback("a"))
    batcher.submit(b, results.callback("b"))
    batcher.start()
    results.wait("a", "b")
    batcher.stop(timeout=WAIT)
    kinds = [e[0] for e in recorder.events]
    assert kinds == ["queued", "queued", "started", "executed", "succeeded", "succeeded"]
    assert recorder.events[2] == ("started", "m_0", ["a", "b"])
    execution: BatchExecution = recorder.events[3][1]
    assert (execution.instance, execution.batch_size, execution.request_count) == ("m_0", 5, 2)
    assert execution.compute_input_ns == 10 and execution.compute_infer_ns == 20
    assert execution.compute_output_ns == execution.end_ns - execution.start_ns - 30 >= 0
    for r in (a, b):
        assert r.received_ns <= r.queue_start_ns <= r.compute_start_ns
        assert r.compute_start_ns <= r.compute_input_end_ns <= r.compute_infer_end_ns <= r.compute_end_ns


# -- concurrency: every response matches its own request -------------------------------------------


class TaggedDouble:
    """Merges the batch, computes y = 2x and t = the instance's tag per row, splits it back."""

    def __init__(self, name: str, tag: float) -> None:
        self.name = name
        self.tag = tag
        self.sizes: list[int] = []

    def execute(self, requests):
        merged = merge_inputs(requests)
        self.sizes.append(sum(r.batch_size for r in requests))
        y = merged["x"] * 2
        parts = split_outputs({"y": y, "t": np.full(y.shape[0], self.tag)}, [r.batch_size for r in requests])
        return [
            InferResponse(r.model_name, r.model_version, part, id=r.id) for r, part in zip(requests, parts)
        ]


def test_under_concurrent_load_every_response_matches_its_request(batchers):
    instances = [TaggedDouble("m_0", 0.0), TaggedDouble("m_1", 1.0)]
    cfg = config(max_batch_size=8, dynamic_batching={"max_queue_delay_microseconds": 100})
    batcher = make(batchers, cfg, instances)
    batcher.start()
    mismatches: list[str] = []

    def check(index: int, outcome) -> None:
        size = 1 + index % 3
        expected = np.arange(index * 10, index * 10 + size * 4, dtype=np.float32).reshape(size, 4) * 2
        if not isinstance(outcome, InferResponse) or outcome.id != str(index):
            mismatches.append(f"{index}: {outcome!r}")
        elif not np.array_equal(outcome.outputs["y"], expected):
            mismatches.append(f"{index}: wrong data")
        elif outcome.outputs["t"].tolist() not in ([0.0] * size, [1.0] * size):  # one instance ran it
            mismatches.append(f"{index}: rows from different instances")

    def tagged(index: int) -> InferRequest:
        size = 1 + index % 3
        x = np.arange(index * 10, index * 10 + size * 4, dtype=np.float32).reshape(size, 4)
        return InferRequest("m", 1, {"x": x}, id=str(index), batch_size=size)

    def worker(start: int) -> None:
        for index in range(start, start + 150):
            check(index, batcher.infer_sync(tagged(index), timeout=WAIT))

    threads = [threading.Thread(target=worker, args=(i * 1000,)) for i in range(6)]
    for thread in threads:
        thread.start()

    async def many():
        outcomes = await asyncio.gather(*(batcher.infer(tagged(100_000 + i)) for i in range(600)))
        for i, outcome in enumerate(outcomes):
            check(100_000 + i, outcome)

    asyncio.run(many())
    for thread in threads:
        thread.join(timeout=60)
    assert not mismatches, mismatches[:5]
    sizes = [s for i in instances for s in i.sizes]
    indices = [i for start in range(6) for i in range(start * 1000, start * 1000 + 150)]
    indices += [100_000 + i for i in range(600)]
    assert sum(sizes) == sum(1 + index % 3 for index in indices)  # every request ran exactly once
    assert max(sizes) <= 8
    assert max(sizes) > 3  # requests were really batched together


def test_real_onnx_runtime_instances_in_parallel(batchers, tmp_path):
    """Two ONNX Runtime sessions (add_sub) behind the batcher, under concurrent load."""
    path = mb.add_sub(tmp_path / "add_sub.onnx", dims=("N", 16))

    class OrtInstance:
        def __init__(self, name: str) -> None:
            self.name = name
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

        def execute(self, requests):
            merged = merge_inputs(requests)
            out0, out1 = self.session.run(["OUTPUT0", "OUTPUT1"], merged)
            parts = split_outputs({"OUTPUT0": out0, "OUTPUT1": out1}, [r.batch_size for r in requests])
            return [InferResponse(r.model_name, 1, p, id=r.id) for r, p in zip(requests, parts)]

    cfg = {
        "name": "add_sub",
        "max_batch_size": 8,
        "input": [
            {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [16]},
            {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [16]},
        ],
        "dynamic_batching": {},
    }
    batcher = make(batchers, cfg, [OrtInstance("add_sub_0"), OrtInstance("add_sub_1")])
    batcher.start()
    rng = np.random.default_rng(0)
    cases = []
    for index in range(400):
        size = 1 + index % 4
        a = rng.standard_normal((size, 16)).astype(np.float32)
        b = np.full((size, 16), float(index), np.float32)
        cases.append(InferRequest("add_sub", 1, {"INPUT0": a, "INPUT1": b}, id=str(index), batch_size=size))

    async def run():
        return await asyncio.gather(*(batcher.infer(r) for r in cases))

    for case, response in zip(cases, asyncio.run(run())):
        assert response.id == case.id
        np.testing.assert_allclose(
            response.outputs["OUTPUT0"], case.inputs["INPUT0"] + case.inputs["INPUT1"], rtol=1e-6
        )
        np.testing.assert_allclose(
            response.outputs["OUTPUT1"], case.inputs["INPUT0"] - case.inputs["INPUT1"], rtol=1e-6
        )
