"""Shared parts of the reliability suite: the test repository, the runtime process, tagged load.

tests/test_reliability_*.py run reduced forms in CI; bench/reliability.py runs the full forms
with the same code (docs/reliability.md). Everything here is real: the runtime runs as the
container image runs it (`python -m handlers.entrypoints.container` over a compiled manifest),
clients are tritonclient's (`tritonclient.http.aio`, aiohttp) or plain `http.client`, memory is
read from /proc. The tests at the bottom check the harness itself: the tagged requests' expected
answers are what the three models compute.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import model_builders as mb
from conftest import write_config

ROOT = Path(__file__).resolve().parents[1]
PYTHON_MODELS = Path(__file__).resolve().parent / "python_models"
WIDTH = 16  # every tensor of the mixed repository is [batch, 16] FP32
MIXED_MODELS = ("add_sub", "py_add_sub", "pipeline")

# --- the repository -------------------------------------------------------------------------------

ADD_SUB_CONFIG = """
    backend: "{backend}"
    max_batch_size: 64
    input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }}, {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }} ]
    output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }}, {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }} ]
    dynamic_batching {{ }}
    instance_group [ {{ count: {count} kind: KIND_CPU }} ]
    {extra}
"""

PIPELINE_CONFIG = """
    platform: "ensemble"
    max_batch_size: 64
    input [ { name: "A" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "B" data_type: TYPE_FP32 dims: [ 16 ] } ]
    output [ { name: "TWICE_A" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "TWICE_B" data_type: TYPE_FP32 dims: [ 16 ] } ]
    ensemble_scheduling { step [
      { model_name: "add_sub" model_version: -1
        input_map { key: "INPUT0" value: "A" } input_map { key: "INPUT1" value: "B" }
        output_map { key: "OUTPUT0" value: "SUM" } output_map { key: "OUTPUT1" value: "DIFF" } },
      { model_name: "py_add_sub" model_version: -1
        input_map { key: "INPUT0" value: "SUM" } input_map { key: "INPUT1" value: "DIFF" }
        output_map { key: "OUTPUT0" value: "TWICE_A" } output_map { key: "OUTPUT1" value: "TWICE_B" } }
    ] }
