"""Run a built image on this machine as its platform runs it.

- Lambda images run under AWS's Lambda Runtime Interface Emulator (lambda_rie.py), the program
  AWS's base images carry: it is mounted read-only into the container as its entrypoint and runs
  the image's own ENTRYPOINT + CMD as the function's runtime, with a read-only root, a writable
  `/tmp` (tmpfs) and an arbitrary non-root user, as Lambda does. The RIE initialises the function
  on the first invocation (Lambda's init phase) and takes invocations on `POST
  /2015-03-31/functions/function/invocations`; `LocalLambda.invoke` sends one, and `toolkit
  proxy` / `toolkit run` put a Function URL front before it (deploy/function_url.py).
- Cloud Run / Knative images run with `PORT`, a read-only root and a writable `/tmp`.

Containers use the host's network (the private CI engine has no bridge network), so the RIE's
two listening addresses, its invoke endpoint and the Runtime API it serves the function, are set
to free loopback ports (`--runtime-interface-emulator-address`, `--runtime-api-address`): runs in
parallel never collide.

The RIE's log lines give the cold start: rapid's `INIT REPORT(durationMs: ...)` is the init
phase (runtime start to its first `/next`: imports, models loaded and warmed up), the number
Lambda reports as `Init Duration`. (This RIE's own `REPORT ... Init Duration` measures only the
asynchronous hand-off, about 0.05 ms; its `Duration` includes waiting for init.)
"""

from __future__ import annotations

import re
import socket
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Self

from .builders import Builder
from .errors import BuildError
from .lambda_rie import RIEError, ensure_rie

INVOKE_PATH = "/2015-03-31/functions/function/invocations"
RIE_IN_CONTAINER = "/aws-lambda-rie"
# Lambda runs functions as an arbitrary non-root user (uid 993 in today's sandboxes).
LAMBDA_SANDBOX_USER = "993:990"
READ_ONLY = ["--read-only", "--tmpfs", "/tmp"]

_INIT_REPORT = re.compile(r"INIT REPORT\(durationMs: ([0-9.]+)\)")
_REPORT = re.compile(r"REPORT RequestId: \S+\s+(?:Init Duration: ([0-9.]+) ms\s+)?Duration: ([0-9.]+) ms")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class LambdaReports:
    """What the RIE logged about the function's start and its first invocation."""

    init_ms: float | None  # rapid's INIT REPORT: Lambda's Init Duration
    first_invoke_ms: float | None  # the first REPORT's Duration (includes waiting for init here)


def parse_reports(logs: str) -> LambdaReports:
    init = _INIT_REPORT.search(logs)
    report = _REPORT.search(logs)
    init_ms = float(init.group(1)) if init else None
    if init_ms is None and report and report.group(1):
        init_ms = float(report.group(1))
    return LambdaReports(init_ms, float(report.group(2)) if report else None)


