"""Container entry point for Cloud Run / Knative: `python -m handlers.entrypoints.container`.

Environment:
  PORT                   port to listen on (Cloud Run sets it; default 8080)
  TOOLKIT_PROTOCOL       what $PORT serves: "http" (v2 REST, default) or "grpc" (inference.
                         GRPCInferenceService and grpc.health.v1 over h2c); images built with
                         `toolkit build --protocol grpc` set it
  TOOLKIT_GRPC_MODULES   folder of Triton's generated gRPC modules (gRPC images set it)
  TOOLKIT_MANIFEST       compiled manifest (default /opt/toolkit/models.json)
  TOOLKIT_MODEL_ROOT     folder the manifest's model paths are relative to (default: the manifest's)
  TOOLKIT_HOST           address (default 0.0.0.0)
  TOOLKIT_EXIT_ON_ERROR  "0" keeps serving when a model fails to load (it stays unready)
  TOOLKIT_GRACEFUL_SECONDS  drain budget on SIGTERM (default 9: Cloud Run gives 10 s)
  TOOLKIT_LOG_LEVEL      default info
  TOOLKIT_MAX_REQUEST_BYTES, TOOLKIT_MAX_TENSOR_ELEMENTS  request limits (413 above them;
                         docs/runtime.md)
  TOOLKIT_WORKERS        server processes on $PORT, each with its share of every model's
                         instances: N or "auto" (default 1; handlers/workers, docs/performance.md)
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from ..manifest import Manifest
from ..model_repository import ModelRepository
from ..workers.plan import WORKERS_ENV, WorkerPlanError, worker_count
from ..workers.supervisor import supervise
from .server import serve

DEFAULT_MANIFEST = "/opt/toolkit/models.json"


def main() -> int:
    level = os.environ.get("TOOLKIT_LOG_LEVEL", "info")
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    root = os.environ.get("TOOLKIT_MODEL_ROOT")
    manifest_path = Path(os.environ.get("TOOLKIT_MANIFEST", DEFAULT_MANIFEST))
    manifest = Manifest.load(manifest_path, Path(root) if root else None)
    repository = ModelRepository(manifest)
    try:
        workers = worker_count(manifest, os.environ.get(WORKERS_ENV, "1"), repository.cpu_plan.cpus.cpus)
    except WorkerPlanError as exc:
        logging.getLogger("handlers.container").error("%s: %s", WORKERS_ENV, exc)
        return 2
    protocol = os.environ.get("TOOLKIT_PROTOCOL", "http").strip().lower() or "http"
    if protocol not in ("http", "grpc"):
        logging.getLogger("handlers.container").error("TOOLKIT_PROTOCOL must be http or grpc, got %r", protocol)
        return 2
    port = int(os.environ.get("PORT", "8080"))
    options = dict(
        grpc_port=port if protocol == "grpc" else None,
        exit_on_error=os.environ.get("TOOLKIT_EXIT_ON_ERROR", "1") != "0",
        graceful_seconds=float(os.environ.get("TOOLKIT_GRACEFUL_SECONDS", "9")),
        log_level=level,
    )
    host = os.environ.get("TOOLKIT_HOST", "0.0.0.0")
    if workers > 1:
        return supervise(manifest_path, Path(root) if root else None, workers, host, port if protocol == "http" else None,
                         **options)
    return serve(repository, host=host, port=port if protocol == "http" else None, **options)


if __name__ == "__main__":
    sys.exit(main())
