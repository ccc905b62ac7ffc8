"""An inference request's way from its headers and body to its reply, without FastAPI.

Every HTTP transport runs these steps, so all answer alike: the FastAPI infer routes
(handlers/protocol/routes.py), the app's ASGI fast path (handlers/app.py), the native HTTP front
end's queued path (handlers/protocol/httpnative) and the AWS Lambda handler's direct path
(handlers/entrypoints/lambda_handler.py). Nothing here imports FastAPI or Starlette, so the Lambda
handler serves inference events without them: its init imports them only when an event other than
an inference request arrives (docs/aws-lambda.md).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from .. import limits
from ..batching import OnLoop
from ..errors import InferenceError
from ..inference import InferOutcome, InferRequest, InferResponse
from ..model_repository import LoadedModel, ModelRepository, decoupled_error
from . import plans
from .codec import encode_error, encode_response
from .compression import compress, decompress

log = logging.getLogger("handlers.protocol.routes")
app_log = logging.getLogger("handlers.app")  # the app's exception handler logs under this name

JSON = "application/json"


@dataclass(frozen=True, slots=True)
class InferHeaders:
    """The request headers the infer route reads (None when absent)."""

    content_length: str | None = None
    header_length: str | None = None  # Inference-Header-Content-Length
    content_encoding: str | None = None
    accept_encoding: str | None = None

    @classmethod
    def from_raw(cls, raw: Iterable[tuple[bytes, bytes]]) -> "InferHeaders":
        """From ASGI `scope["headers"]` (lowercase names); the first occurrence of a name wins, as
        Starlette's `Headers.get` has it."""
        found: dict[bytes, str] = {}
        for key, value in raw:
            if key in _INFER_HEADER_NAMES and key not in found:
                found[key] = value.decode("latin-1")
        return cls(
            found.get(b"content-length"),
            found.get(b"inference-header-content-length"),
            found.get(b"content-encoding"),
            found.get(b"accept-encoding"),
        )


_INFER_HEADER_NAMES = frozenset(
    {b"content-length", b"inference-header-content-length", b"content-encoding", b"accept-encoding"}
)


@dataclass(slots=True)
class InferReply:
    """What the infer route answers: status, body and headers (lowercase names, content-type
    included)."""

    status: int
    body: bytes
    headers: dict[str, str]


def _error_reply(error: InferenceError) -> InferReply:
    return InferReply(error.http_status, encode_error(error), {"content-type": JSON})


def _infer_target(repository: ModelRepository, model_name: str, model_version: int | None,
                  headers: InferHeaders) -> LoadedModel:
    """The addressed model version, ready, not decoupled, and a declared body within the limit
    (before reading it)."""
    model = repository.get(model_name, model_version)
    if model.decoupled:  # tritonserver refuses before reading the body
        raise decoupled_error()
    if not model.ready:
        raise model.not_ready_error()
    limits.LIMITS.check_content_length(headers.content_length)
    return model


def _infer_request(model: LoadedModel, headers: InferHeaders, raw: bytes) -> InferRequest:
    body = decompress(raw, headers.content_encoding, limits.LIMITS.max_request_bytes)
    return plans.infer_request(model, body, headers.header_length)


def _ok_reply(model: LoadedModel, infer_request: InferRequest, response: InferResponse,
              headers: InferHeaders) -> InferReply:
    """The 200 reply to a request its model answered: the response encoded as the request asks,
    compressed as the client accepts."""
    payload, reply_headers = encode_response(response, infer_request, model.spec.config, labels=model.labels,
                                             io=model.io)
    payload, encoding = compress(payload, headers.accept_encoding)
    if encoding:
        reply_headers["content-encoding"] = encoding
    reply_headers.setdefault("content-type", JSON)
    return InferReply(200, payload, reply_headers)


def _failed_reply(model_name: str, error: InferenceError) -> InferReply:
    if error.http_status >= 500:  # the server's or the model's fault: the operator needs it
        log.error("inference of model '%s' failed (%d): %s", model_name, error.http_status, error)
    return _error_reply(error)


async def run_infer(
    repository: ModelRepository,
    model_name: str,
    model_version: int | None,
    headers: InferHeaders,
    chunks: AsyncIterator[bytes],
) -> InferReply:
    """One inference request from its headers and body chunks to the reply (errors included).

    Shared by the FastAPI route and the ASGI fast path (handlers/app.py), so both answer alike;
    `run_infer_sync` is the same steps for a body already whole, outside an event loop (Lambda).
    """
    try:
        model = _infer_target(repository, model_name, model_version, headers)
        raw = await limits.read_limited(chunks, limits.LIMITS)
        infer_request = _infer_request(model, headers, raw)
        return _ok_reply(model, infer_request, await model.infer(infer_request), headers)
    except InferenceError as error:
        return _failed_reply(model_name, error)


