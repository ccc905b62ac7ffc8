"""The reference tools the tests compare against (scripts/tools/): found or installed once per
test session. Locally a tool that cannot be installed skips its tests with the command that
installs it; CI sets TOOLKIT_REQUIRE_TOOLS=1 so such a test fails instead."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

TOOLS = Path(__file__).resolve().parents[1] / "scripts" / "tools"


@functools.cache
def _install(tool: str) -> tuple[str | None, str]:
    script = TOOLS / tool
    try:
        out = subprocess.run([str(script), "--install-only"], capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return None, "timed out installing"
    if out.returncode != 0:
        return None, (out.stderr or out.stdout)[-2000:]
    return str(script), ""


def tool(name: str) -> str:
    """The command of tool `name` (scripts/tools/NAME), installed on first use."""
    path, error = _install(name)
    if path is None:
        message = f"{name} is not installed and could not be installed ({error.strip()}); install it with: scripts/tools/{name} --install-only"
        if os.environ.get("TOOLKIT_REQUIRE_TOOLS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return path


def perf_analyzer() -> str:
    """NVIDIA perf_analyzer 2.51.0 (scripts/tools/perf_analyzer)."""
    return tool("perf_analyzer")


@functools.cache
def _printed_path(name: str) -> str:
    out = subprocess.run([tool(name), "--install-only"], capture_output=True, text=True, timeout=900)
    return out.stdout.strip().splitlines()[-1]


def lambda_rie() -> str:
    """AWS's Lambda Runtime Interface Emulator binary for this machine's architecture
    (scripts/tools/aws-lambda-rie, pinned in toolkit/build/lambda_rie.py)."""
    return _printed_path("aws-lambda-rie")


def sam() -> str:
    """AWS SAM CLI 1.170.0 in its own virtual environment (scripts/tools/sam)."""
    return tool("sam")


def tritonserver() -> str:
    """NVIDIA tritonserver 2.51.0 (scripts/tools/tritonserver: `validate` and `serve`)."""
    return tool("tritonserver")


@dataclass
class Tritonserver:
    """A running `scripts/tools/tritonserver serve` (loopback; every port its own)."""

    process: subprocess.Popen
    http_port: int
    grpc_port: int
    metrics_port: int
    log: Path

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def serve_tritonserver(repository: Path, *flags: str, ready_timeout: float = 300) -> Iterator[Tritonserver]:
    """The real tritonserver 2.51 on `repository` (ONNX models through its python backend, see
    docs/tools.md), on free HTTP, gRPC and metrics ports; stopped on exit. `flags` go to
    tritonserver itself (e.g. "--log-verbose=1")."""
    from serving import free_port

    command = tritonserver()
    ports = [free_port(), free_port(), free_port()]
    log = Path(tempfile.mkstemp(prefix="tritonserver-", suffix=".log")[1])
    with open(log, "w") as handle:
        process = subprocess.Popen(
            [command, "serve", str(repository), "--http-port", str(ports[0]), "--grpc-port", str(ports[1]),
             "--metrics-port", str(ports[2]), "--ready-timeout", str(ready_timeout), *(["--", *flags] if flags else [])],
            stdout=handle,
            stderr=subprocess.STDOUT,
        )
    server = Tritonserver(process, *ports, log)
    try:
        deadline = time.monotonic() + ready_timeout + 30
        while "tritonserver ready:" not in server.output():
            if process.poll() is not None:
                raise RuntimeError(f"tritonserver exited with {process.returncode}:\n{server.output()[-4000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"tritonserver not ready after {ready_timeout} s:\n{server.output()[-4000:]}")
            time.sleep(0.2)
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.unlink(missing_ok=True)
