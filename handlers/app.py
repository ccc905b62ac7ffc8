"""The ASGI application: FastAPI with the v2 routes over one ModelRepository."""

from __future__ import annotations

import logging

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import __version__
from .model_repository import ModelRepository
from .protocol.routes import router

log = logging.getLogger("handlers.app")


def _error(message: str, status: int) -> Response:
    return Response(orjson.dumps({"error": message}), status_code=status, media_type="application/json")


def create_app(repository: ModelRepository) -> FastAPI:
    app = FastAPI(title="toolkit v2 inference runtime", version=__version__, docs_url=None, redoc_url=None)
    app.state.repository = repository
    app.include_router(router)

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
