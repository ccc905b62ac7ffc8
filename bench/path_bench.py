"""The shared request path in-process: what a request costs after the front end, without one.

    .venv/bin/python bench/path_bench.py                       # tiny, 2 rows/request
    .venv/bin/python bench/path_bench.py --model fil --rows 16
    .venv/bin/python bench/path_bench.py --source DIR ...      # another tree (before/after)

Loads a repository with the runtime's own ModelRepository and runs `infer.run_infer` (the
handler both HTTP front ends call: find the model, read the body, decode, validate, the batcher
and the model, the statistics, encode the reply) from 16 coroutines on uvloop, each sending the
body perf_analyzer sends (binary input, binary output requested) one request after the other.
No sockets, no HTTP parsing, no client: the CPU it reports per request is the shared path's alone,
which load on the machine moves far less than a served throughput. Prints one JSON line:
`process_us` (CPU of every thread per request), `loop_us` (the event loop's thread: the
GIL-bound part a front end adds to), `req_s`, and the load average. Numbers are printed, never
asserted; compare trees by alternating runs (docs/performance.md, "The shared path after the
front end").

Models: `tiny` (bench/overhead.py's repository: a 16x16 MatMul, max_batch_size 8, 1 instance)
or `fil` (bench/fil_ceiling.py's: XGBoost, 300 trees, 32 features, max_batch_size 1024).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent


def run(source: Path, repo: Path, model: str, rows: int, requests: int, concurrency: int) -> dict:
    """One measurement, in a fresh process whose handlers/ and toolkit/ come from `source`."""
    sys.path.insert(0, str(source))
    import numpy as np
    import uvloop

    from handlers.manifest import Manifest
    from handlers.model_repository import ModelRepository
    from handlers.protocol.infer import InferHeaders, run_infer
    from toolkit.repository.compile import compile_repository

    compiled = compile_repository(repo, None, "cpu", auto_complete=True)
    manifest = Manifest.from_dict(compiled.manifest(), root=compiled.root)
    repository = ModelRepository(manifest)
    repository.load()
    config = compiled.models[model].config
    tensor, output = config["input"][0], config["output"][0]
    features = int(tensor["dims"][0])
    data = np.random.default_rng(0).random((rows, features), dtype=np.float32).tobytes()
    header = json.dumps({
        "inputs": [{"name": tensor["name"], "shape": [rows, features], "datatype": "FP32",
                    "parameters": {"binary_data_size": len(data)}}],
        "outputs": [{"name": output["name"], "parameters": {"binary_data": True}}],
    }).encode()
    body = header + data
    headers = InferHeaders(str(len(body)), str(len(header)), None, None)

    async def chunks():
        yield body

    async def client(count: int) -> None:
        for _ in range(count):
            reply = await run_infer(repository, model, None, headers, chunks())
            if reply.status != 200:
                raise RuntimeError(f"{reply.status}: {reply.body[:300]!r}")

    async def main() -> dict:
        await asyncio.gather(*(client(max(1, requests // concurrency // 10)) for _ in range(concurrency)))  # warm
        each = requests // concurrency
        cpu, loop, wall = time.process_time(), time.thread_time(), time.perf_counter()
        await asyncio.gather(*(client(each) for _ in range(concurrency)))
        cpu, loop, wall = time.process_time() - cpu, time.thread_time() - loop, time.perf_counter() - wall
        total = each * concurrency
        return {"process_us": round(cpu / total * 1e6, 2), "loop_us": round(loop / total * 1e6, 2),
                "req_s": round(total / wall), "load": round(os.getloadavg()[0], 2)}

    try:
        return uvloop.run(main())
    finally:
        repository.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "fil"], default="tiny")
    parser.add_argument("--rows", type=int, default=2, help="rows per request (perf_analyzer -b)")
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--source", type=Path, default=BENCH.parent,
                        help="the tree whose handlers/ and toolkit/ run (default: this one)")
    parser.add_argument("--repository", type=Path, help="an existing repository (default: made in a temp dir)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    name = "tiny" if args.model == "tiny" else "trees"
    if args.child:
        print(json.dumps(run(args.source.resolve(), args.repository, name, args.rows, args.requests,
                             args.concurrency)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        repo = args.repository
        if repo is None:
            sys.path.insert(0, str(BENCH))
            if args.model == "tiny":
                import overhead

                repo = overhead.repository(Path(tmp), 1, True)
            else:
                import fil_ceiling

                repo = fil_ceiling.make_repository(Path(tmp) / "models", "xgboost", 300, 32, 1)
        # a child process: its imports come from --source alone
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", "--model", args.model,
                        "--rows", str(args.rows), "--requests", str(args.requests), "--concurrency",
                        str(args.concurrency), "--source", str(args.source), "--repository", str(repo)],
                       check=True, cwd=args.source)


if __name__ == "__main__":
    main()
