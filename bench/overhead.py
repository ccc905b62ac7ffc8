"""Per-request overhead of `toolkit serve` and tritonserver on the tiny model, measured robustly.

    .venv/bin/python bench/overhead.py [--protocol http|grpc] [--repeats 5] [--window 2000]
        [--variant NAME=SERVER:INSTANCES:BATCHING[:WORKERS]] ... [--json OUT.json] [--quick]
        [--input-floats N]

`--quick` is a smoke run (1 repeat, 1 s windows): it checks the script and the servers, its
numbers mean nothing.

The throughput of an overhead-bound model on a shared machine moves with whatever else runs, so
the primary number here is what the machine's load moves least: the **server's CPU time per
request** (user + system time of every process of the server, from /proc, over the requests the
server counted), beside the CPU time of the event-loop threads alone (the GIL-bound part, which
caps one Python process at about one core) and of perf_analyzer per request. Wall-clock
throughput and p95 come with them, as medians of interleaved repeats (the variants take turns,
their order rotating), together with the load average.

`--input-floats N` (default 16) widens the tiny model's input to N floats and keeps its compute
(the model takes the first 16: perf_models.wide), so each request carries 8 N bytes (`-b 2`): the
front ends' cost for large bodies, e.g. 75264 for 602 KB, about an image.

Variants (default: the set in docs/performance.md, "Per-request overhead"): SERVER is `toolkit`
(`toolkit serve`, WORKERS processes: `--workers`; its HTTP and gRPC front ends are the default
ones, native when built; `toolkit@TOOLKIT_HTTP_FRONTEND=uvicorn` for uvicorn), `toolkit-native` or `toolkit-grpcio` (`toolkit serve` with TOOLKIT_GRPC_FRONTEND set
to that front end), `toolkit-granian` (`toolkit serve` with granian in place of uvicorn:
bench/granian_serve.py, one process), or `triton` (scripts/tools/tritonserver, its
python backend running ONNX Runtime, as bench/servers.py); SERVER may end in `@NAME=VALUE`s,
environment variables for that variant's server (`@source=DIR`: run `toolkit serve` from that
checkout instead of this one, e.g. a `git worktree` of the commit before a change, so before and
after are variants of one interleaved run); INSTANCES the instance_group count;
BATCHING 1 for `dynamic_batching { }`, 0 for none. The load is perf_analyzer 2.51: `-b 2` at
concurrency 16 (`--concurrency`). Over gRPC, perf_analyzer's concurrent clients share a channel
(one HTTP/2 connection) by default, and SO_REUSEPORT spreads connections, not requests: all of it
reaches one worker. `--grpc-channel-share 1` (TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT,
tritonclient's own setting, for both servers) gives each client its own connection. Each
variant's executed batch sizes (the statistics extension's batch_stats, before and after) give
its batch-size histogram.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import perf_analyzer  # noqa: E402
import perf_models  # noqa: E402
from perf_analyzer import ROOT  # noqa: E402
from servers import TRITONSERVER, free_port  # noqa: E402

CONFIG = """name: "tiny"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {floats} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
parameters {{ key: "intra_op_thread_count" value: {{ string_value: "1" }} }}
parameters {{ key: "inter_op_thread_count" value: {{ string_value: "1" }} }}
{batching}"""

DEFAULT_VARIANTS = [
    "toolkit (1 instance)=toolkit:1:1:1",
    "toolkit (2 instances)=toolkit:2:1:1",
    "toolkit --workers 2 (2 instances)=toolkit:2:1:2",
    "Triton (1 instance)=triton:1:1",
    "Triton (2 instances)=triton:2:1",
]
TICKS = os.sysconf("SC_CLK_TCK")
GRPC_SHARE_ENV = "TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT"


def repository(root: Path, instances: int, batching: bool, floats: int = 16) -> Path:
    """The tiny model's repository; `floats` > 16 widens its input (the model computes on the
    first 16: perf_models.wide), so requests carry large bodies at the same compute."""
    repo = root / f"tiny-{instances}-{int(batching)}-{floats}"
    if not repo.exists():
        model = repo / "tiny" / "1" / "model.onnx"
        perf_models.tiny(model) if floats == 16 else perf_models.wide(model, floats)
        (repo / "tiny" / "config.pbtxt").write_text(
            CONFIG.format(instances=instances, batching="dynamic_batching { }\n" if batching else "", floats=floats))
    return repo


def _processes() -> dict[int, tuple[int, int, str]]:
    """pid -> (parent pid, user + system ticks, command name)."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                text = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
            found[int(entry)] = (int(rest[1]), int(rest[11]) + int(rest[12]), name)
    return found


