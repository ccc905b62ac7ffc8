"""Relocatable Python environments laid out like conda-pack's, for EXECUTION_ENV_PATH tests.

conda's channels are unreachable where these tests run (only PyPI, Debian and npm are), so no
real conda-pack archive can be made. This stands in for one honestly: the running interpreter's
own installation (sys.base_prefix: its bin/python, libpython, standard library and extension
modules, plus the shared libraries those modules need, copied into lib/ as conda bundles them),
numpy copied from the test environment, and packages made by the test, under the layout
conda-pack produces (bin/python -> pythonX.Y, lib/pythonX.Y/site-packages, bin/activate), then
packed with tar. Nothing refers back to the host's paths: the interpreter finds its standard
library next to itself and its libpython through LD_LIBRARY_PATH=<env>/lib, which the
activation sets (the copied binary's RUNPATH still names the host's prefix, as an unpacked
conda environment's recorded prefix would before conda-unpack).

`make_environment(..., python=...)` makes the same from another installed interpreter (a Python
3.10 one, say: the Python of Triton's 24.x containers); `find_python` looks for one on PATH and
among pyenv's versions.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

# Shared libraries an extension module may need that the environment carries (conda ships them
# too); modules needing others (tk, curses, readline, ssl, sqlite...) are left out: the model
# process never imports them.
_CARRIED_LIBRARIES = ("libffi.so", "libz.so", "libbz2.so", "liblzma.so", "libexpat.so", "libuuid.so", "libmd.so", "libbsd.so")
_SYSTEM_LIBRARIES = ("libc.so", "libm.so", "libpthread.so", "libdl.so", "librt.so", "libpython", "ld-linux", "linux-vdso")
_STDLIB_SKIP = {"site-packages", "dist-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "__pycache__"}


def _needed(path: Path) -> list[Path] | None:
    """The non-system libraries `path` links to, or None when one is not carried."""
    output = subprocess.run(["ldd", str(path)], capture_output=True, text=True).stdout
    needed = []
    for line in output.splitlines():
        parts = line.split("=>")
        if len(parts) != 2:
            continue
        name = parts[0].strip()
        if name.startswith(_SYSTEM_LIBRARIES):
            continue
        if not name.startswith(_CARRIED_LIBRARIES):
            return None
        needed.append(Path(parts[1].split("(")[0].strip()))
    return needed


def _copy_stdlib(source: Path, destination: Path, dynload: Path) -> set[Path]:
    libraries: set[Path] = set()
    for entry in source.iterdir():
        if entry.name in _STDLIB_SKIP or entry.name.startswith("config-"):
            continue
        if entry.is_dir() and entry.resolve() == dynload.resolve():
            continue
        if entry.is_dir():
            shutil.copytree(entry, destination / entry.name, ignore=shutil.ignore_patterns("__pycache__", "test", "tests"))
        else:
            shutil.copy2(entry, destination / entry.name)
    target = destination / "lib-dynload"
    target.mkdir(exist_ok=True)
    for module in dynload.glob("*.so"):
        if module.name.startswith(("_test", "_ctypes_test", "xxlimited", "_xxtestfuzz")):
            continue
        needed = _needed(module)
        if needed is None:
            continue
        shutil.copy2(module, target / module.name)
        libraries.update(needed)
    return libraries


# What an interpreter reports of its installation (run by that interpreter: no imports beyond
# its standard library).
_LAYOUT = """
import json, os, sys, sysconfig
print(json.dumps({
    "version": "%d.%d" % sys.version_info[:2], "base_prefix": sys.base_prefix,
    "executable": os.path.realpath(sys.executable), "shared": bool(sysconfig.get_config_var("Py_ENABLE_SHARED")),
    "libpython": os.path.join(sysconfig.get_config_var("LIBDIR") or "", sysconfig.get_config_var("INSTSONAME") or ""),
    "stdlib": sysconfig.get_paths()["stdlib"], "dynload": sysconfig.get_config_var("DESTSHARED"),
}))
"""


def _layout(python: Path | None) -> dict:
    """The installation of `python` (default: the interpreter running this)."""
    return json.loads(subprocess.run([str(python or sys.executable), "-I", "-c", _LAYOUT], capture_output=True,
                                     text=True, check=True, timeout=60).stdout)


def find_python(version: str) -> Path | None:
    """An installed CPython `version` ("3.10") that runs: `pythonX.Y` on PATH, else the newest of
    pyenv's versions of it; None when there is none."""
    candidates = []
    on_path = shutil.which(f"python{version}")
    if on_path:
        candidates.append(Path(on_path))
    pyenv = shutil.which("pyenv")
    if pyenv:
        root = subprocess.run([pyenv, "root"], capture_output=True, text=True).stdout.strip()
        if root:
            installed = (Path(root) / "versions").glob(f"{version}.*")
            newest = sorted(installed, key=lambda p: [int(n) if n.isdigit() else 0 for n in p.name.split(".")])
            candidates += [path / "bin" / f"python{version}" for path in reversed(newest)]
    for candidate in candidates:
        try:
            if _layout(candidate)["version"] == version:
                return candidate
        except (OSError, subprocess.SubprocessError, ValueError):
            continue  # a pyenv shim for a version that is not selected, or a broken install
    return None


