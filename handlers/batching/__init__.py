"""Dynamic batching with tritonserver's semantics (DynamicBatchScheduler), as its own package.

- policy.py: what the scheduler reads from a model's Triton config JSON
- priority_queue.py: the per-priority-level queues with their timeout / size policies
- formation.py: which requests form the next batch (pure, tested with virtual time)
- batcher.py: DynamicBatcher, one worker thread per model instance
- ordering.py: preserve_ordering
- observer.py: the events statistics and metrics are built from
- merge.py: concatenating a batch's inputs and splitting its outputs per request
- batch_tensors.py: batch inputs and batch outputs (ragged batching), made from the batch itself
- sequence_policy.py, sequence_state.py, sequence_batcher.py: the sequence batcher of stateful models
  (sequence_batching): control tensors, implicit state, slots
"""

from .batcher import BatcherState, DynamicBatcher, ModelInstance, OnLoop
from .formation import Formation, form_batch
from .merge import batch_sizes, merge_inputs, requested_output_names, split_outputs
from .observer import BatcherObserver, BatchExecution, FailureReason
from .policy import BatchingPolicy, QueuePolicy, TimeoutAction
from .priority_queue import PendingRequest, PriorityQueue
from .sequence_batcher import SequenceBatcher
from .sequence_policy import SequencePolicy

__all__ = [
    "BatchExecution",
    "BatcherObserver",
    "BatcherState",
    "BatchingPolicy",
    "DynamicBatcher",
    "FailureReason",
    "Formation",
    "ModelInstance",
    "OnLoop",
    "PendingRequest",
    "PriorityQueue",
    "QueuePolicy",
    "SequenceBatcher",
    "SequencePolicy",
    "TimeoutAction",
    "batch_sizes",
    "form_batch",
    "merge_inputs",
    "requested_output_names",
    "split_outputs",
]
