"""ONNX Runtime backend: an InferenceSession per model instance, as Triton's onnxruntime backend,
except where a version's CPU instances share one session (below).

Session options come from the config's `parameters` (intra_op_thread_count, inter_op_thread_count,
execution_mode, enable_mem_arena, enable_mem_pattern) and `optimization.graph.level`; thread
counts the config leaves unset come from the CPU budget (handlers/cpu_budget.py: the instance's
share of the container's CPUs, where Triton leaves ORT's default of every core); execution
providers from the instance group kind and `optimization.execution_accelerators` (CUDA and
TensorRT on GPU instances, OpenVINO on CPU when installed). Batches arrive as lists of requests;
their inputs are concatenated along the batch dimension, run once, and split back per request.

Shared sessions (`shares_session`): the instances of a model version that run on the CPU
execution provider alone, with one intra-op thread and sequential execution (the CPU budget's plan
wherever a version has as many instances as the container has CPUs, or more), run on one session:
ONNX Runtime's `Run` is thread-safe, and with one intra-op thread each run computes on its
caller's thread, so the instances still run in parallel. The weights are loaded, pre-packed and
held once instead of once per instance: the seeds' full-width text_recognition (177 MB) with its
2 instances takes 796 MB of memory instead of 1,334 and loads in 0.26 s instead of 0.52 on one
CPU, at the same throughput and p95 (bench/ort_sessions.py, docs/performance.md). On AWS Lambda
(the CPU plan's `serial`: one request at a time) a version's CPU-provider instances share one
session whatever their threads, since they never run together. Triton creates a session per
instance; `TOOLKIT_ORT_SHARED_SESSION=0` does the same here.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..batching.batch_tensors import batch_inputs, batch_outputs, split_batch
from ..batching.merge import (
    batch_responses, batch_sizes, merge_inputs, refuse_alone, requested_output_names, run_batch, stamp_compute,
)
from ..errors import InferenceError, internal, invalid_argument
from ..inference import InferOutcome, InferRequest
from ..manifest import ModelSpec
from .sharing import Shared

log = logging.getLogger("handlers.onnxruntime")

# Triton's documented `optimization { graph { level } }` values.
_GRAPH_LEVELS = {-1: "ORT_ENABLE_BASIC", 1: "ORT_ENABLE_EXTENDED", 2: "ORT_DISABLE_ALL"}
TRT_CACHE_ENV = "TOOLKIT_TRT_CACHE_DIR"
SHARED_SESSION_ENV = "TOOLKIT_ORT_SHARED_SESSION"  # "0": a session per instance, as Triton
_OPENVINO_SESSION_LOCK = threading.Lock()


class ModelLoadError(Exception):
    """A model (instance) cannot be created; the message says why and what to do."""


_ORT_DISTRIBUTIONS = ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-directml")


def _several_onnxruntime_dist_infos() -> bool:
    """Whether the import path holds the `.dist-info` folders of more than one ONNX Runtime
    distribution (`{name}-{version}.dist-info`, the name with `_` for `-`): one listing of each
    folder, no import. Only then is importlib.metadata asked which (its imports cost ~12 ms, a
    twentieth of a Lambda init)."""
    wanted = {name.replace("-", "_") for name in _ORT_DISTRIBUTIONS}
    seen = set()
    for folder in sys.path:
        try:
            names = os.listdir(folder or ".")
        except OSError:  # a zip file, a folder that went away
            continue
        for name in names:
            if name.startswith("onnxruntime") and name.endswith(".dist-info"):
                project = name[: -len(".dist-info")].rsplit("-", 1)[0].replace("-", "_").replace(".", "_").lower()
                if project in wanted:
                    seen.add(project)
    return len(seen) > 1


def _installed_onnxruntime_distributions() -> list[str]:
    from importlib import metadata

    found = []
    for name in _ORT_DISTRIBUTIONS:
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found.append(name)
    return found


def _ort():
    distributions = _installed_onnxruntime_distributions() if _several_onnxruntime_dist_infos() else []
    if len(distributions) > 1:
        # They install the same `onnxruntime` module over each other: which one loads is an accident.
        raise ModelLoadError(
            f"{' and '.join(distributions)} are all installed; they ship the same `onnxruntime` module and "
            f"overwrite each other. Keep exactly one: pip uninstall -y {' '.join(distributions)} && pip install "
            "'triton-serverless-toolkit[cpu]' (or [gpu])"
        )
    try:
        import onnxruntime
    except ImportError as exc:  # depends on the installed extra
        raise ModelLoadError(
            "onnxruntime is not installed: install the runtime extra, e.g. "
            "pip install 'triton-serverless-toolkit[cpu]' (or [gpu])"
        ) from exc
    return onnxruntime


def _parameter(config: dict, key: str) -> str | None:
    value = config.get("parameters", {}).get(key)
    if value is None:
        return None
    return value.get("string_value", "") if isinstance(value, dict) else str(value)


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "on", "yes"):
        return True
    if lowered in ("0", "false", "off", "no"):
        return False
    raise ModelLoadError(f"failed to convert '{text}' to boolean value")


def explicit_threads(config: dict) -> int | None:
    """The CPU threads one session uses because the config sets them (the CPU budget's hook,
    handlers/cpu_budget.py): intra-op threads, times the inter-op threads in parallel mode."""
    intra = _parameter(config, "intra_op_thread_count")
    if intra is None or not intra.strip().isdigit() or int(intra) <= 0:
        return None  # 0 is ORT's "default": the budget decides
    inter = _parameter(config, "inter_op_thread_count")
    mode = _parameter(config, "execution_mode")
    if mode is not None and mode.strip() == "1" and inter is not None and inter.strip().isdigit() and int(inter) > 0:
        return int(intra) * int(inter)
    return int(intra)


def thread_counts(config: dict, budget: int | None) -> tuple[int | None, int | None]:
    """(intra-op, inter-op) threads of a session: the config's where it sets them (a value of 0 is
    ORT's own default, as in Triton), else from `budget` (the instance's CPU share; None: leave
    ORT's defaults). Sequential execution has no inter-op pool; in parallel mode the budget is
    split so that intra x inter stays within it."""
    intra_text = _parameter(config, "intra_op_thread_count")
    inter_text = _parameter(config, "inter_op_thread_count")
    intra = int(intra_text) if intra_text is not None else None
    inter = int(inter_text) if inter_text is not None else None
    if budget is None:
        return intra, inter
    mode = _parameter(config, "execution_mode")
    parallel = mode is not None and int(mode) == 1
    if not parallel:
        return (budget if intra is None else intra), inter
    if inter is None and intra is None:
        return 1, budget
    if inter is None:
        return intra, max(1, budget // max(1, intra))
    if intra is None:
        return max(1, budget // max(1, inter)), inter
    return intra, inter


def op_libraries(config: dict, model_dir: Path) -> list[str]:
    """The custom-op libraries of `model_operations { op_library_filename }`, as each is registered
    (ONNX Runtime's RegisterCustomOpsLibrary: dlopen). A relative name that is a file in the
    model's directory is taken from there, so a library kept beside the model travels with it into
    the image; every other name is passed as written (an absolute path, or a bare name that dlopen
    looks up on the library search path). tritonserver passes every name as written, a relative
    one from its working directory."""
    names = (config.get("model_operations") or {}).get("op_library_filename") or []
    if isinstance(names, str):
        names = [names]
    found: list[str] = []
    for name in names:
        beside = Path(model_dir) / name
        found.append(str(beside) if not os.path.isabs(name) and beside.is_file() else str(name))
    return found


def session_options(config: dict, threads: int | None = None, libraries: list[str] | tuple[str, ...] = ()):
    """ORT session options from the config; `threads`: the instance's CPU budget; `libraries`:
    custom-op libraries to register (`op_libraries`)."""
    ort = _ort()
    options = ort.SessionOptions()
    options.log_severity_level = 3
    for library in libraries:
        options.register_custom_ops_library(library)
    intra, inter = thread_counts(config, threads)
    if intra is not None:
        options.intra_op_num_threads = intra
    if inter is not None:
        options.inter_op_num_threads = inter
    mode = _parameter(config, "execution_mode")
    if mode is not None:
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL if int(mode) == 1 else ort.ExecutionMode.ORT_SEQUENTIAL
    arena = _parameter(config, "enable_mem_arena")
    if arena is not None:
        options.enable_cpu_mem_arena = _bool(arena)
    pattern = _parameter(config, "enable_mem_pattern")
    if pattern is not None:
        options.enable_mem_pattern = _bool(pattern)
    level = config.get("optimization", {}).get("graph", {}).get("level", 0)
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _GRAPH_LEVELS.get(int(level), "ORT_ENABLE_ALL"))
    return options


def execution_providers(config: dict, kind: str, device_id: int, model_name: str) -> list:
    """The provider list for one instance (Triton's ModelState::LoadModel)."""
    ort = _ort()
    available = set(ort.get_available_providers())
    accelerators = config.get("optimization", {}).get("execution_accelerators", {})
    providers: list = []
    if kind == "KIND_GPU":
        if "CUDAExecutionProvider" not in available:
            raise ModelLoadError(
                f"model '{model_name}' has a KIND_GPU instance group but no GPU execution provider is "
                f"available (onnxruntime providers: {', '.join(sorted(available))}); install "
                "'triton-serverless-toolkit[gpu]' on a machine with an NVIDIA GPU, or serve it on CPU with "
                "--device cpu"
            )
        cuda_options: dict[str, Any] = {"device_id": device_id}
        algo = _parameter(config, "cudnn_conv_algo_search")
        if algo is not None:
            cuda_options["cudnn_conv_algo_search"] = {"0": "EXHAUSTIVE", "1": "HEURISTIC", "2": "DEFAULT"}.get(algo, algo)
        limit = _parameter(config, "gpu_mem_limit")
        if limit is not None:
            cuda_options["gpu_mem_limit"] = int(limit)
        strategy = _parameter(config, "arena_extend_strategy")
        if strategy is not None:
            cuda_options["arena_extend_strategy"] = {"0": "kNextPowerOfTwo", "1": "kSameAsRequested"}.get(strategy, strategy)
        copy_stream = _parameter(config, "do_copy_in_default_stream")
        if copy_stream is not None:
            cuda_options["do_copy_in_default_stream"] = int(_bool(copy_stream))
        for accelerator in accelerators.get("gpu_execution_accelerator", []):
            name = accelerator.get("name", "")
            params = accelerator.get("parameters", {})
            if name == "tensorrt":
                if "TensorrtExecutionProvider" not in available:
                    raise ModelLoadError(
                        f"model '{model_name}' requests the TensorRT execution accelerator but onnxruntime "
                        "has no TensorrtExecutionProvider here"
                    )
                providers.append(("TensorrtExecutionProvider", _tensorrt_options(params, model_name, device_id)))
            elif name == "cuda":
                cuda_options.update(params)
            else:
                raise ModelLoadError(f"unknown Execution Accelerator '{name}' is requested")
        providers.append(("CUDAExecutionProvider", cuda_options))
    else:
        for accelerator in accelerators.get("cpu_execution_accelerator", []):
            name = accelerator.get("name", "")
            if name == "openvino":
                if "OpenVINOExecutionProvider" not in available:
                    raise ModelLoadError(
                        f"model '{model_name}' requests the OpenVINO execution accelerator but onnxruntime "
                        "has no OpenVINOExecutionProvider here (install onnxruntime-openvino)"
                    )
                providers.append(("OpenVINOExecutionProvider", {"device_type": "CPU"}))
            else:
                raise ModelLoadError(f"unknown Execution Accelerator '{name}' is requested")
    providers.append("CPUExecutionProvider")
    return providers


def _tensorrt_options(params: dict[str, str], model_name: str, device_id: int) -> dict[str, Any]:
    options: dict[str, Any] = {"device_id": device_id}
    for key, value in params.items():
        if key == "precision_mode":
            options["trt_fp16_enable"] = value.upper() == "FP16"
            options["trt_int8_enable"] = value.upper() == "INT8"
        elif key == "max_workspace_size_bytes":
            options["trt_max_workspace_size"] = int(value)
        elif key.startswith("trt_"):
            options[key] = value
        else:
            options[f"trt_{key}"] = value
    # A warm engine cache makes later cold starts skip the TensorRT engine build.
    options.setdefault("trt_engine_cache_enable", True)
    cache_root = os.environ.get(TRT_CACHE_ENV, os.path.join(os.environ.get("TMPDIR", "/tmp"), "toolkit-trt-cache"))
    options.setdefault("trt_engine_cache_path", os.path.join(cache_root, model_name))
    Path(options["trt_engine_cache_path"]).mkdir(parents=True, exist_ok=True)
    return options


def _onnx_file(path: Path) -> Path:
    return path / "model.onnx" if path.is_dir() else path


def shares_session(config: dict, kind: str, providers: list, threads: int | None, serial: bool = False) -> bool:
    """Whether an instance runs on its model version's shared session (the module's docstring):
    a CPU instance on the CPU execution provider alone, one intra-op thread (the config's, else its
    CPU budget `threads`), sequential execution, and sharing not turned off; or any CPU instance on
    that provider where the CPU plan is `serial` (AWS Lambda: one request at a time, so the
    instances never run together and never contend for the session's thread pools)."""
    if os.environ.get(SHARED_SESSION_ENV, "1").strip() == "0":
        return False
    if kind != "KIND_CPU" or providers != ["CPUExecutionProvider"]:
        return False
    if serial:
        return True
    mode = _parameter(config, "execution_mode")
    if mode is not None and int(mode) == 1:
        return False
    intra, _ = thread_counts(config, threads)
    return intra == 1


_SESSIONS = Shared()  # the versions' shared sessions, by model file and config (shares_session)


def _session_key(path: Path, config: dict) -> tuple | None:
    """What a shared session is made from: the file as it is now, and the config; None when the
    file cannot be read (the session's own load then says why)."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return str(path), stat.st_mtime_ns, stat.st_size, json.dumps(config, sort_keys=True)


def create_instance(spec: ModelSpec, version: int, slot: Any) -> "OnnxRuntimeInstance":
    """One instance (the backend contract, handlers/backends/__init__.py)."""
    return OnnxRuntimeInstance(spec, version, slot.name, slot.kind, slot.device_id, getattr(slot, "threads", None),
                               serial=getattr(slot, "serial", False))


class OnnxRuntimeInstance:
    """One model instance, used by one batcher worker thread at a time: its own InferenceSession,
    or its model version's shared one (`shares_session`)."""

    def __init__(self, spec: ModelSpec, version: int, name: str, kind: str = "KIND_CPU", device_id: int = 0,
                 threads: int | None = None, *, serial: bool = False) -> None:
        ort = _ort()
        self.name = name
        self.kind = kind
        self.device_id = device_id
        self.spec = spec
        self.version = version
        config = spec.config
        providers = execution_providers(config, kind, device_id, spec.name)
        path = _onnx_file(spec.model_files[version])
        started = time.perf_counter()
        # Session creation with OpenVINO's provider is not thread-safe: the onnxruntime backend
        # serialises it with a global lock, and so does this one (instances load in parallel).
        openvino = any(p[0] == "OpenVINOExecutionProvider" for p in providers if isinstance(p, tuple))

        def make() -> Any:
            try:
                with _OPENVINO_SESSION_LOCK if openvino else contextlib.nullcontext():
                    options = session_options(config, threads, op_libraries(config, spec.directory))
                    return ort.InferenceSession(str(path), sess_options=options,
                                                providers=providers)
            except Exception as exc:
                raise ModelLoadError(f"failed to load model '{spec.name}' version {version}: {exc}") from exc

        key = _session_key(path, config) if shares_session(config, kind, providers, threads, serial) else None
        self.shared = key is not None
        self.session = _SESSIONS.get(key, make)[0] if key is not None else make()
        self.load_seconds = time.perf_counter() - started
        applied = self.session.get_session_options()  # what the session was built with
        self.intra_op_threads = applied.intra_op_num_threads
        self.inter_op_threads = applied.inter_op_num_threads
        log.info(
            "model '%s' version %d instance %s: ONNX Runtime intra-op threads %d, inter-op %d%s%s",
            spec.name, version, name, self.intra_op_threads, self.inter_op_threads,
            " (CPU budget)" if threads is not None and explicit_threads(config) is None else "",
            ", the version's shared session" if self.shared else "",
        )
        self.batching = spec.max_batch_size > 0
        self._inputs = {io["name"]: io for io in config.get("input", [])}
        self._outputs = {io["name"]: io for io in config.get("output", [])}
        self._output_names = [io["name"] for io in config.get("output", [])]
        self._string_outputs = {n for n, io in self._outputs.items() if io["data_type"] == "TYPE_STRING"}
        self._ragged = {n for n, io in self._inputs.items() if io.get("allow_ragged_batch")}
        try:
            self._batch_inputs = batch_inputs(config)
            self._batch_outputs = batch_outputs(config)
        except ValueError as exc:
            raise ModelLoadError(f"model '{spec.name}': {exc}") from None

    # -- execution ------------------------------------------------------------------------------

    def execute(self, requests: list[InferRequest]) -> list[InferOutcome]:
        """Run a batch. A batching model runs the whole batch at once; a non-batching model
        (max_batch_size 0) is never merged, so each of its requests runs on its own. A request
        whose BYTES ONNX Runtime cannot take is refused alone; the rest of its batch runs."""
        refused = refuse_alone(requests, self._undecodable, self.execute)
        if refused is not None:
            return refused
        return run_batch(requests, self._run, batching=self.batching)

    def _run(self, requests: list[InferRequest]) -> list[InferOutcome]:
        start = time.monotonic_ns()
        try:
            merged = merge_inputs(requests, batching=self.batching, ragged=self._ragged)
            feeds = {name: self._prepare(name, array) for name, array in merged.items()}
            for batch_input in self._batch_inputs:  # Triton makes them on the CPU, whatever the provider
                tensor = batch_input.tensor(requests)
                feeds.update((target, tensor) for target in batch_input.targets)
        except InferenceError as exc:
            return [exc] * len(requests)
        except ValueError as exc:
            return [internal(f"model '{self.spec.name}': {exc}")] * len(requests)
        names = requested_output_names(requests, self._output_names)
        input_end = time.monotonic_ns()
        try:
            results = self.session.run(names, feeds)
        except Exception as exc:  # ORT raises its own exception types
            return [internal(f"onnx runtime error: {exc}")] * len(requests)
        infer_end = time.monotonic_ns()
        try:
            parts = split_batch(
                dict(zip(names, results)), requests, batch_sizes(requests, batching=self.batching), self._batch_outputs
            )
        except ValueError as exc:
            return [internal(f"model '{self.spec.name}': {exc}")] * len(requests)
        outcomes: list[InferOutcome] = list(batch_responses(
            requests, parts, lambda name, array, request: self._finish(name, array)
        ))
        stamp_compute(requests, start, input_end, infer_end, time.monotonic_ns())
        return outcomes

    def _undecodable(self, request: InferRequest) -> InferenceError | None:
        for name, array in request.inputs.items():
            if array.dtype == object:
                try:
                    for item in array.reshape(-1):
                        if isinstance(item, bytes):
                            item.decode("utf-8")
                except UnicodeDecodeError:
                    return self._not_utf8(name)
        return None

    def _not_utf8(self, name: str) -> InferenceError:
        return invalid_argument(
            f"BYTES input '{name}' of model '{self.spec.name}' is not valid UTF-8; ONNX Runtime's Python "
            "API passes string tensors as text"
        )

    def _prepare(self, name: str, array: np.ndarray) -> np.ndarray:
        if array.dtype == object:
            try:
                array = np.array([b.decode("utf-8") for b in array.reshape(-1)], dtype=object).reshape(array.shape)
            except UnicodeDecodeError:
                raise self._not_utf8(name) from None
        return array  # `reshape` was applied by request validation

    def _finish(self, name: str, array: np.ndarray) -> np.ndarray:
        """An output as a response carries it: strings as bytes (the config's output `reshape` is
        the model repository's, for every backend: handlers/model_io.py)."""
        if name in self._string_outputs or array.dtype.kind in ("U", "O"):
            flat = np.empty(array.size, dtype=object)
            flat[:] = [s.encode("utf-8") if isinstance(s, str) else bytes(s) for s in array.reshape(-1)]
            array = flat.reshape(array.shape)
        return array
