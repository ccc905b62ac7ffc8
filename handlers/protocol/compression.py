"""HTTP body compression as tritonserver's HTTP frontend does it: `Content-Encoding: gzip|deflate`
requests are inflated, and responses are compressed when `Accept-Encoding` names gzip or deflate
(tritonclient's request_compression_algorithm / response_compression_algorithm).

Inflating is bounded (`TOOLKIT_MAX_REQUEST_BYTES`, handlers/limits.py) so a small compressed body
cannot expand without limit: past it the request is refused with 413.
"""

from __future__ import annotations

import zlib

from ..errors import InferenceError, ErrorCode, invalid_argument
from ..limits import LIMITS, body_too_large

MAX_REQUEST_BYTES = LIMITS.max_request_bytes
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def decompress(body: bytes, content_encoding: str | None, limit: int = MAX_REQUEST_BYTES) -> bytes:
    if not content_encoding or content_encoding.strip().lower() == "identity":
        return body
    encoding = content_encoding.strip().lower()
    wbits = _WBITS.get(encoding)
    if wbits is None:
        raise InferenceError(f"unsupported content-encoding '{content_encoding}': use gzip or deflate", ErrorCode.UNSUPPORTED)
    inflater = zlib.decompressobj(wbits)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise invalid_argument(f"failed to decompress the request body ({encoding}): {exc}") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise body_too_large(limit, inflated=True)
    return out


def compress(payload: bytes, accept_encoding: str | None) -> tuple[bytes, str | None]:
    if not accept_encoding:
        return payload, None
    accepted = [part.split(";")[0].strip().lower() for part in accept_encoding.split(",")]
    for encoding in ("gzip", "deflate"):
        if encoding in accepted:
            compressor = zlib.compressobj(6, zlib.DEFLATED, _WBITS[encoding])
            return compressor.compress(payload) + compressor.flush(), encoding
    return payload, None
