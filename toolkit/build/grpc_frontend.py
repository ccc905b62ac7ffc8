"""The gRPC front end of a `--protocol grpc` image: grpc++ (`native`) or grpcio's asyncio server.

The native front end (handlers/protocol/grpc/native, docs/grpc.md) enters an image as a
self-contained wheel, `toolkit-grpcnative`: the `_grpcnative` module with grpc++ and the
libraries it links, repaired by auditwheel (handlers/protocol/native/build.py grpc --wheel). No
package index carries it, so `toolkit build` finds or makes it, in this order:

1. `TOOLKIT_GRPC_NATIVE_WHEELS=DIR`: the user's wheel for the image's Python, arch and glibc
   (none in DIR: an error, as the user asked for it);
2. the wheel cache (`<wheel cache>/grpcnative/<key>/`), keyed by the front end's sources
   (every file build.py reads: grpcnative.cpp, frontend.h, build.py), the Python tag and the arch: a second build reuses it, a changed
   source builds again;
3. built now by build.py --wheel with the Python running toolkit, when its major.minor and arch
   are the image's (a wheel is specific to both), then cached.

The wheel's manylinux tag must fit the base image's glibc (Debian bookworm's grpc++ gives
manylinux_2_35: glibc 2.35 or newer). `--grpc-frontend auto` (default) serves with grpcio's
server when the native front end cannot be had, and says why and how to get it (the build report
and one line of the build's output); `native` fails the build with that reason instead; `grpcio`
leaves the wheel out. The runtime picks native when its module imports
(handlers/protocol/grpc/server.py), so nothing else in the image changes. HTTP and Lambda images
never carry it.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import handlers

from .base_image import BaseImage
from .errors import BuildError
from .footprint import installed_size
from .runtime_deps import GRPC_NATIVE, GRPC_NATIVE_WHEELS_ENV, RuntimeRequirement, grpc_native_requirement

CHOICES = ("auto", "native", "grpcio")
CACHE_FOLDER = "grpcnative"
PROTOCOL_DIR = Path(handlers.__file__).resolve().parent / "protocol"
BUILD_SCRIPT = PROTOCOL_DIR / "native" / "build.py"
# every file `build.py grpc` reads (what `build.py grpc --sources` lists)
SOURCES = (PROTOCOL_DIR / "grpc" / "native" / "grpcnative.cpp", PROTOCOL_DIR / "native" / "frontend.h", BUILD_SCRIPT)
BUILD_TIMEOUT_S = 1800
BUILD_DEPENDENCIES = "g++, pkg-config and libgrpc++-dev (Debian/Ubuntu: apt-get install g++ pkg-config libgrpc++-dev)"
WHEEL_GLOB = "toolkit_grpcnative-*.whl"

# Legacy manylinux aliases (PEP 600): the glibc each one means.
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_")

Progress = Callable[[str], None]


class Unavailable(Exception):
    """Why the native front end cannot go into this image (with the way to get it)."""


@dataclass(frozen=True)
class GrpcFrontend:
    """The front end an image serves gRPC with, and where its wheel came from."""

    frontend: str  # "native" or "grpcio"
    source: str  # native: "built", "cache" or GRPC_NATIVE_WHEELS_ENV; grpcio: "--grpc-frontend grpcio" or "fallback"
    wheel: Path | None = None
    reason: str = ""  # grpcio: why not native, and how to get it
    wheel_build_seconds: float | None = None

    @property
    def requirement(self) -> RuntimeRequirement | None:
        """The wheel as the image's requirement (installed offline like every other wheel)."""
        return None if self.wheel is None else RuntimeRequirement(str(self.wheel), GRPC_NATIVE.imports)

    def as_dict(self) -> dict[str, Any]:
        """build-report.json's `grpc_frontend`. `installed_bytes` is what the image grows by: the
        wheel's files once installed (the wheel itself stays in the build's install stage)."""
        entry: dict[str, Any] = {"frontend": self.frontend, "source": self.source}
        if self.wheel is not None:
            entry.update(
                wheel=self.wheel.name, wheel_bytes=self.wheel.stat().st_size, installed_bytes=installed_size(self.wheel),
                wheel_build_seconds=self.wheel_build_seconds,
            )
        if self.reason:
            entry["reason"] = self.reason
        return entry

    def line(self) -> str:
        """One line for the build's output."""
        if self.frontend == "native":
            how = {"built": f"built in {self.wheel_build_seconds or 0:.0f} s and cached",
                   "cache": "reused from the wheel cache"}.get(self.source, f"from {GRPC_NATIVE_WHEELS_ENV}")
            return f"gRPC front end: native (grpc++ wheel {how})"
        if self.source == "fallback":
            return f"gRPC front end: grpcio's server, not the native one (about half its throughput, docs/grpc.md): {self.reason}"
        return f"gRPC front end: grpcio's server ({self.reason})"


