"""The native HTTP front end's server (handlers/protocol/httpnative/server.py, NativeHttpServer)
in this process, with small ASGI apps, under raw sockets: what the drain does with connections
kept lingering after an error answer, and a streamed answer's back-pressure (a client that stops
reading holds the producer back; one that leaves ends it). `toolkit serve` on it:
tests/test_http_native.py."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from serving import NEEDS_NATIVE_HTTP, read_continue, read_response

pytestmark = NEEDS_NATIVE_HTTP


class Running:
    """A NativeHttpServer serving `app` on its own event loop thread."""

    def __init__(self, app: Any, graceful_seconds: float, keep_alive_seconds: float) -> None:
        from handlers.protocol.httpnative.server import NativeHttpServer

        self.server = NativeHttpServer(app, graceful_seconds=graceful_seconds, keep_alive_seconds=keep_alive_seconds)
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
def running(app: Any, graceful_seconds: float = 5.0, keep_alive_seconds: float = 75.0) -> Iterator[Running]:
    server = Running(app, graceful_seconds, keep_alive_seconds)
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
    return _server_end_of(client.getsockname()[1], client.getpeername()[1])


def _server_end_of(local: int, peer: int) -> str | None:
    """_server_end of the connection from port `local` to the server's port `peer`."""
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


def test_a_lingering_connection_takes_no_cpu_and_ends_when_its_client_closes():
    """The loop's epoll changes are batched per turn (libevent's changelist), so a socket must
    never be left in epoll under a descriptor closed while a copy holds it open: the loop would be
    woken for it on every turn. A lingering connection keeps evhttp's own descriptor, so its
    worker sleeps while it lingers (this took a whole core with a copy), and closes the server's
    end once the client closes its own."""
    with running(hello) as server:
        with server.connect() as sock:
            sock.sendall(b"THIS IS NOT HTTP\r\n\r\n")
            assert read_response(sock, bytearray())[0] == 400
            assert sock.recv(1) == b""
            sock.sendall(b"still sending")
            ports = sock.getsockname()[1], sock.getpeername()[1]
            assert _server_end_of(*ports) is not None
            before = time.process_time()
            time.sleep(1.0)
            assert time.process_time() - before < 0.25  # this process's CPU, every thread's
            with server.connect() as other:  # the worker still serves
                other.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                assert read_response(other, bytearray())[2] == b"hello"
        deadline = time.monotonic() + 10
        while _server_end_of(*ports) is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _server_end_of(*ports) is None


class Producer:
    """An app streaming `count` server-sent events of `size` bytes as fast as `send` lets it (as
    generate_stream's EventStreamResponse does), counting what it produced, and stopping when its
    client leaves (the next message of `receive` is http.disconnect)."""

    def __init__(self, count: int, size: int) -> None:
        self.count, self.size = count, size
        self.produced = 0
        self.disconnected = False
        self.finished = threading.Event()

    def event(self, index: int) -> bytes:
        return b"data: %08d " % index + b"x" * (self.size - 17) + b"\n\n"

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/events":
            await hello(scope, receive, send)
            return

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            self.disconnected = True

        watcher = asyncio.ensure_future(watch())
        try:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
            for index in range(self.count):
                if self.disconnected:
                    return
                await send({"type": "http.response.body", "body": self.event(index), "more_body": True})
                self.produced += 1
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watcher.cancel()
            self.finished.set()


