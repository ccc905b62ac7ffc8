"""The seeds' experiment, reproduced on this CPU: dynamic batching and instance groups, `toolkit
serve` against the real tritonserver, measured by the real perf_analyzer. One command:

    .venv/bin/python bench/serve_vs_triton.py            # ~50 min on 2 cores; --quick: ~5 min
    .venv/bin/python bench/serve_vs_triton.py --protocol grpc   # the same over gRPC (perf_analyzer -i grpc)

writes bench/results/<date>-<host>.md (tables, targets, profile), its PNG plots and the raw
results (.json; `--render FILE.json` renders them again without measuring).

Models (bench/perf_models.py): `text_recognition`, the seeds' ResNet + CTC model (input.1 FP32
[1,32,100] -> 308 [26,37], max_batch_size 8 as in Triton's conceptual guide, part 2) built with
onnx.helper at x0.25 width, and `tiny`, a 16x16 MatMul whose cost is the serving stack's own
per-request overhead; `text_recognition_full` (bench/str_model.py, needs a CPU torch): the
guide's own STRModel at full width exported with torch.onnx.export as the guide does, served as
`text_recognition` with the guide's config verbatim (KIND_GPU -> KIND_CPU) and no thread
parameters, so the runtime's CPU budget sets its threads.

Configurations, every one with an explicit `instance_group { count, kind: KIND_CPU }` and ORT
intra-op threads from the config's `intra_op_thread_count` (default 1, `--ort-threads`):
(1) no dynamic batching, 1 instance; (2) dynamic batching, 1 instance; (3) dynamic batching,
2 instances; (4a/4b) as (3) with max_queue_delay_microseconds 10 / 100. The tiny model runs (1)
and (2). text_recognition_full runs the seeds' three: (1), (2) and (T), the guide's
`dynamic_batching { }` with 2 instances; its Triton gets `--ort-threads` = CPUs / instances
per configuration, the count the runtime's CPU budget chooses by itself (Triton's onnxruntime
backend would otherwise give every session all the cores).

Load: perf_analyzer 2.51 with the seeds' command `-b 2 --shape input.1:1,32,100
--concurrency-range 2:16:2 --percentile=95` (plus measurement window and stability options for a
shared 2-core machine), against both servers on the same repository; `--protocol grpc` sends the same load with
`-i grpc` to both servers' gRPC ports (Triton's 8001 equivalent, `toolkit serve --grpc-port`) and
writes its results beside, suffixed `-grpc`. Both servers run during a
configuration's measurements; the repeats alternate which one goes first (interleaved); ratios
are of the medians. The raw ceiling is ONNX Runtime alone, in-process, at the batch sizes the
batcher forms. Triton is tritonserver 2.51 from scripts/tools/tritonserver (python backend +
ONNX Runtime, docs/tools.md), labelled as such.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

import ort_ceiling  # noqa: E402
import perf_analyzer  # noqa: E402
import perf_models  # noqa: E402
import str_model  # noqa: E402
import report  # noqa: E402
import server_profile  # noqa: E402
import servers  # noqa: E402

TEXT = "text_recognition"
TINY = "tiny"
FULL = "text_recognition_full"
# The model name the servers and perf_analyzer use (the seeds' command: -m text_recognition).
SERVED = {TEXT: "text_recognition", TINY: "tiny", FULL: "text_recognition"}


_CONFIG = """name: "{name}"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "{input}" data_type: TYPE_FP32 dims: [ {dims} ] }} ]
output [ {{ name: "{output}" data_type: TYPE_FP32 dims: [ {out_dims} ] }} ]
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
parameters {{ key: "intra_op_thread_count" value: {{ string_value: "{threads}" }} }}
parameters {{ key: "inter_op_thread_count" value: {{ string_value: "1" }} }}
{batching}"""

_SIGNATURES = {
    TEXT: {"input": "input.1", "dims": "1, 32, 100", "output": "308", "out_dims": "26, 37",
           "shape": "input.1:1,32,100"},
    TINY: {"input": "INPUT0", "dims": "16", "output": "OUTPUT0", "out_dims": "16", "shape": None},
}
_SIGNATURES[FULL] = _SIGNATURES[TEXT]


@dataclass(frozen=True)
class BenchConfig:
    key: str
    title: str
    instances: int
    delay_us: int | None  # None: no dynamic batching

    def pbtxt(self, model: str, threads: int) -> str:
        if model == FULL:  # the guide's text; (1) and (2) are its config without batching / with 1 instance
            text = str_model.guide_config("KIND_CPU", self.instances)  # this machine has no GPU
            return text if self.delay_us is not None else text.replace("dynamic_batching { }\n\n", "")
        if self.delay_us is None:
            batching = ""
        elif self.delay_us == 0:
            batching = "dynamic_batching { }\n"
        else:
            batching = f"dynamic_batching {{ max_queue_delay_microseconds: {self.delay_us} }}\n"
        signature = {k: v for k, v in _SIGNATURES[model].items() if k != "shape"}
        return _CONFIG.format(name=model, instances=self.instances, threads=threads, batching=batching, **signature)

    def as_dict(self) -> dict:
        return {"key": self.key, "title": self.title, "instances": self.instances, "delay_us": self.delay_us}


CONFIGS = {
    TEXT: [
        BenchConfig("1", "no dynamic batching, 1 instance", 1, None),
        BenchConfig("2", "dynamic batching, 1 instance", 1, 0),
        BenchConfig("3", "dynamic batching, 2 instances", 2, 0),
        BenchConfig("4a", "dynamic batching, 2 instances, delay 10 us", 2, 10),
        BenchConfig("4b", "dynamic batching, 2 instances, delay 100 us", 2, 100),
    ],
    TINY: [
        BenchConfig("1", "no dynamic batching, 1 instance", 1, None),
        BenchConfig("2", "dynamic batching, 1 instance", 1, 0),
    ],
    FULL: [
        BenchConfig("1", "no dynamic batching, 1 instance", 1, None),
        BenchConfig("2", "dynamic batching, 1 instance", 1, 0),
        BenchConfig("T", "the guide's config: dynamic_batching { }, 2 instances", 2, 0),
    ],
}


def cpus() -> int:
    """The CPUs the runtime's CPU budget divides on this machine."""
    from handlers.cpu_budget import available_cpus

    return available_cpus().cpus


