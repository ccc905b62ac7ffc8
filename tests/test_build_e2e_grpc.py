"""End to end with a real container engine: a Cloud Run image built with `--protocol grpc`
answers tritonclient.grpc and the gRPC health probe on $PORT (h2c), read-only, as its non-root
user, and drains on SIGTERM; by default it serves with the native grpc++ front end (its wheel,
for CPython's stable ABI, built on demand with this Python and cached), with `--grpc-frontend
grpcio` or where the wheel cannot be built with grpcio's server. Skips without the engine unless TOOLKIT_REQUIRE_DOCKER=1 (CI)."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from serving import free_port
from test_build_e2e import BASE_IMAGE, QUICKSTART, deploy_builds, docker, engine, stop_and_logs, toolkit_build  # noqa: F401 (engine is a fixture)
from tools import perf_analyzer

from toolkit.build.native_frontend import GRPC
from toolkit.build.pipeline import wait_grpc_serving
from toolkit.build.wheelhouse import default_cache_dir

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def base_python(engine: dict[str, str]) -> str:  # noqa: F811
    return docker(engine, "run", "--rm", "--network", "none", "--entrypoint", "python3", BASE_IMAGE, "-c",
                  "import sys; print('%d.%d' % sys.version_info[:2])").stdout.strip()


@pytest.fixture(scope="module")
def grpc_image(engine: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    """The default gRPC image (no option, no environment): the native front end's wheel is
    built with this Python (or reused from the wheel cache) when it is the base image's."""
    output = tmp_path_factory.mktemp("cloudrun-grpc") / "ctx"
    report = toolkit_build(engine, output, "--target", "cloudrun", "--protocol", "grpc", "--measure-cold-start")
    report["context_dir"] = output
    return report


@pytest.fixture(scope="module")
def grpcio_image(engine: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    output = tmp_path_factory.mktemp("cloudrun-grpcio") / "ctx"
    report = toolkit_build(engine, output, "--target", "cloudrun", "--protocol", "grpc", "--grpc-frontend", "grpcio")
    report["context_dir"] = output
    return report


def _native_wheels(context: Path) -> list[str]:
    return sorted(name for name in os.listdir(context / "wheelhouse") if name.startswith("toolkit_grpcnative-"))


def test_grpc_image_carries_grpc_but_not_the_build_side(engine: dict[str, str], grpc_image: dict) -> None:  # noqa: F811
    image = grpc_image["image"]
    assert grpc_image["cold_start"]["measured"] and "gRPC health" in grpc_image["cold_start"]["how"]
    config = json.loads(docker(engine, "image", "inspect", "--format", "{{json .Config}}", image).stdout)
    assert config["Labels"]["io.triton-serverless-toolkit.protocol"] == "grpc"
    assert "TOOLKIT_PROTOCOL=grpc" in config["Env"]
    check = (
        "import importlib.util as u; "
        "print(sorted(m for m in ('toolkit', 'onnx', 'jinja2', 'boto3', 'tritonclient', 'mangum', 'grpc', "
        "'grpc_health', 'google.protobuf', 'google.auth') if u.find_spec(m.split('.')[0]) and "
        "(m.count('.') == 0 or u.find_spec(m))))"
    )
    found = docker(engine, "run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-c", check).stdout
    assert found.strip() == "['google.protobuf', 'grpc', 'grpc_health']"


def _serves_and_drains(engine: dict[str, str], image: str) -> str:  # noqa: F811
    """Run the image (read-only, host network), drive it with tritonclient.grpc (unary and a
    stream), stop it: it drains and exits 0. Returns its log."""
    port = free_port()
    container = docker(
        engine, "run", "-d", "--network", "host", "--read-only", "--tmpfs", "/tmp", "-e", f"PORT={port}",
        "-e", "TOOLKIT_HOST=127.0.0.1", image,
    ).stdout.strip()
    try:
        running = lambda: docker(engine, "inspect", "--format", "{{.State.Running}}", container, check=False).stdout.strip() == "true"  # noqa: E731
        assert wait_grpc_serving(f"127.0.0.1:{port}", 180, running) is not None, docker(engine, "logs", container).stderr
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("add_sub")
        assert client.get_model_metadata("add_sub").platform == "onnxruntime_onnx"
        a = np.random.default_rng(0).random((3, 16), dtype=np.float32)
        inputs = [grpcclient.InferInput(f"INPUT{i}", [3, 16], "FP32") for i in (0, 1)]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        result = client.infer("add_sub", inputs)
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + a, rtol=1e-6)
        answers: queue.Queue = queue.Queue()
        client.start_stream(lambda result, error: answers.put((result, error)))
        for n in range(3):
            client.async_stream_infer("add_sub", inputs, request_id=str(n))
        assert [answers.get(timeout=30)[0].get_response().id for _ in range(3)] == ["0", "1", "2"]
        client.stop_stream()
        client.close()
        return stop_and_logs(engine, container)
    finally:
        docker(engine, "rm", "-f", container, check=False)


