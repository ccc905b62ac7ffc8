"""Response streams: the responses of one request as a model produces them.

A decoupled model (`model_transaction_policy { decoupled: true }`, Triton's python backend) sends
zero, one or many responses per request, from any thread, possibly long after its `execute`
returned; the last one carries the final flag (TRITONSERVER_RESPONSE_COMPLETE_FINAL), or a
flag-only final follows it. A response may be an error without ending the stream. Every
transport reads the same events:

- `StreamEvent(response, error, final)`: outputs, or an error, or neither (a flag-only final);
- `ResponseSink`: where a request's events go. The backend (the producer) calls `send`, from any
  thread; `finish(error)` ends a stream that is still open with an error (a failed execute, a queue
  timeout, a model process that died); the consumer calls `cancel()` when its client goes away,
  which runs the hooks registered with `on_cancel` (the request leaves the batcher's queue if it
  is still there; the model sees `request.is_cancelled()`);
- `ResponseStream`: a sink that an asyncio consumer reads with `async for event in stream`
  (HTTP generate / generate_stream, gRPC ModelStreamInfer). Events are buffered until read;
  once the consumer cancels, its iteration ends.

`LoadedModel.stream(request)` (model_repository.py) starts a request and returns its stream, for a
decoupled model or not (a non-decoupled model gives exactly one final event), so a transport needs
no other path. Events are delivered in the order they were sent; nothing follows a final event.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from .errors import InferenceError
from .inference import InferResponse

log = logging.getLogger("handlers.streaming")

__all__ = ["ResponseSink", "ResponseStream", "StreamClosed", "StreamEvent"]


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event of a request's stream: a response, an error, or a flag-only final (neither)."""

    response: InferResponse | None = None
    error: InferenceError | None = None
    final: bool = False


class StreamClosed(Exception):
    """An event sent after the stream's final event."""


class ResponseSink:
    """Where one request's events go. `deliver(event)` (if given) receives them in order, called
    with the sink's lock held: it must be quick and must not send to this sink."""

    __slots__ = ("_cancel_hooks", "_cancelled", "_closed", "_deliver", "_lock")

    def __init__(self, deliver: Callable[[StreamEvent], None] | None = None) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._cancelled = False
        self._cancel_hooks: list[Callable[[], object]] = []
        self._deliver = deliver

    # -- producer side (any thread) ------------------------------------------------------------------

    def send(
        self, response: InferResponse | None = None, error: InferenceError | None = None, final: bool = False
    ) -> None:
        """Deliver one event; StreamClosed once the final event was sent."""
        with self._lock:
            if self._closed:
                raise StreamClosed("the response stream of this request is closed")
            if final:
                self._closed = True
            self._emit(StreamEvent(response, error, final))

    def finish(self, error: InferenceError | None = None, response: InferResponse | None = None) -> bool:
        """End the stream unless it has ended already (True when this call ended it): with
        `error` or `response` as its last event, else with a flag-only final."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
            self._emit(StreamEvent(response, error, True))
            return True

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    # -- consumer side -------------------------------------------------------------------------------

    def cancel(self) -> None:
        """The consumer is gone: mark the request cancelled and run the cancel hooks (once)."""
        with self._lock:
            if self._cancelled:
                return
            self._cancelled = True
            hooks, self._cancel_hooks = self._cancel_hooks, []
        for hook in hooks:
            try:
                hook()
            except Exception:  # a failing hook must not stop the others
                log.exception("cancel hook of a response stream failed")

    def on_cancel(self, hook: Callable[[], object]) -> None:
        """Run `hook` when the stream is cancelled (at once if it already is)."""
        with self._lock:
            if not self._cancelled:
                self._cancel_hooks.append(hook)
                return
        hook()

    def _emit(self, event: StreamEvent) -> None:
        if self._deliver is not None:
            self._deliver(event)


class ResponseStream(ResponseSink):
    """A sink read by one asyncio consumer (`async for event in stream`). Created on the
    consumer's event loop; producers may send from any thread."""

    __slots__ = ("_events", "_finished", "_loop", "_waiter")

    def __init__(self) -> None:
        super().__init__()
        self._events: collections.deque[StreamEvent] = collections.deque()
        self._finished = False  # the final event is in _events (or was read)
        self._waiter: asyncio.Future[None] | None = None
        self._loop = asyncio.get_running_loop()

    def _emit(self, event: StreamEvent) -> None:
        self._events.append(event)
        if event.final:
            self._finished = True
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            try:
                self._loop.call_soon_threadsafe(_wake, waiter)
            except RuntimeError:  # the consumer's loop is closed: nobody reads any more
                pass

    def cancel(self) -> None:
        """The consumer is gone: as ResponseSink.cancel, and the iteration ends at once."""
        super().cancel()
        with self._lock:
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            try:
                self._loop.call_soon_threadsafe(_wake, waiter)
            except RuntimeError:  # the consumer's loop is closed
                pass

    def __aiter__(self) -> ResponseStream:
        return self

    async def __anext__(self) -> StreamEvent:
        while True:
            with self._lock:
                if self._cancelled:
                    raise StopAsyncIteration
                if self._events:
                    return self._events.popleft()
                if self._finished:
                    raise StopAsyncIteration
                waiter = self._loop.create_future()
                self._waiter = waiter
            await waiter

    async def collect(self) -> list[StreamEvent]:
        """Every event up to and including the final one."""
        return [event async for event in self]


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
