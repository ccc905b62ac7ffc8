"""The real runtime serving one candidate configuration: `toolkit serve` in its own process.

A candidate repository holds only the tuned model: its directory's files linked from the user's
repository (nothing is copied or changed there) and the candidate's config.pbtxt. The server is
the same `toolkit serve` users run (uvicorn, the batcher, ONNX Runtime), started on a free port
and stopped with SIGTERM.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from google.protobuf import text_format
from google.protobuf.message import Message


class ServerError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def candidate_repository(model_dir: Path, config: Message, target: Path) -> Path:
    """`target`/<model> with the model's files linked and `config` as its config.pbtxt."""
    model = target / model_dir.name
    model.mkdir(parents=True)
    for entry in model_dir.iterdir():
        if entry.name in ("config.pbtxt", "config.tuned.pbtxt"):
            continue
        (model / entry.name).symlink_to(entry.resolve(), target_is_directory=entry.is_dir())
    (model / "config.pbtxt").write_text(text_format.MessageToString(config), encoding="utf-8")
    return target


class Server:
    """`toolkit serve REPO --device DEVICE` on a free local port."""

    def __init__(self, repo: Path, device: str, log: Path, ready_timeout: float = 300.0,
                 cpus: int | None = None, env: dict[str, str] | None = None) -> None:
        """`cpus`: run the server on only that many of this machine's CPUs (its CPU affinity, as a
        cpuset would; the runtime's CPU budget sees them), e.g. to stand in for Lambda vCPUs.
        `env`: added to the server's environment."""
        self.port = free_port()
        self.log = log
        command = [sys.executable, "-m", "toolkit.cli", "serve", str(repo), "--host", "127.0.0.1", "--port",
                   str(self.port), "--device", device, "--log-level", "warning"]
        allowed = sorted(os.sched_getaffinity(0))
        chosen = set(allowed[: max(1, cpus)]) if cpus is not None and cpus < len(allowed) else None
        with open(log, "w") as handle:
            self.process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT,
                                            start_new_session=True, env={**os.environ, **(env or {})},
                                            preexec_fn=(lambda: os.sched_setaffinity(0, chosen)) if chosen else None)
        deadline = time.monotonic() + ready_timeout
        while not self._ready():
            if self.process.poll() is not None:
                raise ServerError(f"toolkit serve exited with {self.process.returncode}:\n{self.output()}")
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(f"toolkit serve was not ready after {ready_timeout:g} s:\n{self.output()}")
            time.sleep(0.1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/v2/health/ready", timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(60)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