def test_the_default_grpc_image_serves_with_the_native_front_end(
    engine: dict[str, str], grpc_image: dict, base_python: str  # noqa: F811
) -> None:
    """No option, no TOOLKIT_GRPC_NATIVE_WHEELS: the image carries the grpc++ front end's
    self-contained wheel (build.py --wheel with this Python; the stable ABI, cp311-abi3, so any
    image Python from 3.11 on) and serves with it, offline build and read-only image as ever; the
    report says what it adds. Where the base image's Python is older than 3.11, the image falls back
    to grpcio's server and the report says why."""
    frontend = grpc_image["grpc_frontend"]
    if tuple(map(int, base_python.split("."))) < (3, 11):
        assert frontend["frontend"] == "grpcio" and f"the image's Python is {base_python}" in frontend["reason"]
        assert "gRPC front end: grpcio" in _serves_and_drains(engine, grpc_image["image"])
        return
    assert frontend["frontend"] == "native" and frontend["source"] in ("built", "cache"), frontend
    assert _native_wheels(grpc_image["context_dir"]) == [frontend["wheel"]]
    assert frontend["wheel"].startswith("toolkit_grpcnative-0.1.0-cp311-abi3-manylinux_"), frontend["wheel"]
    assert frontend["installed_bytes"] > frontend["wheel_bytes"] > 1_000_000
    assert "gRPC front end: native (grpc++" in grpc_image["output"]
    assert "gRPC front end: native" in _serves_and_drains(engine, grpc_image["image"])


def test_a_second_grpc_build_reuses_the_cached_wheel(engine: dict[str, str], grpc_image: dict, tmp_path) -> None:  # noqa: F811
    if grpc_image["grpc_frontend"]["frontend"] != "native":
        pytest.skip("the base image's Python is older than 3.11: no wheel to reuse (the test above checks the fallback)")
    report = toolkit_build(engine, tmp_path / "ctx", "--target", "cloudrun", "--protocol", "grpc")
    frontend = report["grpc_frontend"]
    assert frontend["source"] == "cache" and frontend["wheel"] == grpc_image["grpc_frontend"]["wheel"], frontend
    assert "reused from the wheel cache" in report["output"] and "building the native gRPC" not in report["output"]
    assert report["image"] == grpc_image["image"]  # the same context, so the same image


def test_grpcio_frontend_option_gives_a_grpcio_image(engine: dict[str, str], grpcio_image: dict) -> None:  # noqa: F811
    assert grpcio_image["grpc_frontend"] == {"frontend": "grpcio", "source": "--grpc-frontend grpcio",
                                             "reason": "--grpc-frontend grpcio"}
    assert _native_wheels(grpcio_image["context_dir"]) == []
    assert "gRPC front end: grpcio" in _serves_and_drains(engine, grpcio_image["image"])


