"""The openvino backend against its ceiling: `toolkit serve` driven by perf_analyzer at
concurrency 16, against OpenVINO called directly in-process. Target: >= 90 % of the ceiling.

    .venv/bin/python bench/openvino_bench.py                 # 3 interleaved repeats
    .venv/bin/python bench/openvino_bench.py --quick         # 1 repeat, short windows (checks it runs)
    .venv/bin/python bench/openvino_bench.py --write-repo DIR   # only write the repository (cold start,
                                                                # image size: bench/cold_start.py, toolkit build)

Model: the benchmark's text_recognition (bench/perf_models.py: input.1 FP32 [N,1,32,100] -> 308
[N,26,37]), converted to an IR by OpenVINO (convert_model + save_model), served by the openvino
backend with max_batch_size 8, dynamic batching and `--instances` instances (default 2) with
NUM_STREAMS = instances, so the instances' infer requests run in parallel streams, and the
threads left to the runtime's CPU budget (INFERENCE_NUM_THREADS is OpenVINO's count for the whole
compiled model: until 2026-11-30 this bench set it to cores / instances, 1 on two cores, and every
ceiling and server ran the model on one thread; the results before then are of that setting).

Served: perf_analyzer 2.51 `-b 2 --shape input.1:1,32,100 --concurrency-range 16` against
`toolkit serve`; the server's statistics give the average batch size it executed.

Control (`--no-control` skips it): the same model as ONNX under the onnxruntime backend (2
instances, 1 intra-op thread each, as bench/serve_vs_triton.py's configuration (3)) against ONNX
Runtime in-process (bench/ort_ceiling.py), measured the same way in the same repeats: on a
shared machine its ratio tells how much of a low ratio is the machine.

Ceiling: the same compiled model (handlers.backends.openvino.compile_model, so the same
parameters, with the threads the CPU budget gives a server on the ceiling's CPUs), measured in a
process of its own per CPU variant (`ceilings`: OpenVINO's threads keep the CPUs they started on),
`instances` threads each with its own infer request running batches back to back,
at batch sizes 1, 2, 4 and 8; the ceiling at the served run's average batch size is interpolated
(bench/ort_ceiling.at_batch). Each repeat measures the ceilings, then every server; ratios are of
medians. Front ends (--frontends: uvicorn HTTP, the native HTTP front end, the native gRPC front
end with perf_analyzer -i grpc; servers.FRONTENDS) times two CPU variants (--variants: `shared`,
all on all CPUs; `pinned`, perf_analyzer on the first CPU, server and ceiling on the others), each
pair with its own server, all started first and interleaved. Results go to
bench/results/openvino-<date>-<host>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

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


def write_control(directory: Path, instances: int, width: float = 0.25) -> Path:
    """The control: the same model as ONNX under the onnxruntime backend."""
    repo = Path(directory)
    perf_models.text_recognition(repo / ORT_MODEL / "1" / "model.onnx", width=width)
    (repo / ORT_MODEL / "config.pbtxt").write_text(ORT_CONFIG.format(name=ORT_MODEL, instances=instances))
    return repo


def ort_ceiling_at(repo: Path, batch: int, instances: int, seconds: float) -> float:
    from toolkit.repository.compile import compile_repository

    config = compile_repository(repo).models[ORT_MODEL].config
    x = perf_analyzer.random_input(SHAPE, batch)  # the data perf_analyzer sends (random bytes, one row repeated)
    return ort_ceiling.throughput(repo / ORT_MODEL / "1" / "model.onnx", config, {"input.1": x}, instances, seconds)


def ort_ceilings(repo: Path, batches: tuple[int, ...], instances: int, seconds: float) -> dict[int, float]:
    """The control's `ort_ceiling_at` at each of `batches`, in this process (ONNX Runtime's threads
    are the calling ones, on this thread's CPUs)."""
    return {batch: ort_ceiling_at(repo, batch, instances, seconds) for batch in batches}


def write_repository(directory: Path, instances: int, width: float = 0.25) -> Path:
    """The benchmark's repository: text_recognition (`width` of the original's channels) as an IR
    under the openvino backend."""
    import openvino as ov

    repo = Path(directory)
    version = repo / MODEL / "1"
    version.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        onnx_path = perf_models.text_recognition(Path(scratch) / "model.onnx", width=width)
        ov.save_model(ov.convert_model(str(onnx_path)), str(version / "model.xml"))
    (repo / MODEL / "config.pbtxt").write_text(CONFIG.format(name=MODEL, instances=instances))
    return repo


