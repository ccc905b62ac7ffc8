"""The reference tools the tests compare against (scripts/tools/): found or installed once per
test session. Locally a tool that cannot be installed skips its tests with the command that
installs it; CI sets TOOLKIT_REQUIRE_TOOLS=1 so such a test fails instead."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

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
