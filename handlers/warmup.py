"""Cold-start warmup from `model_warmup`, handed to each model instance as Triton hands it.

Triton (TritonModelInstance::GenerateWarmupData / WarmUp) builds, for every warmup sample with a
non-zero `batch_size`, that many requests of batch size 1 (shape [1] + dims when the model
batches), all sharing the same data, and executes them on each instance as one batch; `count`
repeats the sample (0 means once). Data: `zero_data` (zeros; empty strings for BYTES),
`random_data` (random bytes reinterpreted as the datatype; empty strings for BYTES) or
`input_data_file` (raw little-endian bytes from the model's `warmup/` folder; BYTES files hold
4-byte length-prefixed elements).
"""

from __future__ import annotations

import logging
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .batching.sequence_policy import control_input_names
from .datatypes import from_config_type, numpy_dtype
from .errors import InferenceError
from .inference import InferRequest
from .manifest import ModelSpec

log = logging.getLogger("handlers.warmup")

WARMUP_FOLDER = "warmup"


class WarmupError(Exception):
    pass


@dataclass(frozen=True)
class WarmupSample:
    name: str
    batch_size: int
    iterations: int
    inputs: dict[str, np.ndarray]  # one request's tensors (batch dimension included when batching)

    def requests(self, spec: ModelSpec, version: int) -> list[InferRequest]:
        """`batch_size` requests of batch 1, checked like client requests (this also applies
        `reshape`, as Triton's PrepareForInference does for warmup requests)."""
        from .protocol.validation import validate_request

        # Triton hands warmup inputs the config does not have to the backend: a sequence model's
        # control inputs reach it that way (warmup runs on the instance, not through the sequence
        # batcher); others the compiler warns about and the model never sees.
        model_inputs = {io["name"] for io in spec.config.get("input", [])}
        inputs = {name: array for name, array in self.inputs.items() if name in model_inputs}
        controls = {name: self.inputs[name] for name in control_input_names(spec.config) if name in self.inputs}
        requests = []
        for _ in range(self.batch_size):
            request = InferRequest(spec.name, version, dict(inputs), id=f"warmup:{self.name}", batch_size=1)
            try:
                validate_request(spec.config, request)
            except InferenceError as exc:
                raise WarmupError(f"warmup sample '{self.name}' of model '{spec.name}': {exc.message}") from None
            request.inputs.update(controls)
            requests.append(request)
        return requests


def _decode_bytes_elements(raw: bytes, count: int, source: str) -> np.ndarray:
    out = np.empty(count, dtype=object)
    offset = 0
    for i in range(count):
        if offset + 4 > len(raw):
            raise WarmupError(f"warmup data {source} holds fewer than {count} BYTES elements")
        length = int.from_bytes(raw[offset : offset + 4], "little")
        offset += 4
        if offset + length > len(raw):
            raise WarmupError(f"warmup data {source}: element {i} declares {length} bytes past the end")
        out[i] = raw[offset : offset + length]
        offset += length
    return out


def _data_file(spec: ModelSpec, filename: str) -> Path:
    """`input_data_file` inside the model's `warmup/` folder, joined as Triton's JoinPath does (a
    leading '/' does not make it absolute). One that leads outside the folder ('..', symlinks) is
    refused, as the compiler refuses it (handlers/config/warmup.py)."""
    folder = (spec.directory / WARMUP_FOLDER).resolve()
    path = (folder / filename.lstrip("/")).resolve()
    if not path.is_relative_to(folder):
        raise WarmupError(
            f"warmup input_data_file '{filename}' resolves to '{path}', outside the model's warmup directory '{folder}'"
        )
    return path


