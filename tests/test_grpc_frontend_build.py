"""How `toolkit build --protocol grpc` chooses the image's gRPC front end
(toolkit/build/native_frontend.py, gf.GRPC): the native wheel's cache key, its manylinux tag against the base
image's glibc, the user's TOOLKIT_GRPC_NATIVE_WHEELS, and the fall back to grpcio's server with the
reason (the image's Python older than 3.11, its arch not the host's, no compiler, glibc too old), or the
build's failure under `--grpc-frontend native`. The wheel is for CPython's stable ABI
(`cp311-abi3`): any Python from 3.11 on builds it, for an image with any Python from 3.11 on. Building and serving real images:
tests/test_build_e2e_grpc.py."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console

from handlers.protocol.native import build as native_build
from toolkit.build import native_frontend as gf
from toolkit.build.base_image import BaseImage
from toolkit.build.errors import BuildError, BuildOptionError
from toolkit.build.pipeline import BuildOptions, _check_options
from toolkit.build.report import BuildReport, grpc_frontend_text
from toolkit.build.runtime_deps import GRPC_NATIVE_WHEELS_ENV, HTTP_NATIVE_WHEELS_ENV, RuntimeRequirement, runtime_requirements
from toolkit.build.wheelhouse import cache_key

HOST = gf.host_python()
TAG = "cp" + HOST.replace(".", "")
ABI3 = ("cp311", "abi3")  # the Python and ABI tags of the wheels build.py makes
OLDER = "3.10"  # a Python older than the stable ABI the modules use


def _base(python: str = HOST, glibc: tuple[int, int] = (2, 36), arch: str | None = None) -> BaseImage:
    return BaseImage("python:test", python, glibc, arch or gf.host_arch(), False, "test")


def _wheel(folder: Path, platform: str = "manylinux_2_35", tags: tuple[str, str] = ABI3, arch: str | None = None) -> Path:
    """A wheel file by the name build.py --wheel gives (its content: one module file). It stands
    in for a built wheel where only its name and place matter (the cache lookup, the tag check)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"toolkit_grpcnative-0.1.0-{tags[0]}-{tags[1]}-{platform}_{arch or gf.host_arch()}.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("toolkit_grpcnative/__init__.py", "x" * 1000)
    return path


def test_cache_key_follows_the_sources_python_and_arch(tmp_path):
    sources = []
    for source in gf.GRPC.sources:
        copy = tmp_path / source.name
        shutil.copyfile(source, copy)
        sources.append(copy)
    key = gf.cache_key("cp311", "x86_64", tuple(sources))
    assert key == gf.cache_key("cp311", "x86_64", tuple(sources)) == gf.cache_key("cp311", "x86_64", gf.GRPC.sources)  # content, not path
    assert len({key, gf.cache_key("cp312", "x86_64", tuple(sources)), gf.cache_key("cp311", "aarch64", tuple(sources))}) == 3
    for changed in sources:  # the C++ source or the build script changed: a new wheel
        text = changed.read_bytes()
        changed.write_bytes(text + b"\n")
        assert gf.cache_key("cp311", "x86_64", tuple(sources)) != key
        changed.write_bytes(text)
    assert gf.cache_key("cp311", "x86_64", tuple(sources)) == key


def test_cache_key_hashes_every_file_the_build_reads():
    """The shared builder lists what `build.py grpc` reads (the C++ source, the shared header,
    itself): the cache key hashes exactly those files, so a change to any of them builds anew."""
    listed = subprocess.run([sys.executable, str(gf.BUILD_SCRIPT), "grpc", "--sources"], capture_output=True,
                            text=True, check=True).stdout.split()
    assert [Path(p) for p in listed] == list(gf.GRPC.sources)
    assert all(Path(p).is_file() for p in listed)


@pytest.mark.parametrize("kind", [gf.GRPC, gf.HTTP], ids=["grpc", "http"])
def test_the_cache_key_covers_every_file_the_build_reads(kind):
    """One list of what a build reads: build.py's (the cache key takes it from there). It holds the
    C++ source, every local header it includes (found where the compiler's -I looks: beside the
    source and in handlers/protocol/native), and the builder itself; a header added to a source
    without being listed fails here."""
    frontend = native_build.FRONTENDS[kind.name]
    assert kind.sources == frontend.sources
    assert kind.debian == frontend.debian
    names = {path.name: path for path in kind.sources}
    assert frontend.source in kind.sources and Path(native_build.__file__).resolve() in kind.sources
    assert gf.BUILD_SCRIPT == Path(native_build.__file__).resolve()
    pending, seen = [frontend.source], set()
    while pending:
        source = pending.pop()
        for included in re.findall(r'^\s*#\s*include\s+"([^"]+)"', source.read_text(), re.MULTILINE):
            found = [d / included for d in (source.parent, native_build.HERE) if (d / included).is_file()]
            assert found, f"{source.name} includes {included}, which the build cannot find"
            assert names.get(found[0].name) == found[0], f"{included} is not in the sources"
            if found[0] not in seen:
                seen.add(found[0])
                pending.append(found[0])
    assert seen, "the C++ source includes frontend.h"
    # build.py --wheel copies exactly the C++ source and the header into its project
    assert set(kind.sources) == {frontend.source, native_build.HEADER, Path(native_build.__file__).resolve()}


