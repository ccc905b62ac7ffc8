"""The two servers the benchmark compares, started as real processes on free ports.

- `toolkit`: `toolkit serve REPO --device cpu` (this repository's runtime; its HTTP and gRPC front
  ends are the native ones where built, as `toolkit serve` chooses);
- `triton`: `scripts/tools/tritonserver serve REPO`, the real tritonserver 2.51 (the project's
  pinned tool, docs/tools.md) whose ONNX models run as python-backend models with ONNX Runtime on
  CPU, one session per instance, with the session options of the config's `parameters` (the same
  intra-op threads as `toolkit serve`; `ort_threads` where the config sets none: `--ort-threads`)
  and the ONNX Runtime version `toolkit serve` uses (TOOLKIT_TRITON_ORT_VERSION). See
  docs/tools.md for how to label its numbers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perf_analyzer import ROOT

TRITONSERVER = ROOT / "scripts" / "tools" / "tritonserver"

TOOLKIT = "toolkit"
TRITON = "triton"
LABELS = {
    TOOLKIT: "toolkit serve",
    TRITON: "Triton 2.51 (python backend + ORT)",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ready(port: int, timeout: float = 2) -> bool:
    """Whether a v2 HTTP server on `port` answers its readiness probe with 200."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class Server:
    kind: str
    process: subprocess.Popen
    port: int
    log: Path
    grpc_port: int = 0

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def address(self, protocol: str = "http") -> str:
        """What perf_analyzer's -u takes for `protocol` (http: the HTTP port, grpc: the gRPC port)."""
        return f"127.0.0.1:{self.grpc_port}" if protocol == "grpc" else self.url

    @property
    def label(self) -> str:
        return LABELS[self.kind]

    def python_pid(self) -> int:
        """The process that runs the runtime's Python (for py-spy)."""
        return self.process.pid

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)


