"""Inference errors with Triton's error codes and their HTTP status (http_server.cc)."""

from __future__ import annotations

from enum import Enum


class ErrorCode(Enum):
    """TRITONSERVER_Error_Code (the names pb_utils.TritonError also uses)."""

    UNKNOWN = "UNKNOWN"
    INTERNAL = "INTERNAL"
    NOT_FOUND = "NOT_FOUND"
    INVALID_ARG = "INVALID_ARG"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"

    @property
    def http_status(self) -> int:
        """tritonserver's HttpCodeFromError: everything not listed answers 400."""
        return _HTTP_STATUS.get(self, 400)


_HTTP_STATUS = {
    ErrorCode.INTERNAL: 500,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNSUPPORTED: 501,
}


class InferenceError(Exception):
    """An error answered to a client as `{"error": message}` with the code's HTTP status."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.INVALID_ARG) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    @property
    def http_status(self) -> int:
        return self.code.http_status

    def __repr__(self) -> str:
        return f"InferenceError({self.message!r}, {self.code.name})"


def invalid_argument(message: str) -> InferenceError:
    return InferenceError(message, ErrorCode.INVALID_ARG)


def not_found(message: str) -> InferenceError:
    return InferenceError(message, ErrorCode.NOT_FOUND)


def unavailable(message: str) -> InferenceError:
    return InferenceError(message, ErrorCode.UNAVAILABLE)


def unsupported(message: str) -> InferenceError:
    return InferenceError(message, ErrorCode.UNSUPPORTED)


def internal(message: str) -> InferenceError:
    return InferenceError(message, ErrorCode.INTERNAL)