def _tree(root: int, processes: dict[int, tuple[int, int, str]]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in processes.items():
        children.setdefault(parent, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in processes:
            out.append(pid)
        todo += children.get(pid, [])
    return out


def _main_thread_ticks(pid: int) -> int:
    try:
        rest = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return int(rest[11]) + int(rest[12])
    except OSError:
        return 0


@dataclass
class Variant:
    name: str
    server: str
    instances: int
    batching: bool
    workers: int = 1
    process: subprocess.Popen | None = None
    http_port: int = 0
    grpc_port: int = 0
    runs: list[dict] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str) -> "Variant":
        name, _, spec = text.partition("=")
        parts = spec.split(":")
        return cls(name, parts[0], int(parts[1]), parts[2] == "1", int(parts[3]) if len(parts) > 3 else 1)

    def start(self, root: Path, logs: Path, floats: int = 16) -> None:
        repo = repository(root, self.instances, self.batching, floats)
        self.http_port, self.grpc_port = free_port(), free_port()
        server, *variables = self.server.split("@")
        env = dict(os.environ)
        env.update(variable.split("=", 1) for variable in variables)
        source = Path(env.pop("source", ROOT))
        if server == "triton":
            command = [str(TRITONSERVER), "serve", str(repo), "--http-port", str(self.http_port), "--grpc-port",
                       str(self.grpc_port), "--metrics-port", "0", "--ort-threads", "1"]
        else:
            command = [sys.executable, "-m", "toolkit.cli", "serve", str(repo), "--port", str(self.http_port),
                       "--grpc-port", str(self.grpc_port), "--metrics-port", "0", "--device", "cpu", "--log-level",
                       "warning", "--workers", str(self.workers)]
        if server == "toolkit-granian":
            if self.workers != 1:
                raise ValueError(f"{self.name}: bench/granian_serve.py runs one process (WORKERS 1)")
            command[1:4] = [str(Path(__file__).resolve().with_name("granian_serve.py"))]
            command[-2:] = []
        elif server.startswith("toolkit-"):
            env["TOOLKIT_GRPC_FRONTEND"] = server.removeprefix("toolkit-")
        log = logs / f"{self.name.replace(' ', '_').replace('/', '_')}.log"
        with open(log, "w") as handle:
            self.process = subprocess.Popen(command, cwd=source, stdout=handle, stderr=subprocess.STDOUT,
                                            start_new_session=True, env=env)
        deadline = time.monotonic() + 900
        while not all(self._get("/v2/health/ready")[0] == 200 for _ in range(8)):  # every worker answers
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start:\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.3)

    def _get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=30) as response:
                return response.status, response.read()
        except OSError:
            return 0, b""

    def counters(self) -> tuple[int, dict[int, int]]:
        """(successful requests, executions per batch size) from the statistics extension."""
        stats = json.loads(self._get("/v2/models/tiny/stats")[1])["model_stats"][0]
        batches = {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats["batch_stats"]}
        return int(stats["inference_stats"]["success"]["count"]), batches

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)

    def measure(self, protocol: str, concurrency: int, window_ms: int) -> dict:
        assert self.process is not None
        url = f"127.0.0.1:{self.grpc_port if protocol == 'grpc' else self.http_port}"
        requests_before, batches_before = self.counters()
        processes = _processes()
        pids = _tree(self.process.pid, processes)
        cpu_before = sum(processes[p][1] for p in pids)
        loops_before = sum(_main_thread_ticks(p) for p in pids)
        client = [0]
        done = threading.Event()

        def watch_client() -> None:  # perf_analyzer's own CPU, read while it runs
            while not done.is_set():
                ticks = sum(t for _, t, name in _processes().values() if name == "perf_analyzer")
                client[0] = max(client[0], ticks)
                time.sleep(0.05)

        watcher = threading.Thread(target=watch_client)
        watcher.start()
        started = time.monotonic()
        try:  # any stability will do: the numbers that matter are counted over the whole run
            for attempt in range(3):
                try:
                    levels, _ = perf_analyzer.run("tiny", url, concurrency=f"{concurrency}:{concurrency}",
                                                  measurement_ms=window_ms, stability=999, max_trials=6,
                                                  protocol=protocol)
                    break
                except perf_analyzer.PerfAnalyzerError:
                    if attempt == 2:
                        raise
        finally:
            done.set()
            watcher.join()
        elapsed = time.monotonic() - started
        processes = _processes()
        pids = _tree(self.process.pid, processes)
        cpu = sum(processes[p][1] for p in pids) - cpu_before
        loops = sum(_main_thread_ticks(p) for p in pids) - loops_before
        requests_after, batches_after = self.counters()
        served = requests_after - requests_before
        histogram = {size: batches_after.get(size, 0) - batches_before.get(size, 0) for size in batches_after}
        level = levels[-1]
        return {
            "cpu_us_per_request": cpu / TICKS / served * 1e6,
            "event_loop_us_per_request": loops / TICKS / served * 1e6 if self.server != "triton" else None,
            "client_us_per_request": client[0] / TICKS / served * 1e6,
            "server_cores": cpu / TICKS / elapsed,
            "infer_per_s": level.throughput,
            "p95_ms": level.p95_us / 1000,
            "requests": served,
            "batch_histogram": {k: v for k, v in sorted(histogram.items()) if v},
            "load": os.getloadavg()[0],
        }


