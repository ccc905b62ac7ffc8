"""`pb_utils.Logger` (pb_log.cc): log lines attributed to the model's own file and line.

Lines go to the serving process's log (Python logging, logger `handlers.python_model`): from a
model process over its socket, in-process directly. VERBOSE maps to DEBUG (Triton prints it only
with --log-verbose).
"""

from __future__ import annotations

import sys
from enum import IntEnum

from . import host


class LogLevel(IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


def _emit(message: str, level: int) -> None:
    frame = sys._getframe(2)  # the model's call site: Logger.log_info -> _emit
    filename, lineno = frame.f_code.co_filename, frame.f_lineno
    current = host.current_host()
    text = str(message)
    if current is not None:
        current.log(int(level), text, filename, lineno)
    else:
        host.emit_log(int(level), text, filename, lineno)


class Logger:
    LogLevel = LogLevel
    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: LogLevel = LogLevel.INFO) -> None:
        _emit(message, level)

    @staticmethod
    def log_info(message: str) -> None:
        _emit(message, LogLevel.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        _emit(message, LogLevel.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        _emit(message, LogLevel.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        _emit(message, LogLevel.VERBOSE)
