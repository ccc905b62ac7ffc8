"""Run the runtime with uvicorn: listen at once, load models in the background, drain on SIGTERM.

`/v2/health/live` answers as soon as the socket is open; `/v2/health/ready` turns 200 when every
model is loaded (the Cloud Run startup probe). On SIGTERM uvicorn stops accepting connections and
waits for in-flight requests (up to `graceful_seconds`); the batchers then drain and stop.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from typing import Iterator

import uvicorn

from ..app import create_app
from ..model_repository import ModelRepository

log = logging.getLogger("handlers.server")


class _Server(uvicorn.Server):
    """uvicorn re-raises SIGTERM/SIGINT after its graceful shutdown, which kills the process before
    the batchers drain and Python models' finalize() run. Handle the signals without re-raising."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def _fastest(module: str, fallback: str) -> str:
    try:
        __import__(module)
    except ImportError:
        return fallback
    return module


def serve(
    repository: ModelRepository,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    exit_on_error: bool = True,
    graceful_seconds: float = 30.0,
    log_level: str = "info",
) -> int:
    """Serve until SIGTERM/SIGINT; returns the process exit status."""
    app = create_app(repository)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        loop="uvloop" if _fastest("uvloop", "asyncio") == "uvloop" else "asyncio",
        http="httptools" if _fastest("httptools", "h11") == "httptools" else "h11",
        lifespan="off",
        access_log=False,
        log_level=log_level,
        timeout_graceful_shutdown=int(graceful_seconds),
        timeout_keep_alive=75,
    )
    server = _Server(config)
    failure: list[BaseException] = []

    def load() -> None:
        try:
            repository.load(exit_on_error=exit_on_error)
        except BaseException as exc:  # reported after the server stops
            failure.append(exc)
            server.should_exit = True

    loader = threading.Thread(target=load, name="model-loader", daemon=True)
    loader.start()
    try:
        server.run()
    finally:
        loader.join()
        repository.stop(drain=True, timeout=graceful_seconds)
    if failure:
        log.error("%s", failure[0])
        return 1
    return 0
