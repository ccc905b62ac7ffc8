"""KServe/Triton v2 REST routes: health, server and model metadata, config, readiness, infer.

Status codes and bodies follow tritonserver 2.51 as measured (docs/protocol.md): unknown model 404
`Request for unknown model: 'x' is not found`, readiness by status code (200 / 400), errors as
`{"error": "..."}`. The gRPC service (handlers/protocol/grpc) answers from the same documents.
Infer on a decoupled model answers tritonserver's 501 (generate.py streams its responses).

Every route is described in the app's OpenAPI document (`GET /openapi.json`): the v2 request and
response bodies, the binary tensor data extension's framing, and every status a route answers, so
that schema-driven clients and fuzzers (schemathesis, tests/test_reliability_fuzz.py) see the real
contract. The descriptions are documentation only: handlers read the raw body themselves.
The infer route enforces the request size limits of handlers/limits.py (413).
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Path, Request
from fastapi.responses import Response

from .. import __version__
from .. import limits
from .. import metrics, workers
from ..datatypes import PROTOCOL_DATATYPES, from_config_type
from ..errors import ErrorCode, InferenceError
from ..model_repository import LoadedModel, ModelRepository
from .codec import encode_error
from .infer import JSON, InferHeaders, InferReply, run_infer

log = logging.getLogger("handlers.protocol.routes")

# GET /v2 answers as tritonserver 2.51 does, because clients written for Triton check it
# (tritonclient's simple_http_health_metadata.py requires name "triton"). The toolkit's own identity
# goes in a field clients ignore (`toolkit_version`). The extensions are tritonserver 2.51's list, in
# its order, less what this runtime does not implement (model_repository(unload_dependents),
# system_shared_memory, cuda_shared_memory, trace, logging): GET /v2 must not promise more.
SERVER_NAME = "triton"
SERVER_VERSION = "2.51.0"
EXTENSIONS = [
    "classification",
    "sequence",
    "model_repository",
    "schedule_policy",
    "model_configuration",
    "binary_tensor_data",
    "parameters",
    "statistics",
]
# tritonserver's answer to load/unload unless started with --model-control-mode=explicit
# (model_repository_manager.cc); an image serves the repository it was built with.
MODEL_CONTROL_DISABLED = "explicit model load / unload is not allowed if polling is enabled"


# Handlers build their responses themselves; Response keeps FastAPI from documenting JSON bodies
# for routes that send none (health).
router = APIRouter(default_response_class=Response)


def _repository(request: Request) -> ModelRepository:
    return request.app.state.repository


def _json(document: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(document), status_code=status, media_type=JSON)


def error_response(error: InferenceError) -> Response:
    return Response(encode_error(error), status_code=error.http_status, media_type=JSON)


def model_metadata_document(model: LoadedModel, versions: list[int]) -> dict[str, Any]:
    """Triton's model metadata (REST `GET /v2/models/M`, gRPC `ModelMetadata`)."""
    config = model.spec.config
    batch = [-1] if model.spec.max_batch_size > 0 else []

    def tensors(key: str) -> list[dict[str, Any]]:
        return [
            {"name": io["name"], "datatype": from_config_type(io["data_type"]), "shape": batch + list(io["dims"])}
            for io in config.get(key, [])
        ]

    return {
        "name": model.name,
        "versions": [str(v) for v in versions],
        "platform": model.spec.platform,
        "inputs": tensors("input"),
        "outputs": tensors("output"),
    }


# --- OpenAPI description (documentation only; the handlers below read requests themselves) -------

_ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}},
    "additionalProperties": False,
}
_PARAMETER_VALUE = {"type": ["string", "integer", "number", "boolean"]}
_UINT64 = {"type": "integer", "minimum": 0, "maximum": 2**64 - 1}
_TENSOR_METADATA = {
    "type": "object",
    "required": ["name", "datatype", "shape"],
    "properties": {
        "name": {"type": "string"},
        "datatype": {"type": "string"},
        "shape": {"type": "array", "items": {"type": "integer"}},
    },
}
_INFER_REQUEST_SCHEMA: dict[str, Any] = {
    "title": "InferenceRequest",
    "description": "KServe v2 inference request (JSON part). With the binary tensor data extension the "
    "JSON is followed by raw tensor bytes and `Inference-Header-Content-Length` gives its length.",
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "id": {"type": "string"},
        "parameters": {
            "type": "object",
            "description": "Request parameters; `priority`, `timeout` (µs), `binary_data_output`, "
            "`sequence_*` are read by the server, the rest reach the model. Keys starting with "
            "`triton_` are reserved.",
            "properties": {
                "priority": _UINT64,
                "timeout": _UINT64,
                "binary_data_output": {"type": "boolean"},
                "sequence_id": {"anyOf": [_UINT64, {"type": "string"}]},
                "sequence_start": {"type": "boolean"},
                "sequence_end": {"type": "boolean"},
            },
            "propertyNames": {"not": {"pattern": "^triton_"}},
            "additionalProperties": _PARAMETER_VALUE,
        },
        "inputs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "shape", "datatype"],
                "properties": {
                    "name": {"type": "string"},
                    "shape": {"type": "array", "items": _UINT64},
                    "datatype": {"type": "string", "enum": sorted(PROTOCOL_DATATYPES)},
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "binary_data_size": _UINT64,
                            "shared_memory_region": {"type": "string"},
                        },
                    },
                    "data": {
                        "type": "array",
                        "description": "Row-major values, flat or nested: numbers, booleans for BOOL, "
                        "strings for BYTES. Exactly one of `data`, `parameters.binary_data_size` "
                        "(binary extension) or `parameters.shared_memory_region`.",
                    },
                },
            },
        },
        "outputs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string"},
                    "parameters": {
                        "type": "object",
                        "properties": {
                            "binary_data": {"type": "boolean"},
                            "classification": _UINT64,
                            "shared_memory_region": {"type": "string"},
                        },
                    },
                },
            },
        },
    },
}
_INFER_RESPONSE_SCHEMA: dict[str, Any] = {
    "title": "InferenceResponse",
    "type": "object",
    "required": ["model_name", "model_version", "outputs"],
    "properties": {
        "id": {"type": "string"},
        "model_name": {"type": "string"},
        "model_version": {"type": "string"},
        "parameters": {"type": "object"},
        "outputs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "datatype", "shape"],
                "properties": {
                    "name": {"type": "string"},
                    "datatype": {"type": "string"},
                    "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                    "data": {"type": "array"},
                    "parameters": {"type": "object"},
                },
            },
        },
    },
}
_SERVER_METADATA_SCHEMA = {
    "type": "object",
    "required": ["name", "version", "extensions"],
    "properties": {
        "name": {"type": "string"},
        "version": {"type": "string"},
        "extensions": {"type": "array", "items": {"type": "string"}},
        "toolkit_version": {"type": "string"},
    },
}
_MODEL_METADATA_SCHEMA = {
    "type": "object",
    "required": ["name", "versions", "platform", "inputs", "outputs"],
    "properties": {
        "name": {"type": "string"},
        "versions": {"type": "array", "items": {"type": "string"}},
        "platform": {"type": "string"},
        "inputs": {"type": "array", "items": _TENSOR_METADATA},
        "outputs": {"type": "array", "items": _TENSOR_METADATA},
    },
}
_STATISTICS_SCHEMA = {
    "type": "object",
    "required": ["model_stats"],
    "properties": {"model_stats": {"type": "array", "items": {"type": "object"}}},
}
_INDEX_SCHEMA = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["name", "version", "state"],
        "properties": {
            "name": {"type": "string"},
            "version": {"type": "string"},
            "state": {"type": "string", "enum": ["READY", "UNAVAILABLE", "LOADING"]},
            "reason": {"type": "string"},
        },
    },
}


def _error(description: str) -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": _ERROR_SCHEMA}}}


def _ok(schema: dict[str, Any] | None, description: str = "Success", media_type: str = JSON) -> dict[str, Any]:
    if schema is None:
        return {"description": description}
    return {"description": description, "content": {media_type: {"schema": schema}}}


_BAD_REQUEST = _error("Invalid request (a malformed query or version parameter)")
_UNKNOWN_MODEL = _error("Unknown model or version: `Request for unknown model: 'x' is not found`")
_NOT_READY = _error("The model (version) is not ready: loading, or failed to load")
# "4XX" stands for the other client errors every route can give (405 for another method; FastAPI
# would otherwise document a 422 the app never sends: its validation errors are 400).
_OTHER_CLIENT_ERRORS = _error("Another client error, e.g. 405 for a method the route does not take")
_MODEL_ERRORS = {400: _BAD_REQUEST, 404: _UNKNOWN_MODEL, 503: _NOT_READY, "4XX": _OTHER_CLIENT_ERRORS}
_VERSION = Annotated[int, Path(ge=0, description="Model version (a directory number of the repository)")]

