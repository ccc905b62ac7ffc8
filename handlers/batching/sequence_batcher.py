"""The sequence batcher of one model version (`sequence_batching`): Triton's scheduler for stateful
models (core's SequenceBatchScheduler with its DirectSequenceBatch / OldestSequenceBatch).

Every request names its sequence by a correlation ID and flags its first and last request
(`sequence_start`, `sequence_end`). A new sequence takes a free slot of one instance, or waits in
the backlog (first come, first served) until a slot is released; all its requests then run on
that instance, one at a time and in order, with the config's control tensors (sequence_policy.py)
added to their inputs. A slot is released when its sequence's END request is taken into a batch,
or when the sequence has been idle for `max_sequence_idle_microseconds` (the reaper thread):
after that, a request of the sequence without START is refused.

Each instance's worker forms its batches from its own slots, at most one request per slot:
- direct: every slot with a request, in slot order; where a batching model's batch skips a slot,
  a null request fills it (the inputs of a real request, zeroed, with READY false), so a
  request's position in the batch is its slot. With `max_queue_delay_microseconds` and
  `minimum_slot_utilization` it waits until enough slots are ready or the oldest has waited.
- oldest: the oldest requests among the instance's candidate sequences, up to max_batch_size
  (a preferred batch size when one is reached), waiting up to `max_queue_delay_microseconds`.

Execution, statistics, metrics and the delivery of outcomes are the dynamic batcher's own
(DynamicBatcher._execute), so every transport and the statistics see one kind of scheduler.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InferenceError, invalid_argument, unavailable
from ..inference import InferOutcome, InferRequest, InferResponse
from ..streaming import ResponseSink
from .batcher import BatcherState, Clock, DynamicBatcher, ModelInstance, _lower_thread_priority, _stopping
from .observer import BatcherObserver, FailureReason
from .priority_queue import Callback, PendingRequest
from .sequence_policy import SEQUENCE_END, SEQUENCE_START, SequencePolicy
from .sequence_state import state_specs

log = logging.getLogger(__name__)

_RELEASE = object()  # in a slot's queue: the reaper ended the slot's sequence here
_BACKLOG_RECHECK_NS = 50_000_000  # an idle sequence still in the backlog is looked at again (Triton: 50 ms)


class _Slot:
    __slots__ = ("correlation_id", "index", "instance", "queue", "state")

    def __init__(self, instance: int, index: int) -> None:
        self.instance = instance
        self.index = index
        self.correlation_id: int | str | None = None
        self.queue: deque[Any] = deque()  # PendingRequest, or _RELEASE
        self.state: dict[str, np.ndarray] | None = None  # the sequence's implicit state

    def __lt__(self, other: _Slot) -> bool:  # free slots: the lowest index first, across instances
        return (self.index, self.instance) < (other.index, other.instance)


class _Backlog:
    __slots__ = ("correlation_id", "expires_ns", "queue")

    def __init__(self, correlation_id: int | str) -> None:
        self.correlation_id = correlation_id
        self.queue: deque[PendingRequest] = deque()
        # the earliest deadline of its requests' `timeout` (None: none set): then the whole
        # backlogged sequence is refused (SequenceBatchScheduler::ReaperThread)
        self.expires_ns: int | None = None

    def add(self, pending: PendingRequest, now: int) -> bool:
        """Queue `pending`; True when its timeout makes the backlog expire earlier."""
        self.queue.append(pending)
        timeout_us = pending.request.timeout_us
        if timeout_us and (self.expires_ns is None or now + timeout_us * 1000 < self.expires_ns):
            self.expires_ns = now + timeout_us * 1000
            return True
        return False


def backlog_timeout_error() -> InferenceError:
    """tritonserver's answer to the requests of a backlogged sequence whose timeout expired."""
    return unavailable("timeout of the corresponding sequence has been expired")


