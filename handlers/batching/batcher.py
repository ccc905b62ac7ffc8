"""The dynamic batcher of one model version: a queue, and one worker thread per model instance.

A worker that is free forms the next batch (formation.py) and executes it on its own instance,
so instances run in parallel (ONNX Runtime releases the GIL). Only one free worker forms a batch
at a time, like tritonserver's single batcher thread: it waits on `_lead` for arrivals or for the
queue delay to run out, while the other free workers wait on `_idle` until it has taken a batch.
A submit therefore wakes one thread (a second only when the leading worker is already owed a
batch and another free worker takes the new one), and the request reaches an instance in one
hand-off.

While a worker is free, the submitting thread forms the batch itself, at arrival, as
tritonserver's batcher thread does when a request wakes it, and hands it to a free worker
(`_handoffs`). A woken worker would only run once the submitting thread (the event loop, at a
higher priority and holding the GIL) lets it: the requests that arrived meanwhile would join its
batch while other instances stayed idle, and clients that send together would stay in step, one
instance working for all of them (docs/batching.md, "Free instances take requests as they arrive").

Without `dynamic_batching` the same workers take requests one at a time, in arrival order
(Triton's default scheduler: no priorities, no queue policy).

Workers run at a lower CPU priority than the event loop (niceness TOOLKIT_INSTANCE_NICE, default
10; tritonserver also sets per-thread niceness on its batcher threads): the event loop's work per request is
short and on every request's critical path, a model execution is long, and when the CPUs are
saturated by executions a response should not wait for a time slice (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from enum import Enum
from typing import Any, Protocol

from ..errors import ErrorCode, InferenceError, internal, invalid_argument, unavailable
from ..inference import InferOutcome, InferRequest, InferResponse
from .formation import form_batch
from .observer import BatcherObserver, BatchExecution, FailureReason
from .ordering import ResponseOrder
from .policy import BatchingPolicy
from .priority_queue import Callback, PendingRequest, PriorityQueue, request_tag, timeout_error

log = logging.getLogger(__name__)

Clock = Callable[[], int]

INSTANCE_NICE_ENV = "TOOLKIT_INSTANCE_NICE"
DEFAULT_INSTANCE_NICE = 10


def instance_niceness(environ: Mapping[str, str] | None = None) -> int:
    """The niceness increment of worker threads (0 leaves them at the process's priority)."""
    text = (os.environ if environ is None else environ).get(INSTANCE_NICE_ENV, "").strip()
    if not text:
        return DEFAULT_INSTANCE_NICE
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{INSTANCE_NICE_ENV} must be an integer from 0 to 19, got {text!r}") from None
    if not 0 <= value <= 19:
        raise ValueError(f"{INSTANCE_NICE_ENV} must be an integer from 0 to 19, got {text!r}")
    return value


def _lower_thread_priority(increment: int) -> None:
    """Raise the calling thread's niceness by `increment` (Linux: per thread; raising it needs no
    privilege). Elsewhere setpriority would apply to the whole process, so nothing is done."""
    if increment <= 0 or not sys.platform.startswith("linux"):
        return
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + increment))
    except OSError as exc:  # e.g. a sandbox without setpriority: keep serving at the usual priority
        log.debug("could not lower the priority of %s: %s", threading.current_thread().name, exc)


class ModelInstance(Protocol):
    """One instance of a model. `execute` is only ever called by the instance's own worker.

    It returns one outcome per request, in order. It may set compute_input_end_ns and
    compute_infer_end_ns (and compute_start_ns / compute_end_ns) on the requests; the batcher
    fills whatever it leaves unset. If it raises, every request of the batch fails (an
    InferenceError keeps its code, anything else becomes INTERNAL) and the instance keeps serving.
    """

    @property
    def name(self) -> str: ...

    def execute(self, requests: list[InferRequest]) -> list[InferOutcome]: ...


