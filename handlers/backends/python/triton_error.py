"""`pb_utils.TritonError` and `pb_utils.TritonModelException` (pb_error.cc, pb_exception.h).

TritonError is NOT an exception (as in Triton: raising it is a TypeError): it is the error a model
puts in `InferenceResponse(error=...)`. Its codes are the TRITONSERVER_Error_Code numbers, the
same names as the runtime's `handlers.errors.ErrorCode`.
"""

from __future__ import annotations

from enum import IntEnum


class _ErrorCode(IntEnum):
    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __str__(self) -> str:
        return f"__ErrorCode.{self.name}"


_ErrorCode.__name__ = _ErrorCode.__qualname__ = "__ErrorCode"  # how Triton's enum prints


class TritonError:
    """An error with a message and a code (default INTERNAL, HTTP 500)."""

    __slots__ = ("_code", "_message")

    UNKNOWN = _ErrorCode.UNKNOWN
    INTERNAL = _ErrorCode.INTERNAL
    NOT_FOUND = _ErrorCode.NOT_FOUND
    INVALID_ARG = _ErrorCode.INVALID_ARG
    UNAVAILABLE = _ErrorCode.UNAVAILABLE
    UNSUPPORTED = _ErrorCode.UNSUPPORTED
    ALREADY_EXISTS = _ErrorCode.ALREADY_EXISTS
    CANCELLED = _ErrorCode.CANCELLED

    def __init__(self, message: str, code: _ErrorCode = _ErrorCode.INTERNAL) -> None:
        if not isinstance(message, str):
            raise TypeError(
                "__init__(): incompatible constructor arguments. The following argument types are supported:\n"
                "    1. c_python_backend_utils.TritonError(message: str, code: "
                "c_python_backend_utils.TritonError.__ErrorCode = <__ErrorCode.INTERNAL: 1>)\n\n"
                f"Invoked with: {message!r}"
            )
        self._message = message
        self._code = _ErrorCode(code)

    def message(self) -> str:
        return self._message

    def code(self) -> _ErrorCode:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, TritonError.{self._code.name})"


class TritonModelException(Exception):
    """What the backend raises for a misuse (Triton's PythonBackendException in Python)."""