def summary(variant: Variant) -> dict:
    runs = variant.runs
    out = {"name": variant.name, "server": variant.server, "instances": variant.instances,
           "batching": variant.batching, "workers": variant.workers}
    for key in ("cpu_us_per_request", "event_loop_us_per_request", "client_us_per_request", "server_cores",
                "infer_per_s", "p95_ms", "load"):
        values = [r[key] for r in runs if r[key] is not None]
        out[key] = statistics.median(values) if values else None
        out[key + "_range"] = (min(values), max(values)) if values else None
    histogram: dict[int, int] = {}
    for run in runs:
        for size, count in run["batch_histogram"].items():
            histogram[int(size)] = histogram.get(int(size), 0) + count
    out["batch_histogram"] = dict(sorted(histogram.items()))
    return out


def versus_triton(summary: dict, summaries: list[dict]) -> str:
    """A toolkit variant's median throughput over the Triton variant's with the same instances and
    batching (the issue's target: >= 0.8x on the tiny model at c16)."""
    if not summary["server"].startswith("toolkit"):
        return ""
    for other in summaries:
        same = (other["instances"], other["batching"]) == (summary["instances"], summary["batching"])
        if other["server"] == "triton" and same:
            return f"{summary['infer_per_s'] / other['infer_per_s']:.2f}x"
    return ""