"""


def build_mixed_repository(root: Path) -> Path:
    """`add_sub` (ONNX, 2 instances), `py_add_sub` (Triton's python add_sub example, in the serving
    process), `pipeline` (ensemble: add_sub then py_add_sub, so TWICE_A = 2A and TWICE_B = 2B) and
    `strings` (ONNX identity over BYTES, for the codec fuzz)."""
    if root.exists():
        shutil.rmtree(root)
    mb.add_sub(root / "add_sub" / "1" / "model.onnx", dims=("N", WIDTH))
    write_config(root, "add_sub", ADD_SUB_CONFIG.format(
        backend="onnxruntime", count=2,
        extra='parameters { key: "intra_op_thread_count" value: { string_value: "1" } }'))
    (root / "py_add_sub" / "1").mkdir(parents=True)
    shutil.copy(PYTHON_MODELS / "add_sub.py", root / "py_add_sub" / "1" / "model.py")
    write_config(root, "py_add_sub", ADD_SUB_CONFIG.format(backend="python", count=1, extra=""))
    write_config(root, "pipeline", PIPELINE_CONFIG)
    (root / "pipeline" / "1").mkdir()
    mb.identity(root / "strings" / "1" / "model.onnx", {"TEXT": ("BYTES", ["N", -1])}, ["ECHO"])
    write_config(root, "strings", """
        backend: "onnxruntime"
        max_batch_size: 8
        input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] } ]
        output [ { name: "ECHO" data_type: TYPE_STRING dims: [ -1 ] } ]
        dynamic_batching { }
    """)
    return root


def python_model(root: Path, name: str, source: str, config: str) -> Path:
    """A Python model from inline source (written as Triton's docs write them)."""
    directory = root / name / "1"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.py").write_text(textwrap.dedent(source))
    write_config(root, name, config)
    return directory / "model.py"


def compile_manifest(repo: Path) -> Path:
    """Compile `repo` as `toolkit build` does and write models.json next to it."""
    from toolkit.repository.compile import compile_repository

    result = compile_repository(repo, device="cpu")
    assert result.ok, {name: str(error) for name, error in result.failures.items()}
    return result.write_manifest(repo / "models.json")


# --- the runtime process ----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status(port: int, path: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", path)
        return connection.getresponse().status
    except OSError:
        return 0
    finally:
        connection.close()


def rss_bytes(pid: int) -> int:
    """Resident memory of a process and all its descendants (model processes included)."""
    total = 0
    pending = [pid]
    while pending:
        current = pending.pop()
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
            for task in Path(f"/proc/{current}/task").iterdir():
                pending.extend(int(c) for c in (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


@dataclass
class Runtime:
    """The runtime as an image runs it: `python -m handlers.entrypoints.container`."""

    process: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def rss(self) -> int:
        return rss_bytes(self.process.pid)

    def alive(self) -> bool:
        return self.process.poll() is None

    def ready(self) -> bool:
        return _status(self.port, "/v2/health/ready") == 200

    def terminate(self) -> float:
        """SIGTERM; returns the seconds until the process exited."""
        started = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(60)
        return time.monotonic() - started


@contextlib.contextmanager
def runtime(manifest: Path, *, env: dict[str, str] | None = None, ready_timeout: float = 120.0,
            log_dir: Path | None = None) -> Iterator[Runtime]:
    port = free_port()
    log = (log_dir or manifest.parent) / f"runtime-{port}.log"
    environment = {
        **os.environ,
        "TOOLKIT_MANIFEST": str(manifest),
        "PORT": str(port),
        "TOOLKIT_HOST": "127.0.0.1",
        "TOOLKIT_LOG_LEVEL": "warning",
        "PYTHONPATH": str(ROOT),
        **(env or {}),
    }
    with open(log, "w") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "handlers.entrypoints.container"],
            cwd=ROOT, env=environment, stdout=handle, stderr=subprocess.STDOUT,
        )
    server = Runtime(process, port, log)
    try:
        deadline = time.monotonic() + ready_timeout
        while not server.ready():
            if process.poll() is not None:
                raise RuntimeError(f"runtime exited with {process.returncode}:\n{server.output()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"runtime not ready after {ready_timeout} s:\n{server.output()}")
            time.sleep(0.05)
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# --- tagged requests ----------------------------------------------------------------------------------


def tagged_inputs(tag: int) -> tuple[np.ndarray, np.ndarray]:
    """Inputs that only request `tag` sends: batch 1-3, values exact in FP32 (tag < 2**20)."""
    batch = 1 + tag % 3
    index = np.arange(batch * WIDTH, dtype=np.float32).reshape(batch, WIDTH)
    a = np.float32(tag) + index / np.float32(4)
    b = np.float32((tag * 7) % 4093) - index
    return a.astype(np.float32), b.astype(np.float32)


def tagged_model(tag: int) -> str:
    return MIXED_MODELS[tag % len(MIXED_MODELS)]


def expected_outputs(model: str, a: np.ndarray, b: np.ndarray) -> dict[str, np.ndarray]:
    """What the model computes, in float32 as it does (for tagged values: exactly 2A and 2B)."""
    with np.errstate(all="ignore"):
        total, difference = a + b, a - b
        if model == "pipeline":
            return {"TWICE_A": total + difference, "TWICE_B": total - difference}
        return {"OUTPUT0": total, "OUTPUT1": difference}


def input_names(model: str) -> tuple[str, str]:
    return ("A", "B") if model == "pipeline" else ("INPUT0", "INPUT1")


@dataclass
class LoadReport:
    sent: int = 0
    ok: int = 0
    mismatched: int = 0
    lost: int = 0  # no HTTP answer at all (connection error, timeout)
    statuses: Counter = field(default_factory=Counter)  # HTTP status of every failed request
    errors: Counter = field(default_factory=Counter)  # message (first 120 chars) of failures
    mismatches: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def answered(self) -> int:
        return self.ok + self.mismatched + sum(self.statuses.values())

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) if self.latencies else 0.0

    def summary(self) -> dict:
        return {
            "sent": self.sent, "ok": self.ok, "mismatched": self.mismatched, "lost": self.lost,
            "failed": dict(self.statuses), "seconds": round(self.seconds, 2),
            "requests_per_s": round(self.sent / self.seconds, 1) if self.seconds else 0.0,
            "p50_ms": round(self.percentile(50) * 1000, 2), "p99_ms": round(self.percentile(99) * 1000, 2),
        }


async def tagged_load(url: str, tags: Iterable[int], concurrency: int, *, binary: bool = True,
                      timeout: float = 120.0, report: LoadReport | None = None) -> LoadReport:
    """Send one tagged request per tag with `concurrency` requests in flight (tritonclient's aio
    client), checking that each answer carries its own request id and its own values."""
    import tritonclient.http.aio as aioclient
    from tritonclient.utils import InferenceServerException

    report = report if report is not None else LoadReport()
    queue = iter(tags)
    client = aioclient.InferenceServerClient(url, conn_limit=concurrency, conn_timeout=timeout)
    started = time.perf_counter()

    async def one(tag: int) -> None:
        model = tagged_model(tag)
        a, b = tagged_inputs(tag)
        inputs = []
        for name, array in zip(input_names(model), (a, b)):
            tensor = aioclient.InferInput(name, list(array.shape), "FP32")
            tensor.set_data_from_numpy(array, binary_data=binary)
            inputs.append(tensor)
        expected = expected_outputs(model, a, b)
        outputs = [aioclient.InferRequestedOutput(name, binary_data=binary) for name in expected]
        request_id = f"tag-{tag}"
        report.sent += 1
        sent = time.perf_counter()
        try:
            result = await client.infer(model, inputs, request_id=request_id, outputs=outputs, timeout=int(timeout * 1e6))
        except InferenceServerException as exc:
            status = exc.status()
            if status is None:
                report.lost += 1
                report.errors[f"no answer: {exc.message()[:120]}"] += 1
            else:
                report.statuses[str(status)] += 1
                report.errors[(exc.message() or "")[:120]] += 1
            return
        except (asyncio.TimeoutError, OSError, Exception) as exc:  # aiohttp's connection errors
            report.lost += 1
            report.errors[f"no answer: {type(exc).__name__}: {str(exc)[:100]}"] += 1
            return
        report.latencies.append(time.perf_counter() - sent)
        response = result.get_response()
        problems = []
        if response.get("id") != request_id:
            problems.append(f"id {response.get('id')!r}")
        for name, values in expected.items():
            got = result.as_numpy(name)
            if got is None or got.shape != values.shape or not np.array_equal(got, values):
                problems.append(name)
        if problems:
            report.mismatched += 1
            if len(report.mismatches) < 20:
                report.mismatches.append(f"{request_id} ({model}): {', '.join(problems)}")
        else:
            report.ok += 1

    async def worker() -> None:
        for tag in queue:
            await one(tag)

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.close()
    report.seconds += time.perf_counter() - started
    return report


def run_tagged_load(url: str, tags: Iterable[int], concurrency: int, **kwargs) -> LoadReport:
    return asyncio.run(tagged_load(url, tags, concurrency, **kwargs))


# --- raw HTTP --------------------------------------------------------------------------------------------


class RawClient:
    """One keep-alive connection for raw requests (bodies no client library would send);
    reconnects when the server closed it."""

    def __init__(self, port: int, timeout: float = 60.0) -> None:
        self.port = port
        self.timeout = timeout
        self.connection: http.client.HTTPConnection | None = None

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        for attempt in (1, 2):
            if self.connection is None:
                self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)
            try:
                self.connection.request(method, path, body=body, headers=headers or {})
                response = self.connection.getresponse()
                payload = response.read()
                answer = (response.status, {k.lower(): v for k, v in response.getheaders()}, payload)
                if response.will_close:
                    self.close()
                return answer
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                self.close()  # a keep-alive connection the server closed meanwhile: retry once
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self.connection is not None:
            self.connection.close()
            self.connection = None


