"""The loaded models of one runtime: instances, batchers, readiness, and lookup by name/version.

Loading happens outside ASGI lifespan (Mangum runs lifespan on every Lambda invocation): at
import/init time on Lambda, in a background thread for uvicorn so `/v2/health/live` answers while
models load and `/v2/health/ready` turns 200 once every model is loaded.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import functools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from . import cpu_budget, huge_pages
from .backends import backend_module
from .backends.ensemble import EnsembleScheduler
from .batching import DynamicBatcher, PendingRequest, SequenceBatcher
from .response_cache import CachingScheduler, ResponseCache, cache_enabled, cache_from_environment
from .errors import ErrorCode, InferenceError, internal, not_found, unavailable, unsupported
from .inference import InferOutcome, InferRequest, InferResponse
from .instance_group import instance_slots
from .manifest import Manifest, ModelSpec
from .metrics import ModelMetrics
from .model_io import ModelIO, OutputReshape
from .statistics import ModelStatistics
from .streaming import ResponseSink, ResponseStream
from .warmup import warm_up, warmup_samples
from .workers.plan import WorkerSlot

log = logging.getLogger("handlers.models")

ENSEMBLE = "ensemble"


class ModelState(enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNAVAILABLE = "UNAVAILABLE"


class _ReshapingInstance:
    """A model instance whose responses get their config's output `reshape` (OutputReshape);
    everything else is the instance's own."""

    def __init__(self, instance: Any, reshape: OutputReshape) -> None:
        self._instance = instance
        self._reshape = reshape

    def execute(self, requests: list[InferRequest]) -> list[InferOutcome]:
        return [self._reshape.apply(outcome) for outcome in self._instance.execute(requests)]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._instance, name)


def _reshaping(factory: Callable[..., Any], reshape: OutputReshape, *args: Any) -> _ReshapingInstance:
    return _ReshapingInstance(factory(*args), reshape)