def test_deploy_builds_with_its_grpc_frontend_and_base_image(engine: dict[str, str], grpcio_image: dict, tmp_path) -> None:  # noqa: F811
    """`toolkit deploy --target cloudrun --protocol grpc` from a repository (no --image) builds the
    image with toolkit build's --grpc-frontend and --base-image: here the grpcio image again (the
    same context, so the same image) before stopping at the Google credentials this machine lacks."""
    pushed = deploy_builds(engine, tmp_path, "--protocol", "grpc", "--grpc-frontend", "grpcio")
    assert pushed.rsplit(":", 1)[1] == grpcio_image["image"].rsplit(":", 1)[1]


def test_without_a_compiler_the_image_falls_back_to_grpcio(
    engine: dict[str, str], grpcio_image: dict, tmp_path  # noqa: F811
) -> None:
    """PATH pointing at a folder without g++ stands in for a host without a compiler (and a wheel
    cache holding the wheelhouses but no native wheel): the build succeeds with grpcio's server
    and says why in one line and in the report; the image is the --grpc-frontend grpcio one."""
    cache = tmp_path / "cache"
    cache.mkdir()
    for entry in default_cache_dir().iterdir() if default_cache_dir().is_dir() else []:
        if entry.name != GRPC.cache_folder and not entry.name.startswith("."):
            (cache / entry.name).symlink_to(entry)
    empty = tmp_path / "bin"
    empty.mkdir()
    env = {**engine, "PATH": str(empty), "TOOLKIT_WHEEL_CACHE": str(cache)}
    report = toolkit_build(env, tmp_path / "ctx", "--target", "cloudrun", "--protocol", "grpc")
    frontend = report["grpc_frontend"]
    assert (frontend["frontend"], frontend["source"]) == ("grpcio", "fallback"), frontend
    assert "no C++ compiler (g++) on PATH" in frontend["reason"] and "libgrpc++-dev" in frontend["reason"]
    lines = [line for line in report["output"].splitlines() if "gRPC front end: grpcio's server, not the native" in line]
    assert len(lines) == 1, report["output"]
    assert _native_wheels(tmp_path / "ctx") == [] and report["image"] == grpcio_image["image"]
    failed = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "build", str(QUICKSTART), "--base-image", BASE_IMAGE, "--builder", "docker",
         "--output", str(tmp_path / "ctx2"), "-q", "--target", "cloudrun", "--protocol", "grpc", "--grpc-frontend", "native"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert failed.returncode == 1 and "--grpc-frontend native: the native gRPC front end cannot go into this image" in (
        " ".join(failed.stderr.split())), failed.stderr


def test_users_native_wheels_win(engine: dict[str, str], grpc_image: dict, tmp_path) -> None:  # noqa: F811
    """TOOLKIT_GRPC_NATIVE_WHEELS=DIR (a wheel made by build.py --wheel: here the one the default
    build made) goes into the image as before; a folder without a wheel for the image is an error."""
    if grpc_image["grpc_frontend"]["frontend"] != "native":
        pytest.skip("the base image's Python is older than 3.11: no wheel for it")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in _native_wheels(grpc_image["context_dir"]):
        shutil.copyfile(grpc_image["context_dir"] / "wheelhouse" / name, wheels / name)
    report = toolkit_build({**engine, "TOOLKIT_GRPC_NATIVE_WHEELS": str(wheels)}, tmp_path / "ctx", "--target",
                           "cloudrun", "--protocol", "grpc")
    assert report["grpc_frontend"]["source"] == "TOOLKIT_GRPC_NATIVE_WHEELS" and report["image"] == grpc_image["image"]
    empty = tmp_path / "none"
    empty.mkdir()
    failed = subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "build", str(QUICKSTART), "--base-image", BASE_IMAGE, "--builder", "docker",
         "--output", str(tmp_path / "ctx2"), "-q", "--target", "cloudrun", "--protocol", "grpc"],
        capture_output=True, text=True, env={**engine, "TOOLKIT_GRPC_NATIVE_WHEELS": str(empty)}, timeout=600,
    )
    assert failed.returncode == 1 and "holds no toolkit_grpcnative wheel" in " ".join(failed.stderr.split()), failed.stderr