def budget_threads(instances: int) -> int:
    """Intra-op threads per session that the CPU budget gives `instances` instances of one model."""
    return max(1, cpus() // instances)


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def _wait_quiet(max_load: float, patience_s: float) -> float:
    """Wait (up to `patience_s`) for the 1-minute load average to drop below `max_load`."""
    deadline = time.monotonic() + patience_s
    load = os.getloadavg()[0]
    while load >= max_load and time.monotonic() < deadline:
        _log(f"load average {load:.2f} >= {max_load}: waiting for a quiet machine")
        time.sleep(15)
        load = os.getloadavg()[0]
    return load


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=30)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                               text=True, timeout=30).stdout.strip()
        return out.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except OSError:
        return "unknown"


def _build_model(model: str, path: Path, width: float) -> Path:
    if model == FULL:
        try:
            return str_model.export(path)
        except ImportError:
            raise SystemExit("text_recognition_full needs torch (a CPU build): pip install torch==2.13.0 from "
                             "PyTorch's CPU wheel index, or leave it out with --models text_recognition,tiny") from None
    return perf_models.text_recognition(path, width=width) if model == TEXT else perf_models.tiny(path)


def _feeds(model: str):
    import numpy as np

    rng = np.random.default_rng(0)
    if model in (TEXT, FULL):
        return lambda batch: {"input.1": rng.random((batch, 1, 32, 100), dtype=np.float32)}
    return lambda batch: {"INPUT0": rng.random((batch, 16), dtype=np.float32)}


def _per_inference_ms(onnx: Path, model: str) -> dict[int, float]:
    """ORT alone, one session: milliseconds per run at batch 1, 2 and 8."""
    config = {"parameters": {"intra_op_thread_count": {"string_value": "1"},
                             "inter_op_thread_count": {"string_value": "1"}}}
    times = {}
    for batch in (1, 2, 8):
        rate = ort_ceiling.throughput(onnx, config, _feeds(model)(batch), 1, 2.0)
        times[batch] = 1000 * batch / rate
    return times


