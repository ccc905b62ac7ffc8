"""What the batcher reports for statistics (Triton's statistics extension, Prometheus metrics).

Every request produces `request_queued`, then either `batch_started` (it left the queue in a
batch) followed by `request_succeeded` or `request_failed`, or `request_failed` straight from the
queue (rejected by its timeout, cancelled, or dropped at shutdown: `instance` is None). Every batch
an instance executed without raising produces one `batch_executed`.

The request's timestamps (InferRequest.*_ns, monotonic) are complete when the request is
reported: queue = compute_start - queue_start; compute_input = compute_input_end - compute_start;
compute_infer = compute_infer_end - compute_input_end; compute_output = compute_end -
compute_infer_end. Triton's inference_count is the sum of the executed batch sizes, its
execution_count the number of batches, and batch_stats is keyed by the executed batch size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from ..errors import InferenceError
from ..inference import InferRequest


class FailureReason(Enum):
    """The `reason` label of nv_inference_request_failure (tritonserver's FailureReason)."""

    REJECTED = "REJECTED"  # queue timeout under REJECT
    CANCELED = "CANCELED"
    BACKEND = "BACKEND"  # the model instance failed the request
    OTHER = "OTHER"  # e.g. dropped when the model stopped without draining


@dataclass(frozen=True, slots=True)
class BatchExecution:
    """One execution of a model instance (TRITONBACKEND_ModelInstanceReportBatchStatistics)."""

    instance: str
    batch_size: int  # sum of the requests' batch sizes
    request_count: int
    start_ns: int  # execution start
    compute_start_ns: int  # inputs ready
    compute_end_ns: int  # inference done
    end_ns: int  # outputs ready

    @property
    def compute_input_ns(self) -> int:
        return self.compute_start_ns - self.start_ns

    @property
    def compute_infer_ns(self) -> int:
        return self.compute_end_ns - self.compute_start_ns

    @property
    def compute_output_ns(self) -> int:
        return self.end_ns - self.compute_end_ns


class BatcherObserver(Protocol):
    """Called from the submitting thread (request_queued) and from worker threads (the rest).

    Calls must be quick and must not raise; an exception is logged and ignored.
    """

    def request_queued(self, request: InferRequest) -> None: ...

    def batch_started(self, instance: str, requests: Sequence[InferRequest]) -> None: ...

    def batch_executed(self, execution: BatchExecution) -> None: ...

    def request_succeeded(self, instance: str, request: InferRequest) -> None: ...

    def request_failed(
        self, instance: str | None, request: InferRequest, error: InferenceError, reason: FailureReason
    ) -> None: ...