def _stream_client(server: Running) -> tuple[socket.socket, bytearray]:
    """A client with a small receive buffer that asks for the stream and reads its head only."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.settimeout(30)
    sock.connect(("127.0.0.1", server.port))
    sock.sendall(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
    buffer = bytearray()
    while b"\r\n\r\n" not in buffer:
        buffer += sock.recv(4096)
    assert bytes(buffer).startswith(b"HTTP/1.1 200"), buffer
    return sock, buffer


def _stalled(producer: Producer) -> int:
    """What the producer has produced once it stopped (it waits for the client)."""
    deadline = time.monotonic() + 20
    last = -1
    while producer.produced != last and time.monotonic() < deadline:
        last = producer.produced
        time.sleep(0.5)
    return producer.produced


def _events(stream: bytes) -> list[bytes]:
    """The chunked body's pieces, in order (up to the last, empty chunk)."""
    pieces, at = [], 0
    while True:
        end = stream.index(b"\r\n", at)
        size = int(stream[at:end], 16)
        if size == 0:
            return pieces
        pieces.append(stream[end + 2 : end + 2 + size])
        at = end + 2 + size + 2


def _socket_bound() -> int:
    """What the sockets may hold between the server and a client that stopped reading: the
    kernel's largest send buffer (tcp_wmem's maximum, autotuned), the client's small receive
    buffer, and 1 MiB to spare."""
    try:
        wmem = int(open("/proc/sys/net/ipv4/tcp_wmem").read().split()[2])
    except (OSError, IndexError, ValueError):
        wmem = 4 << 20
    return wmem + (1 << 20)


SIZE = 16 * 1024
BOUND = _socket_bound() + 64 * 1024  # + the flow's high mark in the server
COUNT = max(32 << 20, 4 * BOUND) // SIZE  # what the producer would queue at once without the flow


def test_a_client_that_stops_reading_holds_the_producer_back_and_the_stream_resumes():
    """The producer stops where the flow's high mark and the sockets' buffers end (BOUND: some 5 MB
    here, a quarter of what it would otherwise queue in the server at once); reading again lets the
    stream go on to its end, every event in order."""
    producer = Producer(COUNT, SIZE)
    with running(producer) as server:
        sock, buffer = _stream_client(server)
        with sock:
            stalled = _stalled(producer)
            assert stalled * SIZE < BOUND, (stalled, BOUND)
            assert not producer.finished.is_set()
            head, _, body = bytes(buffer).partition(b"\r\n\r\n")
            assert b"transfer-encoding: chunked" in head.lower()
            stream = bytearray(body)
            while not stream.endswith(b"\r\n0\r\n\r\n"):
                data = sock.recv(1 << 20)
                assert data, "the stream ended early"
                stream += data
        assert producer.finished.wait(10) and producer.produced == COUNT and not producer.disconnected
        events = _events(bytes(stream))
        assert events == [producer.event(i) for i in range(COUNT)]


def test_a_client_that_leaves_while_the_producer_waits_ends_the_producer():
    producer = Producer(COUNT, SIZE)
    with running(producer) as server:
        sock, _ = _stream_client(server)
        stalled = _stalled(producer)
        assert stalled < COUNT and not producer.finished.is_set()
        sock.close()
        assert producer.finished.wait(10), "the producer still waits for a client that left"
        assert producer.disconnected and producer.produced < COUNT
        with server.connect() as other:  # the server goes on
            other.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(other, bytearray())[0] == 200


def test_a_reader_stalled_past_the_timeout_is_dropped_and_ends_the_producer():
    """evhttp's timeout (the keep-alive one, here 1 s) also bounds a write that makes no progress:
    it closes the connection, and the producer hears of it as of a client that left."""
    producer = Producer(COUNT, SIZE)
    with running(producer, keep_alive_seconds=1.0) as server:
        sock, _ = _stream_client(server)
        with sock:
            assert producer.finished.wait(20), "the producer still waits for a connection that is gone"
            assert producer.disconnected and producer.produced < COUNT
        with server.connect() as other:
            other.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(other, bytearray())[0] == 200


