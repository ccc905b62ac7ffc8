"""Where a pinned server's one CPU goes, per thread: the pytorch ceiling model (bench/pytorch_ceiling.py)
served by `toolkit serve` on one CPU under perf_analyzer (on another CPU) at c16, with each thread's
CPU time and context switches read from /proc over a window of the load.

    .venv/bin/python bench/serving_threads.py                  # the model, then a cheap one, 3 interleaved repeats
    .venv/bin/python bench/serving_threads.py --sched-batch    # also an arm with the serving threads SCHED_BATCH

Arms (interleaved, each repeat starts its own server):
- `model`: the ceiling bench's TorchScript CNN (~1 ms of forward per row).
- `cheap`: a TorchScript module with the same inputs and outputs that only slices its input (a few
  microseconds), so the serving threads' CPU per request is what serving costs on its own.
- `model+sched-batch` (--sched-batch): the model, with the server's threads at the process's priority
  (the event loop and the front end's threads; not the instance threads, which the batcher runs at
  niceness 10) switched to SCHED_BATCH after start-up: a woken serving thread then waits for the
  running instance thread's time slice instead of preempting it.

The threads are told apart by what the runtime does to them: the event loop is the main thread
(its id is the process id), instance threads run at TOOLKIT_INSTANCE_NICE (10), the rest are the
front end's (evhttp's, or grpc++'s with --frontend grpc-native). Output: a table on stdout and
bench/results/serving-threads-<date>-<host>.json.

Any repository's model instead (no ceiling, no cheap arm): where its one CPU goes, and how two
trees or two settings compare, arms interleaved in every repeat (each starts its own server):

    .venv/bin/python bench/fil_ceiling.py --trees 500 --depth 7 --features 500 --write-repository /tmp/fil
    git worktree add /tmp/before REV     # and copy the built front ends (handlers/protocol/*/*.so) into it
    .venv/bin/python bench/serving_threads.py --repository /tmp/fil --model trees --rows 16 \
        --arm before=/tmp/before --arm after=. --arm after-4k=.,TOOLKIT_HUGE_PAGES=0

`--arm NAME=TREE[,VAR=VALUE...]`: the tree whose toolkit/ and handlers/ serve (python -m puts it
first on the path) and the environment the server gets on top of the front end's.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

import perf_analyzer  # noqa: E402
import pytorch_ceiling  # noqa: E402
import servers  # noqa: E402

SHAPE = "INPUT__0:1,32,100"


def build_cheap(path: Path) -> None:
    import torch

    class Cheap(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.reshape(x.shape[0], 3200)[:, :962].reshape(x.shape[0], 26, 37) * 2.0

    path.parent.mkdir(parents=True, exist_ok=True)
    torch.jit.script(Cheap()).save(str(path))


def thread_counters(pid: int) -> dict[int, tuple[int, int, int, int]]:
    """{thread id: (CPU ticks, niceness, voluntary switches, involuntary switches)}"""
    counters = {}
    for name in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{name}/stat").read_text()
            status = Path(f"/proc/{pid}/task/{name}/status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        switches = {line.split(":")[0]: int(line.split()[1]) for line in status.splitlines()
                    if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"))}
        counters[int(name)] = (int(fields[11]) + int(fields[12]), int(fields[16]),
                               switches["voluntary_ctxt_switches"], switches["nonvoluntary_ctxt_switches"])
    return counters


def role(pid: int, tid: int, nice: int) -> str:
    if tid == pid:
        return "event loop"
    return "instance" if nice > 0 else "front end"


def sched_batch(pid: int) -> None:
    for tid, (_, nice, _, _) in thread_counters(pid).items():
        if nice == 0:
            os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))


def measure(repo: Path, log: Path, frontend: servers.Frontend, cpus: tuple[str, str], seconds: float,
            batch_policy: bool, *, model: str = pytorch_ceiling.MODEL, shape: str | None = SHAPE, rows: int = 2,
            source: Path = servers.ROOT) -> dict:
    """One server on `cpus[1]` under perf_analyzer (`rows` rows a request, c16) on `cpus[0]`: its
    threads' CPU per request by role, read over `seconds` of the load."""
    client_cpus, server_cpus = cpus
    pids: list[int] = []
    with servers.toolkit_serve(repo, log, cpus=server_cpus, frontend=frontend, pids=pids, source=source) as url:
        common = dict(shape=shape, batch=rows, concurrency="16:16", cpus=client_cpus, protocol=frontend.protocol)
        perf_analyzer.run(model, url, measurement_ms=1000, stability=perf_analyzer.LOOSE_STABILITY,
                          max_trials=3, **common)  # warm-up
        (pid,) = pids
        if batch_policy:
            sched_batch(pid)
        levels: list[perf_analyzer.Level] = []
        load = threading.Thread(target=lambda: levels.extend(perf_analyzer.run_levels(
            model, url, measurement_ms=int(seconds * 1000) + 4000, max_trials=3, **common)))
        load.start()
        time.sleep(2)  # into the measured part of the load
        before, began = thread_counters(pid), time.monotonic()
        time.sleep(seconds)
        after, elapsed = thread_counters(pid), time.monotonic() - began
        load.join()
    (level,) = levels
    requests = level.throughput / rows * elapsed  # perf_analyzer -b ROWS: ROWS inferences a request
    ticks = os.sysconf("SC_CLK_TCK")
    roles: dict[str, dict[str, float]] = {}
    for tid, (cpu, nice, voluntary, involuntary) in after.items():
        if tid not in before:
            continue
        cpu0, _, voluntary0, involuntary0 = before[tid]
        entry = roles.setdefault(role(pid, tid, nice), {"cpu_s_per_s": 0.0, "us_per_request": 0.0, "voluntary_per_s": 0.0,
                                                          "involuntary_per_s": 0.0, "threads": 0})
        seconds_used = (cpu - cpu0) / ticks
        if seconds_used == 0:
            continue
        entry["threads"] += 1
        entry["cpu_s_per_s"] += seconds_used / elapsed
        entry["us_per_request"] += seconds_used / requests * 1e6
        entry["voluntary_per_s"] += (voluntary - voluntary0) / elapsed
        entry["involuntary_per_s"] += (involuntary - involuntary0) / elapsed
    return {"throughput": level.throughput, "p50_ms": level.p50_us / 1000, "p95_ms": level.p95_us / 1000,
            "batch": level.batch_size, "threads": roles}


