"""The KServe/Triton v2 protocol over gRPC: `inference.GRPCInferenceService` (Triton's
grpc_service.proto, with tritonclient's generated modules) and the `grpc.health.v1` health service,
served by grpcio's asyncio server over the same `ModelRepository` as the REST routes.

- `generated`: loads Triton's generated modules (no tritonclient import).
- `tensors`: ModelInferRequest <-> the runtime's InferRequest / InferResponse.
- `service`: every RPC, with tritonserver's status codes and messages.
- `settings`: log and trace settings.
- `server`: the listener (`GrpcServer`), health, message size limits, drain.

Only gRPC images (and `toolkit serve`) import this package: it needs grpcio, grpcio-health-checking
and protobuf, which HTTP-only images do not carry.
"""