def _tensor(spec: ModelSpec, name: str, meta: dict[str, Any], rng: random.Random) -> np.ndarray:
    datatype = from_config_type(meta["data_type"])
    dims = [int(d) for d in meta.get("dims", [])]
    count = math.prod(dims)
    if datatype == "BYTES":
        if "input_data_file" in meta:
            path = _data_file(spec, meta["input_data_file"])
            flat = _decode_bytes_elements(path.read_bytes(), count, str(path))
        else:
            flat = np.empty(count, dtype=object)
            flat[:] = [b""] * count
        array = flat.reshape(dims)
    else:
        dtype = numpy_dtype(datatype)
        if meta.get("zero_data"):
            array = np.zeros(dims, dtype=dtype)
        elif meta.get("random_data"):
            raw = rng.randbytes(count * dtype.itemsize)
            array = np.frombuffer(raw, dtype=np.uint8 if datatype == "BOOL" else dtype).reshape(dims)
            array = array != 0 if datatype == "BOOL" else array.copy()
        elif "input_data_file" in meta:
            path = _data_file(spec, meta["input_data_file"])
            raw = path.read_bytes()
            needed = count * dtype.itemsize
            if len(raw) < needed:
                raise WarmupError(
                    f"warmup setting expects {needed} bytes, but the data provided from "
                    f"{meta['input_data_file']} only has {len(raw)} bytes"
                )
            array = np.frombuffer(raw[:needed], dtype=dtype).reshape(dims).copy()
        else:
            raise WarmupError(f"warmup setting expects input '{name}' to have input_data_type set")
    if spec.max_batch_size > 0:
        array = array.reshape((1, *array.shape))
    return array


def warmup_samples(spec: ModelSpec, seed: int = 0) -> list[WarmupSample]:
    # The standard library's generator, not numpy.random: importing that costs ~9 ms of a cold start.
    rng = random.Random(seed)
    samples = []
    for setting in spec.config.get("model_warmup", []):
        batch_size = int(setting.get("batch_size", 0))
        if batch_size == 0:
            continue  # Triton skips batch-0 samples
        inputs = {name: _tensor(spec, name, meta, rng) for name, meta in setting.get("inputs", {}).items()}
        samples.append(WarmupSample(setting.get("name", ""), batch_size, max(1, int(setting.get("count", 0))), inputs))
    return samples


def _execute(instance: Any, requests: list[InferRequest], observer: Any) -> list:
    if observer is None:
        return instance.execute(requests)
    from .batching import BatchExecution

    now = time.monotonic_ns()
    for request in requests:
        request.received_ns = request.queue_start_ns = now
        observer.request_queued(request)
    observer.batch_started(instance.name, requests)
    start = time.monotonic_ns()
    outcomes = instance.execute(requests)
    end = time.monotonic_ns()
    for request in requests:
        request.compute_start_ns = request.compute_start_ns or start
        request.compute_input_end_ns = request.compute_input_end_ns or request.compute_start_ns
        request.compute_infer_end_ns = request.compute_infer_end_ns or request.compute_input_end_ns
        request.compute_end_ns = request.compute_end_ns or end
    first = requests[0]
    observer.batch_executed(
        BatchExecution(
            instance=instance.name,
            batch_size=sum(r.batch_size for r in requests),
            request_count=len(requests),
            start_ns=first.compute_start_ns,
            compute_start_ns=first.compute_input_end_ns,
            compute_end_ns=first.compute_infer_end_ns,
            end_ns=first.compute_end_ns,
        )
    )
    for request, outcome in zip(requests, outcomes):
        if isinstance(outcome, InferenceError):
            from .batching import FailureReason

            observer.request_failed(instance.name, request, outcome, FailureReason.BACKEND)
        else:
            observer.request_succeeded(instance.name, request)
    return outcomes


@dataclass(frozen=True)
class WarmupReport:
    instance: str
    executions: int
    seconds: float


def warm_up(
    instance: Any, spec: ModelSpec, version: int, samples: list[WarmupSample], observer: Any = None
) -> WarmupReport:
    """Run every sample on one instance; any failed request fails the warmup (and the load).

    With an observer (the model's statistics), each execution is reported as the batcher reports
    a batch, so warmup shows in the statistics as it does in Triton's."""
    started = time.perf_counter()
    executions = 0
    for sample in samples:
        for _ in range(sample.iterations):
            requests = sample.requests(spec, version)
            outcomes = _execute(instance, requests, observer)
            executions += 1
            for outcome in outcomes:
                if isinstance(outcome, InferenceError):
                    raise WarmupError(
                        f"warmup sample '{sample.name}' failed on instance {instance.name}: {outcome.message}"
                    )
    seconds = time.perf_counter() - started
    if samples:
        log.info("model '%s' instance %s warmed up: %d execution(s) in %.3f s", spec.name, instance.name, executions, seconds)
    return WarmupReport(instance.name, executions, seconds)