class Slow:
    """An app whose /slow answer waits for `release` (set from the test's thread)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.started = threading.Event()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope.get("path") == "/slow":
            self.started.set()
            while not self.release.is_set():
                await asyncio.sleep(0.01)
        await hello(scope, receive, send)


def test_a_drain_closes_idle_connections_at_once_and_lets_a_request_in_flight_finish():
    app = Slow()
    with running(app, graceful_seconds=30) as server:
        idle, partial, busy = server.connect(), server.connect(), server.connect()
        with idle, partial, busy:
            idle.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(idle, bytearray())[2] == b"hello"  # kept alive, then idle
            partial.sendall(b"GET / HTTP/1.1\r\nHost:")  # a head not finished
            busy.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
            assert app.started.wait(10)
            stopping = threading.Thread(target=server.stop)
            stopping.start()
            idle.settimeout(10)
            partial.settimeout(10)
            assert idle.recv(1) == b"" and partial.recv(1) == b""  # closed while the request runs
            assert not server.served.is_set()
            app.release.set()
            status, headers, body = read_response(busy, bytearray())
            assert (status, body, headers["connection"]) == (200, b"hello", "close")
            stopping.join(30)
            assert server.served.is_set()


@pytest.fixture
def quickstart_app(tmp_path):
    """The runtime's app over samples/quickstart (add_sub: dynamic batching, 2 instances), loaded
    in this process."""
    from handlers.app import create_app
    from handlers.manifest import Manifest
    from handlers.model_repository import ModelRepository
    from serving import ROOT
    from toolkit.repository.compile import compile_repository

    compiled = compile_repository(ROOT / "samples" / "quickstart")
    assert compiled.ok, compiled.failures
    manifest = Manifest.load(compiled.write_manifest(tmp_path / "models.json"), ROOT / "samples" / "quickstart")
    repository = ModelRepository(manifest)
    repository.load()
    try:
        yield create_app(repository)
    finally:
        repository.stop(drain=False, timeout=10)


def _infer(sock: socket.socket, buffer: bytearray, path: str = "/v2/models/add_sub/infer") -> tuple[int, Any]:
    body = json.dumps({"inputs": [{"name": name, "shape": [1, 16], "datatype": "FP32", "data": list(range(16))}
                                  for name in ("INPUT0", "INPUT1")]}).encode()
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    status, _, payload = read_response(sock, buffer)
    return status, json.loads(payload)


def test_inference_requests_are_queued_without_a_task_and_answered(quickstart_app, monkeypatch, caplog):
    """Inference requests to a batched model take the queued path (infer.submit_infer: decoded
    and queued as they arrive, answered from the loop when the batch is done), not a task each.
    A failure after the batch (here the reply's encoding raising) is answered as the app's
    exception handler answers it, 500 naming the exception's type only, logged, and the server
    goes on."""
    from handlers.protocol import infer
    from handlers.protocol.httpnative.server import NativeHttpServer

    tasks = []
    real_handle = NativeHttpServer._handle

    async def handle(self, request):  # every request that does not take the queued path
        tasks.append(request.uri)
        await real_handle(self, request)

    monkeypatch.setattr(NativeHttpServer, "_handle", handle)
    real_encode = infer.encode_response
    failures = [RuntimeError("the reply's encoding failed")]

    def encode(*args, **kwargs):
        if failures:
            raise failures.pop()
        return real_encode(*args, **kwargs)

    monkeypatch.setattr(infer, "encode_response", encode)
    with running(quickstart_app) as server, server.connect() as sock:
        buffer = bytearray()
        status, body = _infer(sock, buffer)
        assert (status, body) == (500, {"error": "internal error: RuntimeError"})
        assert "internal error serving POST /v2/models/add_sub/infer" in caplog.text
        status, body = _infer(sock, buffer)
        assert status == 200
        assert body["outputs"][0]["data"] == [2.0 * i for i in range(16)]
        status, body = _infer(sock, buffer, "/v2/models/nothing/infer")  # refused before queueing
        assert (status, body) == (404, {"error": "Request for unknown model: 'nothing' is not found"})
        assert tasks == []
        status, _ = _infer(sock, buffer, "/v2/models/add_sub/infer?x=1")  # not the fast path: a task
        assert status == 200 and tasks == [b"/v2/models/add_sub/infer?x=1"]


async def digest(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers `<length>:<sha256>` of the request body it received (`_expected`)."""
    if scope["type"] != "http":
        return
    body = bytearray()
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": _expected(bytes(body))})


def _post(body: bytes, path: str = "/echo") -> bytes:
    return f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


def _expected(body: bytes) -> bytes:
    return f"{len(body)}:{hashlib.sha256(body).hexdigest()}".encode()


def _read_syscalls() -> int:
    """read/readv calls this process has made (/proc/self/io `syscr`: the server runs in it)."""
    for line in open("/proc/self/io").read().splitlines():
        if line.startswith("syscr:"):
            return int(line.split()[1])
    raise AssertionError("no syscr in /proc/self/io")


def test_a_declared_body_is_read_in_large_reads_not_libevents_4_kb_ones():
    """libevent 2.1 reads 4 KB per read event; once a head declares its body, the front end reads
    the rest of it in reads as large as the socket holds (httpnative.cpp PullBody). A 4 MiB body
    arrives whole and exact, in far fewer than the 1,024 reads of 4 KB it took before."""
    body = os.urandom(4 * 1024 * 1024)
    with running(digest) as server, server.connect() as sock:
        buffer = bytearray()
        sock.sendall(_post(b"warm"))  # the connection's first request, outside the count
        assert read_response(sock, buffer)[2] == _expected(b"warm")
        before = _read_syscalls()
        sock.sendall(_post(body))
        status, _, answer = read_response(sock, buffer)
        reads = _read_syscalls() - before
        assert (status, answer) == (200, _expected(body))
        assert reads < 300, f"{reads} reads for a 4 MiB body"


def test_a_body_arriving_in_pieces_and_pipelined_requests_are_read_exactly():
    """The large reads ask for no more than the declared body: a body sent in pieces with pauses
    (the head with the start of it, the rest over several reads), and requests pipelined in one
    write (bodies of several sizes, then a GET), are each answered whole and in order."""
    pieces = os.urandom(600_000)
    first, second, third = os.urandom(200_000), b"", os.urandom(70_001)
    with running(digest) as server, server.connect() as sock:
        buffer = bytearray()
        message = _post(pieces)
        cut = len(message) - len(pieces) + 1000
        sock.sendall(message[:cut])
        for start in range(cut, len(message), 150_000):
            time.sleep(0.05)
            sock.sendall(message[start:start + 150_000])
        status, _, answer = read_response(sock, buffer)
        assert (status, answer) == (200, _expected(pieces))
        sock.sendall(_post(first) + _post(second) + _post(third) + b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        answers = [read_response(sock, buffer) for _ in range(4)]
        assert [status for status, _, _ in answers] == [200] * 4
        assert [answer for _, _, answer in answers] == [_expected(first), _expected(second), _expected(third),
                                                     _expected(b"")]


def test_a_client_leaving_in_the_middle_of_a_declared_body_leaves_the_server_serving():
    """A client that declares 1 MB, sends part of it and closes: nothing is answered on that
    connection, and the next connection is served."""
    with running(digest) as server:
        with server.connect() as sock:
            sock.sendall(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n" + os.urandom(300_000))
            time.sleep(0.1)
        with server.connect() as sock:
            buffer = bytearray()
            sock.sendall(_post(b"after"))
            status, _, answer = read_response(sock, buffer)
            assert (status, answer) == (200, _expected(b"after"))


def test_a_declared_body_after_100_continue_is_read_whole():
    """`Expect: 100-continue` with a declared body: the client sends the body only after evhttp's
    100 Continue, so the front end's large read after the head must not wait for it (it asks the
    socket without blocking)."""
    body = os.urandom(300_000)
    with running(digest) as server, server.connect() as sock:
        sock.sendall(f"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                     "Expect: 100-continue\r\n\r\n".encode())
        buffer = read_continue(sock)
        sock.sendall(body)
        status, _, answer = read_response(sock, buffer)
        assert (status, answer) == (200, _expected(body))
