"""The parent of the workers: reserve the ports, start the workers, forward SIGTERM, wait.

It loads no model itself. The ports are bound here first (SO_REUSEPORT, not listening), so a port
that is taken fails at once with the single-process message, and an ephemeral port (0) becomes one
concrete port that every worker then listens on. Each worker is `python -m
handlers.entrypoints.worker` with TOOLKIT_WORKER=INDEX/COUNT, the manifest and the ports; its
log lines say `worker INDEX`. SIGTERM or SIGINT is passed on to every worker, each drains as a
single server does, and the parent exits with the worst status. A worker that exits on its own
(a model failed to load, a crash) stops the others: the platform restarts the container.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .plan import WORKER_ENV

log = logging.getLogger("handlers.workers")

DIRECTORY_ENV = "TOOLKIT_WORKER_DIR"  # where the workers' sockets live (default: a new temp dir)


def _reserve(host: str, port: int, kind: str) -> socket.socket:
    from ..entrypoints.server import _bind

    return _bind(host, port, kind, reuse_port=True, listen=False)


def supervise(
    manifest: Path,
    model_root: Path | None,
    workers: int,
    host: str,
    port: int | None,
    *,
    grpc_port: int | None = None,
    metrics_port: int | None = None,
    exit_on_error: bool = True,
    graceful_seconds: float = 30.0,
    log_level: str = "info",
    on_listening: Callable[[list[Any]], None] | None = None,
) -> int:
    """Run `workers` worker processes on the same ports until SIGTERM/SIGINT; the exit status."""
    from ..entrypoints.server import Listener

    reserved: dict[str, socket.socket] = {}
    try:
        for kind, wanted in (("HTTP", port), ("gRPC", grpc_port), ("metrics", metrics_port)):
            if wanted:
                reserved[kind] = _reserve(host, wanted, kind)
    except OSError as exc:
        log.error("%s", exc)
        for sock in reserved.values():
            sock.close()
        return 1
    ports = {kind: sock.getsockname()[1] for kind, sock in reserved.items()}
    own_directory = not os.environ.get(DIRECTORY_ENV)
    directory = Path(os.environ.get(DIRECTORY_ENV) or tempfile.mkdtemp(prefix="toolkit-workers-"))
    directory.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "handlers.entrypoints.worker", "--manifest", str(manifest), "--host", host,
        "--http-port", str(ports.get("HTTP", 0)), "--grpc-port", str(ports.get("gRPC", 0)),
        "--metrics-port", str(ports.get("metrics", 0)), "--graceful-seconds", str(graceful_seconds),
        "--log-level", log_level, "--exit-on-error" if exit_on_error else "--no-exit-on-error",
    ]
    if model_root is not None:
        command += ["--model-root", str(model_root)]
    processes: list[subprocess.Popen[bytes]] = []
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    status = 0
    try:
        for index in range(workers):
            environment = {**os.environ, WORKER_ENV: f"{index}/{workers}", DIRECTORY_ENV: str(directory)}
            processes.append(subprocess.Popen(command, env=environment))
        listeners = [Listener(kind, host, number) for kind, number in ports.items()]
        log.info("%d workers (pids %s) on %s", workers, ", ".join(str(p.pid) for p in processes),
                 ", ".join(str(listener) for listener in listeners))
        if on_listening is not None:
            on_listening(listeners)
        while [process.poll() for process in processes].count(None):  # poll every one (any() would stop early)
            failed = [p for p in processes if p.returncode not in (None, 0)]
            exited = [p for p in processes if p.returncode is not None]
            if exited and not stopping:
                first = (failed or exited)[0]
                log.error("worker %d exited with status %d: stopping the other workers",
                          processes.index(first), first.returncode)
                stop(signal.SIGTERM, None)
            time.sleep(0.1)
        codes = [p.returncode for p in processes]
        status = next((code for code in codes if code), 0)
        if status < 0:  # killed by a signal
            status = 1
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for sock in reserved.values():
            sock.close()
        if own_directory:
            shutil.rmtree(directory, ignore_errors=True)
    return status
