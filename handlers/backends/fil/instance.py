"""A fil model instance: a batch's rows concatenated, predicted once by Treelite, split back."""

from __future__ import annotations

import logging
import time

from ...batching.merge import (
    batch_responses, batch_sizes, merge_inputs, requested_output_names, run_batch, split_outputs, stamp_compute,
)
from ...errors import internal, invalid_argument
from ...inference import InferOutcome, InferRequest
from ...manifest import ModelSpec
from .errors import FilModelError
from .model import FilModel, load_model
from .parameters import parse_parameters
from .tensors import INPUT, OUTPUT, tensor_layout
from .treelite import TreeliteError

log = logging.getLogger("handlers.fil")


def prediction_threads(cpu_nthread: int, budget: int | None) -> int:
    """The threads an instance predicts with: FIL's `cpu_nthread` when it is positive, else the
    instance's share of the container's CPUs (handlers/cpu_budget.py), else (an instance made
    outside a ModelRepository, no plan) Treelite's default, -1: OpenMP's all cores, as FIL."""
    if cpu_nthread > 0:
        return cpu_nthread
    return budget if budget is not None else -1


class FilInstance:
    """One instance of a fil model. Treelite releases the GIL while it predicts, so instances
    run in parallel; each uses `threads` CPU threads (prediction_threads)."""

    def __init__(self, spec: ModelSpec, version: int, name: str, kind: str = "KIND_CPU", device_id: int = 0,
                 threads: int | None = None) -> None:
        self.name = name
        self.kind = kind
        self.device_id = device_id
        self.spec = spec
        self.version = version
        config = spec.config
        started = time.perf_counter()
        params = parse_parameters(config)
        layout = tensor_layout(config)
        self.model: FilModel = load_model(spec.model_files[version], config, params, layout)
        self.load_seconds = time.perf_counter() - started
        self.threads = prediction_threads(params.cpu_nthread, threads)
        self.batching = spec.max_batch_size > 0
        self._output_names = [io["name"] for io in config.get("output", [])]
        log.info(
            "model '%s' version %d instance %s: %s, %d trees, %d features (%s, %s), threads %d%s",
            spec.name, version, name, self.model.kind, self.model.forest.num_tree, self.model.forest.num_feature,
            params.model_type, self.model.forest.postprocessor, self.threads,
            " on CPU (the fil backend predicts with Treelite)" if kind == "KIND_GPU" else "",
        )
        for note in params.notes:
            log.info("model '%s': %s", spec.name, note)

    def execute(self, requests: list[InferRequest]) -> list[InferOutcome]:
        return run_batch(requests, self._run, batching=self.batching)

    def _run(self, requests: list[InferRequest]) -> list[InferOutcome]:
        start = time.monotonic_ns()
        try:
            rows = merge_inputs(requests, batching=self.batching)[INPUT]
            self.model.check_rows(rows)
        except (FilModelError, KeyError, ValueError) as exc:
            if len(requests) > 1:  # the requests at fault get the error, the others run
                return self._one_by_one(requests)
            message = exc.message if isinstance(exc, FilModelError) else f"model '{self.spec.name}': {exc}"
            return [invalid_argument(message)]
        input_end = time.monotonic_ns()
        try:
            scores = self.model.predict(rows, self.threads)
        except TreeliteError as exc:
            return [internal(f"model '{self.spec.name}': {exc}")] * len(requests)
        infer_end = time.monotonic_ns()
        names = requested_output_names(requests, self._output_names)
        produced = {OUTPUT: scores} if OUTPUT in names else {}
        sizes = batch_sizes(requests, batching=self.batching) if self.batching else [scores.shape[0]]
        parts = split_outputs(produced, sizes) if produced else [{} for _ in requests]
        outcomes: list[InferOutcome] = list(batch_responses(requests, parts))
        stamp_compute(requests, start, input_end, infer_end, time.monotonic_ns())
        return outcomes

    def _one_by_one(self, requests: list[InferRequest]) -> list[InferOutcome]:
        return run_batch(requests, self._run, batching=False)

    def close(self) -> None:
        self.model.close()
