"""Triton's generate extension: `POST /v2/models/{m}[/versions/{v}]/generate` and `generate_stream`.

A text-oriented endpoint for LLM-style models (docs/protocol/extension_generate.md and
http_server.cc HandleGenerate in tritonserver 2.51), for any model, decoupled or not:

- Request: a JSON object. Each top-level key, and each key of the optional `parameters` object,
  that names a model input becomes that input; any other key becomes a request parameter
  (string, integer, number or boolean; the model reads them in `request.parameters()`; `id` is
  also the request id). An input's value is one element or a flat array; its shape is the model's
  input shape with the element count spread over it: fixed dimensions must divide the count, the
  innermost variable dimension takes the rest, other variable dimensions (the batch one) are 1.
- Response: one flat JSON object per model response: `id` (when the request has one),
  `model_name`, `model_version`, the response parameters, and each output by name (one element
  as a scalar, more as a flat array), keys in byte order as Triton writes them.
- `generate` answers the model's single response as `application/json`; `generate_stream`
  answers server-sent events (`text/event-stream; charset=utf-8`), one `data: {...}` event per
  response and `data: {"error": "..."}` for an error response, as the model sends them, and ends
  when the model sends the final flag. The HTTP status is the first event's (200, or its error's);
  a request that fails before inference is a JSON error with its status, as for every endpoint.

Deviations (docs/triton-compatibility.md): malformed requests are 400 with a message where Triton
answers 500 or crashes; a `generate` call whose model sends zero or several responses is 500 with
Triton's message where Triton answers 200 with it; the first error event's status is its own
code's where Triton's is unreliable (observed 400 for INTERNAL); `generate_stream` also sends
`cache-control: no-cache` and `x-accel-buffering: no`, so proxies do not buffer the events. A
client that disconnects cancels its request: it leaves the queue, and the model sees
`request.is_cancelled()`. Where responses cannot stream (AWS Lambda), `generate_stream` is
refused with the reason (`create_app(..., streaming=False)`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Mapping
from typing import Annotated, Any

import numpy as np
import orjson
from fastapi import APIRouter, Path, Request
from fastapi.responses import Response
from starlette.types import Receive, Scope, Send

from .. import limits
from ..datatypes import from_config_type
from ..errors import InferenceError, internal, invalid_argument, unsupported
from ..inference import InferRequest, InferResponse
from ..model_repository import ModelRepository
from ..streaming import ResponseStream, StreamEvent
from .binary import BytesContext
from .codec import (
    encode_error,
    json_data,
    json_tensor,
    log_prefix,
    parse_json,
    tensor_datatype,
    unsendable_output,
)
from .validation import validate_request

log = logging.getLogger("handlers.protocol.generate")

__all__ = ["decode_generate", "encode_generate", "router", "EXACTLY_ONE", "NO_STREAMING"]

JSON = "application/json"
EVENT_STREAM = "text/event-stream; charset=utf-8"
EXACTLY_ONE = (
    "generate expects model to produce exactly 1 response, use generate stream for model that generates "
    "various number of responses"
)
NO_STREAMING = (
    "generate_stream is not available on AWS Lambda: a Python function returns its response in one piece "
    "(Lambda streams responses natively only for Node.js runtimes), so the events would all arrive at the end; "
    "use /generate for a model that sends one response, or deploy to Cloud Run or Knative, which stream"
)
_PARAMETER_TYPES = (str, int, bool, float)
_NESTED = "parameters"
_RESERVED = ("id", "model_name", "model_version")


# --- request -----------------------------------------------------------------------------------------


def decode_generate(
    body: bytes | bytearray | memoryview, config: Mapping[str, Any], *, model_name: str, model_version: int
) -> InferRequest:
    """A generate request body as an InferRequest of `config`'s model (not yet validated)."""
    document = parse_json(memoryview(body))
    if type(document) is not dict:
        raise invalid_argument(f"the generate request must be a JSON object, got {_kind(document)}")
    request_id = document.get("id", "")
    if type(request_id) is not str:
        raise invalid_argument(f"Unable to parse 'id': expected a string, got {_kind(request_id)}")
    request = InferRequest(
        model_name=model_name, model_version=model_version, inputs={}, id=request_id, frontend_parameters=False
    )
    inputs = {io["name"]: io for io in config.get("input", ())}
    batch = [-1] if int(config.get("max_batch_size", 0)) > 0 else []
    parameters: dict[str, Any] = {}

    def member(key: str, value: Any, where: str) -> None:
        io = inputs.get(key)
        if io is None:
            if type(value) not in _PARAMETER_TYPES:
                raise invalid_argument(
                    f"{where}parameter '{key}' has invalid type. It should be either 'int', 'bool', or 'string'."
                )
            parameters[key] = value
            return
        array = _tensor(key, value, from_config_type(io["data_type"]), batch + list(io["dims"]), model_name, where)
        if key in request.inputs:
            raise invalid_argument(f"{where}{log_prefix(request_id)}input '{key}' already exists in request")
        request.inputs[key] = array

    for key, value in document.items():
        if key != _NESTED:
            member(key, value, "")
            continue
        if _NESTED in inputs:
            raise invalid_argument(f"Keyword '{_NESTED}' for nested schema also given as input tensor name")
        if type(value) is not dict:
            raise invalid_argument(f"Expected JSON object for keyword: '{_NESTED}': got {_kind(value)}")
        for nested_key, nested_value in value.items():
            member(nested_key, nested_value, f"Converting keyword: '{_NESTED}': ")
    request.parameters = parameters
    return request


