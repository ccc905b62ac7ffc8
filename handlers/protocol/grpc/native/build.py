"""Build the grpc++ front end (`handlers/protocol/grpc/_grpcnative*.so`) from grpcnative.cpp.

    python handlers/protocol/grpc/native/build.py [--output DIR]

Needs g++, pkg-config and grpc++'s headers and libraries (Debian: `libgrpc++-dev`), and the
running Python's headers. Without the module, `toolkit serve` serves gRPC with grpcio's asyncio
server (handlers/protocol/grpc/frontend.py). Exits 1 with the reason when it cannot build.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "grpcnative.cpp"
MODULE = "_grpcnative"


def output_name() -> str:
    return MODULE + sysconfig.get_config_var("EXT_SUFFIX")


def command(output: Path) -> list[str]:
    """The compiler command line (raises RuntimeError naming what is missing)."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise RuntimeError("no C++ compiler (g++) on PATH")
    if shutil.which("pkg-config") is None:
        raise RuntimeError("no pkg-config on PATH")
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "grpc++"], capture_output=True, text=True, check=False)
    if flags.returncode != 0:
        raise RuntimeError(f"grpc++ not found by pkg-config (Debian: apt-get install libgrpc++-dev): "
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=HERE.parent, help="where the module goes")
    args = parser.parse_args()
    try:
        print(build(args.output))
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"grpcnative: cannot build: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
