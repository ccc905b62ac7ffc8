"""Generated load: closed-loop concurrency over HTTP, as perf_analyzer's concurrency mode.

`concurrency` clients each send a request, wait for its answer, and send the next. The request
body is built once by tritonclient (the v2 JSON header plus binary tensor data, exactly what a
tritonclient user sends) from random inputs of the model's shapes, and posted with aiohttp, so the
generator's own cost per request stays small next to the server's (both share this machine's
CPUs, like perf_analyzer and the server do). After a warm-up, requests that start and finish
inside the measurement window count; the server's statistics extension gives the average batch
size it executed in that window.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

_NUMPY = {
    "TYPE_BOOL": np.bool_, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16, "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
}


class LoadError(RuntimeError):
    pass


@dataclass(frozen=True)
class Level:
    concurrency: int
    throughput: float  # inferences/s
    requests: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    batch_size: float  # average batch the server executed in the window (0: unknown)

    def latency(self, percentile: int) -> float:
        return {50: self.p50_ms, 95: self.p95_ms, 99: self.p99_ms}[percentile]


def _shape(io: dict[str, Any], batch: int, batching: bool, shapes: dict[str, list[int]]) -> list[int]:
    dims = shapes.get(io["name"]) or [int(d) for d in io.get("dims", [])]
    if any(d < 0 for d in dims):
        raise LoadError(f"input '{io['name']}' has a variable dimension: give its shape with --shape "
                        f"{io['name']}:D1,D2,...")
    return ([batch] if batching else []) + list(dims)


def request_body(config: dict[str, Any], batch: int, shapes: dict[str, list[int]], seed: int = 0) -> tuple[bytes, dict[str, str]]:
    """One request for the model (every non-optional input, random data), as tritonclient
    encodes it: body and headers."""
    import tritonclient.http as httpclient

    from handlers.datatypes import from_config_type

    rng = np.random.default_rng(seed)
    batching = int(config.get("max_batch_size", 0)) > 0
    inputs = []
    for io in config.get("input", []):
        if io.get("optional"):
            continue
        shape = _shape(io, batch, batching, shapes)
        data_type = io["data_type"]
        if data_type == "TYPE_STRING":
            data = np.array([b"toolkit tune"] * int(np.prod(shape)), dtype=np.object_).reshape(shape)
        elif data_type == "TYPE_BF16":
            data = rng.random(shape, dtype=np.float32)
        elif data_type in ("TYPE_FP16", "TYPE_FP32", "TYPE_FP64"):
            data = rng.random(shape).astype(_NUMPY[data_type])
        elif data_type == "TYPE_BOOL":
            data = rng.random(shape) < 0.5
        elif data_type in _NUMPY:
            data = rng.integers(0, 100, size=shape).astype(_NUMPY[data_type])
        else:
            raise LoadError(f"input '{io['name']}' has data type {data_type}, which tune cannot generate")
        tensor = httpclient.InferInput(io["name"], shape, from_config_type(data_type))
        tensor.set_data_from_numpy(data, binary_data=True)
        inputs.append(tensor)
    outputs = [httpclient.InferRequestedOutput(io["name"], binary_data=True) for io in config.get("output", [])]
    body, header_length = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs or None)
    headers = {"Content-Type": "application/octet-stream"}
    if header_length is not None:
        headers["Inference-Header-Content-Length"] = str(header_length)
    return bytes(body), headers


async def _stats(session: Any, url: str) -> tuple[int, int]:
    async with session.get(url) as response:
        document = json.loads(await response.read())
    counts = [(s.get("inference_count", 0), s.get("execution_count", 0)) for s in document.get("model_stats", [])]
    return sum(c[0] for c in counts), sum(c[1] for c in counts)


async def _level(base_url: str, model: str, body: bytes, headers: dict[str, str], batch: int, concurrency: int,
                 warmup_s: float, window_s: float, timeout_s: float) -> Level:
    import aiohttp

    infer_url = f"{base_url}/v2/models/{model}/infer"
    stats_url = f"{base_url}/v2/models/{model}/stats"
    latencies: list[float] = []
    failures: list[str] = []
    connector = aiohttp.TCPConnector(limit=concurrency + 1)
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        begin = time.perf_counter()
        window_start = begin + warmup_s
        window_end = window_start + window_s

        async def client() -> None:
            while True:
                started = time.perf_counter()
                if started >= window_end:
                    return
                async with session.post(infer_url, data=body, headers=headers) as response:
                    payload = await response.read()
                    status = response.status
                ended = time.perf_counter()
                if status != 200:
                    failures.append(f"HTTP {status}: {payload[:300].decode('utf-8', 'replace')}")
                    return
                if started >= window_start and ended <= window_end:
                    latencies.append(ended - started)

        async def monitor() -> tuple[int, int]:
            await asyncio.sleep(max(0.0, window_start - time.perf_counter()))
            first = await _stats(session, stats_url)
            await asyncio.sleep(max(0.0, window_end - time.perf_counter()))
            last = await _stats(session, stats_url)
            return last[0] - first[0], last[1] - first[1]

        watcher = asyncio.ensure_future(monitor())
        await asyncio.gather(*(client() for _ in range(concurrency)))
        inferences, executions = await watcher
    if failures:
        raise LoadError(f"the server failed a request: {failures[0]}")
    if not latencies:
        raise LoadError(f"no request completed inside the {window_s:g} s window at concurrency {concurrency}")
    ordered = sorted(latencies)

    def percentile(p: float) -> float:  # nearest rank
        index = min(len(ordered), max(1, math.ceil(p / 100 * len(ordered)))) - 1
        return 1000 * ordered[index]

    return Level(
        concurrency=concurrency,
        throughput=len(latencies) * batch / window_s,
        requests=len(latencies),
        p50_ms=percentile(50),
        p95_ms=percentile(95),
        p99_ms=percentile(99),
        mean_ms=1000 * sum(latencies) / len(latencies),
        batch_size=inferences / executions if executions else 0.0,
    )


def measure(base_url: str, model: str, body: bytes, headers: dict[str, str], batch: int, concurrency: int, *,
            warmup_s: float = 1.0, window_s: float = 3.0, timeout_s: float = 120.0) -> Level:
    """Throughput and latency percentiles at one concurrency level."""
    return asyncio.run(_level(base_url, model, body, headers, batch, concurrency, warmup_s, window_s, timeout_s))
