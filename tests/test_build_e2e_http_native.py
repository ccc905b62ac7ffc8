"""End to end with a real container engine: a Cloud Run HTTP image built with no option carries
the native HTTP front end (libevent's evhttp; its self-contained wheel, for CPython's stable ABI,
built on demand with this Python and cached, as the gRPC one is) and serves tritonclient's HTTP client with it, read-only,
and drains on SIGTERM; `--http-frontend uvicorn` leaves the wheel out and serves with uvicorn.
The two images' sizes are compared (what the wheel adds). Skips without the engine unless
TOOLKIT_REQUIRE_DOCKER=1 (CI)."""

from __future__ import annotations

import http.client
import json
import os
import socket
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from serving import free_port, read_response
from test_build_e2e import (  # noqa: F401 (engine is a fixture)
    BASE_IMAGE, deploy_builds, docker, engine, infer_add_sub, stop_and_logs, toolkit_build, wait_ready,
)

from toolkit.build.native_frontend import HTTP

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def base_python(engine: dict[str, str]) -> str:  # noqa: F811
    return docker(engine, "run", "--rm", "--network", "none", "--entrypoint", "python3", BASE_IMAGE, "-c",
                  "import sys; print('%d.%d' % sys.version_info[:2])").stdout.strip()


def _build(engine: dict[str, str], tmp_path_factory: pytest.TempPathFactory, name: str, *args: str) -> dict:  # noqa: F811
    output = tmp_path_factory.mktemp(name) / "ctx"
    report = toolkit_build(engine, output, "--target", "cloudrun", *args)
    report["context_dir"] = output
    return report


