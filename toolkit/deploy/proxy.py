"""`toolkit proxy URL`: a local plain-HTTP endpoint that signs each request and forwards it.

Unmodified clients (`tritonclient.http`, `perf_analyzer -u 127.0.0.1:8000`, curl) talk to the
proxy as they would to tritonserver; the proxy adds SigV4 or a Google ID token (signing.py) and
forwards to the private deployment over HTTPS, then relays the answer unchanged: status, body
(compressed bodies stay compressed) and headers such as `Inference-Header-Content-Length`;
server-sent events (generate_stream) are relayed as they arrive.

It listens on 127.0.0.1 by default: anyone who can reach it calls the deployment with your
credentials. HTTP/1.1 keep-alive on both sides; a thread per client connection; a pool of
upstream connections.

An upstream that is a Lambda Invoke API endpoint (`.../2015-03-31/functions/NAME/invocations`:
AWS's Runtime Interface Emulator, `sam local start-lambda`) is driven as a Function URL would
drive the function: each request becomes a Function URL event (payload format 2.0,
function_url.py), is POSTed to that endpoint, and the function's answer becomes the HTTP
response. A loopback one is one local execution environment: requests go one at a time.
"""

from __future__ import annotations

import contextlib
import json
import re
import select
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable
from urllib.parse import urlsplit

from .errors import DeployError
from .function_url import http_response, is_function_error, request_event
from .signing import Signer

HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
    "transfer-encoding", "upgrade", "host", "content-length", "expect",
})
# Client credentials are never forwarded: the proxy's signature replaces them.
CLIENT_AUTH = frozenset({"authorization", "x-amz-date", "x-amz-security-token", "x-amz-content-sha256"})
MAX_BODY_BYTES = 256 * 1024 * 1024
LAMBDA_INVOKE_PATH = re.compile(r"/2015-03-31/functions/[^/]+/invocations$")
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def _is_event_stream(headers) -> bool:  # noqa: ANN001 - urllib3's HTTPHeaderDict
    return headers.get("content-type", "").split(";")[0].strip().lower() == "text/event-stream"


