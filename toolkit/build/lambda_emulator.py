"""Run a Lambda image locally: a minimal AWS Lambda Runtime API and a Function URL front.

AWS's runtime interface client (awslambdaric, or the one in AWS base images) long-polls the
Runtime API (`AWS_LAMBDA_RUNTIME_API`) for events and posts each result back. `RuntimeAPI`
implements the four documented endpoints of version 2018-06-01 (invocation/next, .../response,
.../error, init/error) and nothing else. `FunctionURL` is an HTTP server that turns each request
into a Function URL event (payload format 2.0), invokes it through the Runtime API and writes the
function's response back, so unchanged HTTP clients (tritonclient, curl) can talk to the image as
they would to a Lambda Function URL.

Used by `toolkit build --measure-cold-start` for Lambda images and by the end-to-end tests. It is
an emulator of AWS's documented interface, not AWS: no concurrency (one invocation at a time,
like one execution environment), no timeouts enforced on the function, no IAM.
"""

from __future__ import annotations

import base64
import json
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import urlsplit

API_PREFIX = "/2018-06-01/runtime"
FUNCTION_ARN = "arn:aws:lambda:us-east-1:000000000000:function:{name}"
# Content types a Function URL passes as text; every other body travels base64-encoded.
TEXT_TYPES = ("text/", "application/json", "application/xml", "application/javascript", "application/x-www-form-urlencoded")


@dataclass
class Invocation:
    request_id: str
    event: dict[str, Any]
    deadline_ms: int
    done: threading.Event = field(default_factory=threading.Event)
    outcome: str = ""  # "response" or "error"
    payload: Any = None


