"""The REST side of Triton's logging, trace and shared-memory extensions, answering as the gRPC
service does (handlers/protocol/grpc/service.py), so that a client gets the same answers over
either protocol:

- `GET|POST /v2/logging`: the process's log settings (settings.py, one for both transports),
  Triton's JSON (`log_file`, `log_info`, ..., `log_format`); a POST changes the ones it names
  (null: left as is, as Triton does).
- `GET|POST /v2/trace/setting`, `/v2/models/{model}/trace/setting`: tritonserver's answer without
  `--trace-config` (`trace_level` ["OFF"], the rest as strings); a change is refused (501), this
  runtime does not trace.
- `/v2/systemsharedmemory/...`, `/v2/cudasharedmemory/...`: `status` answers `[]` (a named region:
  404, Triton's message), `unregister` succeeds (nothing is ever registered, as Triton answers for
  unknown names), `register` is refused (501): a serverless server never shares a host with its
  client. Triton's own shared-memory examples, which unregister everything first, then stop at
  `register` with that message.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from .. import limits
from ..errors import ErrorCode, InferenceError, invalid_argument, not_found, unsupported
from .routes import error_response as _error
from .settings import process_log_settings, trace_settings

JSON = "application/json"
SHARED_MEMORY_UNSUPPORTED = (
    "{kind} shared memory is not supported by this server: it runs on a serverless platform, where the "
    "client and the server never share a host; send tensors in the request body"
)

router = APIRouter(default_response_class=Response)

_ERROR = {"content": {JSON: {"schema": {"type": "object", "required": ["error"],
                                       "properties": {"error": {"type": "string"}}}}}}
_OBJECT = {"content": {JSON: {"schema": {"type": "object"}}}}
_SETTINGS_RESPONSES: dict[int | str, Any] = {
    200: {"description": "The settings after the request's changes", **_OBJECT},
    400: {"description": "A malformed body, a wrongly typed value, or an unknown model", **_ERROR},
    413: {"description": "The body is over the request size limit", **_ERROR},
    501: {"description": "A setting that cannot be changed here (`log_file`, `trace_file`; any trace setting: "
                         "this runtime does not trace)", **_ERROR},
    "4XX": {"description": "Another client error, e.g. 405 for a method the route does not take", **_ERROR},
}


def _json(document: Any) -> Response:
    return Response(orjson.dumps(document), media_type=JSON)


async def _document(request: Request, what: str) -> dict[str, Any]:
    """A POST's JSON object (empty body: {}), within the request size limit."""
    if request.method != "POST":
        return {}
    limits.LIMITS.check_content_length(request.headers.get("content-length"))
    body = await limits.read_limited(request.stream(), limits.LIMITS)
    if not body.strip():
        return {}
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise invalid_argument(f"failed to parse the {what} request JSON buffer: {error}") from None
    if not isinstance(document, dict):
        raise invalid_argument(f"failed to parse the {what} request JSON buffer: the body is not a JSON object")
    return document


def _log_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool_param"
    if isinstance(value, int) and 0 <= value < 2**32:
        return "uint32_param"
    return "string_param" if isinstance(value, str) else type(value).__name__


@router.api_route("/v2/logging", methods=["GET", "POST"], responses=_SETTINGS_RESPONSES)
async def logging_settings(request: Request) -> Response:
    try:
        document = await _document(request, "dynamic logging")
        updates = {key: (_log_kind(value), value) for key, value in document.items() if value is not None}
        return _json(process_log_settings().update(updates))
    except InferenceError as error:
        return _error(error)


@router.api_route("/v2/trace/setting", methods=["GET", "POST"], responses=_SETTINGS_RESPONSES)
@router.api_route("/v2/models/{model_name}/trace/setting", methods=["GET", "POST"], responses=_SETTINGS_RESPONSES)
async def trace_setting(request: Request, model_name: str = "") -> Response:
    try:
        if model_name and not any(m.ready for m in request.app.state.repository.models.get(model_name, {}).values()):
            raise invalid_argument(f"Request for unknown model : {model_name}")
        document = await _document(request, "trace")
        if "trace_file" in document:
            raise InferenceError("trace file location can not be updated through network protocol",
                                 ErrorCode.UNSUPPORTED)
        updates = {key: [] if value is None else [str(v) for v in value] if isinstance(value, list) else [str(value)]
                   for key, value in document.items()}
        values = trace_settings(updates)
        return _json({key: value if key == "trace_level" else value[0] for key, value in values.items()})
    except InferenceError as error:
        return _error(error)


def _shared_memory(kind: str, label: str) -> None:
    base = f"/v2/{kind}sharedmemory"

    other = {"4XX": _SETTINGS_RESPONSES["4XX"]}

    listing = {"content": {JSON: {"schema": {"type": "array", "maxItems": 0}}}}

    @router.get(f"{base}/status", responses={200: {"description": "No region is registered: []", **listing}, **other})
    async def status() -> Response:
        return _json([])

    @router.get(f"{base}/region/{{region}}/status", responses={404: {"description": "No such region", **_ERROR}, **other})
    async def region_status(region: str) -> Response:
        return _error(not_found(f"Unable to find {label.lower()} shared memory region: '{region}'"))

    registering = {501: {"description": "Shared memory is not supported: the client never shares the host", **_ERROR}}

    @router.post(f"{base}/register", responses={**registering, **other})
    @router.post(f"{base}/region/{{region}}/register", responses={**registering, **other})
    async def register(region: str = "") -> Response:
        return _error(unsupported(SHARED_MEMORY_UNSUPPORTED.format(kind=label)))

    done = {200: {"description": "Nothing was registered: nothing to unregister"}}

    @router.post(f"{base}/unregister", responses={**done, **other})
    @router.post(f"{base}/region/{{region}}/unregister", responses={**done, **other})
    async def unregister(region: str = "") -> Response:
        return Response(b"", media_type=JSON)  # nothing is ever registered


_shared_memory("system", "system")
_shared_memory("cuda", "CUDA")
