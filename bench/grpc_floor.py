"""What grpcio itself costs per ModelInfer, without the runtime: the floor under `toolkit serve`'s gRPC path.

    .venv/bin/python bench/grpc_floor.py [--modes aio,aio+handoff,sync-4,sync-16+handoff] [--repeats 3]
        [--window 2000] [--quick]

Each mode is a stand-in ModelInfer server (on purpose: it measures the transport, not the
runtime) on the same generic handler with raw-bytes (de)serializers as
handlers/protocol/grpc/service.py: it parses the request (upb, as the service does) and answers a
fixed, pre-serialized ModelInferResponse for the tiny model (2 x 16 FP32; perf_analyzer does not
check outputs). The load is perf_analyzer 2.51 `-i grpc -b 2` at concurrency 16 on the tiny
model, as bench/overhead.py's; the number is the server process's CPU time (user + system, every
thread, from /proc) per request it answered, medians of interleaved repeats.

Modes:
- `aio`: grpc.aio on uvloop (what `toolkit serve` runs), the reply returned at once.
- `aio+handoff`: as `aio`, but each RPC waits for a batcher-like thread (batches of up to 4
  requests, 40 us of busy CPU per batch), settled with `call_soon_threadsafe`, as
  handlers/batching/batcher.py's `infer` does.
- `native`: the grpc++ front end (handlers/protocol/grpc/native, built by
  handlers/protocol/native/build.py grpc) on uvloop: grpc++'s threads receive each RPC as bytes
  and wake the loop through an eventfd; the loop takes every waiting call in one native call,
  parses (upb) and answers, the reply returned at once.
- `native+handoff`: as `native`, each RPC waiting for the batcher-like thread as in `aio+handoff`.
- `sync-N`: grpcio's thread-pool server with N threads, the reply returned at once.
- `sync-N+handoff`: as `sync-N`, each handler thread blocking until its batch ran. A server
  whose handlers block needs as many threads as requests in flight for batches to form.

`--quick`: 1 repeat of 1 s windows, a smoke run whose numbers mean nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from perf_analyzer import PERF_ANALYZER  # noqa: E402
from servers import free_port  # noqa: E402

SERVICE = "inference.GRPCInferenceService"
TICKS = os.sysconf("SC_CLK_TCK")
BATCH_WORK_S = 40e-6
MAX_BATCH = 4


class _Batcher:
    """A thread that runs queued requests in batches of up to MAX_BATCH, BATCH_WORK_S each."""

    def __init__(self) -> None:
        self.queue: collections.deque = collections.deque()
        self.ready = threading.Condition()
        threading.Thread(target=self._work, daemon=True).start()

    def submit(self, done) -> None:
        with self.ready:
            self.queue.append(done)
            self.ready.notify()

    def _work(self) -> None:
        while True:
            with self.ready:
                while not self.queue:
                    self.ready.wait()
                batch = [self.queue.popleft() for _ in range(min(MAX_BATCH, len(self.queue)))]
            started = time.perf_counter()
            while time.perf_counter() - started < BATCH_WORK_S:
                pass
            for done in batch:
                done()


def _handler(asynchronous: bool, handoff: bool, counter: list[int]):
    import grpc
    import numpy as np

    from handlers.protocol.grpc import generated

    _, pb, _ = generated.load()
    reply = pb.ModelInferResponse(model_name="tiny", model_version="1")
    output = reply.outputs.add(name="OUTPUT0", datatype="FP32")
    output.shape.extend([2, 16])
    reply.raw_output_contents.append(np.zeros((2, 16), np.float32).tobytes())
    answers = {
        "ModelInfer": reply.SerializeToString(),
        "ServerMetadata": pb.ServerMetadataResponse(name="floor", version="0").SerializeToString(),
        "ServerLive": pb.ServerLiveResponse(live=True).SerializeToString(),
    }
    metadata = pb.ModelMetadataResponse(name="tiny", versions=["1"], platform="onnxruntime_onnx")
    metadata.inputs.add(name="INPUT0", datatype="FP32", shape=[-1, 16])
    metadata.outputs.add(name="OUTPUT0", datatype="FP32", shape=[-1, 16])
    answers["ModelMetadata"] = metadata.SerializeToString()
    config = pb.ModelConfigResponse()
    config.config.name = "tiny"
    config.config.max_batch_size = 8
    config.config.input.add(name="INPUT0", data_type=11, dims=[16])
    config.config.output.add(name="OUTPUT0", data_type=11, dims=[16])
    answers["ModelConfig"] = config.SerializeToString()
    batcher = _Batcher() if handoff else None

    def behaviour(name: str):
        answer = answers[name]
        if name != "ModelInfer":
            if asynchronous:
                async def other(data: bytes, context) -> bytes:
                    return answer
                return other
            return lambda data, context: answer

        if asynchronous:
            async def infer(data: bytes, context) -> bytes:
                pb.ModelInferRequest.FromString(data)
                counter[0] += 1
                if batcher is not None:
                    loop = asyncio.get_running_loop()
                    future = loop.create_future()
                    batcher.submit(lambda: loop.call_soon_threadsafe(future.set_result, None))
                    await future
                return answer
            return infer

        def infer_sync(data: bytes, context) -> bytes:
            pb.ModelInferRequest.FromString(data)
            counter[0] += 1
            if batcher is not None:
                lock = threading.Lock()
                lock.acquire()
                batcher.submit(lock.release)
                lock.acquire()
            return answer
        return infer_sync

    handlers = {
        name: grpc.unary_unary_rpc_method_handler(behaviour(name)) for name in answers
    }
    return grpc.method_handlers_generic_handler(SERVICE, handlers)


def _serve_native(handoff: bool, counter: list[int], port: int, report) -> None:
    import grpc

    from handlers.protocol.grpc import _grpcnative

    generic = _handler(True, handoff, counter)
    methods = {}

    class _Details:
        def __init__(self, method: str) -> None:
            self.method = method
            self.invocation_metadata = ()

    async def answer(call, handler, payload: bytes) -> None:
        call.reply(await handler.unary_unary(payload, None))

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, report)
        server = _grpcnative.Server(f"127.0.0.1:{port}", 2**31 - 1, 2**31 - 1, False, ())

        def drain() -> None:
            for call, kind, payload in server.drain():
                if kind != _grpcnative.MESSAGE:
                    continue
                method = call.method
                handler = methods.get(method)
                if handler is None:
                    handler = methods[method] = generic.service(_Details(method))
                    if handler is None:
                        call.finish(grpc.StatusCode.UNIMPLEMENTED.value[0], "")
                        continue
                if handoff:
                    loop.create_task(answer(call, handler, payload))
                    continue
                coroutine = handler.unary_unary(payload, None)
                try:
                    coroutine.send(None)
                except StopIteration as done:
                    call.reply(done.value)

        loop.add_reader(server.fileno(), drain)
        print("READY", flush=True)
        await asyncio.Event().wait()

    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())


def serve(mode: str, port: int) -> None:
    """Run one mode's server until SIGTERM; then print the requests answered."""
    import grpc

    counter = [0]
    handoff = mode.endswith("+handoff")
    kind = mode.removesuffix("+handoff")

    def report(*_: object) -> None:
        print(f"ANSWERED {counter[0]}", flush=True)
        os._exit(0)

    signal.signal(signal.SIGTERM, report)
    if kind == "aio":
        async def main() -> None:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, report)
            server = grpc.aio.server()
            server.add_generic_rpc_handlers((_handler(True, handoff, counter),))
            server.add_insecure_port(f"127.0.0.1:{port}")
            await server.start()
            print("READY", flush=True)
            await server.wait_for_termination()

        try:
            import uvloop
        except ImportError:
            asyncio.run(main())
        else:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(main())
        return
    if kind == "native":
        _serve_native(handoff, counter, port, report)
        return
    threads = int(kind.removeprefix("sync-"))
    server = grpc.server(futures.ThreadPoolExecutor(threads))
    server.add_generic_rpc_handlers((_handler(False, handoff, counter),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    print("READY", flush=True)
    server.wait_for_termination()


def _cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])  # utime + stime of every thread