def _tensor(name: str, value: Any, datatype: str, shape: list[int], model_name: str, where: str) -> np.ndarray:
    data = value if type(value) is list else [value]
    count = len(data)
    # Triton's two passes: fixed dimensions divide the count, the innermost variable one takes the
    # rest, the other variable ones are 1.
    remaining = count
    for dim in reversed(shape):
        if dim != -1:
            if dim <= 0 or remaining % dim:
                raise invalid_argument(f"{where}The schema can not convert input '{name}' to tensor with proper shape")
            remaining //= dim
    resolved = list(shape)
    for index in range(len(resolved) - 1, -1, -1):
        if resolved[index] == -1:
            resolved[index] = remaining
            remaining = 1
    if remaining != 1:
        raise invalid_argument(f"{where}The schema can not convert input '{name}' to tensor with proper shape")
    try:
        return json_tensor(data, datatype, resolved, BytesContext(name, model_name, ""))
    except InferenceError as error:
        raise InferenceError(where + error.message, error.code) from None


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number"
    )


# --- response ----------------------------------------------------------------------------------------


def encode_generate(response: InferResponse, config: Mapping[str, Any], request_id: str = "") -> bytes:
    """One model response as the generate extension's flat JSON object (INTERNAL when an output
    cannot be written as JSON)."""
    datatypes = {o["name"]: from_config_type(o["data_type"]) for o in config.get("output", ())}
    items: dict[str, Any] = {}
    response_id = response.id or request_id
    if response_id:
        items["id"] = response_id
    items["model_name"] = response.model_name
    items["model_version"] = str(response.model_version)
    for key, value in (response.parameters or {}).items():
        if type(value) not in _PARAMETER_TYPES:
            raise internal(f"Response parameter '{key}' has a type that the generate extension cannot write")
        items.setdefault(key, value)
    for name, output in response.outputs.items():
        if name in items:
            continue  # Triton's map keeps the first entry of a name
        array = np.asarray(output)
        datatype = datatypes.get(name) or tensor_datatype(array)
        try:
            data = json_data(array, datatype)
        except (ValueError, TypeError, OverflowError) as exc:
            raise unsendable_output(response.model_name, name, array, datatype, exc) from None
        if data is None:
            raise internal(
                f"output '{name}' of model '{response.model_name}' holds bytes that are not UTF-8, which a JSON "
                "response cannot carry"
            )
        items[name] = _scalar(data) if math.prod(array.shape) == 1 else data
    return orjson.dumps({key: items[key] for key in sorted(items, key=lambda k: k.encode())},
                        option=orjson.OPT_SERIALIZE_NUMPY)


def _scalar(data: Any) -> Any:
    """The one element of an output's JSON data (Triton writes it without the array)."""
    if isinstance(data, orjson.Fragment):  # non-finite floats, pre-serialised as a JSON array
        text = data.contents.decode() if isinstance(data.contents, bytes) else data.contents
        return orjson.Fragment(text.strip()[1:-1].strip().encode())
    if isinstance(data, np.ndarray):
        return data.reshape(-1)[0]
    return data[0]


