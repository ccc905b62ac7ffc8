"""`toolkit serve` with a `backend: "fil"` model against its ceiling: Treelite alone, in-process.

    .venv/bin/python bench/fil_ceiling.py                 # ~50 s per arm and repeat (defaults: 12, ~10 min); --quick: 1 short repeat
    .venv/bin/python bench/fil_ceiling.py --framework lightgbm --instances 2

A tree model trained here (XGBoost JSON or LightGBM text; --trees, --features) is served by
`toolkit serve` (max_batch_size 1024, dynamic batching, --instances KIND_CPU instances, threads
from the CPU budget: the container's CPUs shared among instances, handlers/cpu_budget.py).
perf_analyzer 2.51 sends requests of --rows rows each (perf_analyzer -b, as FIL's own
qa/run_benchmarks.sh does; default 1 and 16) at concurrency --concurrency; the server executes
batches of some average size B rows (its statistics). The ceiling is the same model predicting
batches of B rows back to back, in this process, on as many threads as instances, each instance
with its threads (the runtime's own FilModel, bench/ort_ceiling.py's method): a server that
forms batches of B cannot do better. Serve runs and ceiling runs alternate (--repeats): in each
repeat every arm is served, then each CPU variant's ceiling is measured once, at the median of the
batches its arms executed, as the median of --ceiling-windows windows (single windows of one
model differ by up to 10 % back to back on a quiet machine). The result is the ratio of medians.
Front ends (--frontends: uvicorn HTTP, the native HTTP front end, the native gRPC front end with
perf_analyzer -i grpc; servers.FRONTENDS) times two CPU variants, interleaved, each pair with its
own server (--variants):
`shared` (perf_analyzer, server and ceiling on all CPUs) and `pinned` (perf_analyzer on the first
CPU, the server and the ceiling on the others, so the client's CPU counts for neither). The
ceiling predicts the rows perf_analyzer sends (one random-bytes row, repeated). Target: >= 90 %
from 16 rows per request. The last column says what that leaves the serving stack per request
(servers.serving_budget_us): with FIL's example model (--trees 500 --depth 7 --features 500) at
16 rows, ~60-75 us of CPU on one CPU, under what any server measured here spends on a request; at
FIL's own 128 and 1,024 rows, 0.5-4.7 ms (docs/performance.md, "Issue 13's >= 90 %: where it
holds, and the bound below it"). With one row per request a cheap model measures the serving
stack (HTTP, codec and batching, ~100-200 us per request in one Python event loop:
docs/performance.md, "tiny") and is reported without a target. Writes bench/results/<date>-fil-<framework>-<host>.json.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

import perf_analyzer
import servers  # noqa: E402

MODEL = "trees"
CONFIG = """backend: "fil"
max_batch_size: 1024
input [ {{ name: "input__0" data_type: TYPE_FP32 dims: [ {features} ] }} ]
output [ {{ name: "output__0" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
dynamic_batching {{ }}
parameters [
  {{ key: "model_type" value: {{ string_value: "{model_type}" }} }},
  {{ key: "is_classifier" value: {{ string_value: "true" }} }},
  {{ key: "predict_proba" value: {{ string_value: "true" }} }},
  {{ key: "threshold" value: {{ string_value: "0.5" }} }}{nthread}
]
"""


def make_repository(root: Path, framework: str, trees: int, features: int, instances: int,
                    cpu_nthread: int | None = None, depth: int = 6) -> Path:
    rng = np.random.default_rng(0)
    X = rng.standard_normal((20000, features)).astype(np.float32)
    y = ((X[:, 0] + X[:, 1] * X[:, 2] + 0.5 * rng.standard_normal(len(X))) > 0).astype(int)
    version = root / MODEL / "1"
    version.mkdir(parents=True)
    if framework == "xgboost":
        import xgboost

        booster = xgboost.train({"objective": "binary:logistic", "max_depth": depth, "nthread": 1}, xgboost.DMatrix(X, label=y), trees)
        booster.save_model(version / "xgboost.json")
        model_type = "xgboost_json"
    else:
        import lightgbm

        booster = lightgbm.train({"objective": "binary", "num_leaves": 2 ** depth - 1, "verbose": -1, "num_threads": 1},
                                 lightgbm.Dataset(X, label=y), trees)
        booster.save_model(version / "model.txt")
        model_type = "lightgbm"
    (root / MODEL / "config.pbtxt").write_text(
        CONFIG.format(features=features, instances=instances, model_type=model_type,
                      nthread="" if cpu_nthread is None else
                      f',\n  {{ key: "cpu_nthread" value: {{ string_value: "{cpu_nthread}" }} }}')
    )
    return root


def ceiling(repo: Path, batch: int, instances: int, seconds: float, windows: int = 1) -> list[float]:
    """Rows per second of `instances` threads each predicting batches of `batch` rows with its own
    copy of the model, as the runtime's instances do: one rate per window of `seconds`, the models
    loaded once."""
    from handlers import cpu_budget
    from handlers.backends.fil.instance import prediction_threads
    from handlers.backends.fil.model import load_model
    from handlers.backends.fil.parameters import parse_parameters
    from handlers.backends.fil.tensors import tensor_layout
    from handlers.instance_group import instance_slots
    from toolkit.repository.compile import compile_repository

    compiled = compile_repository(repo).models[MODEL]
    config = compiled.config
    params = parse_parameters(config)
    layout = tensor_layout(config)
    # the runtime's threads: the CPU budget's share of the first instance (they are equal or 1 apart)
    plan = cpu_budget.plan([compiled], cpu_budget.available_cpus())
    threads = prediction_threads(params.cpu_nthread, plan.threads_for(MODEL, instance_slots(config)[0]))
    path = compiled.path / compiled.model_files[1]
    models = [load_model(path, config, params, layout) for _ in range(instances)]
    rows = perf_analyzer.random_input((layout.features,), batch)  # the rows the server predicts
    for model in models:
        model.predict(rows, threads)
    try:
        calls = [lambda model=model: model.predict(rows, threads) for model in models]
        return [servers.threads_rate(calls, seconds) * batch for _ in range(windows)]
    finally:
        for model in models:
            model.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--framework", choices=["xgboost", "lightgbm"], default="xgboost")
    parser.add_argument("--trees", type=int, default=300)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--depth", type=int, default=6,
                        help="XGBoost max_depth (LightGBM: num_leaves 2^depth - 1). FIL's own example XGBoost model "
                             "(its qa/generate_example_models.sh): --trees 500 --depth 7 --features 500")
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--cpu-nthread", type=int, default=None,
                        help="FIL's cpu_nthread parameter (default: unset, the CPU budget's share)")
    parser.add_argument("--variants", default="shared,pinned",
                        help="shared: perf_analyzer, server and ceiling on all CPUs; pinned: perf_analyzer on the "
                             "first CPU, server and ceiling on the others (servers.split_cpus)")
    servers.add_frontend_argument(parser)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rows", default="1,16", help="rows per request (perf_analyzer -b), comma-separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--measurement-ms", type=int, default=3000)
    parser.add_argument("--ceiling-windows", type=int, default=3,
                        help="windows of --measurement-ms the ceiling is the median of, per variant and repeat")
    parser.add_argument("--quick", action="store_true", help="1 repeat, short windows: checks the bench runs")
    parser.add_argument("--output", type=Path, default=BENCH / "results")
    parser.add_argument("--write-repository", type=Path, metavar="DIR",
                        help="only write the bench's repository to DIR (e.g. for bench/cold_start.py) and exit")
    args = parser.parse_args()
    if args.write_repository:
        make_repository(args.write_repository, args.framework, args.trees, args.features, args.instances,
                        depth=args.depth)
        print(f"wrote {args.write_repository / MODEL}")
        return
    if args.quick:
        args.repeats, args.measurement_ms, args.ceiling_windows = 1, 1000, 1

    sizes = [int(r) for r in args.rows.split(",")]
    arms = servers.arms(args.variants, args.frontends)
    load_at_start = os.getloadavg()[0]
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        repo = make_repository(Path(tmp) / "models", args.framework, args.trees, args.features, args.instances,
                               args.cpu_nthread, args.depth)
        urls = {}
        for arm in arms:  # one server per arm, all started first: the repeats interleave them
            urls[arm.name] = stack.enter_context(servers.toolkit_serve(
                repo, Path(tmp) / f"serve-{arm.name.replace('/', '-')}.log", timeout=120, cpus=arm.server_cpus,
                frontend=arm.frontend))
        for repeat in range(args.repeats):
            levels: dict[tuple[str, int], perf_analyzer.Level] = {}
            for arm in servers.rotated(arms, repeat):
                for rows in sizes:
                    [levels[arm.name, rows]] = perf_analyzer.run_levels(
                        MODEL, urls[arm.name], concurrency=f"{args.concurrency}:{args.concurrency}", batch=rows,
                        measurement_ms=args.measurement_ms, stability=30 if not args.quick else 999,
                        cpus=arm.client_cpus, protocol=arm.frontend.protocol,
                    )
            # one ceiling per CPU variant and request size in each repeat, after its arms, at the median
            # of the batches they executed (they differ by a few rows), each the median of
            # --ceiling-windows windows: single windows of this model differ by up to 10 % back to back
            for variant in dict.fromkeys(arm.variant for arm in arms):
                mine = [arm for arm in arms if arm.variant == variant]
                for rows in sizes:
                    batch = max(1, round(statistics.median(levels[arm.name, rows].batch_size for arm in mine)))
                    with servers.pinned(mine[0].server_cpus):
                        windows = ceiling(repo, batch, args.instances, args.measurement_ms / 1000,
                                          args.ceiling_windows)
                    limit = statistics.median(windows)
                    for arm in mine:
                        level = levels[arm.name, rows]
                        runs.append({"variant": arm.variant, "frontend": arm.frontend.name, "repeat": repeat,
                                     "rows": rows, "level": level.as_dict(), "batch": level.batch_size,
                                     "ceiling_batch": batch, "ceiling": limit, "ceiling_windows": windows,
                                     "ratio": level.throughput / limit, "load": os.getloadavg()[0]})
                        print(f"repeat {repeat}, {arm.name}, {rows} row(s)/request: serve {level.throughput:.0f} "
                              f"infer/s (p95 {level.p95_us / 1000:.2f} ms, batches of {level.batch_size:.1f} rows), "
                              f"ceiling at {batch} rows: {limit:.0f} infer/s (windows "
                              f"{', '.join(f'{w:.0f}' for w in windows)}), {100 * level.throughput / limit:.1f} %, "
                              f"load {os.getloadavg()[0]:.2f}", flush=True)

    summary = []
    for arm in arms:
        variant = arm.variant
        for rows in sizes:
            mine = [r for r in runs if r["rows"] == rows and r["variant"] == variant and r["frontend"] == arm.frontend.name]
            serve_median = statistics.median(r["level"]["throughput"] for r in mine)
            ceiling_median = statistics.median(r["ceiling"] for r in mine)
            summary.append({"variant": variant, "frontend": arm.frontend.as_dict(),
                            "cpus": (arm.client_cpus, arm.server_cpus), "rows": rows, "serve_median": serve_median,
                            "ceiling_median": ceiling_median, "ratio": serve_median / ceiling_median,
                            "p95_ms": statistics.median(r["level"]["p95_us"] for r in mine) / 1000,
                            "batch": statistics.median(r["batch"] for r in mine),
                            "target": 0.9 if rows > 1 else None,
                            "serving_budget_us": servers.serving_budget_us(ceiling_median, rows, arm.server_cpus)})
    result = {
        "date": dt.date.today().isoformat(), "host": socket.gethostname(), "cpus": len(os.sched_getaffinity(0)),
        "machine": platform.processor() or platform.machine(), "load_at_start": load_at_start,
        "load_at_end": os.getloadavg()[0],
        "framework": args.framework, "trees": args.trees, "depth": args.depth, "features": args.features,
        "instances": args.instances,
        "cpu_nthread": args.cpu_nthread,
        "concurrency": args.concurrency, "runs": runs, "summary": summary,
    }
    print(f"\n{args.framework}, {args.trees} trees of depth {args.depth}, {args.features} features, {args.instances} instance(s), "
          f"concurrency {args.concurrency}, medians of {args.repeats}, load {load_at_start:.2f} at start, "
          f"{os.getloadavg()[0]:.2f} at end:\n"
          "| variant (client / server CPUs) | front end | rows/request | toolkit serve infer/s | p95 ms | executed batch (rows) | "
          "ceiling infer/s | % of ceiling | target | 90 % leaves serving (CPU us/request) |\n|---|---|---|---|---|---|---|---|---|---|")
    for s in summary:
        target = "-" if s["target"] is None else (">= 90 %: " + ("met" if s["ratio"] >= s["target"] else "NOT met"))
        where = "all / all" if s["cpus"][0] is None else f"{s['cpus'][0]} / {s['cpus'][1]}"
        print(f"| {s['variant']} ({where}) | {s['frontend']['name']} | {s['rows']} | {s['serve_median']:.0f} | {s['p95_ms']:.2f} | {s['batch']:.1f} | "
              f"{s['ceiling_median']:.0f} | {100 * s['ratio']:.1f} % | {target} | {s['serving_budget_us']:.0f} |")
    if not args.quick:
        args.output.mkdir(parents=True, exist_ok=True)
        size = "" if (args.trees, args.depth, args.features) == (300, 6, 32) else f"-{args.trees}x{args.depth}x{args.features}"
        path = args.output / f"{result['date']}-fil-{args.framework}{size}-{result['host']}.json"
        path.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {path}")

if __name__ == "__main__":
    main()
