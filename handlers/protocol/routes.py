"""KServe/Triton v2 REST routes: health, server and model metadata, config, readiness, infer.

Status codes and bodies follow tritonserver 2.51 as measured (docs/protocol.md): unknown model 404
`Request for unknown model: 'x' is not found`, readiness by status code (200 / 400), errors as
`{"error": "..."}`. gRPC is out of scope.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from .. import __version__
from .. import metrics
from ..datatypes import from_config_type
from ..errors import InferenceError
from ..model_repository import LoadedModel, ModelRepository
from .codec import decode_request, encode_error, encode_response
from .compression import compress, decompress
from .validation import validate_request

SERVER_NAME = "toolkit"
# Only what this runtime implements (GET /v2 must not promise more).
EXTENSIONS = ["binary_tensor_data", "model_configuration", "parameters", "schedule_policy", "statistics"]

JSON = "application/json"

router = APIRouter()


def _repository(request: Request) -> ModelRepository:
    return request.app.state.repository


def _json(document: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(document), status_code=status, media_type=JSON)


def error_response(error: InferenceError) -> Response:
    return Response(encode_error(error), status_code=error.http_status, media_type=JSON)


def _metadata(model: LoadedModel, versions: list[int]) -> dict[str, Any]:
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


@router.get("/v2/health/live")
async def health_live() -> Response:
    return Response(status_code=200)


@router.get("/v2/health/ready")
async def health_ready(request: Request) -> Response:
    return Response(status_code=200 if _repository(request).ready() else 400)


@router.get("/v2")
async def server_metadata() -> Response:
    return _json({"name": SERVER_NAME, "version": __version__, "extensions": EXTENSIONS})


@router.get("/v2/models/stats")
async def all_statistics(request: Request) -> Response:
    repository = _repository(request)
    stats = [
        model.statistics.as_dict()
        for name in sorted(repository.models)
        for _, model in sorted(repository.models[name].items())
        if model.ready
    ]
    return _json({"model_stats": stats})


@router.get("/v2/models/{model_name}")
@router.get("/v2/models/{model_name}/versions/{model_version:int}")
async def model_metadata(request: Request, model_name: str, model_version: int | None = None) -> Response:
    repository = _repository(request)
    try:
        model = repository.get(model_name, model_version)
    except InferenceError as error:
        return error_response(error)
    if not model.ready:
        return error_response(model.not_ready_error())
    return _json(_metadata(model, repository.ready_versions(model_name)))


@router.get("/v2/models/{model_name}/ready")
@router.get("/v2/models/{model_name}/versions/{model_version:int}/ready")
async def model_ready(request: Request, model_name: str, model_version: int | None = None) -> Response:
    try:
        model = _repository(request).get(model_name, model_version)
    except InferenceError:
        model = None
    if model is None or not model.ready:
        return _json({"error": "Model version not ready"}, status=400)
    return Response(status_code=200)


@router.get("/v2/models/{model_name}/config")
@router.get("/v2/models/{model_name}/versions/{model_version:int}/config")
async def model_config(request: Request, model_name: str, model_version: int | None = None) -> Response:
    try:
        model = _repository(request).get(model_name, model_version)
    except InferenceError as error:
        return error_response(error)
    return _json(model.spec.config)


@router.post("/v2/models/{model_name}/infer")
@router.post("/v2/models/{model_name}/versions/{model_version:int}/infer")
async def infer(request: Request, model_name: str, model_version: int | None = None) -> Response:
    try:
        model = _repository(request).get(model_name, model_version)
        if not model.ready:
            raise model.not_ready_error()
        header_length = request.headers.get("inference-header-content-length")
        body = decompress(await request.body(), request.headers.get("content-encoding"))
        infer_request = decode_request(body, header_length, model_name=model.name, model_version=model.version)
        validate_request(model.spec.config, infer_request)
        response = await model.infer(infer_request)
        payload, headers = encode_response(response, infer_request, model.spec.config, labels=model.labels)
    except InferenceError as error:
        return error_response(error)
    payload, encoding = compress(payload, request.headers.get("accept-encoding"))
    if encoding:
        headers["content-encoding"] = encoding
    return Response(payload, headers=headers, media_type=headers.pop("content-type", JSON))


@router.get("/v2/models/{model_name}/stats")
@router.get("/v2/models/{model_name}/versions/{model_version:int}/stats")
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
    except InferenceError as error:
        return error_response(error)
    return _json({"model_stats": [m.statistics.as_dict() for m in models]})


@router.post("/v2/repository/index")
async def repository_index(request: Request) -> Response:
    """The read-only part of Triton's model repository extension: every model version with its
    state (READY / UNAVAILABLE / LOADING) and, for a failed load, the reason. Loading and unloading
    models at runtime is not offered (an image serves what it was built with)."""
    return _json(_repository(request).index())


@router.get("/metrics")
async def prometheus_metrics() -> Response:
    return Response(metrics.exposition(), media_type=metrics.CONTENT_TYPE)
