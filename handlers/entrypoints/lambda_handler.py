"""The Lambda handler class (Mangum over the runtime app); `aws_lambda` instantiates it at import.

`handlers.entrypoints.aws_lambda` creates it at import, i.e. in Lambda's init phase, where models
are loaded and warmed up; never in ASGI lifespan: Mangum runs lifespan on every invocation, so
lifespan is off. Function URL, API
Gateway HTTP API (v2) and REST API (v1) events are accepted; binary-extension bodies travel
base64-encoded in both directions.

Batching on Lambda: one execution environment serves one request at a time, so requests never
meet in a queue; the batcher runs with no queue delay (waiting could only add latency) and a
request's own batch is executed as one batch.

Inference requests take a direct path (`LambdaHandler._direct`): Mangum still reads the event
(its handler for the event's kind gives the ASGI scope and the body) and writes the result (the
same handler formats the response), but in between the request goes straight to the runtime
(`run_infer_sync`, handlers/protocol/infer.py: the steps of the HTTP fast path) on the invoking
thread, without an event loop, an ASGI cycle or a hand-off back to a loop. Only requests the HTTP
fast path serves take it (`POST /v2/models/M[/versions/V]/infer`, no query string); everything
else goes through Mangum and the app. tests/test_lambda_direct_path.py checks both give the same
response, event for event; bench/lambda_overhead.py measures what it saves
(docs/aws-lambda.md). `TOOLKIT_LAMBDA_DIRECT=0` turns it off.

The app itself (FastAPI, Starlette, pydantic: ~0.15-0.2 s of imports and route building) is made
on the first event that goes through Mangum, not in init: an environment that only serves
inference events never imports FastAPI. Where init is taken ahead of traffic (provisioned
concurrency, SnapStart: AWS_LAMBDA_INITIALIZATION_TYPE), or with the direct path off, the app is
made in init, so that no request pays for it, on a thread of its own while the models load: its
imports (Python, holding the GIL) overlap the loading (an ONNX Runtime session's optimisation, a
warmup's inference: mostly without the GIL), as `toolkit serve` overlaps them
(handlers/entrypoints/server.py).

Limits: Lambda refuses a request or response payload over 6 MB (synchronous invocation) before or
after the handler runs. Requests over it never reach us (docs/aws-lambda.md); responses are
checked here, after base64, and replaced by a clear 413 error instead of Lambda's opaque failure.

Environment: TOOLKIT_MANIFEST (default: models.json next to the task root, then
/opt/toolkit/models.json), TOOLKIT_EXIT_ON_ERROR ("0" keeps serving when a model fails to load).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from mangum import Mangum

from ..manifest import Manifest
from ..model_repository import ModelRepository
from ..protocol.infer import InferHeaders, infer_target, internal_error_reply, reply_headers, run_infer_sync

log = logging.getLogger("handlers.aws_lambda")

# Lambda's synchronous response payload quota is 6 MB (6,291,456 bytes) for the whole response
# document; keep headroom for the status line, headers and JSON framing around the body.
RESPONSE_LIMIT_BYTES = 6 * 1024 * 1024
ENVELOPE_RESERVE_BYTES = 16 * 1024
DIRECT_ENV = "TOOLKIT_LAMBDA_DIRECT"
# Lambda's own: "on-demand", "provisioned-concurrency" or "snap-start" (how init was started).
INITIALIZATION_TYPE_ENV = "AWS_LAMBDA_INITIALIZATION_TYPE"


def _manifest_path() -> Path:
    explicit = os.environ.get("TOOLKIT_MANIFEST")
    if explicit:
        return Path(explicit)
    task_root = Path(os.environ.get("LAMBDA_TASK_ROOT", "/var/task"))
    candidate = task_root / "toolkit" / "models.json"
    return candidate if candidate.is_file() else Path("/opt/toolkit/models.json")


def direct_default() -> bool:
    """Inference requests take the direct path unless TOOLKIT_LAMBDA_DIRECT=0."""
    return os.environ.get(DIRECT_ENV, "1") != "0"


def eager(direct: bool) -> bool:
    """Whether init makes the app: where init runs ahead of traffic (AWS_LAMBDA_INITIALIZATION_TYPE
    other than on-demand) or without the direct path."""
    return not direct or os.environ.get(INITIALIZATION_TYPE_ENV, "on-demand") != "on-demand"


class _App:
    """The runtime's ASGI app (handlers/app.py) for Mangum, made when first needed (the module doc)."""

    def __init__(self, repository: ModelRepository) -> None:
        self.repository = repository
        self.made: Any = None

    def get(self) -> Any:
        if self.made is None:
            from ..app import create_app  # FastAPI and Starlette are imported here

            started = time.perf_counter()
            self.made = create_app(self.repository, streaming=False)  # Mangum returns one buffered response
            log.info("made the HTTP app for events other than inference requests in %.3f s",
                     time.perf_counter() - started)
        return self.made

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.get()(scope, receive, send)


