"""Ensembles (`platform: "ensemble"`): steps executed as a data-flow graph, as Triton's ensemble
scheduler does. A step runs as soon as every ensemble tensor in its `input_map` exists, so
independent steps run concurrently; each composing model keeps its own batcher and instances
(requests of concurrent ensemble calls meet in those batchers). `model_version: -1` is the
latest ready version. The first failing step fails the ensemble request with that step's error.

Statistics follow tritonserver 2.51 (measured): one success/execution per ensemble request,
inference_count += its batch size, and compute_input/infer/output the sum of the composing
requests' compute durations. Every response carries the request's `sequence_id`,
`sequence_start` and `sequence_end` as response parameters, as tritonserver 2.51's ensembles
answer (CheckAndSetEnsembleOutput).

An ensemble with a decoupled step is decoupled itself (ValidateEnsembleConfig marks it) and
streams, as core's ensemble scheduler does: every response of a step adds one *iteration* of the
step's output tensors (an output the response leaves out is absent in that iteration, and a
consuming step gets no such input); a step runs once per iteration in which all of its inputs
exist; the ensemble sends a response whenever its requested outputs all exist in one iteration,
with the final flag when no step is left in flight (else a flag-only final follows). The first
error ends the request with that error at once; the steps still in flight run on and what they
send is dropped, as in tritonserver (a client that goes away cancels them).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Iterable
from typing import Any, Protocol

import numpy as np

from ..batching import BatchExecution, FailureReason
from ..batching.sequence_policy import SEQUENCE_END, SEQUENCE_START
from ..errors import InferenceError, internal, unavailable
from ..inference import InferRequest, InferResponse, RequestedOutput
from ..manifest import ModelSpec
from ..protocol.codec import log_prefix
from ..protocol.validation import validate_request
from ..statistics import ModelStatistics
from ..streaming import ResponseSink, StreamEvent


class ComposingModel(Protocol):
    """A loaded version of a composing model (model_repository.LoadedModel)."""

    spec: ModelSpec

    async def infer(self, request: InferRequest) -> InferResponse: ...

    def submit_stream(self, request: InferRequest, sink: ResponseSink, loop: asyncio.AbstractEventLoop) -> None: ...


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
        # for a decoupled ensemble: the steps reading each tensor, and the inputs a request may leave out
        self._consumers: dict[str, list[_Step]] = {}
        for step in self.steps:
            for tensor in dict.fromkeys(step.input_map.values()):
                self._consumers.setdefault(tensor, []).append(step)
        self._optional_inputs = [io["name"] for io in spec.config.get("input", []) if io.get("optional", False)]

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
        if self.spec.decoupled:
            await self._stream(request)
            return None  # type: ignore[return-value]  # the responses went to request.responses
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
        return InferResponse(self.spec.name, self.version, outputs, id=request.id, parameters=_sequence(request))

    def infer_sync(self, request: InferRequest, timeout: float | None = None) -> InferResponse:
        return asyncio.run(asyncio.wait_for(self.infer(request), timeout))

    # -- decoupled ensembles -------------------------------------------------------------------------

    async def _stream(self, request: InferRequest) -> None:
        """Run `request` through the data flow with iterations (the module's docstring), its
        responses going to `request.responses`; raises the ensemble's error (which then ends the
        stream: LoadedModel.submit_stream)."""
        sink = request.responses
        if sink is None:  # LoadedModel.infer refuses one-response calls to a decoupled model
            raise internal(f"ensemble '{self.spec.name}' is decoupled and was called without a response stream")
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[tuple[_Step, StreamEvent]] = asyncio.Queue()
        # ensemble tensor -> its tensors by iteration (None: absent in that iteration)
        tensors: dict[str, list[np.ndarray | None]] = {name: [array] for name, array in request.inputs.items()}
        for name in self._optional_inputs:
            tensors.setdefault(name, [None])
        requested = self._requested(request)
        open_steps: list[ResponseSink] = []
        composing: list[InferRequest] = []
        in_flight = 0

        def schedule(updated: Iterable[tuple[str, int]]) -> None:
            nonlocal in_flight
            ready = sorted(
                {
                    (step.index, iteration)
                    for tensor, iteration in updated
                    for step in self._consumers.get(tensor, ())
                    if all(len(tensors.get(t, ())) > iteration for t in step.input_map.values())
                }
            )
            for index, iteration in ready:
                step = self.steps[index]
                present = {t: tensors[t][iteration] for t in step.input_map.values()}
                step_request = self._step_request(request, step, {t: a for t, a in present.items() if a is not None})
                composing.append(step_request)
                model = self.repository.get(step.model, None if step.version == -1 else step.version)
                step_sink = ResponseSink(functools.partial(_deliver, loop, events, step))
                try:
                    model.submit_stream(step_request, step_sink, loop)
                except InferenceError as exc:
                    raise InferenceError(f"in ensemble '{self.spec.name}', {exc.message}", exc.code) from None
                open_steps.append(step_sink)
                in_flight += 1

        try:
            schedule((name, 0) for name in tensors)
            if not in_flight:
                raise internal(f"ensemble '{self.spec.name}' has no step to run")
            while in_flight:
                step, event = await events.get()
                if event.final:
                    in_flight -= 1
                if event.error is not None:
                    raise InferenceError(f"in ensemble '{self.spec.name}', {event.error.message}", event.error.code)
                updated: list[tuple[str, int]] = []
                if event.response is not None:
                    outputs = event.response.outputs
                    for model_output, tensor in step.output_map.items():
                        produced = tensors.setdefault(tensor, [])
                        updated.append((tensor, len(produced)))
                        produced.append(outputs.get(model_output))
                    schedule(updated)
                response = self._iteration_response(request, requested, updated, tensors)
                if response is not None:
                    sink.send(response, final=not in_flight)
                elif not in_flight:
                    sink.finish()  # the flag-only final
        except BaseException as exc:
            if not isinstance(exc, InferenceError):  # cancelled (the client went away), or our own fault
                for step_sink in open_steps:
                    if not step_sink.closed:
                        step_sink.cancel()
            self.statistics.request_failed(
                None, request, exc if isinstance(exc, InferenceError) else internal(str(exc)), FailureReason.BACKEND
            )
            raise
        self._record(request, [r for r in composing if r.compute_end_ns])

    def _iteration_response(
        self, request: InferRequest, names: list[str], updated: list[tuple[str, int]],
        tensors: dict[str, list[np.ndarray | None]],
    ) -> InferResponse | None:
        """CheckAndSetEnsembleOutput: the ensemble's response when an updated tensor is one of the
        requested outputs `names` and every one of them exists in that iteration (an absent one is
        left out)."""
        ready, iteration = False, 0
        for tensor, index in updated:
            if tensor in names:
                ready, iteration = all(len(tensors.get(n, ())) > index for n in names), index
        if not ready:
            return None
        outputs = {n: tensors[n][iteration] for n in names if tensors[n][iteration] is not None}
        return InferResponse(self.spec.name, self.version, outputs, id=request.id, parameters=_sequence(request))  # type: ignore[arg-type]

    def _step_request(self, request: InferRequest, step: _Step, tensors: dict[str, np.ndarray]) -> InferRequest:
        step_request = InferRequest(
            model_name=step.model,
            model_version=step.version,
            inputs={model_input: tensors[tensor] for model_input, tensor in step.input_map.items() if tensor in tensors},
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

    def _requested(self, request: InferRequest) -> list[str]:
        """The ensemble outputs `request` asks for (every one when it names none), in config order."""
        names = [o["name"] for o in self.spec.config.get("output", [])]
        if request.requested_outputs is not None:
            wanted = {o.name for o in request.requested_outputs}
            names = [n for n in names if n in wanted]
        return names

    def _outputs(self, request: InferRequest, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names = self._requested(request)
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


def _sequence(request: InferRequest) -> dict[str, Any]:
    """The response parameters of an ensemble's responses: the request's sequence, as the
    tensors the composing models produced carry it in Triton's ensemble scheduler."""
    return {
        "sequence_id": request.correlation_id,
        "sequence_start": bool(request.flags & SEQUENCE_START),
        "sequence_end": bool(request.flags & SEQUENCE_END),
    }


def _deliver(loop: asyncio.AbstractEventLoop, events: asyncio.Queue, step: _Step, event: StreamEvent) -> None:
    """A step's event, from the thread that sent it, to the ensemble request's queue on its loop
    (gone with the loop at shutdown: nobody reads it any more)."""
    try:
        loop.call_soon_threadsafe(events.put_nowait, (step, event))
    except RuntimeError:  # the loop is closed
        pass