@dataclass
class LoadedModel:
    """One version of one model."""

    spec: ModelSpec
    version: int
    state: ModelState = ModelState.LOADING
    reason: str = ""
    instances: list[Any] = field(default_factory=list)
    scheduler: Any = None  # DynamicBatcher, SequenceBatcher, or EnsembleScheduler for ensembles
    load_seconds: float = 0.0  # instances created (sessions loaded)
    warmup_seconds: float = 0.0  # model_warmup run on every instance
    statistics: ModelStatistics = field(init=False)

    labels: dict[str, list[str]] = field(init=False)
    # The protocols' request plans for this version: HTTP's by JSON header (handlers/protocol/plans.py),
    # gRPC's by the message without its tensor data (handlers/protocol/grpc/plans.py).
    request_plans: dict[bytes, Any] = field(init=False, repr=False)
    grpc_request_plans: dict[bytes, Any] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.statistics = ModelStatistics(
            self.spec.name, self.version, ModelMetrics(self.spec.name, self.version, cache=cache_enabled(self.spec.config))
        )
        self.labels = {}
        self.request_plans = {}
        self.grpc_request_plans = {}

    def load_labels(self) -> None:
        """Label files of outputs (classification extension), one label per line; the name is
        joined to the model directory as Triton's JoinPath does, and must stay inside it."""
        directory = self.spec.directory.resolve()
        for output in self.spec.config.get("output", []):
            filename = output.get("label_filename")
            if filename:
                path = (directory / filename.lstrip("/")).resolve()
                if not path.is_relative_to(directory):
                    raise RuntimeError(
                        f"label_filename '{filename}' of output '{output['name']}' resolves to '{path}', outside "
                        f"the model directory '{directory}'"
                    )
                self.labels[output["name"]] = path.read_text(encoding="utf-8").splitlines()

    @property
    def name(self) -> str:
        return self.spec.name

    @functools.cached_property
    def io(self) -> ModelIO:
        """The config's inputs and outputs as validating and encoding read them (made once)."""
        return ModelIO(self.spec.config)

    @property
    def ready(self) -> bool:
        return self.state is ModelState.READY

    def not_ready_error(self) -> InferenceError:
        return unavailable(f"Request for unknown model: '{self.name}' version {self.version} is not at ready state")

    @property
    def decoupled(self) -> bool:
        return self.spec.decoupled

    def _check_one_response(self) -> None:
        """Raise unless the model is ready to take a request answered by one response (not
        decoupled)."""
        if self.scheduler is None or not self.ready:
            raise self.not_ready_error()
        if self.decoupled:
            raise decoupled_error()

    async def infer(self, request: InferRequest) -> InferResponse:
        """The one response of a request to a model that is not decoupled."""
        self._check_one_response()
        return await self.scheduler.infer(request)

    @property
    def queues_callbacks(self) -> bool:
        """Whether `submit` takes this model's requests (its scheduler is a batcher); an ensemble
        runs each request as a coroutine, through `infer` only."""
        return hasattr(self.scheduler, "submit")

    def submit(self, request: InferRequest, callback: Callable[[InferOutcome], None]) -> PendingRequest:
        """Queue a request to a model that is not decoupled (one whose `queues_callbacks`);
        `callback(outcome)` is called once, from a worker thread (handlers.batching.OnLoop has it
        answered on an event loop). Raises InferenceError when it cannot be queued. The queued
        request's `cancel()` takes it out of the queue (unless it already runs)."""
        self._check_one_response()
        return self.scheduler.submit(request, callback)

    def infer_sync(self, request: InferRequest, timeout: float | None = None) -> InferResponse:
        self._check_one_response()
        return self.scheduler.infer_sync(request, timeout)

    def stream(self, request: InferRequest) -> ResponseStream:
        """Start `request` and return its response stream (handlers/streaming.py), read on the
        calling event loop: every response of a decoupled model, or the one response of any other
        model as a final event. Raises InferenceError when the request cannot be queued (not
        ready, queue full, stopping); errors after that arrive as events. Cancelling the stream
        takes a queued request out of the queue and tells the model (`request.is_cancelled()`)."""
        stream = ResponseStream()
        self.submit_stream(request, stream, asyncio.get_running_loop())
        return stream

    def submit_stream(self, request: InferRequest, sink: ResponseSink, loop: asyncio.AbstractEventLoop) -> None:
        """Queue `request` with its events going to `sink` (any ResponseSink); `loop` runs
        schedulers that only offer a coroutine (ensembles). Raises InferenceError when the request
        cannot be queued."""
        if self.scheduler is None or not self.ready:
            raise self.not_ready_error()
        decoupled = self.decoupled
        request.responses = sink if decoupled else None

        def done(outcome: InferOutcome) -> None:
            if isinstance(outcome, InferenceError):
                sink.finish(outcome)  # unless the model already ended the stream itself
            elif not decoupled:
                sink.finish(response=outcome)
            # a decoupled request that executed: its responses come through the sink

        submit = getattr(self.scheduler, "submit", None)
        if submit is not None:
            pending = submit(request, done)
            sink.on_cancel(pending.cancel)
            return
        future = asyncio.run_coroutine_threadsafe(self.scheduler.infer(request), loop)

        def settle(f: object) -> None:
            try:
                done(future.result())
            except InferenceError as exc:
                done(exc)
            except BaseException as exc:  # noqa: BLE001 - cancelled, or our own fault
                done(cancelled_error(request) if future.cancelled() else internal(f"{type(exc).__name__}: {exc}"))

        future.add_done_callback(settle)
        sink.on_cancel(future.cancel)


def decoupled_error() -> InferenceError:
    """tritonserver's answer to a one-response API (HTTP infer) on a decoupled model."""
    return unsupported("HTTP end point doesn't support models with decoupled transaction policy")


def cancelled_error(request: InferRequest) -> InferenceError:
    return InferenceError(f"[request id: {request.id or '<id_unknown>'}] inference request cancelled", ErrorCode.CANCELLED)


