"""What the sequence batcher reads from a model's `sequence_batching` (Triton's stateful models,
docs/user_guide/architecture.md#stateful-models), and the control tensors it gives a request.

- `strategy`: "direct" (the default) gives each sequence a slot of one instance for its whole
  life; an instance has `max_batch_size` slots (1 when the model does not batch), and its batch
  holds at most one request per slot, in slot order. "oldest" keeps up to
  `max_candidate_sequences` sequences per instance and batches the oldest requests among them,
  at most one per sequence.
- `idle_us`: a sequence that gets no request for `max_sequence_idle_microseconds` (1 s when the
  config leaves it 0, as tritonserver normalises it) loses its slot; its next request without
  the START flag is refused.
- `controls(request, ready)`: the `control_input` tensors (CONTROL_SEQUENCE_START, _END, _READY
  as `int32_false_true` / `fp32_false_true` / `bool_false_true`, and CONTROL_SEQUENCE_CORRID
  with its `data_type`), each of shape [1] (with the batch dimension, [1, 1]), as
  SequenceBatch::SetControlTensors makes them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..inference import InferRequest

SEQUENCE_START = 1  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
SEQUENCE_END = 2  # TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
DEFAULT_IDLE_US = 1_000_000

_BOOLEAN_FIELDS = {
    "int32_false_true": np.dtype(np.int32),
    "fp32_false_true": np.dtype(np.float32),
    "bool_false_true": np.dtype(np.bool_),
}
_CORRID_DTYPES = {
    "TYPE_UINT64": np.dtype(np.uint64),
    "TYPE_INT64": np.dtype(np.int64),
    "TYPE_UINT32": np.dtype(np.uint32),
    "TYPE_INT32": np.dtype(np.int32),
    "TYPE_STRING": np.dtype(object),
}


@dataclass(frozen=True)
class Control:
    """One control tensor: for START, END and READY its false and true values; for CORRID none."""

    name: str
    kind: str
    dtype: np.dtype
    values: tuple[Any, Any] = (0, 1)


@dataclass(frozen=True)
class SequencePolicy:
    strategy: str = "direct"
    idle_us: int = DEFAULT_IDLE_US
    max_batch_size: int = 0
    slots_per_instance: int = 1
    max_queue_delay_us: int = 0
    minimum_slot_utilization: float = 0.0
    preferred_batch_sizes: tuple[int, ...] = ()
    controls: tuple[Control, ...] = field(default_factory=tuple)

    @property
    def batching_model(self) -> bool:
        return self.max_batch_size > 0

    @classmethod
    def from_model_config(cls, config: Mapping[str, Any]) -> SequencePolicy:
        sequence = config.get("sequence_batching") or {}
        max_batch_size = int(config.get("max_batch_size", 0))
        idle = int(sequence.get("max_sequence_idle_microseconds", 0) or 0) or DEFAULT_IDLE_US
        controls = tuple(_controls(sequence))
        if "oldest" in sequence:
            oldest = sequence.get("oldest") or {}
            return cls(
                strategy="oldest",
                idle_us=idle,
                max_batch_size=max_batch_size,
                slots_per_instance=max(1, int(oldest.get("max_candidate_sequences", 0) or 0)),
                max_queue_delay_us=int(oldest.get("max_queue_delay_microseconds", 0) or 0),
                preferred_batch_sizes=tuple(sorted(int(s) for s in oldest.get("preferred_batch_size", ()))),
                controls=controls,
            )
        direct = sequence.get("direct") or {}
        return cls(
            strategy="direct",
            idle_us=idle,
            max_batch_size=max_batch_size,
            slots_per_instance=max(1, max_batch_size),
            max_queue_delay_us=int(direct.get("max_queue_delay_microseconds", 0) or 0),
            minimum_slot_utilization=float(direct.get("minimum_slot_utilization", 0.0) or 0.0),
            controls=controls,
        )

    def controls_for(self, request: InferRequest, *, ready: bool = True) -> dict[str, np.ndarray]:
        """The control tensors of `request` (of a null request that pads a slot when not `ready`:
        START, END and READY false, CORRID 0)."""
        shape = (1, 1) if self.batching_model else (1,)
        tensors: dict[str, np.ndarray] = {}
        for control in self.controls:
            if control.kind == "CONTROL_SEQUENCE_CORRID":
                tensors[control.name] = _corrid(control, request.correlation_id if ready else 0, shape)
                continue
            if control.kind == "CONTROL_SEQUENCE_READY":
                on = ready
            elif control.kind == "CONTROL_SEQUENCE_START":
                on = ready and bool(request.flags & SEQUENCE_START)
            else:
                on = ready and bool(request.flags & SEQUENCE_END)
            tensors[control.name] = np.full(shape, control.values[1 if on else 0], dtype=control.dtype)
        return tensors


def control_input_names(config: Mapping[str, Any]) -> list[str]:
    """The names of a config's sequence control tensors (inputs of the model, not of the config)."""
    sequence = config.get("sequence_batching") or {}
    return [c.get("name", "") for c in sequence.get("control_input", ()) if c.get("control")]


def _controls(sequence: Mapping[str, Any]):
    for control_input in sequence.get("control_input", ()):
        name = control_input.get("name", "")
        for control in control_input.get("control", ()):
            kind = control.get("kind", "CONTROL_SEQUENCE_START")
            if kind == "CONTROL_SEQUENCE_CORRID":
                yield Control(name, kind, _CORRID_DTYPES.get(control.get("data_type", "TYPE_UINT64"), np.dtype(np.uint64)))
                continue
            for field_name, dtype in _BOOLEAN_FIELDS.items():
                values = control.get(field_name)
                if values:
                    yield Control(name, kind, dtype, (values[0], values[1]))
                    break


def _corrid(control: Control, correlation_id: int | str, shape: tuple[int, ...]) -> np.ndarray:
    if control.dtype == object:
        array = np.empty(shape, dtype=object)
        array.fill(str(correlation_id).encode("utf-8") if correlation_id != 0 else b"")
        return array
    # A string id given to a numeric CORRID: Triton copies no value; 0 here. A numeric id is
    # copied bytewise as Triton copies it: a 32-bit CORRID holds the id's low 32 bits.
    value = correlation_id if isinstance(correlation_id, int) else 0
    if control.dtype.itemsize == 4:
        word = np.array([value & 0xFFFFFFFF], dtype=np.uint32).view(control.dtype)
    else:
        word = np.array([value & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64).view(control.dtype)
    return np.full(shape, word[0], dtype=control.dtype)
