"""The scheduler's queue: one policy queue per priority level (scheduler_utils.cc PriorityQueue).

Each level holds its unexpired requests in arrival order, followed by its *delayed* requests
(those whose timeout expired under a DELAY policy). Levels are served highest priority (lowest
number) first. Timeouts are applied as a scan reaches a request, exactly like Triton's cursor:
an expired request under REJECT is taken out to fail, under DELAY it moves to the back of its
level and never expires again.

Not thread-safe: the batcher holds its lock around every call.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from ..errors import InferenceError, unavailable
from ..inference import InferOutcome, InferRequest
from .policy import QueuePolicy, TimeoutAction

Callback = Callable[[InferOutcome], None]


def request_tag(request: InferRequest) -> str:
    """InferenceRequest::LogRequest, the prefix tritonserver puts on scheduler errors."""
    return f"[request id: {request.id or '<id_unknown>'}] "


class PendingRequest:
    """A submitted request and the callback that receives its outcome.

    Returned by `DynamicBatcher.submit`; `cancel()` takes it out of the queue if no batch has
    taken it yet (through `canceller`, the batcher's, which owns the queue and its lock).
    """

    __slots__ = (
        "_canceller",
        "batch_size",
        "callback",
        "deadline_ns",
        "enqueue_ns",
        "level",
        "queued",
        "request",
        "seq",
    )

    def __init__(
        self,
        request: InferRequest,
        callback: Callback,
        batch_size: int,
        level: int,
        enqueue_ns: int,
        deadline_ns: int,
        canceller: Callable[[PendingRequest], bool] | None = None,
    ) -> None:
        self.request = request
        self.callback = callback
        self.batch_size = batch_size  # at least 1: what the request counts for in a batch
        self.level = level
        self.enqueue_ns = enqueue_ns
        self.deadline_ns = deadline_ns  # 0: never times out
        self.queued = True  # False once taken into a batch, failed or cancelled
        self.seq = -1  # response order (preserve_ordering)
        self._canceller = canceller

    def cancel(self) -> bool:
        """Cancel the request if it is still queued: its callback gets a CANCELLED error.

        False when it is already executing or finished (its outcome comes as usual).
        """
        return self._canceller is not None and self._canceller(self)

    def __repr__(self) -> str:
        return f"PendingRequest(id={self.request.id!r}, batch_size={self.batch_size}, level={self.level})"


class PolicyQueue:
    __slots__ = ("delayed", "policy", "queue")

    def __init__(self, policy: QueuePolicy) -> None:
        self.policy = policy
        self.queue: deque[PendingRequest] = deque()
        self.delayed: deque[PendingRequest] = deque()

    def __len__(self) -> int:
        return len(self.queue) + len(self.delayed)


class PriorityQueue:
    def __init__(self, levels: dict[int, QueuePolicy]) -> None:
        self._by_level = {level: PolicyQueue(policy) for level, policy in sorted(levels.items())}
        self._ordered = list(self._by_level.values())
        self.size = 0

    def __len__(self) -> int:
        return self.size

    def policy(self, level: int) -> QueuePolicy:
        return self._by_level[level].policy

    def enqueue(self, pending: PendingRequest) -> None:
        """Queue a request at the back of its level; UNAVAILABLE when that level is full."""
        queue = self._by_level[pending.level]
        limit = queue.policy.max_queue_size
        if limit and len(queue) >= limit:
            raise unavailable(request_tag(pending.request) + "Exceeds maximum queue size")
        queue.queue.append(pending)
        self.size += 1

    def remove(self, pending: PendingRequest) -> bool:
        queue = self._by_level[pending.level]
        for part in (queue.queue, queue.delayed):
            try:
                part.remove(pending)
            except ValueError:
                continue
            self.size -= 1
            return True
        return False

    def take_all(self) -> list[PendingRequest]:
        taken: list[PendingRequest] = []
        for queue in self._ordered:
            taken.extend(queue.queue)
            taken.extend(queue.delayed)
            queue.queue.clear()
            queue.delayed.clear()
        self.size = 0
        return taken

    def scan(self, now_ns: int) -> Scan:
        return Scan(self, now_ns)


class Scan:
    """A cursor over the queue in scheduling order, applying each level's timeout policy.

    `next()` takes requests off the queue one by one; `keep(n)` keeps the first n of them (the
    batch) and puts every other one back where it was, so a scan that forms no batch leaves the
    queue as it found it, except for timeouts it applied.
    """

    __slots__ = ("_level", "_now", "_pq", "_taken", "rejected")

    def __init__(self, pq: PriorityQueue, now_ns: int) -> None:
        self._pq = pq
        self._now = now_ns
        self._level = 0
        self._taken: list[tuple[PendingRequest, deque[PendingRequest]]] = []
        self.rejected: list[PendingRequest] = []  # timed out under REJECT, out of the queue

    def next(self) -> PendingRequest | None:
        levels = self._pq._ordered
        now = self._now
        while self._level < len(levels):
            level = levels[self._level]
            if level.queue:
                pending = level.queue.popleft()
                if pending.deadline_ns and now > pending.deadline_ns:
                    pending.deadline_ns = 0
                    if level.policy.timeout_action is TimeoutAction.DELAY:
                        level.delayed.append(pending)
                    else:
                        pending.queued = False
                        self._pq.size -= 1
                        self.rejected.append(pending)
                    continue
                self._taken.append((pending, level.queue))
                return pending
            if level.delayed:
                pending = level.delayed.popleft()
                self._taken.append((pending, level.delayed))
                return pending
            self._level += 1
        return None

    def keep(self, count: int) -> list[PendingRequest]:
        """The first `count` requests of the scan leave the queue; the others go back."""
        for pending, origin in reversed(self._taken[count:]):
            origin.appendleft(pending)
        batch = [pending for pending, _ in self._taken[:count]]
        for pending in batch:
            pending.queued = False
        self._pq.size -= len(batch)
        self._taken = []
        return batch


def timeout_error(request: InferRequest) -> InferenceError:
    """What a request rejected by its queue timeout answers (tritonserver 2.51, HTTP 503)."""
    return unavailable("Request timeout expired")