_INFER_DOC: dict[str, Any] = {
    "summary": "Inference",
    "description": "KServe/Triton v2 inference, with the binary tensor data extension "
    "(`Inference-Header-Content-Length`), the classification extension and gzip/deflate bodies "
    "(`Content-Encoding`, `Accept-Encoding`). An empty body, or a header length of 0, is a raw "
    "binary request for the model's only input.",
    "responses": {
        200: {
            "description": "Outputs: JSON, or JSON followed by binary tensor data "
            "(`Inference-Header-Content-Length` gives the JSON length)",
            "content": {
                JSON: {"schema": _INFER_RESPONSE_SCHEMA},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            },
        },
        400: _error("Invalid request: malformed body, or a request the model's configuration refuses"),
        404: _UNKNOWN_MODEL,
        413: _error("Request body or an input tensor over the limits (TOOLKIT_MAX_REQUEST_BYTES, "
                    "TOOLKIT_MAX_TENSOR_ELEMENTS)"),
        500: _error("The model's own error (an exception in model.py), as tritonserver answers it"),
        501: _error("Unsupported request feature (a Content-Encoding other than gzip or deflate), or a decoupled "
                    "model (use generate_stream)"),
        503: _error("Not ready, queue full (`max_queue_size`), queue timeout, or shutting down"),
        "4XX": _OTHER_CLIENT_ERRORS,
    },
    "openapi_extra": {
        "parameters": [
            {
                "name": "Inference-Header-Content-Length",
                "in": "header",
                "required": False,
                "description": "Binary tensor data extension: length of the JSON part of the body",
                "schema": {"type": "integer", "minimum": 0},
            }
        ],
        "requestBody": {
            "required": False,
            "content": {
                JSON: {"schema": _INFER_REQUEST_SCHEMA},
                "application/octet-stream": {
                    "schema": {
                        "type": "string",
                        "format": "binary",
                        "description": "JSON request followed by binary tensor data, or a raw binary request",
                    }
                },
            },
        },
    },
}


# --- routes ---------------------------------------------------------------------------------------


@router.get("/v2/health/live", responses={200: _ok(None, "The server is running")})
async def health_live() -> Response:
    return Response(status_code=200)


@router.get(
    "/v2/health/ready",
    responses={200: _ok(None, "Every model is loaded and warmed up"), 400: {"description": "Not ready"}},
)
async def health_ready(request: Request) -> Response:
    return Response(status_code=200 if await workers.server_ready(_repository(request)) else 400)


def server_metadata_document() -> dict[str, Any]:
    """Triton's server metadata (REST `GET /v2`, gRPC `ServerMetadata`)."""
    return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS, "toolkit_version": __version__}


@router.get("/v2", responses={200: _ok(_SERVER_METADATA_SCHEMA)})
async def server_metadata() -> Response:
    return _json(server_metadata_document())


@router.get("/v2/models/stats", responses={200: _ok(_STATISTICS_SCHEMA)})
async def all_statistics(request: Request) -> Response:
    repository = _repository(request)
    models = [model for name in sorted(repository.models) for _, model in sorted(repository.models[name].items())
              if model.ready]
    try:
        return _json({"model_stats": await workers.statistics(repository, models)})
    except InferenceError as error:  # a worker did not answer
        return error_response(error)


@router.get("/v2/models/{model_name}", responses={200: _ok(_MODEL_METADATA_SCHEMA), **_MODEL_ERRORS})
async def model_metadata(request: Request, model_name: str, model_version: int | None = None) -> Response:
    repository = _repository(request)
    try:
        model = repository.get(model_name, model_version)
    except InferenceError as error:
        return error_response(error)
    if not model.ready:
        return error_response(model.not_ready_error())
    return _json(model_metadata_document(model, repository.ready_versions(model_name)))


@router.get(
    "/v2/models/{model_name}/versions/{model_version:int}",
    responses={200: _ok(_MODEL_METADATA_SCHEMA), **_MODEL_ERRORS},
)
async def model_version_metadata(request: Request, model_name: str, model_version: _VERSION) -> Response:
    return await model_metadata(request, model_name, model_version)


_READY_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: _ok(None, "The model version is ready"),
    400: _error("Not ready (`Model version not ready`), unknown, or a malformed parameter"),
    "4XX": _OTHER_CLIENT_ERRORS,
}


@router.get("/v2/models/{model_name}/ready", responses=_READY_RESPONSES)
async def model_ready(request: Request, model_name: str, model_version: int | None = None) -> Response:
    try:
        model = _repository(request).get(model_name, model_version)
    except InferenceError:
        model = None
    if model is None or not model.ready:
        return _json({"error": "Model version not ready"}, status=400)
    return Response(status_code=200)


@router.get("/v2/models/{model_name}/versions/{model_version:int}/ready", responses=_READY_RESPONSES)
async def model_version_ready(request: Request, model_name: str, model_version: _VERSION) -> Response:
    return await model_ready(request, model_name, model_version)


_CONFIG_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: _ok({"type": "object"}, "The model's Triton configuration (JSON)"),
    **_MODEL_ERRORS,
}


