"""Request size limits, with safe defaults, answered with HTTP 413.

A serverless instance has a few GiB of memory at most, and one request must not be able to take
it. Two limits, read once from the environment when the runtime starts:

- `TOOLKIT_MAX_REQUEST_BYTES` (default 64 MiB: `HTTP_DEFAULT_MAX_INPUT_SIZE`, the default of
  `--http-max-input-size` in tritonserver releases after 2.51; 2.51 itself has no limit and
  served a 100 MB body when measured): the request body, after gzip/deflate inflation. A body whose
  `Content-Length` is over it is refused before a byte of it is read; a chunked body is refused as
  soon as it passes the limit; an inflated body as soon as inflation passes it. Decoding a body
  costs a multiple of its size (JSON numbers and BYTES elements become Python objects: measured
  12-15x, docs/security.md), so this is also what bounds the memory one request can take.
- `TOOLKIT_MAX_TENSOR_ELEMENTS` (default 2**26 = 67,108,864, as many 1-byte elements as the
  default body holds): the element count of each input tensor of a client request. Requests a
  model makes itself (BLS, ensemble steps, warmup) are trusted and not limited.

Both answer 413 `{"error": "..."}` naming the variable to raise. Values must be positive
integers; anything else fails start-up with a message naming the variable.
"""

from __future__ import annotations

import math
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

from .errors import ErrorCode, InferenceError
from .inference import InferRequest

__all__ = [
    "DEFAULT_MAX_REQUEST_BYTES",
    "DEFAULT_MAX_TENSOR_ELEMENTS",
    "LIMITS",
    "Limits",
    "PayloadTooLarge",
    "body_too_large",
    "read_limited",
]

MAX_REQUEST_BYTES_ENV = "TOOLKIT_MAX_REQUEST_BYTES"
MAX_TENSOR_ELEMENTS_ENV = "TOOLKIT_MAX_TENSOR_ELEMENTS"
DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_TENSOR_ELEMENTS = 1 << 26
HTTP_PAYLOAD_TOO_LARGE = 413


class PayloadTooLarge(InferenceError):
    """A request over a size limit: HTTP 413 (INVALID_ARG for anything that reads the code)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, ErrorCode.INVALID_ARG)

    @property
    def http_status(self) -> int:
        return HTTP_PAYLOAD_TOO_LARGE


def _positive(environ: Mapping[str, str], name: str, default: int) -> int:
    text = environ.get(name)
    if text is None or not text.strip():
        return default
    try:
        value = int(text.strip().replace("_", ""))
    except ValueError:
        raise ValueError(f"{name} must be a positive integer, got {text!r}") from None
    if value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {text!r}")
    return value


@dataclass(frozen=True, slots=True)
class Limits:
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_tensor_elements: int = DEFAULT_MAX_TENSOR_ELEMENTS

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> "Limits":
        environ = os.environ if environ is None else environ
        return cls(
            max_request_bytes=_positive(environ, MAX_REQUEST_BYTES_ENV, DEFAULT_MAX_REQUEST_BYTES),
            max_tensor_elements=_positive(environ, MAX_TENSOR_ELEMENTS_ENV, DEFAULT_MAX_TENSOR_ELEMENTS),
        )

    def body_too_large(self, size: int | None = None) -> PayloadTooLarge:
        return body_too_large(self.max_request_bytes, size)

    def check_content_length(self, header: str | None) -> None:
        """Refuse a declared body over the limit before reading it (an unparsable header is left
        to the HTTP server, which already refused it)."""
        if header is not None and header.strip().isdigit():
            declared = int(header)
            if declared > self.max_request_bytes:
                raise self.body_too_large(declared)

    def check_request(self, request: InferRequest) -> None:
        """Every input tensor of a client request within the element limit."""
        for name, array in request.inputs.items():
            count = math.prod(array.shape)
            if count > self.max_tensor_elements:
                raise PayloadTooLarge(
                    f"input '{name}' has {count} elements, more than the limit of {self.max_tensor_elements} "
                    f"per tensor; send a smaller batch, or raise {MAX_TENSOR_ELEMENTS_ENV}"
                )


def body_too_large(limit: int, size: int | None = None, *, inflated: bool = False) -> PayloadTooLarge:
    """The 413 for a body over `limit` bytes (`size` when known; `inflated` for a compressed body
    that inflates past it)."""
    if inflated:
        what = "request body inflates to more than the limit"
    elif size is not None:
        what = f"request body of {size} bytes exceeds the limit"
    else:
        what = "request body exceeds the limit"
    return PayloadTooLarge(
        f"{what} of {limit} bytes; send a smaller batch, or raise {MAX_REQUEST_BYTES_ENV}"
    )


def check_body(body: bytes, limits: Limits) -> None:
    """A body received whole (a Lambda event) within the limit, as `read_limited` decides it."""
    if len(body) > limits.max_request_bytes:
        raise limits.body_too_large()


async def read_limited(chunks: AsyncIterator[bytes], limits: Limits) -> bytes:
    """Collect a streamed body, refusing it as soon as it passes the limit (memory stays bounded
    by the limit, whatever the client sends or declares)."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limits.max_request_bytes:
            raise limits.body_too_large()
        if chunk:
            parts.append(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


# The limits of this process, read once at start-up (a bad value fails the import, i.e. start-up).
LIMITS = Limits.from_environment()
