"""How `toolkit build` chooses a Cloud Run / Knative HTTP image's front end
(toolkit/build/native_frontend.py, HTTP): the native libevent front end's wheel (found, cached or
built like the gRPC one: tests/test_grpc_frontend_build.py, which also runs
its no-compiler case), or uvicorn with the reason. Building
and serving real images: tests/test_build_e2e_http_native.py."""

from __future__ import annotations

import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from rich.console import Console

from toolkit.build import native_frontend as nf
from toolkit.build.base_image import BaseImage
from toolkit.build.errors import BuildError, BuildOptionError
from toolkit.build.pipeline import BuildOptions, _check_options
from toolkit.build.report import BuildReport, http_frontend_text
from toolkit.build.runtime_deps import HTTP_NATIVE_WHEELS_ENV

HOST = nf.host_python()
TAG = "cp" + HOST.replace(".", "")


def _base(python: str = HOST, glibc: tuple[int, int] = (2, 36)) -> BaseImage:
    return BaseImage("python:test", python, glibc, nf.host_arch(), False, "test")


def _wheel(folder: Path, platform: str = "manylinux_2_36") -> Path:
    """A wheel file by the name build.py http --wheel gives, for the stable ABI (where only its name
    and place matter)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"toolkit_httpnative-0.1.0-cp311-abi3-{platform}_{nf.host_arch()}.whl"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("toolkit_httpnative/__init__.py", "x" * 1000)
    return path


def test_the_cache_key_hashes_every_file_the_http_build_reads():
    listed = subprocess.run([sys.executable, str(nf.BUILD_SCRIPT), "http", "--sources"], capture_output=True,
                            text=True, check=True).stdout.split()
    assert [Path(p) for p in listed] == list(nf.HTTP.sources)
    assert nf.cache_key(TAG, "x86_64", nf.HTTP.sources) != nf.cache_key(TAG, "x86_64", nf.GRPC.sources)
    assert (nf.HTTP.cache_folder, nf.HTTP.wheel_glob) == ("httpnative", "toolkit_httpnative-*.whl")


def test_uvicorn_leaves_the_wheel_out(tmp_path, monkeypatch):
    monkeypatch.setenv(HTTP_NATIVE_WHEELS_ENV, str(tmp_path))
    chosen = nf.choose_frontend(nf.HTTP, "uvicorn", _base(), cache_dir=tmp_path)
    assert (chosen.frontend, chosen.wheel, chosen.requirement) == ("uvicorn", None, None)
    assert chosen.as_dict() == {"frontend": "uvicorn", "source": "--http-frontend uvicorn",
                                "reason": "--http-frontend uvicorn"}
    with pytest.raises(BuildError, match="unknown HTTP front end 'grpcio': choose auto, native, uvicorn"):
        nf.choose_frontend(nf.HTTP, "grpcio", _base(), cache_dir=tmp_path)


def test_a_cached_wheel_is_reused_and_an_old_glibc_falls_back_to_uvicorn(tmp_path, monkeypatch):
    monkeypatch.delenv(HTTP_NATIVE_WHEELS_ENV, raising=False)
    wheel = _wheel(tmp_path / "httpnative" / nf.cache_key(nf.ABI3_KEY, nf.host_arch(), nf.HTTP.sources)[:32])
    monkeypatch.setattr(nf, "BUILD_SCRIPT", tmp_path / "absent.py")  # a build would fail
    chosen = nf.choose_frontend(nf.HTTP, "auto", _base(), cache_dir=tmp_path)
    assert (chosen.frontend, chosen.source, chosen.wheel) == ("native", "cache", wheel)
    assert chosen.requirement.imports == ("toolkit_httpnative",)
    assert chosen.line() == "HTTP front end: native (libevent wheel reused from the wheel cache)"
    old = nf.choose_frontend(nf.HTTP, "auto", _base(glibc=(2, 31)), cache_dir=tmp_path)
    assert (old.frontend, old.source) == ("uvicorn", "fallback") and "needs glibc 2.36" in old.reason
    assert old.line().startswith("HTTP front end: uvicorn, not the native one (")
    with pytest.raises(BuildError, match="--http-frontend native: the native HTTP front end .*needs glibc 2.36"):
        nf.choose_frontend(nf.HTTP, "native", _base(glibc=(2, 31)), cache_dir=tmp_path)


def test_the_users_wheels_win(tmp_path, monkeypatch):
    folder = tmp_path / "wheels"
    folder.mkdir()
    monkeypatch.setenv(HTTP_NATIVE_WHEELS_ENV, str(folder))
    with pytest.raises(BuildError, match=f"holds no toolkit_httpnative wheel for Python {HOST}.*build.py http --wheel"):
        nf.choose_frontend(nf.HTTP, "auto", _base(), cache_dir=tmp_path)
    wheel = _wheel(folder)
    chosen = nf.choose_frontend(nf.HTTP, "auto", _base(), cache_dir=tmp_path)
    assert (chosen.frontend, chosen.source, chosen.wheel) == ("native", HTTP_NATIVE_WHEELS_ENV, wheel.resolve())


def test_build_options_and_the_report():
    with pytest.raises(BuildOptionError, match="unknown HTTP front end 'granian'"):
        _check_options(BuildOptions(repository="r", target="cloudrun", http_frontend="granian"))
    with pytest.raises(BuildOptionError, match="--http-frontend native applies to --protocol http images .* "
                                               "this lambda image is invoked with HTTP events"):
        _check_options(BuildOptions(repository="r", target="lambda", http_frontend="native"))
    with pytest.raises(BuildOptionError, match="this knative image serves gRPC"):
        _check_options(BuildOptions(repository="r", target="knative", protocol="grpc", http_frontend="uvicorn"))
    _check_options(BuildOptions(repository="r", target="knative", http_frontend="uvicorn"))
    native = {"frontend": "native", "source": "cache", "wheel": "w.whl", "wheel_bytes": 600_000,
              "installed_bytes": 1_700_000, "wheel_build_seconds": None}
    assert http_frontend_text(native) == "native (libevent): w.whl, adds 1.7 MB installed (600.0 kB wheel; from the wheel cache)"
    fallback = {"frontend": "uvicorn", "source": "fallback", "reason": "the native front end cannot be had: x"}
    assert http_frontend_text(fallback) == "uvicorn (the native front end cannot be had: x)"
    report = BuildReport("n", "t", "cloudrun", "linux/amd64", "b", HOST, "cpu", "c", "d", "r", "docker", "cmd",
                         http_frontend=native)
    console = Console(width=200, record=True, file=io.StringIO())
    report.render(console)
    assert "HTTP front end" in console.export_text()
    assert report.to_dict()["http_frontend"] == native and report.to_dict()["grpc_frontend"] is None