def host_python() -> str:
    return "%d.%d" % sys.version_info[:2]


def host_arch() -> str:
    machine = platform.machine()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine)


def cache_key(python_tag: str, arch: str, sources: tuple[Path, ...] = SOURCES) -> str:
    """What decides the wheel: the front end's source and build script (by content), the
    Python tag and the arch. The host's grpc++ is not part of it: the wheel carries its own."""
    digests = {}
    for path in sources:
        with open(path, "rb") as handle:
            digests[path.name] = hashlib.file_digest(handle, "sha256").hexdigest()
    document = {"sources": digests, "python": python_tag, "arch": arch}
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


def wheel_glibc(filename: str) -> tuple[int, int] | None:
    """The oldest glibc a wheel's platform tags let it install on (manylinux_2_35_x86_64:
    (2, 35); manylinux2014: (2, 17)); None for a wheel with no manylinux tag (linux_x86_64 runs
    only where it was built)."""
    stem = filename.removesuffix(".whl")
    parts = stem.split("-")
    if len(parts) < 5:
        return None
    found = []
    for tag in parts[-1].split("."):
        match = _MANYLINUX.match(tag)
        if match:
            found.append((int(match[1]), int(match[2])))
        else:
            legacy = tag.split("_", 1)[0]
            if legacy in _LEGACY_MANYLINUX:
                found.append(_LEGACY_MANYLINUX[legacy])
    return min(found) if found else None


def check_glibc(wheel: Path, base: BaseImage) -> None:
    """Unavailable when the base image's glibc is older than the wheel's manylinux tag needs."""
    needed = wheel_glibc(wheel.name)
    have = f"{base.glibc[0]}.{base.glibc[1]}"
    if needed is None:
        raise Unavailable(
            f"its wheel {wheel.name} has no manylinux tag (it runs only where it was built), so base image "
            f"{base.reference} (glibc {have}) cannot install it: build it with build.py --wheel, which repairs it with auditwheel"
        )
    if base.glibc < needed:
        raise Unavailable(
            f"its wheel {wheel.name} needs glibc {needed[0]}.{needed[1]} or newer and base image {base.reference} has "
            f"glibc {have}: choose a newer base image (e.g. python:{base.python}-slim-bookworm, glibc 2.36)"
        )


def _user_wheel(base: BaseImage) -> GrpcFrontend | None:
    """TOOLKIT_GRPC_NATIVE_WHEELS's wheel for the image (None: unset). Its absence or a glibc
    the base cannot meet is an error: the user asked for that wheel."""
    try:
        requirement = grpc_native_requirement(base.python, base.arch)
    except ValueError as exc:
        raise BuildError(str(exc)) from None
    if requirement is None:
        return None
    wheel = Path(requirement.spec)
    try:
        check_glibc(wheel, base)
    except Unavailable as exc:
        raise BuildError(f"{GRPC_NATIVE_WHEELS_ENV}: the native gRPC front end cannot go into this image: {exc}") from None
    return GrpcFrontend("native", GRPC_NATIVE_WHEELS_ENV, wheel=wheel)


def _cached(folder: Path) -> Path | None:
    found = sorted(folder.glob(WHEEL_GLOB)) if folder.is_dir() else []
    return found[-1] if found else None


def _build_failure(process: subprocess.CompletedProcess) -> str:
    """build.py's own reason (`grpcnative: cannot build: ...`) with the line of the failing
    tool's output before it (a compiler's or pip's error), else the end of its output."""
    lines = [ln.strip() for ln in process.stderr.splitlines() if ln.strip()]
    marks = [i for i, ln in enumerate(lines) if ln.startswith("grpcnative: cannot build:")]
    if not marks:
        return lines[-1] if lines else f"exit status {process.returncode}"
    reason = lines[marks[-1]].split("cannot build:", 1)[1].strip()
    if "failed (exit status" in reason and marks[-1] > 0:
        reason += f": {lines[marks[-1] - 1][:300]}"
    return reason


