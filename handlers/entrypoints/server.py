"""Run the runtime's listeners in one event loop: HTTP (the native front end where built, else
uvicorn: `http_frontend`), gRPC (the native front end where built, else grpcio's asyncio server)
and a metrics port (uvicorn), like tritonserver's 8000 / 8001 / 8002. Each one is optional.

Load models in the background from the start (the HTTP app, FastAPI's imports and routes, is made
while they load), listen at once, drain on SIGTERM: `/v2/health/live` (gRPC ServerLive) answers
as soon as the sockets are open; `/v2/health/ready` turns 200 (gRPC health SERVING) when every
model is loaded (the Cloud Run startup probe). On SIGTERM/SIGINT the listeners
stop accepting: HTTP waits for in-flight requests, gRPC finishes what its calls and streams
received (up to `graceful_seconds`); the batchers then drain and stop.

The metrics port serves `GET /metrics` only (Prometheus text), as tritonserver's does; the HTTP
port serves `/metrics` too, for platforms that route a single port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn

from .. import limits, metrics, workers  # limits: TOOLKIT_MAX_* read, a bad value refused, before loading
from ..errors import InferenceError
from ..protocol import frontends
from ..protocol.codec import encode_error
from ..model_repository import ModelRepository

log = logging.getLogger("handlers.server")


class _Server(uvicorn.Server):
    """Signals are handled once for every listener (see `serve`), never by uvicorn itself:
    uvicorn would re-raise SIGTERM after its shutdown, killing the process before the batchers
    drain and Python models' finalize() run."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


HTTP_FRONTEND_ENV = "TOOLKIT_HTTP_FRONTEND"
HTTP_FRONTENDS = ("uvicorn", "native")


NATIVE_HTTP_MODULE = "handlers.protocol.httpnative.server"


def native_http_available() -> bool:
    """Whether the native HTTP front end's module (handlers/protocol/httpnative) is built."""
    return frontends.importable(NATIVE_HTTP_MODULE)


def http_frontend() -> str:
    """The HTTP front end to serve with: TOOLKIT_HTTP_FRONTEND (uvicorn or native), else native
    when its module is built (handlers/protocol/httpnative: libevent's evhttp on its own threads),
    else uvicorn: the gRPC front end's rule (handlers/protocol/frontends.py). ValueError, with the
    reason, for another value or for native when its module is not built."""
    return frontends.choose(HTTP_FRONTEND_ENV, HTTP_FRONTENDS, "uvicorn", NATIVE_HTTP_MODULE,
                            "HTTP front end is not built (handlers/protocol/native/build.py http)")


def _fastest(module: str, fallback: str) -> str:
    try:
        __import__(module)
    except ImportError:
        return fallback
    return module


def _metrics_app(repository: ModelRepository | None = None) -> Callable[..., Awaitable[None]]:
    """tritonserver's metrics port: `GET /metrics`, nothing else (summed over the workers when
    this process is one of several: handlers/workers)."""

    async def app(scope: dict[str, Any], receive: Callable[[], Awaitable[Any]], send: Callable[[Any], Awaitable[None]]) -> None:
        await _serve_metrics(repository, scope, send)

    return app


async def _serve_metrics(repository: ModelRepository | None, scope: dict[str, Any], send: Callable[[Any], Awaitable[None]]) -> None:
    if scope["type"] != "http":
        return
    if scope["path"] == "/metrics" and scope["method"] in ("GET", "HEAD"):
        try:
            status, body, content_type = 200, await workers.exposition(repository), metrics.CONTENT_TYPE
        except InferenceError as error:  # a worker did not answer
            status, body, content_type = error.http_status, encode_error(error), "application/json"
    else:
        status, body, content_type = 404, b'{"error":"Not Found"}', "application/json"
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())],
    })
    await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})


@dataclass(frozen=True)
class Listener:
    """What listens where (logged at startup)."""

    kind: str  # "HTTP", "gRPC" or "metrics"
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = {"HTTP": "http://", "metrics": "http://"}.get(self.kind, "")
        suffix = "/metrics" if self.kind == "metrics" else ""
        return f"{self.kind} {scheme}{host}:{self.port}{suffix}"


