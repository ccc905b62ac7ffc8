"""The pytorch backend against torch itself: `toolkit serve` under perf_analyzer at concurrency 16,
against the raw ceiling, the same TorchScript module called directly in-process. Target: the
server reaches >= 90 % of the ceiling.

    .venv/bin/python bench/pytorch_ceiling.py            # 3 interleaved repeats x 2 variants, ~3-4 min on 2 cores
    .venv/bin/python bench/pytorch_ceiling.py --quick    # 1 short repeat, to check it runs
    .venv/bin/python bench/pytorch_ceiling.py --model str --frontends http-native   # the guide's model, ~8 min

Model (--model): `text_cnn` (the default), a small TorchScript CNN with text_recognition's
signature (`INPUT__0` FP32 [1,32,100] -> `OUTPUT__0` FP32 [26,37]; three conv+pool stages and a
linear head, made by torch.jit.script with fixed weights, ~0.9 ms of forward per row: the serving
stack's cost shows); or `str`, the seeds' model at full size, Triton's conceptual guide's
STRModel (bench/str_model.py) traced with torch.jit.trace as a user saves it, the same
signature, ~46 ms of forward per row. Either with `max_batch_size: 8`, `dynamic_batching { }`, two
KIND_CPU instances and INTRA_OP_THREAD_COUNT 1 (torch's intra-op pool is process-wide; one
thread per call keeps the two instances from fighting over two cores, and the ceiling uses the
same setting, as it does the backend's C allocator setting, handlers/backends/pytorch/settings.py
keep_freed_memory).

Ceiling: N threads (N = the instance count), each calling the module on one batch back to back
under no_grad + inference_mode, as the backend calls it, on the data perf_analyzer sends (random
bytes, one row repeated: perf_analyzer.random_input; all-zero input ran ~35 % faster and made
the ceiling unfairly high); measured at batch sizes 2, 4, 6 and 8,
and read at the average batch size the server executed (ort_ceiling.at_batch interpolates the
time per inference). Load: perf_analyzer 2.51 `-b 2 --shape INPUT__0:1,32,100
--concurrency-range 16:16`. Repeats interleave the ceiling and the servers; the ratio is of the
medians. Front ends (--frontends, interleaved, each with its own server: servers.FRONTENDS):
uvicorn HTTP, the native HTTP front end, the native gRPC front end (perf_analyzer -i grpc).
Two CPU variants, interleaved, each with its own servers: `shared` (perf_analyzer, server and
ceiling on all CPUs, as before) and `pinned` (perf_analyzer on the first CPU, the server and the
ceiling on the others: the ratio then compares the server with torch on the same CPUs, and the
client's CPU counts for neither). Results go to bench/results/pytorch-<date>-<host>.json and a
table on stdout, whose last column says what 90 % leaves the serving stack per request
(servers.serving_budget_us): ~330 us on one CPU for `text_cnn`, where serving beside the forward
and the forward's slowdown beside it measured ~420 us (docs/performance.md, "Issue 13's >= 90 %:
where it holds, and the bound below it"); ~12 ms for `str`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import socket
import statistics
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

import ort_ceiling  # noqa: E402
import perf_analyzer  # noqa: E402
import servers  # noqa: E402

MODEL = "text_cnn"
INSTANCES = 2
TARGET = 0.90
ROWS = 2  # rows a request (perf_analyzer -b)
CONFIG = f"""name: "{MODEL}"
platform: "pytorch_libtorch"
max_batch_size: 8
input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ 1, 32, 100 ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 26, 37 ] }} ]
dynamic_batching {{ }}
instance_group [ {{ count: {INSTANCES} kind: KIND_CPU }} ]
parameters {{ key: "INTRA_OP_THREAD_COUNT" value {{ string_value: "1" }} }}
"""


def build_model(path: Path, model: str = "text_cnn") -> Path:
    import torch

    if model == "str":
        import str_model

        return str_model.save_torchscript(path)

    class TextCNN(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = torch.nn.Sequential(
                torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                torch.nn.Conv2d(32, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
                torch.nn.Conv2d(64, 128, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d((1, 26)),
            )
            self.head = torch.nn.Linear(128, 37)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            features = self.features(x).squeeze(2).permute(0, 2, 1)  # [B, 26, 128]
            return self.head(features)

    torch.manual_seed(0)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.script(TextCNN().eval()).save(str(path))
    return path


def ceiling(model: Path, batch: int, instances: int, seconds: float) -> float:
    """Inferences per second of `instances` threads calling the module in-process."""
    import torch

    from handlers.backends.pytorch import settings

    settings.keep_freed_memory()  # the allocator setting the backend's CPU instances make
    torch.set_num_threads(1)
    module = torch.jit.load(str(model))
    x = torch.from_numpy(perf_analyzer.random_input((1, 32, 100), batch))  # what the server computes on
    with torch.no_grad(), torch.inference_mode():
        for _ in range(5):
            module(x)

    def call() -> None:
        with torch.inference_mode():  # thread-local: entered by each call (microseconds per run)
            module(x)

    return servers.threads_rate([call] * instances, seconds) * batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ceiling-seconds", type=float, default=3.0)
    parser.add_argument("--model", choices=["text_cnn", "str"], default="text_cnn",
                        help="text_cnn: a small CNN (~1 ms per row); str: the guide's STRModel at full size")
    parser.add_argument("--measurement-ms", type=int, default=None,
                        help="perf_analyzer's window (default 4000; --model str: 15000, ~30 requests/s)")
    parser.add_argument("--quick", action="store_true", help="one short repeat (checks that the bench runs)")
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--variants", default="shared,pinned",
                        help="shared: perf_analyzer, server and ceiling on all CPUs; pinned: perf_analyzer on the "
                             "first CPU, server and ceiling on the others (servers.split_cpus)")
    servers.add_frontend_argument(parser)
    args = parser.parse_args()
    args.load_at_start = os.getloadavg()[0]
    if args.measurement_ms is None:
        args.measurement_ms = 15000 if args.model == "str" else 4000
    if args.quick:
        args.repeats, args.ceiling_seconds, args.measurement_ms = 1, 1.0, 1000

    with tempfile.TemporaryDirectory(prefix="pytorch-bench-") as folder:
        _run(args, Path(folder))


def _run(args: argparse.Namespace, work: Path) -> None:
    repo = work / "models"
    model = build_model(repo / MODEL / "1" / "model.pt", args.model)
    (repo / MODEL / "config.pbtxt").write_text(CONFIG)
    sizes = [2, 4, 6, 8]
    arms = servers.arms(args.variants, args.frontends)
    variants = list(dict.fromkeys(arm.variant for arm in arms))
    server_cpus = {arm.variant: arm.server_cpus for arm in arms}
    ceilings: dict[str, dict[int, list[float]]] = {v: {b: [] for b in sizes} for v in variants}
    runs: dict[str, list[perf_analyzer.Level]] = {arm.name: [] for arm in arms}
    with contextlib.ExitStack() as stack:
        urls = {}
        for arm in arms:  # one server per arm, all started first: the repeats interleave them
            urls[arm.name] = stack.enter_context(servers.toolkit_serve(
                repo, work / f"serve-{arm.name.replace('/', '-')}.log", cpus=arm.server_cpus, frontend=arm.frontend))
            perf_analyzer.run(MODEL, urls[arm.name], batch=ROWS, shape="INPUT__0:1,32,100", concurrency="16:16",
                              measurement_ms=1000,
                              stability=perf_analyzer.LOOSE_STABILITY, max_trials=3, cpus=arm.client_cpus,
                              protocol=arm.frontend.protocol)  # warm-up
        for repeat in range(args.repeats):
            for variant in variants:  # the ceiling depends on the CPUs only, not on the front end
                with servers.pinned(server_cpus[variant]):
                    for batch in sizes:
                        ceilings[variant][batch].append(ceiling(model, batch, INSTANCES, args.ceiling_seconds))
                for arm in servers.rotated([arm for arm in arms if arm.variant == variant], repeat):
                    (level,) = perf_analyzer.run_levels(
                        MODEL, urls[arm.name], concurrency="16:16", batch=ROWS, shape="INPUT__0:1,32,100",
                        measurement_ms=args.measurement_ms, max_trials=5, cpus=arm.client_cpus,
                        protocol=arm.frontend.protocol)
                    runs[arm.name].append(level)
                    print(f"repeat {repeat + 1}, {arm.name}: toolkit serve {level.throughput:.1f} infer/s at batch "
                          f"{level.batch_size:.2f}, ceiling at batch 8 {ceilings[variant][8][-1]:.1f} infer/s, "
                          f"load {os.getloadavg()[0]:.2f}", flush=True)

    result = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "load_at_start": args.load_at_start,
        "load_at_end": os.getloadavg()[0],
        "model": (f"{MODEL}: TorchScript CNN" if args.model == "text_cnn" else
                  f"{MODEL} (its name in the repository): the guide's STRModel at full size, torch.jit.trace")
        + f", FP32 [1,32,100] -> [26,37], max_batch_size 8, {INSTANCES} instances",
        "target": TARGET,
        "repeats": args.repeats,
        "variants": {},
    }
    for arm in arms:
        medians = {(INSTANCES, b): statistics.median(v) for b, v in ceilings[arm.variant].items()}
        served = statistics.median(level.throughput for level in runs[arm.name])
        batch = statistics.median(level.batch_size for level in runs[arm.name])
        ceiling_at = ort_ceiling.at_batch(medians, INSTANCES, batch)
        ratio = served / ceiling_at if ceiling_at else 0.0
        result["variants"][arm.name] = {
            "variant": arm.variant,
            "frontend": arm.frontend.as_dict(),
            "cpus": arm.where,
            "ceiling": {str(b): v for (_, b), v in medians.items()},
            "served": [level.as_dict() for level in runs[arm.name]],
            "served_median": served,
            "average_batch": batch,
            "ceiling_at_batch": ceiling_at,
            "ratio": ratio,
            "serving_budget_us": servers.serving_budget_us(ceiling_at, ROWS, arm.server_cpus, TARGET) if ceiling_at else 0.0,
        }
    print(f"\nmedians of {args.repeats}, c16, load {args.load_at_start:.2f} at start, {os.getloadavg()[0]:.2f} at end:")
    print("| variant | front end | toolkit serve (infer/s) | avg batch | ceiling there (infer/s) | % of ceiling | >= 90 % "
          "| 90 % leaves serving (CPU us/request) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, entry in result["variants"].items():
        print(f"| {entry['variant']} | {entry['frontend']['name']} | {entry['served_median']:.1f} | "
              f"{entry['average_batch']:.2f} | {entry['ceiling_at_batch']:.1f} | {entry['ratio']:.1%} | "
              f"{'met' if entry['ratio'] >= TARGET else 'NOT met'} | {entry['serving_budget_us']:.0f} |")
    for variant in variants:
        print(f"ceiling, {variant}: " + ", ".join(f"batch {b}: {statistics.median(v):.1f}"
                                                  for b, v in ceilings[variant].items()))
    if not args.quick:
        name = "pytorch" if args.model == "text_cnn" else "pytorch-str"
        output = args.output or BENCH / "results" / f"{name}-{dt.date.today().isoformat()}-{socket.gethostname()}.json"
        output.write_text(json.dumps(result, indent=2) + "\n")
        print(f"results: {output}")


if __name__ == "__main__":
    main()
