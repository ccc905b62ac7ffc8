"""The native HTTP front end's server (handlers/protocol/httpnative/server.py, NativeHttpServer)
in this process, with small ASGI apps, under raw sockets: what the drain does with connections
kept lingering after an error answer, and a streamed answer's back-pressure (a client that stops
reading holds the producer back; one that leaves ends it). `toolkit serve` on it:
tests/test_http_native.py."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from serving import read_response


def _built() -> bool:
    try:
        from handlers.protocol.httpnative import server  # noqa: F401
    except ImportError:
        return False
    return True


pytestmark = pytest.mark.skipif(
    not _built() and os.environ.get("TOOLKIT_REQUIRE_TOOLS") != "1",
    reason="the native HTTP front end is not built (scripts/http-native.sh)",
)


class Running:
    """A NativeHttpServer serving `app` on its own event loop thread."""

    def __init__(self, app: Any, graceful_seconds: float) -> None:
        from handlers.protocol.httpnative.server import NativeHttpServer

        self.server = NativeHttpServer(app, graceful_seconds=graceful_seconds)
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(128)
        self.port = self.listener.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        self.served = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.loop.run_until_complete(self.server.serve([self.listener]))
        finally:
            self.served.set()

    def call(self, function: Any) -> None:
        self.loop.call_soon_threadsafe(function)

    def stop(self, timeout: float = 30.0) -> None:
        """should_exit, as the runner sets it on SIGTERM; returns once serve() has drained."""
        def exit_() -> None:
            self.server.should_exit = True

        self.call(exit_)
        assert self.served.wait(timeout), "the drain did not finish"
        self.thread.join(timeout)

    def connect(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


@contextlib.contextmanager
def running(app: Any, graceful_seconds: float = 5.0) -> Iterator[Running]:
    server = Running(app, graceful_seconds)
    try:
        yield server
    finally:
        if not server.served.is_set():
            server.stop()
        server.loop.close()


async def hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"hello"})


def _server_end(client: socket.socket) -> str | None:
    """`socket:[inode]` of the server's end of `client`'s connection while this process holds it
    open (the server runs in this process), else None."""
    local, peer = client.getsockname()[1], client.getpeername()[1]
    inodes = set()
    for line in open("/proc/net/tcp").read().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == peer and int(fields[2].split(":")[1], 16) == local:
            inodes.add(f"socket:[{fields[9]}]")
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if (target := os.readlink(f"/proc/self/fd/{fd}")) in inodes:
                return target
    return None


def test_a_drain_closes_the_connections_kept_lingering_after_an_error_answer():
    """After evhttp's own answer (here 400 for a malformed request) the connection lingers: the
    server keeps its end open, reading and dropping what the client still sends, for up to 10 s.
    The drain closes it with the rest, and the server's threads finish."""
    with running(hello) as server:
        with server.connect() as sock:
            buffer = bytearray()
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(sock, buffer)[2] == b"hello"
            sock.sendall(b"THIS IS NOT HTTP\r\n\r\n")
            assert read_response(sock, buffer)[0] == 400
            assert sock.recv(1) == b""  # the answer is complete (the server shut its side for writing)
            sock.sendall(b"still sending")  # read and dropped: the connection lingers
            with server.connect() as other:  # the server goes on meanwhile
                other.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                assert read_response(other, bytearray())[2] == b"hello"
            assert _server_end(sock) is not None
            server.stop()
            assert _server_end(sock) is None  # closed by the drain, not left open after the worker ended
