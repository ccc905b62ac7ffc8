"""The native gRPC front end: grpc++ (handlers/protocol/grpc/native, the `_grpcnative` module)
speaks HTTP/2 and gRPC on its own threads; this module runs grpcio's method handlers on the
asyncio loop, so the services (InferenceService, grpc_health's HealthServicer) are the same
objects whichever front end serves them.

Why: grpcio's asyncio server spends ~130-200 us of CPU per unary RPC on the thread that holds
the GIL; with grpc++ doing the transport off that thread, a ModelInfer costs the loop only what
the service itself does (bench/grpc_floor.py, docs/performance.md).

`NativeServer` has the part of `grpc.aio.Server`'s API that GrpcServer uses
(`add_generic_rpc_handlers`, `add_registered_method_handlers`, `add_insecure_port`, `start`,
`stop`), and the handlers get a context with the part of `grpc.aio.ServicerContext` that services
use (`abort`, `set_code`, `set_details`, `write`, `invocation_metadata`, `peer`,
`time_remaining`, `cancelled`, `done`). Semantics follow grpcio's: an unknown method is
UNIMPLEMENTED "Method not found!", an exception escaping a handler is UNKNOWN "Unexpected <class>:
text", a client's cancellation cancels the handler's task, `stop(grace)` refuses new RPCs and
cancels those still running after `grace` seconds. A method given `add_queued_method` (ModelInfer)
is answered by the service itself when its batch is done, with no task per call; a cancelled call
takes its request out of the batcher's queue.

Streaming requests are read one message ahead (the next is asked for when the handler takes
one), so a slow handler holds back a fast client as grpcio's does; a response stream's writer
waits while more than `WRITE_HIGH` of its messages are not sent yet (until `WRITE_LOW` are), so a
slow client holds back the handler instead of filling the server's memory.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import grpc

try:  # built in the tree (handlers/protocol/native/build.py grpc) ...
    from . import _grpcnative
except ImportError:  # ... or installed as a wheel (build.py --wheel); neither: the caller falls back
    from toolkit_grpcnative import _grpcnative

log = logging.getLogger("handlers.protocol.grpc")

MESSAGE, HALF_CLOSE, CANCELLED = _grpcnative.MESSAGE, _grpcnative.HALF_CLOSE, _grpcnative.CANCELLED
WRITABLE = _grpcnative.WRITABLE
WRITE_HIGH = 8  # response messages queued to grpc++ before a writer waits ...
WRITE_LOW = 2  # ... until no more than this many are left
_CODE = {code: code.value[0] for code in grpc.StatusCode}
_NOT_FOUND = object()


class _Abort(Exception):
    """Raised by `context.abort` (grpcio raises its own AbortError there)."""


class _Context:
    """What a handler sees of its call: the part of grpc.aio.ServicerContext that the services
    served here use (no `read()`: streaming handlers iterate their requests; no metadata of the
    handler's own: none of the services sets any)."""

    __slots__ = ("_call", "_serialize", "code", "details")

    def __init__(self, call: Any, serialize: Any) -> None:
        self._call = call
        self._serialize = serialize
        self.code: grpc.StatusCode | None = None
        self.details = ""

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Sequence[Any] = ()) -> None:
        if code == grpc.StatusCode.OK:
            raise ValueError("abort() needs a non-OK status code")
        self.code, self.details = code, details or ""
        raise _Abort()

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    def code_value(self) -> grpc.StatusCode | None:
        return self.code

    async def write(self, message: Any) -> None:
        await _write(self._call, self._serialize(message) if self._serialize else message)

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self._call.metadata()

    def peer(self) -> str:
        return self._call.peer()

    def time_remaining(self) -> float | None:
        return self._call.time_remaining()

    def cancelled(self) -> bool:
        return self._call.cancelled()

    def done(self) -> bool:
        return self._call.cancelled()


def _answer(call: Any, context: _Context, serialize: Any, response: Any) -> None:
    """A unary answer: the status the handler set on its context, else its response."""
    if context.code is not None and context.code != grpc.StatusCode.OK:
        call.finish(_CODE[context.code], context.details)
    else:
        call.reply(serialize(response) if serialize else response)


class _Requests:
    """A streaming call's request messages as an async iterator (one read ahead)."""

    __slots__ = ("_call", "_closed", "_deserialize", "_items", "_waiter")

    def __init__(self, call: Any, deserialize: Any) -> None:
        self._call = call
        self._deserialize = deserialize
        self._items: collections.deque[bytes] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False

    def push(self, payload: bytes) -> None:
        self._items.append(payload)
        self._wake()

    def close(self) -> None:
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> _Requests:
        return self

    async def __anext__(self) -> Any:
        while not self._items:
            if self._closed:
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        payload = self._items.popleft()
        self._call.read()
        return self._deserialize(payload) if self._deserialize else payload