def progress(repeat: int, arm: str, result: dict) -> None:
    print(f"repeat {repeat + 1}, {arm}: {result['throughput']:.1f} infer/s, p95 {result['p95_ms']:.1f} ms, "
          + ", ".join(f"{role} {t['us_per_request']:.0f} us/request" for role, t in result["threads"].items()),
          flush=True)


def medians(results: list[dict]) -> dict:
    """An arm's repeats: the medians of its rate, p95, batch and each role's CPU and switches."""
    def med(role: str, key: str) -> float:
        return statistics.median(r["threads"].get(role, {}).get(key, 0.0) for r in results)
    return {"throughput": statistics.median(r["throughput"] for r in results),
            "p95_ms": statistics.median(r["p95_ms"] for r in results),
            "batch": statistics.median(r["batch"] for r in results),
            **{f"{role}_{key}": med(role, key) for role in ("event loop", "front end", "instance")
               for key in ("us_per_request", "voluntary_per_s", "involuntary_per_s")}}


def parse_arm(spec: str) -> tuple[str, Path, dict[str, str]]:
    """NAME=TREE[,VAR=VALUE...] -> (name, tree, environment)."""
    name, sep, rest = spec.partition("=")
    tree, *settings = rest.split(",")
    if not sep or not name or not tree or any("=" not in setting for setting in settings):
        raise SystemExit(f"--arm {spec!r}: expected NAME=TREE[,VAR=VALUE...]")
    path = Path(tree).resolve()
    if not (path / "handlers").is_dir():
        raise SystemExit(f"--arm {spec!r}: {path} has no handlers/ (a checkout of this repository)")
    return name, path, dict(setting.split("=", 1) for setting in settings)


