"""Helpers for the python-backend tests: model directories from the fixture model.py files, and
a loaded runtime `ModelRepository` (real instances, real model processes)."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

from handlers.backends.python import attach_repository
from handlers.manifest import Manifest
from handlers.model_repository import ModelRepository
from toolkit.repository.compile import compile_repository

FIXTURES = Path(__file__).resolve().parent


def python_model(repo: Path, name: str, fixture: str | None, config: str | None, *, source: str | None = None, version: int = 1) -> Path:
    """`repo/name/<version>/model.py` from a fixture file (or `source`), and config.pbtxt when given."""
    directory = repo / name / str(version)
    directory.mkdir(parents=True, exist_ok=True)
    if source is not None:
        (directory / "model.py").write_text(textwrap.dedent(source))
    else:
        shutil.copy(FIXTURES / fixture, directory / "model.py")
    if config is not None:
        (repo / name / "config.pbtxt").write_text(textwrap.dedent(config).lstrip())
    return directory / "model.py"


def load(repo: Path, **compile_args) -> ModelRepository:
    result = compile_repository(repo, **compile_args)
    assert result.ok, {name: str(error) for name, error in result.failures.items()}
    manifest = Manifest.from_dict(result.manifest(), root=result.root)
    repository = ModelRepository(manifest)
    attach_repository(repository)
    repository.load(exit_on_error=False)
    return repository


def close(repository: ModelRepository) -> None:
    repository.stop(drain=False, timeout=30)
    for by_version in repository.models.values():
        for model in by_version.values():
            for instance in model.instances:
                closer = getattr(instance, "close", None)
                if closer is not None:
                    closer()
