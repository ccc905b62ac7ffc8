"""Model repository layout, as Triton reads it.

    <repository>/
      <model-name>/
        [config.pbtxt]
        [<label files> ...]
        <version>/            an integer; see `parse_version_directory`
          <model file>        model.onnx (file or directory), model.py, or default_model_filename
        [warmup/]             files named by model_warmup input_data_file

Hidden directories (names starting with '.') are not models (Triton would try to load `.git`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import ModelError, RepositoryError
from .model_config import CONFIG_FILENAME

# Subdirectories of a model that are never versions (Triton's kWarmupDataFolder,
# kInitialStateFolder).
NON_VERSION_DIRECTORIES = ("warmup", "initial_state")

_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)
_SPACE = " \t\n\v\f\r"


class VersionParse:
    """What Triton's VersionsToLoad makes of a model's subdirectories."""

    def __init__(self) -> None:
        self.versions: dict[int, str] = {}  # version -> first directory name that gave it
        self.warnings: list[str] = []


def parse_version_directory(name: str) -> int | None:
    """The version tritonserver reads from a model subdirectory name, or None if it ignores it.

    tritonserver (model_lifecycle.cc VersionsToLoad) skips names longer than one character that
    start with '0', then applies std::stoll: leading whitespace, an optional sign and the leading
    digits count, anything after them is ignored ("2a" is version 2, "-1" is version -1, "0" is
    version 0), no digits at all means the directory is ignored. (`ModelDirectory.scan_versions`
    refuses negative versions, which hang tritonserver 2.51's python backend.) A number outside the 64-bit range
    raises `ValueError` (std::out_of_range, which tritonserver 2.51 does not catch: it aborts).
    """
    if len(name) > 1 and name.startswith("0"):
        return None
    text = name.lstrip(_SPACE)
    sign = ""
    if text[:1] in ("+", "-"):
        sign, text = text[0], text[1:]
    digits = ""
    for ch in text:
        if not ("0" <= ch <= "9"):
            break
        digits += ch
    if not digits:
        return None
    value = int(sign + digits)
    if not _INT64_MIN <= value <= _INT64_MAX:
        raise ValueError(name)
    return value


def is_version_directory_name(name: str) -> bool:
    """True for the directory tritonserver loads a version from (it joins str(version))."""
    try:
        version = parse_version_directory(name)
    except ValueError:
        return False
    return version is not None and str(version) == name


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

    def scan_versions(self) -> VersionParse:
        """The versions tritonserver finds, with the warnings it logs about other directories.

        Raises `ModelError` for a directory whose number does not fit in 64 bits (tritonserver
        2.51 aborts on it; we refuse it cleanly).
        """
        found = VersionParse()
        for p in sorted(self.path.iterdir(), key=lambda p: p.name):
            if not p.is_dir() or p.name in NON_VERSION_DIRECTORIES:
                continue
            if len(p.name) > 1 and p.name.startswith("0"):
                found.warnings.append(
                    f"ignore version directory '{p.name}' which contains leading zeros in its directory name"
                )
                continue
            try:
                version = parse_version_directory(p.name)
            except ValueError:
                raise ModelError(
                    f"version directory '{p.name}' of model '{self.name}' is out of the range of a 64-bit "
                    "version number",
                    model=self.name,
                    file=str(p),
                    detail="tritonserver 2.51 aborts (std::out_of_range) on such a directory; rename it",
                ) from None
            if version is None:
                found.warnings.append(
                    f"ignore version directory '{p.name}' which fails to convert to integral number"
                )
                continue
            if version < 0:
                raise ModelError(
                    f"version directory '{p.name}' of model '{self.name}' gives the negative version {version}",
                    model=self.name,
                    file=str(p),
                    detail="tritonserver reads it as a version, and 2.51 hangs loading it with the python "
                    "backend; versions are positive numbers (and -1 means 'latest' in ensemble steps)",
                )
            found.versions.setdefault(version, p.name)
        return found

    def version_numbers(self) -> list[int]:
        """The versions tritonserver finds, ascending."""
        return sorted(self.scan_versions().versions)

    def version_path(self, version: int) -> Path:
        # tritonserver loads version N from JoinPath(model, std::to_string(N)), whatever the
        # directory that gave N was called ("2a" gives version 2, loaded from "2").
        return self.path / str(version)


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


def find_model_file(model_dir: ModelDirectory, version: int, filename: str, backend: str) -> Path:
    """The model file (or directory, for ONNX models with external data) of one version.

    The messages are the backends': the onnxruntime backend's ModelState::LoadModel, and the
    python backend stub's ("Failed to preinitialize Python stub: ...", which tritonserver 2.51
    logs while the load never finishes: the server hangs).
    """
    path = model_dir.version_path(version) / filename
    if backend == "onnxruntime":
        from .onnx_autocomplete import resolve_model_file

        resolve_model_file(path, model_dir.name)
    elif backend == "pytorch":
        from .torchscript import model_file

        path = model_file(model_dir.version_path(version), filename, model_dir.name)
    elif not path.exists():
        raise ModelError(
            f"Python model file not found in '{path}'",
            model=model_dir.name,
            file=str(path),
            detail=f"version {version} of a python model needs '{filename}'",
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