class RuntimeAPI:
    """The Lambda Runtime API for one execution environment."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, function_name: str = "toolkit") -> None:
        self.function_name = function_name
        self._pending: queue.Queue[Invocation] = queue.Queue()
        self._active: dict[str, Invocation] = {}
        self.init_error: dict[str, Any] | None = None
        self.init_failed = threading.Event()
        self.first_poll = threading.Event()
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="lambda-runtime-api", daemon=True)

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def environment(self, memory_mb: int = 3008) -> dict[str, str]:
        """What Lambda sets for the function process (the subset runtime clients read)."""
        return {
            "AWS_LAMBDA_RUNTIME_API": self.address,
            "AWS_LAMBDA_FUNCTION_NAME": self.function_name,
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(memory_mb),
            "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{self.function_name}",
            "AWS_LAMBDA_LOG_STREAM_NAME": "local",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def invoke(
        self, event: dict[str, Any], timeout: float = 300.0, alive: Callable[[], bool] | None = None
    ) -> Invocation:
        """Queue one event and wait for the function's response or error. `alive` tells whether
        the function's process still runs (no point waiting for a dead one)."""
        invocation = Invocation(str(uuid.uuid4()), event, int((time.time() + timeout) * 1000))
        self._pending.put(invocation)
        deadline = time.monotonic() + timeout
        while not invocation.done.wait(0.2):
            if self.init_failed.is_set():
                raise RuntimeError(f"the function failed to initialise: {self.init_error}")
            if alive is not None and not alive():
                raise RuntimeError("the function's process exited before answering")
            if time.monotonic() > deadline:
                raise TimeoutError(f"no response from the function within {timeout:.0f} s")
        return invocation

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def _reply(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _body(self) -> bytes:
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def do_GET(self) -> None:
                if self.path != f"{API_PREFIX}/invocation/next":
                    self._reply(404, b'{"errorType":"NotFound"}')
                    return
                api.first_poll.set()
                invocation = api._pending.get()
                api._active[invocation.request_id] = invocation
                self._reply(
                    200,
                    json.dumps(invocation.event).encode(),
                    {
                        "Lambda-Runtime-Aws-Request-Id": invocation.request_id,
                        "Lambda-Runtime-Deadline-Ms": str(invocation.deadline_ms),
                        "Lambda-Runtime-Invoked-Function-Arn": FUNCTION_ARN.format(name=api.function_name),
                        "Lambda-Runtime-Trace-Id": f"Root=1-{int(time.time()):08x}-{uuid.uuid4().hex[:24]};Sampled=0",
                    },
                )

            def do_POST(self) -> None:
                body = self._body()
                if self.path == f"{API_PREFIX}/init/error":
                    api.init_error = _json_or_text(body)
                    api.init_failed.set()
                    self._reply(202, b'{"status":"OK"}')
                    return
                parts = self.path[len(API_PREFIX):].strip("/").split("/")
                if len(parts) == 3 and parts[0] == "invocation" and parts[2] in ("response", "error"):
                    invocation = api._active.pop(parts[1], None)
                    if invocation is None:
                        self._reply(400, b'{"errorType":"InvalidRequestID"}')
                        return
                    invocation.outcome = parts[2]
                    invocation.payload = _json_or_text(body)
                    self._reply(202, b'{"status":"OK"}')
                    invocation.done.set()
                    return
                self._reply(404, b'{"errorType":"NotFound"}')

        return Handler


def _json_or_text(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")


def function_url_event(method: str, target: str, headers: dict[str, str], body: bytes, host: str) -> dict[str, Any]:
    """A Lambda Function URL event (payload format version 2.0) for one HTTP request."""
    url = urlsplit(target)
    content_type = headers.get("content-type", "")
    is_text = not body or any(content_type.startswith(t) for t in TEXT_TYPES)
    now = time.time()
    return {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": url.path,
        "rawQueryString": url.query,
        "headers": headers,
        "requestContext": {
            "accountId": "anonymous",
            "apiId": "local",
            "domainName": host,
            "domainPrefix": "local",
            "http": {
                "method": method,
                "path": url.path,
                "protocol": "HTTP/1.1",
                "sourceIp": "127.0.0.1",
                "userAgent": headers.get("user-agent", ""),
            },
            "requestId": str(uuid.uuid4()),
            "routeKey": "$default",
            "stage": "$default",
            "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
            "timeEpoch": int(now * 1000),
        },
        "body": body.decode("utf-8") if is_text else base64.b64encode(body).decode("ascii"),
        "isBase64Encoded": not is_text,
    }


class FunctionURL:
    """An HTTP endpoint in front of a RuntimeAPI, like a Lambda Function URL."""

    def __init__(self, runtime: RuntimeAPI, host: str = "127.0.0.1", port: int = 0, timeout: float = 300.0) -> None:
        self.runtime = runtime
        self.timeout = timeout
        self._lock = threading.Lock()  # one execution environment: one invocation at a time
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="function-url", daemon=True)

    @property
    def address(self) -> str:
        host, port = self._server.server_address[:2]
        return f"{host!s}:{port}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {k.lower(): v for k, v in self.headers.items()}
                event = function_url_event(self.command, self.path, headers, body, front.address)
                try:
                    with front._lock:
                        invocation = front.runtime.invoke(event, front.timeout)
                except (RuntimeError, TimeoutError) as exc:
                    self._send(502, {"content-type": "application/json"}, json.dumps({"error": str(exc)}).encode())
                    return
                if invocation.outcome != "response" or not isinstance(invocation.payload, dict):
                    message = {"error": "the function failed", "detail": invocation.payload}
                    self._send(502, {"content-type": "application/json"}, json.dumps(message).encode())
                    return
                result = invocation.payload
                payload = result.get("body") or ""
                data = base64.b64decode(payload) if result.get("isBase64Encoded") else payload.encode("utf-8")
                self._send(int(result.get("statusCode", 200)), result.get("headers") or {}, data)

            def _send(self, status: int, headers: dict[str, str], data: bytes) -> None:
                self.send_response(status)
                for key, value in headers.items():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        return Handler
