"""preserve_ordering: outcomes are delivered in the order requests left the queue.

DynamicBatchScheduler::DelegateResponse/FinalizeResponses: a request gets its slot when a batch
takes it (so in scheduling order, across instances); a finished outcome waits until every earlier
slot has been delivered. Requests that fail in the queue (timeout, cancel) never get a slot.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ..inference import InferOutcome
from .priority_queue import PendingRequest

Deliver = Callable[[PendingRequest, InferOutcome], None]


class ResponseOrder:
    def __init__(self, deliver: Deliver) -> None:
        self._deliver = deliver
        self._lock = threading.Lock()
        # Held by the one thread delivering; a worker that finds it taken leaves its outcomes to
        # that thread instead of blocking.
        self._finalize = threading.Lock()
        self._next_slot = 0
        self._next_delivery = 0
        self._done: dict[int, tuple[PendingRequest, InferOutcome]] = {}

    def assign(self, batch: list[PendingRequest]) -> None:
        """Give the requests of a batch their slots (called under the batcher's lock)."""
        with self._lock:
            for pending in batch:
                pending.seq = self._next_slot
                self._next_slot += 1

    def complete(self, finished: list[tuple[PendingRequest, InferOutcome]]) -> None:
        with self._lock:
            for pending, outcome in finished:
                self._done[pending.seq] = (pending, outcome)
        while self._deliverable() and self._finalize.acquire(blocking=False):
            try:
                while ready := self._take_ready():
                    for pending, outcome in ready:
                        self._deliver(pending, outcome)
            finally:
                self._finalize.release()
            # Outcomes added while this thread was delivering and whose thread found the lock
            # taken are picked up by the loop condition.

    def _deliverable(self) -> bool:
        with self._lock:
            return self._next_delivery in self._done

    def _take_ready(self) -> list[tuple[PendingRequest, InferOutcome]]:
        with self._lock:
            ready: list[tuple[PendingRequest, InferOutcome]] = []
            while self._next_delivery in self._done:
                ready.append(self._done.pop(self._next_delivery))
                self._next_delivery += 1
            return ready