def start(kind: str, repo: Path, *, ort_threads: int, ort_version: str, logs: Path, timeout: float = 900,
          workers: str = "1") -> Server:
    """`timeout` covers the first use of scripts/tools/tritonserver, which installs it; `workers`:
    toolkit serve's --workers (N or auto)."""
    port, grpc_port = free_port(), free_port()
    if kind == TOOLKIT:
        command = [sys.executable, "-m", "toolkit.cli", "serve", str(repo), "--port", str(port), "--grpc-port",
                   str(grpc_port), "--metrics-port", "0", "--device", "cpu", "--log-level", "warning",
                   "--workers", str(workers)]
    else:
        command = [str(TRITONSERVER), "serve", str(repo), "--http-port", str(port), "--grpc-port", str(grpc_port),
                   "--metrics-port", "0", "--ort-threads", str(ort_threads)]
    env = {**os.environ, "TOOLKIT_TRITON_ORT_VERSION": ort_version}
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"{kind}-{repo.name}-{port}.log"
    with open(log, "w") as handle:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    server = Server(kind, process, port, log, grpc_port)
    deadline = time.monotonic() + timeout
    while not all(ready(port) for _ in range(8)):  # with workers, each new connection may reach another
        if process.poll() is not None:
            raise RuntimeError(f"{kind} server exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > deadline:
            server.stop()
            raise TimeoutError(f"{kind} server not ready after {timeout} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.2)
    return server


@contextlib.contextmanager
def running(kinds: list[str], repo: Path, **options) -> Iterator[dict[str, Server]]:
    """Both servers on `repo` (started one after the other), stopped on exit."""
    servers: dict[str, Server] = {}
    try:
        for kind in kinds:
            servers[kind] = start(kind, repo, **options)
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@dataclass(frozen=True)
class Frontend:
    """How a per-backend bench reaches `toolkit serve`: the protocol perf_analyzer speaks (its -i)
    and the front end that serves it (TOOLKIT_HTTP_FRONTEND / TOOLKIT_GRPC_FRONTEND)."""

    name: str  # what --frontends and the results call it
    protocol: str  # perf_analyzer -i: http or grpc
    http: str = "uvicorn"  # TOOLKIT_HTTP_FRONTEND (for grpc: the HTTP port only answers readiness)
    grpc: str | None = None  # TOOLKIT_GRPC_FRONTEND; None: the gRPC port is off
    extra: tuple[tuple[str, str], ...] = ()  # more environment for this arm (--frontends NAME+VAR=VALUE)

    def env(self) -> dict[str, str]:
        env = {"TOOLKIT_HTTP_FRONTEND": self.http}
        if self.grpc is not None:
            env["TOOLKIT_GRPC_FRONTEND"] = self.grpc
        env.update(self.extra)
        return env

    def as_dict(self) -> dict:
        return {"name": self.name, "protocol": self.protocol, "env": self.env()}


FRONTENDS = {
    "http-uvicorn": Frontend("http-uvicorn", "http", "uvicorn"),
    "http-native": Frontend("http-native", "http", "native"),  # handlers/protocol/httpnative (evhttp)
    "grpc-native": Frontend("grpc-native", "grpc", grpc="native"),  # handlers/protocol/grpc/native (grpc++)
    "grpc-grpcio": Frontend("grpc-grpcio", "grpc", grpc="grpcio"),  # grpcio's asyncio server
}
DEFAULT_FRONTENDS = "http-uvicorn,http-native,grpc-native"


def add_frontend_argument(parser: Any) -> None:
    """The per-backend benches' --frontends option (parsed by `frontends`)."""
    parser.add_argument(
        "--frontends", default=DEFAULT_FRONTENDS,
        help=f"comma-separated, interleaved in each repeat, one server each: {', '.join(FRONTENDS)} "
             f"(default {DEFAULT_FRONTENDS}; the native ones need scripts/http-native.sh / grpc-native.sh)")


def frontends(spec: str) -> list[Frontend]:
    """The front ends of a --frontends value; SystemExit naming an unknown or unbuilt one. An item
    may add environment for its server: `http-native+TOOLKIT_X=1+TOOLKIT_Y=2` is the native HTTP
    front end with those variables (named so in the results), so that arms differing only in a
    setting are measured interleaved in one run."""
    chosen = []
    for item in (n.strip() for n in spec.split(",") if n.strip()):
        name, *settings = item.split("+")
        if name not in FRONTENDS:
            raise SystemExit(f"--frontends: unknown {name!r} (choose from {', '.join(FRONTENDS)})")
        extra = []
        for setting in settings:
            variable, equals, value = setting.partition("=")
            if not equals or not variable:
                raise SystemExit(f"--frontends {item}: {setting!r} is not VARIABLE=VALUE")
            extra.append((variable, value))
        frontend = FRONTENDS[name]
        if extra:
            frontend = dataclasses.replace(frontend, name=item, extra=tuple(extra))
        module = None
        if frontend.protocol == "http" and frontend.http == "native":
            module = "handlers.protocol.httpnative.server"
        elif frontend.grpc == "native":
            module = "handlers.protocol.grpc.nativeserver"
        if module is not None:
            try:
                __import__(module)
            except ImportError as exc:
                raise SystemExit(f"--frontends {name}: not built here ({exc})") from None
        chosen.append(frontend)
    return chosen


@dataclass(frozen=True)
class Arm:
    """One server of a per-backend bench: a CPU variant (shared or pinned) and a front end."""

    variant: str  # shared or pinned
    client_cpus: str | None  # taskset list for perf_analyzer (None: all)
    server_cpus: str | None  # taskset list for the server and the in-process ceiling (None: all)
    frontend: Frontend

    @property
    def name(self) -> str:
        return f"{self.variant}/{self.frontend.name}"

    @property
    def where(self) -> str:
        if self.client_cpus is None:
            return "perf_analyzer, server and ceiling on all CPUs"
        return f"perf_analyzer on CPU {self.client_cpus}, server and ceiling on CPU {self.server_cpus}"


def arms(variants: str, frontend_spec: str) -> list[Arm]:
    """Every (CPU variant, front end) pair of --variants and --frontends, variant-major: the
    ceiling depends on the variant only, so a bench measures it once per variant and repeat."""
    wanted = [v.strip() for v in variants.split(",") if v.strip()]
    unknown = set(wanted) - {"shared", "pinned"}
    if unknown:
        raise SystemExit(f"--variants: unknown {', '.join(sorted(unknown))} (choose shared, pinned)")
    split = split_cpus()
    if "pinned" in wanted and split is None:
        print("one CPU: no pinned variant")
        wanted = [v for v in wanted if v != "pinned"]
    chosen = frontends(frontend_spec)
    return [Arm(v, *(split if v == "pinned" else (None, None)), frontend) for v in wanted for frontend in chosen]


def rotated(arms: list, repeat: int) -> list:
    """`arms` in the order repeat `repeat` serves them: each repeat starts one arm later. An arm's
    place in a repeat moves its rate by several percent (in one FIL run the arm served right after
    another was 5-10 % off), so every arm takes every place in turn."""
    if not arms:
        return arms
    start = repeat % len(arms)
    return arms[start:] + arms[:start]


@contextlib.contextmanager
def toolkit_serve(repo: Path, log: Path, timeout: float = 300, python: str = sys.executable,
                  cpus: str | None = None, frontend: Frontend = FRONTENDS["http-uvicorn"],
                  source: Path = ROOT, pids: list[int] | None = None, log_level: str = "warning") -> Iterator[str]:
    """`toolkit serve REPO --device cpu` on a free HTTP port (and, for a gRPC `frontend`, a free
    gRPC port; the metrics port off, so that nothing else on the machine collides with them) until
    ready; yields the host:port perf_analyzer reaches it at for `frontend.protocol`, stops its
    process group on exit. For the per-backend benches (bench/*_ceiling.py, openvino_bench.py).
    `cpus` (a taskset list) pins the server to those CPUs (its CPU budget then sees only them).
    `source`: the tree whose toolkit/ and handlers/ run (python -m puts it first on the path; a
    before/after comparison serves from an exported older commit). `pids`, when given, gets the
    server's process id (taskset execs the server in its own process); `log_level`: its --log-level."""
    port = free_port()
    grpc_port = free_port() if frontend.grpc is not None else 0
    log.parent.mkdir(parents=True, exist_ok=True)
    pin = ["taskset", "-c", cpus] if cpus is not None else []
    with open(log, "w") as handle:
        process = subprocess.Popen(
            [*pin, python, "-m", "toolkit.cli", "serve", str(repo), "--port", str(port), "--device", "cpu",
             "--grpc-port", str(grpc_port), "--metrics-port", "0", "--log-level", log_level],
            cwd=source, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **frontend.env()},
        )
    if pids is not None:
        pids.append(process.pid)
    try:
        deadline = time.monotonic() + timeout
        while not ready(port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"toolkit serve did not become ready:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)  # polling an HTTP endpoint: there is no event to wait on
        yield f"127.0.0.1:{grpc_port if frontend.protocol == 'grpc' else port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(30)


def split_cpus() -> tuple[str, str] | None:
    """The pinned variant of the ceiling benches: (the client's CPUs, the server's and the
    ceiling's CPUs) as taskset lists: perf_analyzer on the first CPU this process may use, the
    server and the in-process ceiling on the others, so that the ratio compares the server with
    the framework on the same CPUs and the client's CPU counts for neither. None with one CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    return str(cpus[0]), ",".join(str(c) for c in cpus[1:])


def serving_budget_us(ceiling: float, rows: int, cpus: str | None, target: float = 0.9) -> float:
    """What a request of `rows` rows may cost the server's CPUs beyond the model, in CPU
    microseconds, for a server on `cpus` (a taskset list; None: every CPU this process may use) to
    reach `target` of `ceiling` (rows per second, the framework alone on the same CPUs): at the
    ceiling a request takes len(cpus) x rows / ceiling of CPU, and target x (model + rest) = model
    leaves rest = model x (1 / target - 1). With the client on the same CPUs (the shared variant)
    its CPU comes out of this too. Where the serving stack's own cost per request is above it, no
    change to how the model is batched or run reaches the target at that request size."""
    return len(cpu_set(cpus)) * rows / ceiling * 1e6 * (1 / target - 1)


def cpu_set(cpus: str | None) -> set[int]:
    """The CPUs of a taskset list ("1", "0,2", "1-3,6"); None: those this process may use."""
    if cpus is None:
        return set(os.sched_getaffinity(0))
    found: set[int] = set()
    for part in cpus.split(","):
        first, _, last = part.partition("-")
        found.update(range(int(first), int(last or first) + 1))
    return found


@contextlib.contextmanager
def pinned(cpus: str | None) -> Iterator[None]:
    """Runs the block with this thread (and the threads it starts) on `cpus` (a taskset list;
    None: unchanged), then restores the affinity."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpu_set(cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def threads_rate(calls: list, seconds: float) -> float:
    """Runs each of `calls` (no-argument functions, one per thread, as a model's instances run)
    back to back for `seconds`, all started together; the calls completed per second, in all.

    Each thread's rate is its completed calls over the time up to its last completion: a call still
    going when the window closes is neither counted nor timed (with calls of ~0.3 s in a 3 s
    window, counting the calls finished by the window's end would undercount by up to a tenth).
    A window shorter than one call is stretched until every thread has completed one.

    The process's memory is first put on huge pages as the runtime puts a server's once its
    models are loaded (handlers/huge_pages.py; not with TOOLKIT_HUGE_PAGES=0), so that a ceiling
    compares the framework with the server on the same pages (the calls have run once by then:
    every ceiling warms its model up first)."""
    import threading

    from handlers import huge_pages

    huge_pages.apply()
    counts = [0] * len(calls)
    last = [0.0] * len(calls)
    start = threading.Barrier(len(calls) + 1)
    stop = threading.Event()

    def work(index: int) -> None:
        call = calls[index]
        start.wait()
        while not stop.is_set():
            call()
            counts[index] += 1
            last[index] = time.perf_counter()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(calls))]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    time.sleep(seconds)
    while min(counts) == 0:
        time.sleep(0.01)
    stop.set()
    for thread in threads:
        thread.join()
    return sum(count / (at - began) for count, at in zip(counts, last))