class _State:
    """A call's Python side (in `call.tag`)."""

    __slots__ = ("cancel", "requests", "task", "writable")

    def __init__(self, requests: _Requests | None) -> None:
        self.task: asyncio.Task[None] | None = None
        self.cancel: Callable[[], object] | None = None  # a queued call's (add_queued_method)
        self.requests = requests
        self.writable: asyncio.Future[None] | None = None


async def _write(call: Any, data: bytes) -> None:
    """Queue one response message; wait while too many are not sent yet."""
    if call.write(data) > WRITE_HIGH and call.wait_writable(WRITE_LOW):
        state = call.tag
        waiter = state.writable = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            state.writable = None


class _Details:
    """grpc.HandlerCallDetails for a generic handler's `service()`."""

    __slots__ = ("invocation_metadata", "method")

    def __init__(self, method: str, metadata: tuple[tuple[str, Any], ...]) -> None:
        self.method = method
        self.invocation_metadata = metadata


class NativeServer:
    """A grpc++ server whose RPCs run grpcio method handlers on this asyncio loop."""

    def __init__(self, options: Iterable[tuple[str, Any]] = ()) -> None:
        settings = dict(options)
        self._max_receive = int(settings.get("grpc.max_receive_message_length", 4 * 1024 * 1024))
        self._max_send = int(settings.get("grpc.max_send_message_length", 2**31 - 1))
        self._reuse_port = bool(settings.get("grpc.so_reuseport", 1))
        self._generic: list[grpc.GenericRpcHandler] = []
        self._methods: dict[str, Any] = {}  # full method name -> RpcMethodHandler, for served methods
        self._queued: dict[str, Callable[..., Any]] = {}  # full method name -> add_queued_method's function
        self._native: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    # -- grpc.aio.Server's API ----------------------------------------------------------------

    def add_generic_rpc_handlers(self, handlers: Iterable[grpc.GenericRpcHandler]) -> None:
        self._generic.extend(handlers)
        self._methods = {}

    def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
        self.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))

    def add_queued_method(self, method: str, queue: Callable[..., Any]) -> None:
        """Serve the unary `method` (its full name) by `queue(payload, loop, reply, fail)` rather
        than its method handler: a function that answers the call itself, later, on this loop
        (`reply(bytes)` or `fail(status, details)`), with no task made for it. It returns the
        call's cancel function (or None when it answered already), or False to leave the call to
        the method handler (InferenceService.queue_model_infer)."""
        self._queued[method] = queue

    def add_insecure_port(self, address: str) -> int:
        """Bind and start accepting (the calls wait until `start`); the bound port, 0 when the
        address cannot be bound."""
        if self._native is not None:
            raise RuntimeError("the native gRPC front end listens on one address")
        try:
            self._native = _grpcnative.Server(
                address, self._max_receive, self._max_send, self._reuse_port
            )
        except OSError:
            return 0
        return self._native.port

    async def start(self) -> None:
        if self._native is None:
            raise RuntimeError("add_insecure_port first")
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._native.fileno(), self._drain)
        self._drain()

    async def stop(self, grace: float | None) -> None:
        """Refuse new RPCs; cancel those still running after `grace` seconds (at once: None)."""
        native = self._native
        if native is None or self._loop is None:
            return
        await self._loop.run_in_executor(None, native.shutdown, grace or 0.0)
        self._drain()
        self._loop.remove_reader(native.fileno())
        tasks = list(self._tasks)  # every call is finished; their handlers may still be unwinding
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- dispatch -------------------------------------------------------------------------------

    def _handler(self, method: str, metadata: tuple[tuple[str, Any], ...]) -> Any:
        handler = self._methods.get(method)
        if handler is None:
            details = _Details(method, metadata)
            for generic in self._generic:
                handler = generic.service(details)
                if handler is not None:
                    self._methods[method] = handler  # served methods only: clients choose the names
                    return handler
            return _NOT_FOUND
        return handler

    def _drain(self) -> None:
        loop = self._loop
        assert loop is not None
        for call, kind, payload in self._native.drain():
            try:
                self._event(loop, call, kind, payload)
            except Exception:  # our own fault: that call fails, the others go on
                log.exception("internal error dispatching a gRPC call (%s)", call.method)
                call.finish(_CODE[grpc.StatusCode.INTERNAL], "internal error")

    def _event(self, loop: asyncio.AbstractEventLoop, call: Any, kind: int, payload: bytes | None) -> None:
        """One event of a call (handlers/protocol/grpc/native: MESSAGE, HALF_CLOSE, CANCELLED, WRITABLE)."""
        state = call.tag
        if kind == MESSAGE:
            if state is None:
                self._begin(loop, call, payload)
            elif state.requests is not None:
                state.requests.push(payload)
        elif state is None:  # no message came before: an empty stream, or a cancelled call
            if kind == HALF_CLOSE and not call.cancelled():
                self._begin(loop, call, None)
            elif kind == CANCELLED:
                call.finish(_CODE[grpc.StatusCode.CANCELLED], "Cancelled")
        elif kind == WRITABLE:
            if state.writable is not None and not state.writable.done():
                state.writable.set_result(None)
        else:
            if kind == HALF_CLOSE:
                if state.requests is not None:
                    state.requests.close()
            else:  # CANCELLED
                if state.requests is not None:
                    state.requests.close()
                if state.task is not None:
                    state.task.cancel()
                if state.cancel is not None:
                    state.cancel()  # a queued request leaves the queue
                # finished here too: a task cancelled before its first step never runs its own
                # handler of the cancellation (a call finishes once; the task's later finish is a no-op)
                call.finish(_CODE[grpc.StatusCode.CANCELLED], "Cancelled")

    def _begin(self, loop: asyncio.AbstractEventLoop, call: Any, payload: bytes | None) -> None:
        """A call's first event: its first message (None: the client sent none)."""
        queue = self._queued.get(call.method)
        if queue is not None and payload is not None and self._queue(loop, call, queue, payload):
            return
        handler = self._handler(call.method, ())
        if handler is _NOT_FOUND:
            call.finish(_CODE[grpc.StatusCode.UNIMPLEMENTED], "Method not found!")
            return
        if handler.request_streaming:
            requests = _Requests(call, handler.request_deserializer)
            if payload is None:
                requests.close()
            else:
                requests.push(payload)
            state = _State(requests)
            coroutine = self._stream(call, handler, requests)
        elif payload is None:
            call.finish(_CODE[grpc.StatusCode.INTERNAL], "Missing request message")
            return
        else:
            state = _State(None)
            coroutine = self._unary(call, handler, payload)
        call.tag = state
        task = state.task = loop.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    def _queue(loop: asyncio.AbstractEventLoop, call: Any, queue: Callable[..., Any], payload: bytes) -> bool:
        """A call `add_queued_method`'s function takes; False when it leaves it to the handler."""
        state = call.tag = _State(None)
        cancel = queue(payload, loop, functools.partial(_queued_reply, call), functools.partial(_queued_fail, call))
        if cancel is False:
            call.tag = None
            return False
        state.cancel = cancel
        return True

    async def _unary(self, call: Any, handler: Any, payload: bytes) -> None:
        serialize = handler.response_serializer
        context = _Context(call, serialize)
        try:
            deserialize = handler.request_deserializer
            request = deserialize(payload) if deserialize else payload
            if handler.unary_unary is not None:
                _answer(call, context, serialize, await handler.unary_unary(request, context))
                return
            await self._responses(call, handler.unary_stream(request, context), context)
        except BaseException as exc:  # noqa: BLE001 (every ending answers the call)
            self._fail(call, context, exc)
        finally:
            call.tag = None

    async def _stream(self, call: Any, handler: Any, requests: _Requests) -> None:
        context = _Context(call, handler.response_serializer)
        try:
            if handler.stream_unary is not None:
                _answer(call, context, handler.response_serializer, await handler.stream_unary(requests, context))
                return
            await self._responses(call, handler.stream_stream(requests, context), context)
        except BaseException as exc:  # noqa: BLE001
            self._fail(call, context, exc)
        finally:
            call.tag = None

    async def _responses(self, call: Any, result: Any, context: _Context) -> None:
        """Write what a response-streaming handler yields (or writes), then the status."""
        serialize = context._serialize
        if hasattr(result, "__anext__"):
            async for response in result:
                await _write(call, serialize(response) if serialize else response)
        elif result is not None:
            await result  # a coroutine writing with context.write
        code = context.code if context.code is not None else grpc.StatusCode.OK
        call.finish(_CODE[code], context.details)

    @staticmethod
    def _fail(call: Any, context: _Context, exc: BaseException) -> None:
        if isinstance(exc, _Abort):
            assert context.code is not None
            call.finish(_CODE[context.code], context.details)
        elif isinstance(exc, asyncio.CancelledError):
            call.finish(_CODE[grpc.StatusCode.CANCELLED], "Cancelled")
            raise exc
        elif isinstance(exc, Exception):
            log.exception("unexpected exception in a gRPC handler (%s)", call.method)
            call.finish(_CODE[grpc.StatusCode.UNKNOWN], f"Unexpected {type(exc)}: {exc}")
        else:
            call.finish(_CODE[grpc.StatusCode.INTERNAL], "Server is exiting")
            raise exc


def _queued_reply(call: Any, data: bytes) -> None:
    call.tag = None
    call.reply(data)


def _queued_fail(call: Any, code: grpc.StatusCode, details: str) -> None:
    call.tag = None
    call.finish(_CODE[code], details)


def available() -> bool:
    """Whether this module imports (its extension is built); for callers that import lazily."""
    return True


__all__ = ["NativeServer", "available"]