@router.get("/v2/models/{model_name}/config", responses=_CONFIG_RESPONSES)
async def model_config(request: Request, model_name: str, model_version: int | None = None) -> Response:
    try:
        model = _repository(request).get(model_name, model_version)
    except InferenceError as error:
        return error_response(error)
    return _json(model.spec.config)


@router.get("/v2/models/{model_name}/versions/{model_version:int}/config", responses=_CONFIG_RESPONSES)
async def model_version_config(request: Request, model_name: str, model_version: _VERSION) -> Response:
    return await model_config(request, model_name, model_version)


def _response(reply: InferReply) -> Response:
    headers = dict(reply.headers)
    return Response(reply.body, status_code=reply.status, headers=headers, media_type=headers.pop("content-type"))


@router.post("/v2/models/{model_name}/infer", **_INFER_DOC)
async def infer(request: Request, model_name: str, model_version: int | None = None) -> Response:
    headers = InferHeaders(
        request.headers.get("content-length"),
        request.headers.get("inference-header-content-length"),
        request.headers.get("content-encoding"),
        request.headers.get("accept-encoding"),
    )
    reply = await run_infer(_repository(request), model_name, model_version, headers, request.stream())
    return _response(reply)


@router.post("/v2/models/{model_name}/versions/{model_version:int}/infer", **_INFER_DOC)
async def infer_version(request: Request, model_name: str, model_version: _VERSION) -> Response:
    return await infer(request, model_name, model_version)


_MODEL_STATISTICS_RESPONSES: dict[int | str, dict[str, Any]] = {200: _ok(_STATISTICS_SCHEMA), **_MODEL_ERRORS}


@router.get("/v2/models/{model_name}/stats", responses=_MODEL_STATISTICS_RESPONSES)
async def model_statistics(request: Request, model_name: str, model_version: int | None = None) -> Response:
    repository = _repository(request)
    try:
        if model_version is None:
            repository.get(model_name)  # 404 for an unknown model, 503 when none is ready
            models = [m for _, m in sorted(repository.models[model_name].items()) if m.ready]
        else:
            model = repository.get(model_name, model_version)
            if not model.ready:
                raise model.not_ready_error()
            models = [model]
        return _json({"model_stats": await workers.statistics(repository, models)})
    except InferenceError as error:
        return error_response(error)


@router.get("/v2/models/{model_name}/versions/{model_version:int}/stats", responses=_MODEL_STATISTICS_RESPONSES)
async def model_version_statistics(request: Request, model_name: str, model_version: _VERSION) -> Response:
    return await model_statistics(request, model_name, model_version)


@router.post("/v2/repository/index", responses={200: _ok(_INDEX_SCHEMA)})
async def repository_index(request: Request) -> Response:
    """The read-only part of Triton's model repository extension: every model version with its
    state (READY / UNAVAILABLE / LOADING) and, for a failed load, the reason. Loading and unloading
    models at runtime is not offered (an image serves what it was built with)."""
    return _json(_repository(request).index())


_MODEL_CONTROL_RESPONSES = {
    400: {"description": "The body is not a JSON object"},
    413: {"description": "The body is over the request size limit"},
    503: {"description": "Model control is disabled (tritonserver's default --model-control-mode)"},
}


@router.post("/v2/repository/models/{model_name}/load", responses=_MODEL_CONTROL_RESPONSES)
@router.post("/v2/repository/models/{model_name}/unload", responses=_MODEL_CONTROL_RESPONSES)
async def model_control(request: Request, model_name: str) -> Response:
    """Load and unload answer as tritonserver does without --model-control-mode=explicit: the body
    is read (a malformed one is a 400), then 503 `explicit model load / unload is not allowed if
    polling is enabled`, whatever the model."""
    try:
        limits.LIMITS.check_content_length(request.headers.get("content-length"))
        body = await limits.read_limited(request.stream(), limits.LIMITS)
        if body.strip():
            try:
                document = orjson.loads(body)
            except orjson.JSONDecodeError as error:
                raise InferenceError(f"failed to parse the request JSON buffer: {error}") from None
            if not isinstance(document, dict):
                raise InferenceError("failed to parse the request JSON buffer: the body is not a JSON object")
        raise InferenceError(MODEL_CONTROL_DISABLED, ErrorCode.UNAVAILABLE)
    except InferenceError as error:
        return error_response(error)


@router.get("/metrics", responses={200: _ok({"type": "string"}, "Prometheus text format", "text/plain")})
async def prometheus_metrics(request: Request) -> Response:
    try:
        return Response(await workers.exposition(_repository(request)), media_type=metrics.CONTENT_TYPE)
    except InferenceError as error:  # a worker did not answer
        return error_response(error)
