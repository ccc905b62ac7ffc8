"""The native front ends of Cloud Run / Knative images: grpc++ for `--protocol grpc`, libevent's
evhttp for `--protocol http`; each otherwise served by its Python server (grpcio's, uvicorn).

A native front end (handlers/protocol/grpc/native, handlers/protocol/httpnative/native; docs/grpc.md,
docs/runtime.md) enters an image as a self-contained wheel, `toolkit-grpcnative` or
`toolkit-httpnative`: its module with the libraries it links, repaired by auditwheel
(handlers/protocol/native/build.py grpc|http --wheel). No package index carries them, so `toolkit
build` finds or makes the one its image needs, in this order:

1. `TOOLKIT_GRPC_NATIVE_WHEELS=DIR` / `TOOLKIT_HTTP_NATIVE_WHEELS=DIR`: the user's wheel for the
   image's Python, arch and glibc (none in DIR: an error, as the user asked for it);
2. the wheel cache (`<wheel cache>/grpcnative/<key>/`, `.../httpnative/<key>/`), keyed by the
   front end's sources (every file build.py reads, as its `Frontend.sources` lists them: the C++
   file, frontend.h, build.py), the stable ABI and the arch: a second build reuses it, a changed
   source builds again;
3. built now by build.py --wheel with the Python running toolkit, then cached. The modules use
   CPython's stable ABI (build.py: the limited API of 3.11), so the wheel is `cp311-abi3`: any
   Python from 3.11 on builds it, for an image with any Python from 3.11 on; the arch must be
   the image's (it is compiled here).

The wheel's manylinux tag must fit the base image's glibc (built on Debian bookworm: glibc 2.35 or
2.36 or newer). `--grpc-frontend` / `--http-frontend auto` (default) serves with the Python server
when the native front end cannot be had, and says why and how to get it (the build report and one
line of the build's output); `native` fails the build with that reason instead; `grpcio` /
`uvicorn` leaves the wheel out. A gRPC image's runtime picks native when its module imports
(handlers/protocol/grpc/server.py); an HTTP image with the wheel sets TOOLKIT_HTTP_FRONTEND=native
(toolkit/build/context.py). Lambda images carry neither (Mangum, no server).
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

from handlers.protocol.native import build as native_build

from .base_image import BaseImage
from .errors import BuildError
from .footprint import installed_size
from .runtime_deps import (
    GRPC_NATIVE,
    GRPC_NATIVE_WHEELS_ENV,
    HTTP_NATIVE,
    HTTP_NATIVE_WHEELS_ENV,
    RuntimeRequirement,
    native_requirement,
)

BUILD_SCRIPT = Path(native_build.__file__).resolve()
BUILD_TIMEOUT_S = 1800
# Where the fallback's cost is measured. The warning names no number: measurements change, the
# warning would not.
PERFORMANCE_DOC = "docs/performance.md"


@dataclass(frozen=True)
class Kind:
    """What differs between the native front ends' wheels."""

    name: str  # build.py's argument: grpc, http
    label: str  # gRPC, HTTP
    library: str  # what serves natively: grpc++, libevent
    fallback: str  # the other choice: grpcio, uvicorn
    fallback_text: str  # grpcio's server, uvicorn
    requirement: RuntimeRequirement  # the wheel's distribution and its import
    wheels_env: str  # the user's folder of wheels

    @property
    def build(self) -> native_build.Frontend:
        """build.py's description of this front end's build (one implementation of what it reads)."""
        return native_build.FRONTENDS[self.name]

    @property
    def sources(self) -> tuple[Path, ...]:
        """Every file `build.py NAME` reads (what `build.py NAME --sources` lists): the cache key's input."""
        return self.build.sources

    @property
    def debian(self) -> str:
        """The library's Debian package."""
        return self.build.debian

    @property
    def choices(self) -> tuple[str, ...]:
        return ("auto", "native", self.fallback)

    @property
    def option(self) -> str:
        return f"--{self.name}-frontend"

    @property
    def cache_folder(self) -> str:
        return self.requirement.name.removeprefix("toolkit-")

    @property
    def wheel_glob(self) -> str:
        return self.requirement.name.replace("-", "_") + "-*.whl"

    @property
    def dependencies(self) -> str:
        return f"g++, pkg-config and {self.debian} (Debian/Ubuntu: apt-get install g++ pkg-config {self.debian})"


GRPC = Kind("grpc", "gRPC", "grpc++", "grpcio", "grpcio's server", GRPC_NATIVE, GRPC_NATIVE_WHEELS_ENV)
HTTP = Kind("http", "HTTP", "libevent", "uvicorn", "uvicorn", HTTP_NATIVE, HTTP_NATIVE_WHEELS_ENV)
KINDS = {kind.name: kind for kind in (GRPC, HTTP)}