@pytest.fixture(scope="module")
def native_image(engine: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    return _build(engine, tmp_path_factory, "native")


@pytest.fixture(scope="module")
def uvicorn_image(engine: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    return _build(engine, tmp_path_factory, "uvicorn", "--http-frontend", "uvicorn")


def _wheels(context: Path) -> list[str]:
    return sorted(name for name in os.listdir(context / "wheelhouse") if name.startswith("toolkit_httpnative-"))


def _serves_and_drains(engine: dict[str, str], image: str) -> str:  # noqa: F811
    """Run the image (read-only, host network, a 4 kB body limit), drive it with tritonclient's
    HTTP client and raw requests, stop it: it drains and exits 0. Returns its log."""
    port = free_port()
    container = docker(
        engine, "run", "-d", "--network", "host", "--read-only", "--tmpfs", "/tmp", "-e", f"PORT={port}",
        "-e", "TOOLKIT_HOST=127.0.0.1", "-e", "TOOLKIT_MAX_REQUEST_BYTES=4096", image,
    ).stdout.strip()
    try:
        wait_ready(f"http://127.0.0.1:{port}", container, engine)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        assert client.is_server_live() and client.is_model_ready("add_sub")
        assert client.get_model_metadata("add_sub")["platform"] == "onnxruntime_onnx"
        infer_add_sub(client)
        a = np.ones((1, 16), dtype=np.float32)
        inputs = [httpclient.InferInput(f"INPUT{i}", [1, 16], "FP32") for i in (0, 1)]
        for tensor in inputs:
            tensor.set_data_from_numpy(a, binary_data=True)
        np.testing.assert_allclose(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), a + a)
        client.close()
        # the answers both front ends give alike: a declared body over the limit, an unknown method
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(b"POST /v2/models/add_sub/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n")
            status, _, body = read_response(sock, bytearray())  # head and body may come in two reads
        assert status == 413 and body.startswith(b'{"error":"request body of 100000 bytes exceeds'), body
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        connection.request("QUERY", "/v2/models/add_sub")
        response = connection.getresponse()
        assert (response.status, json.loads(response.read())) == (405, {"error": "Method Not Allowed"})
        connection.close()
        return stop_and_logs(engine, container)
    finally:
        docker(engine, "rm", "-f", container, check=False)


def test_the_default_http_image_serves_with_the_native_front_end(
    engine: dict[str, str], native_image: dict, base_python: str  # noqa: F811
) -> None:
    frontend = native_image["http_frontend"]
    if tuple(map(int, base_python.split("."))) < (3, 11):  # older than the wheel's stable ABI: uvicorn, and why
        assert frontend["frontend"] == "uvicorn" and f"the image's Python is {base_python}" in frontend["reason"]
        assert "HTTP front end: uvicorn" in _serves_and_drains(engine, native_image["image"])
        return
    assert frontend["frontend"] == "native" and frontend["source"] in ("built", "cache"), frontend
    assert _wheels(native_image["context_dir"]) == [frontend["wheel"]]
    assert frontend["wheel"].startswith("toolkit_httpnative-0.1.0-cp311-abi3-manylinux_"), frontend["wheel"]
    assert frontend["installed_bytes"] > frontend["wheel_bytes"] > 100_000
    assert "HTTP front end: native (libevent" in native_image["output"]
    config = json.loads(docker(engine, "image", "inspect", "--format", "{{json .Config}}", native_image["image"]).stdout)
    assert "TOOLKIT_HTTP_FRONTEND=native" in config["Env"]
    assert "HTTP front end: native" in _serves_and_drains(engine, native_image["image"])


def test_uvicorn_image_leaves_the_wheel_out_and_the_size_difference_is_the_wheel(
    engine: dict[str, str], native_image: dict, uvicorn_image: dict  # noqa: F811
) -> None:
    assert uvicorn_image["http_frontend"] == {"frontend": "uvicorn", "source": "--http-frontend uvicorn",
                                              "reason": "--http-frontend uvicorn"}
    assert _wheels(uvicorn_image["context_dir"]) == []
    config = json.loads(docker(engine, "image", "inspect", "--format", "{{json .Config}}", uvicorn_image["image"]).stdout)
    assert not any(entry.startswith("TOOLKIT_HTTP_FRONTEND=") for entry in config["Env"])
    assert "HTTP front end: uvicorn" in _serves_and_drains(engine, uvicorn_image["image"])
    if native_image["http_frontend"]["frontend"] == "native":
        delta = native_image["image_size"] - uvicorn_image["image_size"]
        print(f"native HTTP front end: image {native_image['image_size']} vs {uvicorn_image['image_size']} bytes "
              f"(+{delta}); wheel {native_image['http_frontend']['wheel_bytes']}, installed "
              f"{native_image['http_frontend']['installed_bytes']}")
        assert 0 < delta < 3 * native_image["http_frontend"]["installed_bytes"]


def test_a_second_build_reuses_the_cached_wheel(engine: dict[str, str], native_image: dict, tmp_path) -> None:  # noqa: F811
    if native_image["http_frontend"]["frontend"] != "native":
        pytest.skip("the base image's Python is older than 3.11: no wheel to cache")
    report = toolkit_build(engine, tmp_path / "ctx", "--target", "knative")
    frontend = report["http_frontend"]
    assert frontend["source"] == "cache" and frontend["wheel"] == native_image["http_frontend"]["wheel"], frontend
    assert "reused from the wheel cache" in report["output"]
    assert HTTP.cache_folder == "httpnative"


def test_deploy_builds_with_its_http_frontend(engine: dict[str, str], uvicorn_image: dict, native_image: dict, tmp_path) -> None:  # noqa: F811
    """`toolkit deploy --target cloudrun` from a repository builds with toolkit build's
    --http-frontend: `uvicorn` gives the uvicorn image again, the default the native one (the same
    contexts, so the same images) before stopping at the Google credentials this machine lacks."""
    tag = deploy_builds(engine, tmp_path, "--http-frontend", "uvicorn").rsplit(":", 1)[1]
    assert tag == uvicorn_image["image"].rsplit(":", 1)[1]
    assert deploy_builds(engine, tmp_path).rsplit(":", 1)[1] == native_image["image"].rsplit(":", 1)[1]