@pytest.mark.parametrize("kind", [gf.GRPC, gf.HTTP], ids=["grpc", "http"])
def test_the_fallback_warning_names_no_number_that_goes_stale(kind, tmp_path, monkeypatch):
    """The warning points at the measurements (docs/performance.md) instead of quoting them."""
    monkeypatch.delenv(kind.wheels_env, raising=False)
    line = gf.choose_frontend(kind, "auto", _base(python=OLDER), cache_dir=tmp_path).line()
    cost = line.split(", not the native one (", 1)[1].split("):", 1)[0]
    assert cost == "slower: docs/performance.md"
    assert (Path(__file__).resolve().parent.parent / "docs" / "performance.md").is_file()


@pytest.mark.parametrize(("filename", "glibc"), [
    ("toolkit_grpcnative-0.1.0-cp311-cp311-manylinux_2_35_x86_64.whl", (2, 35)),
    ("toolkit_grpcnative-0.1.0-cp312-cp312-manylinux_2_17_aarch64.manylinux2014_aarch64.whl", (2, 17)),
    ("toolkit_grpcnative-0.1.0-cp311-cp311-manylinux2014_x86_64.whl", (2, 17)),
    ("toolkit_grpcnative-0.1.0-cp311-cp311-manylinux1_x86_64.whl", (2, 5)),
    ("toolkit_grpcnative-0.1.0-cp311-cp311-linux_x86_64.whl", None),
    ("toolkit_grpcnative-0.1.0-cp311-cp311-musllinux_1_2_x86_64.whl", None),
])
def test_wheel_glibc_reads_the_manylinux_tag(filename, glibc):
    assert gf.wheel_glibc(filename) == glibc


def test_glibc_check_against_the_base_image(tmp_path):
    wheel = _wheel(tmp_path)
    gf.check_glibc(wheel, _base(glibc=(2, 36)))
    gf.check_glibc(wheel, _base(glibc=(2, 35)))
    with pytest.raises(gf.Unavailable, match=r"needs glibc 2\.35 or newer and base image python:test has glibc 2\.31"):
        gf.check_glibc(wheel, _base(glibc=(2, 31)))
    with pytest.raises(gf.Unavailable, match="no manylinux tag"):
        gf.check_glibc(_wheel(tmp_path, platform="linux"), _base())


def test_grpcio_leaves_the_wheel_out(tmp_path, monkeypatch):
    monkeypatch.setenv(GRPC_NATIVE_WHEELS_ENV, str(tmp_path))  # the option wins over the user's wheels too
    chosen = gf.choose_frontend(gf.GRPC, "grpcio", _base(), cache_dir=tmp_path)
    assert (chosen.frontend, chosen.wheel, chosen.requirement) == ("grpcio", None, None)
    assert chosen.as_dict() == {"frontend": "grpcio", "source": "--grpc-frontend grpcio", "reason": "--grpc-frontend grpcio"}


def test_a_cached_wheel_is_reused_without_building(tmp_path, monkeypatch):
    monkeypatch.delenv(GRPC_NATIVE_WHEELS_ENV, raising=False)
    folder = tmp_path / gf.GRPC.cache_folder / gf.cache_key(gf.ABI3_KEY, gf.host_arch(), gf.GRPC.sources)[:32]
    wheel = _wheel(folder)
    monkeypatch.setattr(gf, "BUILD_SCRIPT", tmp_path / "absent.py")  # a build would fail
    chosen = gf.choose_frontend(gf.GRPC, "auto", _base(), cache_dir=tmp_path)
    assert (chosen.frontend, chosen.source, chosen.wheel) == ("native", "cache", wheel)
    # the same stable-ABI wheel serves an image with another Python from 3.11 on
    for python in ("3.11", "3.12", "3.13", "3.14"):
        other = gf.choose_frontend(gf.GRPC, "auto", _base(python=python), cache_dir=tmp_path)
        assert (other.frontend, other.source, other.wheel) == ("native", "cache", wheel), python
    assert chosen.requirement.spec == str(wheel) and chosen.requirement.imports == ("toolkit_grpcnative",)
    entry = chosen.as_dict()
    assert entry["wheel"] == wheel.name and entry["wheel_bytes"] == wheel.stat().st_size
    assert entry["installed_bytes"] == 1000
    assert "reused from the wheel cache" in chosen.line()
    # the base image's glibc is older than the wheel's tag: grpcio's server, saying why
    old = gf.choose_frontend(gf.GRPC, "auto", _base(glibc=(2, 31)), cache_dir=tmp_path)
    assert (old.frontend, old.source) == ("grpcio", "fallback") and "needs glibc 2.35" in old.reason
    with pytest.raises(BuildError, match="--grpc-frontend native: .*needs glibc 2.35"):
        gf.choose_frontend(gf.GRPC, "native", _base(glibc=(2, 31)), cache_dir=tmp_path)


