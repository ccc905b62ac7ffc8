"""The runtime's inference request and response, as the batcher and the backends see them.

A request is validated against the model's config before it is queued (a bad request never
reaches a batch). Tensors are numpy arrays; when the model batches (max_batch_size > 0) the
first dimension of every input is the request's own batch size.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import InferenceError


@dataclass(slots=True)
class RequestedOutput:
    name: str
    binary_data: bool = False  # binary tensor data extension: return raw bytes after the JSON
    classification: int = 0  # classification extension: top-N "value:index[:label]" strings
    parameters: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    model_name: str
    model_version: int
    inputs: dict[str, np.ndarray]
    # None: every output of the model. Otherwise the outputs asked for, in request order.
    requested_outputs: list[RequestedOutput] | None = None
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)
    # Scheduling: the request's own batch size (1 when the model does not batch), its priority
    # level (0 = the model's default) and queue timeout (0 = the model's default policy).
    batch_size: int = 1
    priority: int = 0
    timeout_us: int = 0
    # Monotonic timestamps (ns) for statistics: set by the protocol layer, the batcher and the
    # backend as the request moves through them.
    received_ns: int = field(default_factory=time.monotonic_ns)
    queue_start_ns: int = 0
    compute_start_ns: int = 0
    compute_input_end_ns: int = 0
    compute_infer_end_ns: int = 0
    compute_end_ns: int = 0
    # Correlation id / flags pass through to Python models (pb_utils.InferenceRequest).
    correlation_id: int | str = 0
    flags: int = 0
    # The request parameters the v2 infer frontend consumes (codec.FRONTEND_PARAMETERS: priority,
    # timeout, sequence_*, binary_data_output) are hidden from models; the generate extension
    # consumes none of them, so its requests pass every parameter on (False).
    frontend_parameters: bool = True
    # A request to a decoupled model: the ResponseSink (handlers/streaming.py) its responses go to.
    responses: Any = None
    # A request of a sequence with implicit state: the state outputs the backend must also produce
    # and answer with (the sequence batcher keeps them; handlers/batching/sequence_state.py).
    state_outputs: tuple[str, ...] = ()


@dataclass(slots=True)
class InferResponse:
    model_name: str
    model_version: int
    outputs: dict[str, np.ndarray]
    id: str = ""
    parameters: dict[str, Any] = field(default_factory=dict)


# What an instance returns for each request of a batch: its response, or its error.
InferOutcome = InferResponse | InferenceError
