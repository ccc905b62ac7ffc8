"""What `pb_utils` needs from the runtime around it, and which model is calling.

`pb_utils` is the same module in two places: inside a Python-model process (`stub.py`), where BLS
calls, logs and metrics travel to the serving process over the instance's socket, and inside the
serving process itself (in-process instances, `local_host.py`). Both install a `Host`; without one
(e.g. a model's own unit test importing pb_utils) BLS is refused with a clear message and logs go
to Python logging.

`ModelContext` says which model instance the current code runs for: the runner sets it (a
contextvar) around import, `initialize`, `execute` and `finalize`, and a model process also sets
it as the process default so the model's own threads see it.
"""

from __future__ import annotations

import collections
import contextvars
import enum
import logging
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

# One tensor crossing the runtime boundary: (name, array, Triton datatype). BYTES arrays are object
# arrays of `bytes`; BF16 arrays hold the raw 16-bit patterns as uint16.
TensorPayload = tuple[str, Any, str]


@dataclass(frozen=True)
class BlsCall:
    """A BLS request as `pb_utils.InferenceRequest` describes it."""

    model_name: str
    model_version: int
    inputs: list[TensorPayload]
    requested_output_names: list[str]
    request_id: str = ""
    correlation_id: int | str = 0
    flags: int = 0
    timeout_us: int = 0
    parameters: dict[str, Any] | None = None


# ("ok", [TensorPayload, ...]) or ("error", message, TRITONSERVER_Error_Code number)
BlsOutcome = tuple


class BlsStream:
    """The events of a decoupled BLS call (`exec(decoupled=True)`) as they arrive: (BlsOutcome,
    or None for a flag-only final; final flag). Filled by the host's thread, read by the model's
    thread (`get` blocks); thread-safe."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._events: collections.deque[tuple[BlsOutcome | None, bool]] = collections.deque()
        self._ready_hooks: list[Callable[[], object]] = []
        self._cancel: Callable[[], object] | None = None
        self._cancelled = False

    def put(self, payload: BlsOutcome | None, final: bool) -> None:
        with self._cond:
            self._events.append((payload, final))
            self._cond.notify_all()
            hooks, self._ready_hooks = self._ready_hooks, []
        for hook in hooks:
            hook()

    def get(self) -> tuple[BlsOutcome | None, bool]:
        with self._cond:
            while not self._events:
                self._cond.wait()
            return self._events.popleft()

    def when_ready(self, hook: Callable[[], object]) -> None:
        """Call `hook` once the first event is there (at once if it is)."""
        with self._cond:
            if not self._events:
                self._ready_hooks.append(hook)
                return
        hook()

    def set_cancel(self, cancel: Callable[[], object]) -> None:
        with self._cond:
            self._cancel = cancel
            cancelled = self._cancelled
        if cancelled:
            cancel()

    def cancel(self) -> None:
        with self._cond:
            self._cancelled = True
            cancel = self._cancel
        if cancel is not None:
            cancel()


class Phase(enum.Enum):
    AUTO_COMPLETE = "auto_complete_config"
    INITIALIZE = "initialize"
    EXECUTE = "execute"
    FINALIZE = "finalize"


@dataclass(frozen=True)
class ModelContext:
    model_name: str
    instance_name: str
    model_dir: str  # the folder of model.py (pb_utils.get_model_dir())
    phase: Phase = Phase.EXECUTE
    # In the serving process: what serves this model's BLS calls (its repository's bridge).
    owner: Any = field(default=None, compare=False)

    def with_phase(self, phase: Phase) -> ModelContext:
        return replace(self, phase=phase)


class MetricsBackend(Protocol):
    """Custom metric families (pb_utils.MetricFamily), stored where /metrics is served. Errors
    are raised as ValueError with the core's message (pb_utils adds Triton's prefixes)."""

    def family(self, name: str, description: str, kind: int) -> int: ...

    def metric(self, family: int, labels: dict[str, str], buckets: list[float] | None) -> int: ...

    def update(self, metric: int, operation: str, value: float) -> None: ...

    def value(self, metric: int) -> float: ...


class Host(Protocol):
    def infer(self, call: BlsCall) -> BlsOutcome: ...

    def infer_async(self, call: BlsCall) -> Awaitable[BlsOutcome]: ...

    def infer_stream(self, call: BlsCall) -> BlsStream: ...

    def is_model_ready(self, name: str, version: str) -> bool: ...

    def log(self, level: int, message: str, filename: str, lineno: int) -> None: ...

    @property
    def metrics(self) -> MetricsBackend: ...


_context: contextvars.ContextVar[ModelContext | None] = contextvars.ContextVar("pb_utils_model", default=None)
_process_context: ModelContext | None = None
_host: Host | None = None


def install_host(host: Host | None) -> None:
    global _host
    _host = host


def current_host() -> Host | None:
    return _host


def set_process_context(context: ModelContext | None) -> None:
    """The model a whole process serves (a model process serves exactly one instance)."""
    global _process_context
    _process_context = context


def current_context() -> ModelContext | None:
    return _context.get() or _process_context


def enter_context(context: ModelContext) -> contextvars.Token:
    return _context.set(context)


def leave_context(token: contextvars.Token) -> None:
    _context.reset(token)


# Logger levels (pb_utils.Logger.LogLevel numbers) -> Python logging levels.
LOG_LEVELS = {0: logging.INFO, 1: logging.WARNING, 2: logging.ERROR, 3: logging.DEBUG}
MODEL_LOGGER = "handlers.python_model"


def emit_log(level: int, message: str, filename: str, lineno: int) -> None:
    """A pb_utils.Logger line as a Python log record located at the model's call site (Triton's
    log shows `model.py:25`)."""
    emit_record(LOG_LEVELS.get(level, logging.INFO), message, filename, lineno, MODEL_LOGGER)


def emit_record(levelno: int, message: str, filename: str, lineno: int, logger_name: str) -> None:
    logger = logging.getLogger(logger_name)
    if not logger.isEnabledFor(levelno):
        return
    logger.handle(logger.makeRecord(logger.name, levelno, filename, lineno, message, None, None, "log"))