def _build(folder: Path, progress: Progress | None) -> tuple[Path, float]:
    """Build the wheel with this Python into `folder` (replaced atomically). Unavailable when it
    cannot be built here."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".build-", dir=folder.parent))
    started = time.monotonic()
    try:
        try:
            process = subprocess.run(
                [sys.executable, str(BUILD_SCRIPT), "grpc", "--wheel", str(scratch)], capture_output=True, text=True,
                check=False, timeout=BUILD_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise Unavailable(f"building its wheel took over {BUILD_TIMEOUT_S} s") from None
        if process.returncode != 0:
            raise Unavailable(
                f"its wheel cannot be built on this machine: {_build_failure(process)}; building it needs "
                f"{BUILD_DEPENDENCIES}, the Python headers and PyPI (setuptools, auditwheel), or set "
                f"{GRPC_NATIVE_WHEELS_ENV}=DIR to a folder of wheels made by build.py --wheel"
            )
        built = _cached(scratch)
        if built is None:
            raise Unavailable(f"build.py --wheel made no {WHEEL_GLOB} ({_build_failure(process)})")
        seconds = time.monotonic() - started
        if folder.exists():  # a refresh, or another build's: move it aside, ours wins
            shutil.rmtree(folder.rename(folder.parent / f".stale-{folder.name}-{os.getpid()}-{time.monotonic_ns()}"),
                          ignore_errors=True)
        try:
            scratch.rename(folder)
        except OSError:  # another build filled it meanwhile: take theirs
            if _cached(folder) is None:
                raise
        wheel = _cached(folder)
        assert wheel is not None
        return wheel, seconds
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)


def _native(base: BaseImage, cache_dir: Path, refresh: bool, progress: Progress | None) -> GrpcFrontend:
    """The cached or freshly built wheel for `base` (Unavailable: why not)."""
    python, arch = host_python(), host_arch()
    if base.arch != arch:
        raise Unavailable(
            f"the image is {base.arch} and this machine {arch} (the wheel is compiled here): build on a {base.arch} "
            f"machine, or set {GRPC_NATIVE_WHEELS_ENV}=DIR to a folder with a {base.arch} wheel made by "
            f"handlers/protocol/native/build.py grpc --wheel DIR"
        )
    if base.python != python:
        raise Unavailable(
            f"the image's Python is {base.python} and the one running toolkit {python} (the wheel is built with it): "
            f"run toolkit build with Python {base.python}, or make the wheel with it (python{base.python} "
            f"handlers/protocol/native/build.py grpc --wheel DIR) and set {GRPC_NATIVE_WHEELS_ENV}=DIR"
        )
    folder = cache_dir / CACHE_FOLDER / cache_key(base.python_tag, arch)[:32]
    wheel = None if refresh else _cached(folder)
    if wheel is not None:
        check_glibc(wheel, base)
        return GrpcFrontend("native", "cache", wheel=wheel)
    if progress:
        progress(f"building the native gRPC front end's wheel (Python {python}, {arch}; cached for later builds)")
    wheel, seconds = _build(folder, progress)
    check_glibc(wheel, base)
    return GrpcFrontend("native", "built", wheel=wheel, wheel_build_seconds=round(seconds, 1))


def choose_frontend(
    choice: str, base: BaseImage, *, cache_dir: Path, refresh: bool = False, progress: Progress | None = None
) -> GrpcFrontend:
    """The front end of a gRPC image for `--grpc-frontend auto|native|grpcio` (see the module
    doc). BuildError for `native` when it cannot be had, and for a TOOLKIT_GRPC_NATIVE_WHEELS
    folder without a wheel that fits."""
    if choice not in CHOICES:
        raise BuildError(f"unknown gRPC front end '{choice}': choose {', '.join(CHOICES)}")
    if choice == "grpcio":
        return GrpcFrontend("grpcio", "--grpc-frontend grpcio", reason="--grpc-frontend grpcio")
    user = _user_wheel(base)
    if user is not None:
        return user
    try:
        return _native(base, Path(cache_dir), refresh, progress)
    except Unavailable as exc:
        if choice == "native":
            raise BuildError(f"--grpc-frontend native: the native gRPC front end cannot go into this image: {exc}") from None
        return GrpcFrontend("grpcio", "fallback", reason=f"the native front end cannot be had: {exc}")
