"""The KServe/Triton v2 protocol over gRPC: `inference.GRPCInferenceService` (Triton's
grpc_service.proto, with tritonclient's generated modules) and the `grpc.health.v1` health service,
served over the same `ModelRepository` as the REST routes by grpc++ (the `native` front end, when
its extension is built) or grpcio's asyncio server.

- `generated`: loads Triton's generated modules (no tritonclient import).
- `tensors`: ModelInferRequest <-> the runtime's InferRequest / InferResponse.
- `service`: every RPC, with tritonserver's status codes and messages.
- `server`: the listener (`GrpcServer`), health, message size limits, drain, the front end.
- `nativeserver`: the native front end: grpcio method handlers run on the loop for calls that
  grpc++ receives (`_grpcnative`, built from `native/grpcnative.cpp` by `../native/build.py grpc`).

Only gRPC images (and `toolkit serve`) import this package: it needs grpcio, grpcio-health-checking
and protobuf, which HTTP-only images do not carry.
"""
