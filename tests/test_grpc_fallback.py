"""grpcio's server is the gRPC fallback: images built without the native front end's wheel and
machines without grpc++ serve with it. When the native front end is built, the rest of the suite
serves gRPC with it, so the gRPC suites run here once more, on grpcio's server
(TOOLKIT_GRPC_FRONTEND=grpcio), in a pytest of their own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from handlers.protocol.grpc import server as grpc_server

ROOT = Path(__file__).resolve().parents[1]
SUITES = (
    "tests/test_grpc_frontend.py",
    "tests/test_grpc_protocol.py",
    "tests/test_grpc_reliability.py",
    "tests/test_grpc_examples.py",
    "tests/test_decoupled_grpc.py",
    "tests/test_decoupled_examples.py",
    "tests/test_workers.py",
    "tests/test_reliability_fuzz.py",
)


def test_grpc_suites_pass_on_grpcio_server() -> None:
    if os.environ.get(grpc_server.FRONTEND_ENV) == "grpcio" or not grpc_server.native_available():
        pytest.skip("this run's gRPC tests already serve with grpcio's server")
    env = {**os.environ, grpc_server.FRONTEND_ENV: "grpcio"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *SUITES]
    done = subprocess.run(command, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    summary = done.stdout.strip().splitlines()[-1:] if done.stdout.strip() else []
    assert done.returncode == 0, f"{' '.join(SUITES)} on grpcio's server:\n{done.stdout[-6000:]}\n{done.stderr[-2000:]}"
    assert summary and " passed" in summary[0] and "failed" not in summary[0] and "skipped" not in summary[0], summary