class LocalLambda:
    """A Lambda image running under AWS's RIE in a container (start with `start()` or `with`)."""

    def __init__(
        self,
        builder: Builder,
        image: str,
        *,
        rie: Path | None = None,
        arch: str = "amd64",
        host: str = "127.0.0.1",
        function_name: str = "function",
        memory_mb: int | None = None,
        timeout_s: int | None = None,
        environment: dict[str, str] | None = None,
        user: str = LAMBDA_SANDBOX_USER,
    ) -> None:
        self.builder = builder
        self.image = image
        try:
            self.rie = rie or ensure_rie(arch)
        except RIEError as exc:
            raise BuildError(str(exc)) from None
        self.host = host
        self.function_name = function_name
        self.memory_mb = memory_mb
        self.timeout_s = timeout_s
        self.environment = dict(environment or {})
        self.user = user
        self.port = 0
        self.container: str | None = None
        self.started_at = 0.0  # time.monotonic() just before the engine was asked to start it

    @property
    def invoke_url(self) -> str:
        return f"http://{self.host}:{self.port}{INVOKE_PATH}"

    def start(self) -> Self:
        info = self.builder.inspect(self.image)
        command = [*info.entrypoint, *info.cmd]
        if not command:
            raise BuildError(f"{self.image} has neither ENTRYPOINT nor CMD: nothing for the Lambda runtime to run")
        self.port = free_port(self.host)
        runtime_api = f"127.0.0.1:{free_port()}"
        env = {"AWS_LAMBDA_FUNCTION_NAME": self.function_name, **self.environment}
        if self.memory_mb:
            env["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"] = str(self.memory_mb)
        if self.timeout_s:
            env["AWS_LAMBDA_FUNCTION_TIMEOUT"] = str(self.timeout_s)
        args = ["--network", "host", *READ_ONLY, "--user", self.user,
                "-v", f"{self.rie}:{RIE_IN_CONTAINER}:ro", "--entrypoint", RIE_IN_CONTAINER]
        for key, value in sorted(env.items()):
            args += ["-e", f"{key}={value}"]
        rie_options = [
            "--runtime-interface-emulator-address", f"{self.host}:{self.port}",
            "--runtime-api-address", runtime_api,
        ]  # then the image's own ENTRYPOINT + CMD, which the RIE runs as the function's runtime (no
        # "--" between: the RIE would take it as the program; it reads only its own options)
        self.started_at = time.monotonic()
        self.container = self.builder.run_detached(self.image, args, [*rie_options, *command])
        return self

    def running(self) -> bool:
        return self.container is not None and self.builder.running(self.container)

    def logs(self) -> str:
        return self.builder.logs(self.container) if self.container else ""

    def wait_listening(self, timeout: float = 60.0) -> None:
        """Until the RIE accepts connections (it starts in milliseconds; the engine may not)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection((self.host, self.port), timeout=2):
                    return
            except OSError:
                pass
            if not self.running():
                raise BuildError(f"{self.image} exited under the Lambda RIE before it listened", detail=self.logs()[-3000:])
            if time.monotonic() > deadline:
                raise BuildError(f"the Lambda RIE in {self.image} did not listen within {timeout:.0f} s", detail=self.logs()[-3000:])
            time.sleep(0.02)  # polling a port: there is no event to wait on

    def invoke(self, payload: bytes, timeout: float = 300.0) -> tuple[int, dict[str, str], bytes]:
        """One invocation (the event as JSON bytes): the Invoke API's status, headers, payload."""
        self.wait_listening(min(timeout, 60.0))
        request = urllib.request.Request(self.invoke_url, data=payload, method="POST", headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, dict(response.headers.items()), response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers.items()), exc.read()
        except OSError as exc:
            raise BuildError(f"invoking {self.image} under the Lambda RIE failed: {exc}", detail=self.logs()[-3000:]) from None

    def reports(self, wait_s: float = 5.0) -> LambdaReports:
        """The RIE's INIT REPORT / REPORT lines (the engine may take a moment to hand logs over)."""
        deadline = time.monotonic() + wait_s
        while True:
            reports = parse_reports(self.logs())
            if (reports.init_ms is not None and reports.first_invoke_ms is not None) or time.monotonic() > deadline:
                return reports
            time.sleep(0.1)

    def stop(self) -> None:
        if self.container is not None:
            self.builder.remove_container(self.container)
            self.container = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_service(builder: Builder, image: str, port: int, host: str = "127.0.0.1", environment: dict[str, str] | None = None) -> str:
    """Start a Cloud Run / Knative image as those platforms run it (PORT, read-only root, /tmp);
    return the container's name."""
    args = ["--network", "host", *READ_ONLY, "-e", f"PORT={port}", "-e", f"TOOLKIT_HOST={host}"]
    for key, value in sorted((environment or {}).items()):
        args += ["-e", f"{key}={value}"]
    return builder.run_detached(image, args)
