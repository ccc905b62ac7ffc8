"""The ASGI application: FastAPI with the v2 routes over one ModelRepository.

Inference requests take a fast path: `RuntimeApp.__call__` recognises `POST
/v2/models/{name}[/versions/{v}]/infer` (without a query string) and runs the same handler as the
FastAPI route (`run_infer`, handlers/protocol/infer.py) straight from ASGI, skipping Starlette's
middleware stack, routing and request objects, which cost more than the whole inference of a small
model (docs/performance.md). Every other request, and an infer request with a query string, goes through
FastAPI; the OpenAPI document still describes the infer routes, whose FastAPI handlers stay.
"""

from __future__ import annotations

import logging
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
from .protocol.admin import router as admin_router
from .protocol.generate import router as generate_router
from .protocol.infer import InferHeaders, InferReply, infer_target, internal_error_reply, reply_headers, run_infer
from .protocol.routes import router

log = logging.getLogger("handlers.app")


def _error(message: str, status: int) -> Response:
    return Response(orjson.dumps({"error": message}), status_code=status, media_type="application/json")


async def _body_chunks(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.request":
            yield message.get("body", b"")
            if not message.get("more_body", False):
                return
        elif message["type"] == "http.disconnect":
            raise ClientDisconnect()


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
    app.include_router(admin_router)

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
