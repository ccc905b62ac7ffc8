"""The pb_utils host of the serving process itself (in-process instances): BLS through the
calling model's `BlsBridge`, logs to Python logging, metrics into the runtime's MetricStore."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

from . import host
from .bls import BlsBridge
from .host import BlsCall, BlsOutcome, BlsStream
from .metric_store import MetricStore, runtime_store
from .triton_error import TritonModelException


class LocalHost:
    def __init__(self) -> None:
        self._fallback: BlsBridge | None = None

    def remember(self, bridge: BlsBridge) -> None:
        """The bridge for calls made outside any model context (a model's own threads)."""
        self._fallback = bridge

    def _bridge(self) -> BlsBridge:
        context = host.current_context()
        bridge = context.owner if context is not None else None
        if bridge is None:
            bridge = self._fallback
        if bridge is None:
            raise TritonModelException("BLS call made outside any served Python model")
        return bridge

    def infer(self, call: BlsCall) -> BlsOutcome:
        return self._bridge().call(call)

    def infer_async(self, call: BlsCall) -> Awaitable[BlsOutcome]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Any] = loop.create_future()

        def finished(outcome: BlsOutcome) -> None:
            loop.call_soon_threadsafe(_settle, future, outcome)

        self._bridge().submit(call, finished)
        return future

    def infer_stream(self, call: BlsCall) -> BlsStream:
        stream = BlsStream()
        stream.set_cancel(self._bridge().submit_stream(call, stream.put))
        return stream

    def is_model_ready(self, name: str, version: str) -> bool:
        return self._bridge().is_model_ready(name, version)

    def log(self, level: int, message: str, filename: str, lineno: int) -> None:
        host.emit_log(level, message, filename, lineno)

    @property
    def metrics(self) -> MetricStore:
        return runtime_store()


def _settle(future: asyncio.Future, outcome: BlsOutcome) -> None:
    if not future.done():
        future.set_result(outcome)


_local: LocalHost | None = None


def install_local_host() -> LocalHost:
    """Install (once) the serving process's host; model processes install their own."""
    global _local
    if _local is None:
        _local = LocalHost()
        host.install_host(_local)
    return _local
