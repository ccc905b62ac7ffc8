"""The workers' view of one server: readiness, statistics and metrics summed over every worker.

Each worker answers its own state, statistics and collected metrics on a Unix socket in the
directory the supervisor made (`worker-INDEX.sock`: one JSON line in, one JSON line out). A worker
that serves `/v2/health/ready`, a statistics request (HTTP or gRPC) or `/metrics` asks the other
workers at that moment and adds their answers to its own, so a request is counted by the one worker
that served it, once, and a query sees every request answered before it was made.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import Any

import orjson
from prometheus_client.core import Metric

from .. import exposition
from ..errors import InferenceError, unavailable
from .plan import WorkerSlot

log = logging.getLogger("handlers.workers")

ASK_TIMEOUT_S = 10.0
# Machine-wide gauges: every worker reads the same machine, so one reading (the answering
# worker's) is the answer, not a sum.
_MACHINE_PREFIXES = ("nv_cpu_", "nv_gpu_")
# Per model version and worker, a duration of the cold start: the slowest worker's is the answer.
_SLOWEST = ("toolkit_model_load_duration_seconds", "toolkit_model_warmup_duration_seconds")


def socket_path(directory: Path, index: int) -> Path:
    return Path(directory) / f"worker-{index}.sock"


class Peers:
    """This worker's channel to the others (and theirs to it)."""

    def __init__(self, repository: Any, slot: WorkerSlot, directory: Path) -> None:
        self.repository = repository
        self.slot = slot
        self.directory = Path(directory)
        self._server: asyncio.AbstractServer | None = None
        self._all_ready = False

    # -- serving the others ---------------------------------------------------------------------

    async def start(self) -> None:
        path = socket_path(self.directory, self.slot.index)
        path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(self._answer, path=str(path))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            question = orjson.loads(await reader.readline())
            writer.write(orjson.dumps(self.local(question)) + b"\n")
            await writer.drain()
        except Exception:  # a broken question must not take the worker down
            log.exception("worker %s: answering a peer failed", self.slot)
        finally:
            writer.close()

    def local(self, question: dict[str, Any]) -> Any:
        op = question.get("op")
        repository = self.repository
        if op == "state":
            instances = {name: sorted({i.name for m in versions.values() for i in m.instances})
                         for name, versions in repository.models.items()}
            return {"ready": repository.ready(), "loaded": repository.loaded, "pid": os.getpid(), "instances": instances}
        if op == "stats":
            found = []
            for name, version in question.get("models", []):
                model = repository.models.get(name, {}).get(int(version))
                if model is not None and model.ready:
                    found.append(model.statistics.as_dict())
            return found
        if op == "metrics":
            return [_metric_document(m) for m in exposition.REGISTRY.collect()]
        raise ValueError(f"unknown question {op!r}")

    # -- asking the others ------------------------------------------------------------------------

    async def _ask(self, index: int, question: dict[str, Any]) -> Any:
        path = socket_path(self.directory, index)
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(str(path)), ASK_TIMEOUT_S)
            try:
                writer.write(orjson.dumps(question) + b"\n")
                await writer.drain()
                line = await asyncio.wait_for(reader.readline(), ASK_TIMEOUT_S)
            finally:
                writer.close()
        except (OSError, asyncio.TimeoutError) as exc:
            raise unavailable(f"worker {index} of {self.slot.count} did not answer: {exc or type(exc).__name__}") from None
        if not line:
            raise unavailable(f"worker {index} of {self.slot.count} did not answer")
        return orjson.loads(line)

    async def _everyone(self, question: dict[str, Any]) -> list[Any]:
        """This worker's answer first, then the others' (asked at once)."""
        others = [i for i in range(self.slot.count) if i != self.slot.index]
        answers = await asyncio.gather(*(self._ask(i, question) for i in others))
        return [self.local(question), *answers]

    async def all_ready(self) -> bool:
        if self._all_ready:  # every worker was ready once; a worker that fails stops the server
            return True
        try:
            states = await self._everyone({"op": "state"})
        except InferenceError:
            return False
        self._all_ready = all(state["ready"] for state in states)
        return self._all_ready

    async def statistics(self, models: list[tuple[str, int]]) -> list[dict[str, Any]]:
        answers = await self._everyone({"op": "stats", "models": [[name, version] for name, version in models]})
        merged: dict[tuple[str, str], dict[str, Any]] = {}
        for answer in answers:
            for entry in answer:
                key = (entry["name"], entry["version"])
                merged[key] = entry if key not in merged else merge_statistics(merged[key], entry)
        return [merged[(name, str(version))] for name, version in models if (name, str(version)) in merged]

    async def exposition(self) -> bytes:
        answers = await self._everyone({"op": "metrics"})
        return exposition.render(merge_metrics(answers))


def merge_statistics(a: Any, b: Any, key: str = "") -> Any:
    """Two workers' statistics of one model version (Triton's JSON) as one: counts and durations
    add up, `last_inference` is the latest, `batch_stats` entries add up per batch size."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = dict(a)
        for k, v in b.items():
            out[k] = merge_statistics(a[k], v, k) if k in a else v
        return out
    if key == "batch_stats":
        by_size = {entry["batch_size"]: entry for entry in a}
        for entry in b:
            size = entry["batch_size"]
            by_size[size] = merge_statistics(by_size[size], entry) if size in by_size else entry
        return [by_size[size] for size in sorted(by_size)]
    if key in ("name", "version", "batch_size"):
        return a
    if key == "last_inference":
        return max(a, b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return a + b
    return a


def _metric_document(metric: Metric) -> dict[str, Any]:
    return {
        "name": metric.name,
        "doc": metric.documentation,
        "type": metric.type,
        "counter": isinstance(metric, exposition.CounterMetric),
        "samples": [[s.name, s.labels, s.value] for s in metric.samples],
    }


def merge_metrics(answers: list[list[dict[str, Any]]]) -> list[Metric]:
    """Every worker's collected metrics as one registry's: samples with the same name and labels add
    up; machine gauges are the first answer's (this worker's); cold-start durations the largest."""
    families: dict[str, dict[str, Any]] = {}
    for position, answer in enumerate(answers):
        for family in answer:
            name = family["name"]
            merged = families.setdefault(name, {**family, "values": {}})
            if position and name.startswith(_MACHINE_PREFIXES):
                continue
            for sample_name, labels, value in family["samples"]:
                key = (sample_name, tuple(sorted(labels.items())))
                if key not in merged["values"]:
                    merged["values"][key] = value
                elif name in _SLOWEST:
                    merged["values"][key] = max(merged["values"][key], value)
                else:
                    merged["values"][key] += value
    out: list[Metric] = []
    for name, family in families.items():
        metric = exposition.CounterMetric(name, family["doc"]) if family["counter"] else Metric(name, family["doc"], family["type"])
        for (sample_name, labels), value in family["values"].items():
            metric.add_sample(sample_name, dict(labels), value)
        out.append(metric)
    return out