def measure_model(model: str, args: argparse.Namespace, work: Path, data: dict) -> None:
    configs = [c for c in CONFIGS[model] if not args.configs or f"{model}:{c.key}" in args.configs
               or c.key in args.configs]
    onnx = _build_model(model, work / "models" / f"{model}.onnx", args.width)
    cost = _per_inference_ms(onnx, model)
    signature = _SIGNATURES[model]
    if model == FULL:
        import torch

        description = (
            f"The guide's own STRModel (bench/str_model.py: None-ResNet-None-CTC, output_channels 512, 37 classes) "
            f"exported with torch.onnx.export (torch {torch.__version__}, TorchScript exporter, as the guide), served as "
            f"`text_recognition` with the guide's config.pbtxt verbatim (KIND_GPU -> KIND_CPU; (1) and (2) drop its "
            f"dynamic_batching / use 1 instance), `input.1` FP32 [1,32,100] -> `308` FP32 [26,37], "
            f"{onnx.stat().st_size / 1e6:.0f} MB. Random weights (the guide's trained None-ResNet-None-CTC.pth is not "
            f"on PyPI; throughput does not depend on them). No thread parameters: toolkit's CPU budget gives each "
            f"session CPUs / instances threads ({cpus()} CPUs here), and Triton's model the same count through "
            f"scripts/tools/tritonserver serve --ort-threads. ONNX Runtime alone, 1 thread: {cost[1]:.1f} ms per inference at batch 1, "
            f"{cost[2]:.1f} ms per run of batch 2 (one request), {cost[8]:.1f} ms per run of batch 8.")
    elif model == TEXT:
        description = (
            f"ResNet feature extractor + CTC head (deep-text-recognition-benchmark's None-ResNet-None-CTC layout, "
            f"channel width x{args.width}), `input.1` FP32 [1,32,100] -> `308` FP32 [26,37], max_batch_size 8. "
            f"ONNX Runtime alone, 1 thread: {cost[1]:.2f} ms per inference at batch 1, {cost[2]:.2f} ms per run of "
            f"batch 2 (one request), {cost[8]:.2f} ms per run of batch 8.")
    else:
        description = (
            f"OUTPUT0 = relu(INPUT0 @ W), INPUT0 FP32 [16], max_batch_size 8: an overhead-bound model (ONNX Runtime "
            f"alone: {1000 * cost[2]:.0f} us per run of batch 2), so its throughput is the serving stack's own "
            f"per-request cost.")
    entry = {"description": description, "configs": [c.as_dict() for c in configs], "runs": {},
             "cost_ms": {str(k): v for k, v in cost.items()}}
    data["models"][model] = entry

    ceiling_samples: dict[tuple[int, int], list[float]] = {}
    if model in (TEXT, FULL) and not args.no_ceiling:
        if model == FULL:  # the guide's config sets no threads: the CPU budget's share, as the runtime
            parameters, threads, how = {}, budget_threads, f"the CPU budget's CPUs / instances = {cpus()} / N"
            seconds = args.full_ceiling_seconds
            when = ("measured in every repeat right after the two servers' runs (interleaved: a run of "
                    "~0.3 s per batch moves with the machine's load as much as the servers do)")
        else:
            parameters = {"parameters": {"intra_op_thread_count": {"string_value": str(args.ort_threads)},
                                         "inter_op_thread_count": {"string_value": "1"}}}
            threads, how = None, f"{args.ort_threads}"
            seconds, when = args.ceiling_seconds, "measured before the servers"
            _log(f"{model}: raw ORT ceiling")
            instances = sorted({c.instances for c in configs})
            ceilings = ort_ceiling.measure(onnx, parameters, _feeds(model), [2, 4, 6, 8], instances,
                                           seconds=seconds, repeats=args.repeats, threads=threads)
            ceiling_samples = {key: [value] for key, value in ceilings.items()}
        entry["ceiling_note"] = (
            f"N threads on sessions as the runtime makes them (its session options: {how} intra-op "
            f"thread(s); one session shared by the N threads where the runtime's instances share one, "
            f"at 1 intra-op thread each, else one each), running `session.run` back to back for {seconds:.0f} s, {when}; median of "
            f"{args.repeats}. The ceiling of a configuration is this table at the average batch size its batcher "
            "executed (per-inference time interpolated between measured sizes).")

    measurement_ms = {TEXT: args.measurement_ms, TINY: args.tiny_measurement_ms, FULL: args.full_measurement_ms}[model]
    served = SERVED[model]
    for cfg in configs:
        repo = work / f"{model}-{cfg.key}"
        (repo / served / "1").mkdir(parents=True, exist_ok=True)
        os.link(onnx, repo / served / "1" / "model.onnx")
        (repo / served / "config.pbtxt").write_text(cfg.pbtxt(model, args.ort_threads))
        runs: dict[str, list] = {servers.TOOLKIT: [], servers.TRITON: []}
        entry["runs"][cfg.key] = runs
        anchor_threads = budget_threads(cfg.instances) if model == FULL else args.ort_threads
        _log(f"{model} ({cfg.key}) {cfg.title}: starting both servers")
        with servers.running([servers.TOOLKIT, servers.TRITON], repo, ort_threads=anchor_threads,
                             ort_version=args.ort_version, logs=work / "logs", workers=args.toolkit_workers) as started:
            for kind, server in started.items():  # warm-up, not recorded (no stability asked)
                try:
                    perf_analyzer.run(served, server.address(args.protocol), shape=signature["shape"],
                                      protocol=args.protocol, concurrency=f"{args.target}:{args.target}",
                                      measurement_ms=max(1000, measurement_ms if model == FULL else 0),
                                      stability=perf_analyzer.LOOSE_STABILITY, max_trials=3)
                except perf_analyzer.PerfAnalyzerError as exc:  # it warmed up all the same
                    _log(f"  warm-up of {kind}: {str(exc).splitlines()[-1]}")
            if model == FULL:
                entry.setdefault("plans", {})[cfg.key] = _plan_lines(repo)
            for repeat in range(args.repeats):
                order = [servers.TOOLKIT, servers.TRITON] if repeat % 2 == 0 else [servers.TRITON, servers.TOOLKIT]
                for kind in order:
                    levels = perf_analyzer.run_levels(
                        served, started[kind].address(args.protocol), shape=signature["shape"],
                        concurrency=args.concurrency, measurement_ms=measurement_ms, stability=args.stability,
                        max_trials=args.max_trials, protocol=args.protocol)
                    runs[kind].append([level.as_dict() for level in levels])
                    last = levels[-1]
                    _log(f"  repeat {repeat + 1} {kind:8s} c{last.concurrency}: {last.throughput:8.1f} infer/s, "
                         f"p95 {last.p95_us / 1000:.1f} ms, batch {last.batch_size:.2f}")
                if model == FULL and not args.no_ceiling:
                    ceilings = ort_ceiling.measure(onnx, parameters, _feeds(model), [2, 4, 6, 8], [cfg.instances],
                                                   seconds=args.full_ceiling_seconds, repeats=1, threads=threads)
                    for key, value in ceilings.items():
                        ceiling_samples.setdefault(key, []).append(value)
                    _log(f"  repeat {repeat + 1} ORT alone, {cfg.instances} instance(s), batch 8: "
                         f"{ceilings[(cfg.instances, 8)]:.1f} infer/s")
    if ceiling_samples:
        entry["ceiling"] = [[i, b, statistics.median(values)] for (i, b), values in sorted(ceiling_samples.items())]


