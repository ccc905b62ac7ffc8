"""Responses of decoupled Python models, serving-process side.

A decoupled model sends its responses through `request.get_response_sender()`, from any thread,
during or after `execute`. Each request of a batch gets a token; the model's senders address
their responses to the token (model_runner.py), and `ResponseRoutes` turns them into events of
the request's ResponseSink (handlers/streaming.py). An in-process instance's senders call the
routes directly; a model process's senders send ("response", token, (payload, final)) messages
that the instance's reader thread hands to the routes (process_instance.py), and cancellation
travels the other way as ("cancel", token, None).

A route is closed by the final event, by the execute error that ends its request (the batcher
then finishes the sink), or by `close_all` when the model process dies or the instance unloads.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from typing import Any

from ...errors import InferenceError, internal
from ...inference import InferRequest
from ...model_io import OutputReshape
from ...streaming import ResponseSink, StreamClosed
from . import conversion

log = logging.getLogger("handlers.python")

# One event as it crosses the model boundary: an OutcomePayload (("ok", tensors) or ("error",
# message, code)) or None for a flag-only final, and the final flag.


class ResponseRoutes:
    """The open response streams of one model instance's decoupled requests, by token."""

    def __init__(self, on_cancel: Callable[[int], None] | None = None, reshape: OutputReshape | None = None) -> None:
        self._reshape = reshape  # the config's output reshape, for each response as it is sent
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._routes: dict[int, tuple[ResponseSink, InferRequest]] = {}
        self._cancelled: set[int] = set()
        self._on_cancel = on_cancel  # a model process is told about cancellations

    def open(self, request: InferRequest) -> int:
        """A token for `request`'s responses (a request without a sink, e.g. warmup, gets one
        whose responses are dropped)."""
        sink = request.responses if request.responses is not None else ResponseSink()
        token = next(self._ids)
        with self._lock:
            self._routes[token] = (sink, request)
        sink.on_cancel(lambda: self._cancel(token))
        return token

    def _cancel(self, token: int) -> None:
        with self._lock:
            if token not in self._routes:
                return
            self._cancelled.add(token)
        if self._on_cancel is not None:
            self._on_cancel(token)

    def send(self, token: int, payload: Any, final: bool) -> None:
        """One event from the model: its response, its error, or a flag-only final (None)."""
        with self._lock:
            route = self._routes.get(token)
            if route is not None and final:
                del self._routes[token]
                self._cancelled.discard(token)
        if route is None:
            return  # the stream ended already (an execute error, a dead process)
        sink, request = route
        response = error = None
        if payload is not None:
            outcome = conversion.outcome(payload, request)
            if self._reshape:
                outcome = self._reshape.apply(outcome)
            if isinstance(outcome, InferenceError):
                error = outcome
            else:
                response = outcome
        try:
            sink.send(response, error, final)
        except StreamClosed:
            pass

    def is_cancelled(self, token: int) -> bool:
        with self._lock:
            return token in self._cancelled

    def forget(self, token: int) -> None:
        """The request ended without its final event (its execute failed: the batcher ends it)."""
        with self._lock:
            self._routes.pop(token, None)
            self._cancelled.discard(token)

    def close_all(self, message: str) -> None:
        """End every open stream with an INTERNAL error (the model process died, or the
        instance was unloaded while a stream was still open)."""
        with self._lock:
            routes, self._routes = self._routes, {}
            self._cancelled.clear()
        for sink, _ in routes.values():
            sink.finish(internal(message))

    def __len__(self) -> int:
        with self._lock:
            return len(self._routes)
