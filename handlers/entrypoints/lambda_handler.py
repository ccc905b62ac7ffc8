"""The Lambda handler class (Mangum over the runtime app); `aws_lambda` instantiates it at import.

`handlers.entrypoints.aws_lambda` creates it at import, i.e. in Lambda's init phase, where models
are loaded and warmed up; never in ASGI lifespan: Mangum runs lifespan on every invocation, so
lifespan is off. Function URL, API
Gateway HTTP API (v2) and REST API (v1) events are accepted; binary-extension bodies travel
base64-encoded in both directions.

Batching on Lambda: one execution environment serves one request at a time, so requests never
meet in a queue; the batcher runs with no queue delay (waiting could only add latency) and a
request's own batch is executed as one batch.

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
from pathlib import Path
from typing import Any

from mangum import Mangum

from ..app import create_app
from ..manifest import Manifest
from ..model_repository import ModelRepository

log = logging.getLogger("handlers.aws_lambda")

# Lambda's synchronous response payload quota is 6 MB (6,291,456 bytes) for the whole response
# document; keep headroom for the status line, headers and JSON framing around the body.
RESPONSE_LIMIT_BYTES = 6 * 1024 * 1024
ENVELOPE_RESERVE_BYTES = 16 * 1024


def _manifest_path() -> Path:
    explicit = os.environ.get("TOOLKIT_MANIFEST")
    if explicit:
        return Path(explicit)
    task_root = Path(os.environ.get("LAMBDA_TASK_ROOT", "/var/task"))
    candidate = task_root / "toolkit" / "models.json"
    return candidate if candidate.is_file() else Path("/opt/toolkit/models.json")


class LambdaHandler:
    """Callable Lambda handler over one loaded repository."""

    def __init__(self, repository: ModelRepository) -> None:
        self.repository = repository
        self.app = create_app(repository, streaming=False)  # Mangum returns one buffered response
        self._mangum = Mangum(self.app, lifespan="off")
        self.invocations = 0

    @classmethod
    def from_manifest(cls, manifest: Manifest, *, exit_on_error: bool = True) -> "LambdaHandler":
        repository = ModelRepository(manifest, no_queue_delay=True, serial=True)
        repository.load(exit_on_error=exit_on_error)
        return cls(repository)

    def __call__(self, event: dict[str, Any], context: Any) -> dict[str, Any]:
        self.invocations += 1
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

    @classmethod
    def from_environment(cls) -> "LambdaHandler":
        logging.basicConfig(level=os.environ.get("TOOLKIT_LOG_LEVEL", "info").upper())
        manifest = Manifest.load(_manifest_path())
        return cls.from_manifest(manifest, exit_on_error=os.environ.get("TOOLKIT_EXIT_ON_ERROR", "1") != "0")
