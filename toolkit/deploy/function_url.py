"""The Lambda Function URL event codec (payload format version 2.0), both ways.

`request_event` turns one HTTP request into the event a Function URL hands the function;
`http_response` turns what the function returned (the invocation's payload) back into the HTTP
answer the Function URL would send, following AWS's documented rules
(docs.aws.amazon.com/lambda/latest/dg/urls-invocation.html): a dict with `statusCode` is taken as
is (`body`, `headers`, `cookies`, `isBase64Encoded`); any other JSON becomes a 200
`application/json` answer with that JSON as body; a function error becomes 502.

Used by the deploy smoke test (one event, through the real Lambda Invoke API) and by
`toolkit proxy` / `toolkit run`, where plain HTTP clients reach a Lambda Invoke API endpoint
(AWS's Runtime Interface Emulator, `sam local start-lambda`) as if it were a Function URL.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from .. import __version__

# Content types a Function URL passes as text; every other body travels base64-encoded.
TEXT_TYPES = (
    "text/", "application/json", "application/xml", "application/javascript", "application/x-www-form-urlencoded",
)


def _is_text(content_type: str) -> bool:
    return any(content_type.lower().startswith(t) for t in TEXT_TYPES)


def request_event(
    method: str,
    target: str,
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    host: str = "localhost",
    source_ip: str = "127.0.0.1",
) -> dict[str, Any]:
    """The Function URL event for one HTTP request (`target` is the path with its query)."""
    url = urlsplit(target)
    lowered: dict[str, str] = {}
    cookies: list[str] = []
    for key, value in (headers or {}).items():
        name = key.lower()
        if name == "cookie":
            cookies += [c.strip() for c in value.split(";") if c.strip()]
            continue
        lowered[name] = f"{lowered[name]},{value}" if name in lowered else value  # Function URLs join repeats
    lowered.setdefault("host", host)
    lowered.setdefault("user-agent", f"toolkit/{__version__}")
    is_text = not body or _is_text(lowered.get("content-type", ""))
    now = time.time()
    event: dict[str, Any] = {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": url.path or "/",
        "rawQueryString": url.query,
        "headers": lowered,
        "requestContext": {
            "accountId": "anonymous",
            "apiId": host.split(".")[0],
            "domainName": host,
            "domainPrefix": host.split(".")[0],
            "http": {
                "method": method.upper(),
                "path": url.path or "/",
                "protocol": "HTTP/1.1",
                "sourceIp": source_ip,
                "userAgent": lowered["user-agent"],
            },
            "requestId": str(uuid.uuid4()),
            "routeKey": "$default",
            "stage": "$default",
            "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
            "timeEpoch": int(now * 1000),
        },
        "isBase64Encoded": not is_text,
    }
    if url.query:
        parameters: dict[str, str] = {}
        for key, value in parse_qsl(url.query, keep_blank_values=True):
            parameters[key] = f"{parameters[key]},{value}" if key in parameters else value
        event["queryStringParameters"] = parameters
    if cookies:
        event["cookies"] = cookies
    if body:
        event["body"] = body.decode("utf-8") if is_text else base64.b64encode(body).decode("ascii")
    return event


@dataclass
class HTTPAnswer:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""


def _error(message: str) -> HTTPAnswer:
    body = json.dumps({"error": message}).encode()
    return HTTPAnswer(502, [("Content-Type", "application/json")], body)


def is_function_error(payload: bytes) -> bool:
    """Whether an invocation's payload is a Lambda function error document (errorType, errorMessage)."""
    try:
        result = json.loads(payload)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return False
    return isinstance(result, dict) and "errorType" in result and "statusCode" not in result


def http_response(payload: bytes, function_error: str | None = None) -> HTTPAnswer:
    """The HTTP answer for an invocation's payload (`function_error`: the Invoke API's
    X-Amz-Function-Error header, set when the function raised or its runtime failed)."""
    try:
        result = json.loads(payload) if payload.strip() else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _error(f"the function's response is not JSON: {payload[:200]!r}")
    if function_error or is_function_error(payload):
        detail = result if isinstance(result, dict) else {}
        kind = detail.get("errorType") or function_error or "error"
        return _error(f"the function failed ({kind}): {detail.get('errorMessage', payload[:500].decode(errors='replace'))}")
    if not (isinstance(result, dict) and "statusCode" in result):
        return HTTPAnswer(200, [("Content-Type", "application/json")], json.dumps(result).encode())
    try:
        status = int(result["statusCode"])
    except (TypeError, ValueError):
        return _error(f"the function returned an invalid statusCode {result['statusCode']!r}")
    body = result.get("body") or ""
    if not isinstance(body, str):
        body = json.dumps(body)
    data = base64.b64decode(body) if result.get("isBase64Encoded") else body.encode("utf-8")
    headers = [(str(k), str(v)) for k, v in (result.get("headers") or {}).items()]
    headers += [("Set-Cookie", str(c)) for c in result.get("cookies") or []]
    return HTTPAnswer(status, headers, data)