def ceiling(repo: Path, batch: int, instances: int, seconds: float) -> float:
    """Inferences per second of `instances` infer requests on the served model's compiled model,
    compiled with the INFERENCE_NUM_THREADS a server on this thread's CPUs gives it (the runtime's
    CPU budget over the repository's models, and its rule for a version's instances together)."""
    from handlers import cpu_budget
    from handlers.backends import openvino as backend
    from handlers.instance_group import instance_slots
    from handlers.manifest import Manifest
    from toolkit.repository.compile import compile_repository

    compiled = compile_repository(repo)
    spec = Manifest.from_dict(compiled.manifest(), repo).models[MODEL]
    plan = cpu_budget.plan(compiled.models.values(), cpu_budget.available_cpus())
    share = plan.threads_for(MODEL, instance_slots(spec.config)[0])
    model = backend.compile_model(spec, 1, backend.version_threads(spec, share))
    requests = [model.compiled.create_infer_request() for _ in range(instances)]
    x = perf_analyzer.random_input(SHAPE, batch)  # the data perf_analyzer sends (random bytes, one row repeated)
    for request in requests:
        request.infer({"input.1": x}, share_inputs=True)  # warm-up
    calls = [lambda request=request: request.infer({"input.1": x}, share_inputs=True) for request in requests]
    return servers.threads_rate(calls, seconds) * batch


def ceilings(repo: Path, batches: tuple[int, ...], instances: int, seconds: float) -> dict[int, float]:
    """`ceiling` at each of `batches`, in a new process that runs on this thread's CPUs. OpenVINO's
    CPU plugin keeps its threads for the life of the process, on the CPUs it found when it made
    them: measured in this process, a ceiling pinned to one CPU after one on every CPU computed on
    both (3,499 infer/s at batch 8 against 2,135 in a process started on one CPU)."""
    context = multiprocessing.get_context("spawn")  # the child's main thread inherits this thread's CPUs
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(_ceilings, repo, batches, instances, seconds).result()


def _ceilings(repo: Path, batches: tuple[int, ...], instances: int, seconds: float) -> dict[int, float]:
    return {batch: ceiling(repo, batch, instances, seconds) for batch in batches}


