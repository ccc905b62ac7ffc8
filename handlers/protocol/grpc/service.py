"""`inference.GRPCInferenceService` over one `ModelRepository`: every RPC of Triton's
grpc_service.proto, answered as tritonserver 2.51 answers it (codes and messages measured against
the real server; docs/grpc.md lists each RPC and every deviation).

The service is registered from the generated service descriptor with raw-bytes request
deserializers: requests are parsed here, so a malformed protobuf is INVALID_ARGUMENT with a
message (grpcio's own deserializer failure would be INTERNAL, tritonserver's is INTERNAL too).

Inference feeds the same runtime as REST: `validate_request`, the request limits
(handlers/limits.py), the model's scheduler (batcher, statistics, metrics); a repeated request is
made from its plan (handlers/protocol/grpc/plans.py), as HTTP's are.

`ModelStreamInfer` reads requests while earlier ones run: each request is inferred concurrently,
responses of non-decoupled models are written in request order (as Triton does), those of
decoupled models as the model sends them (its response stream, handlers/streaming.py, read in
`_responses`); ModelInfer refuses decoupled models as tritonserver does.
A client that cancels the stream cancels its requests: queued ones leave the batcher's queue, and
a decoupled model sees `request.is_cancelled()`.
While the server drains (SIGTERM), requests already received are answered, new ones get an
UNAVAILABLE error response, and the stream ends once nothing is left in flight.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from ... import workers
from ...batching import OnLoop
from ...errors import ErrorCode, InferenceError, invalid_argument, not_found, unavailable, unsupported
from ...inference import InferOutcome, InferRequest
from ...limits import PayloadTooLarge
from ...model_repository import LoadedModel, ModelRepository
from ...streaming import StreamEvent
from ..routes import model_metadata_document, server_metadata_document
from . import generated, plans
from ..settings import process_log_settings, trace_settings
from .tensors import FINAL_RESPONSE, encode_infer_response, parse_version, set_parameter

log = logging.getLogger("handlers.protocol.grpc")

SERVICE_NAME = "inference.GRPCInferenceService"

# Triton's TRITONSERVER_Error_Code -> gRPC status (grpc_utils.cc).
_STATUS = {
    ErrorCode.UNKNOWN: grpc.StatusCode.UNKNOWN,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.INVALID_ARG: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.UNSUPPORTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.CANCELLED: grpc.StatusCode.CANCELLED,
}

SHARED_MEMORY_UNSUPPORTED = (
    "{kind} shared memory is not supported by this server: it runs on a serverless platform, where the "
    "client and the server never share a host; send tensors in the request (raw_input_contents)"
)


def status_of(error: InferenceError) -> grpc.StatusCode:
    """The gRPC status of an error: Triton's mapping; a request over a size limit (HTTP 413) is
    RESOURCE_EXHAUSTED, gRPC's code for a message over its size limit."""
    if isinstance(error, PayloadTooLarge):
        return grpc.StatusCode.RESOURCE_EXHAUSTED
    return _STATUS.get(error.code, grpc.StatusCode.UNKNOWN)


class _Stream:
    """One ModelStreamInfer call: responses waiting to be written, in the order they go out."""

    def __init__(self) -> None:
        self.out: asyncio.Queue[Any] = asyncio.Queue()
        self.ordered: collections.deque[asyncio.Future[list[Any]]] = collections.deque()
        self.tasks: set[asyncio.Task[None]] = set()
        self.reading = True
        self.draining = False

    @property
    def idle(self) -> bool:
        return not self.tasks and not self.ordered

    def flush(self, _: object = None) -> None:
        """Move the finished responses at the head of the request order to the writer."""
        while self.ordered and self.ordered[0].done():
            future = self.ordered.popleft()
            if not future.cancelled():
                for response in future.result():
                    self.out.put_nowait(response)
        self.out.put_nowait(None)  # wake the writer: it checks whether the stream is finished


