"""The ASGI application: FastAPI with the v2 routes over one ModelRepository.

Inference requests take a fast path: `RuntimeApp.__call__` recognises `POST
/v2/models/{name}[/versions/{v}]/infer` (without a query string) and runs the same handler as the
FastAPI route (`routes.run_infer`) straight from ASGI, skipping Starlette's middleware stack,
routing and request objects, which cost more than the whole inference of a small model
(docs/performance.md). Every other request, and an infer request with a query string, goes through
FastAPI; the OpenAPI document still describes the infer routes, whose FastAPI handlers stay.
"""

from __future__ import annotations

import logging
import re
from collections.abc import AsyncIterator

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import Receive, Scope, Send

from . import __version__
from .model_repository import ModelRepository
from .protocol.generate import router as generate_router
from .protocol.routes import InferHeaders, InferReply, router, run_infer

log = logging.getLogger("handlers.app")


def _error(message: str, status: int) -> Response:
    return Response(orjson.dumps({"error": message}), status_code=status, media_type="application/json")


# The infer routes' paths as Starlette matches them (`{model_name}`: one segment; `:int`: digits).
_INFER_PATH = re.compile(r"/v2/models/([^/]+)/(?:versions/([0-9]+)/)?infer")


def _route_path(scope: Scope) -> str:
    """The path the router matches (Starlette's get_route_path: without the root path)."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root) and path != root and path[len(root)] == "/":
        return path[len(root):]
    return path


async def _body_chunks(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.request":
            yield message.get("body", b"")
            if not message.get("more_body", False):
                return
        elif message["type"] == "http.disconnect":
            raise ClientDisconnect()


def infer_target(scope: Scope) -> tuple[str, int | None] | None:
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


def internal_error_reply(scope: Scope, exc: Exception) -> InferReply:
    """As the app's exception handler: log it, never send it."""
    log.error("internal error serving %s %s", scope["method"], scope["path"], exc_info=exc)
    return InferReply(500, orjson.dumps({"error": f"internal error: {type(exc).__name__}"}),
                      {"content-type": "application/json"})


def reply_headers(reply: InferReply) -> list[tuple[bytes, bytes]]:
    """The headers Starlette's Response writes, in its order: given ones, content-length, content-type."""
    headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items() if k != "content-type"]
    headers.append((b"content-length", str(len(reply.body)).encode("latin-1")))
    headers.append((b"content-type", reply.headers["content-type"].encode("latin-1")))
    return headers


async def _send_reply(send: Send, reply: InferReply) -> None:
    await send({"type": "http.response.start", "status": reply.status, "headers": reply_headers(reply)})
    await send({"type": "http.response.body", "body": reply.body})


class RuntimeApp(FastAPI):
    """FastAPI with the inference fast path (see the module doc)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = infer_target(scope)
        if target is not None:
            await self._infer(target, scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    async def _infer(self, target: tuple[str, int | None], scope: Scope, receive: Receive, send: Send) -> None:
        try:
            reply = await run_infer(
                self.state.repository,
                *target,
                InferHeaders.from_raw(scope["headers"]),
                _body_chunks(receive),
            )
        except ClientDisconnect:
            return  # nobody to answer
        except Exception as exc:
            reply = internal_error_reply(scope, exc)
        await _send_reply(send, reply)


def create_app(repository: ModelRepository, *, streaming: bool = True) -> FastAPI:
    """`streaming`: whether responses reach the client as they are written (False on AWS Lambda,
    where `generate_stream` is refused with the reason)."""
    app = RuntimeApp(title="toolkit v2 inference runtime", version=__version__, docs_url=None, redoc_url=None)
    app.state.repository = repository
    app.state.streaming = streaming
    app.include_router(router)
    app.include_router(generate_router)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        response = _error(str(exc.detail), exc.status_code)
        response.headers.update(exc.headers or {})  # e.g. the `Allow` header of a 405 (RFC 9110)
        return response

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> Response:
        return _error("; ".join(str(e.get("msg", e)) for e in exc.errors()), 400)

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> Response:
        # Our own fault: log the traceback, never send it.
        log.exception("internal error serving %s %s", request.method, request.url.path)
        return _error(f"internal error: {type(exc).__name__}", 500)

    return app
