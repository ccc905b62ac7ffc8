"""Custom execution environments: parameter EXECUTION_ENV_PATH, as Triton's python backend has it.

A Python model may name a conda-pack archive (`.tar.gz` / `.tar`) or an unpacked environment
folder; `$$TRITON_MODEL_DIRECTORY` in the value stands for the model's directory. Its model
processes then run on that environment's own interpreter (`<env>/bin/python`), with the
variables Triton's activation sets (VIRTUAL_ENV, PATH and LD_LIBRARY_PATH led by the
environment's bin/ and lib/, no PYTHONHOME), so model.py imports the environment's packages.

What differs from Triton: Triton's stub is a C++ program linked to one libpython, so the
environment's Python must be the stub's exact version (3.10 in Triton's 24.x containers, 3.12 in
the nvidia-pytriton build the tests compare with). Here the stub is this package's Python source,
which runs on Python `MIN_PYTHON` or newer with numpy `MIN_NUMPY` or newer in the environment;
its messages carry arrays in a form every numpy version reads (ipc.py, portable channels). Nothing of the serving environment leaks in: the
model process gets no PYTHONPATH, and the `handlers` package is imported from its folder alone
(`launch_command`).

`inspect` reads an archive or folder without running anything (compile time: `toolkit validate`,
`toolkit build`), `unpack` extracts an archive (the image build's install stage, or `toolkit serve`
at load time, as Triton does) and runs conda-pack's `conda-unpack` when the environment has it.
`python -m handlers.backends.python.execution_env unpack ARCHIVE FOLDER` is the build's entry.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

PARAMETER = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"
# The oldest Python the model process (this package's stub) runs on: the stub's modules need no
# newer one (vermin, tests/test_python_execution_env.py), and 3.10 is the Python of Triton's own
# 24.x containers, so users' conda-pack environments made for them are 3.10 environments.
MIN_PYTHON = (3, 10)
MIN_NUMPY = (1, 23)  # the oldest numpy the stub is tested with (1.23.5, the first with Python 3.11 wheels)
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")

_PYTHON_DIR = re.compile(r"^lib/python(\d+)\.(\d+)t?/")
_NUMPY_DIST = re.compile(r"^lib/python\d+\.\d+t?/site-packages/numpy-(\d+)\.(\d+)[^/]*\.(?:dist|egg)-info/")
_NUMPY_PACKAGE = re.compile(r"^lib/python\d+\.\d+t?/site-packages/numpy/__init__\.py$")
_CONDA_META_NUMPY = re.compile(r"^conda-meta/numpy-(\d+)\.(\d+)[^/]*\.json$")


class EnvironmentError_(Exception):
    """An execution environment that cannot host a model process; the message says which file,
    what is wrong and what works."""


def configured_value(config: Mapping[str, Any]) -> str | None:
    """The EXECUTION_ENV_PATH parameter's string, or None when the model sets none."""
    parameter = (config.get("parameters") or {}).get(PARAMETER)
    if parameter is None:
        return None
    value = parameter.get("string_value", "") if isinstance(parameter, Mapping) else str(parameter)
    return value


def resolve(value: str, model_dir: Path | str) -> Path:
    """The path `value` names: `$$TRITON_MODEL_DIRECTORY` replaced by the model's directory, made
    absolute as tritonserver's model paths are (the first occurrence, as Triton does); a relative
    path is relative to the model directory."""
    directory = Path(model_dir).absolute()
    resolved = Path(value.replace(MODEL_DIRECTORY, str(directory), 1))
    return resolved if resolved.is_absolute() else directory / resolved


@dataclass(frozen=True)
class EnvironmentInfo:
    path: Path
    archive: bool
    python: tuple[int, int] | None
    numpy: tuple[int, int] | None  # None: no numpy; (0, 0): numpy present, version unknown
    interpreter: str | None  # bin/python or bin/python3 (relative), if present
    conda_unpack: bool
    executable_format: str | None  # "elf", "mach-o", "pe", "script" or None (unread)


def _format(head: bytes) -> str | None:
    if head.startswith(b"\x7fELF"):
        return "elf"
    if head[:4] in (b"\xcf\xfa\xed\xfe", b"\xce\xfa\xed\xfe", b"\xca\xfe\xba\xbe", b"\xfe\xed\xfa\xcf"):
        return "mach-o"
    if head.startswith(b"MZ"):
        return "pe"
    if head.startswith(b"#!"):
        return "script"
    return None if not head else "unknown"


def _scan(names: list[str]) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    pythons: set[tuple[int, int]] = set()
    numpy: tuple[int, int] | None = None
    for name in names:
        match = _PYTHON_DIR.match(name)
        if match:
            pythons.add((int(match.group(1)), int(match.group(2))))
        match = _NUMPY_DIST.match(name) or _CONDA_META_NUMPY.match(name)
        if match:
            numpy = (int(match.group(1)), int(match.group(2)))
        elif numpy is None and _NUMPY_PACKAGE.match(name):
            numpy = (0, 0)
    python = max(pythons) if pythons else None
    return python, numpy


