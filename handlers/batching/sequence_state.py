"""Implicit state of stateful models (`sequence_batching { state [...] }`): tensors the model reads
as inputs and writes as outputs, which the sequence batcher keeps from one request of a sequence
to the next (Triton's "implicit state management"; core's SequenceStates).

`state_specs(config, model_dir)` reads each state with Triton's load-time checks and messages
(SequenceBatchScheduler::GenerateInitialStateData). A sequence's state starts, at its START
request, as its `initial_state` (`zero_data`, or `data_file` from the model's `initial_state/`
folder), else zeros (tritonserver leaves that buffer unset); its shape is the state's `dims` with
each -1 as 1, behind a batch dimension of 1 when the model batches. After each request the
model's `output_name` tensor becomes the sequence's next `input_name` tensor; it reaches the
client only where the config also lists it as an output and the request asks for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..datatypes import from_config_type, numpy_dtype

INITIAL_STATE_FOLDER = "initial_state"


@dataclass(frozen=True)
class StateSpec:
    input_name: str
    output_name: str
    dtype: np.dtype
    initial: np.ndarray  # the state at a sequence's start (batch dimension included when batching)


def state_specs(config: Mapping[str, Any], model_dir: Path | None) -> list[StateSpec]:
    """The config's states; ValueError with tritonserver's message for one it refuses."""
    sequence = config.get("sequence_batching") or {}
    batching = int(config.get("max_batch_size", 0)) > 0
    specs: list[StateSpec] = []
    seen: set[str] = set()
    for state in sequence.get("state", ()):
        input_name = str(state.get("input_name", ""))
        data_type = str(state.get("data_type", "TYPE_INVALID"))
        dims = [int(d) for d in state.get("dims", ())]
        if state.get("use_growable_memory"):
            raise ValueError(
                "'use_growable_memory' can only work with KIND_GPU model instances right now. Please either change the "
                f"instance type to KIND_GPU or set 'use_growable_memory' to false for state input '{input_name}'"
            )
        initial_states = state.get("initial_state", ())
        if len(initial_states) > 1:
            raise ValueError(
                f"initial_state field for state input '{input_name}' must contain exactly one or zero element. "
                f"Found '{len(initial_states)}' elements."
            )
        dtype = numpy_dtype(from_config_type(data_type))
        if initial_states:
            if input_name in seen:
                raise ValueError(f"State input name '{input_name}' specified more than once.")
            initial = _initial_state(initial_states[0], input_name, data_type, dims, dtype, model_dir)
        else:
            initial = np.zeros([1 if d == -1 else d for d in dims], dtype=dtype)
            if dtype == object:
                initial.fill(b"")
        seen.add(input_name)
        if batching:
            initial = initial.reshape((1, *initial.shape))
        initial.flags.writeable = False  # shared by every sequence's start
        specs.append(StateSpec(input_name, str(state.get("output_name", "")), dtype, initial))
    return specs


def _initial_state(
    initial: Mapping[str, Any], input_name: str, data_type: str, dims: list[int], dtype: np.dtype, model_dir: Path | None
) -> np.ndarray:
    """GenerateInitialStateData's checks, in its order, and the data."""
    if initial.get("data_type", "TYPE_INVALID") != data_type:
        raise ValueError(f"The data type used for 'initial_state' field of state '{input_name}' does not match the state "
                         "data type.")
    if not initial.get("name"):
        raise ValueError(f"Field 'name' must be set when using initial_state for state input '{input_name}'.")
    initial_dims = [int(d) for d in initial.get("dims", ())]
    if len(initial_dims) != len(dims):
        raise ValueError(
            "Number of dimensions in 'initial_state' doesn't match the size of 'state' dimensions for state input "
            f"'{input_name}'. {len(initial_dims)} != {len(dims)}"
        )
    for initial_dim, dim in zip(initial_dims, dims):
        if initial_dim == -1:
            raise ValueError(f"'initial_state' field for state input name '{input_name}' contains variable dimensions.")
        if dim != -1 and initial_dim != dim:
            raise ValueError(
                f"'initial_state' dim for input name '{input_name}' doesn't match 'state' dim description. "
                f"{initial_dim} != {dim}"
            )
    count = int(np.prod(initial_dims)) if initial_dims else 1
    if initial.get("data_file"):
        path = (Path(model_dir) if model_dir is not None else Path(".")) / INITIAL_STATE_FOLDER / str(initial["data_file"])
        try:
            raw = path.read_bytes()
        except OSError as exc:
            raise ValueError(f"failed to read initial state file '{path}' for state input '{input_name}': "
                             f"{exc.strerror}") from None
        if dtype == object:
            return _strings(raw, count, input_name).reshape(initial_dims)
        needed = count * dtype.itemsize
        if needed > len(raw):
            raise ValueError(
                f"initial_state for state input '{input_name}' has only {len(raw)} bytes of data, {needed} bytes needed"
            )
        return np.frombuffer(raw[:needed], dtype=dtype).reshape(initial_dims).copy()
    array = np.zeros(initial_dims, dtype=dtype)
    if dtype == object:
        array.fill(b"")
    return array


def _strings(raw: bytes, count: int, input_name: str) -> np.ndarray:
    """BYTES elements as Triton serialises them: a 4-byte little-endian length, then the bytes."""
    items: list[bytes] = []
    offset = 0
    while offset + 4 <= len(raw) and len(items) < count:
        length = int.from_bytes(raw[offset : offset + 4], "little")
        items.append(raw[offset + 4 : offset + 4 + length])
        offset += 4 + length
    if len(items) != count:
        raise ValueError(f"initial_state for state input '{input_name}' holds {len(items)} strings, {count} needed")
    array = np.empty(count, dtype=object)
    array[:] = items
    return array
