"""Micro-benchmark of the dynamic batcher's own overhead (no model: a no-op instance).

    .venv/bin/python bench/batcher_bench.py [--requests 20000] [--instances 2] [--max-batch-size 8]
                                             [--concurrency 64] [--delay-us 0] [--no-dynamic-batching]

Prints, for three ways of calling it:
- sync round trip: one thread calling infer_sync back to back (submit -> worker -> callback ->
  caller): the latency of a request that never waits for company;
- threads: --concurrency threads calling infer_sync;
- asyncio: --concurrency tasks awaiting infer() on one event loop (how the HTTP server calls it);
requests/s, the hand-off latency (queue start -> execution start, from the requests' own
timestamps) p50/p99, the round-trip p50/p99 where measured, and the batch sizes executed.
Numbers are machine-dependent; nothing here is asserted anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from handlers.batching import DynamicBatcher
from handlers.inference import InferOutcome, InferRequest, InferResponse


class NoopInstance:
    def __init__(self, name: str) -> None:
        self.name = name
        self.batch_sizes: Counter[int] = Counter()
        self._lock = threading.Lock()

    def execute(self, requests: list[InferRequest]) -> list[InferOutcome]:
        self.batch_sizes[sum(r.batch_size for r in requests)] += 1
        return [InferResponse(r.model_name, r.model_version, r.inputs, id=r.id) for r in requests]


def make_requests(n: int) -> list[InferRequest]:
    x = np.zeros((1, 4), np.float32)
    return [InferRequest("bench", 1, {"x": x}, id=str(i)) for i in range(n)]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(
    name: str,
    requests: list[InferRequest],
    seconds: float,
    round_trips: list[float] | None,
    instances: list[NoopInstance],
) -> None:
    handoff = [(r.compute_start_ns - r.queue_start_ns) / 1e3 for r in requests]
    line = (
        f"{name:<18} {len(requests) / seconds:>10.0f} req/s   hand-off p50 {statistics.median(handoff):7.1f} us"
        f"  p99 {pct(handoff, 0.99):8.1f} us"
    )
    if round_trips:
        line += f"   round trip p50 {statistics.median(round_trips):7.1f} us  p99 {pct(round_trips, 0.99):8.1f} us"
    sizes: Counter[int] = Counter()
    for instance in instances:
        sizes.update(instance.batch_sizes)
        instance.batch_sizes.clear()
    total = sum(sizes.values())
    mean = sum(size * count for size, count in sizes.items()) / max(1, total)
    print(line + f"   batches {total} (mean size {mean:.2f})")


def bench_sync(batcher: DynamicBatcher, n: int, instances: list[NoopInstance]) -> None:
    requests = make_requests(n)
    trips: list[float] = []
    started = time.perf_counter()
    for request in requests:
        t0 = time.perf_counter_ns()
        batcher.infer_sync(request)
        trips.append((time.perf_counter_ns() - t0) / 1e3)
    report("sync round trip", requests, time.perf_counter() - started, trips, instances)


def bench_threads(batcher: DynamicBatcher, n: int, concurrency: int, instances: list[NoopInstance]) -> None:
    requests = make_requests(n)
    chunks = [requests[i::concurrency] for i in range(concurrency)]
    trips: list[list[float]] = [[] for _ in chunks]

    def run(index: int) -> None:
        for request in chunks[index]:
            t0 = time.perf_counter_ns()
            batcher.infer_sync(request)
            trips[index].append((time.perf_counter_ns() - t0) / 1e3)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    report(
        f"threads x{concurrency}",
        requests,
        time.perf_counter() - started,
        [t for ts in trips for t in ts],
        instances,
    )


def bench_async(batcher: DynamicBatcher, n: int, concurrency: int, instances: list[NoopInstance]) -> None:
    requests = make_requests(n)

    async def main() -> float:
        trips: list[float] = []
        it = iter(requests)

        async def client() -> None:
            for request in it:
                t0 = time.perf_counter_ns()
                await batcher.infer(request)
                trips.append((time.perf_counter_ns() - t0) / 1e3)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
        report(f"asyncio x{concurrency}", requests, elapsed, trips, instances)
        return elapsed

    asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--instances", type=int, default=2)
    parser.add_argument("--max-batch-size", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--delay-us", type=int, default=0)
    parser.add_argument("--no-dynamic-batching", action="store_true")
    args = parser.parse_args()

    config: dict = {
        "name": "bench",
        "max_batch_size": args.max_batch_size,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
    }
    if not args.no_dynamic_batching:
        config["dynamic_batching"] = {"max_queue_delay_microseconds": args.delay_us}
    instances = [NoopInstance(f"bench_{i}") for i in range(args.instances)]
    batcher = DynamicBatcher("bench", config, instances)
    batcher.start()
    print(
        f"python {sys.version.split()[0]}, {args.instances} instance(s), max_batch_size {args.max_batch_size}, "
        f"{'no dynamic batching' if args.no_dynamic_batching else f'delay {args.delay_us} us'}"
    )
    bench_sync(batcher, min(args.requests, 5000), instances)
    bench_threads(batcher, args.requests, min(args.concurrency, 16), instances)
    bench_async(batcher, args.requests, args.concurrency, instances)
    batcher.stop()


if __name__ == "__main__":
    main()
