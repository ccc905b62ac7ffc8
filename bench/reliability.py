"""Reliability, full forms: fuzzing, soak, overload, SIGTERM under load (docs/reliability.md).

    .venv/bin/python bench/reliability.py                 # everything (about 13 minutes on 2 cores)
    .venv/bin/python bench/reliability.py fuzz soak       # some parts
    .venv/bin/python bench/reliability.py --json out.json # also write the results

Parts (the code is the CI tests' own, tests/test_reliability_*.py, run at full size):

- fuzz: schemathesis (its CLI and engine, every built-in check but positive_data_acceptance and
  the auth checks) against the runtime's OpenAPI document, >= 10,000 cases; then 10,000
  hypothesis cases on the binary tensor data extension over HTTP; then correct answers.
- soak: 100,000 tagged requests at concurrency 64 over an ONNX model, a Python model and an
  ensemble (after 5,000 warm-up requests); lost, mismatched, RSS growth.
- overload: 1,000 requests refused by a full queue (latency of the 503s), then the overload,
  limits and security tests as they run in CI.
- drain: SIGTERM under load (64 clients, 10 s of load), 5 times; dropped requests, exit time.

Every part asserts what the CI test asserts and exits 1 on the first failure.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

PARTS = ("fuzz", "soak", "overload", "drain")


def _print(title: str, document: dict) -> None:
    print(f"== {title}: {json.dumps(document)}", flush=True)


def fuzz(work: Path, schemathesis_examples: int, codec_cases: int) -> dict:
    from test_reliability_fuzz import fuzz_codec, run_schemathesis
    from test_reliability_harness import build_mixed_repository, check_correct_answers, compile_manifest, runtime

    manifest = compile_manifest(build_mixed_repository(work / "models"))
    results: dict = {}
    with runtime(manifest) as server:
        rss_before = server.rss()
        started = time.perf_counter()
        run = run_schemathesis(server.url, work / "schemathesis", max_examples=schemathesis_examples, seed=11)
        results["schemathesis"] = run.summary()
        _print("schemathesis", results["schemathesis"])
        assert run.returncode == 0 and not run.report["failures"] and not run.report["errors"], run.output[-6000:]
        assert run.cases >= 10_000, run.summary()
        stats = fuzz_codec(server.port, examples=codec_cases, seed=11)
        results["codec"] = stats.summary()
        _print("codec", results["codec"])
        assert stats.cases >= codec_cases
        assert server.alive(), server.output()
        check_correct_answers(server.url, count=300, concurrency=16)
        results["after"] = {"alive": server.alive(), "correct_answers": 300,
                            "rss_growth_mb": round((server.rss() - rss_before) / 2**20, 1),
                            "seconds": round(time.perf_counter() - started, 1)}
        _print("after fuzzing", results["after"])
    return results


def soak(work: Path, requests: int, warmup: int) -> dict:
    from test_reliability_soak import check
    from test_reliability_soak import soak as run_soak

    result = run_soak(work, requests=requests, warmup=warmup)
    _print("soak", result.summary())
    check(result, requests)
    return result.summary()


def overload(work: Path, refusals: int) -> dict:
    from test_reliability_harness import compile_manifest, runtime
    from test_reliability_overload import build_overload_repository, check_queue_full, queue_full

    results: dict = {}
    with runtime(compile_manifest(build_overload_repository(work))) as server:
        result = queue_full(server.port, work, refusals=refusals)
        check_queue_full(result)
        results["queue_full_503"] = result.latencies_ms()
        _print("queue full", results["queue_full_503"])
    tests = ["tests/test_reliability_overload.py", "tests/test_reliability_limits.py", "tests/test_reliability_security.py"]
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], cwd=ROOT,
                          capture_output=True, text=True)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-2000:]
    results["tests"] = {"files": tests, "result": last, "seconds": round(time.perf_counter() - started, 1)}
    _print("overload, limits, security tests", results["tests"])
    assert done.returncode == 0, done.stdout[-6000:]
    return results


def drain(work: Path, runs: int, clients: int, load_seconds: float, grace: float) -> dict:
    from test_reliability_drain import check, drain_under_load

    summaries = []
    for index in range(runs):
        result = drain_under_load(work / f"run{index}", clients=clients, load_seconds=load_seconds, grace=grace)
        summaries.append(result.summary())
        _print(f"drain {index + 1}/{runs}", summaries[-1])
        check(result)
    return {
        "runs": runs, "clients": clients, "load_seconds": load_seconds, "grace_s": grace,
        "answered": sum(s["answered"] for s in summaries),
        "in_flight_at_sigterm": sum(s["in_flight_at_sigterm"] for s in summaries),
        "dropped": sum(s["dropped"] for s in summaries),
        "max_exit_s": max(s["exit_s"] for s in summaries),
        "per_run": summaries,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("parts", nargs="*", metavar="PART", help=f"any of {', '.join(PARTS)} (default: all)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--schemathesis-examples", type=int, default=700, help="per operation and phase")
    parser.add_argument("--codec-cases", type=int, default=10_000)
    parser.add_argument("--soak-requests", type=int, default=100_000)
    parser.add_argument("--drain-runs", type=int, default=5)
    args = parser.parse_args()
    unknown = sorted(set(args.parts) - set(PARTS))
    if unknown:
        parser.error(f"unknown part(s) {', '.join(unknown)}: choose from {', '.join(PARTS)}")
    parts = args.parts or list(PARTS)
    results: dict = {
        "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count(),
                    "platform": platform.platform()},
    }
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="toolkit-reliability-") as scratch:
        work = Path(scratch)
        try:
            if "fuzz" in parts:
                results["fuzz"] = fuzz(work / "fuzz", args.schemathesis_examples, args.codec_cases)
            if "soak" in parts:
                results["soak"] = soak(work / "soak", args.soak_requests, warmup=5_000)
            if "overload" in parts:
                results["overload"] = overload(work / "overload", refusals=1_000)
            if "drain" in parts:
                results["drain"] = drain(work / "drain", args.drain_runs, clients=64, load_seconds=10.0, grace=9.0)
        except AssertionError as failure:
            print(f"FAILED: {failure}", file=sys.stderr)
            results["failed"] = str(failure)[:4000]
        results["seconds"] = round(time.perf_counter() - started, 1)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps({k: v for k, v in results.items() if k != "machine"}, indent=2))
    return 1 if "failed" in results else 0


if __name__ == "__main__":
    sys.exit(main())
