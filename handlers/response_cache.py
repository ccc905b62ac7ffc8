"""The response cache (a model's `response_cache { enable: true }`), as tritonserver's local cache.

tritonserver caches a model's responses only when the server was started with a cache
(`--cache-config local,size=BYTES`); here the same setting is `TOOLKIT_CACHE_CONFIG=local,size=BYTES`
(or `toolkit serve --cache-config local,size=BYTES`). One cache serves every model that enables
it, holds at most `size` bytes of output data, and evicts the least recently used response.

A request whose inputs match a cached response's is answered from the cache without queueing
or executing; the answer is the cached outputs under the request's own id. The key is the
model's name and version and every input's name, datatype, shape and bytes, plus the outputs
the request asks for (tritonserver hashes names and bytes only, so two requests with the same
bytes in other shapes, or asking for other outputs, share its answer; not here). A failed
request is never cached.

Statistics and metrics as tritonserver counts them: a hit is a success with a `cache_hit`
duration (the lookup) and no inference; a miss adds the lookup and insertion to `cache_miss`;
`nv_cache_num_hits_per_model`, `nv_cache_hit_duration_per_model` (us), `nv_cache_num_misses_per_model`,
`nv_cache_miss_duration_per_model` (us) for the models that enable the cache.

`CachingScheduler` wraps a model's scheduler (a batcher, or an ensemble's) with the same calls,
so every transport (HTTP, gRPC, Lambda events, BLS) meets the cache on its way in.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from .inference import InferOutcome, InferRequest, InferResponse

log = logging.getLogger(__name__)

CACHE_CONFIG_ENV = "TOOLKIT_CACHE_CONFIG"


def parse_cache_config(text: str) -> int:
    """The byte size of tritonserver's `--cache-config` value for the local cache:
    `local,size=BYTES`. ValueError, naming the setting, for anything else."""
    name, _, setting = text.strip().partition(",")
    key, _, value = setting.partition("=")
    if name != "local" or key.strip() != "size" or not value.strip().isdigit():
        raise ValueError(
            f"cache config {text!r} is not 'local,size=BYTES' (tritonserver's --cache-config for its local cache)"
        )
    return int(value)


def cache_from_environment(environ: dict[str, str] | None = None) -> ResponseCache | None:
    text = (os.environ if environ is None else environ).get(CACHE_CONFIG_ENV, "").strip()
    return ResponseCache(parse_cache_config(text)) if text else None


def cache_enabled(config: dict[str, Any]) -> bool:
    return bool((config.get("response_cache") or {}).get("enable", False))


class ResponseCache:
    """Responses by key, at most `capacity` bytes of output data, least recently used evicted."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._entries: OrderedDict[bytes, tuple[InferResponse, int]] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(request: InferRequest) -> bytes:
        digest = hashlib.blake2b(digest_size=32)
        digest.update(f"{request.model_name}\0{request.model_version}\0".encode())
        for name in sorted(request.inputs):
            array = request.inputs[name]
            digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
            if array.dtype == object:
                for item in array.reshape(-1):
                    data = item if isinstance(item, bytes) else str(item).encode()
                    digest.update(len(data).to_bytes(8, "little"))
                    digest.update(data)
            else:
                digest.update(np.ascontiguousarray(array).data)
        if request.requested_outputs is not None:
            for output in request.requested_outputs:
                digest.update(f"\1{output.name}\0".encode())
        return digest.digest()

    def lookup(self, key: bytes) -> InferResponse | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def insert(self, key: bytes, response: InferResponse) -> bool:
        """Keep `response` (False: larger than the whole cache, not kept)."""
        size = sum(_nbytes(array) for array in response.outputs.values())
        if size > self.capacity:
            return False
        outputs = {}
        for name, array in response.outputs.items():
            kept = np.array(array, copy=True)
            kept.flags.writeable = False
            outputs[name] = kept
        kept_response = InferResponse(response.model_name, response.model_version, outputs,
                                      parameters=dict(response.parameters))
        with self._lock:
            if key in self._entries:
                return True
            while self.used + size > self.capacity and self._entries:
                _, (_, freed) = self._entries.popitem(last=False)
                self.used -= freed
            self._entries[key] = (kept_response, size)
            self.used += size
        return True


def _nbytes(array: np.ndarray) -> int:
    if array.dtype == object:
        return sum(len(item) if isinstance(item, bytes) else len(str(item)) for item in array.reshape(-1)) + 8 * array.size
    return int(array.nbytes)


class _Answered:
    """What `submit` returns for a request answered from the cache: nothing left to cancel."""

    queued = False

    def cancel(self) -> bool:
        return False


class CachingScheduler:
    """A model's scheduler behind the response cache."""

    def __init__(self, scheduler: Any, cache: ResponseCache, statistics: Any) -> None:
        self._scheduler = scheduler
        self._cache = cache
        self._statistics = statistics
        if hasattr(scheduler, "submit"):
            self.submit = self._submit

    def __getattr__(self, name: str) -> Any:  # stop, queued, state, composing_models, ...
        return getattr(self._scheduler, name)

    def _lookup(self, request: InferRequest) -> tuple[bytes, InferResponse | None, int]:
        started = time.monotonic_ns()
        if request.queue_start_ns == 0:
            request.queue_start_ns = started
        key = self._cache.key(request)
        cached = self._cache.lookup(key)
        return key, cached, started

    def _hit(self, request: InferRequest, cached: InferResponse, started: int) -> InferResponse:
        self._statistics.cache_hit(request, started, time.monotonic_ns())
        return InferResponse(request.model_name, request.model_version, dict(cached.outputs),
                             id=request.id, parameters=dict(cached.parameters))

    def _store(self, key: bytes, outcome: InferOutcome, lookup_ns: int) -> None:
        """Cache a successful response; never raises (the answer must reach its caller)."""
        if not isinstance(outcome, InferResponse):
            return
        try:
            started = time.monotonic_ns()
            if not self._cache.insert(key, outcome):
                log.warning("a response of model '%s' is larger than the whole response cache (%d bytes): not cached",
                            outcome.model_name, self._cache.capacity)
            self._statistics.cache_miss(lookup_ns + time.monotonic_ns() - started)
        except Exception:
            log.exception("caching a response of model '%s' failed", outcome.model_name)

    def _submit(self, request: InferRequest, callback: Callable[[InferOutcome], None]) -> Any:
        key, cached, started = self._lookup(request)
        if cached is not None:
            callback(self._hit(request, cached, started))
            return _Answered()
        lookup_ns = time.monotonic_ns() - started

        def store_then(outcome: InferOutcome) -> None:
            self._store(key, outcome, lookup_ns)
            callback(outcome)

        return self._scheduler.submit(request, store_then)

    async def infer(self, request: InferRequest) -> InferResponse:
        key, cached, started = self._lookup(request)
        if cached is not None:
            return self._hit(request, cached, started)
        lookup_ns = time.monotonic_ns() - started
        response = await self._scheduler.infer(request)
        self._store(key, response, lookup_ns)
        return response

    def infer_sync(self, request: InferRequest, timeout: float | None = None) -> InferResponse:
        key, cached, started = self._lookup(request)
        if cached is not None:
            return self._hit(request, cached, started)
        lookup_ns = time.monotonic_ns() - started
        response = self._scheduler.infer_sync(request, timeout)
        self._store(key, response, lookup_ns)
        return response