def _plan_lines(repo: Path) -> list[str]:
    """The CPU budget `toolkit serve` plans (and logs at startup) for `repo` on this machine."""
    from handlers import cpu_budget
    from toolkit.repository.compile import compile_repository

    compiled = compile_repository(repo, None, "cpu")
    return cpu_budget.plan(compiled.models.values(), cpu_budget.available_cpus()).lines()


def profile_model(model: str, key: str, args: argparse.Namespace, work: Path) -> str:
    """py-spy on toolkit serve while perf_analyzer drives it at the target concurrency."""
    repo = work / f"{model}-{key}"
    signature = _SIGNATURES[model]
    served = SERVED[model]
    with servers.running([servers.TOOLKIT], repo, ort_threads=args.ort_threads, ort_version=args.ort_version,
                         logs=work / "logs") as started:
        server = started[servers.TOOLKIT]
        seconds = 8.0
        measured: list = []

        def load() -> None:
            levels, _ = perf_analyzer.run(served, server.address(args.protocol), shape=signature["shape"],
                                          concurrency=f"{args.target}:{args.target}", measurement_ms=5000,
                                          stability=perf_analyzer.LOOSE_STABILITY, max_trials=3,
                                          protocol=args.protocol)
            measured.extend(levels)

        folded = server_profile.record_under_load(server.python_pid(), seconds, work / f"profile-{model}-{key}.txt",
                                                  load)
    summary = server_profile.summarise(folded)
    under = f"{measured[0].throughput:.1f} infer/s" if measured else "n/a"
    return (f"py-spy, {seconds:.0f} s at 250 Hz, `toolkit serve` on {model} config ({key}) under perf_analyzer at "
            f"concurrency {args.target} ({under} while sampled; sampling slows it down a little).\n\n"
            + server_profile.markdown(summary, seconds))



