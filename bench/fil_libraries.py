"""Which library should serve `fil` models? Treelite (what Triton's FIL loads every model with,
and predicts with on CPU: GTIL) against the frameworks' own predictors, on the same models.

    .venv/bin/python bench/fil_libraries.py [--trees 200] [--features 32] [--repeats 5]

For an XGBoost and a LightGBM binary classifier trained here on synthetic data, it prints per
library: installed size (the distribution and the dependencies it imports), cold load time
(a fresh interpreter imports the library and loads the model file; median of `--repeats`),
single-row latency (median of many calls, one thread), batch throughput (rows/s at batch 1024,
one thread and all threads) and the largest difference from the framework's own prediction.

Libraries: `treelite-ctypes` is handlers/backends/fil/treelite.py (libtreelite's C API, what the
runtime uses); `treelite-py` is the treelite package's own Python API (treelite.gtil.predict,
which imports scipy); `xgboost` is xgboost-cpu's Booster.inplace_predict; `lightgbm` is
lightgbm's Booster.predict. Needs the dev extra (xgboost-cpu, lightgbm, treelite).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Distributions each way of serving needs in an image (besides numpy, which the runtime has).
FOOTPRINT = {
    "treelite-ctypes": ["treelite"],
    "treelite-py": ["treelite", "scipy", "packaging"],
    "xgboost": ["xgboost-cpu", "scipy"],
    "lightgbm": ["lightgbm", "scipy", "narwhals"],
}

LOAD_SNIPPETS = {
    "treelite-ctypes": "from handlers.backends.fil.treelite import Forest; Forest.load({path!r}, {model_type!r})",
    "treelite-py": (
        "import treelite; "
        "m = treelite.frontend.load_lightgbm_model({path!r}) if {model_type!r} == 'lightgbm' "
        "else treelite.frontend.load_xgboost_model({path!r})"
    ),
    "xgboost": "import xgboost; xgboost.Booster(model_file={path!r})",
    "lightgbm": "import lightgbm; lightgbm.Booster(model_file={path!r})",
}


def installed_mb(distributions: list[str]) -> float:
    total = 0
    for name in distributions:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            return float("nan")
        for file in dist.files or []:
            path = Path(dist.locate_file(file))
            if path.is_file():
                total += path.stat().st_size
    return total / 1e6


def cold_load_ms(library: str, path: Path, model_type: str, repeats: int) -> float:
    code = "import time; t = time.perf_counter(); " + LOAD_SNIPPETS[library].format(path=str(path), model_type=model_type)
    code += "; print((time.perf_counter() - t) * 1000)"
    times = []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
        times.append(float(out.stdout.strip().splitlines()[-1]))
    return statistics.median(times)


def per_call_us(fn, rows: np.ndarray, seconds: float = 0.5) -> float:
    fn(rows)
    samples = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter_ns()
        for _ in range(20):
            fn(rows)
        samples.append((time.perf_counter_ns() - start) / 20 / 1000)
    return statistics.median(samples)


def predictors(library: str, path: Path, model_type: str):
    """{threads: fn(rows) -> probabilities of the positive class}"""
    cpus = len(os.sched_getaffinity(0))
    if library == "treelite-ctypes":
        from handlers.backends.fil.treelite import Forest

        forest = Forest.load(path, model_type)
        return {n: (lambda rows, n=n: forest.predict(rows, n)[:, 0]) for n in (1, cpus)}
    if library == "treelite-py":
        import treelite
        import treelite.gtil

        model = (treelite.frontend.load_lightgbm_model(path) if model_type == "lightgbm"
                 else treelite.frontend.load_xgboost_model(path))
        return {n: (lambda rows, n=n: treelite.gtil.predict(model, rows, nthread=n)[:, 0, 0]) for n in (1, cpus)}
    if library == "xgboost":
        import xgboost

        boosters = {}
        for n in (1, cpus):
            boosters[n] = xgboost.Booster(model_file=str(path))
            boosters[n].set_param({"nthread": n})
        return {n: (lambda rows, b=b: b.inplace_predict(rows)) for n, b in boosters.items()}
    if library == "lightgbm":
        import lightgbm

        booster = lightgbm.Booster(model_file=str(path))
        return {n: (lambda rows, n=n: booster.predict(rows, num_threads=n)) for n in (1, cpus)}
    raise ValueError(library)


def train(directory: Path, trees: int, features: int) -> dict[str, tuple[Path, str, np.ndarray, np.ndarray]]:
    import lightgbm
    import xgboost

    rng = np.random.default_rng(0)
    X = rng.standard_normal((20000, features)).astype(np.float32)
    y = ((X[:, 0] + X[:, 1] * X[:, 2] + rng.standard_normal(20000) * 0.5) > 0).astype(int)
    models = {}
    booster = xgboost.train({"objective": "binary:logistic", "max_depth": 6, "nthread": 1},
                            xgboost.DMatrix(X, label=y), trees)
    booster.save_model(directory / "xgboost.json")
    models["xgboost"] = (directory / "xgboost.json", "xgboost_json", X[:4096], booster.inplace_predict(X[:4096]))
    lgb = lightgbm.train({"objective": "binary", "num_leaves": 63, "verbose": -1, "num_threads": 1},
                         lightgbm.Dataset(X, label=y), trees)
    lgb.save_model(directory / "model.txt")
    models["lightgbm"] = (directory / "model.txt", "lightgbm", X[:4096], lgb.predict(X[:4096]))
    return models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", type=int, default=200)
    parser.add_argument("--features", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=1024)
    args = parser.parse_args()
    cpus = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as tmp:
        models = train(Path(tmp), args.trees, args.features)
        print(f"{args.trees} trees, {args.features} features, {cpus} CPUs; times are medians")
        print("| model | library | installed MB | cold import+load ms | 1 row us (1 thread) | "
              f"batch {args.batch} rows/s (1 thread) | batch rows/s ({cpus} threads) | max abs diff |")
        print("|---|---|---|---|---|---|---|---|")
        for framework, (path, model_type, rows, expected) in models.items():
            for library in ("treelite-ctypes", "treelite-py", framework):
                fns = predictors(library, path, model_type)
                one = per_call_us(fns[1], rows[:1])
                batch = rows[: args.batch]
                rate1 = args.batch / (per_call_us(fns[1], batch) / 1e6)
                rate_n = args.batch / (per_call_us(fns[cpus], batch) / 1e6)
                diff = float(np.max(np.abs(np.asarray(fns[cpus](rows), dtype=np.float64) - expected)))
                load = cold_load_ms(library, path, model_type, args.repeats)
                size = installed_mb(FOOTPRINT[library])
                print(f"| {framework} | {library} | {size:.1f} | {load:.0f} | {one:.1f} | {rate1:,.0f} | {rate_n:,.0f} | {diff:.2g} |")


if __name__ == "__main__":
    main()
