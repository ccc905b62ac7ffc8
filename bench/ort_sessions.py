"""One ONNX Runtime session shared by a version's CPU instances, against one session per instance.

    .venv/bin/python bench/ort_sessions.py                  # 3 interleaved repeats, ~8 min
    .venv/bin/python bench/ort_sessions.py --quick          # 1 repeat, short windows

The model is the conceptual guide's text_recognition at full width (bench/str_model.py, 177 MB of
weights) with the guide's config verbatim (2 instances, KIND_CPU, `dynamic_batching { }`, no
thread parameters: the CPU budget gives each instance one thread on 2 CPUs). Two arms of
`toolkit serve` (native HTTP) differ only in TOOLKIT_ORT_SHARED_SESSION: `shared` (the default:
one session for both instances, handlers/backends/onnxruntime.py) and `per-instance` (=0: a
session each, as Triton). In every repeat, in rotated order, each arm's server is started and
measured for:

- the model's load: the runtime's own "loaded N model version(s) in X s" (both instances'
  sessions, made in parallel threads), and the time from the process's start until
  /v2/health/ready answers 200 (polled every 0.2 s);
- resident memory: VmRSS once ready, and VmHWM (the peak) after the load;
- perf_analyzer 2.51 `-b 2 --shape input.1:1,32,100` at c16 (the seeds' command), throughput and
  p95.

Then ONNX Runtime alone, in this process (bench/ort_ceiling.py: 2 threads running batches of 8
back to back, no server, no client) on one shared session and on two sessions, on the server's
CPUs. `--pinned` runs perf_analyzer on the first CPU and the servers and ONNX Runtime alone on
the others (servers.split_cpus; on a 2-CPU machine a one-vCPU server, as Lambda up to 1,769 MB
and Cloud Run's default). Writes bench/results/<date>-ort-sessions[-pinned]-<host>.json; medians
of the repeats.

`--lambda` measures the AWS Lambda entry point instead, as its init phase runs: a fresh
interpreter per arm and repeat imports `handlers.entrypoints.aws_lambda` (the manifest read, both
instances loaded and warmed up; Lambda's Init Duration) with AWS_LAMBDA_FUNCTION_MEMORY_SIZE set
(`--lambda-memory`, default 3,538 MB: 2 vCPUs, the smallest size where the serial plan gives each
instance more than one thread, so only the serial rule shares), then sends one function-URL event
at a time (the seeds' 2-row request) and reports the invocations' p50 and p99, and VmRSS / VmHWM.
Writes bench/results/<date>-ort-sessions-lambda-<host>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

import ort_ceiling  # noqa: E402
import perf_analyzer  # noqa: E402
import servers  # noqa: E402
import str_model  # noqa: E402

MODEL = "text_recognition"
ARMS = {"shared": "http-native", "per-instance": "http-native+TOOLKIT_ORT_SHARED_SESSION=0"}


def _status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, MB."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) // 1024
    return values


def serve_arm(repo: Path, arm: str, logs: Path, measurement_ms: int, server_cpus: str | None,
              client_cpus: str | None) -> dict:
    frontend = servers.frontends(ARMS[arm])[0]
    pids: list[int] = []
    log = logs / f"{arm}-{int(time.time())}.log"
    started = time.monotonic()
    with servers.toolkit_serve(repo, log, frontend=frontend, pids=pids, cpus=server_cpus, log_level="info") as url:
        ready_s = time.monotonic() - started
        at_ready = _status(pids[0])
        levels, _ = perf_analyzer.run(MODEL, url, batch=2, shape=f"{str_model.INPUT_NAME}:1,32,100", concurrency="16:16",
                                      measurement_ms=measurement_ms, stability=30, max_trials=10, cpus=client_cpus)
        after = _status(pids[0])
    level = levels[-1]
    loaded = re.search(r"loaded \d+ model version\(s\) in ([\d.]+) s", log.read_text())
    return {"load_s": float(loaded.group(1)) if loaded else None, "ready_s": round(ready_s, 2),
            "rss_mb_ready": at_ready["VmRSS"], "hwm_mb": after["VmHWM"],
            "rss_mb_after": after["VmRSS"], "infer_per_s": level.throughput, "p95_ms": level.p95_us / 1000,
            "avg_batch": level.batch_size}


# One Lambda execution environment: its init, then the event (argv[1]) `argv[2]` times, one at a
# time. It prints a line after init and one after the invocations, and waits for a line on stdin
# after each, while the bench reads its memory (_status).
LAMBDA_CHILD = r"""
import json, statistics, sys, time
started = time.perf_counter()
from handlers.entrypoints import aws_lambda
print(json.dumps({"init_s": round(time.perf_counter() - started, 3)}), flush=True)
sys.stdin.readline()
event, times = json.loads(sys.argv[1]), []
for _ in range(int(sys.argv[2])):
    began = time.perf_counter()
    answer = aws_lambda.handler(event, None)
    times.append(time.perf_counter() - began)
    assert answer["statusCode"] == 200, answer
