"""Model backends: one module or package per Triton backend.

A backend module provides `create_instance(spec, version, slot)`, returning a model instance with
`.execute(requests) -> outcomes` (and optionally `.close()`); a package may also provide
`attach_repository(repository)`, called once when the repository holds one of its models (the
python backend's BLS). Backends are imported only when a model uses them, so an image carries
and loads only the frameworks its models need.

Decoupled models (`model_transaction_policy { decoupled: true }`): a module that serves them sets
`DECOUPLED = True`; its instances send each request's responses to `request.responses` (a
ResponseSink, handlers/streaming.py) and return an outcome per request when `execute` returns
(its error ends the request's stream). A decoupled model of any other backend fails to load.

CPU threads: `slot.threads` is the instance's share of the container's CPUs, for the framework's
thread pools where the config sets no count; a module may define `explicit_threads(config)` so
that the budget knows the counts a config does set (handlers/cpu_budget.py says how).
`slot.serial` is true where the plan serves one request at a time (AWS Lambda): the instances
of a version never execute together there (the onnxruntime backend then shares one session).
"""

from __future__ import annotations

import importlib
from types import ModuleType

# Triton backend name -> the module serving it (ensembles are scheduled by the repository itself).
BACKEND_MODULES: dict[str, str] = {
    "fil": "handlers.backends.fil",
    "onnxruntime": "handlers.backends.onnxruntime",
    "openvino": "handlers.backends.openvino",
    "python": "handlers.backends.python",
    "pytorch": "handlers.backends.pytorch",
}


def backend_module(name: str) -> ModuleType | None:
    """The module serving backend `name`, imported on first use; None when no module serves it."""
    path = BACKEND_MODULES.get(name)
    return None if path is None else importlib.import_module(path)
