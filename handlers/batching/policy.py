"""How a model's requests are queued and batched, read from Triton's config JSON.

`BatchingPolicy.from_model_config` reads exactly what tritonserver's DynamicBatchScheduler is
created from (backend_model.cc SetConfiguredScheduler): `max_batch_size`, the `dynamic_batching`
message, and the inputs whose shapes must be equal inside a batch. The config is the JSON that
`GET /v2/models/M/config` returns; 64-bit fields may arrive as numbers or as decimal strings
(protobuf's JSON mapping), enum fields as names or numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class TimeoutAction(Enum):
    """ModelQueuePolicy.TimeoutAction."""

    REJECT = "REJECT"  # the request fails with UNAVAILABLE "Request timeout expired"
    DELAY = "DELAY"  # the request moves behind every unexpired request of its priority level

    @classmethod
    def parse(cls, value: Any) -> TimeoutAction:
        if value in (None, "", 0, "0", "REJECT"):
            return cls.REJECT
        if value in (1, "1", "DELAY"):
            return cls.DELAY
        raise ValueError(f"unknown timeout_action {value!r}")


@dataclass(frozen=True, slots=True)
class QueuePolicy:
    """ModelQueuePolicy: the queue of one priority level."""

    timeout_action: TimeoutAction = TimeoutAction.REJECT
    default_timeout_us: int = 0  # 0: requests never time out in the queue
    allow_timeout_override: bool = False
    max_queue_size: int = 0  # 0: unbounded

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> QueuePolicy:
        data = data or {}
        return cls(
            timeout_action=TimeoutAction.parse(data.get("timeout_action")),
            default_timeout_us=_uint(data.get("default_timeout_microseconds")),
            allow_timeout_override=bool(data.get("allow_timeout_override", False)),
            max_queue_size=_uint(data.get("max_queue_size")),
        )

    def timeout_us(self, requested_us: int) -> int:
        """The queue timeout a request gets (PolicyQueue::Enqueue).

        A request's own timeout only counts when the policy allows overrides, and then only when it
        is shorter than the default: with no default timeout (0) a request timeout is ignored,
        exactly as tritonserver 2.51 does (verified against it: allow_timeout_override with no
        default timeout never rejects).
        """
        timeout = self.default_timeout_us
        if self.allow_timeout_override and 0 < requested_us < timeout:
            timeout = requested_us
        return timeout


@dataclass(frozen=True)
class BatchingPolicy:
    """Everything the scheduler of one model needs from its config."""

    model_name: str
    dynamic_batching: bool = False
    batching_model: bool = False  # max_batch_size > 0
    max_batch_size: int = 1  # Triton's max(1, max_batch_size): a non-batching model counts 1 per request
    preferred_batch_sizes: tuple[int, ...] = ()  # ascending, distinct
    max_queue_delay_ns: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = QueuePolicy()
    priority_queue_policies: Mapping[int, QueuePolicy] = field(default_factory=dict)
    # Inputs whose shape (without the batch dimension) must be equal for requests to share a batch;
    # True: the contents must be equal too (shape tensors).
    equal_shape_inputs: Mapping[str, bool] = field(default_factory=dict)
    # With an optional input, requests share a batch only if they carry the same set of inputs.
    has_optional_input: bool = False

    @property
    def max_preferred_batch_size(self) -> int:
        return self.preferred_batch_sizes[-1] if self.preferred_batch_sizes else 0

    @property
    def checks_inputs(self) -> bool:
        return bool(self.equal_shape_inputs) or self.has_optional_input

    @classmethod
    def from_model_config(cls, config: Mapping[str, Any], *, no_queue_delay: bool = False) -> BatchingPolicy:
        """Read a model's Triton config JSON.

        `no_queue_delay` forces max_queue_delay_microseconds to 0 (AWS Lambda: an environment
        serves one request at a time, so waiting for company only adds latency).
        """
        name = str(config.get("name", ""))
        mbs = int(config.get("max_batch_size", 0) or 0)
        equal, optional = _equal_shape_inputs(config.get("input", []))
        db = config.get("dynamic_batching")
        if db is None:
            return cls(
                model_name=name,
                batching_model=mbs > 0,
                max_batch_size=max(1, mbs),
                equal_shape_inputs=equal,
                has_optional_input=optional,
            )
        preferred = sorted({int(size) for size in db.get("preferred_batch_size", [])})
        if not preferred and mbs > 0:
            # NormalizeModelConfig: a batching model's preferred size defaults to max_batch_size.
            preferred = [mbs]
        policies = {
            int(level): QueuePolicy.from_json(policy)
            for level, policy in (db.get("priority_queue_policy") or {}).items()
        }
        return cls(
            model_name=name,
            dynamic_batching=True,
            batching_model=mbs > 0,
            max_batch_size=max(1, mbs),
            preferred_batch_sizes=tuple(preferred),
            max_queue_delay_ns=0 if no_queue_delay else _uint(db.get("max_queue_delay_microseconds")) * 1000,
            preserve_ordering=bool(db.get("preserve_ordering", False)),
            priority_levels=_uint(db.get("priority_levels")),
            default_priority_level=_uint(db.get("default_priority_level")),
            default_queue_policy=QueuePolicy.from_json(db.get("default_queue_policy")),
            priority_queue_policies=policies,
            equal_shape_inputs=equal,
            has_optional_input=optional,
        )

    def priority_level(self, requested: int) -> int:
        """InferenceRequest::SetPriority: 0 or a level out of range means the default level."""
        if self.priority_levels == 0:
            return 0
        if requested <= 0 or requested > self.priority_levels:
            return self.default_priority_level
        return requested

    def queue_policy(self, level: int) -> QueuePolicy:
        return self.priority_queue_policies.get(level, self.default_queue_policy)

    def levels(self) -> dict[int, QueuePolicy]:
        """Every priority level with its queue policy, highest priority (lowest number) first."""
        if not self.dynamic_batching:
            return {0: QueuePolicy()}
        if self.priority_levels == 0:
            return {0: self.default_queue_policy}
        return {level: self.queue_policy(level) for level in range(1, self.priority_levels + 1)}


def _uint(value: Any) -> int:
    return int(value) if value not in (None, "") else 0


def _equal_shape_inputs(inputs: list[Mapping[str, Any]]) -> tuple[dict[str, bool], bool]:
    """SetConfiguredScheduler's enforce_equal_shape_tensors, plus whether any input is optional.

    Shape tensors must match in shape and contents; other inputs with a variable dimension (-1)
    must match in shape, unless they allow ragged batches.
    """
    equal: dict[str, bool] = {}
    optional = False
    for io in inputs:
        optional = optional or bool(io.get("optional", False))
        if io.get("is_shape_tensor", False):
            equal[io["name"]] = True
        elif not io.get("allow_ragged_batch", False) and any(int(d) == -1 for d in io.get("dims", [])):
            equal[io["name"]] = False
    return equal, optional