def describe_tree(tree: Path) -> str:
    """What the results say an arm's tree is, without a machine path: this checkout or another one,
    at its commit (with `+changes` when it has uncommitted ones)."""
    which = "this checkout" if tree.resolve() == servers.ROOT.resolve() else f"checkout '{tree.name}'"
    commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if commit.returncode != 0:
        return which
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return f"{which} at {commit.stdout.strip()}{' +changes' if dirty else ''}"


def repository_arms(args: argparse.Namespace, cpus: tuple[str, str], frontend: servers.Frontend) -> None:
    """--repository: the arms on that repository's model, interleaved (rotated) in every repeat."""
    arms = [parse_arm(spec) for spec in args.arm or [f"this={servers.ROOT}"]]
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in arms}
    with tempfile.TemporaryDirectory(prefix="serving-threads-") as folder:
        for repeat in range(args.repeats):
            for name, tree, env in servers.rotated(arms, repeat):
                arm_frontend = dataclasses.replace(frontend, extra=(*frontend.extra, *env.items()))
                result = measure(args.repository, Path(folder) / f"{name}.log", arm_frontend, cpus, args.seconds,
                                 batch_policy=False, model=args.model, shape=None, rows=args.rows, source=tree)
                runs[name].append(result)
                progress(repeat, name, result)
    print(f"\nmedians of {args.repeats}, {args.model} ({args.rows} rows a request, c16), {frontend.name}, server on "
          f"CPU {cpus[1]}, perf_analyzer on CPU {cpus[0]}:")
    print("| arm | infer/s (repeats) | p95 ms | avg batch | event loop us/request | front end us/request "
          "| instances us/request | serving switches/request (voluntary, involuntary) |")
    print("|---|---|---|---|---|---|---|---|")
    summary = {}
    for name, results in runs.items():
        rates = [r["throughput"] for r in results]
        row = summary[name] = medians(results)
        per_request = args.rows / row["throughput"]
        print(f"| {name} | {row['throughput']:.0f} ({min(rates):.0f}-{max(rates):.0f}) | {row['p95_ms']:.1f} | "
              f"{row['batch']:.1f} | {row['event loop_us_per_request']:.0f} | {row['front end_us_per_request']:.0f} | "
              f"{row['instance_us_per_request']:.0f} | "
              f"{(row['event loop_voluntary_per_s'] + row['front end_voluntary_per_s']) * per_request:.2f}, "
              f"{(row['event loop_involuntary_per_s'] + row['front end_involuntary_per_s']) * per_request:.2f} |")
    output = args.output or BENCH / "results" / f"serving-threads-{args.model}-{dt.date.today().isoformat()}-{socket.gethostname()}.json"
    output.write_text(json.dumps({"date": dt.datetime.now().isoformat(timespec="seconds"), "host": socket.gethostname(),
                                  "model": args.model, "rows": args.rows, "frontend": frontend.name,
                                  "cpus": {"client": cpus[0], "server": cpus[1]}, "repeats": args.repeats,
                                  "arms": {name: {"tree": describe_tree(tree), "env": env} for name, tree, env in arms},
                                  "runs": runs, "medians": summary}, indent=2) + "\n")
    print(f"results: {output}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6.0, help="the window the threads' CPU is read over")
    parser.add_argument("--sched-batch", action="store_true", help="add the model+sched-batch arm")
    parser.add_argument("--frontend", default="http-native", choices=sorted(servers.FRONTENDS))
    parser.add_argument("--output", type=Path, default=None)
    parser.add_argument("--repository", type=Path, default=None,
                        help="serve this repository's --model instead of the pytorch CNN (no ceiling, no cheap arm)")
    parser.add_argument("--model", default=None, help="with --repository: the model perf_analyzer drives")
    parser.add_argument("--rows", type=int, default=2, help="with --repository: rows a request (perf_analyzer -b)")
    parser.add_argument("--arm", action="append", metavar="NAME=TREE[,VAR=VALUE...]",
                        help="with --repository, repeatable: a tree to serve from and its environment "
                             "(default: this tree as it is)")
    args = parser.parse_args()
    cpus = servers.split_cpus()
    if cpus is None:
        raise SystemExit("needs two CPUs: perf_analyzer on one, the server on the other")
    frontend = servers.FRONTENDS[args.frontend]
    if args.repository is not None:
        if args.model is None:
            raise SystemExit("--repository needs --model")
        repository_arms(args, cpus, frontend)
        return
    if args.arm or args.model:
        raise SystemExit("--arm and --model go with --repository")
    arms = ["model", "cheap"] + (["model+sched-batch"] if args.sched_batch else [])
    runs: dict[str, list[dict]] = {arm: [] for arm in arms}
    ceilings: list[float] = []
    with tempfile.TemporaryDirectory(prefix="serving-threads-") as folder:
        work = Path(folder)
        repos = {}
        for kind in ("model", "cheap"):
            repo = work / kind
            model = repo / pytorch_ceiling.MODEL / "1" / "model.pt"
            pytorch_ceiling.build_model(model) if kind == "model" else build_cheap(model)
            (repo / pytorch_ceiling.MODEL / "config.pbtxt").write_text(pytorch_ceiling.CONFIG)
            repos[kind] = repo
        for repeat in range(args.repeats):
            with servers.pinned(cpus[1]):  # the forward alone on the server's CPU, as bench/pytorch_ceiling.py runs it
                rate = pytorch_ceiling.ceiling(repos["model"] / pytorch_ceiling.MODEL / "1" / "model.pt", 8,
                                               pytorch_ceiling.INSTANCES, 3.0)
            ceilings.append(rate)
            print(f"repeat {repeat + 1}, ceiling at batch 8: {rate:.1f} infer/s, {2 / rate * 1e6:.0f} us per request "
                  f"of 2", flush=True)
            for arm in arms:
                result = measure(repos[arm.split("+")[0]], work / f"{arm}.log", frontend, cpus, args.seconds,
                                 batch_policy=arm.endswith("sched-batch"))
                runs[arm].append(result)
                progress(repeat, arm, result)
    ceiling = statistics.median(ceilings)
    print(f"\nmedians of {args.repeats}, {frontend.name}, server on CPU {cpus[1]}, perf_analyzer on CPU {cpus[0]}; "
          f"the ceiling (the model alone, {pytorch_ceiling.INSTANCES} threads at batch 8 on the server's CPU): "
          f"{ceiling:.1f} infer/s, {2 / ceiling * 1e6:.0f} us of forward per request of 2 rows")
    print("| arm | infer/s | % of ceiling | p95 ms | event loop us/request | front end us/request | instances us/request "
          "| serving switches/s (voluntary, involuntary) | instances' involuntary switches/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    summary = {}
    for arm, results in runs.items():
        row = summary[arm] = medians(results)
        share = f"{row['throughput'] / ceiling:.1%}" if arm != "cheap" else "n/a"
        print(f"| {arm} | {row['throughput']:.1f} | {share} | {row['p95_ms']:.1f} | {row['event loop_us_per_request']:.0f} | "
              f"{row['front end_us_per_request']:.0f} | {row['instance_us_per_request']:.0f} | "
              f"{row['event loop_voluntary_per_s'] + row['front end_voluntary_per_s']:.0f}, "
              f"{row['event loop_involuntary_per_s'] + row['front end_involuntary_per_s']:.0f} | "
              f"{row['instance_involuntary_per_s']:.0f} |")
    output = args.output or BENCH / "results" / f"serving-threads-{dt.date.today().isoformat()}-{socket.gethostname()}.json"
    output.write_text(json.dumps({"date": dt.datetime.now().isoformat(timespec="seconds"), "host": socket.gethostname(),
                                  "frontend": frontend.name, "cpus": {"client": cpus[0], "server": cpus[1]},
                                  "repeats": args.repeats, "ceiling_batch8": ceilings, "runs": runs,
                                  "medians": summary}, indent=2) + "\n")
    print(f"results: {output}")


if __name__ == "__main__":
    main()
