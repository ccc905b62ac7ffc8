"""Batch formation: DynamicBatchScheduler::GetDynamicBatch, for a model instance that is free.

Pure logic over the queue and an explicit `now`, so it is tested with virtual time. Requests join
the batch in scheduling order, each counting with its own batch size:

- the batch never exceeds max_batch_size, and stops at a request whose variable-dimension inputs
  have other shapes than the first request's (the batch is then sent as it is);
- the largest preferred batch size reached is sent at once; when the next request would go past
  the largest preferred size, what is pending is marked as the best batch;
- otherwise the batch waits until its oldest request has been queued max_queue_delay (or the
  closest queue timeout in it expires), unless it cannot grow any further; with no delay it is
  sent as it is.

The scheduler only forms a batch for an instance that is free, so Triton's "payload already
queued and still growing" case (payload_batch_size > 0) never arises here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..inference import InferRequest
from .policy import BatchingPolicy
from .priority_queue import PendingRequest, PriorityQueue

# GetDynamicBatch returns its wait in whole microseconds and a 0 means "send now".
_MIN_WAIT_NS = 1_000


@dataclass(slots=True)
class Formation:
    batch: list[PendingRequest] = field(default_factory=list)  # to execute now (may be empty)
    rejected: list[PendingRequest] = field(default_factory=list)  # timed out under REJECT
    wait_ns: int | None = None  # nothing to execute: re-check after this long (None: on arrival)


class InputSignature:
    """RequiredEqualInputs: what a request must share with the first request of a batch."""

    __slots__ = ("_batching", "_names", "_shapes")

    def __init__(self, policy: BatchingPolicy, request: InferRequest) -> None:
        self._batching = policy.batching_model
        self._shapes: dict[str, tuple[tuple[int, ...], np.ndarray | None]] = {}
        for name, contents in policy.equal_shape_inputs.items():
            array = request.inputs.get(name)
            if array is not None:
                self._shapes[name] = (self._shape(array), array if contents else None)
        self._names = frozenset(request.inputs) if policy.has_optional_input else None

    def _shape(self, array: np.ndarray) -> tuple[int, ...]:
        return array.shape[1:] if self._batching else array.shape

    def matches(self, request: InferRequest) -> bool:
        inputs = request.inputs
        if self._names is not None and (
            len(inputs) != len(self._names) or not self._names.issuperset(inputs)
        ):
            return False
        for name, (shape, contents) in self._shapes.items():
            array = inputs.get(name)
            if array is None:
                continue
            if self._shape(array) != shape:
                return False
            if contents is not None and not np.array_equal(array, contents):
                return False
        return True


def form_batch(
    policy: BatchingPolicy, queue: PriorityQueue, now_ns: int, *, flush: bool = False
) -> Formation:
    """The batch a free instance executes now, or how long to wait for a better one.

    `flush` sends whatever is pending without waiting (used while draining at shutdown).
    """
    scan = queue.scan(now_ns)
    if not policy.dynamic_batching:
        # Default scheduler: every request runs on its own, in arrival order.
        first = scan.next()
        return Formation(scan.keep(1 if first is not None else 0), scan.rejected)

    max_batch = policy.max_batch_size
    max_preferred = policy.max_preferred_batch_size
    preferred = policy.preferred_batch_sizes
    signature: InputSignature | None = None
    check_inputs = policy.checks_inputs

    count = 0  # requests in the pending batch
    size = 0  # its batch size
    best = 0  # requests in the best batch found (0: none)
    send_now = False
    oldest_ns = 0
    closest_timeout_ns = 0
    while (pending := scan.next()) is not None:
        batch_size = pending.batch_size
        if count == 0:
            if check_inputs:
                signature = InputSignature(policy, pending.request)
        else:
            if size + batch_size > max_preferred and best == 0:
                # Past every preferred size: what is pending is the best batch; keep looking only
                # to learn whether the delay of the requests that would still fit has run out.
                best = count
            if size + batch_size > max_batch:
                send_now = True
                break
            if signature is not None and not signature.matches(pending.request):
                send_now = True
                break
        count += 1
        size += batch_size
        if count == 1 or pending.enqueue_ns < oldest_ns:
            oldest_ns = pending.enqueue_ns
        if pending.deadline_ns and (closest_timeout_ns == 0 or pending.deadline_ns < closest_timeout_ns):
            closest_timeout_ns = pending.deadline_ns
        if size in preferred:
            best = count

    delay_ns = policy.max_queue_delay_ns
    waited_ns = now_ns - oldest_ns
    delay_exceeded = flush or (delay_ns != 0 and count > 0 and waited_ns >= delay_ns)

    if best and not delay_exceeded:
        take = best
    elif count == 0:
        take = 0
    elif send_now or size >= max_preferred or delay_exceeded or delay_ns == 0:
        take = count
    else:
        wait_ns = delay_ns - waited_ns
        if closest_timeout_ns:
            wait_ns = (
                min(wait_ns, closest_timeout_ns - now_ns) if now_ns <= closest_timeout_ns else _MIN_WAIT_NS
            )
        if wait_ns < _MIN_WAIT_NS:
            take = count
        else:
            scan.keep(0)
            return Formation([], scan.rejected, wait_ns)
    return Formation(scan.keep(take), scan.rejected)