def _member_name(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.rstrip("/")


def inspect(path: Path) -> EnvironmentInfo:
    """Read an environment (archive or folder) without running it. Raises EnvironmentError_ when
    it is missing or unreadable."""
    if not path.exists():
        raise EnvironmentError_(f"{PARAMETER} names {path}, which does not exist")
    if path.is_dir():
        names = []
        lib = path / "lib"
        if lib.is_dir():
            for child in lib.iterdir():
                if _PYTHON_DIR.match(f"lib/{child.name}/"):
                    names.append(f"lib/{child.name}/")
                    site = child / "site-packages"
                    if site.is_dir():
                        names += [f"lib/{child.name}/site-packages/{e.name}/" for e in site.iterdir()]
                        if (site / "numpy" / "__init__.py").is_file():
                            names.append(f"lib/{child.name}/site-packages/numpy/__init__.py")
        meta = path / "conda-meta"
        if meta.is_dir():
            names += [f"conda-meta/{e.name}" for e in meta.iterdir()]
        python, numpy = _scan(names)
        interpreter = next((f"bin/{n}" for n in ("python", "python3") if (path / "bin" / n).exists()), None)
        head = b""
        if interpreter:
            try:
                with open(path / interpreter, "rb") as handle:
                    head = handle.read(4)
            except OSError:
                head = b""
        return EnvironmentInfo(path, False, python, numpy, interpreter, (path / "bin" / "conda-unpack").is_file(), _format(head))
    try:
        with tarfile.open(path, "r:*") as archive:
            members = {_member_name(m.name): m for m in archive}
            python, numpy = _scan(list(members))
            interpreter = next((f"bin/{n}" for n in ("python", "python3") if f"bin/{n}" in members), None)
            head = b""
            if interpreter:
                member = members[interpreter]
                for _ in range(8):  # bin/python -> python3.X: follow links inside the archive
                    target = os.path.normpath(f"{PurePosixPath(_member_name(member.name)).parent}/{member.linkname}")
                    if not member.issym() or target not in members:
                        break
                    member = members[target]
                if member.isfile():
                    extracted = archive.extractfile(member)
                    head = extracted.read(4) if extracted else b""
            conda_unpack = "bin/conda-unpack" in members
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise EnvironmentError_(
            f"{PARAMETER} names {path}, which is not a readable conda-pack archive (.tar.gz or .tar): {exc}"
        ) from None
    return EnvironmentInfo(path, True, python, numpy, interpreter, conda_unpack, _format(head))


def check(info: EnvironmentInfo) -> None:
    """Refuse an environment this runtime's model process cannot run in."""
    where = f"{PARAMETER} {info.path}"
    works = (
        f"an environment made by conda-pack (or an unpacked one) on Linux with Python "
        f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer and numpy {MIN_NUMPY[0]}.{MIN_NUMPY[1]} or newer works"
    )
    if info.executable_format in ("mach-o", "pe"):
        system = "macOS" if info.executable_format == "mach-o" else "Windows"
        raise EnvironmentError_(f"{where}: its bin/python was built for {system}, not Linux; {works}")
    if info.python is None:
        raise EnvironmentError_(f"{where}: no Python found (no lib/pythonX.Y/ folder); {works}")
    if info.interpreter is None:
        raise EnvironmentError_(f"{where}: no bin/python interpreter; {works}")
    if info.python < MIN_PYTHON:
        raise EnvironmentError_(
            f"{where}: its Python is {info.python[0]}.{info.python[1]}, older than "
            f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]}, the oldest the model process (the toolkit's stub) runs on; "
            f"recreate the environment with python>={MIN_PYTHON[0]}.{MIN_PYTHON[1]}; {works}"
        )
    if info.numpy is None:
        raise EnvironmentError_(
            f"{where}: numpy is not installed in it (lib/python{info.python[0]}.{info.python[1]}/site-packages/numpy), "
            f"and the model process needs it; install numpy>={MIN_NUMPY[0]}.{MIN_NUMPY[1]} into the environment "
            "before packing it"
        )
    if info.numpy != (0, 0) and info.numpy < MIN_NUMPY:
        raise EnvironmentError_(
            f"{where}: its numpy is {info.numpy[0]}.{info.numpy[1]}, older than {MIN_NUMPY[0]}.{MIN_NUMPY[1]}; "
            f"install numpy>={MIN_NUMPY[0]}.{MIN_NUMPY[1]} into the environment before packing it"
        )


# --- unpacking -------------------------------------------------------------------------------------


