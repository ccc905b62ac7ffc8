"""Binary tensor data extension: how an HTTP body is framed, and how BYTES elements are laid out.

A v2 inference body is a JSON header, optionally followed by raw tensor data. The
`Inference-Header-Content-Length` HTTP header says where the JSON ends; the tensors that declare
`parameters.binary_data_size` then take their bytes from what follows, in input order. A header
length of 0 (or an empty body without the header) makes the whole body the data of the model's
single input: Triton's "raw binary request".

BYTES tensors travel as, per element, a 4-byte little-endian length followed by that many bytes.

Public surface:

- `parse_header_length(value, body_size)`: the header length as Triton reads it, or None.
- `split_body(body, header_length)`: the `Framing` (JSON header and binary payload, or raw).
- `deserialize_bytes(buffer, expected, describe)`: BYTES payload -> numpy object array.
- `serialize_bytes(elements)`: BYTES elements -> payload.

Every malformed input is answered with `InferenceError` (INVALID_ARG, HTTP 400), never with an
allocation sized by an untrusted number.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable
from typing import Any, NamedTuple

import numpy as np

from ..errors import invalid_argument

HEADER_LENGTH_HEADER = "Inference-Header-Content-Length"

_UINT32 = struct.Struct("<I")
_DIGITS = re.compile(r"\s*\+?(\d+)\s*")


class Framing(NamedTuple):
    """A request body cut in two: the JSON header and the binary data after it.

    `raw` marks a raw binary request: there is no JSON header and `payload` is the data of the
    model's only input. (A NamedTuple: made once per request, and a frozen dataclass's
    `__init__` costs twice as much.)
    """

    header: memoryview
    payload: memoryview
    raw: bool = False


def parse_header_length(value: str | int | None, body_size: int) -> int | None:
    """The `Inference-Header-Content-Length` value, checked against the body size.

    Triton reads the header with atoi, so a garbled value silently becomes 0 (a raw request); this
    runtime answers 400 instead. The range message is Triton's.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise invalid_argument(f"Unable to parse {HEADER_LENGTH_HEADER}, got: {value}")
    if isinstance(value, int):
        length = value
    else:
        match = _DIGITS.fullmatch(value)
        if match is None:
            if re.fullmatch(r"\s*-\d+\s*", value):
                raise invalid_argument(
                    f"inference header size should be in range (0, {body_size}), got: {value.strip()}"
                )
            raise invalid_argument(f"Unable to parse {HEADER_LENGTH_HEADER}, got: {value}")
        length = int(match.group(1))
    if length < 0 or length > body_size:
        raise invalid_argument(f"inference header size should be in range (0, {body_size}), got: {value}")
    return length


def split_body(body: bytes | bytearray | memoryview, header_length: int | None) -> Framing:
    """Cut `body` at `header_length` (already checked by `parse_header_length`).

    Without the header the whole body is JSON, except that an empty body is a raw request, as in
    Triton (`header_length` defaults to the content length, and 0 means raw).
    """
    view = memoryview(body).cast("B") if not isinstance(body, memoryview) else body.cast("B")
    if header_length is None:
        header_length = len(view)
    if header_length == 0:
        return Framing(header=view[:0], payload=view, raw=True)
    return Framing(header=view[:header_length], payload=view[header_length:])


class BytesContext(NamedTuple):
    """Names used in BYTES and size error messages (Triton's wording names input and model); a
    NamedTuple, as it is made for every input of a gRPC request."""

    input_name: str
    model_name: str
    log_prefix: str = ""


def deserialize_bytes(
    buffer: bytes | bytearray | memoryview, expected: int, where: BytesContext
) -> np.ndarray:
    """Decode `expected` length-prefixed elements into a 1-D object array of `bytes`.

    The walk is bounded by the buffer (each element costs at least 4 bytes), so a huge declared
    element count is only compared, never allocated. Messages follow Triton: the core's count and
    length-indicator checks, the backend's "incomplete string data" check.
    """
    data = bytes(buffer)
    size = len(data)
    elements: list[bytes] = []
    append = elements.append
    unpack = _UINT32.unpack_from
    pos = start = length = 0
    try:  # the tight loop: at most `expected` elements, ends when no 4 bytes are left
        for _ in range(expected):
            (length,) = unpack(data, pos)
            start = pos + 4
            pos = start + length
            append(data[start:pos])
    except struct.error:
        pass
    if pos > size:
        raise _incomplete_data(where, length, size - start)
    count = len(elements)
    if count < expected and pos < size:
        raise _incomplete_indicator(where, size - pos)
    while pos < size:  # more elements than declared: count them for the message
        if size - pos < 4:
            raise _incomplete_indicator(where, size - pos)
        (length,) = unpack(data, pos)
        start = pos + 4
        pos = start + length
        if pos > size:
            raise _incomplete_data(where, length, size - start)
        count += 1
    if count != expected:
        raise string_count_error(where, expected, count)
    array = np.empty(count, dtype=np.object_)
    array[:] = elements
    return array


def string_count_error(where: BytesContext, expected: int, count: int) -> Exception:
    """Triton core's messages for a BYTES tensor with the wrong number of elements."""
    if count < expected:
        return invalid_argument(
            f"{where.log_prefix}expected {expected} string elements for inference input "
            f"'{where.input_name}' for model '{where.model_name}', got {count}"
        )
    return invalid_argument(
        f"{where.log_prefix}unexpected number of string elements {count} for inference input "
        f"'{where.input_name}' for model '{where.model_name}', expecting {expected}"
    )


def _incomplete_indicator(where: BytesContext, available: int) -> Exception:
    return invalid_argument(
        f"{where.log_prefix}incomplete string length indicator for inference input '{where.input_name}' "
        f"for model '{where.model_name}', expecting 4 bytes but only {available} bytes available. "
        "Please make sure the string length indicator is in one buffer."
    )


def _incomplete_data(where: BytesContext, length: int, available: int) -> Exception:
    return invalid_argument(
        f"incomplete string data for inference input '{where.input_name}', expecting string of length "
        f"{length} but only {available} bytes available"
    )


def element_bytes(item: Any) -> bytes:
    """One BYTES element as bytes: bytes as they are, str as UTF-8, anything else as str(item)
    in UTF-8 (what Triton's python backend does when it serialises an object array)."""
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    if isinstance(item, (bytearray, memoryview)):
        return bytes(item)
    return str(item).encode("utf-8")


def serialize_bytes(elements: Iterable[Any]) -> bytes:
    """Length-prefixed concatenation of BYTES elements (see `element_bytes`)."""
    pack = _UINT32.pack
    parts: list[bytes] = []
    extend = parts.extend
    for item in elements:
        raw = element_bytes(item)
        extend((pack(len(raw)), raw))
    return b"".join(parts)
