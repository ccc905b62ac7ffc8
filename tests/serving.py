"""Start `toolkit serve` as a real process for tests, and wait for readiness."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from handlers.entrypoints.server import native_http_available

ROOT = Path(__file__).resolve().parents[1]
TOOLKIT = [sys.executable, "-m", "toolkit.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The native HTTP front end's tests skip where it is not built, except in CI (TOOLKIT_REQUIRE_TOOLS=1).
NEEDS_NATIVE_HTTP = pytest.mark.skipif(
    not native_http_available() and os.environ.get("TOOLKIT_REQUIRE_TOOLS") != "1",
    reason="the native HTTP front end is not built (scripts/http-native.sh)",
)


def read_response(sock: socket.socket, buffer: bytearray) -> tuple[int, dict[str, str], bytes]:
    """One response (Content-Length framed) from `sock`; `buffer` keeps what follows it."""
    while b"\r\n\r\n" not in buffer:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError(f"closed before a response: {bytes(buffer)!r}")
        buffer += data
    head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    body = bytearray(rest)
    while len(body) < length:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed inside a body")
        body += data
    buffer[:] = body[length:]
    return status, headers, bytes(body[:length])


def read_continue(sock: socket.socket) -> bytearray:
    """Reads the interim `100 Continue` an `Expect: 100-continue` head gets; returns what came
    after it."""
    buffer = bytearray()
    while b"\r\n\r\n" not in buffer:
        buffer += sock.recv(65536)
    assert bytes(buffer).startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), buffer
    del buffer[: len(b"HTTP/1.1 100 Continue\r\n\r\n")]
    return buffer


def _get(url: str, timeout: float = 2.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


class Server:
    def __init__(self, process: subprocess.Popen, port: int, log: Path, grpc_port: int = 0):
        self.process = process
        self.port = port
        self.grpc_port = grpc_port
        self.log = log

    @property
    def grpc(self) -> str:
        """host:port of the gRPC listener (tritonclient.grpc's `url`)."""
        assert self.grpc_port, "this server was started without gRPC"
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def metric(self, line_start: str) -> float:
        """The sum of the values of the /metrics lines that start with `line_start` (a metric's
        name and the start of its labels, e.g. 'nv_inference_pending_request_count{model="m"')."""
        with urllib.request.urlopen(f"{self.http}/metrics", timeout=30) as response:
            text = response.read().decode()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start))


@contextlib.contextmanager
def serve(repo: Path, *args: str, ready_timeout: float = 90.0, env: dict | None = None, wait_ready: bool = True) -> Iterator[Server]:
    port = free_port()
    # tritonserver's gRPC and metrics ports (8001, 8002) would collide between concurrent tests:
    # gRPC gets a free port, metrics is off, unless the caller says otherwise.
    grpc_port = 0
    if "--grpc-port" not in args:
        grpc_port = free_port()
        args = (*args, "--grpc-port", str(grpc_port))
    else:
        grpc_port = int(args[args.index("--grpc-port") + 1])
    if "--metrics-port" not in args:
        args = (*args, "--metrics-port", "0")
    log = Path(os.environ.get("PYTEST_TMPDIR", "/tmp")) / f"toolkit-serve-{port}.log"
    handle = open(log, "w")
    process = subprocess.Popen(
        [*TOOLKIT, "serve", str(repo), "--port", str(port), "--log-level", "warning", *args],
        cwd=ROOT,
        stdout=handle,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
    )
    server = Server(process, port, log, grpc_port)
    try:
        if wait_ready:
            deadline = time.monotonic() + ready_timeout
            while _get(f"{server.http}/v2/health/ready") != 200:
                if process.poll() is not None:
                    raise RuntimeError(f"toolkit serve exited with {process.returncode}:\n{server.output()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"toolkit serve not ready after {ready_timeout}s:\n{server.output()}")
                time.sleep(0.1)
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        handle.close()
