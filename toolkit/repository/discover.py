"""Model repository layout, as Triton reads it.

    <repository>/
      <model-name>/
        [config.pbtxt]
        [<label files> ...]
        <version>/            numeric, not starting with 0 (others are ignored)
          <model file>        model.onnx (file or directory), model.py, or default_model_filename
        [warmup/]             files named by model_warmup input_data_file

Hidden directories (names starting with '.') are not models (Triton would try to load `.git`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import ModelError, RepositoryError
from .model_config import CONFIG_FILENAME


@dataclass(frozen=True)
class ModelDirectory:
    """One model directory of a repository (before its config is read)."""

    name: str
    path: Path

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILENAME

    @property
    def has_config(self) -> bool:
        return self.config_path.is_file()

    def version_numbers(self) -> list[int]:
        """Numerically named version directories, ascending (Triton ignores the others)."""
        return sorted(
            int(p.name) for p in self.path.iterdir() if p.is_dir() and is_version_directory_name(p.name)
        )

    def version_path(self, version: int) -> Path:
        return self.path / str(version)


def is_version_directory_name(name: str) -> bool:
    return name.isascii() and name.isdigit() and not name.startswith("0")


def list_models(repository: Path) -> list[ModelDirectory]:
    """Every model directory in the repository, sorted by name."""
    if not repository.exists():
        raise RepositoryError(f"model repository '{repository}' does not exist")
    if not repository.is_dir():
        raise RepositoryError(f"model repository '{repository}' is not a directory")
    return [
        ModelDirectory(p.name, p)
        for p in sorted(repository.iterdir(), key=lambda p: p.name)
        if p.is_dir() and not p.name.startswith(".")
    ]


def select_versions(model_name: str, available: list[int], policy: dict) -> list[int]:
    """Apply a Triton `version_policy` (its JSON form) to the available versions.

    Mirrors Triton's model repository manager: `latest` takes the `num_versions` highest, `all`
    takes every version, `specific` takes the listed versions that exist. No version left is an
    error, with Triton's message.
    """
    if "specific" in policy:
        wanted = [int(v) for v in policy["specific"].get("versions", [])]
        selected = sorted(v for v in set(wanted) if v in available)
    elif "all" in policy:
        selected = list(available)
    else:
        count = int(policy.get("latest", {}).get("num_versions", 1))
        selected = sorted(available)[-count:] if count > 0 else []
    if not selected:
        raise ModelError(
            f"at least one version must be available under the version policy of model '{model_name}'",
            model=model_name,
        )
    return selected


def missing_specific_versions(available: list[int], policy: dict) -> list[int]:
    """Versions a `specific` policy names that have no directory (Triton logs these)."""
    if "specific" not in policy:
        return []
    return sorted({int(v) for v in policy["specific"].get("versions", [])} - set(available))


def find_model_file(model_dir: ModelDirectory, version: int, filename: str) -> Path:
    """The model file (or directory, for ONNX models with external data) of one version."""
    path = model_dir.version_path(version) / filename
    if not path.exists():
        raise ModelError(
            f"unable to find '{path}' for model '{model_dir.name}' version {version}: "
            f"the version directory must contain '{filename}'",
            model=model_dir.name,
            file=str(path),
        )
    return path


def within(base: Path, candidate: Path) -> bool:
    """True when `candidate` resolves to a path inside `base` (symlinks and '..' followed)."""
    try:
        candidate.resolve().relative_to(base.resolve())
    except ValueError:
        return False
    return True


def ensure_repository(path: str | Path) -> Path:
    """A local path for a repository location (remote locations are fetched into a cache)."""
    text = str(path)
    if "://" in text:
        from .remote import fetch_repository

        return fetch_repository(text)
    return Path(text)