def _bind(host: str, port: int, kind: str, *, reuse_port: bool = False, listen: bool = True) -> socket.socket:
    """`reuse_port`: share the port with the other workers (SO_REUSEPORT: the kernel spreads the
    connections across the processes listening on it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen for {kind} on {host}:{port}: {exc.strerror or exc}") from None
    if not listen:
        return sock
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(
    repository: ModelRepository,
    host: str = "127.0.0.1",
    port: int | None = 8000,
    *,
    grpc_port: int | None = None,
    metrics_port: int | None = None,
    exit_on_error: bool = True,
    graceful_seconds: float = 30.0,
    log_level: str = "info",
    on_listening: Callable[[list[Listener]], None] | None = None,
    reuse_port: bool = False,
) -> int:
    """Serve until SIGTERM/SIGINT; returns the process exit status. A port of None or 0 turns
    that listener off; `on_listening` gets the listeners once they are open; `reuse_port`: this
    process is one of several workers on the same ports (handlers/workers)."""
    runner = _Runner(repository, host, exit_on_error, graceful_seconds, log_level, reuse_port)
    try:
        runner.frontend = http_frontend() if port else "uvicorn"
    except ValueError as exc:  # TOOLKIT_HTTP_FRONTEND is wrong
        log.error("%s", exc)
        return 1
    try:
        sockets = runner.bind(port, grpc_port, metrics_port)
    except OSError as exc:
        log.error("%s", exc)
        return 1
    loop_factory = None
    if _fastest("uvloop", "asyncio") == "uvloop":
        import uvloop

        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as loop_runner:
        return loop_runner.run(runner.run(sockets, on_listening))


class _Runner:
    def __init__(self, repository: ModelRepository, host: str, exit_on_error: bool, graceful_seconds: float, log_level: str,
                 reuse_port: bool = False) -> None:
        self.repository = repository
        self.reuse_port = reuse_port
        self.frontend = "uvicorn"  # of the HTTP port (http_frontend())
        self.host = host
        self.exit_on_error = exit_on_error
        self.graceful_seconds = graceful_seconds
        self.log_level = log_level
        self.http: list[Any] = []  # uvicorn servers, or the native HTTP front end
        self.grpc: Any = None
        self.grpc_port = 0
        self.listeners: list[Listener] = []
        self.failure: list[BaseException] = []
        self.stopping: asyncio.Event | None = None

    def bind(self, port: int | None, grpc_port: int | None, metrics_port: int | None) -> dict[str, socket.socket]:
        sockets: dict[str, socket.socket] = {}
        try:
            if port:
                sockets["HTTP"] = _bind(self.host, port, "HTTP", reuse_port=self.reuse_port)
            if metrics_port:
                sockets["metrics"] = _bind(self.host, metrics_port, "metrics", reuse_port=self.reuse_port)
        except OSError:
            for sock in sockets.values():
                sock.close()
            raise
        self.grpc_port = grpc_port or 0
        return sockets

    def _http_app(self) -> Any:
        """The runtime's FastAPI app (handlers.app: imported on first use, see `run`)."""
        from ..app import create_app

        return create_app(self.repository)

    def _uvicorn(self, app: Any, sock: socket.socket) -> _Server:
        config = uvicorn.Config(
            app,
            loop="none",
            http="httptools" if _fastest("httptools", "h11") == "httptools" else "h11",
            lifespan="off",
            access_log=False,
            log_level=self.log_level,
            timeout_graceful_shutdown=int(self.graceful_seconds),
            timeout_keep_alive=75,
        )
        return _Server(config)

    async def run(self, sockets: dict[str, socket.socket], on_listening: Callable[[list[Listener]], None] | None) -> int:
        loop = asyncio.get_running_loop()
        self.stopping = asyncio.Event()
        tasks: list[asyncio.Task[Any]] = []
        peers = self.repository.peers
        if peers is not None:
            await peers.start()  # before any listener: the others may ask as soon as they serve
        if self.grpc_port:
            from ..protocol.grpc.server import GrpcServer

            try:
                self.grpc = GrpcServer(self.repository, self.host, self.grpc_port, reuse_port=self.reuse_port)
                bound = await self.grpc.start()
            except (OSError, ValueError) as exc:  # ValueError: TOOLKIT_GRPC_FRONTEND is wrong
                log.error("%s", exc)
                for sock in sockets.values():
                    sock.close()
                return 1
            self.listeners.append(Listener("gRPC", self.host, bound))
        # The models load from here on, while the HTTP app is made: FastAPI's imports (~170 ms of
        # Python, imported here and not before) overlap the loading, most of which (an ONNX Runtime
        # session's graph optimisation, a warmup's inference) runs without the GIL.
        loader = threading.Thread(target=self._load, args=(loop,), name="model-loader", daemon=True)
        loader.start()
        frontend = self.frontend
        for kind, sock in sockets.items():
            app = self._http_app() if kind == "HTTP" else _metrics_app(self.repository)
            if kind == "HTTP" and frontend == "native":
                from ..protocol.httpnative.server import NativeHttpServer

                server: Any = NativeHttpServer(app, graceful_seconds=self.graceful_seconds)
            else:
                server = self._uvicorn(app, sock)
            self.http.append(server)
            tasks.append(asyncio.ensure_future(server.serve(sockets=[sock])))
            self.listeners.append(Listener(kind, self.host, sock.getsockname()[1]))
        order = {"HTTP": 0, "gRPC": 1, "metrics": 2}
        self.listeners.sort(key=lambda listener: order[listener.kind])
        if on_listening is not None:
            on_listening(self.listeners)
        for listener in self.listeners:
            log.info("listening: %s", listener)
        if "HTTP" in sockets:
            log.info("HTTP front end: %s", frontend)
        log.info("request limits: %d bytes a request, %d elements a tensor (TOOLKIT_MAX_REQUEST_BYTES, "
                 "TOOLKIT_MAX_TENSOR_ELEMENTS)", limits.LIMITS.max_request_bytes, limits.LIMITS.max_tensor_elements)

        handled = (signal.SIGINT, signal.SIGTERM)
        if threading.current_thread() is threading.main_thread():
            for sig in handled:
                loop.add_signal_handler(sig, self.stopping.set)
        try:
            await self.stopping.wait()
            log.info("shutting down: draining requests in flight (up to %.0f s)", self.graceful_seconds)
            await self._stop(tasks)
        finally:
            if threading.current_thread() is threading.main_thread():
                for sig in handled:
                    loop.remove_signal_handler(sig)
            await asyncio.to_thread(loader.join)
            await asyncio.to_thread(self.repository.stop, drain=True, timeout=self.graceful_seconds)
            if peers is not None:
                await peers.close()
        if self.failure:
            log.error("%s", self.failure[0])
            return 1
        return 0

    def _load(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            self.repository.load(exit_on_error=self.exit_on_error)
        except BaseException as exc:  # reported after the listeners stop
            self.failure.append(exc)
            assert self.stopping is not None
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(self.stopping.set)

    async def _stop(self, tasks: list[asyncio.Task[Any]]) -> None:
        for server in self.http:
            server.should_exit = True
        stops: list[Awaitable[Any]] = [*tasks]
        if self.grpc is not None:
            stops.append(self.grpc.stop(self.graceful_seconds))
        results = await asyncio.gather(*stops, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                log.error("a listener failed while stopping: %r", result)