class InferenceService:
    """The servicer. `handler()` gives the grpc generic handler to add to a server."""

    def __init__(self, repository: ModelRepository) -> None:
        _, self.pb, _ = generated.load()
        self.repository = repository
        self.log_settings = process_log_settings()
        self.draining = False
        self._streams: set[_Stream] = set()

    # -- registration -------------------------------------------------------------------------

    def handler(self) -> grpc.GenericRpcHandler:
        """Every method of the service descriptor, bound to the method of the same name here."""
        descriptor = self.pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
        handlers: dict[str, grpc.RpcMethodHandler] = {}
        for method in descriptor.methods:
            request_class = getattr(self.pb, method.input_type.name)
            if method.client_streaming and method.server_streaming:
                handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                    self._stream_behavior(request_class), response_serializer=_serialize
                )
            else:
                handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                    self._unary_behavior(method.name, request_class), response_serializer=_serialize
                )
        return grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)

    def _unary_behavior(self, name: str, request_class: Any) -> Callable[..., Any]:
        implementation = getattr(self, name)

        async def behavior(data: bytes, context: grpc.aio.ServicerContext) -> Any:
            try:
                return await implementation(_parse(request_class, data))
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                await context.abort(*_failure(name, exc))

        behavior.__name__ = name
        return behavior

    # -- health, metadata ---------------------------------------------------------------------

    async def ServerLive(self, request: Any) -> Any:  # noqa: N802 (the RPC's name)
        return self.pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any) -> Any:  # noqa: N802
        return self.pb.ServerReadyResponse(ready=not self.draining and await workers.server_ready(self.repository))

    async def ModelReady(self, request: Any) -> Any:  # noqa: N802
        version = parse_version(request.version)
        try:
            model = self.repository.get(request.name, version)
        except InferenceError:
            return self.pb.ModelReadyResponse(ready=False)
        return self.pb.ModelReadyResponse(ready=model.ready)

    async def ServerMetadata(self, request: Any) -> Any:  # noqa: N802
        document = server_metadata_document()
        return self.pb.ServerMetadataResponse(
            name=document["name"], version=document["version"], extensions=document["extensions"]
        )

    def _ready_model(self, name: str, version_text: str) -> LoadedModel:
        model = self.repository.get(name, parse_version(version_text))
        if not model.ready:
            raise model.not_ready_error()
        return model

    async def ModelMetadata(self, request: Any) -> Any:  # noqa: N802
        model = self._ready_model(request.name, request.version)
        document = model_metadata_document(model, self.repository.ready_versions(model.name))
        response = self.pb.ModelMetadataResponse(
            name=document["name"], versions=document["versions"], platform=document["platform"]
        )
        for key in ("inputs", "outputs"):
            for tensor in document[key]:
                getattr(response, key).add(name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"])
        return response

    async def ModelConfig(self, request: Any) -> Any:  # noqa: N802
        model = self.repository.get(request.name, parse_version(request.version))
        response = self.pb.ModelConfigResponse()
        json_format.ParseDict(model.spec.config, response.config, ignore_unknown_fields=True)
        return response

    async def ModelStatistics(self, request: Any) -> Any:  # noqa: N802
        repository = self.repository
        version = parse_version(request.version)
        if not request.name:
            models = [m for name in sorted(repository.models) for _, m in sorted(repository.models[name].items())]
        elif request.name not in repository.models:
            raise invalid_argument(f"requested model '{request.name}' is not available")
        elif version is None:
            models = [m for _, m in sorted(repository.models[request.name].items())]
        else:
            model = repository.models[request.name].get(version)
            if model is None or not model.ready:
                raise invalid_argument(f"requested model version is not available for model '{request.name}'")
            models = [model]
        response = self.pb.ModelStatisticsResponse()
        json_format.ParseDict(
            {"model_stats": await workers.statistics(repository, (m for m in models if m.ready))}, response,
            ignore_unknown_fields=True,
        )
        return response

    async def RepositoryIndex(self, request: Any) -> Any:  # noqa: N802
        if request.repository_name:
            raise unsupported("'repository_name' specification is not supported")
        response = self.pb.RepositoryIndexResponse()
        for entry in self.repository.index():
            if request.ready and entry["state"] != "READY":
                continue
            response.models.add(**entry)
        return response

    async def RepositoryModelLoad(self, request: Any) -> Any:  # noqa: N802
        raise _model_control_error()

    async def RepositoryModelUnload(self, request: Any) -> Any:  # noqa: N802
        raise _model_control_error()

    # -- shared memory: never shared with a serverless client ---------------------------------

    async def SystemSharedMemoryStatus(self, request: Any) -> Any:  # noqa: N802
        if request.name:
            raise not_found(f"Unable to find system shared memory region: '{request.name}'")
        return self.pb.SystemSharedMemoryStatusResponse()

    async def SystemSharedMemoryRegister(self, request: Any) -> Any:  # noqa: N802
        raise unsupported(SHARED_MEMORY_UNSUPPORTED.format(kind="system"))

    async def SystemSharedMemoryUnregister(self, request: Any) -> Any:  # noqa: N802
        return self.pb.SystemSharedMemoryUnregisterResponse()  # nothing is ever registered

    async def CudaSharedMemoryStatus(self, request: Any) -> Any:  # noqa: N802
        if request.name:
            raise not_found(f"Unable to find cuda shared memory region: '{request.name}'")
        return self.pb.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(self, request: Any) -> Any:  # noqa: N802
        raise unsupported(SHARED_MEMORY_UNSUPPORTED.format(kind="CUDA"))

    async def CudaSharedMemoryUnregister(self, request: Any) -> Any:  # noqa: N802
        return self.pb.CudaSharedMemoryUnregisterResponse()

    # -- settings -------------------------------------------------------------------------------

    async def TraceSetting(self, request: Any) -> Any:  # noqa: N802
        if request.model_name and request.model_name not in self.repository.models:
            raise invalid_argument(f"Request for unknown model : {request.model_name}")
        values = trace_settings({key: list(value.value) for key, value in request.settings.items()})
        response = self.pb.TraceSettingResponse()
        for key, value in values.items():
            response.settings[key].value.extend(value)
        return response

    async def LogSettings(self, request: Any) -> Any:  # noqa: N802
        updates = {}
        for key, value in request.settings.items():
            kind = value.WhichOneof("parameter_choice")
            updates[key] = (kind, None if kind is None else getattr(value, kind))
        values = self.log_settings.update(updates)
        response = self.pb.LogSettingsResponse()
        for key, value in values.items():
            setting = response.settings[key]
            if isinstance(value, bool):
                setting.bool_param = value
            elif isinstance(value, int):
                setting.uint32_param = value
            else:
                setting.string_param = value
        return response

    # -- inference ------------------------------------------------------------------------------

    def _request(self, message: Any, *, unary: bool, model: LoadedModel | None = None,
                 ) -> tuple[LoadedModel, InferRequest, bool]:
        """A ModelInferRequest as the runtime's request (validated, within the limits), its model
        (`model`, or the one it names), and whether the client asked for an empty final response.
        ModelInfer refuses a decoupled model, as tritonserver does (its responses need
        ModelStreamInfer)."""
        if model is None:
            model = self._ready_model(message.model_name, message.model_version)
        if unary and model.decoupled:
            raise unsupported("ModelInfer RPC doesn't support models with decoupled transaction policy")
        request, empty_final = plans.infer_request(model, message)
        return model, request, empty_final

    async def _infer(self, message: Any) -> tuple[Any, bool]:
        """One ModelInferRequest to its ModelInferResponse (InferenceError on failure), and
        whether the client asked for an empty final response."""
        model, request, empty_final = self._request(message, unary=True)
        return await self._reply(model, request), empty_final

    async def _reply(self, model: LoadedModel, request: InferRequest) -> Any:
        response = await model.infer(request)
        reply = self.pb.ModelInferResponse()
        encode_infer_response(response, request, model.spec.config, reply, labels=model.labels, io=model.io)
        return reply

    async def ModelInfer(self, request: Any) -> Any:  # noqa: N802
        reply, _ = await self._infer(request)
        return reply

    def queue_model_infer(self, data: bytes, loop: asyncio.AbstractEventLoop, reply: Callable[[bytes], None],
                          fail: Callable[[grpc.StatusCode, str], None]) -> Callable[[], bool] | None | bool:
        """ModelInfer without a task or a coroutine, for a front end that answers calls itself
        (handlers/protocol/grpc/nativeserver.py): the request is parsed, checked and queued here,
        and `reply(response bytes)` or `fail(status, details)` runs on `loop` once its batch is
        done (a batch's answers delivered by one wake-up of the loop: handlers.batching.OnLoop);
        a request refused before it is queued is answered at once. The answers, errors and logs
        are ModelInfer's. Returns the queued request's `cancel` (for a cancelled call: it leaves
        the queue unless it already runs), None when it was answered at once, or False, with
        nothing answered, for a model that runs requests as coroutines only (ensembles): the
        method handler serves those."""
        try:
            message = _parse(self.pb.ModelInferRequest, data)
            model = self._ready_model(message.model_name, message.model_version)
            if not model.queues_callbacks:
                return False
            _, request, _ = self._request(message, unary=True, model=model)
            return model.submit(request, OnLoop(loop, functools.partial(self._answer_queued, model, request,
                                                                        reply, fail))).cancel
        except Exception as exc:
            fail(*_failure("ModelInfer", exc))
        return None

    def _answer_queued(self, model: LoadedModel, request: InferRequest, reply: Callable[[bytes], None],
                       fail: Callable[[grpc.StatusCode, str], None], outcome: InferOutcome) -> None:
        """`queue_model_infer`'s second half, on the loop."""
        if isinstance(outcome, InferenceError):
            fail(*_failure("ModelInfer", outcome))
            return
        try:
            response = self.pb.ModelInferResponse()
            encode_infer_response(outcome, request, model.spec.config, response, labels=model.labels, io=model.io)
            data = _serialize(response)
        except Exception as exc:
            fail(*_failure("ModelInfer", exc))
            return
        reply(data)

    async def _responses(self, message: Any) -> AsyncIterator[Any]:
        """The stream responses of one request: every response the model gives, the last one
        marked final (`triton_final_response`), or one error response. A non-decoupled model gives
        exactly one; a decoupled model's (zero or more, then the final flag) are yielded as the
        model sends them (`_read` writes them out at once)."""
        try:
            model, request, empty_final = self._request(message, unary=False)
            if model.decoupled:
                stream = model.stream(request)
            else:
                reply = await self._reply(model, request)
        except InferenceError as error:
            if error.http_status >= 500 and error.code is not ErrorCode.UNAVAILABLE:
                log.error("ModelStreamInfer request failed (%s): %s", error.code.name, error)
            yield self._stream_error(message, error.message)
            return
        if not model.decoupled:
            set_parameter(reply.parameters[FINAL_RESPONSE], True)
            yield self.pb.ModelStreamInferResponse(infer_response=reply)
            return
        try:
            async for event in stream:
                response = self._stream_event(model, request, event, empty_final)
                if response is not None:
                    yield response
        finally:
            if not stream.closed:
                stream.cancel()  # the client cancelled (the task is cancelled): so is the request

    def _stream_event(self, model: LoadedModel, request: InferRequest, event: StreamEvent, empty_final: bool) -> Any:
        """One event of a decoupled model as tritonserver 2.51 writes it: a response with
        `triton_final_response` (true on the last one); an error as `error_message` with the model
        name, the id and `triton_final_response`; a flag-only final only when the client asked for
        it (`triton_enable_empty_final_response`), as a response with no outputs."""
        error = event.error
        if event.response is not None:
            reply = self.pb.ModelInferResponse()
            try:
                encode_infer_response(event.response, request, model.spec.config, reply, labels=model.labels)
            except InferenceError as failure:
                log.error("ModelStreamInfer: %s", failure.message)
                error = failure
            else:
                set_parameter(reply.parameters[FINAL_RESPONSE], event.final)
                return self.pb.ModelStreamInferResponse(infer_response=reply)
        if error is None and not empty_final:
            return None
        reply = self.pb.ModelInferResponse(model_name=model.name, id=request.id)
        set_parameter(reply.parameters[FINAL_RESPONSE], event.final)
        if error is None:
            return self.pb.ModelStreamInferResponse(infer_response=reply)
        return self.pb.ModelStreamInferResponse(error_message=error.message, infer_response=reply)

    def _stream_error(self, message: Any, text: str) -> Any:
        response = self.pb.ModelStreamInferResponse(error_message=text)
        if message is not None:
            response.infer_response.id = message.id
        return response

    def _decoupled(self, message: Any) -> bool:
        """Whether the request's model is decoupled (its responses are not kept in request order)."""
        try:
            model = self.repository.get(message.model_name, parse_version(message.model_version))
        except InferenceError:
            return False  # the ordered path answers the error
        return model.decoupled

    async def _collect(self, message: Any, error: str | None) -> list[Any]:
        """Every response of a request kept in request order (a parse error: its error response)."""
        if message is None:
            return [self._stream_error(None, error or "")]
        try:
            return [response async for response in self._responses(message)]
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # our own fault: logged, answered, the stream goes on
            log.exception("internal error serving a ModelStreamInfer request")
            return [self._stream_error(message, f"internal error: {type(exc).__name__}")]

    async def _deliver(self, stream: _Stream, message: Any) -> None:
        """A decoupled request's responses, written out as they come."""
        try:
            async for response in self._responses(message):
                stream.out.put_nowait(response)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("internal error serving a ModelStreamInfer request")
            stream.out.put_nowait(self._stream_error(message, f"internal error: {type(exc).__name__}"))

    def _stream_behavior(self, request_class: Any) -> Callable[..., Any]:
        async def ModelStreamInfer(requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext):  # noqa: N802
            stream = _Stream()
            stream.draining = self.draining
            self._streams.add(stream)
            reader = asyncio.ensure_future(self._read(stream, requests))
            try:
                while True:
                    response = await stream.out.get()
                    if response is not None:
                        yield response
                    elif stream.idle and stream.out.empty() and (not stream.reading or stream.draining):
                        break  # nothing running and nothing left to write (a wake-up may precede a response)
            finally:
                self._streams.discard(stream)
                reader.cancel()
                for task in list(stream.tasks):
                    task.cancel()  # a cancelled request leaves the batcher's queue

        return ModelStreamInfer

    async def _read(self, stream: _Stream, requests: AsyncIterator[bytes]) -> None:
        try:
            async for data in requests:
                try:
                    message, error = _parse(self.pb.ModelInferRequest, data), None
                except InferenceError as exc:
                    message, error = None, exc.message
                if stream.draining:
                    refused = unavailable("Server is stopping: the stream accepts no new inference requests")
                    stream.out.put_nowait(self._stream_error(message, refused.message))
                    continue
                if message is not None and self._decoupled(message):
                    task = asyncio.ensure_future(self._deliver(stream, message))
                    stream.tasks.add(task)  # type: ignore[arg-type]
                    task.add_done_callback(lambda t: (stream.tasks.discard(t), stream.out.put_nowait(None)))
                    continue
                future: asyncio.Future[list[Any]] = asyncio.ensure_future(self._collect(message, error))
                stream.ordered.append(future)
                stream.tasks.add(future)  # type: ignore[arg-type]
                future.add_done_callback(lambda f: (stream.tasks.discard(f), stream.flush()))
        except asyncio.CancelledError:
            raise
        except Exception:  # the client went away or broke the stream: the writer ends it
            log.debug("ModelStreamInfer: reading requests ended", exc_info=True)
        finally:
            stream.reading = False
            stream.out.put_nowait(None)

    def begin_drain(self) -> None:
        """SIGTERM: finish what was received, refuse new stream requests, end idle streams."""
        self.draining = True
        for stream in list(self._streams):
            stream.draining = True
            stream.out.put_nowait(None)


def _parse(request_class: Any, data: bytes) -> Any:
    try:
        return request_class.FromString(data)
    except DecodeError as exc:
        raise invalid_argument(
            f"failed to parse the request: not a valid inference.{request_class.DESCRIPTOR.name} protobuf ({exc})"
        ) from None
    except Exception as exc:  # e.g. RecursionError on absurd nesting
        raise invalid_argument(
            f"failed to parse the request: not a valid inference.{request_class.DESCRIPTOR.name} protobuf "
            f"({type(exc).__name__})"
        ) from None


def _failure(name: str, exc: Exception) -> tuple[grpc.StatusCode, str]:
    """The status and details an RPC that raised `exc` ends with: an InferenceError's own (logged
    when the server is at fault), else INTERNAL naming only the exception's type (our own fault:
    logged with its traceback, never sent)."""
    if isinstance(exc, InferenceError):
        if exc.http_status >= 500 and exc.code is not ErrorCode.UNAVAILABLE:
            log.error("%s failed (%s): %s", name, exc.code.name, exc)
        return status_of(exc), exc.message
    log.error("internal error serving %s", name, exc_info=exc)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}"


def _serialize(message: Any) -> bytes:
    return message.SerializeToString()


def _model_control_error() -> InferenceError:
    """tritonserver's answer when the model control mode is not EXPLICIT (an image serves the
    models it was built with; `toolkit serve` is tritonserver's default mode NONE)."""
    return unavailable("explicit model load / unload is not allowed if polling is enabled")


__all__ = ["InferenceService", "SERVICE_NAME", "status_of"]
