"""Cold start: process start -> first 200 on /v2/health/ready (load + warmup included).

    .venv/bin/python bench/cold_start.py [REPO ...] [--runs 5] [--python-instance-mode process,auto]

Two ways to start, both measured from the moment the process is spawned:
- `image`: what a container runs, `python -m handlers.entrypoints.container`, with a manifest
  compiled beforehand (as `toolkit build` does);
- `serve`: `toolkit serve REPO`, which compiles the repository first.
`--python-instance-mode` sets TOOLKIT_PYTHON_INSTANCE_MODE for the started server (several,
comma-separated, are measured interleaved: run 1 of each, then run 2 of each, ...); by default
each start runs with its own default (the Cloud Run image's `process`, serve's `process`).
Prints the median and every run; the numbers go in docs/cold-start.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from servers import free_port, ready


def measure(command: list[str], port: int, env: dict[str, str], timeout: float = 120) -> float:
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        while not ready(port, timeout=1):
            if process.poll() is not None:
                raise RuntimeError(f"{' '.join(command)} exited with {process.returncode}")
            if time.perf_counter() - started > timeout:
                raise TimeoutError(" ".join(command))
            time.sleep(0.005)
        return time.perf_counter() - started
    finally:
        process.terminate()
        process.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("repos", nargs="*", default=[str(ROOT / "samples" / "quickstart")])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--python-instance-mode", default="", help="e.g. process,auto (TOOLKIT_PYTHON_INSTANCE_MODE)")
    parser.add_argument("--start", default="image,serve", help="image, serve or both (comma-separated)")
    args = parser.parse_args()
    python_modes = [m for m in args.python_instance_mode.split(",") if m] or [""]
    starts = [s for s in args.start.split(",") if s]

    from toolkit.repository.compile import compile_repository

    for repo in args.repos:
        work = Path(tempfile.mkdtemp(prefix="cold-start-"))
        try:
            result = compile_repository(repo, device="cpu")
            if not result.ok:
                raise SystemExit(f"{repo}: {result.failures}")
            manifest = result.write_manifest(work / "models.json")
            for start in starts:
                times: dict[str, list[float]] = {mode: [] for mode in python_modes}
                for _ in range(args.runs):
                    for python_mode in python_modes:  # interleaved, so a change in load hits every mode alike
                        port = free_port()
                        env = {**os.environ, "PORT": str(port), "TOOLKIT_MANIFEST": str(manifest), "TOOLKIT_HOST": "127.0.0.1",
                               "TOOLKIT_MODEL_ROOT": str(Path(repo).resolve()),
                               "TOOLKIT_LOG_LEVEL": "warning"}
                        env.pop("TOOLKIT_PYTHON_INSTANCE_MODE", None)
                        if python_mode:
                            env["TOOLKIT_PYTHON_INSTANCE_MODE"] = python_mode
                        elif start == "image":
                            env["TOOLKIT_PYTHON_INSTANCE_MODE"] = "process"  # the Cloud Run image's default
                        if start == "image":
                            command = [sys.executable, "-m", "handlers.entrypoints.container"]
                        else:
                            command = [sys.executable, "-m", "toolkit.cli", "serve", repo, "--port", str(port), "--device", "cpu",
                                       "--log-level", "warning"]
                        times[python_mode].append(measure(command, port, env))
                for python_mode, runs_s in times.items():
                    runs = ", ".join(f"{t:.3f}" for t in runs_s)
                    label = f"{start}, python {python_mode}" if python_mode else start
                    print(f"{repo} [{label}] median {statistics.median(runs_s):.3f} s over {len(runs_s)} runs ({runs})")
                first, *others = python_modes
                for other in others:  # run i of each mode ran back to back: their difference is paired
                    paired = [a - b for a, b in zip(times[first], times[other])]
                    print(f"{repo} [{start}] {first} - {other}: median of paired differences {statistics.median(paired):+.3f} s")
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
