"""Start and stop the tritonserver 2.51.0 binary that the nvidia-pytriton 0.7.0 wheel carries.

The wheel's server has one backend, python. Its stub (`triton_python_backend_stub`) is built per
Python minor version and must sit in the backend's directory, so each run gets a backend directory
of its own: the wheel's `backends/` plus the stub for this interpreter. The stub embeds libpython of
the interpreter this venv was made from and imports packages (numpy, onnxruntime) from this venv,
which it finds through `python3` on PATH.

Everything a run creates is named after the launcher's process id (a work directory under
$TOOLKIT_TOOLS_CACHE/tritonserver-runs, the python backend's shared-memory regions in /dev/shm), so
a run that was killed with SIGKILL is cleaned up by the next one.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytriton

VERSION = "2.51.0"
PACKAGE = Path(pytriton.__file__).resolve().parent
SERVER = PACKAGE / "tritonserver"
CACHE = Path(
    os.environ.get("TOOLKIT_TOOLS_CACHE")
    or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "toolkit-tools"
)
RUNS = CACHE / "tritonserver-runs"
SHM = Path("/dev/shm")
SHM_PREFIX = "toolkit_triton_"
# Loopback only, never through a proxy.
_LOCAL = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def say(message: str) -> None:
    print(f"[tritonserver] {message}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


def http_json(url: str, body: bytes | None = None, timeout: float = 10) -> tuple[int, object]:
    """(status, decoded JSON or None) of a GET (or POST with `body`) on loopback."""
    request = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    try:
        with _LOCAL.open(request, timeout=timeout) as response:
            status, text = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, text = error.code, error.read()
    try:
        return status, json.loads(text) if text else None
    except ValueError:
        return status, None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_leftovers() -> None:
    """Work directories and shared-memory regions of runs whose launcher no longer exists."""
    leftovers = [(p, p.name.split("-")[1]) for p in RUNS.glob("run-*")]
    leftovers += [(p, p.name[len(SHM_PREFIX):].split("_")[0]) for p in SHM.glob(SHM_PREFIX + "*")]
    for path, pid in leftovers:
        if not pid.isdigit() or _alive(int(pid)):
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _die_with_launcher() -> None:
    """preexec_fn: tritonserver gets SIGTERM when the launcher dies (PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)


@dataclass
class Ports:
    http: int = 8000
    grpc: int = 8001
    metrics: int = 8002

    @classmethod
    def choose(cls, http: int, grpc: int, metrics: int) -> "Ports":
        """The ports asked for; 0 picks a free one."""
        return cls(http or free_port(), grpc or free_port(), metrics or free_port())

    def busy(self) -> list[int]:
        return [p for p in (self.http, self.grpc, self.metrics) if port_in_use(p)]


@dataclass
class Tritonserver:
    """One tritonserver process on `repository` (loopback only), its log in the work directory
    (`repository` may be filled in `work` before `start`)."""

    ports: Ports
    repository: Path | None = None
    flags: list[str] = field(default_factory=list)
    log_to_file: bool = True
    work: Path = field(init=False)
    process: subprocess.Popen | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        RUNS.mkdir(parents=True, exist_ok=True)
        remove_leftovers()
        self.work = Path(tempfile.mkdtemp(prefix=f"run-{os.getpid()}-", dir=RUNS))
        self.shm_prefix = f"{SHM_PREFIX}{os.getpid()}_"
        self.log_path = self.work / "tritonserver.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports.http}"

    def _backends(self) -> Path:
        backends = self.work / "backends"
        shutil.copytree(SERVER / "backends", backends)
        stub = SERVER / "python_backend_stubs" / f"{sys.version_info[0]}.{sys.version_info[1]}"
        if not (stub / "triton_python_backend_stub").is_file():
            raise SystemExit(f"tritonserver: the wheel has no python backend stub for Python {stub.name}")
        shutil.copy(stub / "triton_python_backend_stub", backends / "python")
        return backends

    def command(self) -> list[str]:
        return [
            str(SERVER / "bin" / "tritonserver"),
            f"--model-repository={self.repository}",
            f"--backend-directory={self._backends()}",
            f"--cache-directory={SERVER / 'caches'}",
            "--http-address=127.0.0.1", f"--http-port={self.ports.http}",
            "--grpc-address=127.0.0.1", f"--grpc-port={self.ports.grpc}",
            "--metrics-address=127.0.0.1", f"--metrics-port={self.ports.metrics}",
            "--allow-gpu-metrics=false",
            "--pinned-memory-pool-byte-size=0",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
            *self.flags,
        ]

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [
            str(PACKAGE.parent / "nvidia_pytriton.libs"),
            sysconfig.get_config_var("LIBDIR"),
            os.environ.get("LD_LIBRARY_PATH"),
        ]))
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        return env

    def start(self) -> None:
        output = open(self.log_path, "w") if self.log_to_file else None
        self.process = subprocess.Popen(
            self.command(),
            env=self.environment(),
            stdout=output,
            stderr=subprocess.STDOUT if output else None,
            preexec_fn=_die_with_launcher,
            start_new_session=True,
        )
        if output:
            output.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""

    def wait_until_up(self, timeout: float) -> None:
        """Until the HTTP endpoint answers: tritonserver opens it once the startup loads are done
        (whatever their outcome, with --exit-on-error=false)."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise ServerDied(self.process.returncode, self.log())
            try:
                status, _ = http_json(f"{self.url}/v2/health/live", timeout=2)
                if status == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise ServerHung(timeout, self.log())
            time.sleep(0.25)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=40)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for region in SHM.glob(self.shm_prefix + "*"):
            region.unlink(missing_ok=True)
        shutil.rmtree(self.work, ignore_errors=True)


class ServerDied(RuntimeError):
    def __init__(self, code: int, log: str):
        super().__init__(f"tritonserver exited with code {code} before it was up")
        self.code, self.log = code, log


class ServerHung(RuntimeError):
    def __init__(self, timeout: float, log: str):
        super().__init__(f"tritonserver was not up after {timeout:.0f} s")
        self.log = log


def stop_on_signals() -> None:
    """SIGINT, SIGTERM and SIGHUP end the launcher through SystemExit, so `finally` stops the server."""

    def on_signal(signum, _frame):
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