def _event_body(event: StreamEvent, config: Mapping[str, Any], request_id: str) -> bytes | None:
    """The JSON of one event (None for a flag-only final)."""
    if event.error is not None:
        return encode_error(event.error)
    if event.response is None:
        return None
    try:
        return encode_generate(event.response, config, request_id)
    except InferenceError as error:
        log.error("generate: %s", error.message)
        return encode_error(error)


# --- responses ------------------------------------------------------------------------------------


class _Watch:
    """Cancels the stream when the client disconnects (the request body is read by then, so
    the next ASGI message is the disconnect)."""

    def __init__(self, receive: Receive, stream: ResponseStream) -> None:
        self.task = asyncio.ensure_future(self._watch(receive, stream))

    @staticmethod
    async def _watch(receive: Receive, stream: ResponseStream) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                stream.cancel()
                return

    @property
    def disconnected(self) -> bool:
        return self.task.done()

    def stop(self) -> None:
        self.task.cancel()


class GenerateResponse(Response):
    """The answer of `generate`: the model's single response, read from its stream."""

    def __init__(self, stream: ResponseStream, config: Mapping[str, Any], request_id: str) -> None:
        super().__init__()
        self.stream, self.config, self.request_id = stream, config, request_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = _Watch(receive, self.stream)
        first: StreamEvent | None = None
        count = 0  # responses and errors (only the first is kept: more than one is an error)
        try:
            async for event in self.stream:
                if event.response is not None or event.error is not None:
                    count += 1
                    first = first or event
        finally:
            watch.stop()
        if watch.disconnected:
            return  # nobody to answer
        error = internal(EXACTLY_ONE) if count != 1 or first is None else first.error
        if error is None:
            try:
                body = encode_generate(first.response, self.config, self.request_id)  # type: ignore[union-attr,arg-type]
            except InferenceError as failure:
                log.error("generate: %s", failure.message)
                error = failure
        if error is not None:
            status, body = error.http_status, encode_error(error)
        else:
            status = 200
        await _send(send, status, JSON, [body], more=False)


class EventStreamResponse(Response):
    """The answer of `generate_stream`: server-sent events, written as the model sends them
    (each event is its own ASGI body message: uvicorn writes it at once)."""

    def __init__(self, stream: ResponseStream, config: Mapping[str, Any], request_id: str) -> None:
        super().__init__()
        self.stream, self.config, self.request_id = stream, config, request_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = _Watch(receive, self.stream)
        try:
            first = await anext(self.stream, None)
            if watch.disconnected:
                return
            status = 200 if first is None or first.error is None else first.error.http_status
            await send({"type": "http.response.start", "status": status, "headers": _headers(EVENT_STREAM, sse=True)})
            events = [] if first is None else [first]
            while True:
                for event in events:
                    body = _event_body(event, self.config, self.request_id)
                    if body is not None:
                        await send({"type": "http.response.body", "body": b"data: " + body + b"\n\n", "more_body": True})
                events = []
                event = await anext(self.stream, None)
                if event is None or watch.disconnected:
                    break
                events.append(event)
            if not watch.disconnected:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            watch.stop()
            if not self.stream.closed:
                self.stream.cancel()  # we stop reading: the model may stop too


def _headers(content_type: str, *, sse: bool = False, length: int | None = None) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", content_type.encode())]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    if sse:
        headers += [(b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
    return headers


async def _send(send: Send, status: int, content_type: str, chunks: list[bytes], more: bool) -> None:
    body = b"".join(chunks)
    await send({"type": "http.response.start", "status": status, "headers": _headers(content_type, length=len(body))})
    await send({"type": "http.response.body", "body": body, "more_body": more})


# --- routes -------------------------------------------------------------------------------------------

router = APIRouter(default_response_class=Response)

_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}}}
_GENERATE_REQUEST = {
    "title": "GenerateRequest",
    "description": "Model inputs and request parameters by name, e.g. {\"text_input\": \"...\", \"parameters\": "
    "{\"temperature\": 0.5}}; `parameters` may hold inputs too.",
    "type": "object",
    "properties": {"id": {"type": "string"}, "parameters": {"type": "object"}},
    "additionalProperties": True,
}
_GENERATE_RESPONSE = {
    "title": "GenerateResponse",
    "type": "object",
    "required": ["model_name", "model_version"],
    "properties": {"id": {"type": "string"}, "model_name": {"type": "string"}, "model_version": {"type": "string"}},
    "additionalProperties": True,
}