# Legacy manylinux aliases (PEP 600): the glibc each one means.
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_")

Progress = Callable[[str], None]


class Unavailable(Exception):
    """Why the native front end cannot go into this image (with the way to get it)."""


@dataclass(frozen=True)
class NativeFrontend:
    """The front end an image serves gRPC or HTTP with, and where its wheel came from."""

    kind: Kind
    frontend: str  # "native", or the kind's fallback ("grpcio", "uvicorn")
    source: str  # native: "built", "cache" or the wheels variable; fallback: "--grpc-frontend grpcio" or "fallback"
    wheel: Path | None = None
    reason: str = ""  # fallback: why not native, and how to get it
    wheel_build_seconds: float | None = None

    @property
    def requirement(self) -> RuntimeRequirement | None:
        """The wheel as the image's requirement (installed offline like every other wheel)."""
        return None if self.wheel is None else RuntimeRequirement(str(self.wheel), self.kind.requirement.imports)

    def as_dict(self) -> dict[str, Any]:
        """build-report.json's `grpc_frontend` / `http_frontend`. `installed_bytes` is what the image
        grows by: the wheel's files once installed (the wheel itself stays in the build's install
        stage)."""
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
        kind = self.kind
        if self.frontend == "native":
            how = {"built": f"built in {self.wheel_build_seconds or 0:.0f} s and cached",
                   "cache": "reused from the wheel cache"}.get(self.source, f"from {kind.wheels_env}")
            return f"{kind.label} front end: native ({kind.library} wheel {how})"
        if self.source == "fallback":
            return (f"{kind.label} front end: {kind.fallback_text}, not the native one "
                    f"(slower: {PERFORMANCE_DOC}): {self.reason}")
        return f"{kind.label} front end: {kind.fallback_text} ({self.reason})"


def host_python() -> str:
    return "%d.%d" % sys.version_info[:2]


# The stable ABI the wheels are built for (cp311-abi3: every CPython from 3.11 on).
ABI3_PYTHON = native_build.LIMITED_API
ABI3_KEY = f"{native_build.ABI3_TAG}-abi3"


def _version(python: str) -> tuple[int, ...]:
    return tuple(int(part) for part in python.split("."))


def host_arch() -> str:
    machine = platform.machine()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine)


def cache_key(python_tag: str, arch: str, sources: tuple[Path, ...]) -> str:
    """What decides the wheel: the files its build reads (by content), its Python tag (the stable
    ABI, `cp311-abi3`) and the arch. The host's grpc++ or libevent is not part of it: the wheel
    carries its own."""
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


def _user_wheel(kind: Kind, base: BaseImage) -> NativeFrontend | None:
    """The wheel for the image from the kind's wheels variable (None: unset). Its absence or a
    glibc the base cannot meet is an error: the user asked for that wheel."""
    try:
        requirement = native_requirement(kind.requirement, kind.wheels_env, base.python, base.arch)
    except ValueError as exc:
        raise BuildError(str(exc)) from None
    if requirement is None:
        return None
    wheel = Path(requirement.spec)
    try:
        check_glibc(wheel, base)
    except Unavailable as exc:
        raise BuildError(
            f"{kind.wheels_env}: the native {kind.label} front end cannot go into this image: {exc}"
        ) from None
    return NativeFrontend(kind, "native", kind.wheels_env, wheel=wheel)


def _cached(kind: Kind, folder: Path) -> Path | None:
    found = sorted(folder.glob(kind.wheel_glob)) if folder.is_dir() else []
    return found[-1] if found else None


def _build_failure(kind: Kind, process: subprocess.CompletedProcess) -> str:
    """build.py's own reason (`grpcnative: cannot build: ...`) with the line of the failing
    tool's output before it (a compiler's or pip's error), else the end of its output."""
    lines = [ln.strip() for ln in process.stderr.splitlines() if ln.strip()]
    marks = [i for i, ln in enumerate(lines) if ln.startswith(f"{kind.cache_folder}: cannot build:")]
    if not marks:
        return lines[-1] if lines else f"exit status {process.returncode}"
    reason = lines[marks[-1]].split("cannot build:", 1)[1].strip()
    if "failed (exit status" in reason and marks[-1] > 0:
        reason += f": {lines[marks[-1] - 1][:300]}"
    return reason


