"""Run the real perf_analyzer (scripts/tools/perf_analyzer, 2.51) and parse what it prints.

One `Level` per concurrency level: the client side (throughput, p50/p90/p95/p99, request count)
and the server side perf_analyzer reads from the statistics extension (inference and execution
counts, so the average executed batch size, and the average request latency split into overhead,
queue, compute input, compute infer and compute output). Both servers answer the statistics
extension, so both get the same breakdown.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PERF_ANALYZER = Path(os.environ.get("TOOLKIT_PERF_ANALYZER", ROOT / "scripts" / "tools" / "perf_analyzer"))


@dataclass
class Level:
    concurrency: int
    throughput: float  # infer/s
    p50_us: int
    p90_us: int
    p95_us: int
    p99_us: int
    requests: int = 0
    inference_count: int = 0
    execution_count: int = 0
    server_request_us: int = 0  # server-side average request latency and its parts
    overhead_us: int = 0
    queue_us: int = 0
    compute_input_us: int = 0
    compute_infer_us: int = 0
    compute_output_us: int = 0
    stability: int = 0  # the --stability-percentage this level was measured with

    @property
    def batch_size(self) -> float:
        """Average executed batch size (inferences per model execution)."""
        return self.inference_count / self.execution_count if self.execution_count else 0.0

    def as_dict(self) -> dict:
        return asdict(self)


class PerfAnalyzerError(RuntimeError):
    pass


_FIELDS = {
    "requests": r"Request count: (\d+)",
    "throughput": r"Throughput: ([\d.]+) infer/sec",
    "p50_us": r"p50 latency: (\d+) usec",
    "p90_us": r"p90 latency: (\d+) usec",
    "p95_us": r"p95 latency: (\d+) usec",
    "p99_us": r"p99 latency: (\d+) usec",
    "inference_count": r"Inference count: (\d+)",
    "execution_count": r"Execution count: (\d+)",
}
_SERVER = re.compile(
    r"Avg request latency: (\d+) usec \(overhead (\d+) usec \+ queue (\d+) usec \+ compute input (\d+) usec "
    r"\+ compute infer (\d+) usec \+ compute output (\d+) usec\)"
)


def parse(output: str) -> list[Level]:
    """The levels perf_analyzer measured, from its standard output."""
    levels = []
    for block in re.split(r"^Request concurrency: ", output, flags=re.M)[1:]:
        concurrency = int(block.split(None, 1)[0])
        values: dict = {}
        for key, pattern in _FIELDS.items():
            match = re.search(pattern, block)
            if match:
                values[key] = float(match.group(1)) if key == "throughput" else int(match.group(1))
        if "throughput" not in values:
            continue  # a level that failed to stabilise prints no result
        server = _SERVER.search(block)
        if server:
            names = ("server_request_us", "overhead_us", "queue_us", "compute_input_us", "compute_infer_us",
                     "compute_output_us")
            values.update({name: int(v) for name, v in zip(names, server.groups())})
        for key in ("p50_us", "p90_us", "p95_us", "p99_us"):
            values.setdefault(key, 0)
        levels.append(Level(concurrency=concurrency, **values))
    return levels


def random_input(row_shape: tuple[int, ...], batch: int, dtype: str = "float32", seed: int = 0):
    """A batch as perf_analyzer sends it by default (`--input-data random`): its data_loader fills
    one buffer with random bytes (rand() per byte) and every row of every request is that same
    buffer, read as the input's datatype. For FP32 that is values across the whole float range,
    ~0.4 % of them NaN or Inf, the same row `batch` times. An in-process ceiling must compute on
    the same data as the server, since kernels' speed depends on it (the pytorch bench's CNN runs
    ~35 % faster on all-zero input, its max-pooling most of all; a tree's path depends on its
    features)."""
    import numpy as np

    size = int(np.prod(row_shape)) * np.dtype(dtype).itemsize
    row = np.random.default_rng(seed).integers(0, 256, size=size, dtype=np.uint8).view(dtype).reshape(row_shape)
    return np.ascontiguousarray(np.broadcast_to(row, (batch, *row_shape)))


def version() -> str:
    out = subprocess.run([str(PERF_ANALYZER), "--version"], capture_output=True, text=True, timeout=600)
    match = re.search(r"(\d+\.\d+\.\d+)", out.stdout + out.stderr)
    return match.group(1) if match else "unknown"


def run(
    model: str,
    url: str,
    *,
    batch: int = 2,
    shape: str | None = None,
    concurrency: str = "2:16:2",
    measurement_ms: int = 2000,
    stability: int = 30,
    max_trials: int = 10,
    extra: tuple[str, ...] = (),
    timeout: float = 1800,
    protocol: str = "http",
    cpus: str | None = None,
) -> tuple[list[Level], str]:
    """Run perf_analyzer with the seeds' options (`-b 2 --shape ... --concurrency-range ...
    --percentile=95`) plus the window and stability options a shared 2-core machine needs.

    `cpus` (a taskset list, e.g. "0") pins perf_analyzer to those CPUs.

    Returns the levels and the full output. A level that does not stabilise within `max_trials`
    makes perf_analyzer stop: the levels before it are returned, and PerfAnalyzerError is raised
    only when none was measured.
    """
    command = [
        str(PERF_ANALYZER), "-m", model, "-u", url, "-b", str(batch), "--concurrency-range", concurrency,
        "--percentile=95", "--measurement-interval", str(measurement_ms), "--stability-percentage",
        str(stability), "--max-trials", str(max_trials), *extra,
    ]
    if shape:
        command[5:5] = ["--shape", shape]
    if protocol != "http":
        command[1:1] = ["-i", protocol]  # -i grpc: ModelInfer on the gRPC port
    if cpus is not None:
        command[:0] = ["taskset", "-c", cpus]
    out = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    text = out.stdout + out.stderr
    levels = parse(out.stdout)
    if not levels:
        raise PerfAnalyzerError(f"perf_analyzer failed ({out.returncode}): {' '.join(command)}\n{text[-3000:]}")
    return levels, text


# Stability accepted last: perf_analyzer checks nothing meaningful above 100 %, so a level is always
# reported; such levels are flagged by their `stability` in the results.
LOOSE_STABILITY = 1000


def concurrency_levels(spec: str) -> list[int]:
    """The levels of a --concurrency-range START:END:STEP."""
    parts = [int(p) for p in spec.split(":")]
    start, end, step = (parts + [parts[0], 1])[:3] if len(parts) == 1 else (parts + [1])[:3]
    return list(range(start, end + 1, step))


def run_levels(model: str, url: str, *, concurrency: str, stability: int = 30, retry_stability: int = 60,
               **options) -> list[Level]:
    """Every level of `concurrency`, even where the machine is too noisy for `stability`: levels
    perf_analyzer gave up on (it stops at the first unstable one) are measured one by one, first
    with `retry_stability`, then with LOOSE_STABILITY, so the target level is never lost."""
    wanted = concurrency_levels(concurrency)
    found: dict[int, Level] = {}
    try:
        levels, _ = run(model, url, concurrency=concurrency, stability=stability, **options)
    except PerfAnalyzerError:
        levels = []
    for level in levels:
        level.stability = stability
        found[level.concurrency] = level
    for missing in [c for c in wanted if c not in found]:
        for loosened in (retry_stability, LOOSE_STABILITY):
            try:
                levels, _ = run(model, url, concurrency=f"{missing}:{missing}", stability=loosened, **options)
            except PerfAnalyzerError:
                continue
            levels[0].stability = loosened
            found[missing] = levels[0]
            break
        else:
            raise PerfAnalyzerError(f"perf_analyzer measured nothing at concurrency {missing} for {model} at {url}")
    return [found[c] for c in wanted]
