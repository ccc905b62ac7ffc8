"""Ensembles (`platform: "ensemble"`): steps executed as a data-flow graph, as Triton's ensemble
scheduler does. A step runs as soon as every ensemble tensor in its `input_map` exists, so
independent steps run concurrently; each composing model keeps its own batcher and instances
(requests of concurrent ensemble calls meet in those batchers). `model_version: -1` is the
latest ready version. The first failing step fails the ensemble request with that step's error.

Statistics follow tritonserver 2.51 (measured): one success/execution per ensemble request,
inference_count += its batch size, and compute_input/infer/output the sum of the composing
requests' compute durations.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Protocol

import numpy as np

from ..batching import BatchExecution, FailureReason
from ..errors import InferenceError, internal, unavailable
from ..inference import InferRequest, InferResponse, RequestedOutput
from ..manifest import ModelSpec
from ..protocol.codec import log_prefix
from ..protocol.validation import validate_request
from ..statistics import ModelStatistics


class ComposingModel(Protocol):
    """A loaded version of a composing model (model_repository.LoadedModel)."""

    spec: ModelSpec

    async def infer(self, request: InferRequest) -> InferResponse: ...


class Models(Protocol):
    """Where the scheduler finds its composing models (the model repository that runs it)."""

    def get(self, name: str, version: str | int | None = None) -> ComposingModel: ...


class _Step:
    def __init__(self, index: int, step: dict[str, Any]) -> None:
        self.index = index
        self.model = step["model_name"]
        self.version = int(step.get("model_version", -1))
        self.input_map: dict[str, str] = dict(step.get("input_map", {}))  # model input -> ensemble tensor
        self.output_map: dict[str, str] = dict(step.get("output_map", {}))  # model output -> ensemble tensor

    def ready(self, tensors: dict[str, np.ndarray]) -> bool:
        return all(t in tensors for t in self.input_map.values())


class EnsembleScheduler:
    def __init__(self, spec: ModelSpec, version: int, repository: Models, statistics: ModelStatistics) -> None:
        self.spec = spec
        self.version = version
        self.repository = repository
        self.statistics = statistics
        self.steps = [_Step(i, s) for i, s in enumerate(spec.config["ensemble_scheduling"]["step"])]
        self._accepting = True

    def composing_models(self) -> list[tuple[str, int]]:
        return [(s.model, s.version) for s in self.steps]

    def start(self) -> None:
        self._accepting = True

    def stop(self, drain: bool = True, timeout: float | None = None) -> bool:
        self._accepting = False
        return True

    async def infer(self, request: InferRequest) -> InferResponse:
        if not self._accepting:  # the batchers' stopping error: UNAVAILABLE (503), as in Triton
            raise unavailable(
                f"{log_prefix(request.id)}Server is stopping, scheduler for model has stopped accepting new "
                "inference requests"
            )
        request.queue_start_ns = request.queue_start_ns or time.monotonic_ns()
        request.compute_start_ns = time.monotonic_ns()
        tensors: dict[str, np.ndarray] = dict(request.inputs)
        pending = list(self.steps)
        running: dict[asyncio.Task, _Step] = {}
        composing: list[InferRequest] = []
        try:
            while pending or running:
                for step in [s for s in pending if s.ready(tensors)]:
                    pending.remove(step)
                    step_request = self._step_request(request, step, tensors)
                    composing.append(step_request)
                    model = self.repository.get(step.model, None if step.version == -1 else step.version)
                    running[asyncio.ensure_future(model.infer(step_request))] = step
                if not running:
                    missing = sorted({t for s in pending for t in s.input_map.values() if t not in tensors})
                    raise internal(
                        f"ensemble '{self.spec.name}' cannot run its remaining steps: tensors {missing} were never produced"
                    )
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    step = running.pop(task)
                    try:
                        response = task.result()
                    except InferenceError as exc:  # tritonserver prefixes a composing model's error
                        raise InferenceError(f"in ensemble '{self.spec.name}', {exc.message}", exc.code) from None
                    for output, tensor in step.output_map.items():
                        if output in response.outputs:
                            tensors[tensor] = response.outputs[output]
        except BaseException as exc:
            for task in running:
                task.cancel()
            self.statistics.request_failed(
                None, request, exc if isinstance(exc, InferenceError) else internal(str(exc)), FailureReason.BACKEND
            )
            raise
        outputs = self._outputs(request, tensors)
        self._record(request, composing)
        return InferResponse(self.spec.name, self.version, outputs, id=request.id)

    def infer_sync(self, request: InferRequest, timeout: float | None = None) -> InferResponse:
        return asyncio.run(asyncio.wait_for(self.infer(request), timeout))

    def _step_request(self, request: InferRequest, step: _Step, tensors: dict[str, np.ndarray]) -> InferRequest:
        step_request = InferRequest(
            model_name=step.model,
            model_version=step.version,
            inputs={model_input: tensors[tensor] for model_input, tensor in step.input_map.items()},
            requested_outputs=[RequestedOutput(name) for name in step.output_map],
            id=request.id,
            parameters=dict(request.parameters),
            priority=request.priority,
            timeout_us=request.timeout_us,
            correlation_id=request.correlation_id,
            flags=request.flags,
        )
        try:
            validate_request(self.repository.get(step.model).spec.config, step_request)
        except InferenceError as exc:
            raise InferenceError(f"in ensemble '{self.spec.name}', {exc.message}", exc.code) from None
        return step_request

    def _outputs(self, request: InferRequest, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = [o["name"] for o in self.spec.config.get("output", [])]
        if request.requested_outputs is not None:
            wanted = {o.name for o in request.requested_outputs}
            names = [n for n in names if n in wanted]
        missing = [n for n in names if n not in tensors]
        if missing:
            raise internal(f"ensemble '{self.spec.name}' did not produce output(s) {missing}")
        return {name: tensors[name] for name in names}

    def _record(self, request: InferRequest, composing: list[InferRequest]) -> None:
        input_ns = sum(r.compute_input_end_ns - r.compute_start_ns for r in composing)
        infer_ns = sum(r.compute_infer_end_ns - r.compute_input_end_ns for r in composing)
        output_ns = sum(r.compute_end_ns - r.compute_infer_end_ns for r in composing)
        end = time.monotonic_ns()
        # Express the ensemble as one request whose compute durations are the composing sums.
        request.compute_input_end_ns = request.compute_start_ns + input_ns
        request.compute_infer_end_ns = request.compute_input_end_ns + infer_ns
        request.compute_end_ns = request.compute_infer_end_ns + output_ns
        self.statistics.batch_executed(
            BatchExecution(
                instance=self.spec.name,
                batch_size=max(1, request.batch_size),
                request_count=1,
                start_ns=request.compute_start_ns,
                compute_start_ns=request.compute_input_end_ns,
                compute_end_ns=request.compute_infer_end_ns,
                end_ns=request.compute_end_ns,
            )
        )
        self.statistics.request_succeeded(self.spec.name, request, end_ns=end)