def _build(kind: Kind, folder: Path) -> tuple[Path, float]:
    """Build the wheel with this Python into `folder` (replaced atomically). Unavailable when it
    cannot be built here."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".build-", dir=folder.parent))
    started = time.monotonic()
    try:
        try:
            process = subprocess.run(
                [sys.executable, str(BUILD_SCRIPT), kind.name, "--wheel", str(scratch)], capture_output=True, text=True,
                check=False, timeout=BUILD_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise Unavailable(f"building its wheel took over {BUILD_TIMEOUT_S} s") from None
        if process.returncode != 0:
            raise Unavailable(
                f"its wheel cannot be built on this machine: {_build_failure(kind, process)}; building it needs "
                f"{kind.dependencies}, the Python headers and PyPI (setuptools, auditwheel), or set "
                f"{kind.wheels_env}=DIR to a folder of wheels made by build.py {kind.name} --wheel"
            )
        built = _cached(kind, scratch)
        if built is None:
            raise Unavailable(f"build.py --wheel made no {kind.wheel_glob} ({_build_failure(kind, process)})")
        seconds = time.monotonic() - started
        if folder.exists():  # a refresh, or another build's: move it aside, ours wins
            shutil.rmtree(folder.rename(folder.parent / f".stale-{folder.name}-{os.getpid()}-{time.monotonic_ns()}"),
                          ignore_errors=True)
        try:
            scratch.rename(folder)
        except OSError:  # another build filled it meanwhile: take theirs
            if _cached(kind, folder) is None:
                raise
        wheel = _cached(kind, folder)
        assert wheel is not None
        return wheel, seconds
    finally:
        if scratch.exists():
            shutil.rmtree(scratch, ignore_errors=True)


def _native(kind: Kind, base: BaseImage, cache_dir: Path, refresh: bool, progress: Progress | None) -> NativeFrontend:
    """The cached or freshly built wheel for `base` (Unavailable: why not)."""
    python, arch = host_python(), host_arch()
    if base.arch != arch:
        raise Unavailable(
            f"the image is {base.arch} and this machine {arch} (the wheel is compiled here): build on a {base.arch} "
            f"machine, or set {kind.wheels_env}=DIR to a folder with a {base.arch} wheel made by "
            f"handlers/protocol/native/build.py {kind.name} --wheel DIR"
        )
    oldest = "%d.%d" % ABI3_PYTHON
    if _version(base.python) < ABI3_PYTHON:
        raise Unavailable(
            f"the image's Python is {base.python} and the native front ends need {oldest} or newer (their stable "
            f"ABI): choose a base image with Python {oldest} or newer (e.g. python:3.12-slim-bookworm)"
        )
    if _version(python) < ABI3_PYTHON:
        raise Unavailable(
            f"the wheel is built with the Python running toolkit, {python}, and needs {oldest} or newer: run toolkit "
            f"build with Python {oldest} or newer, or make the wheel with one (python3 "
            f"handlers/protocol/native/build.py {kind.name} --wheel DIR) and set {kind.wheels_env}=DIR"
        )
    folder = cache_dir / kind.cache_folder / cache_key(ABI3_KEY, arch, kind.sources)[:32]
    wheel = None if refresh else _cached(kind, folder)
    if wheel is not None:
        check_glibc(wheel, base)
        return NativeFrontend(kind, "native", "cache", wheel=wheel)
    if progress:
        progress(f"building the native {kind.label} front end's wheel (Python {python}, {arch}; cached for later builds)")
    wheel, seconds = _build(kind, folder)
    check_glibc(wheel, base)
    return NativeFrontend(kind, "native", "built", wheel=wheel, wheel_build_seconds=round(seconds, 1))


def choose_frontend(
    kind: Kind, choice: str, base: BaseImage, *, cache_dir: Path, refresh: bool = False,
    progress: Progress | None = None,
) -> NativeFrontend:
    """The front end of a gRPC or HTTP image for `--grpc-frontend auto|native|grpcio` or
    `--http-frontend auto|native|uvicorn` (see the module doc). BuildError for `native` when it
    cannot be had, and for a wheels folder (TOOLKIT_GRPC_NATIVE_WHEELS, ...) without a wheel that
    fits."""
    if choice not in kind.choices:
        raise BuildError(f"unknown {kind.label} front end '{choice}': choose {', '.join(kind.choices)}")
    if choice == kind.fallback:
        option = f"{kind.option} {kind.fallback}"
        return NativeFrontend(kind, kind.fallback, option, reason=option)
    user = _user_wheel(kind, base)
    if user is not None:
        return user
    try:
        return _native(kind, base, Path(cache_dir), refresh, progress)
    except Unavailable as exc:
        if choice == "native":
            raise BuildError(
                f"{kind.option} native: the native {kind.label} front end cannot go into this image: {exc}"
            ) from None
        return NativeFrontend(kind, kind.fallback, "fallback", reason=f"the native front end cannot be had: {exc}")
