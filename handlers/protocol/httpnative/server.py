"""Serve the runtime's ASGI app behind the native HTTP/1.1 front end (libevent's evhttp).

evhttp's threads accept connections and parse whole requests off the GIL; the asyncio loop takes
every complete request in one call when an eventfd wakes it (as the native gRPC front end does,
handlers/protocol/grpc/nativeserver.py). Each request then runs:

- an inference request the ASGI fast path would take (`infer.infer_target`): straight to
  `infer.run_infer`, the same handler the FastAPI route and the fast path run;
- anything else: the same FastAPI app, through a small ASGI adapter (scope / receive / send), so
  routes, statuses, headers and messages are the app's own. A response whose body comes in
  several messages (`generate_stream`'s SSE) goes out chunk by chunk; its `send` waits while the
  client does not read (WRITE_HIGH / WRITE_LOW, as the native gRPC front end's stream does).

`NativeHttpServer` has the part of `uvicorn.Server`'s interface the runner uses: `serve(sockets)`
until `should_exit` is set, then drain: stop accepting (the listening socket is closed, so new
connections are refused), close idle keep-alive connections, let the requests in flight finish
(answered with `Connection: close`) for up to `graceful_seconds`, then cancel what is left.

Answers given without the app (native/httpnative.cpp reads each request head before evhttp
does): a declared body over TOOLKIT_MAX_REQUEST_BYTES gets the routes' JSON 413 at once, before
any of it is read (then the connection ends; evhttp reads and drops the body); a chunked body
passing the limit, a malformed request (400) and a failed `Expect` (417) get evhttp's answer with
a JSON `{"error": ...}` body instead of its HTML page, and the connection ends after the client
stops sending (at most 10 s later, or at the drain). Methods evhttp 2.1 does not know (QUERY, PROPFIND, ...) reach the app by name. A
client closing its connection while its request is in flight is seen at once (EPOLLRDHUP): the
app's `receive` answers `http.disconnect`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote

from ... import limits
from ..codec import encode_error
from ..infer import (
    InferHeaders, InferReply, infer_path, infer_target, internal_error_reply, reply_headers, run_infer, submit_infer,
)

try:  # built in the tree (handlers/protocol/native/build.py http) ...
    from . import _httpnative
except ImportError:  # ... or installed as a wheel (build.py http --wheel: images); neither: uvicorn serves
    from toolkit_httpnative import _httpnative

log = logging.getLogger("handlers.protocol.httpnative")

BAD_REQUEST = "Invalid HTTP request received."  # uvicorn's words for a request it cannot parse

_ASGI = {"version": "3.0", "spec_version": "2.3"}
# A streamed answer's flow (asyncio's transport marks, which uvicorn's writes follow): `send` of a
# body piece waits while more than WRITE_HIGH bytes are written and not taken by the kernel, until
# no more than WRITE_LOW are; a client that stops reading holds the app's producer back.
WRITE_HIGH = 64 * 1024
WRITE_LOW = 16 * 1024
_INTERNAL_ERROR = (500, [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"21")],
                   b"Internal Server Error")


async def _one(body: bytes) -> AsyncIterator[bytes]:
    yield body


def _split_target(uri: bytes) -> tuple[bytes, bytes]:
    """(raw path, query string) of a request target (origin form, or absolute form)."""
    if not uri.startswith(b"/"):
        scheme, sep, rest = uri.partition(b"://")
        if sep:
            slash = rest.find(b"/")
            uri = rest[slash:] if slash >= 0 else b"/"
    raw_path, _, query = uri.partition(b"?")
    return raw_path, query


def _decoded(raw_path: bytes) -> str:
    """The ASGI `path` of a raw request path (percent-decoded, as uvicorn gives it)."""
    path = raw_path.decode("latin-1")
    return unquote(path) if "%" in path else path


_SIZE_MARK = 987654321987654321


def refusals(limit: int) -> dict[str, bytes]:
    """The JSON bodies of the answers the front end gives without the app (the runtime's own
    messages, as the routes give them under uvicorn): 413 for a declared body over `limit`
    (prefix + size + suffix), 413 for a chunked one passing it, 400 for a malformed request."""
    declared = encode_error(str(limits.body_too_large(limit, _SIZE_MARK)))
    prefix, suffix = declared.split(str(_SIZE_MARK).encode())
    return {"declared_prefix": prefix, "declared_suffix": suffix,
            "too_large": encode_error(str(limits.body_too_large(limit))),
            "bad_request": encode_error(BAD_REQUEST)}


class NativeHttpServer:
    """Serve `app` (handlers/app.py's RuntimeApp) on a bound, listening socket."""

    def __init__(self, app: Any, *, graceful_seconds: float = 30.0, keep_alive_seconds: float = 75.0,
                 threads: int = 1) -> None:
        self.app = app
        self.graceful_seconds = graceful_seconds
        self.keep_alive_seconds = keep_alive_seconds
        self.threads = threads
        self.started = False
        self._exit: asyncio.Event | None = None
        self._should_exit = False
        self._native: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._exchanges: dict[int, _Exchange] = {}  # by request id: those the ASGI app serves
        self._server: tuple[str, int] | None = None
        self._draining = False
        self._finished = False

    # -- the part of uvicorn.Server the runner uses -------------------------------------------

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._should_exit = value
        if value and self._exit is not None:
            self._exit.set()

    async def serve(self, sockets: list[socket.socket]) -> None:
        (sock,) = sockets
        self._loop = asyncio.get_running_loop()
        self._exit = asyncio.Event()
        if self._should_exit:
            self._exit.set()
        host, port = sock.getsockname()[:2]
        self._server = (host, port)
        self._native = _httpnative.Server(sock.fileno(), limits.LIMITS.max_request_bytes, self.threads,
                                          self.keep_alive_seconds, **refusals(limits.LIMITS.max_request_bytes))
        self._loop.add_reader(self._native.fileno(), self._drain)
        self.started = True
        self._drain()
        try:
            await self._exit.wait()
        finally:
            await self._shutdown(sock)

    async def _shutdown(self, sock: socket.socket) -> None:
        loop = self._loop
        assert loop is not None
        self._draining = True
        self._native.stop_accepting()
        sock.close()  # with the workers' copies gone too, the kernel refuses new connections
        await loop.run_in_executor(None, self._native.shutdown, self.graceful_seconds)
        self._finished = True
        self._drain()
        loop.remove_reader(self._native.fileno())
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- dispatch -------------------------------------------------------------------------------

    def _drain(self) -> None:
        loop = self._loop
        assert loop is not None
        for event in self._native.drain():
            if type(event) is int:  # the client of that request closed its connection
                exchange = self._exchanges.pop(event, None)
                if exchange is not None:
                    exchange.disconnect()
                continue
            if type(event) is tuple:  # ("writable", id): a streamed answer may go on
                exchange = self._exchanges.get(event[1])
                if exchange is not None:
                    exchange.writable()
                continue
            if self._infer(event):
                continue
            task = loop.create_task(self._handle(event))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _infer(self, request: Any) -> bool:
        """An inference request the fast path takes, to a model with a batcher: decoded, checked
        and queued now, answered on the loop when its batch is done (infer.submit_infer), with
        no task, scope or coroutine made for it. False for any other request (`_handle` serves
        it in a task)."""
        if request.method != "POST":
            return False
        raw_path, query = _split_target(request.uri)
        if query:
            return False
        path = _decoded(raw_path)
        target = infer_path(path)
        if target is None:
            return False
        return submit_infer(self.app.state.repository, *target, InferHeaders.from_raw(request.headers()),
                            request.body, self._loop, functools.partial(self._answer, request, path))

    def _answer(self, request: Any, path: str, reply: InferReply | Exception) -> None:
        if isinstance(reply, Exception):
            reply = internal_error_reply({"method": "POST", "path": path}, reply)
        if self._finished:  # the front end stopped: the connection is gone
            return
        request.reply(reply.status, reply_headers(reply), reply.body, self._draining)

    def _scope(self, request: Any) -> dict[str, Any]:
        raw_path, query = _split_target(request.uri)
        path = _decoded(raw_path)
        return {
            "type": "http",
            "asgi": _ASGI,
            "http_version": request.http_version,
            "server": self._server,
            "client": request.client,
            "scheme": "http",
            "method": request.method,
            "root_path": "",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "headers": request.headers(),
        }

    async def _handle(self, request: Any) -> None:
        scope = self._scope(request)
        target = infer_target(scope)
        if target is not None:
            try:
                reply = await run_infer(self.app.state.repository, *target, InferHeaders.from_raw(scope["headers"]),
                                        _one(request.body()))
            except Exception as exc:
                reply = internal_error_reply(scope, exc)
            request.reply(reply.status, reply_headers(reply), reply.body, self._draining)
            return
        exchange = _Exchange(request, self)
        self._exchanges[request.id] = exchange
        try:
            await exchange.run(self.app, scope)
        finally:
            self._exchanges.pop(request.id, None)


class _Exchange:
    """One request through the ASGI app (receive / send) onto the native request."""

    __slots__ = ("_body", "_disconnected", "_done", "_finished", "_headers", "_request", "_server", "_status",
                 "_streaming", "_writable")

    def __init__(self, request: Any, server: NativeHttpServer) -> None:
        self._request = request
        self._server = server  # draining by the time the answer starts: it closes the connection
        self._body: bytes | None = request.body()
        self._status: int | None = None
        self._headers: list[tuple[bytes, bytes]] = []
        self._streaming = False
        self._done = False
        self._disconnected = False
        self._finished: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None

    def disconnect(self) -> None:
        """The client left: `receive` answers http.disconnect, what is sent goes nowhere."""
        self._disconnected = True
        self._wake()
        self.writable()

    def writable(self) -> None:
        """A `send` waiting for the client to read may go on."""
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    async def run(self, app: Any, scope: dict[str, Any]) -> None:
        try:
            await app(scope, self.receive, self.send)
        except Exception:
            log.exception("exception in the ASGI application serving %s %s", scope["method"], scope["path"])
            self._abandon()
            return
        except asyncio.CancelledError:
            self._abandon()
            raise
        if not self._done:
            if self._status is None:
                log.error("the ASGI application returned without a response (%s %s)", scope["method"], scope["path"])
            self._abandon()

    def _abandon(self) -> None:
        """uvicorn's answer to an app that failed: 500 when nothing was sent, else end the body."""
        if self._done:
            return
        self._done = True
        if self._streaming:
            self._request.end()
        else:
            status, headers, body = _INTERNAL_ERROR
            self._request.reply(status, headers, body, True)
        self._wake()

    def _wake(self) -> None:
        if self._finished is not None and not self._finished.done():
            self._finished.set_result(None)

    async def receive(self) -> dict[str, Any]:
        body = self._body
        if body is not None:
            self._body = None
            return {"type": "http.request", "body": body, "more_body": False}
        if not self._done and not self._disconnected:  # wait for the response to end or the client to leave
            self._finished = asyncio.get_running_loop().create_future()
            await self._finished
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            if self._status is not None:
                raise RuntimeError("http.response.start sent twice")
            self._status = message["status"]
            self._headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", ())]
            return
        if kind != "http.response.body":
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        if self._status is None:
            raise RuntimeError("http.response.body before http.response.start")
        if self._done or self._disconnected:
            return  # as uvicorn: a body after the end, or after the client left, is dropped
        body = message.get("body", b"")
        more = message.get("more_body", False)
        if not self._streaming and not more:
            self._done = True
            self._request.reply(self._status, self._headers, body, self._server._draining)
            self._wake()
            return
        if not self._streaming:
            self._streaming = True
            self._request.start(self._status, self._headers, self._server._draining)
        if body and self._request.write(body) > WRITE_HIGH and self._request.wait_writable(WRITE_LOW):
            waiter = self._writable = asyncio.get_running_loop().create_future()
            try:
                await waiter  # ... until the client took enough of it (or left)
            finally:
                self._writable = None
            if self._disconnected:
                return
        if not more:
            self._done = True
            self._request.end()
            self._wake()