def _banner(process) -> str:
    """The start-up message (Rich may wrap it over several lines), read up to `Ctrl-C stops`."""
    lines = []
    while not lines or "Ctrl-C" not in lines[-1]:
        line = process.stderr.readline()
        if not line:
            break
        lines.append(line.strip())
    text = " ".join(lines)
    assert "serving" in text or "proxying" in text, text + process.stderr.read()
    return text


def test_toolkit_run_serves_the_grpc_image(engine: dict[str, str], grpc_image: dict) -> None:  # noqa: F811
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "toolkit.cli", "run", grpc_image["image"], "--port", str(port), "--builder", "docker"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=engine,
    )
    try:
        assert f"on gRPC 127.0.0.1:{port}" in _banner(process)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        assert client.is_server_ready()
        client.close()
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err


def test_grpc_clients_drive_a_lambda_image_through_the_proxy(engine: dict[str, str], tmp_path) -> None:  # noqa: F811
    """A Lambda image under AWS's Runtime Interface Emulator (`toolkit run`), reached by
    tritonclient.grpc and perf_analyzer -i grpc through `toolkit proxy --grpc-port`: each unary
    RPC becomes a REST call to the function; streams are refused with the reason."""
    report = toolkit_build(engine, tmp_path / "ctx", "--target", "lambda")
    port, grpc_port = free_port(), free_port()
    function = subprocess.Popen(
        [sys.executable, "-m", "toolkit.cli", "run", report["image"], "--port", str(port), "--builder", "docker"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=engine,
    )
    proxy = None
    try:
        _banner(function)
        proxy = subprocess.Popen(
            [sys.executable, "-m", "toolkit.cli", "proxy", f"http://127.0.0.1:{port}", "--port", "0", "--grpc-port",
             str(grpc_port), "--auth", "none"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=engine,
        )
        assert "proxying gRPC" in _banner(proxy)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        assert client.is_server_ready() and client.is_model_ready("add_sub")
        assert client.get_model_config("add_sub").config.max_batch_size == 8
        a = np.random.default_rng(0).random((2, 16), dtype=np.float32)
        inputs = [grpcclient.InferInput(f"INPUT{i}", [2, 16], "FP32") for i in (0, 1)]
        for tensor in inputs:
            tensor.set_data_from_numpy(a)
        result = client.infer("add_sub", inputs, request_id="lambda")
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), a + a, rtol=1e-6)
        assert result.get_response().id == "lambda"
        errors: queue.Queue = queue.Queue()
        client.start_stream(lambda result, error: errors.put(error))
        try:
            client.async_stream_infer("add_sub", inputs)
        except grpcclient.InferenceServerException:
            pass  # the refusal may already have closed the stream
        assert "AWS Lambda has no gRPC" in str(errors.get(timeout=30))
        client.stop_stream()
        client.close()
        out = subprocess.run(
            [perf_analyzer(), "-i", "grpc", "-u", f"127.0.0.1:{grpc_port}", "-m", "add_sub", "--shape", "INPUT0:16",
             "--shape", "INPUT1:16", "--concurrency-range", "1", "--request-count", "20"],
            capture_output=True, text=True, timeout=300,
        )
        assert out.returncode == 0 and re.findall(r"Request count: (\d+)", out.stdout) == ["20"], out.stdout + out.stderr
    finally:
        for process in (proxy, function):
            if process is not None:
                process.send_signal(signal.SIGTERM)
                process.communicate(timeout=60)
    assert function.returncode == 0