class ModelRepository:
    def __init__(
        self,
        manifest: Manifest,
        *,
        no_queue_delay: bool = False,
        serial: bool = False,
        cpu_plan: cpu_budget.CpuPlan | None = None,
        worker: WorkerSlot | None = None,
        response_cache: ResponseCache | None = None,
    ) -> None:
        """`serial`: one request at a time (AWS Lambda), which the CPU budget counts on;
        `cpu_plan`: the instances' CPU threads (default: this container's CPUs divided among
        every instance, handlers/cpu_budget.py); `worker`: this process is one of several workers and
        creates only its share of every model's instances (handlers/workers: the plan still
        counts every instance, so the threads of all workers add up to the CPUs); `response_cache`:
        the cache of the models that enable it (default: TOOLKIT_CACHE_CONFIG's, or none)."""
        self.manifest = manifest
        self.response_cache = response_cache if response_cache is not None else cache_from_environment()
        self.no_queue_delay = no_queue_delay
        self.cpu_plan = cpu_plan or cpu_budget.plan(manifest.models.values(), cpu_budget.available_cpus(),
                                                    serial=serial)
        self.models: dict[str, dict[int, LoadedModel]] = {
            name: {v: LoadedModel(spec, v) for v in spec.versions} for name, spec in manifest.models.items()
        }
        self.worker = worker
        self.peers: Any = None  # handlers.workers.peers.Peers when this process is one of several workers
        self._loaded = threading.Event()
        for backend in sorted({spec.backend for spec in manifest.models.values()} - {ENSEMBLE}):
            module = backend_module(backend)
            if module is not None and hasattr(module, "attach_repository"):
                module.attach_repository(self)  # e.g. BLS: Python models call this repository's models

    # -- lifecycle --------------------------------------------------------------------------------

    def load(self, *, exit_on_error: bool = True, max_workers: int | None = None) -> None:
        """Create every instance of every model version (in parallel) and start the batchers.

        With `exit_on_error` (Triton's default) the first failure is raised after everything is
        stopped; otherwise the failed model stays UNAVAILABLE with its reason and the rest serve.
        """
        started = time.perf_counter()
        for line in self.cpu_plan.lines():
            log.info("%s", line)
        versions = [m for by_version in self.models.values() for m in by_version.values()]
        ensembles = [m for m in versions if m.spec.backend == ENSEMBLE]
        with ThreadPoolExecutor(max_workers=max_workers or max(4, len(versions))) as pool:
            list(pool.map(self._load_version, [m for m in versions if m.spec.backend != ENSEMBLE]))
        # ensembles last: they are ready when their composing models are (nested ones in order)
        for model in sorted(ensembles, key=lambda m: self._ensemble_depth(m.spec)):
            self._load_ensemble(model)
        failed = [m for m in versions if m.state is ModelState.UNAVAILABLE]
        log.info("loaded %d model version(s) in %.3f s", len(versions) - len(failed), time.perf_counter() - started)
        self._loaded.set()
        if failed and exit_on_error:
            self.stop(drain=False)
            first = failed[0]
            raise RuntimeError(f"failed to load '{first.name}' version {first.version}: {first.reason}")
        if len(failed) < len(versions):  # the loaded models' memory on huge pages (huge_pages.py)
            huge_pages.start()

    def _load_version(self, model: LoadedModel) -> None:
        started = time.perf_counter()
        try:
            module = backend_module(model.spec.backend)
            if module is None:
                raise RuntimeError(f"backend '{model.spec.backend}' is not available in this runtime")
            if model.spec.decoupled and not getattr(module, "DECOUPLED", False):
                raise RuntimeError(
                    f"backend '{model.spec.backend}' does not serve decoupled models "
                    "(model_transaction_policy { decoupled: true }); only backend 'python' does"
                )
            factory = module.create_instance
            model.load_labels()
            slots = instance_slots(model.spec.config)
            if self.worker is not None:
                slots = self.worker.mine(slots)
            plan = self.cpu_plan
            slots = [dataclasses.replace(s, threads=plan.threads_for(model.name, s), serial=plan.serial) for s in slots]
            reshape = OutputReshape(model.spec.config)
            if reshape:  # Triton's core reshapes every backend's responses: here, every instance's
                factory = functools.partial(_reshaping, factory, reshape)
            with ThreadPoolExecutor(max_workers=max(1, len(slots))) as pool:
                model.instances = list(pool.map(lambda s: factory(model.spec, model.version, s), slots))
                model.load_seconds = time.perf_counter() - started
                samples = warmup_samples(model.spec)
                if samples:
                    warm_started = time.perf_counter()
                    list(pool.map(lambda i: warm_up(i, model.spec, model.version, samples, model.statistics), model.instances))
                    model.warmup_seconds = time.perf_counter() - warm_started
            metrics = model.statistics.metrics
            if metrics is not None:
                metrics.load_seconds.set(model.load_seconds)
                metrics.warmup_seconds.set(model.warmup_seconds)
            if "sequence_batching" in model.spec.config:
                model.scheduler = SequenceBatcher(
                    model.name, model.spec.config, model.instances, observer=model.statistics,
                    model_dir=model.spec.directory,
                )
            else:
                model.scheduler = DynamicBatcher(
                    model.name,
                    model.spec.config,
                    model.instances,
                    observer=model.statistics,
                    no_queue_delay=self.no_queue_delay,
                )
            model.scheduler.start()
            self._cache(model)
            model.state = ModelState.READY
            log.info(
                "model '%s' version %d ready: %d instance(s), load %.3f s, warmup %.3f s",
                model.name, model.version, len(model.instances), model.load_seconds, model.warmup_seconds,
            )
        except Exception as exc:  # a failing model never takes the others down
            model.state = ModelState.UNAVAILABLE
            model.reason = str(exc)
            log.error("failed to load '%s' version %d: %s", model.name, model.version, exc)

    def _cache(self, model: LoadedModel) -> None:
        """Put the response cache in front of the model's scheduler when both ask for it (not for a
        decoupled ensemble: Triton's cache takes no decoupled model)."""
        if self.response_cache is not None and cache_enabled(model.spec.config) and not model.decoupled:
            model.scheduler = CachingScheduler(model.scheduler, self.response_cache, model.statistics)
            log.info("model '%s' version %d: responses cached (response_cache)", model.name, model.version)

    def _ensemble_depth(self, spec: ModelSpec, seen: frozenset[str] = frozenset()) -> int:
        depth = 0
        for step in spec.config["ensemble_scheduling"]["step"]:
            composing = self.manifest.models.get(step["model_name"])
            if composing is not None and composing.backend == ENSEMBLE and composing.name not in seen:
                depth = max(depth, 1 + self._ensemble_depth(composing, seen | {spec.name}))
        return depth

    def _load_ensemble(self, model: LoadedModel) -> None:
        scheduler = EnsembleScheduler(model.spec, model.version, self, model.statistics)
        for name, version in scheduler.composing_models():
            by_version = self.models.get(name, {})
            ready = self.ready_versions(name)
            if not by_version:
                problem = f"ensemble '{model.name}' depends on '{name}' which is not found"
            elif not ready:
                reasons = "; ".join(m.reason for m in by_version.values() if m.reason)
                problem = f"ensemble '{model.name}' depends on '{name}' which has no loaded version" + (
                    f". Model '{name}' loading failed with error: {reasons}" if reasons else ""
                )
            elif version != -1 and version not in ready:
                problem = f"ensemble '{model.name}' depends on '{name}' whose required version {version} is not loaded"
            else:
                continue
            model.state = ModelState.UNAVAILABLE
            model.reason = problem
            log.error("failed to load '%s' version %d: %s", model.name, model.version, problem)
            return
        model.scheduler = scheduler
        self._cache(model)
        model.state = ModelState.READY

    def stop(self, *, drain: bool = True, timeout: float = 30.0) -> None:
        # ensembles first, so no new composing requests arrive while the batchers drain
        models = [m for by_version in self.models.values() for m in by_version.values() if m.scheduler is not None]
        for model in sorted(models, key=lambda m: m.spec.backend != ENSEMBLE):
            model.scheduler.stop(drain=drain, timeout=timeout)
        for by_version in self.models.values():
            for model in by_version.values():
                for instance in model.instances:
                    close = getattr(instance, "close", None)  # Python models: finalize()
                    if close is not None:
                        try:
                            close()
                        except Exception:  # one model's finalize must not stop the others
                            log.exception("closing instance %s of '%s' failed", getattr(instance, "name", "?"), model.name)

    # -- queries ------------------------------------------------------------------------------------

    @property
    def loaded(self) -> bool:
        return self._loaded.is_set()

    def ready(self) -> bool:
        """Server readiness: everything loaded, and every model version ready."""
        return self.loaded and all(m.ready for by_version in self.models.values() for m in by_version.values())

    def ready_versions(self, name: str) -> list[int]:
        return sorted(v for v, m in self.models.get(name, {}).items() if m.ready)

    def get(self, name: str, version: str | int | None = None) -> LoadedModel:
        """The model version a request addresses (latest ready version when none is given), with
        tritonserver's 404 messages."""
        by_version = self.models.get(name)
        if by_version is None:
            raise not_found(f"Request for unknown model: '{name}' is not found")
        if version in (None, ""):
            if len(by_version) == 1:  # the usual case: one version, the latest if it is ready
                (model,) = by_version.values()
                if model.ready:
                    return model
            ready = self.ready_versions(name)
            if not ready:
                raise unavailable(f"Request for unknown model: '{name}' has no available versions")
            return by_version[ready[-1]]
        number = int(version)
        model = by_version.get(number)
        if model is None:
            raise not_found(f"Request for unknown model: '{name}' version {number} is not found")
        return model

    def index(self) -> list[dict[str, Any]]:
        """Triton's repository index entries (name, version, state, reason)."""
        entries = []
        for name in sorted(self.models):
            for version, model in sorted(self.models[name].items()):
                entry = {"name": name, "version": str(version), "state": model.state.value}
                if model.reason:
                    entry["reason"] = model.reason
                entries.append(entry)
        return entries