def test_an_older_python_or_another_arch_falls_back_with_the_way_to_get_it(tmp_path, monkeypatch):
    monkeypatch.delenv(GRPC_NATIVE_WHEELS_ENV, raising=False)
    chosen = gf.choose_frontend(gf.GRPC, "auto", _base(python=OLDER), cache_dir=tmp_path)
    assert (chosen.frontend, chosen.source) == ("grpcio", "fallback")
    assert f"the image's Python is {OLDER} and the native front ends need 3.11 or newer" in chosen.reason
    assert "python:3.12-slim-bookworm" in chosen.reason
    assert chosen.line().startswith("gRPC front end: grpcio's server, not the native one")
    arch = "aarch64" if gf.host_arch() != "aarch64" else "x86_64"
    assert f"the image is {arch}" in gf.choose_frontend(gf.GRPC, "auto", _base(arch=arch), cache_dir=tmp_path).reason
    with pytest.raises(BuildError, match=f"--grpc-frontend native: .*Python is {OLDER}"):
        gf.choose_frontend(gf.GRPC, "native", _base(python=OLDER), cache_dir=tmp_path)
    # toolkit itself on a Python older than 3.11 cannot build the wheel: how to get one
    monkeypatch.setattr(gf, "host_python", lambda: OLDER)
    older_host = gf.choose_frontend(gf.GRPC, "auto", _base(python="3.12"), cache_dir=tmp_path)
    assert (older_host.frontend, older_host.source) == ("grpcio", "fallback")
    assert f"the wheel is built with the Python running toolkit, {OLDER}, and needs 3.11 or newer" in older_host.reason
    assert GRPC_NATIVE_WHEELS_ENV in older_host.reason and "build.py grpc --wheel" in older_host.reason
    assert not (tmp_path / gf.GRPC.cache_folder).exists()  # nothing was built


def test_build_py_refuses_a_python_older_than_the_stable_abi(monkeypatch):
    monkeypatch.setattr(native_build.sys, "version_info", (3, 10, 0, "final", 0))
    with pytest.raises(RuntimeError, match="built with Python 3.11 or newer .*not 3.10"):
        native_build.check_python()
    assert (native_build.LIMITED_API_HEX, native_build.ABI3_TAG) == ("0x030B0000", "cp311")
    assert native_build.FRONTENDS["http"].output_name() == "_httpnative.abi3.so"


@pytest.mark.parametrize(("kind", "variable"), [(gf.GRPC, GRPC_NATIVE_WHEELS_ENV), (gf.HTTP, HTTP_NATIVE_WHEELS_ENV)],
                         ids=["grpc", "http"])
def test_no_compiler_falls_back_or_fails_native(tmp_path, monkeypatch, kind, variable):
    """PATH without g++ (an empty folder) stands in for a host without a compiler: build.py
    --wheel runs and refuses; the image falls back (grpcio's server, uvicorn), saying what to
    install, or `native` fails with build.py's reason."""
    monkeypatch.delenv(variable, raising=False)
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    chosen = gf.choose_frontend(kind, "auto", _base(), cache_dir=tmp_path / "cache")
    assert (chosen.frontend, chosen.source) == (kind.fallback, "fallback")
    assert "its wheel cannot be built on this machine: no C++ compiler (g++) on PATH" in chosen.reason
    assert f"apt-get install g++ pkg-config {kind.debian}" in chosen.reason
    assert f"{variable}=DIR" in chosen.reason and f"build.py {kind.name} --wheel" in chosen.reason
    with pytest.raises(BuildError, match=rf"{kind.option} native: .*no C\+\+ compiler"):
        gf.choose_frontend(kind, "native", _base(), cache_dir=tmp_path / "cache")
    assert list((tmp_path / "cache" / kind.cache_folder).iterdir()) == []  # no partial entry left