class BatcherState(Enum):
    CREATED = "CREATED"  # requests are queued until start()
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"  # no new requests; draining or dropping the queue
    STOPPED = "STOPPED"


class DynamicBatcher:
    def __init__(
        self,
        model_name: str,
        config: Mapping[str, Any],
        instances: Sequence[ModelInstance],
        *,
        observer: BatcherObserver | None = None,
        no_queue_delay: bool = False,
        clock: Clock = time.monotonic_ns,
    ) -> None:
        if not instances:
            raise ValueError(f"model '{model_name}' has no instance to execute on")
        self.model_name = model_name
        self.policy = BatchingPolicy.from_model_config(config, no_queue_delay=no_queue_delay)
        self.instances: tuple[ModelInstance, ...] = tuple(instances)
        self._observer = observer
        # An observer may take a batch's successes in one call (ModelStatistics does: one lock and
        # one update of each metric per batch instead of per request).
        self._batch_observer: Callable[[str, list[InferRequest]], None] | None = getattr(
            observer, "requests_succeeded", None
        )
        self._clock = clock
        self._queue = PriorityQueue(self.policy.levels())
        self._lock = threading.Lock()
        self._lead = threading.Condition(self._lock)  # the free worker that forms the next batch
        self._idle = threading.Condition(self._lock)  # the other free workers
        self._leading = False  # a free worker is waiting on _lead
        self._idle_workers = 0
        self._handoffs: deque[list[PendingRequest]] = deque()  # formed at arrival, for free workers
        self._state = BatcherState.CREATED
        self._drain = True
        self._threads: list[threading.Thread] = []
        self._order = ResponseOrder(self._deliver) if self.policy.preserve_ordering else None
        self._niceness = instance_niceness()

    # -- lifecycle --------------------------------------------------------------------------------

    @property
    def state(self) -> BatcherState:
        return self._state

    def start(self) -> None:
        """Start one worker per instance. Requests submitted before start() wait for it."""
        with self._lock:
            if self._state is not BatcherState.CREATED:
                raise RuntimeError(f"batcher of model '{self.model_name}' is {self._state.value.lower()}")
            self._state = BatcherState.RUNNING
            for instance in self.instances:
                thread = threading.Thread(
                    target=self._work,
                    args=(instance,),
                    name=f"batcher-{self.model_name}-{instance.name}",
                    daemon=True,
                )
                self._threads.append(thread)
            for thread in self._threads:
                thread.start()

    def stop(self, drain: bool = True, timeout: float | None = None) -> bool:
        """Refuse new requests (UNAVAILABLE) and stop the workers.

        With `drain`, everything already queued still executes (without waiting for the queue
        delay); otherwise queued requests fail with UNAVAILABLE. Batches already executing always
        finish. Returns False if a worker was still busy when `timeout` (seconds) ran out.
        """
        with self._lock:
            if self._state in (BatcherState.CREATED, BatcherState.RUNNING):
                self._drain = drain
            elif not drain:
                self._drain = False  # a second stop may turn a drain into an abort
            self._state = BatcherState.STOPPING
            dropped = self._queue.take_all() if not (self._drain and self._threads) else []
            for pending in dropped:
                pending.queued = False
            self._lead.notify_all()
            self._idle.notify_all()
        for pending in dropped:
            self._fail_queued(pending, _stopping(pending.request), FailureReason.OTHER)
        return self._join(timeout)

    def _join(self, timeout: float | None) -> bool:
        """Wait for the worker threads (all of them within `timeout` seconds); STOPPED if they ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            if thread is threading.current_thread():
                continue
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        stopped = not any(t.is_alive() for t in self._threads if t is not threading.current_thread())
        if stopped:
            with self._lock:
                self._state = BatcherState.STOPPED
        return stopped

    # -- submitting ----------------------------------------------------------------------------

    def submit(self, request: InferRequest, callback: Callback) -> PendingRequest:
        """Queue a request; `callback(outcome)` is called exactly once, from a worker thread (or
        from the thread that cancels the request).

        Raises InferenceError synchronously when the request cannot be queued: UNAVAILABLE when
        its priority level's queue is full or the batcher is stopping.
        """
        policy = self.policy
        if policy.batching_model:
            batch_size = request.batch_size
            if batch_size > policy.max_batch_size:
                raise invalid_argument(
                    f"{request_tag(request)}inference request batch-size must be <= {policy.max_batch_size} "
                    f"for '{self.model_name}'"
                )
            batch_size = max(1, batch_size)
        else:
            batch_size = 1
        level = policy.priority_level(request.priority) if policy.dynamic_batching else 0
        now = self._clock()
        if request.queue_start_ns == 0:
            request.queue_start_ns = now
        timeout_us = self._queue.policy(level).timeout_us(request.timeout_us)
        pending = PendingRequest(
            request, callback, batch_size, level, now, now + timeout_us * 1000 if timeout_us else 0, self._cancel
        )
        rejected: list[PendingRequest] = []
        with self._lock:
            if self._state is BatcherState.STOPPING or self._state is BatcherState.STOPPED:
                raise _stopping(request)
            self._queue.enqueue(pending)
            if self._observer is not None:
                self._notify(self._observer.request_queued, request)
            if self._idle_workers + self._leading > len(self._handoffs):
                # A worker is free and owed nothing: form its batch now (or learn that the batch
                # waits for the queue delay, which the leading worker then times).
                formation = form_batch(policy, self._queue, now)
                rejected = formation.rejected
                if formation.batch:
                    if self._order is not None:
                        self._order.assign(formation.batch)
                    self._handoffs.append(formation.batch)
            if self._leading:
                self._lead.notify()
                if len(self._handoffs) > 1 and self._idle_workers:
                    self._idle.notify()  # the lead is owed one already: another free worker takes this
            elif self._idle_workers:
                self._idle.notify()
        for expired in rejected:
            self._fail_queued(expired, timeout_error(expired.request), FailureReason.REJECTED)
        return pending

    async def infer(self, request: InferRequest) -> InferResponse:
        """Run a request from any running asyncio loop; raises InferenceError.

        If the awaiting task is cancelled, the request is cancelled too while it is still queued.
        """
        loop = asyncio.get_running_loop()
        future: asyncio.Future[InferOutcome] = loop.create_future()
        pending = self.submit(request, OnLoop(loop, functools.partial(_settle, future)))
        try:
            outcome = await future
        except asyncio.CancelledError:
            pending.cancel()
            raise
        if isinstance(outcome, InferenceError):
            raise outcome
        return outcome

    def infer_sync(self, request: InferRequest, timeout: float | None = None) -> InferResponse:
        """Run a request from a thread that is not an event loop's (BLS: a model calling another).

        Raises InferenceError; UNAVAILABLE if it did not complete within `timeout` seconds (it is
        cancelled if still queued; an executing batch finishes and its result is dropped).
        """
        done = threading.Lock()
        done.acquire()
        box: list[InferOutcome] = []

        def callback(outcome: InferOutcome) -> None:
            box.append(outcome)
            done.release()

        pending = self.submit(request, callback)
        finished = done.acquire(timeout=-1 if timeout is None else max(0.0, timeout))
        # Past the timeout: cancel it if still queued; if it already executes, take the outcome
        # only if it has just arrived.
        if not finished and (pending.cancel() or not done.acquire(blocking=False)):
            raise unavailable(
                f"{request_tag(request)}inference of model '{self.model_name}' did not complete "
                f"within {timeout} s"
            )
        outcome = box[0]
        if isinstance(outcome, InferenceError):
            raise outcome
        return outcome

    def queued(self) -> int:
        """Requests waiting in the queue (not yet taken into a batch)."""
        with self._lock:
            return self._queue.size

    # -- workers ----------------------------------------------------------------------------------

    def _work(self, instance: ModelInstance) -> None:
        _lower_thread_priority(self._niceness)
        while True:
            with self._lock:
                batch, rejected, leave = self._next_batch()
            for pending in rejected:
                self._fail_queued(pending, timeout_error(pending.request), FailureReason.REJECTED)
            if batch:
                self._execute(instance, batch)
            elif leave:
                with self._lock:
                    self._idle.notify_all()  # let the other free workers see the end too
                return

    def _next_batch(self) -> tuple[list[PendingRequest], list[PendingRequest], bool]:
        """Called with the lock held: a batch for this free worker, requests to reject, or leave."""
        while True:
            if self._handoffs:  # formed at arrival (submit): executes even while stopping
                batch = self._handoffs.popleft()
                if self._handoffs and self._idle_workers:
                    self._idle.notify()
                return batch, [], False
            if self._state is BatcherState.STOPPING and (not self._drain or self._queue.size == 0):
                return [], [], True
            if self._leading:
                self._idle_workers += 1
                self._idle.wait()
                self._idle_workers -= 1
                continue
            formation = form_batch(
                self.policy, self._queue, self._clock(), flush=self._state is BatcherState.STOPPING
            )
            if formation.batch:
                if self._order is not None:
                    self._order.assign(formation.batch)
                if self._queue.size and self._idle_workers:
                    self._idle.notify()  # another free worker takes over what is left
                return formation.batch, formation.rejected, False
            if formation.rejected:
                return [], formation.rejected, False
            self._leading = True
            try:
                self._lead.wait(None if formation.wait_ns is None else formation.wait_ns / 1e9)
            finally:
                self._leading = False

    def _execute(self, instance: ModelInstance, batch: list[PendingRequest]) -> None:
        requests = [pending.request for pending in batch]
        start = self._clock()
        for request in requests:
            request.compute_start_ns = start
            request.compute_input_end_ns = request.compute_infer_end_ns = request.compute_end_ns = 0
        observer = self._observer
        if observer is not None:
            self._notify(observer.batch_started, instance.name, requests)
        executed = True
        try:
            outcomes: list[InferOutcome] = instance.execute(requests)
            if len(outcomes) != len(requests):
                raise internal(
                    f"model instance '{instance.name}' returned {len(outcomes)} outcome(s) for "
                    f"{len(requests)} request(s)"
                )
        except InferenceError as exc:
            executed = False
            outcomes = [InferenceError(exc.message, exc.code) for _ in requests]
        except Exception as exc:  # the instance failed: the batch fails, the worker keeps serving
            executed = False
            log.exception("model '%s' instance '%s' failed a batch", self.model_name, instance.name)
            message = str(exc) or type(exc).__name__
            outcomes = [internal(message) for _ in requests]
        end = self._clock()
        for request in requests:
            if request.compute_end_ns == 0:
                request.compute_end_ns = end
            if request.compute_input_end_ns == 0:
                request.compute_input_end_ns = request.compute_start_ns
            if request.compute_infer_end_ns == 0:
                request.compute_infer_end_ns = request.compute_end_ns

        finished: list[tuple[PendingRequest, InferOutcome]] = []
        for pending, outcome in zip(batch, outcomes):
            if not isinstance(outcome, (InferResponse, InferenceError)):
                outcome = internal(
                    f"model instance '{instance.name}' returned {type(outcome).__name__} instead of a response"
                )
            finished.append((pending, outcome))
        if observer is not None:
            if executed:
                first = requests[0]
                self._notify(
                    observer.batch_executed,
                    BatchExecution(
                        instance=instance.name,
                        batch_size=sum(p.batch_size for p in batch),
                        request_count=len(batch),
                        start_ns=first.compute_start_ns,
                        compute_start_ns=first.compute_input_end_ns,
                        compute_end_ns=first.compute_infer_end_ns,
                        end_ns=first.compute_end_ns,
                    ),
                )
            for pending, outcome in finished:
                if isinstance(outcome, InferenceError):
                    self._notify(
                        observer.request_failed,
                        instance.name,
                        pending.request,
                        outcome,
                        FailureReason.BACKEND,
                    )
                elif self._batch_observer is None:
                    self._notify(observer.request_succeeded, instance.name, pending.request)
            if self._batch_observer is not None:
                succeeded = [p.request for p, outcome in finished if not isinstance(outcome, InferenceError)]
                if succeeded:
                    self._notify(self._batch_observer, instance.name, succeeded)
        if self._order is not None:
            self._order.complete(finished)
        else:
            self._deliver_all(finished)

    # -- outcomes -----------------------------------------------------------------------------------

    def _cancel(self, pending: PendingRequest) -> bool:
        with self._lock:
            if not pending.queued or not self._queue.remove(pending):
                return False
            pending.queued = False
        error = InferenceError(
            f"{request_tag(pending.request)}inference request cancelled", ErrorCode.CANCELLED
        )
        self._fail_queued(pending, error, FailureReason.CANCELED)
        return True

    def _fail_queued(self, pending: PendingRequest, error: InferenceError, reason: FailureReason) -> None:
        if self._observer is not None:
            self._notify(self._observer.request_failed, None, pending.request, error, reason)
        self._deliver(pending, error)

    def _deliver_all(self, finished: list[tuple[PendingRequest, InferOutcome]]) -> None:
        """Deliver a batch's outcomes in order. Requests awaited on an event loop (`infer`) or
        answered on one (`OnLoop`) are settled by one `call_soon_threadsafe` per loop and batch
        instead of one per request: one wake-up of the loop and one callback there for the whole
        batch."""
        settle: dict[asyncio.AbstractEventLoop, list[tuple[OnLoop, InferOutcome]]] = {}
        for pending, outcome in finished:
            callback = pending.callback
            if type(callback) is OnLoop:
                settle.setdefault(callback.loop, []).append((callback, outcome))
            else:
                self._deliver(pending, outcome)
        for loop, outcomes in settle.items():
            try:
                loop.call_soon_threadsafe(_settle_all, outcomes)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

    def _deliver(self, pending: PendingRequest, outcome: InferOutcome) -> None:
        try:
            pending.callback(outcome)
        except Exception:
            log.exception("callback of a request to model '%s' failed", self.model_name)

    def _notify(self, method: Callable[..., None], *args: Any) -> None:
        try:
            method(*args)
        except Exception:
            log.exception("batcher observer failed in %s", getattr(method, "__name__", method))


def _stopping(request: InferRequest) -> InferenceError:
    return unavailable(
        f"{request_tag(request)}Server is stopping, scheduler for model has stopped accepting new inference requests"
    )


class OnLoop:
    """A `submit` callback that runs `function(outcome)` on `loop` (an event loop's thread): how
    `infer` settles the future it awaits, and how the native front ends answer a request they
    queued without a task (protocol.infer.submit_infer, InferenceService.queue_model_infer). The
    batcher recognises it and delivers a batch's outcomes for one loop by one wake-up of the loop
    (`_deliver_all`); called alone (cancellation, a failure in the queue) it delivers just its
    own. `function` must not raise (the loop's exception handler would only log it) and is called
    once, unless the loop is closed."""

    __slots__ = ("function", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, function: Callback) -> None:
        self.loop = loop
        self.function = function

    def __call__(self, outcome: InferOutcome) -> None:
        try:
            self.loop.call_soon_threadsafe(self.function, outcome)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            pass


def _settle(future: asyncio.Future[InferOutcome], outcome: InferOutcome) -> None:
    if not future.done():
        future.set_result(outcome)


def _settle_all(outcomes: list[tuple[OnLoop, InferOutcome]]) -> None:
    for callback, outcome in outcomes:
        callback.function(outcome)
