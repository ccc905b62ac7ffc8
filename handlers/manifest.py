"""The compiled repository manifest (`models.json`): the runtime's only description of models.

Written by `toolkit` (repository compiler), read here. Each model carries Triton's completed config
JSON, the versions to load and the model file of each version, relative to the model directory.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

MANIFEST_FORMAT = 1
MANIFEST_FILENAME = "models.json"


@dataclass(frozen=True)
class ModelSpec:
    name: str
    directory: Path
    versions: tuple[int, ...]
    model_files: dict[int, Path]
    config: dict[str, Any]
    # EXECUTION_ENV_PATH's environment as the image build unpacked it (None: resolve the parameter)
    execution_env: Path | None = None

    @property
    def backend(self) -> str:
        """'onnxruntime', 'python' or 'ensemble' (the platform, for ensembles)."""
        return self.config.get("backend") or self.config.get("platform", "")

    @property
    def platform(self) -> str:
        """What Triton's model metadata reports as `platform`."""
        return self.config.get("platform") or self.config.get("backend", "")

    @property
    def max_batch_size(self) -> int:
        return int(self.config.get("max_batch_size", 0))

    @cached_property
    def decoupled(self) -> bool:
        """`model_transaction_policy { decoupled: true }`: zero or many responses per request."""
        return bool((self.config.get("model_transaction_policy") or {}).get("decoupled", False))


@dataclass(frozen=True)
class Manifest:
    root: Path
    device: str
    models: dict[str, ModelSpec]

    @classmethod
    def from_dict(cls, data: dict[str, Any], root: Path) -> "Manifest":
        if data.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"unsupported manifest format {data.get('format')!r} (expected {MANIFEST_FORMAT})")
        models: dict[str, ModelSpec] = {}
        for entry in data["models"]:
            if entry.get("autocomplete") == "image":
                raise ValueError(
                    f"model '{entry['name']}' still waits for its auto_complete_config() to run in the image build "
                    "(python -m handlers.backends.python.complete MANIFEST); this manifest was not completed"
                )
            directory = (root / entry["path"]).resolve()
            models[entry["name"]] = ModelSpec(
                name=entry["name"],
                directory=directory,
                versions=tuple(int(v) for v in entry["versions"]),
                model_files={int(v): directory / f for v, f in entry.get("model_files", {}).items()},
                config=entry["config"],
                execution_env=root / entry["execution_env"] if entry.get("execution_env") else None,
            )
        return cls(root=root, device=data.get("device", "cpu"), models=models)

    @classmethod
    def load(cls, path: Path, root: Path | None = None) -> "Manifest":
        """Read `models.json`; model paths are relative to `root` (default: the manifest's folder)."""
        path = Path(path)
        return cls.from_dict(json.loads(path.read_text()), Path(root) if root else path.parent)
