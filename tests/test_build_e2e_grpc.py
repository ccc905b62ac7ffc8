"""End to end with a real container engine: a Cloud Run image built with `--protocol grpc`
answers tritonclient.grpc and the gRPC health probe on $PORT (h2c), read-only, as its non-root
user, and drains on SIGTERM. Skips without the engine unless TOOLKIT_REQUIRE_DOCKER=1 (CI)."""

from __future__ import annotations

import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from serving import free_port
from test_build_e2e import docker, engine, toolkit_build  # noqa: F401 (engine is a fixture)

from toolkit.build.pipeline import wait_grpc_serving

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def grpc_image(engine: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    output = tmp_path_factory.mktemp("cloudrun-grpc") / "ctx"
    report = toolkit_build(engine, output, "--target", "cloudrun", "--protocol", "grpc", "--measure-cold-start")
    report["context_dir"] = output
    return report


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


def test_grpc_image_serves_tritonclient_grpc_and_drains(engine: dict[str, str], grpc_image: dict) -> None:  # noqa: F811
    port = free_port()
    container = docker(
        engine, "run", "-d", "--network", "host", "--read-only", "--tmpfs", "/tmp", "-e", f"PORT={port}",
        "-e", "TOOLKIT_HOST=127.0.0.1", grpc_image["image"],
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
        docker(engine, "stop", "--time", "30", container)
        state = json.loads(docker(engine, "inspect", "--format", "{{json .State}}", container).stdout)
        assert state["ExitCode"] == 0, docker(engine, "logs", container).stderr
    finally:
        docker(engine, "rm", "-f", container, check=False)
