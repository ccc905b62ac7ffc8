"""The openvino backend against its ceiling: `toolkit serve` driven by perf_analyzer at
concurrency 16, against OpenVINO called directly in-process. Target: >= 90 % of the ceiling.

    .venv/bin/python bench/openvino_bench.py                 # 3 interleaved repeats
    .venv/bin/python bench/openvino_bench.py --quick         # 1 repeat, short windows (checks it runs)
    .venv/bin/python bench/openvino_bench.py --write-repo DIR   # only write the repository (cold start,
                                                                # image size: bench/cold_start.py, toolkit build)

Model: the benchmark's text_recognition (bench/perf_models.py: input.1 FP32 [N,1,32,100] -> 308
[N,26,37]), converted to an IR by OpenVINO (convert_model + save_model), served by the openvino
backend with max_batch_size 8, dynamic batching and `--instances` instances (default 2) with
NUM_STREAMS = instances and INFERENCE_NUM_THREADS = cores / instances, so the instances' infer
requests run in parallel streams.

Served: perf_analyzer 2.51 `-b 2 --shape input.1:1,32,100 --concurrency-range 16` against
`toolkit serve`; the server's statistics give the average batch size it executed.

Control (`--no-control` skips it): the same model as ONNX under the onnxruntime backend (2
instances, 1 intra-op thread each, as bench/serve_vs_triton.py's configuration (3)) against ONNX
Runtime in-process (bench/ort_ceiling.py), measured the same way in the same repeats: on a
shared machine its ratio tells how much of a low ratio is the machine.

Ceiling: the same compiled model (handlers.backends.openvino.compile_model, so the same
parameters), `instances` threads each with its own infer request running batches back to back,
at batch sizes 1, 2, 4 and 8; the ceiling at the served run's average batch size is interpolated
(bench/ort_ceiling.at_batch). Repeats alternate which of the two runs first; ratios are of medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

import ort_ceiling  # noqa: E402
import perf_analyzer  # noqa: E402
import servers  # noqa: E402
import perf_models  # noqa: E402

MODEL = "text_recognition_ov"
SHAPE = (1, 32, 100)
BATCH_SIZES = (1, 2, 4, 8)
CONFIG = """name: "{name}"
backend: "openvino"
max_batch_size: 8
input [ {{ name: "input.1" data_type: TYPE_FP32 dims: [ 1, 32, 100 ] }} ]
output [ {{ name: "308" data_type: TYPE_FP32 dims: [ 26, 37 ] }} ]
dynamic_batching {{ }}
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
parameters {{ key: "NUM_STREAMS" value: {{ string_value: "{instances}" }} }}
parameters {{ key: "INFERENCE_NUM_THREADS" value: {{ string_value: "{threads}" }} }}
"""


ORT_MODEL = "text_recognition_ort"
ORT_CONFIG = """name: "{name}"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "input.1" data_type: TYPE_FP32 dims: [ 1, 32, 100 ] }} ]
output [ {{ name: "308" data_type: TYPE_FP32 dims: [ 26, 37 ] }} ]
dynamic_batching {{ }}
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
parameters {{ key: "intra_op_thread_count" value: {{ string_value: "1" }} }}
parameters {{ key: "inter_op_thread_count" value: {{ string_value: "1" }} }}
"""


def write_control(directory: Path, instances: int) -> Path:
    """The control: the same model as ONNX under the onnxruntime backend."""
    repo = Path(directory)
    perf_models.text_recognition(repo / ORT_MODEL / "1" / "model.onnx")
    (repo / ORT_MODEL / "config.pbtxt").write_text(ORT_CONFIG.format(name=ORT_MODEL, instances=instances))
    return repo


def ort_ceiling_at(repo: Path, batch: int, instances: int, seconds: float) -> float:
    from toolkit.repository.compile import compile_repository

    config = compile_repository(repo).models[ORT_MODEL].config
    x = np.random.default_rng(0).standard_normal((batch, *SHAPE)).astype(np.float32)
    return ort_ceiling.throughput(repo / ORT_MODEL / "1" / "model.onnx", config, {"input.1": x}, instances, seconds)


def write_repository(directory: Path, instances: int) -> Path:
    """The benchmark's repository: text_recognition as an IR under the openvino backend."""
    import openvino as ov

    repo = Path(directory)
    version = repo / MODEL / "1"
    version.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        onnx_path = perf_models.text_recognition(Path(scratch) / "model.onnx")
        ov.save_model(ov.convert_model(str(onnx_path)), str(version / "model.xml"))
    threads = max(1, (os.cpu_count() or 1) // instances)
    (repo / MODEL / "config.pbtxt").write_text(CONFIG.format(name=MODEL, instances=instances, threads=threads))
    return repo


def ceiling(repo: Path, batch: int, instances: int, seconds: float) -> float:
    """Inferences per second of `instances` infer requests on the served model's compiled model."""
    from handlers.backends import openvino as backend
    from handlers.manifest import Manifest
    from toolkit.repository.compile import compile_repository

    compiled = compile_repository(repo)
    spec = Manifest.from_dict(compiled.manifest(), repo).models[MODEL]
    model = backend.compile_model(spec, 1)
    requests = [model.compiled.create_infer_request() for _ in range(instances)]
    x = np.random.default_rng(0).standard_normal((batch, *SHAPE)).astype(np.float32)
    for request in requests:
        request.infer({"input.1": x}, share_inputs=True)  # warm-up
    calls = [lambda request=request: request.infer({"input.1": x}, share_inputs=True) for request in requests]
    return servers.threads_rate(calls, seconds) * batch


toolkit_serve = servers.toolkit_serve  # bench/openvino_vs_ort.py imports it from here


def served(repo: Path, logs: Path, measurement_ms: int, concurrency: int, model: str = MODEL) -> perf_analyzer.Level:
    with toolkit_serve(repo, logs / f"serve-{time.monotonic_ns()}.log") as url:
        levels = perf_analyzer.run_levels(
            model, url, batch=2, shape="input.1:" + ",".join(map(str, SHAPE)),
            concurrency=str(concurrency), measurement_ms=measurement_ms, max_trials=10,
        )
    return levels[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=3.0, help="ceiling run length per batch size")
    parser.add_argument("--measurement-ms", type=int, default=3000)
    parser.add_argument("--quick", action="store_true", help="1 repeat, short windows")
    parser.add_argument("--write-repo", type=Path, help="only write the repository to this folder")
    parser.add_argument("--no-control", dest="control", action="store_false", help="skip the onnxruntime control")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.seconds, args.measurement_ms = 1, 1.0, 1000
    if args.write_repo:
        print(write_repository(args.write_repo, args.instances))
        return 0

    arms = {"openvino": (MODEL, ceiling)}
    if args.control:
        arms["onnxruntime (control)"] = (ORT_MODEL, ort_ceiling_at)
    ceilings: dict[str, dict[int, list[float]]] = {arm: {b: [] for b in BATCH_SIZES} for arm in arms}
    runs: dict[str, list[perf_analyzer.Level]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory(prefix="openvino-bench-") as scratch:
        repo = write_repository(Path(scratch) / "models", args.instances)
        if args.control:
            write_control(repo, args.instances)
        logs = Path(scratch) / "logs"
        for repeat in range(args.repeats):
            order = ("ceiling", "served") if repeat % 2 == 0 else ("served", "ceiling")
            for arm, (model, measure_ceiling) in arms.items():
                for what in order:
                    if what == "ceiling":
                        for batch in BATCH_SIZES:
                            ceilings[arm][batch].append(measure_ceiling(repo, batch, args.instances, args.seconds))
                    else:
                        runs[arm].append(served(repo, logs, args.measurement_ms, args.concurrency, model))
                last = runs[arm][-1]
                print(f"repeat {repeat + 1} {arm}: served {last.throughput:.1f} infer/s at batch {last.batch_size:.2f}; "
                      "ceiling " + ", ".join(f"b{b} {ceilings[arm][b][-1]:.1f}" for b in BATCH_SIZES), flush=True)

    print()
    print("| backend | instances | concurrency | served (infer/s) | p95 (ms) | avg batch | in-process ceiling at that batch "
          "| % of ceiling |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = {}
    for arm in arms:
        medians = {(args.instances, b): statistics.median(v) for b, v in ceilings[arm].items()}
        throughput = statistics.median(r.throughput for r in runs[arm])
        batch = statistics.median(r.batch_size for r in runs[arm])
        p95 = statistics.median(r.p95_us for r in runs[arm]) / 1000
        top = ort_ceiling.at_batch(medians, args.instances, batch)
        ratios[arm] = throughput / top if top else float("nan")
        print(f"| {arm} | {args.instances} | {args.concurrency} | {throughput:.1f} | {p95:.1f} | {batch:.2f} | {top:.1f} "
              f"| **{ratios[arm]:.0%}** |")
    print()
    for arm in arms:
        print(f"ceiling, {arm} (infer/s): " + ", ".join(
            f"batch {b}: {statistics.median(ceilings[arm][b]):.1f}" for b in BATCH_SIZES))
    print(f"target >= 90 % (openvino): {'met' if ratios['openvino'] >= 0.9 else 'NOT met'} ({args.repeats} repeat(s), "
          f"medians; load average at the end {os.getloadavg()[0]:.1f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