def is_lambda_invoke_url(url: str) -> bool:
    """Whether `url` is a Lambda Invoke API endpoint (the proxy then sends Function URL events)."""
    return bool(LAMBDA_INVOKE_PATH.search(urlsplit(url).path))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_ProxyServer"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's signature)
        if self.server.log is not None:
            self.server.log(f"{self.address_string()} {format % args}")

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            total = 0
            while True:
                size_line = self.rfile.readline(65537).split(b";", 1)[0].strip()
                size = int(size_line or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                total += size
                if total > MAX_BODY_BYTES:
                    raise ValueError("request body too large for the proxy")
                chunks.append(self.rfile.read(size))
                self.rfile.readline(65537)
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        if length < 0 or length > MAX_BODY_BYTES:
            raise ValueError("invalid Content-Length")
        return self.rfile.read(length) if length else b""

    def _reply(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, message: str) -> None:
        self._reply(status, [("Content-Type", "application/json")], json.dumps({"error": f"toolkit proxy: {message}"}).encode())

    def _forward(self) -> None:
        import urllib3

        try:
            body = self._read_body()
        except ValueError as exc:
            self.close_connection = True
            self._error(400, str(exc))
            return
        headers = {
            k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP and k.lower() not in CLIENT_AUTH
        }
        if self.server.lambda_invoke:
            self._invoke(headers, body)
            return
        url = self.server.upstream + self.path
        try:
            signed = self.server.signer.sign(self.command, url, headers, body)
        except DeployError as exc:
            self._error(502, f"cannot sign the request: {exc.message}")
            return
        try:
            response = self.server.pool.request(
                self.command, url, body=body if body or self.command in ("POST", "PUT", "PATCH") else None,
                headers=signed, preload_content=False, decode_content=False, redirect=False, retries=False,
            )
            if _is_event_stream(response.headers):
                self._relay_events(response)
                return
            data = response.read(decode_content=False)
            response.release_conn()
        except urllib3.exceptions.HTTPError as exc:
            self._error(502, f"cannot reach {self.server.upstream}: {exc}")
            return
        with self.server.lock:
            self.server.forwarded += 1
        relayed = [(k, v) for k, v in response.headers.items() if k.lower() not in HOP_BY_HOP]
        self._reply(response.status, relayed, data)

    def _relay_events(self, response) -> None:  # noqa: ANN001 - urllib3's HTTPResponse
        """Server-sent events (generate_stream) go on to the client chunk by chunk as they arrive,
        never collected: a streaming client sees each event when the deployment sends it."""
        import urllib3

        with self.server.lock:
            self.server.forwarded += 1
        self.send_response(response.status)
        for key, value in response.headers.items():
            if key.lower() not in HOP_BY_HOP:
                self.send_header(key, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunks = response.read_chunked(decode_content=False) if response.chunked else response.stream(
            64 * 1024, decode_content=False
        )
        finished = threading.Event()
        watcher = threading.Thread(target=self._watch_client, args=(response, finished), daemon=True)
        watcher.start()
        complete = False
        try:
            for chunk in chunks:
                if chunk:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            complete = True
        except (OSError, urllib3.exceptions.HTTPError):  # the client or the upstream went away
            self.close_connection = True
        finally:
            finished.set()
            watcher.join()
            if complete:
                response.release_conn()
            else:
                response.close()  # the deployment sees the disconnect and cancels the request

    def _watch_client(self, response, finished: threading.Event) -> None:  # noqa: ANN001
        """While events are relayed, a client that closes its connection closes the upstream one,
        which ends the upstream read at once (the deployment then cancels the request)."""
        while not finished.is_set():
            readable, _, _ = select.select([self.connection], [], [], 0.2)
            if not readable:
                continue
            try:
                gone = self.connection.recv(1, socket.MSG_PEEK) == b""
            except OSError:
                gone = True
            if gone and not finished.is_set():
                sock = getattr(getattr(response, "connection", None), "sock", None)
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
            return  # gone, or the client sent more (its next request): stop watching

    def _invoke(self, headers: dict[str, str], body: bytes) -> None:
        """One request as a Function URL event through the Lambda Invoke API endpoint."""
        import urllib3

        host = self.headers.get("Host") or "localhost"
        event = request_event(self.command, self.path, headers, body, host=host, source_ip=self.client_address[0])
        payload = json.dumps(event).encode()
        url = self.server.upstream
        try:
            signed = self.server.signer.sign("POST", url, {"Content-Type": "application/json"}, payload)
        except DeployError as exc:
            self._error(502, f"cannot sign the request: {exc.message}")
            return
        try:
            with self.server.invoke_lock:
                response = self.server.pool.request(
                    "POST", url, body=payload, headers=signed, preload_content=False, redirect=False, retries=False,
                )
                data = response.read()
                response.release_conn()
        except urllib3.exceptions.HTTPError as exc:
            self._error(502, f"cannot reach the Lambda Invoke API at {url}: {exc}")
            return
        function_error = response.headers.get("X-Amz-Function-Error")
        if response.status != 200:
            if not is_function_error(data):  # the Invoke API refused: no answer of the function
                text = data.decode(errors="replace").strip()[:1000]
                self._error(502, f"the Lambda Invoke API answered {response.status}: {text or 'no body'}")
                return
            function_error = function_error or "Unhandled"  # the RIE's 502 for a failed init or runtime
        with self.server.lock:
            self.server.forwarded += 1
        answer = http_response(data, function_error)
        self._reply(answer.status, [(k, v) for k, v in answer.headers if k.lower() not in HOP_BY_HOP], answer.body)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = _forward  # noqa: N815


class _ProxyServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], upstream: str, signer: Signer, timeout_s: float,
                 log: Callable[[str], None] | None) -> None:
        import urllib3

        super().__init__(address, _Handler)
        self.upstream = upstream
        self.signer = signer
        self.log = log
        self.lock = threading.Lock()
        self.forwarded = 0
        self.lambda_invoke = is_lambda_invoke_url(upstream)
        # A local emulator is one execution environment: one invocation at a time (as Lambda).
        local = (urlsplit(upstream).hostname or "") in LOOPBACK_HOSTS
        self.invoke_lock: threading.Lock | contextlib.nullcontext = (
            threading.Lock() if self.lambda_invoke and local else contextlib.nullcontext()
        )
        self.pool = urllib3.PoolManager(maxsize=64, block=False, timeout=urllib3.Timeout(connect=30.0, read=timeout_s))


class SigningProxy:
    """Start with `start()` (background thread) or `serve_forever()`; stop with `shutdown()`."""

    def __init__(self, upstream: str, signer: Signer, host: str = "127.0.0.1", port: int = 8000,
                 timeout_s: float = 300.0, log: Callable[[str], None] | None = None) -> None:
        parts = urlsplit(upstream)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise DeployError(f"invalid upstream URL '{upstream}': expected https://HOST[/PATH]")
        self.upstream = upstream.rstrip("/")
        try:
            self._server = _ProxyServer((host, port), self.upstream, signer, timeout_s, log)
        except OSError as exc:
            raise DeployError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{host}:{port}"

    @property
    def forwarded(self) -> int:
        return self._server.forwarded

    def start(self) -> "SigningProxy":
        self._thread = threading.Thread(target=self._server.serve_forever, name="toolkit-proxy", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self._server.serve_forever()

    def close(self) -> None:
        """Release the socket (after `serve_forever` returned)."""
        self._server.server_close()

    def shutdown(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> "SigningProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