class LambdaHandler:
    """Callable Lambda handler over one loaded repository."""

    def __init__(
        self, repository: ModelRepository, *, direct: bool | None = None, eager_app: bool | None = None,
        app: _App | None = None,
    ) -> None:
        """`direct`: inference requests skip the ASGI cycle (the module doc); default: on unless
        TOOLKIT_LAMBDA_DIRECT=0. `eager_app`: make the app now, not on the first event that needs
        it; default: `eager(direct)`. `app`: one already made (or being made) for `repository`."""
        self.repository = repository
        self._app = app or _App(repository)
        self._mangum = Mangum(self._app, lifespan="off")
        self.direct = direct_default() if direct is None else direct
        if eager_app is None:
            eager_app = eager(self.direct)
        if eager_app:
            self._app.get()
        self.invocations = 0
        self.direct_invocations = 0

    @classmethod
    def from_manifest(cls, manifest: Manifest, *, exit_on_error: bool = True, direct: bool | None = None) -> "LambdaHandler":
        """Load every model; where init makes the app (`eager`), it is made meanwhile, on a thread."""
        repository = ModelRepository(manifest, no_queue_delay=True, serial=True)
        direct = direct_default() if direct is None else direct
        app = _App(repository)
        eager_app = eager(direct)
        maker = threading.Thread(target=app.get, name="app-maker", daemon=True) if eager_app else None
        if maker is not None:
            maker.start()  # if it fails, __init__ makes the app again and raises the error
        try:
            repository.load(exit_on_error=exit_on_error)
        finally:
            if maker is not None:
                maker.join()
        return cls(repository, direct=direct, eager_app=eager_app, app=app)

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        self.invocations += 1
        response = self._direct(event, context) if self.direct else None
        if response is None:
            response = self._mangum(event, context)
        body = response.get("body") or ""
        if len(body) > RESPONSE_LIMIT_BYTES - ENVELOPE_RESERVE_BYTES:
            encoded = "base64" if response.get("isBase64Encoded") else "text"
            message = (
                f"response of {len(body)} bytes ({encoded}) exceeds AWS Lambda's 6 MB response payload limit; "
                "request a smaller batch or fewer outputs (binary outputs grow by a third in base64), "
                "or deploy this model to Cloud Run, which has no such limit"
            )
            log.warning(message)
            return {
                "statusCode": 413,
                "headers": {"content-type": "application/json"},
                "body": json.dumps({"error": message}),
                "isBase64Encoded": False,
            }
        return response

    def _direct(self, event: dict[str, Any], context: Any) -> dict[str, Any] | None:
        """The response to an inference request, or None for anything the direct path leaves to
        Mangum (see the module doc)."""
        if not isinstance(event, dict):
            return None
        try:
            handler = self._mangum.infer(event, context)
        except RuntimeError:  # not an HTTP event: Mangum says so
            return None
        scope = handler.scope
        target = infer_target(scope)
        if target is None:
            return None
        self.direct_invocations += 1
        try:
            reply = run_infer_sync(self.repository, *target, InferHeaders.from_raw(scope["headers"]), handler.body)
        except Exception as exc:
            reply = internal_error_reply(scope, exc)
        return handler({"status": reply.status, "headers": reply_headers(reply), "body": reply.body})

    @classmethod
    def from_environment(cls) -> "LambdaHandler":
        logging.basicConfig(level=os.environ.get("TOOLKIT_LOG_LEVEL", "info").upper())
        manifest = Manifest.load(_manifest_path())
        return cls.from_manifest(manifest, exit_on_error=os.environ.get("TOOLKIT_EXIT_ON_ERROR", "1") != "0")