def markdown(protocol: str, summaries: list[dict], repeats: int, concurrency: int, floats: int = 16) -> str:
    shared = os.environ.get(GRPC_SHARE_ENV) if protocol == "grpc" else None
    share = f", {GRPC_SHARE_ENV}={shared}" if shared else ""
    model = "tiny model" if floats == 16 else f"tiny model widened to {floats} input floats ({floats * 8:,} bytes a request)"
    lines = [f"{model}, perf_analyzer -i {protocol} -b 2, concurrency {concurrency}{share}; medians of {repeats} "
             "interleaved repeats (range in brackets)", "",
             "| variant | server CPU us/request | event-loop CPU us/request | perf_analyzer CPU us/request | infer/s | "
             "vs Triton | p95 ms | load |",
             "|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        loop = "n/a" if s["event_loop_us_per_request"] is None else f"{s['event_loop_us_per_request']:.0f}"
        lo, hi = s["cpu_us_per_request_range"]
        tlo, thi = s["infer_per_s_range"]
        lines.append(f"| {s['name']} | {s['cpu_us_per_request']:.0f} ({lo:.0f}-{hi:.0f}) | {loop} | "
                     f"{s['client_us_per_request']:.0f} | {s['infer_per_s']:.0f} ({tlo:.0f}-{thi:.0f}) | "
                     f"{versus_triton(s, summaries)} | {s['p95_ms']:.1f} | {s['load']:.1f} |")
    lines += ["", "Executed batch sizes (share of executions, all repeats):", "",
              "| variant | " + " | ".join(str(i) for i in range(1, 9)) + " | average |", "|---|" + "---|" * 9]
    for s in summaries:
        total = sum(s["batch_histogram"].values()) or 1
        average = sum(size * count for size, count in s["batch_histogram"].items()) / total
        cells = [f"{100 * s['batch_histogram'].get(i, 0) / total:.0f} %" for i in range(1, 9)]
        lines.append(f"| {s['name']} | " + " | ".join(cells) + f" | {average:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", action="append", help="NAME=SERVER:INSTANCES:BATCHING[:WORKERS] (repeatable)")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--window", type=int, default=2000, help="perf_analyzer's measurement window (ms)")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--json", type=Path, help="write every run here")
    parser.add_argument("--quick", action="store_true", help="1 repeat, 1 s windows (a smoke run)")
    parser.add_argument("--input-floats", type=int, default=16,
                        help="the input's width (default 16, the tiny model); wider inputs make large request bodies "
                             "for the same compute (75264: 602 KB a request of 2 rows, an image's size)")
    parser.add_argument("--grpc-channel-share", type=int,
                        help="perf_analyzer's clients per gRPC channel (TRITON_CLIENT_GRPC_CHANNEL_MAX_SHARE_COUNT; "
                             "default: tritonclient's)")
    args = parser.parse_args()
    if args.grpc_channel_share:
        os.environ[GRPC_SHARE_ENV] = str(args.grpc_channel_share)
    if args.quick:
        args.repeats, args.window = 1, 1000
    variants = [Variant.parse(v) for v in (args.variant or DEFAULT_VARIANTS)]
    scratch = Path(tempfile.mkdtemp(prefix="overhead-bench-"))
    try:
        for variant in variants:
            variant.start(scratch, scratch, args.input_floats)
        for repeat in range(args.repeats):
            shift = repeat % len(variants)
            for variant in variants[shift:] + variants[:shift]:
                run = variant.measure(args.protocol, args.concurrency, args.window)
                variant.runs.append(run)
                print(f"{variant.name} #{repeat + 1}: {run['cpu_us_per_request']:.0f} us CPU/request, "
                      f"{run['infer_per_s']:.0f} infer/s, p95 {run['p95_ms']:.1f} ms, load {run['load']:.1f}", flush=True)
    finally:
        for variant in variants:
            variant.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    summaries = [summary(v) for v in variants]
    print()
    print(markdown(args.protocol, summaries, args.repeats, args.concurrency, args.input_floats))
    if args.json:
        args.json.write_text(json.dumps({"protocol": args.protocol, "grpc_channel_share": args.grpc_channel_share,
                                         "input_floats": args.input_floats,
                                         "summaries": summaries,
                                         "runs": {v.name: v.runs for v in variants}}, indent=1))


if __name__ == "__main__":
    main()