toolkit_serve = servers.toolkit_serve  # bench/openvino_vs_ort.py imports it from here


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--width", type=float, default=0.25,
                        help="text_recognition's channels as a fraction of the original's: 0.25 the benchmark's "
                             "(~0.5 ms of CPU per row), 1.0 the seeds' model at full width (~16x the work)")
    parser.add_argument("--seconds", type=float, default=3.0, help="ceiling run length per batch size")
    parser.add_argument("--measurement-ms", type=int, default=3000)
    parser.add_argument("--quick", action="store_true", help="1 repeat, short windows")
    parser.add_argument("--write-repo", type=Path, help="only write the repository to this folder")
    parser.add_argument("--no-control", dest="control", action="store_false", help="skip the onnxruntime control")
    parser.add_argument("--variants", default="shared,pinned",
                        help="shared: perf_analyzer, server and ceiling on all CPUs; pinned: perf_analyzer on the "
                             "first CPU, server and ceiling on the others (servers.split_cpus)")
    servers.add_frontend_argument(parser)
    parser.add_argument("--output", type=Path, default=None, help="results JSON (default bench/results/openvino-DATE-HOST.json)")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.seconds, args.measurement_ms = 1, 1.0, 1000
    if args.write_repo:
        print(write_repository(args.write_repo, args.instances, args.width))
        return 0

    load_at_start = os.getloadavg()[0]
    models = {"openvino": (MODEL, ceilings)}  # each model's name and the function measuring its ceilings
    if args.control:
        models["onnxruntime (control)"] = (ORT_MODEL, ort_ceilings)
    arms = servers.arms(args.variants, args.frontends)
    variants = list(dict.fromkeys(arm.variant for arm in arms))
    server_cpus = {arm.variant: arm.server_cpus for arm in arms}
    table = {(v, m): {b: [] for b in BATCH_SIZES} for v in variants for m in models}
    runs: dict[tuple[str, str], list[perf_analyzer.Level]] = {(arm.name, m): [] for arm in arms for m in models}
    shape = "input.1:" + ",".join(map(str, SHAPE))
    with tempfile.TemporaryDirectory(prefix="openvino-bench-") as scratch, contextlib.ExitStack() as stack:
        repo = write_repository(Path(scratch) / "models", args.instances, args.width)
        if args.control:
            write_control(repo, args.instances, args.width)
        urls = {}
        for arm in arms:  # one server per arm (serving both models), all started first: the repeats interleave them
            urls[arm.name] = stack.enter_context(servers.toolkit_serve(
                repo, Path(scratch) / f"serve-{arm.name.replace('/', '-')}.log", cpus=arm.server_cpus,
                frontend=arm.frontend))
            for name, _ in models.values():  # warm-up
                perf_analyzer.run(name, urls[arm.name], shape=shape, concurrency=str(args.concurrency), measurement_ms=1000,
                                  stability=perf_analyzer.LOOSE_STABILITY, max_trials=3, cpus=arm.client_cpus,
                                  protocol=arm.frontend.protocol)
        for repeat in range(args.repeats):
            for variant in variants:  # the ceiling depends on the CPUs only, not on the front end
                with servers.pinned(server_cpus[variant]):
                    for label, (_, measure_ceilings) in models.items():
                        rates = measure_ceilings(repo, BATCH_SIZES, args.instances, args.seconds)
                        for batch in BATCH_SIZES:
                            table[variant, label][batch].append(rates[batch])
                for arm in servers.rotated([arm for arm in arms if arm.variant == variant], repeat):
                    for label, (name, _) in models.items():
                        [level] = perf_analyzer.run_levels(
                            name, urls[arm.name], batch=2, shape=shape, concurrency=f"{args.concurrency}:{args.concurrency}",
                            measurement_ms=args.measurement_ms, max_trials=10, cpus=arm.client_cpus,
                            protocol=arm.frontend.protocol)
                        runs[arm.name, label].append(level)
                        print(f"repeat {repeat + 1} {arm.name} {label}: served {level.throughput:.1f} infer/s at batch "
                              f"{level.batch_size:.2f}; ceiling " + ", ".join(
                                  f"b{b} {table[variant, label][b][-1]:.1f}" for b in BATCH_SIZES)
                              + f"; load {os.getloadavg()[0]:.2f}", flush=True)

    print()
    print(f"medians of {args.repeats}, c{args.concurrency}, load {load_at_start:.2f} at start, "
          f"{os.getloadavg()[0]:.2f} at end:")
    print("| backend | variant | front end | served (infer/s) | p95 (ms) | avg batch | in-process ceiling at that batch "
          "| % of ceiling |")
    print("|---|---|---|---|---|---|---|---|")
    results = []
    for arm in arms:
        for label in models:
            medians = {(args.instances, b): statistics.median(v) for b, v in table[arm.variant, label].items()}
            mine = runs[arm.name, label]
            throughput = statistics.median(r.throughput for r in mine)
            batch = statistics.median(r.batch_size for r in mine)
            p95 = statistics.median(r.p95_us for r in mine) / 1000
            top = ort_ceiling.at_batch(medians, args.instances, batch)
            ratio = throughput / top if top else float("nan")
            results.append({"backend": label, "variant": arm.variant, "cpus": arm.where, "frontend": arm.frontend.as_dict(),
                            "served": [r.as_dict() for r in mine], "served_median": throughput, "average_batch": batch,
                            "p95_ms": p95, "ceiling": {str(b): v for (_, b), v in medians.items()},
                            "ceiling_at_batch": top, "ratio": ratio})
            print(f"| {label} | {arm.variant} | {arm.frontend.name} | {throughput:.1f} | {p95:.1f} | {batch:.2f} | "
                  f"{top:.1f} | **{ratio:.0%}** |")
    print()
    for (variant, label), values in table.items():
        print(f"ceiling, {label}, {variant} (infer/s): " + ", ".join(
            f"batch {b}: {statistics.median(values[b]):.1f}" for b in BATCH_SIZES))
    best = max(r["ratio"] for r in results if r["backend"] == "openvino")
    print(f"target >= 90 % (openvino): best arm {best:.0%} ({args.repeats} repeat(s), medians)")
    if not args.quick:
        result = {"date": dt.datetime.now().isoformat(timespec="seconds"), "host": socket.gethostname(),
                  "cpus": os.cpu_count(), "load_at_start": load_at_start, "load_at_end": os.getloadavg()[0],
                  "model": f"{MODEL}: text_recognition IR (width {args.width}), max_batch_size 8, "
                           f"{args.instances} instances",
                  "concurrency": args.concurrency, "repeats": args.repeats, "target": 0.9, "results": results}
        output = args.output or BENCH / "results" / f"openvino-{dt.date.today().isoformat()}-{socket.gethostname()}.json"
        output.write_text(json.dumps(result, indent=2) + "\n")
        print(f"results: {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
