"""One worker among several (handlers/workers): `python -m handlers.entrypoints.worker ...`,
started by the supervisor with TOOLKIT_WORKER=INDEX/COUNT and TOOLKIT_WORKER_DIR."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from ..manifest import Manifest
from ..model_repository import ModelRepository
from ..workers.peers import Peers
from ..workers.plan import WORKER_ENV, WorkerSlot
from ..workers.supervisor import DIRECTORY_ENV
from .server import serve


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", type=Path, required=True)
    parser.add_argument("--model-root", type=Path)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--http-port", type=int, default=0)
    parser.add_argument("--grpc-port", type=int, default=0)
    parser.add_argument("--metrics-port", type=int, default=0)
    parser.add_argument("--graceful-seconds", type=float, default=30.0)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--exit-on-error", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args(argv)
    slot = WorkerSlot.parse(os.environ[WORKER_ENV])
    logging.basicConfig(level=args.log_level.upper(),
                        format=f"%(asctime)s %(levelname)s worker {slot.index} %(name)s: %(message)s")
    repository = ModelRepository(Manifest.load(args.manifest, args.model_root), worker=slot)
    repository.peers = Peers(repository, slot, Path(os.environ[DIRECTORY_ENV]))
    return serve(
        repository, args.host, args.http_port or None, grpc_port=args.grpc_port or None,
        metrics_port=args.metrics_port or None, exit_on_error=args.exit_on_error,
        graceful_seconds=args.graceful_seconds, log_level=args.log_level, reuse_port=True,
    )


if __name__ == "__main__":
    sys.exit(main())
