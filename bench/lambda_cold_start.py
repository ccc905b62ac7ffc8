"""Lambda images under AWS's Lambda Runtime Interface Emulator: cold start, two ways.

    .venv/bin/python bench/lambda_cold_start.py IMAGE [IMAGE ...] [--runs 5] [--builder auto]

IMAGE is a Lambda image built by `toolkit build --target lambda`. Each run starts a fresh
container exactly as `toolkit build --measure-cold-start` does (read-only root, /tmp tmpfs,
non-root user, the RIE as entrypoint) and sends one Function URL event for /v2/health/ready:
- `total`: from asking the engine to start the container to the answer (container creation on
  this host, the RIE, Lambda's init phase, the first invoke);
- `init`: the RIE's INIT REPORT (runtime start to its first /next: imports, models loaded and
  warmed up), what Lambda reports as Init Duration.
Prints the median and every run; the numbers go in docs/cold-start.md.

    .venv/bin/python bench/lambda_cold_start.py --host REPO [--source TREE ...] [--runs 7]

`--host` needs no container engine: AWS's RIE runs as a host process (as tests/test_lambda_rie.py
runs it) and starts the real awslambdaric with `handlers.entrypoints.aws_lambda.handler` over REPO
compiled as an image compiles it, with AWS_LAMBDA_FUNCTION_MEMORY_SIZE 1,769 (one vCPU). Each run
is a fresh RIE and runtime that gets one first event, an inference request (`infer`: REPO's
first model with random data for its inputs, as `toolkit tune` makes its requests) or
`GET /v2/health/ready` (`ready`); it reports `init` (INIT REPORT) and `first` (the first
invocation's REPORT Duration, which under the RIE counts from the start of init: the time from
the runtime's start to the first answer). `--source` runs the runtime from other trees too (e.g.
a `git worktree` of an older commit), interleaved with this one, so that a change's effect is
read from one run. `--env KEY=VALUE` sets the runtime's environment, e.g.
`AWS_LAMBDA_INITIALIZATION_TYPE=provisioned-concurrency` (init makes the HTTP app too) or
`TOOLKIT_LAMBDA_DIRECT=0`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import servers  # noqa: E402

from toolkit.build.builders import detect_builder  # noqa: E402
from toolkit.build.pipeline import SilentUI, measure_lambda_cold_start  # noqa: E402


def host_runs(repo: Path, sources: list[Path], runs: int, extra_env: dict[str, str] | None = None) -> None:
    from toolkit.build.lambda_rie import ensure_rie
    from toolkit.build.local_run import INVOKE_PATH, parse_reports
    from toolkit.deploy.function_url import request_event
    from toolkit.repository.compile import compile_repository
    from toolkit.tune.load import request_body

    work = Path(tempfile.mkdtemp(prefix="lambda-cold-"))
    repository = work / "repository"
    shutil.copytree(repo, repository)
    compiled = compile_repository(repository, device="cpu")
    if not compiled.ok:
        raise SystemExit("\n".join(compiled.failure_lines()))
    manifest = compiled.write_manifest(repository / "models.json")
    model = compiled.manifest()["models"][0]
    body, headers = request_body(model["config"], 1, {})
    events = {"infer": request_event("POST", f"/v2/models/{model['name']}/infer", headers, body),
              "ready": request_event("GET", "/v2/health/ready")}
    rie = ensure_rie()

    def once(source: Path, event: dict) -> tuple[float, float]:
        port = servers.free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TOOLKIT_"))}
        env.update({"PYTHONPATH": str(source), "TOOLKIT_MANIFEST": str(manifest), "TOOLKIT_LOG_LEVEL": "warning",
                    "AWS_LAMBDA_FUNCTION_NAME": "bench", "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1769"})
        env.update(extra_env or {})
        log = work / "rie.log"
        with log.open("w") as handle:
            process = subprocess.Popen([str(rie), "--runtime-interface-emulator-address", f"127.0.0.1:{port}",
                                        "--runtime-api-address", f"127.0.0.1:{servers.free_port()}", sys.executable, "-m",
                                        "awslambdaric", "handlers.entrypoints.aws_lambda.handler"],
                                       cwd=work, env=env, stdout=handle, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or process.poll() is not None:
                        raise SystemExit(log.read_text())
                    time.sleep(0.02)
            request = urllib.request.Request(f"http://127.0.0.1:{port}{INVOKE_PATH}", data=json.dumps(event).encode(),
                                             method="POST")
            with urllib.request.urlopen(request, timeout=120) as response:
                answer = json.loads(response.read())
            if answer.get("statusCode") != 200:
                raise SystemExit(f"{source}: {answer}")
        finally:
            process.terminate()
            process.wait(timeout=30)
        reports = parse_reports(log.read_text())
        return reports.init_ms, reports.first_invoke_ms

    trees = [Path(__file__).resolve().parents[1], *sources]
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for run in range(runs):
        for index in range(len(trees)):
            tree = trees[(index + run) % len(trees)]
            for kind, event in events.items():
                results.setdefault((str(tree), kind), []).append(once(tree, event))
    for (tree, kind), values in results.items():
        inits, firsts = [v[0] for v in values], [v[1] for v in values]
        print(f"{tree} first event {kind}: init median {statistics.median(inits):.1f} ms "
              f"(runs {', '.join(f'{v:.0f}' for v in inits)}); to the first answer median {statistics.median(firsts):.1f} ms "
              f"(runs {', '.join(f'{v:.0f}' for v in firsts)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("images", nargs="*")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--builder", default="auto")
    parser.add_argument("--platform", default="linux/amd64")
    parser.add_argument("--host", type=Path, default=None, help="REPO: the RIE as a host process, no engine (module doc)")
    parser.add_argument("--source", type=Path, action="append", default=[], help="with --host: another tree's runtime")
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                        help="with --host: the runtime's environment (e.g. AWS_LAMBDA_INITIALIZATION_TYPE)")
    args = parser.parse_args()
    if args.host is not None:
        extra = dict(item.partition("=")[::2] for item in args.env)
        host_runs(args.host, args.source, args.runs, extra)
        return
    if not args.images:
        parser.error("give IMAGE(s), or --host REPO")
    builder, _ = detect_builder(args.builder)
    if builder is None or not builder.can_run:
        raise SystemExit("no container engine that runs images (docker or podman)")
    for image in args.images:
        totals, inits = [], []
        for _ in range(args.runs):
            cold, _ = measure_lambda_cold_start(builder, image, args.platform, SilentUI())  # (cold start, /metrics)
            totals.append(cold.seconds)
            inits.append(cold.init_seconds or float("nan"))
        print(f"{image}: total median {statistics.median(totals):.2f} s (runs {', '.join(f'{t:.2f}' for t in totals)}); "
              f"init median {statistics.median(inits):.3f} s (runs {', '.join(f'{t:.3f}' for t in inits)})")


if __name__ == "__main__":
    main()