def measure(mode: str, window_ms: int) -> dict:
    port = free_port()
    process = subprocess.Popen([sys.executable, __file__, "--serve", mode, str(port)], cwd=ROOT,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        if process.stdout.readline().strip() != "READY":
            raise RuntimeError(f"{mode}: the server did not start")
        before = _cpu_ticks(process.pid)
        started = time.monotonic()
        out = subprocess.run(
            [str(PERF_ANALYZER), "-i", "grpc", "-m", "tiny", "-u", f"127.0.0.1:{port}", "-b", "2",
             "--concurrency-range", "16:16", "--measurement-interval", str(window_ms),
             "--stability-percentage", "999", "--max-trials", "2"],
            capture_output=True, text=True, timeout=600,
        )
        elapsed = time.monotonic() - started
        cpu = _cpu_ticks(process.pid) - before
    finally:
        process.send_signal(signal.SIGTERM)
        answered_line = process.communicate(timeout=60)[0].strip().splitlines()
    answered = int(answered_line[-1].split()[1]) if answered_line else 0
    if not answered:
        raise RuntimeError(f"{mode}: no request answered\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return {"cpu_us": cpu / TICKS / answered * 1e6, "requests_per_s": answered / elapsed,
            "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="aio,aio+handoff,native,native+handoff,sync-16")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--window", type=int, default=2000, help="perf_analyzer's measurement window (ms)")
    parser.add_argument("--quick", action="store_true", help="1 repeat, 1 s windows (a smoke run)")
    parser.add_argument("--serve", nargs=2, metavar=("MODE", "PORT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return
    if args.quick:
        args.repeats, args.window = 1, 1000
    modes = args.modes.split(",")
    runs: dict[str, list[dict]] = {mode: [] for mode in modes}
    for repeat in range(args.repeats):
        for mode in modes[repeat % len(modes):] + modes[:repeat % len(modes)]:  # rotate the order
            result = measure(mode, args.window)
            runs[mode].append(result)
            print(f"{mode} #{repeat + 1}: {result['cpu_us']:.0f} us CPU/request, "
                  f"{result['requests_per_s']:.0f} requests/s, load {result['load']:.1f}", flush=True)
    import grpc

    print(f"\ngrpcio {grpc.__version__}, perf_analyzer -i grpc -b 2 c16; "
          f"medians of {args.repeats} interleaved repeats\n")
    print("| mode | server CPU us/request | requests/s | load |\n|---|---|---|---|")
    for mode, results in runs.items():
        cpu = [r["cpu_us"] for r in results]
        print(f"| {mode} | {statistics.median(cpu):.0f} ({min(cpu):.0f}-{max(cpu):.0f}) | "
              f"{statistics.median(r['requests_per_s'] for r in results):.0f} | "
              f"{statistics.median(r['load'] for r in results):.1f} |")


if __name__ == "__main__":
    main()
