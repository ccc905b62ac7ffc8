"""The gRPC listener: `inference.GRPCInferenceService` and the standard `grpc.health.v1.Health`
service (what Cloud Run and Kubernetes gRPC probes call) on one port.

Front ends (`frontend()`): the native one (grpc++ on its own threads, handlers/protocol/grpc/
nativeserver.py) when its extension is built, else grpcio's asyncio server; both run the same
service objects. TOOLKIT_GRPC_FRONTEND=native|grpcio chooses (native without the extension is an
error).

Health: the overall service ("") and `inference.GRPCInferenceService` are NOT_SERVING while
models load, SERVING once every model is ready (ServerReady), NOT_SERVING again when the server
drains; a probe's liveness and readiness/startup checks read them (docs/grpc.md).

Message size limits: a request over TOOLKIT_MAX_REQUEST_BYTES (handlers/limits.py) is refused by
the front end before it is read whole (RESOURCE_EXHAUSTED); responses may be as large as gRPC allows.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from ... import limits, workers
from .. import frontends
from ...model_repository import ModelRepository
from .service import SERVICE_NAME, InferenceService

log = logging.getLogger("handlers.protocol.grpc")

MAX_MESSAGE_BYTES = 2**31 - 1  # gRPC's own ceiling (what tritonserver configures)
_READINESS_POLL_S = 0.05
FRONTEND_ENV = "TOOLKIT_GRPC_FRONTEND"
FRONTENDS = ("native", "grpcio")


NATIVE_MODULE = "handlers.protocol.grpc.nativeserver"


def native_available() -> bool:
    """Whether the native front end's extension (handlers/protocol/grpc/native) is built."""
    return frontends.importable(NATIVE_MODULE)


def frontend() -> str:
    """The front end to serve with: TOOLKIT_GRPC_FRONTEND, else native when it is built
    (handlers/protocol/frontends.py)."""
    return frontends.choose(FRONTEND_ENV, FRONTENDS, "grpcio", NATIVE_MODULE,
                            "gRPC front end is not built (handlers/protocol/native/build.py grpc)")


class GrpcServer:
    """Start with `await start()` (returns the bound port), stop with `await stop(grace)`."""

    def __init__(self, repository: ModelRepository, host: str, port: int, *, reuse_port: bool = False) -> None:
        """`reuse_port`: share the port with the other workers (handlers/workers)."""
        self.repository = repository
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.service = InferenceService(repository)
        self.health = health.aio.HealthServicer()
        options = [
            ("grpc.max_receive_message_length", limits.LIMITS.max_request_bytes),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 1 if reuse_port else 0),
        ]
        self.frontend = frontend()
        self.server: Any
        if self.frontend == "native":
            from .nativeserver import NativeServer

            self.server = NativeServer(options)
            # ModelInfer to a batched model: queued as it arrives, answered when its batch is done
            self.server.add_queued_method(f"/{SERVICE_NAME}/ModelInfer", self.service.queue_model_infer)
        else:
            self.server = grpc.aio.server(options=options)
        self.server.add_generic_rpc_handlers((self.service.handler(),))
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = 0
        self._watch: asyncio.Task[None] | None = None

    async def start(self) -> int:
        try:
            self.port = self.server.add_insecure_port(self.address)
        except RuntimeError as exc:
            raise OSError(f"cannot listen for gRPC on {self.address}: {exc}") from None
        if self.port == 0:
            raise OSError(f"cannot listen for gRPC on {self.address}: the address is in use or unavailable")
        await self.server.start()
        log.info("gRPC front end: %s", self.frontend)
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        self._watch = asyncio.ensure_future(self._follow_readiness())
        return self.port

    async def _follow_readiness(self) -> None:
        while not self.repository.loaded:
            await asyncio.sleep(_READINESS_POLL_S)
        if not self.repository.ready():
            return
        while not await workers.server_ready(self.repository):  # the other workers still load
            await asyncio.sleep(_READINESS_POLL_S)
        if not self.service.draining:
            for service in ("", SERVICE_NAME):
                await self.health.set(service, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace: float) -> None:
        """Drain: health NOT_SERVING, no new RPCs, streams finish what they received, then stop
        (RPCs still running after `grace` seconds are cancelled)."""
        self.service.begin_drain()
        if self._watch is not None:
            self._watch.cancel()
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)