def unpack(archive: Path, destination: Path) -> Path:
    """Extract a conda-pack archive into `destination` (created) and run its conda-unpack, which
    rewrites the prefixes recorded at pack time to the new location. Entries that would land
    outside `destination` (absolute paths, `..`, links leading out) are refused, as Triton's
    libarchive options refuse them."""
    destination.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "r:*") as tar:
        if hasattr(tarfile, "tar_filter"):
            tar.extractall(destination, filter="tar")
        else:  # pragma: no cover - Python < 3.11.4
            root = destination.resolve()
            for member in tar.getmembers():
                target = (destination / member.name).resolve()
                if not target.is_relative_to(root) or member.name.startswith("/"):
                    raise EnvironmentError_(f"{archive}: entry {member.name} would be written outside {destination}")
            tar.extractall(destination)
    conda_unpack = destination / "bin" / "conda-unpack"
    if conda_unpack.is_file():
        interpreter = interpreter_of(destination)
        subprocess.run(
            [str(interpreter), str(conda_unpack)],
            env=activation_environment(destination, os.environ),
            check=True,
            stdin=subprocess.DEVNULL,
        )
    return destination


def interpreter_of(root: Path) -> Path:
    for name in ("python", "python3"):
        candidate = root / "bin" / name
        if candidate.exists():
            return candidate
    raise EnvironmentError_(f"{PARAMETER} {root}: no bin/python interpreter")


class _Unpacked:
    """Archives unpacked by this process (toolkit serve), each once while it is unchanged, as
    Triton's EnvironmentManager does; removed at exit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._base: Path | None = None
        self._unpacked: dict[str, tuple[float, Path]] = {}

    def get(self, archive: Path) -> Path:
        canonical = str(archive.resolve())
        mtime = os.stat(canonical).st_mtime
        with self._lock:
            known = self._unpacked.get(canonical)
            if known is not None and known[0] == mtime:
                return known[1]
            if self._base is None:
                self._base = Path(tempfile.mkdtemp(prefix="toolkit_python_env_"))
                import atexit

                atexit.register(shutil.rmtree, self._base, True)
            destination = known[1] if known is not None else self._base / str(len(self._unpacked))
            if destination.exists():
                shutil.rmtree(destination)
            unpack(Path(canonical), destination)
            self._unpacked[canonical] = (mtime, destination)
            return destination


_unpacked = _Unpacked()


def environment_root(spec: Any) -> Path | None:
    """The unpacked environment a model's processes run in, or None for the serving Python.
    An image names the folder its build unpacked (`spec.execution_env`); otherwise the
    parameter is resolved and an archive is unpacked here, once."""
    prepared = getattr(spec, "execution_env", None)
    if prepared:
        return Path(prepared)
    value = configured_value(spec.config)
    if value is None:
        return None
    path = resolve(value, spec.directory)
    if path.is_dir():
        return path.resolve()
    if not path.exists():
        raise EnvironmentError_(f"{PARAMETER} names {path}, which does not exist")
    return _unpacked.get(path)


# --- the model process -----------------------------------------------------------------------------

# Runs in the environment's interpreter: import `handlers` from its folder alone (its parent may
# hold the image's own site-packages, built for another Python), then run the stub.
BOOTSTRAP = (
    "import importlib.util as u, runpy, sys\n"
    "root = sys.argv.pop(1)\n"
    "spec = u.spec_from_file_location('handlers', root + '/handlers/__init__.py', "
    "submodule_search_locations=[root + '/handlers'])\n"
    "module = u.module_from_spec(spec); sys.modules['handlers'] = module; spec.loader.exec_module(module)\n"
    "runpy.run_module('handlers.backends.python.stub', run_name='__main__', alter_sys=True)\n"
)


def activation_environment(root: Path, base: Mapping[str, str]) -> dict[str, str]:
    """The variables of the model process: the serving process's, with the environment's
    activation (Triton's ParseActivationScript: VIRTUAL_ENV, PATH and LD_LIBRARY_PATH led by
    <env>/bin and <env>/lib, no PYTHONHOME) and no PYTHONPATH (the serving environment's
    packages were built for its own Python)."""
    env = dict(base)
    env.pop("PYTHONHOME", None)
    env.pop("PYTHONPATH", None)
    env["VIRTUAL_ENV"] = str(root)
    env["VIRTUAL_ENV_PROMPT"] = f"({root})"
    env["PATH"] = os.pathsep.join(p for p in (str(root / "bin"), base.get("PATH", "")) if p)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(root / "lib"), base.get("LD_LIBRARY_PATH", "")) if p)
    return env


def launch_command(root: Path, handlers_root: str, arguments: list[str]) -> list[str]:
    return [str(interpreter_of(root)), "-c", BOOTSTRAP, handlers_root, *arguments]


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "unpack":
        unpack(Path(argv[1]), Path(argv[2]))
        return 0
    print("usage: python -m handlers.backends.python.execution_env unpack ARCHIVE FOLDER", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