def test_the_users_wheels_win_and_must_fit(tmp_path, monkeypatch):
    folder = tmp_path / "wheels"
    monkeypatch.setenv(GRPC_NATIVE_WHEELS_ENV, str(folder))
    folder.mkdir()
    with pytest.raises(BuildError, match=f"holds no toolkit_grpcnative wheel for Python {HOST}"):
        gf.choose_frontend(gf.GRPC, "auto", _base(), cache_dir=tmp_path)
    # a per-version wheel of another Python does not fit; one of this Python does
    _wheel(folder, tags=("cp39", "cp39"))
    with pytest.raises(BuildError, match=f"holds no toolkit_grpcnative wheel for Python {HOST}"):
        gf.choose_frontend(gf.GRPC, "auto", _base(), cache_dir=tmp_path)
    own = _wheel(folder, tags=(TAG, TAG))
    assert gf.choose_frontend(gf.GRPC, "auto", _base(), cache_dir=tmp_path).wheel == own.resolve()
    own.unlink()
    wheel = _wheel(folder)  # the stable ABI's (cp311-abi3), as build.py makes it
    _wheel(tmp_path / gf.GRPC.cache_folder / gf.cache_key(gf.ABI3_KEY, gf.host_arch(), gf.GRPC.sources)[:32])
    chosen = gf.choose_frontend(gf.GRPC, "auto", _base(), cache_dir=tmp_path)
    assert (chosen.frontend, chosen.source, chosen.wheel) == ("native", GRPC_NATIVE_WHEELS_ENV, wheel.resolve())
    assert gf.choose_frontend(gf.GRPC, "auto", _base(python="3.13"), cache_dir=tmp_path).wheel == wheel.resolve()
    with pytest.raises(BuildError, match=f"holds no toolkit_grpcnative wheel for Python {OLDER}"):
        gf.choose_frontend(gf.GRPC, "auto", _base(python=OLDER), cache_dir=tmp_path)
    with pytest.raises(BuildError, match=f"{GRPC_NATIVE_WHEELS_ENV}: .*needs glibc 2.35"):
        gf.choose_frontend(gf.GRPC, "auto", _base(glibc=(2, 28)), cache_dir=tmp_path)


def test_build_options_and_the_report(tmp_path):
    with pytest.raises(BuildOptionError, match="unknown gRPC front end 'grpc'"):
        _check_options(BuildOptions(repository="r", target="cloudrun", protocol="grpc", grpc_frontend="grpc"))
    with pytest.raises(BuildOptionError, match="--grpc-frontend native applies to --protocol grpc images .* this lambda image serves HTTP"):
        _check_options(BuildOptions(repository="r", target="lambda", grpc_frontend="native"))
    _check_options(BuildOptions(repository="r", target="cloudrun", protocol="grpc", grpc_frontend="grpcio"))
    native = {"frontend": "native", "source": "built", "wheel": "w.whl", "wheel_bytes": 6_500_000,
              "installed_bytes": 21_000_000, "wheel_build_seconds": 90.0}
    assert grpc_frontend_text(native) == "native (grpc++): w.whl, adds 21.0 MB installed (6.5 MB wheel; built now, cached)"
    fallback = {"frontend": "grpcio", "source": "fallback", "reason": "the native front end cannot be had: x"}
    assert grpc_frontend_text(fallback) == "grpcio's server (the native front end cannot be had: x)"
    report = BuildReport("n", "t", "cloudrun", "linux/amd64", "b", HOST, "cpu", "c", "d", "r", "docker", "cmd",
                         grpc_frontend=native)
    console = Console(width=200, record=True, file=io.StringIO())
    report.render(console)
    text = console.export_text()
    assert "gRPC front end" in text and "adds 21.0 MB installed" in text
    assert report.to_dict()["grpc_frontend"] == native


def test_the_wheelhouse_key_follows_the_native_wheel_s_content_not_its_path(tmp_path) -> None:
    """The same wheel from the wheel cache or from TOOLKIT_GRPC_NATIVE_WHEELS (another folder) reuses
    one wheelhouse; a rebuilt wheel (new content, same name) makes a new one."""
    base = BaseImage("python:3.11", "3.11", (2, 36), "x86_64", False, "test")
    runtime = runtime_requirements(server=True, aws_lambda=False, runtime_client=False, gpu_cuda=None, protocol="grpc")
    name = "toolkit_grpcnative-0.1.0-cp311-cp311-manylinux_2_35_x86_64.whl"
    first, second = tmp_path / "cache" / name, tmp_path / "user" / name
    for wheel in (first, second):
        wheel.parent.mkdir()
        wheel.write_bytes(b"the same wheel")

    def key(wheel: Path) -> str:
        native = RuntimeRequirement(str(wheel), ("toolkit_grpcnative",))
        return cache_key(replace(runtime, resolved=(*runtime.resolved, native)), [], base)

    assert key(first) == key(second)
    assert key(first) != cache_key(runtime, [], base)
    second.write_bytes(b"a rebuilt wheel")
    assert key(first) != key(second)
