"""End to end with a real container engine: an image whose Python is not the one running `toolkit
build` still serves with both native front ends. Their wheels are built here for CPython's stable
ABI (`cp311-abi3`: handlers/protocol/native/build.py, frontend.h), install offline in an image
with another Python, and serve tritonclient's HTTP and gRPC clients there, read-only, draining on
SIGTERM. The image's base is Debian trixie's Python (scripts/ci-docker.sh base-other,
$TOOLKIT_OTHER_BASE_IMAGE). Skips without the engine or that base image unless
TOOLKIT_REQUIRE_DOCKER=1 (CI)."""

from __future__ import annotations

import os
import sys

import pytest
from test_build_e2e import docker, engine, toolkit_build  # noqa: F401 (engine is a fixture)
from test_build_e2e_grpc import _serves_and_drains as serves_grpc
from test_build_e2e_http_native import _serves_and_drains as serves_http

pytestmark = pytest.mark.docker

OTHER_BASE_IMAGE = os.environ.get("TOOLKIT_OTHER_BASE_IMAGE", "toolkit-ci/python:3.13-trixie")


@pytest.fixture(scope="module")
def other_base(engine: dict[str, str]) -> str:  # noqa: F811
    """The other base image's Python (major.minor); it must differ from this one's."""
    found = docker(engine, "run", "--rm", "--network", "none", "--entrypoint", "python3", OTHER_BASE_IMAGE, "-c",
                   "import sys; print('%d.%d' % sys.version_info[:2])", check=False)
    if found.returncode != 0:
        problem = f"base image {OTHER_BASE_IMAGE} is missing (scripts/ci-docker.sh base-other)"
        if os.environ.get("TOOLKIT_REQUIRE_DOCKER") == "1":
            pytest.fail(f"TOOLKIT_REQUIRE_DOCKER=1 but {problem}")
        pytest.skip(problem)
    python = found.stdout.strip()
    assert python != "%d.%d" % sys.version_info[:2], f"{OTHER_BASE_IMAGE} has this Python ({python}): choose another"
    assert tuple(map(int, python.split("."))) >= (3, 11)
    return python


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_an_image_with_another_python_serves_with_the_native_front_end(
    engine: dict[str, str], other_base: str, protocol: str, tmp_path  # noqa: F811
) -> None:
    report = toolkit_build(engine, tmp_path / "ctx", "--target", "cloudrun", "--protocol", protocol,
                           base_image=OTHER_BASE_IMAGE)
    frontend = report[f"{protocol}_frontend"]
    package = {"http": "toolkit_httpnative", "grpc": "toolkit_grpcnative"}[protocol]
    assert frontend["frontend"] == "native" and frontend["source"] in ("built", "cache"), frontend
    assert frontend["wheel"].startswith(f"{package}-0.1.0-cp311-abi3-manylinux_"), frontend["wheel"]
    wheels = sorted(name for name in os.listdir(tmp_path / "ctx" / "wheelhouse") if name.startswith(f"{package}-"))
    assert wheels == [frontend["wheel"]]
    image = report["image"]
    try:
        python = docker(engine, "run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-c",
                        "import sys; print('%d.%d' % sys.version_info[:2])").stdout.strip()
        assert python == other_base
        if protocol == "http":
            assert "HTTP front end: native" in serves_http(engine, image)
        else:
            assert "gRPC front end: native" in serves_grpc(engine, image)
    finally:  # no other test uses these images: give their disk back (the engine's vfs copies every layer)
        docker(engine, "rmi", "-f", image, check=False)
