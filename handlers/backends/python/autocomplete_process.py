"""Run a python model's `auto_complete_config` in a child process (`autocomplete.py`).

Triton calls it in an auto-complete stub process of its own; so does the toolkit, from the
compiler (toolkit/repository/python_autocomplete.py) and from the image build's completion step
(`complete.py`): importing model.py can be slow (torch...), change sys.path and sys.modules, or
fail, and the caller must not inherit any of that. The child runs with the interpreter that has
the model's dependencies (`python`, default: this one) and finds this `handlers` package first.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AUTOCOMPLETE_MODULE = "handlers.backends.python.autocomplete"
# The folder holding the `handlers` package.
_ROOT = str(Path(__file__).resolve().parents[3])
DEFAULT_TIMEOUT_S = 600.0


@dataclass
class AutoCompleteFailure(Exception):
    """auto_complete_config could not run or raised; `message` is Triton's where it has one."""

    message: str
    detail: str | None = None
    # Importing a dependency failed (ImportError); `missing_module` names it when Python does.
    import_error: bool = False
    missing_module: str | None = None

    def __str__(self) -> str:
        return self.message


def run_auto_complete(
    config: Mapping[str, Any],
    model_file: Path,
    model_dir: Path,
    version: int,
    *,
    python: Sequence[str] | None = None,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> dict[str, Any]:
    """The config the model's auto_complete_config returns for `config` (Triton's config JSON
    as the model receives it); `AutoCompleteFailure` when it fails."""
    name = str(config.get("name", ""))
    command = [*(python or [sys.executable]), "-m", AUTOCOMPLETE_MODULE]
    request = {"model_file": str(model_file), "model_dir": str(model_dir), "version": version, "config": config}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH", "")) if p)
    try:
        done = subprocess.run(
            command, input=json.dumps(request), capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
    except subprocess.TimeoutExpired:
        raise AutoCompleteFailure(f"auto_complete_config of model '{name}' did not finish within {timeout:.0f} s") from None
    except OSError as exc:
        raise AutoCompleteFailure(f"cannot run {command[0]} to auto-complete model '{name}': {exc}") from None
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        detail = (done.stderr or done.stdout).strip()[-2000:]
        raise AutoCompleteFailure(
            f"Failed to initialize Python stub for auto-complete: the process exited with status {done.returncode}",
            detail=detail or None,
        ) from None
    if "error" in answer:
        raise AutoCompleteFailure(
            answer["error"],
            import_error=bool(answer.get("import_error", False)),
            missing_module=answer.get("missing_module"),
        )
    return answer["config"]


__all__ = ["AUTOCOMPLETE_MODULE", "AutoCompleteFailure", "run_auto_complete"]