times.sort()
print(json.dumps({"p50_ms": round(1000 * statistics.median(times), 1),
                  "p99_ms": round(1000 * times[min(len(times) - 1, int(0.99 * len(times)))], 1)}), flush=True)
sys.stdin.readline()
"""


def lambda_arm(manifest: Path, event: dict, arm: str, memory_mb: int, invocations: int, logs: Path) -> dict:
    """One Lambda init and `invocations` sequential events in a fresh interpreter (LAMBDA_CHILD)."""
    env = {**os.environ, "TOOLKIT_MANIFEST": str(manifest), "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(memory_mb),
           "TOOLKIT_LOG_LEVEL": "info", "PYTHONPATH": str(ROOT)}
    for inherited in ("TOOLKIT_CPUS", "TOOLKIT_ORT_SHARED_SESSION"):
        env.pop(inherited, None)
    env.update(servers.frontends(ARMS[arm])[0].extra)  # the arm's setting (TOOLKIT_ORT_SHARED_SESSION=0 or none)
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"lambda-{arm}-{int(time.time())}.log"
    with log.open("w") as stderr, subprocess.Popen(
            [sys.executable, "-c", LAMBDA_CHILD, json.dumps(event), str(invocations)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=stderr, text=True, env=env, cwd=ROOT) as child:
        result: dict = {}
        for key in ("VmRSS", "VmHWM"):  # after init, then after the invocations
            line = child.stdout.readline()
            if not line:
                child.wait(timeout=60)
                raise SystemExit(f"the Lambda arm {arm} failed:\n{log.read_text()[-3000:]}")
            result.update(json.loads(line))
            result["rss_mb_init" if key == "VmRSS" else "hwm_mb"] = _status(child.pid)[key]
            child.stdin.write("\n")
            child.stdin.flush()
        child.wait(timeout=60)
    text = log.read_text()
    loaded = re.search(r"loaded \d+ model version\(s\) in ([\d.]+) s", text)
    return {"load_s": float(loaded.group(1)) if loaded else None, **result,
            "sessions_shared": text.count("the version's shared session"),
            "intra_op_threads": re.findall(r"intra-op threads (\d+)", text)}


def lambda_main(args: argparse.Namespace, work: Path) -> None:
    from toolkit.deploy.function_url import request_event
    from toolkit.repository.compile import compile_repository
    from toolkit.tune.load import request_body

    repo = work / "repo"
    str_model.export(repo / MODEL / "1" / "model.onnx")
    (repo / MODEL / "config.pbtxt").write_text(str_model.guide_config("KIND_CPU", 2))
    compiled = compile_repository(repo, device="cpu")
    if not compiled.ok:
        raise SystemExit("\n".join(compiled.failure_lines()))
    manifest = compiled.write_manifest(repo / "models.json")
    body, headers = request_body(compiled.manifest()["models"][0]["config"], 2, {})  # the seeds' 2-row request
    event = request_event("POST", f"/v2/models/{MODEL}/infer", headers, body)
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    for repeat in range(args.repeats):
        for arm in servers.rotated(list(ARMS), repeat):
            result = lambda_arm(manifest, event, arm, args.lambda_memory, args.invocations, work / "logs")
            runs[arm].append(result)
            print(f"repeat {repeat + 1} {arm}: {result}", flush=True)
    numeric = ("load_s", "init_s", "rss_mb_init", "hwm_mb", "p50_ms", "p99_ms")
    summary = {arm: {key: statistics.median(r[key] for r in results) for key in numeric if None not in (r[key] for r in results)}
               for arm, results in runs.items()}
    shared, own = summary["shared"], summary["per-instance"]
    ratios = {"init_s_saved": own["init_s"] - shared["init_s"], "rss_mb_saved": own["rss_mb_init"] - shared["rss_mb_init"],
              "hwm_mb_saved": own["hwm_mb"] - shared["hwm_mb"], "p50": shared["p50_ms"] / own["p50_ms"],
              "p99": shared["p99_ms"] / own["p99_ms"]}
    write_results(args.out, "-lambda", summary, ratios, cpus=len(os.sched_getaffinity(0)),
                  lambda_memory_mb=args.lambda_memory, invocations=args.invocations, runs=runs)


def write_results(folder: Path, variant: str, summary: dict, ratios: dict, **fields) -> None:
    """Prints the summary and writes bench/results/<date>-ort-sessions<variant>-<host>.json."""
    print(json.dumps({"summary": summary, "shared/per-instance": ratios}, indent=2))
    host = platform.node() or "host"
    out = folder / f"{dt.date.today().isoformat()}-ort-sessions{variant}-{host}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "command": " ".join(["bench/ort_sessions.py", *sys.argv[1:]]), "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": platform.processor() or platform.machine(), "model": "text_recognition_full, the guide's config (2 x KIND_CPU)",
        "arms": ARMS, **fields, "summary": summary, "shared/per-instance": ratios,
    }, indent=2) + "\n")
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--measurement-ms", type=int, default=8000)
    parser.add_argument("--ceiling-seconds", type=float, default=6.0)
    parser.add_argument("--quick", action="store_true", help="1 repeat, short windows (a smoke run)")
    parser.add_argument("--pinned", action="store_true", help="perf_analyzer on the first CPU, the servers and ONNX "
                        "Runtime alone on the others (servers.split_cpus: on this 2-CPU machine, a one-vCPU server)")
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    parser.add_argument("--lambda", dest="lambda_", action="store_true",
                        help="the AWS Lambda entry point's init and sequential invocations instead (module doc)")
    parser.add_argument("--lambda-memory", type=int, default=3538, help="AWS_LAMBDA_FUNCTION_MEMORY_SIZE, MB")
    parser.add_argument("--invocations", type=int, default=40, help="--lambda: events sent one at a time per arm")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.measurement_ms, args.ceiling_seconds, args.invocations = 1, 3000, 3.0, 5

    work = Path(tempfile.mkdtemp(prefix="ort-sessions-"))
    if args.lambda_:
        lambda_main(args, work)
        return
    repo = work / "repo"
    onnx = str_model.export(repo / MODEL / "1" / "model.onnx")
    (repo / MODEL / "config.pbtxt").write_text(str_model.guide_config("KIND_CPU", 2))
    feeds = {str_model.INPUT_NAME: np.random.default_rng(0).standard_normal((8, 1, 32, 100)).astype(np.float32)}
    config = {}  # the guide's config has no thread parameters: the budget's 1 thread each on 2 CPUs
    client_cpus = server_cpus = None
    if args.pinned:
        split = servers.split_cpus()
        if split is None:
            raise SystemExit("--pinned needs 2 CPUs or more")
        client_cpus, server_cpus = split
    runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
    ceilings: dict[str, list[float]] = {"shared": [], "per-instance": []}
    for repeat in range(args.repeats):
        order = servers.rotated(list(ARMS), repeat)
        for arm in order:
            result = serve_arm(repo, arm, work / "logs", args.measurement_ms, server_cpus, client_cpus)
            runs[arm].append(result)
            print(f"repeat {repeat + 1} {arm}: {result}", flush=True)
        for arm in order:
            with servers.pinned(server_cpus):
                rate = ort_ceiling.throughput(onnx, config, feeds, 2, args.ceiling_seconds, threads=1, shared=arm == "shared")
            ceilings[arm].append(rate)
            print(f"repeat {repeat + 1} ONNX Runtime alone, {arm}: {rate:.1f} infer/s", flush=True)

    summary = {}
    for arm, results in runs.items():
        summary[arm] = {key: statistics.median(r[key] for r in results) if None not in (r[key] for r in results) else None
                        for key in results[0]}  # (load_s is None where the log line was not found)
        summary[arm]["infer_per_s_range"] = [min(r["infer_per_s"] for r in results), max(r["infer_per_s"] for r in results)]
        summary[arm]["ort_alone_batch8"] = statistics.median(ceilings[arm])
    shared, own = summary["shared"], summary["per-instance"]
    ratios = {"throughput": shared["infer_per_s"] / own["infer_per_s"], "p95": shared["p95_ms"] / own["p95_ms"],
              "ort_alone": shared["ort_alone_batch8"] / own["ort_alone_batch8"],
              "rss_ready_mb_saved": own["rss_mb_ready"] - shared["rss_mb_ready"],
              "hwm_mb_saved": own["hwm_mb"] - shared["hwm_mb"], "ready_s_saved": own["ready_s"] - shared["ready_s"],
              "load_s_saved": None if None in (own["load_s"], shared["load_s"]) else own["load_s"] - shared["load_s"]}
    write_results(args.out, "-pinned" if args.pinned else "", summary, ratios, server_cpus=server_cpus,
                  client_cpus=client_cpus, runs=runs, ort_alone=ceilings)


if __name__ == "__main__":
    main()
