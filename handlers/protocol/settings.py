"""Triton's log and trace settings, transport-free: the gRPC `LogSettings` and `TraceSetting` RPCs
and the REST `/v2/logging` and `/v2/trace/setting` routes (admin.py) answer from here, the log
settings from one instance per process (`process_log_settings`), as they set the process's loggers.

Log settings are real: `log_info`, `log_warning`, `log_error` and `log_verbose_level` set the
level of the runtime's loggers (verbose > 0: DEBUG; else the most detailed of INFO / WARNING /
ERROR that is on), `log_format` takes Triton's `default` / `ISO8601`; `log_file` cannot be changed
over the network (Triton's own answer). Requests are validated as a whole before anything
changes, with Triton's messages.

This runtime does not trace requests: the trace settings read as a tritonserver started without
`--trace-config` reads them (`trace_level` OFF), and a request that would change a value is
refused with UNIMPLEMENTED instead of being accepted and ignored.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from ..errors import ErrorCode, InferenceError, invalid_argument

__all__ = ["LogSettings", "TRACE_DEFAULTS", "process_log_settings", "trace_settings"]

LOGGER_NAMES = ("handlers", "uvicorn", "uvicorn.error")

# tritonserver 2.51's answer to TraceSetting without --trace-config (measured).
TRACE_DEFAULTS: dict[str, list[str]] = {
    "trace_level": ["OFF"],
    "trace_rate": ["1000"],
    "trace_count": ["-1"],
    "log_frequency": ["0"],
    "trace_file": [""],
    "trace_mode": ["triton"],
}


def trace_settings(updates: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """The trace settings after `updates` (setting -> values): only unknown settings (ignored, as
    Triton ignores them) and values equal to the current ones are accepted."""
    for key, values in updates.items():
        if key in TRACE_DEFAULTS and list(values) not in ([], TRACE_DEFAULTS[key]):
            raise InferenceError(
                f"trace setting '{key}' cannot be changed: this server does not trace requests (trace_level "
                "stays OFF); use its statistics (ModelStatistics) and metrics instead",
                ErrorCode.UNSUPPORTED,
            )
    return {key: list(values) for key, values in TRACE_DEFAULTS.items()}


class LogSettings:
    """The process's log settings (one instance per server)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        level = logging.getLogger(LOGGER_NAMES[0]).getEffectiveLevel()
        self.values: dict[str, Any] = {
            "log_file": "",
            "log_info": level <= logging.INFO,
            "log_warning": level <= logging.WARNING,
            "log_error": level <= logging.ERROR,
            "log_verbose_level": 1 if level <= logging.DEBUG else 0,
            "log_format": "default",
        }

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self.values)

    def update(self, updates: Mapping[str, tuple[str | None, Any]]) -> dict[str, Any]:
        """Apply `updates` (setting -> (oneof kind, value)) and return the settings. Unknown
        settings are ignored, as Triton ignores them."""
        if "log_file" in updates:
            raise InferenceError(
                "log file location can not be updated through network protocol", ErrorCode.UNSUPPORTED
            )
        changes: dict[str, Any] = {}
        for key in ("log_info", "log_warning", "log_error"):
            if key in updates:
                kind, value = updates[key]
                if kind != "bool_param":
                    raise invalid_argument(f"expect boolean for '{key}'")
                changes[key] = value
        if "log_verbose_level" in updates:
            kind, value = updates["log_verbose_level"]
            if kind != "uint32_param":
                raise invalid_argument("expect int32 for 'log_verbose_level'")
            changes["log_verbose_level"] = value
        if "log_format" in updates:
            kind, value = updates["log_format"]
            if kind != "string_param":
                raise invalid_argument("expect string for 'log_format'")
            if value not in ("default", "ISO8601"):
                raise invalid_argument(f"invalid argument for log_format, got: {value}")
            changes["log_format"] = value
        with self._lock:
            self.values.update(changes)
            if changes:
                self._apply()
            return dict(self.values)

    def _apply(self) -> None:
        values = self.values
        if values["log_verbose_level"] > 0:
            level = logging.DEBUG
        elif values["log_info"]:
            level = logging.INFO
        elif values["log_warning"]:
            level = logging.WARNING
        elif values["log_error"]:
            level = logging.ERROR
        else:
            level = logging.CRITICAL + 1
        for name in LOGGER_NAMES:
            logging.getLogger(name).setLevel(level)


_process_settings: LogSettings | None = None
_process_lock = threading.Lock()


def process_log_settings() -> LogSettings:
    """The process's log settings, shared by its transports."""
    global _process_settings
    with _process_lock:
        if _process_settings is None:
            _process_settings = LogSettings()
        return _process_settings
