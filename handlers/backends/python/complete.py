"""Complete python models' configs in the image build: `python -m handlers.backends.python.complete MANIFEST`.

`toolkit build` compiles the repository on the host. A python model whose `auto_complete_config`
imports a package the host does not have (one from the model's requirements.txt, installed only
into the image) is left for this step: its manifest entry says `"autocomplete": "image"` and
holds the config auto_complete_config receives. The Dockerfile runs this module once the wheels
and the repository are in place (toolkit/build/hooks.py), as the build user, with the image's
Python and packages. For each such model it

1. runs auto_complete_config in a child process, as the compiler does (autocomplete_process.py);
2. keeps what tritonserver keeps of the result and normalises it (config_update.py, the rules
   the compiler applies too);
3. runs the checks the host had to leave out, in tritonserver's order and with its messages, with
   the compiler's own code (handlers/config): ValidateModelConfig / ValidateModelIOConfig of the
   completed config, label files, the warmup samples against the completed inputs
   (handlers/config/warmup.py, through the runtime's own request validation), this product's support
   checks; then ValidateEnsembleConfig for every ensemble that calls a completed model;

and rewrites the manifest atomically with the completed configs, so the image ships complete
JSON and the runtime never guesses. Any failure fails the image build: every failing model is
listed with Triton's message, and the manifest is left as it was.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...config.ensemble import ENSEMBLE_PLATFORM, validate_ensemble_config
from ...config.errors import ConfigError
from ...config.support import check_supported
from ...config.validate import (
    check_label_files,
    duplicate_tensor_warnings,
    validate_model_config,
    validate_model_io_config,
)
from ...manifest import MANIFEST_FORMAT, ModelSpec
from .autocomplete_process import DEFAULT_TIMEOUT_S, AutoCompleteFailure, run_auto_complete
from .config_update import update_model_config
from ...config.warmup import check_warmup

AUTOCOMPLETE_KEY = "autocomplete"
IN_IMAGE = "image"
REQUIREMENTS_FILENAME = "requirements.txt"


class CompletionError(Exception):
    """Models whose completion failed: name -> message (Triton's, with what we add)."""

    def __init__(self, failures: dict[str, str]) -> None:
        self.failures = failures
        lines = "\n".join(f"  {name}: {message}" for name, message in sorted(failures.items()))
        super().__init__(f"auto_complete_config of python models failed in the image build:\n{lines}")


@dataclass
class Completion:
    completed: list[str] = field(default_factory=list)
    ensembles_checked: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _failure_text(exc: ConfigError | AutoCompleteFailure, model_dir: Path) -> str:
    text = exc.message + (f" ({exc.detail})" if exc.detail else "")
    if isinstance(exc, AutoCompleteFailure) and exc.import_error:
        what = f"'{exc.missing_module}'" if exc.missing_module else "a module it imports"
        text += (
            f" (the image cannot import {what} either: list it in {model_dir / REQUIREMENTS_FILENAME}, which "
            "toolkit build installs into the image)"
        )
    return text


def complete_model(
    entry: dict[str, Any], root: Path, *, python: Sequence[str] | None = None, timeout: float = DEFAULT_TIMEOUT_S
) -> tuple[dict[str, Any], list[str]]:
    """The completed config of one manifest entry and its warnings; ConfigError or
    AutoCompleteFailure at the first problem."""
    model_dir = (root / entry["path"]).resolve()
    versions = [int(v) for v in entry["versions"]]
    version = max(versions)
    model_file = model_dir / entry["model_files"][str(version)]
    returned = run_auto_complete(entry["config"], model_file, model_dir, version, python=python, timeout=timeout)
    config = update_model_config(entry["config"], returned)
    validate_model_config(config)  # Model::Init: ValidateModelConfig, ValidateModelIOConfig, label files
    validate_model_io_config(config)
    check_label_files(config, model_dir)
    spec = ModelSpec(
        name=entry["name"],
        directory=model_dir,
        versions=tuple(versions),
        model_files={int(v): model_dir / f for v, f in entry["model_files"].items()},
        config=config,
    )
    warnings = check_warmup(spec, version)
    warnings += duplicate_tensor_warnings(config)
    check_supported(config)
    return config, warnings


def complete_manifest(
    path: Path, *, python: Sequence[str] | None = None, timeout: float = DEFAULT_TIMEOUT_S
) -> Completion:
    """Complete every model of the manifest at `path` marked `"autocomplete": "image"` and
    rewrite the manifest; CompletionError (manifest untouched) when any model fails."""
    path = Path(path)
    document = json.loads(path.read_text())
    if document.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"unsupported manifest format {document.get('format')!r} (expected {MANIFEST_FORMAT})")
    root = path.parent
    entries: list[dict[str, Any]] = document["models"]
    by_name = {entry["name"]: entry for entry in entries}
    result = Completion()
    failures: dict[str, str] = {}

    for entry in entries:
        if entry.get(AUTOCOMPLETE_KEY) != IN_IMAGE:
            continue
        name = entry["name"]
        try:
            config, warnings = complete_model(entry, root, python=python, timeout=timeout)
        except (ConfigError, AutoCompleteFailure) as exc:
            failures[name] = _failure_text(exc, (root / entry["path"]))
            continue
        entry["config"] = config
        del entry[AUTOCOMPLETE_KEY]
        result.completed.append(name)
        result.warnings.extend(warnings)

    for entry in entries:
        config = entry["config"]
        if config.get("platform") != ENSEMBLE_PLATFORM:
            continue
        called = [step["model_name"] for step in config.get("ensemble_scheduling", {}).get("step", [])]
        if not any(model in result.completed for model in called):
            continue
        if any(model in failures or model not in by_name for model in called):
            continue  # the failing model is reported itself
        try:
            decoupled = validate_ensemble_config(config, {model: by_name[model]["config"] for model in called})
        except ConfigError as exc:
            failures[entry["name"]] = exc.message
            continue
        # a step that made itself decoupled makes the ensemble decoupled (ValidateEnsembleConfig)
        config.setdefault("model_transaction_policy", {})["decoupled"] = decoupled
        result.ensembles_checked.append(entry["name"])

    if failures:
        raise CompletionError(failures)
    if result.completed:
        _write_atomically(path, json.dumps(document, indent=2) + "\n")
    return result


def _write_atomically(path: Path, text: str) -> None:
    """Replace `path` with `text` in one rename, readable by everyone (the image runs as another
    user than the one building it)."""
    handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "w") as out:
            out.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m handlers.backends.python.complete",
        description="Run the auto_complete_config of the python models a manifest leaves for the image build.",
    )
    parser.add_argument("manifest", type=Path, help="models.json written by toolkit build")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per model (default 600)")
    args = parser.parse_args(argv)
    try:
        result = complete_manifest(args.manifest, timeout=args.timeout)
    except CompletionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (OSError, ValueError, KeyError) as exc:
        print(f"error: cannot complete {args.manifest}: {exc!r}", file=sys.stderr)
        return 1
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if not result.completed:
        print(f"{args.manifest}: no python model left for the image build")
    for name in result.completed:
        print(f"completed the config of python model '{name}' (auto_complete_config)")
    for name in result.ensembles_checked:
        print(f"checked ensemble '{name}' against the completed configs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