def _doc(streaming: bool) -> dict[str, Any]:
    ok: dict[str, Any] = (
        {"description": "Server-sent events: one `data: {...}` per model response, `data: {\"error\": ...}` for an "
                        "error response", "content": {"text/event-stream": {"schema": {"type": "string"}}}}
        if streaming
        else {"description": "The model's single response", "content": {JSON: {"schema": _GENERATE_RESPONSE}}}
    )
    error = {"content": {JSON: {"schema": _ERROR}}}
    return {
        "summary": "Generate (streaming)" if streaming else "Generate",
        "description": "Triton's generate extension. " + ("Streams every response of the model as it is sent."
                                                         if streaming else "For a model that sends one response."),
        "responses": {
            200: ok,
            400: {"description": "Malformed request, or one the model's configuration refuses", **error},
            404: {"description": "Unknown model or version", **error},
            413: {"description": "Request body or an input over the limits", **error},
            500: {"description": "The model's own error" + ("" if streaming else ", or not exactly one response"), **error},
            501: {"description": "Not available here" + (" (AWS Lambda cannot stream)" if streaming else ""), **error},
            503: {"description": "Not ready, queue full, queue timeout, or shutting down", **error},
            "4XX": {"description": "Another client error, e.g. 405 for a method the route does not take", **error},
        },
        "openapi_extra": {"requestBody": {"required": True, "content": {JSON: {"schema": _GENERATE_REQUEST}}}},
    }


_VERSION = Annotated[int, Path(ge=0, description="Model version (a directory number of the repository)")]


async def run_generate(request: Request, model_name: str, model_version: int | None, streaming: bool) -> Response:
    repository: ModelRepository = request.app.state.repository
    try:
        model = repository.get(model_name, model_version)
        if not model.ready:
            raise model.not_ready_error()
        if streaming and not getattr(request.app.state, "streaming", True):
            raise unsupported(NO_STREAMING)
        encoding = request.headers.get("content-encoding")
        if encoding is not None and encoding.strip().lower() not in ("", "identity"):
            raise invalid_argument("Unsupported content-encoding, only 'identity' is supported.")
        bounds = limits.LIMITS
        bounds.check_content_length(request.headers.get("content-length"))
        body = await limits.read_limited(request.stream(), bounds)
        infer_request = decode_generate(body, model.spec.config, model_name=model.name, model_version=model.version)
        bounds.check_request(infer_request)
        validate_request(model.spec.config, infer_request)
        stream = model.stream(infer_request)
    except InferenceError as error:
        if error.http_status >= 500 and error.http_status != 501:
            log.error("generate on model '%s' failed (%d): %s", model_name, error.http_status, error)
        return Response(encode_error(error), status_code=error.http_status, media_type=JSON)
    response_class = EventStreamResponse if streaming else GenerateResponse
    return response_class(stream, model.spec.config, infer_request.id)


@router.post("/v2/models/{model_name}/generate", **_doc(False))
async def generate(request: Request, model_name: str, model_version: int | None = None) -> Response:
    return await run_generate(request, model_name, model_version, streaming=False)


@router.post("/v2/models/{model_name}/versions/{model_version:int}/generate", **_doc(False))
async def generate_version(request: Request, model_name: str, model_version: _VERSION) -> Response:
    return await run_generate(request, model_name, model_version, streaming=False)


@router.post("/v2/models/{model_name}/generate_stream", **_doc(True))
async def generate_stream(request: Request, model_name: str, model_version: int | None = None) -> Response:
    return await run_generate(request, model_name, model_version, streaming=True)


@router.post("/v2/models/{model_name}/versions/{model_version:int}/generate_stream", **_doc(True))
async def generate_stream_version(request: Request, model_name: str, model_version: _VERSION) -> Response:
    return await run_generate(request, model_name, model_version, streaming=True)