def make_environment(root: Path, packages: dict[str, str] | None = None, with_numpy: bool = True,
                     numpy_site: Path | None = None, python: Path | None = None) -> Path:
    """An unpacked environment at `root`: the interpreter `python` (default: this one), numpy
    (unless `with_numpy` is False; the one installed here, or the one in the site-packages folder
    `numpy_site`, which another interpreter needs) and `packages` ({"relative/path.py": source}
    under site-packages)."""
    layout = _layout(python)
    version = f"python{layout['version']}"
    (root / "bin").mkdir(parents=True)
    lib = root / "lib"
    lib.mkdir()
    executable = Path(layout["base_prefix"]) / "bin" / version
    if not executable.exists():
        executable = Path(layout["executable"])
    shutil.copy2(executable, root / "bin" / version)
    os.symlink(version, root / "bin" / "python3")
    os.symlink(version, root / "bin" / "python")
    if layout["shared"]:
        libpython = Path(layout["libpython"])
        shutil.copy2(libpython, lib / libpython.name)
    stdlib = lib / version
    stdlib.mkdir()
    libraries = _copy_stdlib(Path(layout["stdlib"]), stdlib, Path(layout["dynload"]))
    for library in libraries:
        shutil.copy2(library, lib / library.name)
    site = stdlib / "site-packages"
    site.mkdir()
    if with_numpy:
        if numpy_site is None:
            if python is not None:
                raise ValueError("another interpreter's environment needs numpy_site (numpy built for it)")
            import numpy
        installed = numpy_site / "numpy" if numpy_site else Path(numpy.__file__).parent
        shutil.copytree(installed, site / "numpy", ignore=shutil.ignore_patterns("__pycache__", "tests"))
        for extra in installed.parent.glob("numpy.libs"):
            shutil.copytree(extra, site / extra.name)
        for dist in installed.parent.glob("numpy-*.dist-info"):
            shutil.copytree(dist, site / dist.name)
    for relative, source in (packages or {}).items():
        path = site / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    (root / "bin" / "activate").write_text(
        '# conda-pack-style activation\n_here="$(cd "$(dirname "${BASH_SOURCE:-$0}")/.." && pwd)"\n'
        'export PATH="$_here/bin:$PATH"\nexport CONDA_PREFIX="$_here"\n'
    )
    return root


def pack(root: Path, archive: Path) -> Path:
    """tar.gz of the environment's contents (conda-pack puts them at the archive's top level)."""
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        for entry in sorted(root.iterdir()):
            tar.add(entry, arcname=entry.name)
    return archive


def fake_environment(root: Path, python: str = "3.7", numpy_version: str | None = "1.21.6") -> Path:
    """A conda-pack layout with a Linux (ELF) bin/python for another Python version (the
    interpreter is never run: validation reads the layout)."""
    (root / "bin").mkdir(parents=True)
    (root / "bin" / f"python{python}").write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 57)
    os.symlink(f"python{python}", root / "bin" / "python")
    site = root / "lib" / f"python{python}" / "site-packages"
    site.mkdir(parents=True)
    (root / "lib" / f"python{python}" / "os.py").write_text("")
    if numpy_version:
        (site / "numpy").mkdir()
        (site / "numpy" / "__init__.py").write_text("")
        (site / f"numpy-{numpy_version}.dist-info").mkdir()
        (site / f"numpy-{numpy_version}.dist-info" / "METADATA").write_text(f"Version: {numpy_version}\n")
    return root
