"""The raw ceiling: ONNX Runtime in-process, no server, no client.

`instances` threads, each with an InferenceSession built with the runtime's own session
options (handlers.backends.onnxruntime.session_options, so the same intra-op threads: the
config's, else the CPU budget's share given as `threads`) and shared as the runtime shares it
(one session for all threads where `shares_session` says the runtime's instances would share
one, else one each), run `session.run` on a batch of `batch` back to back for `seconds`; the
ceiling is the inferences per second of all of them together. A server that forms batches of
that size on that many instances cannot do better; `at_batch` interpolates it for the average
batch size a server executed.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Mapping
from pathlib import Path

import numpy as np

import servers


def _session(model: Path, config: dict, threads: int | None = None):
    import onnxruntime

    from handlers.backends.onnxruntime import session_options

    return onnxruntime.InferenceSession(str(model), sess_options=session_options(config, threads),
                                        providers=["CPUExecutionProvider"])


def throughput(model: Path, config: dict, feeds: Mapping[str, np.ndarray], instances: int, seconds: float,
               threads: int | None = None, shared: bool | None = None) -> float:
    """Inferences per second (batch size x runs / s) of `instances` threads running in parallel;
    `threads`: each session's CPU budget where the config sets no intra-op threads; `shared`: the
    threads run on one session (None: as the runtime's CPU instances would).

    Each session's rate is its completed runs over the time up to its last completion
    (servers.threads_rate)."""
    if shared is None:
        from handlers.backends.onnxruntime import shares_session

        shared = shares_session(config, "KIND_CPU", ["CPUExecutionProvider"], threads)
    sessions = [_session(model, config, threads)] * instances if shared else [
        _session(model, config, threads) for _ in range(instances)]
    batch = next(iter(feeds.values())).shape[0]
    for session in set(sessions):
        session.run(None, dict(feeds))  # warm-up
    calls = [functools.partial(session.run, None, dict(feeds)) for session in sessions]
    return batch * servers.threads_rate(calls, seconds)


def measure(
    model: Path,
    config: dict,
    make_feeds,
    batch_sizes: list[int],
    instance_counts: list[int],
    *,
    seconds: float = 3.0,
    repeats: int = 3,
    threads=None,
) -> dict[tuple[int, int], float]:
    """Median inferences/s for every (instances, batch size); `threads(instances)` gives each
    session's CPU budget (None: the config's threads only)."""
    results: dict[tuple[int, int], list[float]] = {}
    for _ in range(repeats):
        for instances in instance_counts:
            for batch in batch_sizes:
                share = threads(instances) if threads is not None else None
                value = throughput(model, config, make_feeds(batch), instances, seconds, share)
                results.setdefault((instances, batch), []).append(value)
    return {key: statistics.median(values) for key, values in results.items()}


def at_batch(ceilings: Mapping[tuple[int, int], float], instances: int, batch: float) -> float | None:
    """The ceiling at an average executed batch size: the time per inference is interpolated
    linearly between the two measured batch sizes around it (clamped to the measured range)."""
    sizes = sorted(size for count, size in ceilings if count == instances and ceilings[(count, size)] > 0)
    if not sizes or batch <= 0:
        return None
    if batch <= sizes[0]:
        return ceilings[(instances, sizes[0])]
    if batch >= sizes[-1]:
        return ceilings[(instances, sizes[-1])]
    for low, high in zip(sizes, sizes[1:]):
        if low <= batch <= high:
            t_low, t_high = 1 / ceilings[(instances, low)], 1 / ceilings[(instances, high)]
            weight = (batch - low) / (high - low)
            return 1 / (t_low + weight * (t_high - t_low))
    return None