class _Padded:
    """An instance seen through a direct batch's slot layout: the real requests at their slots,
    null requests in the gaps; only the real requests' outcomes come back."""

    def __init__(self, instance: ModelInstance, positions: list[int], nulls: dict[int, InferRequest]) -> None:
        self._instance = instance
        self._positions = positions
        self._nulls = nulls

    @property
    def name(self) -> str:
        return self._instance.name

    def execute(self, requests: list[InferRequest]) -> list[InferOutcome]:
        layout: list[InferRequest | None] = [None] * (len(self._positions) + len(self._nulls))
        for position, request in zip(self._positions, requests):
            layout[position] = request
        for position, null in self._nulls.items():
            layout[position] = null
        outcomes = self._instance.execute(layout)  # type: ignore[arg-type]
        if len(outcomes) != len(layout):
            return outcomes  # the batcher reports the miscount
        return [outcomes[position] for position in self._positions]


class _Stateful:
    """An instance whose requests carry implicit state: what each returns is kept as its
    sequence's next state (SequenceBatcher._keep_state) before the outcome is delivered."""

    def __init__(self, instance: Any, batcher: SequenceBatcher, slots: dict[int, _Slot]) -> None:
        self._instance = instance
        self._batcher = batcher
        self._slots = slots  # id(request) -> its sequence's slot

    @property
    def name(self) -> str:
        return self._instance.name

    def execute(self, requests: list[InferRequest]) -> list[InferOutcome]:
        outcomes = self._instance.execute(requests)
        if len(outcomes) != len(requests):
            return outcomes  # the batcher reports the miscount
        return [self._batcher._keep_state(r, o, self._slots[id(r)]) for r, o in zip(requests, outcomes)]


