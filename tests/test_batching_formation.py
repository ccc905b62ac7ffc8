"""Batch formation (Triton's GetDynamicBatch) and the policy queues, in virtual time.

No threads: requests are queued with explicit arrival times and `form_batch` is asked, with an
explicit `now`, what a free instance executes. `simulate` replays an arrival pattern against N
instances that each take a fixed time per batch, exactly as the threaded batcher drives
form_batch (a free instance forms the next batch; while a batch waits for its delay, nothing
else is formed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from handlers.batching import BatchingPolicy, PriorityQueue, QueuePolicy, TimeoutAction, form_batch
from handlers.batching.priority_queue import PendingRequest
from handlers.errors import ErrorCode, InferenceError
from handlers.inference import InferRequest

US = 1_000  # ns


def config(max_batch_size: int = 8, dims=(4,), dynamic_batching: dict | None = None, **extra) -> dict:
    data = {
        "name": "m",
        "max_batch_size": max_batch_size,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": list(dims)}],
        **extra,
    }
    if dynamic_batching is not None:
        data["dynamic_batching"] = dynamic_batching
    return data


class Queue:
    """A PriorityQueue fed the way DynamicBatcher.submit feeds it."""

    def __init__(self, policy: BatchingPolicy) -> None:
        self.policy = policy
        self.pq = PriorityQueue(policy.levels())

    def add(
        self,
        name: str,
        at_ns: int,
        batch_size: int = 1,
        *,
        shape=(4,),
        priority: int = 0,
        timeout_us: int = 0,
        inputs: dict | None = None,
    ) -> PendingRequest:
        if inputs is None:
            inputs = {"x": np.zeros((batch_size, *shape), np.float32)}
        request = InferRequest(
            "m", 1, inputs, id=name, batch_size=batch_size, priority=priority, timeout_us=timeout_us
        )
        level = self.policy.priority_level(priority) if self.policy.dynamic_batching else 0
        timeout = self.pq.policy(level).timeout_us(timeout_us)
        pending = PendingRequest(
            request,
            lambda outcome: None,
            max(1, batch_size),
            level,
            at_ns,
            at_ns + timeout * US if timeout else 0,
        )
        self.pq.enqueue(pending)
        return pending

    def form(self, now_ns: int, flush: bool = False):
        return form_batch(self.policy, self.pq, now_ns, flush=flush)


def ids(batch) -> list[str]:
    return [p.request.id for p in batch]


# -- the seeds' example ------------------------------------------------------------------------------


@dataclass
class Executed:
    instance: int
    start_ns: int
    ids: list[str]


def simulate(
    policy: BatchingPolicy, arrivals: list[tuple[int, str, int]], instances: int, exec_ns: int
) -> list[Executed]:
    """Replay (time, id, batch_size) arrivals on `instances` instances taking exec_ns per batch."""
    queue = Queue(policy)
    pending = sorted(arrivals)
    free_at = [0] * instances
    executed: list[Executed] = []
    now = 0
    wake: int | None = None
    while pending or queue.pq.size:
        while pending and pending[0][0] <= now:
            at, name, size = pending.pop(0)
            queue.add(name, at, size)
        wake = None
        for index in range(instances):
            if free_at[index] > now or not queue.pq.size:
                continue
            formation = queue.form(now)
            if not formation.batch:
                if formation.wait_ns is not None:
                    wake = now + formation.wait_ns
                break  # the batch being formed waits; the other free instances wait for it
            executed.append(Executed(index, now, ids(formation.batch)))
            free_at[index] = now + exec_ns
        times = [t for t in free_at if t > now]
        if pending:
            times.append(pending[0][0])
        if wake is not None:
            times.append(wake)
        if not times:
            break
        now = min(times)
    return executed


X = 3_000 * US  # the time one batch takes, whatever its size
SEEDS = [(0, "A", 4), (0, "C", 2), (X // 3, "B", 2), (2 * X // 3, "D", 6), (2 * X // 3, "E", 2)]


def test_seeds_example_one_instance_without_delay():
    # A and C run at once; B, D and E wait for the instance: B+D reach max batch 8, then E.
    policy = BatchingPolicy.from_model_config(config(dynamic_batching={}))
    run = simulate(policy, SEEDS, instances=1, exec_ns=X)
    assert [(e.start_ns, e.ids) for e in run] == [(0, ["A", "C"]), (X, ["B", "D"]), (2 * X, ["E"])]


def test_seeds_example_one_instance_with_delay():
    # With X/2 delay A,C wait; B completes the preferred (=max) size 8; D,E form the next batch.
    policy = BatchingPolicy.from_model_config(
        config(dynamic_batching={"max_queue_delay_microseconds": X // 2 // US})
    )
    run = simulate(policy, SEEDS, instances=1, exec_ns=X)
    assert [(e.start_ns, e.ids) for e in run] == [(X // 3, ["A", "C", "B"]), (X // 3 + X, ["D", "E"])]


def test_seeds_example_two_instances_without_delay():
    # B runs alone on the second instance; D,E go to the first instance once A,C are done.
    policy = BatchingPolicy.from_model_config(config(dynamic_batching={}))
    run = simulate(policy, SEEDS, instances=2, exec_ns=X)
    assert [(e.instance, e.start_ns, e.ids) for e in run] == [
        (0, 0, ["A", "C"]),
        (1, X // 3, ["B"]),
        (0, X, ["D", "E"]),
    ]


def test_seeds_example_two_instances_with_delay():
    # A,B,C fill instance 1 at X/3; D,E fill instance 2 as soon as they arrive.
    policy = BatchingPolicy.from_model_config(
        config(dynamic_batching={"max_queue_delay_microseconds": X // 2 // US})
    )
    run = simulate(policy, SEEDS, instances=2, exec_ns=X)
    assert [(e.instance, e.start_ns, e.ids) for e in run] == [
        (0, X // 3, ["A", "C", "B"]),
        (1, 2 * X // 3, ["D", "E"]),
    ]


def test_seeds_example_without_dynamic_batching_runs_each_request_alone():
    policy = BatchingPolicy.from_model_config(config())
    run = simulate(policy, SEEDS, instances=1, exec_ns=X)
    assert [e.ids for e in run] == [["A"], ["C"], ["B"], ["D"], ["E"]]
    assert run[-1].start_ns == 4 * X  # 5X in all, as the tutorial says


# -- preferred sizes, max batch size, delay ----------------------------------------------------------


def test_largest_reachable_preferred_size_is_sent():
    policy = BatchingPolicy.from_model_config(config(dynamic_batching={"preferred_batch_size": [2, 4]}))
    q = Queue(policy)
    for name in "abcde":
        q.add(name, 0)
    assert ids(q.form(0).batch) == ["a", "b", "c", "d"]
    assert ids(q.form(0).batch) == ["e"]  # no delay: what is left is sent as it is


def test_batch_is_cut_where_the_next_request_passes_the_largest_preferred_size():
    policy = BatchingPolicy.from_model_config(config(dynamic_batching={"preferred_batch_size": [4]}))
    q = Queue(policy)
    q.add("a", 0, 3)
    q.add("b", 0, 2)  # 3 + 2 > 4: 'a' alone is the best batch even though 3 is not preferred
    assert ids(q.form(0).batch) == ["a"]
    assert ids(q.form(0).batch) == ["b"]


def test_without_preferred_sizes_batches_fill_up_to_max_batch_size():
    policy = BatchingPolicy.from_model_config(config(dynamic_batching={}))
    assert policy.preferred_batch_sizes == (8,)  # NormalizeModelConfig's default
    q = Queue(policy)
    for name, size in [("a", 3), ("b", 3), ("c", 3), ("d", 1)]:
        q.add(name, 0, size)
    assert ids(q.form(0).batch) == ["a", "b"]  # 3+3+3 > 8
    assert ids(q.form(0).batch) == ["c", "d"]


def test_single_request_may_equal_max_batch_size():
    q = Queue(BatchingPolicy.from_model_config(config(dynamic_batching={})))
    q.add("a", 0, 8)
    q.add("b", 0, 1)
    assert ids(q.form(0).batch) == ["a"]
    assert ids(q.form(0).batch) == ["b"]


def test_delay_waits_for_the_oldest_request_then_sends_what_is_pending():
    policy = BatchingPolicy.from_model_config(config(dynamic_batching={"max_queue_delay_microseconds": 100}))
    q = Queue(policy)
    q.add("a", 0)
    first = q.form(10 * US)
    assert first.batch == [] and first.wait_ns == 90 * US
    q.add("b", 50 * US)
    second = q.form(50 * US)
    assert second.batch == [] and second.wait_ns == 50 * US  # measured from the oldest request
    assert q.pq.size == 2  # a scan that forms nothing leaves the queue as it was
    assert ids(q.form(99 * US).batch) == []
    assert ids(q.form(100 * US).batch) == ["a", "b"]


def test_delay_is_cut_short_when_the_batch_cannot_grow():
    policy = BatchingPolicy.from_model_config(
        config(dynamic_batching={"max_queue_delay_microseconds": 1_000_000})
    )
    q = Queue(policy)
    q.add("a", 0, 5)
    assert q.form(0).batch == []
    q.add("b", 1, 3)  # 8: the preferred (= max) size
    assert ids(q.form(2).batch) == ["a", "b"]


def test_delay_exceeded_sends_past_the_largest_preferred_size():
    # GetDynamicBatch: once the delay has run out, what fits in max_batch_size goes, not just
    # the part up to the largest preferred size.
    policy = BatchingPolicy.from_model_config(
        config(dynamic_batching={"preferred_batch_size": [2], "max_queue_delay_microseconds": 100})
    )
    q = Queue(policy)
    for name in "abc":
        q.add(name, 0)
    assert ids(q.form(50 * US).batch) == ["a", "b"]  # preferred size reached: sent at once
    q.add("d", 60 * US)
    q.add("e", 60 * US)
    q.add("f", 60 * US)
    assert ids(q.form(70 * US).batch) == ["c", "d"]
    q2 = Queue(policy)
    for name in "abc":
        q2.add(name, 0)
    assert ids(q2.form(100 * US).batch) == ["a", "b", "c"]


def test_no_queue_delay_forces_the_delay_to_zero():
    cfg = config(dynamic_batching={"max_queue_delay_microseconds": 1_000_000})
    policy = BatchingPolicy.from_model_config(cfg, no_queue_delay=True)
    assert policy.max_queue_delay_ns == 0
    q = Queue(policy)
    q.add("a", 0)
    assert ids(q.form(0).batch) == ["a"]


def test_flush_sends_without_waiting():
    policy = BatchingPolicy.from_model_config(
        config(dynamic_batching={"max_queue_delay_microseconds": 1_000_000})
    )
    q = Queue(policy)
    q.add("a", 0)
    assert q.form(1).batch == []
    assert ids(q.form(1, flush=True).batch) == ["a"]


# -- equal shapes and optional inputs ------------------------------------------------------------------


def test_requests_with_different_variable_shapes_are_not_mixed():
    policy = BatchingPolicy.from_model_config(config(dims=(-1,), dynamic_batching={}))
    assert policy.equal_shape_inputs == {"x": False}
    q = Queue(policy)
    q.add("a", 0, shape=(3,))
    q.add("b", 0, shape=(3,))
    q.add("c", 0, shape=(5,))
    q.add("d", 0, shape=(3,))
    # The pending batch is sent as it is at the first mismatch: no skipping ahead (Triton).
    assert ids(q.form(0).batch) == ["a", "b"]
    assert ids(q.form(0).batch) == ["c"]
    assert ids(q.form(0).batch) == ["d"]


def test_shape_mismatch_sends_pending_batch_even_with_a_delay():
    policy = BatchingPolicy.from_model_config(
        config(dims=(-1,), dynamic_batching={"max_queue_delay_microseconds": 1_000_000})
    )
    q = Queue(policy)
    q.add("a", 0, shape=(3,))
    q.add("b", 0, shape=(4,))
    assert ids(q.form(0).batch) == ["a"]


def test_fixed_shape_and_ragged_inputs_do_not_constrain_batches():
    cfg = config(dims=(-1,), dynamic_batching={})
    cfg["input"][0]["allow_ragged_batch"] = True
    policy = BatchingPolicy.from_model_config(cfg)
    assert policy.equal_shape_inputs == {}
    q = Queue(policy)
    q.add("a", 0, shape=(3,))
    q.add("b", 0, shape=(5,))
    assert ids(q.form(0).batch) == ["a", "b"]


def test_shape_tensors_must_match_in_contents():
    cfg = config(dims=(2,), dynamic_batching={})
    cfg["input"][0]["is_shape_tensor"] = True
    policy = BatchingPolicy.from_model_config(cfg)
    assert policy.equal_shape_inputs == {"x": True}
    q = Queue(policy)
    q.add("a", 0, inputs={"x": np.array([[1, 2]], np.int32)})
    q.add("b", 0, inputs={"x": np.array([[1, 2]], np.int32)})
    q.add("c", 0, inputs={"x": np.array([[1, 3]], np.int32)})
    assert ids(q.form(0).batch) == ["a", "b"]
    assert ids(q.form(0).batch) == ["c"]


def test_optional_inputs_batch_only_requests_with_the_same_inputs():
    cfg = config(dynamic_batching={})
    cfg["input"].append({"name": "mask", "data_type": "TYPE_FP32", "dims": [4], "optional": True})
    policy = BatchingPolicy.from_model_config(cfg)
    assert policy.has_optional_input
    q = Queue(policy)
    x = np.zeros((1, 4), np.float32)
    q.add("a", 0, inputs={"x": x})
    q.add("b", 0, inputs={"x": x, "mask": x})
    q.add("c", 0, inputs={"x": x, "mask": x})
    assert ids(q.form(0).batch) == ["a"]
    assert ids(q.form(0).batch) == ["b", "c"]


# -- non-batching models ------------------------------------------------------------------------------


def test_requests_of_a_non_batching_model_are_never_merged():
    policy = BatchingPolicy.from_model_config(config(max_batch_size=0, dynamic_batching={}))
    assert policy.max_batch_size == 1 and not policy.batching_model
    q = Queue(policy)
    q.add("a", 0, inputs={"x": np.zeros(4, np.float32)})
    q.add("b", 0, inputs={"x": np.zeros(4, np.float32)})
    assert ids(q.form(0).batch) == ["a"]
    assert ids(q.form(0).batch) == ["b"]


# -- priorities ----------------------------------------------------------------------------------------


def priority_config(**db) -> dict:
    return config(
        max_batch_size=2, dynamic_batching={"priority_levels": 3, "default_priority_level": 2, **db}
    )


def test_higher_priority_requests_bypass_lower_ones():
    q = Queue(BatchingPolicy.from_model_config(priority_config()))
    q.add("low1", 0, priority=3)
    q.add("low2", 1, priority=3)
    q.add("high", 2, priority=1)
    q.add("mid", 3, priority=2)
    assert ids(q.form(10).batch) == ["high", "mid"]
    assert ids(q.form(10).batch) == ["low1", "low2"]


@pytest.mark.parametrize("requested, level", [(0, 2), (1, 1), (3, 3), (4, 2), (99, 2), (-1, 2)])
def test_priority_zero_or_out_of_range_uses_the_default_level(requested, level):
    # InferenceRequest::SetPriority (verified against tritonserver 2.51: priority 7 of 2 levels
    # is served at the default level).
    assert BatchingPolicy.from_model_config(priority_config()).priority_level(requested) == level


def test_without_priority_levels_every_request_shares_one_queue():
    policy = BatchingPolicy.from_model_config(config(dynamic_batching={}))
    assert policy.priority_level(5) == 0
    q = Queue(policy)
    q.add("a", 0, priority=5)
    q.add("b", 0, priority=1)
    assert ids(q.form(0).batch) == ["a", "b"]


# -- queue policies --------------------------------------------------------------------------------


def test_max_queue_size_rejects_with_tritons_message():
    q = Queue(
        BatchingPolicy.from_model_config(
            config(dynamic_batching={"default_queue_policy": {"max_queue_size": 2}})
        )
    )
    q.add("a", 0)
    q.add("", 0)
    with pytest.raises(InferenceError) as err:
        q.add("c", 0)
    assert err.value.code is ErrorCode.UNAVAILABLE and err.value.http_status == 503
    assert err.value.message == "[request id: c] Exceeds maximum queue size"
    with pytest.raises(InferenceError, match=r"^\[request id: <id_unknown>\] Exceeds maximum queue size$"):
        q.add("", 0)
    q.form(0)
    q.add("d", 0)  # room again once a batch took the queued requests


def test_max_queue_size_applies_per_priority_level():
    cfg = priority_config(priority_queue_policy={"1": {"max_queue_size": 1}})
    q = Queue(BatchingPolicy.from_model_config(cfg))
    q.add("h1", 0, priority=1)
    with pytest.raises(InferenceError, match="Exceeds maximum queue size"):
        q.add("h2", 0, priority=1)
    for index in range(5):
        q.add(f"low{index}", 0, priority=3)  # other levels use the default (unbounded) policy


def test_timeout_reject_fails_expired_requests_as_the_scan_reaches_them():
    policy = BatchingPolicy.from_model_config(
        config(
            dynamic_batching={
                "default_queue_policy": {"timeout_action": "REJECT", "default_timeout_microseconds": 100}
            }
        )
    )
    q = Queue(policy)
    a = q.add("a", 0)
    q.add("b", 50 * US)
    formation = q.form(120 * US)  # a expired at 100 us, b has 30 us left
    assert formation.rejected == [a] and not a.queued
    assert ids(formation.batch) == ["b"]
    assert q.pq.size == 0


def test_timeout_is_strictly_after_the_deadline():
    q = Queue(
        BatchingPolicy.from_model_config(
            config(dynamic_batching={"default_queue_policy": {"default_timeout_microseconds": 100}})
        )
    )
    q.add("a", 0)
    assert ids(q.form(100 * US).batch) == ["a"]  # PolicyQueue: expired only when now > deadline


def test_timeout_delay_moves_expired_requests_behind_the_others():
    policy = BatchingPolicy.from_model_config(
        config(
            max_batch_size=2,
            dynamic_batching={
                "default_queue_policy": {"timeout_action": "DELAY", "default_timeout_microseconds": 100}
            },
        )
    )
    q = Queue(policy)
    q.add("old", 0)
    q.add("new1", 150 * US)
    q.add("new2", 150 * US)
    formation = q.form(160 * US)
    assert formation.rejected == []
    assert ids(formation.batch) == ["new1", "new2"]
    # A delayed request never expires again.
    assert ids(q.form(10_000 * US).batch) == ["old"]


def test_expired_delayed_requests_still_join_a_batch_after_the_unexpired_ones():
    policy = BatchingPolicy.from_model_config(
        config(
            dynamic_batching={
                "default_queue_policy": {"timeout_action": "DELAY", "default_timeout_microseconds": 100}
            }
        )
    )
    q = Queue(policy)
    q.add("old", 0)
    q.add("new", 150 * US)
    assert ids(q.form(160 * US).batch) == ["new", "old"]


def test_delay_wait_is_cut_to_the_closest_request_timeout():
    policy = BatchingPolicy.from_model_config(
        config(
            dynamic_batching={
                "max_queue_delay_microseconds": 1000,
                "default_queue_policy": {"default_timeout_microseconds": 300},
            }
        )
    )
    q = Queue(policy)
    a = q.add("a", 0)
    formation = q.form(100 * US)
    assert formation.batch == [] and formation.wait_ns == 200 * US
    formation = q.form(301 * US)
    assert formation.rejected == [a] and formation.batch == []


@pytest.mark.parametrize(
    "policy, requested_us, expected_us",
    [
        (QueuePolicy(default_timeout_us=1000), 10, 1000),  # no override allowed
        (QueuePolicy(default_timeout_us=1000, allow_timeout_override=True), 10, 10),
        (QueuePolicy(default_timeout_us=1000, allow_timeout_override=True), 5000, 1000),  # may not lengthen
        (QueuePolicy(default_timeout_us=1000, allow_timeout_override=True), 0, 1000),
        # With no default timeout a request timeout is ignored: tritonserver 2.51 answered all 16
        # requests of a "timeout: 1" run against such a model.
        (QueuePolicy(default_timeout_us=0, allow_timeout_override=True), 10, 0),
    ],
)
def test_request_timeout_override(policy, requested_us, expected_us):
    assert policy.timeout_us(requested_us) == expected_us


def test_request_timeout_override_rejects_early():
    policy = BatchingPolicy.from_model_config(
        config(
            dynamic_batching={
                "default_queue_policy": {
                    "default_timeout_microseconds": 1_000_000,
                    "allow_timeout_override": True,
                }
            }
        )
    )
    q = Queue(policy)
    short = q.add("short", 0, timeout_us=10)
    q.add("long", 0)
    formation = q.form(11 * US)
    assert formation.rejected == [short]
    assert ids(formation.batch) == ["long"]


# -- config JSON ------------------------------------------------------------------------------------


def test_policy_reads_protobuf_json_forms():
    # uint64 fields as strings, enums as names or numbers, map keys as strings.
    policy = BatchingPolicy.from_model_config(
        config(
            dynamic_batching={
                "preferred_batch_size": [4, 2, 4],
                "max_queue_delay_microseconds": "250",
                "preserve_ordering": False,
                "priority_levels": "2",
                "default_priority_level": "1",
                "default_queue_policy": {
                    "timeout_action": "DELAY",
                    "default_timeout_microseconds": "7",
                    "allow_timeout_override": True,
                    "max_queue_size": 3,
                },
                "priority_queue_policy": {"2": {"timeout_action": 0, "max_queue_size": "1"}},
            }
        )
    )
    assert policy.preferred_batch_sizes == (2, 4)
    assert policy.max_queue_delay_ns == 250 * US
    assert policy.priority_levels == 2 and policy.default_priority_level == 1
    assert policy.default_queue_policy == QueuePolicy(TimeoutAction.DELAY, 7, True, 3)
    assert policy.queue_policy(2) == QueuePolicy(TimeoutAction.REJECT, 0, False, 1)
    assert policy.queue_policy(1) == policy.default_queue_policy
    assert list(policy.levels()) == [1, 2]


def test_policy_from_compiled_config(tmp_path):
    # The JSON the toolkit compiles (Triton's own rendering of the config) reads back the same.
    from toolkit.repository.model_config import parse_config_text, to_triton_json

    text = """
    name: "m" max_batch_size: 16
    input { name: "x" data_type: TYPE_FP32 dims: [-1, 3] }
    input { name: "s" data_type: TYPE_INT32 dims: [2] is_shape_tensor: true }
    dynamic_batching { preferred_batch_size: [4, 8] max_queue_delay_microseconds: 100
      priority_levels: 2 default_priority_level: 2
      default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 5 max_queue_size: 3 }
      priority_queue_policy { key: 1 value { max_queue_size: 1 } } }
    """
    policy = BatchingPolicy.from_model_config(to_triton_json(parse_config_text(text)))
    assert policy.dynamic_batching and policy.batching_model and policy.max_batch_size == 16
    assert policy.preferred_batch_sizes == (4, 8) and policy.max_queue_delay_ns == 100 * US
    assert policy.equal_shape_inputs == {"x": False, "s": True}
    assert policy.queue_policy(1).max_queue_size == 1
    assert policy.queue_policy(2) == QueuePolicy(TimeoutAction.DELAY, 5, False, 3)
