"""Compile-time auto-complete of Python-backend models (their `auto_complete_config`).

Triton runs a python model's static `auto_complete_config(auto_complete_model_config)` when it
loads the model with auto-complete enabled (the default), after its own normalisation, then keeps
only part of what the model returns (core backend_model.cc, `TritonModel::UpdateModelConfig`):

- `max_batch_size`, `input` and `output` (replaced as a whole);
- the scheduler (`dynamic_batching` / `sequence_batching` / `ensemble_scheduling`) only when the
  config had none; a different one is an error;
- `model_transaction_policy.decoupled` when the returned config has the policy;

and normalises the result again. Everything else a model writes into `as_dict()` is dropped.

The model is imported in a child process (`python -m handlers.backends.python.autocomplete`) with
the interpreter that has the model's dependencies (`python`, default: this one), as Triton uses a
separate stub process: importing model.py can be slow (torch...), can change sys.path and
sys.modules, and must not take the compiler down. docs/python-backend.md has the measurements.

Deviation: a returned config that is not a valid ModelConfig (e.g. data_type "TYPE_FOO") is an
error naming the problem; tritonserver 2.51 silently keeps the unchanged config.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from google.protobuf import json_format
from google.protobuf.message import Message

from .errors import CODE_INTERNAL, ModelError
from .model_config import ModelConfig, to_triton_json
from .normalize import normalize_model_config

AUTOCOMPLETE_MODULE = "handlers.backends.python.autocomplete"
_SCHEDULERS = ("dynamic_batching", "sequence_batching", "ensemble_scheduling")
_ROOT = str(Path(__file__).resolve().parents[2])  # where `handlers` and `toolkit` live


def run_model_autocomplete(
    config_json: dict,
    model_file: Path,
    model_dir: Path,
    version: int,
    *,
    python: Sequence[str] | None = None,
    timeout: float = 600.0,
) -> dict:
    """The config dict the model's auto_complete_config returns (its input: `config_json`);
    ModelError with Triton's message when it fails."""
    name = str(config_json.get("name", ""))
    command = [*(python or [sys.executable]), "-m", AUTOCOMPLETE_MODULE]
    request = {"model_file": str(model_file), "model_dir": str(model_dir), "version": version, "config": config_json}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH", "")) if p)
    try:
        done = subprocess.run(
            command, input=json.dumps(request), capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        raise ModelError(
            f"auto_complete_config of model '{name}' did not finish within {timeout:.0f} s",
            model=name, file=str(model_file), code=CODE_INTERNAL,
        ) from None
    except OSError as exc:
        raise ModelError(
            f"cannot run {command[0]} to auto-complete model '{name}': {exc}", model=name, code=CODE_INTERNAL
        ) from None
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        detail = (done.stderr or done.stdout).strip()[-2000:]
        raise ModelError(
            f"Failed to initialize Python stub for auto-complete: the process exited with status {done.returncode}",
            model=name,
            file=str(model_file),
            code=CODE_INTERNAL,
            detail=detail or None,
        ) from None
    if "error" in answer:
        raise ModelError(answer["error"], model=name, file=str(model_file), code=CODE_INTERNAL)
    return answer["config"]


def update_model_config(config: Message, returned: dict) -> None:
    """Apply what auto_complete_config returned to `config`, keeping what Triton keeps."""
    name = config.name
    updated = ModelConfig()
    try:
        json_format.ParseDict(returned, updated)
    except json_format.ParseError as exc:
        raise ModelError(
            f"auto_complete_config of model '{name}' returned an invalid model configuration",
            model=name,
            code=CODE_INTERNAL,
            detail=str(exc),
        ) from None
    config.max_batch_size = updated.max_batch_size
    del config.input[:]
    config.input.extend(updated.input)
    del config.output[:]
    config.output.extend(updated.output)
    current = config.WhichOneof("scheduling_choice")
    returned_choice = updated.WhichOneof("scheduling_choice")
    if current is None:
        if returned_choice is not None:
            getattr(config, returned_choice).CopyFrom(getattr(updated, returned_choice))
    elif current != returned_choice:
        number = config.DESCRIPTOR.fields_by_name[current].number
        # Triton prints the current choice twice (sic).
        raise ModelError(
            f"Cannot update scheduling choice from {number} to {number} when auto-completing.",
            model=name,
            code=CODE_INTERNAL,
        )
    if updated.HasField("model_transaction_policy"):
        config.model_transaction_policy.decoupled = updated.model_transaction_policy.decoupled


def autocomplete(
    config: Message,
    model_dir: Path,
    version_dir: Path,
    *,
    model_file: Path | None = None,
    python: Sequence[str] | None = None,
    timeout: float = 600.0,
) -> None:
    """Run the model's auto_complete_config (when it has one) and update `config` in place as
    tritonserver does, normalising it again. Raises ModelError with Triton's message (code
    Internal, as tritonserver reports it). The support checks (e.g. a model that made itself
    decoupled) stay with the compiler, after this step, as in tritonserver's order.

    `config` is the model's config after Triton's own auto-complete and normalisation;
    `version_dir` the version whose model.py runs (Triton: each loaded version; the toolkit: the
    newest, since versions share one config); `model_file` defaults to
    `version_dir / config.default_model_filename` (or model.py).
    """
    model_dir = Path(model_dir)
    version_dir = Path(version_dir)
    if model_file is None:
        model_file = version_dir / (config.default_model_filename or "model.py")
    returned = run_model_autocomplete(
        to_triton_json(config), Path(model_file), model_dir, int(version_dir.name), python=python, timeout=timeout
    )
    try:
        update_model_config(config, returned)
    except ModelError as exc:
        exc.file = exc.file or str(model_file)
        raise
    normalize_model_config(config)


__all__ = ["autocomplete", "run_model_autocomplete", "update_model_config"]