def _http_front_end() -> str:
    """The HTTP front end toolkit serve runs here (handlers/entrypoints/server.py chooses it)."""
    from handlers.entrypoints.server import http_frontend

    if http_frontend() == "native":
        return "native HTTP front end (libevent's evhttp on its own thread) feeding the asyncio loop on uvloop"
    return "uvicorn + httptools + uvloop"


def _grpc_front_end() -> str:
    """The gRPC front end toolkit serve runs here (handlers/protocol/grpc/server.py chooses it)."""
    from handlers.protocol.grpc import server as grpc_server

    if grpc_server.frontend() == "native":
        return "native gRPC front end (grpc++ callback generic service) feeding the asyncio loop on uvloop"
    return "grpcio asyncio server on uvloop"


def recorded_command(argv: list[str]) -> str:
    """The command line a report names, without `--out`: where the files went is not part of what
    was measured, and a machine's folder does not belong in a committed result."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--out":
            skip = True
        elif not arg.startswith("--out="):
            kept.append(arg)
    return " ".join(["bench/serve_vs_triton.py", *kept])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", default="2:16:2", help="perf_analyzer --concurrency-range")
    parser.add_argument("--target", type=int, default=16, help="concurrency the targets are judged at")
    parser.add_argument("--models", default=f"{TEXT},{TINY},{FULL}")
    parser.add_argument("--configs", default="", help="only these configurations, e.g. 2,3 or text_recognition:2")
    parser.add_argument("--width", type=float, default=0.25, help="channel width of the text_recognition model")
    parser.add_argument("--ort-threads", type=int, default=1, help="intra-op threads (intra_op_thread_count) on both servers")
    parser.add_argument("--measurement-ms", type=int, default=2000)
    parser.add_argument("--tiny-measurement-ms", type=int, default=1000)
    parser.add_argument("--full-measurement-ms", type=int, default=8000,
                        help="text_recognition_full: ~10 requests/s need long windows for a stable p95")
    parser.add_argument("--stability", type=int, default=30, help="perf_analyzer --stability-percentage")
    parser.add_argument("--max-trials", type=int, default=10)
    parser.add_argument("--ceiling-seconds", type=float, default=3.0)
    parser.add_argument("--full-ceiling-seconds", type=float, default=6.0,
                        help="text_recognition_full: each ceiling window (runs of ~0.3 s: longer windows, fewer partial runs)")
    parser.add_argument("--no-ceiling", action="store_true")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--max-load", type=float, default=0.5, help="wait for a 1-minute load average below this")
    parser.add_argument("--patience", type=float, default=900, help="seconds to wait for a quiet machine")
    parser.add_argument("--quick", action="store_true", help="1 repeat, c 4:16:12, short windows (a smoke run)")
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    parser.add_argument("--render", type=Path, help="render the report of a saved .json again, measure nothing")
    parser.add_argument("--toolkit-workers", default="1",
                        help="toolkit serve --workers: N or auto (as many as each config's instances and the CPUs allow)")
    parser.add_argument("--protocol", choices=("http", "grpc"), default="http",
                        help="what perf_analyzer speaks to both servers: http (-i http) or grpc (-i grpc, gRPC ports)")
    args = parser.parse_args()

    if args.render:
        data = json.loads(args.render.read_text())
        print(report.render(data, args.render.with_suffix(".md")))
        return
    if args.quick:
        args.repeats, args.measurement_ms, args.tiny_measurement_ms = 1, 1000, 500
        if args.concurrency == parser.get_default("concurrency"):
            args.concurrency = "4:16:12"
        args.full_measurement_ms = 4000
        args.ceiling_seconds, args.full_ceiling_seconds, args.stability, args.max_trials = 1.0, 2.0, 50, 6
    args.configs = {c.strip() for c in args.configs.split(",") if c.strip()}
    import onnxruntime

    args.ort_version = onnxruntime.__version__
    started = time.monotonic()
    load = _wait_quiet(args.max_load, args.patience)
    now = dt.datetime.now()
    host = socket.gethostname()
    data: dict = {
        "meta": {
            "date": now.strftime("%Y-%m-%d %H:%M"),
            "host": host,
            "command": recorded_command(sys.argv[1:]),
            "target_concurrency": args.target,
            "protocol": args.protocol,
            "setup": {
                "machine": f"{_cpu_model()}, {os.cpu_count()} logical CPUs (perf_analyzer and the server share them)",
                "CPU budget": f"{cpus()} CPU(s) for the runtime's thread budget (handlers/cpu_budget.py)",
                "load before start": f"{load:.2f} (1-minute load average; the run waits for < {args.max_load})",
                "toolkit": f"commit {_git_commit()}, Python {platform.python_version()}, onnxruntime "
                           f"{args.ort_version}, " + (_grpc_front_end() if args.protocol == "grpc" else _http_front_end())
                           + f", --workers {args.toolkit_workers}",
                "Triton": f"tritonserver 2.51.0 via scripts/tools/tritonserver serve: python backend + ONNX Runtime "
                          f"{args.ort_version}, CPU, intra_op_thread_count={args.ort_threads} (text_recognition_full: "
                          "--ort-threads CPUs / instances) (a conservative anchor, not Triton's onnxruntime backend)",
                "perf_analyzer": f"{perf_analyzer.version()}: -i {args.protocol} -b 2 [--shape input.1:1,32,100] --concurrency-range "
                                 f"{args.concurrency} --percentile=95 --measurement-interval {args.measurement_ms} "
                                 f"(tiny: {args.tiny_measurement_ms}) --stability-percentage {args.stability} "
                                 f"--max-trials {args.max_trials}",
                "fairness": f"every config sets instance_group {{ count, kind: KIND_CPU }}; intra-op threads "
                            f"{args.ort_threads} and inter-op 1 on both servers (text_recognition_full: no thread "
                            "parameters; toolkit's CPU budget and tritonserver serve --ort-threads both give CPUs / "
                            "instances); same ONNX file; both servers up during a configuration, repeats alternate "
                            "which goes first",
                "repeats": f"{args.repeats} per (configuration, server); medians, ratios of medians",
            },
        },
        "models": {},
        "profiles": {},
        "notes": [],
    }
    work = Path(tempfile.mkdtemp(prefix="serve-vs-triton-"))
    _log(f"work directory {work}, load {load:.2f}")
    for model in [m.strip() for m in args.models.split(",") if m.strip()]:
        measure_model(model, args, work, data)
    if not args.no_profile and server_profile.py_spy():
        for model, key in ((TEXT, "3"), (TINY, "2"), (FULL, "T")):
            if model in data["models"] and key in data["models"][model]["runs"]:
                _log(f"profiling toolkit serve on {model} ({key})")
                data["profiles"][f"{model}, config ({key}), concurrency {args.target}"] = profile_model(
                    model, key, args, work)
    data["meta"]["duration_min"] = (time.monotonic() - started) / 60
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"{now.strftime('%Y-%m-%d')}-{host}" + ("-grpc" if args.protocol == "grpc" else "")
    raw = args.out / f"{name}.json"
    raw.write_text(json.dumps(data, indent=1))
    path = report.render(data, args.out / f"{name}.md")
    _log(f"wrote {path} (raw results {raw})")
    for target in report.targets(data):
        verdict = "n/a" if target.met is None else ("met" if target.met else "NOT MET")
        print(f"  {verdict:8s} {target.name}: {target.measured}")


if __name__ == "__main__":
    main()