class SequenceBatcher(DynamicBatcher):
    def __init__(
        self,
        model_name: str,
        config: Mapping[str, Any],
        instances: Sequence[ModelInstance],
        *,
        observer: BatcherObserver | None = None,
        clock: Clock = time.monotonic_ns,
        model_dir: Path | None = None,
    ) -> None:
        super().__init__(model_name, config, instances, observer=observer, clock=clock)
        self.sequence = SequencePolicy.from_model_config(config)
        self._state_specs = state_specs(config, model_dir)  # ValueError: Triton's message
        self._state_outputs = tuple(spec.output_name for spec in self._state_specs)
        self._config_outputs = {io.get("name") for io in config.get("output", ())}
        count = self.sequence.slots_per_instance
        self._slots = [[_Slot(i, k) for k in range(count)] for i in range(len(self.instances))]
        self._free = [slot for slots in self._slots for slot in slots]
        heapq.heapify(self._free)
        self._active: dict[int | str, _Slot] = {}  # sequence -> its slot, until its END is queued
        self._backlog: deque[_Backlog] = deque()
        self._backlogged: dict[int | str, _Backlog] = {}  # sequence -> its backlog, until its END is queued
        self._seen: dict[int | str, int] = {}  # sequence -> when its last request arrived (ns)
        self._ready = [threading.Condition(self._lock) for _ in self.instances]
        self._reaper_wake = threading.Condition(self._lock)

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            if self._state is not BatcherState.CREATED:
                raise RuntimeError(f"batcher of model '{self.model_name}' is {self._state.value.lower()}")
            self._state = BatcherState.RUNNING
            for index, instance in enumerate(self.instances):
                self._threads.append(threading.Thread(
                    target=self._work_slots, args=(index,), name=f"sequence-{self.model_name}-{instance.name}",
                    daemon=True,
                ))
            self._threads.append(threading.Thread(target=self._reap, name=f"sequence-reaper-{self.model_name}", daemon=True))
        for thread in self._threads:
            thread.start()

    def stop(self, drain: bool = True, timeout: float | None = None) -> bool:
        """Refuse new requests (UNAVAILABLE: tritonserver refuses only new sequences then) and stop.
        With `drain` the queued requests still run, backlogged sequences as slots free up;
        otherwise they fail with UNAVAILABLE."""
        dropped: list[PendingRequest] = []
        with self._lock:
            if self._state in (BatcherState.CREATED, BatcherState.RUNNING):
                self._drain = drain
            elif not drain:
                self._drain = False
            self._state = BatcherState.STOPPING
            if not (self._drain and self._threads):
                for slots in self._slots:
                    for slot in slots:
                        dropped.extend(p for p in slot.queue if p is not _RELEASE)
                        slot.queue.clear()
                for backlog in self._backlog:
                    dropped.extend(backlog.queue)
                self._backlog.clear()
                self._backlogged.clear()
            for condition in (*self._ready, self._reaper_wake):
                condition.notify_all()
        for pending in dropped:
            pending.queued = False
            self._fail_queued(pending, _stopping(pending.request), FailureReason.OTHER)
        return self._join(timeout)

    # -- submitting -------------------------------------------------------------------------------

    def submit(self, request: InferRequest, callback: Callback) -> PendingRequest:
        """Queue a request of a sequence (SequenceBatchScheduler::Enqueue); raises InferenceError
        when it cannot be queued."""
        name = self.model_name
        if self.sequence.batching_model and request.batch_size > 1:
            raise invalid_argument(
                f"inference request to model '{name}' must specify batch-size 1 due to requirements of sequence batcher"
            )
        correlation_id = request.correlation_id
        if correlation_id == 0 or correlation_id == "":
            raise invalid_argument(f"inference request to model '{name}' must specify a non-zero or non-empty correlation ID")
        start = bool(request.flags & SEQUENCE_START)
        end = bool(request.flags & SEQUENCE_END)
        now = self._clock()
        if request.queue_start_ns == 0:
            request.queue_start_ns = now
        pending = PendingRequest(request, callback, 1, 0, now, 0, self._cannot_cancel)
        with self._lock:
            if self._state is BatcherState.STOPPING or self._state is BatcherState.STOPPED:
                raise _stopping(request)
            slot = self._active.get(correlation_id)
            backlog = self._backlogged.get(correlation_id) if slot is None else None
            if not start and slot is None and backlog is None:
                raise invalid_argument(
                    f"inference request for sequence {correlation_id} to model '{name}' must specify the START flag on "
                    "the first request of the sequence"
                )
            if start and (slot is not None or backlog is not None):
                log.warning(
                    "sequence %s for model '%s' has a conflict. The previous sequence did not end before this sequence "
                    "start. Previous sequence will be terminated early.", correlation_id, name,
                )
            if correlation_id not in self._seen:
                self._reaper_wake.notify()
            self._seen[correlation_id] = now
            if slot is None and backlog is None:
                if self._free:
                    slot = heapq.heappop(self._free)
                    slot.correlation_id = correlation_id
                    self._active[correlation_id] = slot
                else:
                    backlog = _Backlog(correlation_id)
                    self._backlog.append(backlog)
                    self._backlogged[correlation_id] = backlog
            if slot is not None:
                slot.queue.append(pending)
                if end:
                    del self._active[correlation_id]
                self._ready[slot.instance].notify()
            else:
                assert backlog is not None
                if backlog.add(pending, now):
                    self._reaper_wake.notify()
                if end:
                    del self._backlogged[correlation_id]
            if self._observer is not None:
                self._notify(self._observer.request_queued, request)
        return pending

    def queued(self) -> int:
        with self._lock:
            in_slots = sum(1 for slots in self._slots for slot in slots for p in slot.queue if p is not _RELEASE)
            return in_slots + sum(len(b.queue) for b in self._backlog)

    def _cannot_cancel(self, pending: PendingRequest) -> bool:
        """A queued request of a sequence is not taken out: the requests after it expect it ran."""
        return False

    # -- slots ------------------------------------------------------------------------------------

    def _release(self, slot: _Slot) -> None:
        """Called with the lock held: the slot's sequence is over; the oldest backlogged sequence
        takes the slot, or it becomes free."""
        slot.correlation_id = None
        if self._backlog:
            backlog = self._backlog.popleft()
            slot.correlation_id = backlog.correlation_id
            slot.queue.extend(backlog.queue)
            if self._backlogged.get(backlog.correlation_id) is backlog:
                del self._backlogged[backlog.correlation_id]
                self._active[backlog.correlation_id] = slot
            self._ready[slot.instance].notify()
        else:
            heapq.heappush(self._free, slot)

    # -- workers ----------------------------------------------------------------------------------

    def _work_slots(self, index: int) -> None:
        _lower_thread_priority(self._niceness)
        instance = self.instances[index]
        while True:
            with self._lock:
                layout = self._next_layout(index)
            if layout is None:
                return
            self._run(instance, layout)

    def _next_layout(self, index: int) -> list[tuple[int, PendingRequest, _Slot]] | None:
        """Called with the lock held: (position, request, slot) of this instance's next batch, or
        None when the worker should leave."""
        slots = self._slots[index]
        condition = self._ready[index]
        policy = self.sequence
        while True:
            stopping = self._state is BatcherState.STOPPING
            for slot in slots:
                while slot.queue and slot.queue[0] is _RELEASE:
                    slot.queue.popleft()
                    slot.state = None  # the idle sequence's state goes with it
                    self._release(slot)
                if stopping and not slot.queue and slot.correlation_id is not None:
                    # no request can join a sequence any more: its slot goes to the backlog
                    if self._active.get(slot.correlation_id) is slot:
                        del self._active[slot.correlation_id]
                    slot.state = None
                    self._release(slot)
            heads = [slot for slot in slots if slot.queue]
            if not heads:
                if stopping and not self._backlog:
                    return None
                condition.wait()
                continue
            if not stopping:
                wait_ns = self._wait_ns(heads)
                if wait_ns > 0:
                    condition.wait(wait_ns / 1e9)
                    continue
            if policy.strategy == "oldest":
                heads.sort(key=lambda s: s.queue[0].enqueue_ns)
                heads = heads[: self._oldest_size(len(heads))]
            layout: list[tuple[int, PendingRequest, _Slot]] = []
            for position, slot in enumerate(heads):
                pending = slot.queue.popleft()
                pending.queued = False
                layout.append((slot.index if policy.strategy == "direct" else position, pending, slot))
                if pending.request.flags & SEQUENCE_END and not slot.queue:
                    self._release(slot)
            return layout

    def _oldest_size(self, ready: int) -> int:
        policy = self.sequence
        limit = min(ready, max(1, policy.max_batch_size))
        preferred = [size for size in policy.preferred_batch_sizes if size <= limit]
        return preferred[-1] if preferred and limit < max(1, policy.max_batch_size) else limit

    def _wait_ns(self, heads: list[_Slot]) -> int:
        """How long the worker still waits for more of its slots to be ready (0: run now)."""
        policy = self.sequence
        delay_ns = policy.max_queue_delay_us * 1000
        if delay_ns == 0:
            return 0
        waited = self._clock() - min(slot.queue[0].enqueue_ns for slot in heads)
        if waited >= delay_ns:
            return 0
        if policy.strategy == "direct":
            if policy.minimum_slot_utilization == 0.0 or len(heads) / policy.slots_per_instance >= policy.minimum_slot_utilization:
                return 0
        else:
            full = min(policy.slots_per_instance, max(1, policy.max_batch_size))
            if len(heads) >= full or any(size <= len(heads) for size in policy.preferred_batch_sizes):
                return 0
        return delay_ns - waited

    def _run(self, instance: ModelInstance, layout: list[tuple[int, PendingRequest, _Slot]]) -> None:
        policy = self.sequence
        batch = [pending for _, pending, _ in layout]
        slots = {id(pending.request): slot for _, pending, slot in layout}
        for pending in batch:
            pending.request.inputs.update(policy.controls_for(pending.request))
            if self._state_specs:
                self._give_state(pending.request, slots[id(pending.request)])
        positions = [position for position, _, _ in layout]
        if policy.strategy == "direct" and policy.batching_model and positions != list(range(len(positions))):
            template = batch[0].request
            nulls = {p: self._null_request(template) for p in range(max(positions) + 1) if p not in positions}
            instance = _Padded(instance, positions, nulls)
        else:
            order = sorted(range(len(layout)), key=lambda i: positions[i])
            batch = [batch[i] for i in order]
        if self._state_specs:
            instance = _Stateful(instance, self, slots)
        self._execute(instance, batch)

    # -- implicit state ---------------------------------------------------------------------------

    def _give_state(self, request: InferRequest, slot: _Slot) -> None:
        """The sequence's state (its slot's) as inputs of its request; the initial state at START."""
        if slot.state is None or request.flags & SEQUENCE_START:
            slot.state = {spec.input_name: spec.initial for spec in self._state_specs}
        request.inputs.update(slot.state)
        request.state_outputs = self._state_outputs

    def _keep_state(self, request: InferRequest, outcome: InferOutcome, slot: _Slot) -> InferOutcome:
        """After a request ran: its state outputs become the sequence's next state; they leave the
        response unless the config lists them as outputs and the request asked for them. (A slot
        released when its END request was taken may already hold the next sequence, which starts
        with START and so with its initial state.)"""
        current = slot.state
        if isinstance(outcome, InferResponse):
            wanted = None if request.requested_outputs is None else {o.name for o in request.requested_outputs}
            for spec in self._state_specs:
                produced = outcome.outputs.get(spec.output_name)
                if produced is not None and current is not None:
                    current[spec.input_name] = np.array(produced, copy=True)
                if spec.output_name not in self._config_outputs or (wanted is not None and spec.output_name not in wanted):
                    outcome.outputs.pop(spec.output_name, None)
        if request.flags & SEQUENCE_END:
            slot.state = None  # the next sequence of this slot starts from its initial state
        return outcome

    def _null_request(self, template: InferRequest) -> InferRequest:
        """InferenceRequest::CopyAsNull: the template's inputs with zeroed data, READY false."""
        controls = {control.name for control in self.sequence.controls} | {spec.input_name for spec in self._state_specs}
        inputs = {
            name: (np.full(array.shape, b"", dtype=object) if array.dtype == object else np.zeros_like(array))
            for name, array in template.inputs.items()
            if name not in controls
        }
        null = InferRequest(template.model_name, template.model_version, inputs,
                            requested_outputs=template.requested_outputs, batch_size=1)
        null.inputs.update({spec.input_name: spec.initial for spec in self._state_specs})
        null.state_outputs = self._state_outputs
        if template.responses is not None:  # a decoupled model: what it sends for the null request goes nowhere
            null.responses = ResponseSink()
        null.inputs.update(self.sequence.controls_for(null, ready=False))
        return null

    # -- the reaper -------------------------------------------------------------------------------

    def _reap(self) -> None:
        """Release the slot of every sequence idle for longer than max_sequence_idle_microseconds,
        and refuse the backlogged sequences whose requests' timeout expired
        (SequenceBatchScheduler::ReaperThread)."""
        idle_ns = self.sequence.idle_us * 1000
        with self._lock:
            while self._state is BatcherState.RUNNING:
                now = self._clock()
                wait_ns = idle_ns
                expired: list[PendingRequest] = []
                for backlog in list(self._backlog):
                    if backlog.expires_ns is None:
                        continue
                    if backlog.expires_ns > now:
                        wait_ns = min(wait_ns, backlog.expires_ns - now)
                        continue
                    self._backlog.remove(backlog)
                    if self._backlogged.get(backlog.correlation_id) is backlog:
                        del self._backlogged[backlog.correlation_id]
                    expired.extend(backlog.queue)
                if expired:
                    self._lock.release()  # answered outside the lock, as tritonserver does
                    try:
                        for pending in expired:
                            pending.queued = False
                            self._fail_queued(pending, backlog_timeout_error(), FailureReason.REJECTED)
                    finally:
                        self._lock.acquire()
                    continue
                for correlation_id, seen in list(self._seen.items()):
                    left = idle_ns - (now - seen)
                    if left > 0:
                        wait_ns = min(wait_ns, left)
                        continue
                    slot = self._active.pop(correlation_id, None)
                    if slot is not None:
                        log.info("sequence %s of model '%s' idle for over %d us: its slot is released",
                                 correlation_id, self.model_name, self.sequence.idle_us)
                        del self._seen[correlation_id]
                        slot.queue.append(_RELEASE)
                        self._ready[slot.instance].notify()
                    elif correlation_id in self._backlogged:
                        wait_ns = min(wait_ns, _BACKLOG_RECHECK_NS)
                    else:
                        del self._seen[correlation_id]
                self._reaper_wake.wait(wait_ns / 1e9)