def error_message(payload: bytes) -> str:
    """The `{"error": "..."}` of an error answer, checked to be exactly that document."""
    document = json.loads(payload)
    assert isinstance(document, dict) and set(document) == {"error"}, document
    assert isinstance(document["error"], str) and document["error"], document
    assert "Traceback (most recent call last)" not in document["error"], document["error"]
    return document["error"]


def check_correct_answers(url: str, count: int = 30, concurrency: int = 6) -> LoadReport:
    """After a fuzz or fault run: the server still answers correctly, every model."""
    report = run_tagged_load(url, range(10**6, 10**6 + count), concurrency)
    assert report.ok == count and not report.mismatched and not report.lost, report.summary()
    return report


def wait_until(predicate: Callable[[], bool], timeout: float, message: str, interval: float = 0.01) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, message
        time.sleep(interval)


# --- tests of the harness itself -----------------------------------------------------------------


def test_tagged_values_are_exact_and_unique() -> None:
    seen = set()
    for tag in (0, 1, 2, 99_999, 100_000, 1_000_029):
        a, b = tagged_inputs(tag)
        assert a.dtype == np.float32 and a.shape == (1 + tag % 3, WIDTH)
        # exact in float32: the float64 computation gives the same values
        assert np.array_equal((a.astype(np.float64) + b.astype(np.float64)).astype(np.float32), a + b)
        assert a[0, 0] == tag  # the tag is readable from the values
        seen.add((a.tobytes(), b.tobytes()))
    assert len(seen) == 6


def test_mixed_repository_answers_tagged_requests(tmp_path: Path) -> None:
    """The three models compute what `expected_outputs` says, through the real runtime."""
    manifest = compile_manifest(build_mixed_repository(tmp_path / "models"))
    with runtime(manifest) as server:
        report = run_tagged_load(server.url, range(60), concurrency=8)
        assert report.ok == 60 and report.mismatched == 0 and report.lost == 0, report.summary()
        assert server.rss() > 0
