"""Python models' EXECUTION_ENV_PATH environments in the image: unpacked at build time.

Triton unpacks a conda-pack archive when it loads the model; an image does it once, in its build,
so a cold start pays nothing. Each environment (an archive, or an unpacked folder packed here
into a tar with fixed times and owners) goes into the context as `envs/<digest>.<suffix>`, named
by its content so models sharing one environment share one copy. The install stage unpacks it
into `<envs_dir>/<digest>` with the runtime's own code (`python -m
handlers.backends.python.execution_env unpack`, which also runs conda-pack's `conda-unpack`),
the image copies the result, and models.json tells each model's processes where it is
(`execution_env`). The archive inside the model directory is not shipped a second time.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from handlers.backends.python.execution_env import ARCHIVE_SUFFIXES, configured_value, resolve

from ..repository.compile import CompiledRepository
from .wheelhouse import file_sha256

FOLDER = "envs"  # in the build context
ENVS_DIR = "/opt/toolkit/envs"  # in the image


@dataclass(frozen=True)
class PackedEnvironment:
    key: str  # content digest (hex, 16)
    filename: str  # under the context's envs/
    source: Path  # the archive or folder named by the model(s)

    @property
    def image_path(self) -> str:
        return str(PurePosixPath(ENVS_DIR) / self.key)


def sources(compiled: CompiledRepository) -> dict[str, Path]:
    """model name -> the environment its EXECUTION_ENV_PATH names (resolved, existing: the
    compiler checked it)."""
    found = {}
    for name, model in sorted(compiled.models.items()):
        if model.backend != "python":
            continue
        value = configured_value(model.config)
        if value is not None:
            found[name] = resolve(value, model.path).resolve()
    return found


def _tar_folder(folder: Path, archive: Path, mtime: int) -> None:
    """A reproducible tar of an environment folder: sorted, fixed times and owners, links kept."""

    def fixed(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.mtime, info.uid, info.gid, info.uname, info.gname = mtime, 0, 0, "", ""
        return info

    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for current, dirs, files in os.walk(folder):
            dirs.sort()
            for name in sorted(dirs + files):
                path = Path(current) / name
                tar.add(path, arcname=path.relative_to(folder).as_posix(), recursive=False, filter=fixed)


def write(compiled: CompiledRepository, context: Path, mtime: int) -> dict[str, PackedEnvironment]:
    """Put every environment into `context/envs/` and point the models at their image path;
    returns model name -> its environment."""
    by_source: dict[Path, PackedEnvironment] = {}
    models: dict[str, PackedEnvironment] = {}
    for name, source in sources(compiled).items():
        packed = by_source.get(source)
        if packed is None:
            folder = context / FOLDER
            folder.mkdir(exist_ok=True)
            staging = folder / ".staging"
            if source.is_dir():
                _tar_folder(source, staging, mtime)
                suffix = ".tar"
            else:
                shutil.copyfile(source, staging)
                suffix = next((s for s in ARCHIVE_SUFFIXES if source.name.endswith(s)), ".tar.gz")
            key = file_sha256(staging)[:16]
            filename = f"{key}{suffix}"
            staging.replace(folder / filename)
            packed = by_source[source] = PackedEnvironment(key, filename, source)
        models[name] = packed
        compiled.models[name].execution_env = packed.image_path
    return models


def shipped_elsewhere(compiled: CompiledRepository) -> set[Path]:
    """Environments inside model directories, which the model copy leaves out."""
    return set(sources(compiled).values())
