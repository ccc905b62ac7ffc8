"""What the compiler produces: each model's completed config and files, and the repository's
failures; `CompiledRepository.manifest()` is the JSON document the runtime (handlers/) reads."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__
from .errors import ModelError
from .normalize import Device

MANIFEST_FORMAT = 1
MANIFEST_FILENAME = "models.json"
# Where python models' auto_complete_config runs (compile_repository's `python_autocomplete`):
# here only, or here and, for models whose dependencies are not installed here, in the image build.
AUTOCOMPLETE_HOST = "host"
AUTOCOMPLETE_IMAGE = "image"


@dataclass
class CompiledModel:
    """One model, ready to serve: Triton's completed config plus what the runtime must load."""

    name: str
    path: Path
    config: dict[str, Any]
    versions: list[int]
    model_files: dict[int, str]  # version -> path relative to the model directory
    warnings: list[str] = field(default_factory=list)
    # "image": auto_complete_config could not run here (a dependency is missing) and runs in the
    # image build (handlers/backends/python/complete.py); `config` is the config it receives.
    autocomplete: str | None = None
    autocomplete_reason: str | None = None

    @property
    def backend(self) -> str:
        return self.config.get("backend") or self.config.get("platform", "")

    def manifest_entry(self, root: Path) -> dict[str, Any]:
        entry = {
            "name": self.name,
            "path": self.path.relative_to(root).as_posix() if self.path.is_relative_to(root) else str(self.path),
            "versions": self.versions,
            "model_files": {str(v): f for v, f in self.model_files.items()},
            "config": self.config,
        }
        if self.autocomplete is not None:
            entry["autocomplete"] = self.autocomplete
        return entry


@dataclass
class CompiledRepository:
    root: Path
    device: Device
    models: dict[str, CompiledModel] = field(default_factory=dict)
    failures: dict[str, ModelError] = field(default_factory=dict)
    selected: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def failure_lines(self) -> list[str]:
        """One line per failed model, by name: `name: location: message`."""
        lines = []
        for name in sorted(self.failures):
            error = self.failures[name]
            where = f"{error.location}: " if error.location else ""
            lines.append(f"{name}: {where}{error.message}")
        return lines

    def manifest(self) -> dict[str, Any]:
        """The JSON document the runtime (handlers/) reads; it never sees protobuf."""
        return {
            "format": MANIFEST_FORMAT,
            "toolkit_version": __version__,
            "device": str(self.device),
            "models": [self.models[n].manifest_entry(self.root) for n in sorted(self.models)],
        }

    def write_manifest(self, path: Path) -> Path:
        path.write_text(json.dumps(self.manifest(), indent=2) + "\n")
        return path
