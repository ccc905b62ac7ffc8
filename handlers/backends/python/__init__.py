"""Triton python-backend models (model.py with `class TritonPythonModel`) served unchanged.

- `triton_python_backend_utils.py`: the `pb_utils` module models import (Tensor, InferenceRequest
  with BLS, InferenceResponse, TritonError, Logger, MetricFamily, ModelConfig, helpers);
- `model_runner.py`: loading model.py and running initialize / execute / finalize as Triton does;
- `process_instance.py` + `stub.py` + `ipc.py`: an instance in a process of its own (Triton's
  layout), talking over a socketpair;
- `inprocess_instance.py` + `local_host.py`: an instance inside the serving process;
  `instance_mode` chooses (see its doc and docs/python-backend.md);
- `bls.py`: BLS calls against the repository's models; `conversion.py`: runtime <-> payloads;
- `streams.py`: the responses of decoupled models (`model_transaction_policy { decoupled: true }`)
  on their way to each request's response stream;
- `metric_store.py`, `metric_family.py`, `logger.py`: custom metrics and logging;
- `autocomplete.py`: running a model's `auto_complete_config` (compile time).

This package's import stays light: a model process imports it before the model.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

DECOUPLED = True  # serves decoupled models (handlers/backends/__init__.py)
INSTANCE_MODE_ENV = "TOOLKIT_PYTHON_INSTANCE_MODE"
PROCESS, IN_PROCESS, AUTO = "process", "inprocess", "auto"
log = logging.getLogger("handlers.python")


class PythonModelLoadError(Exception):
    """A Python model cannot be loaded; the message says why (Triton's words where it has them)."""


def configured_mode(spec: Any) -> str:
    """TOOLKIT_PYTHON_INSTANCE_MODE from the model's config parameters, else the environment,
    else `auto`. The product's entry points set the environment: `toolkit build` bakes the
    target's mode into the image (Cloud Run, Knative: `process`; Lambda: `auto`) and `toolkit
    serve` uses `process`; `auto` is left for the runtime used as a library."""
    parameter = spec.config.get("parameters", {}).get(INSTANCE_MODE_ENV)
    if isinstance(parameter, dict):
        parameter = parameter.get("string_value")
    mode = (parameter or os.environ.get(INSTANCE_MODE_ENV) or AUTO).strip().lower()
    if mode not in (PROCESS, IN_PROCESS, AUTO):
        raise PythonModelLoadError(
            f"{INSTANCE_MODE_ENV} must be '{AUTO}', '{PROCESS}' or '{IN_PROCESS}', got '{mode}' (model '{spec.name}')"
        )
    return mode


# Top-level module names importable from in-process models' folders (their version folder and
# model folder are on sys.path, as in Triton) -> the folder that provides them.
_claimed: dict[str, str] = {}
_claims_lock = threading.Lock()


def _sibling_modules(spec: Any, version: int) -> dict[str, str]:
    names: dict[str, str] = {}
    model_file = Path(spec.model_files[version])
    for folder in (model_file.parent, Path(spec.directory)):
        try:
            entries = list(folder.iterdir())
        except OSError:
            continue
        for entry in entries:
            name = entry.name
            if entry.is_dir():
                if name.isdigit() or name.startswith((".", "__")):
                    continue
            elif entry.suffix in (".py", ".so", ".pyd") and entry != model_file:
                name = name.split(".", 1)[0]
            else:
                continue
            names.setdefault(name, str(folder))
    return names


def _claim(spec: Any, version: int, force: bool) -> bool:
    """Reserve this model's helper module names for the serving process; False when another
    in-process model already provides one of them from another folder (both would get the same
    module: one process has one `sys.modules`)."""
    names = _sibling_modules(spec, version)
    with _claims_lock:
        clashes = sorted(n for n, folder in names.items() if _claimed.get(n, folder) != folder)
        if clashes and not force:
            return False
        if clashes:
            log.warning(
                "in-process model '%s' shares helper module name(s) %s with another in-process model: "
                "both get the module imported first (use %s=process for this model)",
                spec.name, ", ".join(clashes), INSTANCE_MODE_ENV,
            )
        for name, folder in names.items():
            _claimed.setdefault(name, folder)
    return True


def instance_mode(spec: Any, version: int) -> str:
    """Where this model version's instances run.

    `process`: each instance in a model process of its own (Triton's layout): a model that
    crashes (`os._exit`, a segfault in an extension) fails only its own batch, and its process is
    started again for the next one. `inprocess`: inside the serving process. `auto`: in-process
    when the version has exactly one instance and its helper modules do not clash with another
    in-process model's, else processes: one instance saves the process start (cold start;
    docs/python-backend.md has the measurements), while `count > 1` needs processes for parallel
    Python code. In-process, a crash takes the whole server down with every request in flight,
    hence `auto` only where a server has one request at a time (AWS Lambda).
    """
    mode = configured_mode(spec)
    if mode == PROCESS:
        return PROCESS
    from .execution_env import configured_value

    if configured_value(spec.config) is not None or getattr(spec, "execution_env", None):
        # EXECUTION_ENV_PATH: the model runs on its environment's interpreter, so in a process
        if mode == IN_PROCESS:
            log.warning("model '%s' sets EXECUTION_ENV_PATH: its instances run in model processes, not in-process", spec.name)
        return PROCESS
    if mode == IN_PROCESS:
        _claim(spec, version, force=True)
        return IN_PROCESS
    from ...instance_group import instance_slots

    if len(instance_slots(spec.config)) == 1 and _claim(spec, version, force=False):
        return IN_PROCESS
    return PROCESS


def create_instance(spec: Any, version: int, slot: Any) -> Any:
    """One instance of a Python model (the backend contract, handlers/backends/__init__.py)."""
    return new_instance(spec, version, slot.name, slot.kind, slot.device_id, getattr(slot, "threads", None))


def explicit_threads(config: Any) -> int | None:
    """The CPU budget's hook (handlers/cpu_budget.py): a model process's numeric libraries use
    OMP_NUM_THREADS when the serving environment sets it."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def new_instance(spec: Any, version: int, name: str, kind: str = "KIND_CPU", device_id: int = 0,
                 threads: int | None = None) -> Any:
    """One instance of a Python model, named `name`, on `kind` / `device_id`. `threads`: its CPU
    budget, given to a model process as OMP_NUM_THREADS and friends (handlers/cpu_budget.py); an
    in-process instance shares the serving process's environment and gets none."""
    if instance_mode(spec, version) == IN_PROCESS:
        from .inprocess_instance import InProcessInstance
        from .model_runner import ModelLoadError

        try:
            return InProcessInstance(spec, version, name, kind, device_id)
        except ModelLoadError as exc:
            raise PythonModelLoadError(str(exc)) from None
    from .process_instance import ModelProcessError, ProcessInstance

    try:
        return ProcessInstance(spec, version, name, kind, device_id, threads=threads)
    except ModelProcessError as exc:
        raise PythonModelLoadError(str(exc)) from None


def attach_repository(repository: Any) -> None:
    """Let this repository's Python models make BLS calls to its models (see bls.py)."""
    from .bls import attach_repository as attach

    attach(repository)