def run_infer_sync(
    repository: ModelRepository,
    model_name: str,
    model_version: int | None,
    headers: InferHeaders,
    body: bytes,
) -> InferReply:
    """`run_infer` for a whole body on a thread that runs no event loop (the Lambda handler's
    direct path: handlers/entrypoints/lambda_handler.py); the request waits for its batch on this
    thread."""
    try:
        model = _infer_target(repository, model_name, model_version, headers)
        limits.check_body(body, limits.LIMITS)
        infer_request = _infer_request(model, headers, body)
        return _ok_reply(model, infer_request, model.infer_sync(infer_request), headers)
    except InferenceError as error:
        return _failed_reply(model_name, error)


def submit_infer(
    repository: ModelRepository,
    model_name: str,
    model_version: int | None,
    headers: InferHeaders,
    body: Callable[[], bytes],
    loop: asyncio.AbstractEventLoop,
    answer: Callable[[InferReply | Exception], None],
) -> bool:
    """`run_infer` for a whole body (`body()`, taken once the model is known to take the request
    this way), without a task or a coroutine: the request is decoded, validated and queued here,
    and `answer(reply)` runs on `loop` once its batch is done, a batch's replies delivered by one
    wake-up of the loop (handlers.batching.OnLoop). A request refused before it is queued is
    answered at once. Where run_infer would raise something other
    than an InferenceError, `answer` gets that exception. False, and nothing done, when the model
    runs requests as coroutines only (ensembles): run_infer serves those."""
    try:
        model = _infer_target(repository, model_name, model_version, headers)
        if not model.queues_callbacks:
            return False
        raw = body()
        limits.check_body(raw, limits.LIMITS)
        infer_request = _infer_request(model, headers, raw)
        model.submit(infer_request, OnLoop(loop, functools.partial(_finish_infer, model, infer_request, headers,
                                                                   answer)))
    except InferenceError as error:
        answer(_failed_reply(model_name, error))
    except Exception as exc:
        answer(exc)
    return True


def _finish_infer(model: LoadedModel, infer_request: InferRequest, headers: InferHeaders,
                  answer: Callable[[InferReply | Exception], None], outcome: InferOutcome) -> None:
    """`submit_infer`'s second half, on the loop: the outcome's reply, as run_infer makes it."""
    if isinstance(outcome, InferenceError):
        answer(_failed_reply(model.name, outcome))
        return
    try:
        reply = _ok_reply(model, infer_request, outcome, headers)
    except InferenceError as error:
        reply = _failed_reply(model.name, error)
    except Exception as exc:
        answer(exc)
        return
    answer(reply)


# The infer routes' paths as Starlette matches them (`{model_name}`: one segment; `:int`: digits).
_INFER_PATH = re.compile(r"/v2/models/([^/]+)/(?:versions/([0-9]+)/)?infer")


def _route_path(scope: Mapping[str, Any]) -> str:
    """The path the router matches (Starlette's get_route_path: without the root path)."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root) and path != root and path[len(root)] == "/":
        return path[len(root):]
    return path


def infer_target(scope: Mapping[str, Any]) -> tuple[str, int | None] | None:
    """(model, version) when `scope` is an inference request the fast path serves: `POST
    /v2/models/{name}[/versions/{v}]/infer` without a query string; None for anything else."""
    if scope["type"] != "http" or scope["method"] != "POST" or scope.get("query_string"):
        return None
    return infer_path(_route_path(scope))


def infer_path(path: str) -> tuple[str, int | None] | None:
    """(model, version) of an inference request's path (`infer_target` without the scope)."""
    match = _INFER_PATH.fullmatch(path)
    if match is None:
        return None
    version = match.group(2)
    return match.group(1), None if version is None else int(version)


def internal_error_reply(scope: Mapping[str, Any], exc: Exception) -> InferReply:
    """As the app's exception handler: log it, never send it."""
    app_log.error("internal error serving %s %s", scope["method"], scope["path"], exc_info=exc)
    return InferReply(500, orjson.dumps({"error": f"internal error: {type(exc).__name__}"}), {"content-type": JSON})


def reply_headers(reply: InferReply) -> list[tuple[bytes, bytes]]:
    """The headers Starlette's Response writes, in its order: given ones, content-length, content-type."""
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items() if k != "content-type"]
    headers.append((b"content-length", str(len(reply.body)).encode("latin-1")))
    headers.append((b"content-type", reply.headers["content-type"].encode("latin-1")))
    return headers
