"""The openvino backend and the onnxruntime OpenVINO accelerator in a built image (real engine).

One repository, one Cloud Run image: `ov_relu` (backend "openvino", an IR made by OpenVINO from an
ONNX file built here) and `ort_ov` (backend "onnxruntime" with `cpu_execution_accelerator:
[{ name: "openvino" }]`, the same ONNX file). The image must carry `openvino` and
`onnxruntime-openvino` (instead of `onnxruntime`: the same module, never both) without the files
the runtime never loads, run the accelerated model on OpenVINOExecutionProvider, and answer
tritonclient and perf_analyzer with the outputs OpenVINO and ONNX Runtime give on the host.

This is where the accelerator path is tested: onnxruntime-openvino cannot be installed beside the
dev environment's onnxruntime. Engine set-up and skipping rules: tests/test_build_e2e.py.
"""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
import tritonclient.http as httpclient

import openvino_models as ovm
from conftest import write_config
from serving import free_port
from test_build_e2e import docker, engine, toolkit_build, wait_ready  # noqa: F401 - engine is a fixture
from tools import perf_analyzer

pytestmark = pytest.mark.docker

IMAGE_NAME = "openvino-e2e"

INSIDE = """
import importlib.metadata as md, importlib.util, json, os
from handlers.manifest import Manifest
from handlers.instance_group import InstanceSlot
from handlers.backends import onnxruntime as ort_backend
import onnxruntime, openvino
site = os.path.dirname(os.path.dirname(openvino.__file__))
manifest = Manifest.load(os.environ["TOOLKIT_MANIFEST"])
instance = ort_backend.create_instance(manifest.models["ort_ov"], 1, InstanceSlot("ort_ov_0", "KIND_CPU", 0))
def installed(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None
print(json.dumps({
    "distributions": {n: installed(n) for n in ("openvino", "onnxruntime", "onnxruntime-openvino", "openvino-telemetry")},
    "available": onnxruntime.get_available_providers(),
    "session": instance.session.get_providers(),
    "gpu_plugin": os.path.exists(os.path.join(site, "openvino/libs/libopenvino_intel_gpu_plugin.so")),
    "ort_gpu_plugin": os.path.exists(os.path.join(site, "onnxruntime/capi/libopenvino_intel_gpu_plugin.so")),
    "devices": openvino.Core().available_devices,
}))
"""


@pytest.fixture(scope="module")
def image(engine: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    root = tmp_path_factory.mktemp("openvino-image")
    repo = root / "models"
    source = root / "relu.onnx"
    ovm.matmul_relu_ir(repo / "ov_relu" / "1" / "model.xml", source, size=16)
    write_config(repo, "ov_relu", """
        backend: "openvino"
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
        dynamic_batching { }
        instance_group [ { count: 2 kind: KIND_CPU } ]
    """)
    (repo / "ort_ov" / "1").mkdir(parents=True)
    (repo / "ort_ov" / "1" / "model.onnx").write_bytes(source.read_bytes())
    write_config(repo, "ort_ov", """
        backend: "onnxruntime"
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
        optimization { execution_accelerators { cpu_execution_accelerator: [ { name: "openvino" } ] } }
    """)
    report = toolkit_build(engine, root / "ctx", "--target", "cloudrun", "--name", IMAGE_NAME, repository=repo)
    report.update(repository=repo, source=source, context_dir=root / "ctx")
    yield report
    docker(engine, "rmi", "-f", report["image"], check=False)


def test_image_carries_openvino_and_onnxruntime_openvino_instead_of_onnxruntime(engine, image) -> None:  # noqa: F811
    deps = image["python_deps"]
    assert deps["openvino"] == "2026.4.1" and deps["onnxruntime-openvino"] == "1.24.1"
    assert "onnxruntime" not in deps and "openvino-telemetry" not in deps
    dockerfile = (image["context_dir"] / "Dockerfile").read_text()
    assert "openvino/libs/libopenvino_intel_gpu_plugin.so" in dockerfile
    inside = json.loads(docker(engine, "run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp",
                               "--entrypoint", "python3", image["image"], "-c", INSIDE).stdout.strip().splitlines()[-1])
    assert inside["distributions"] == {"openvino": "2026.4.1", "onnxruntime": None, "onnxruntime-openvino": "1.24.1",
                                       "openvino-telemetry": None}
    assert "OpenVINOExecutionProvider" in inside["available"]
    assert inside["session"][0] == "OpenVINOExecutionProvider"  # the accelerated model really runs on it
    assert not inside["gpu_plugin"] and not inside["ort_gpu_plugin"] and inside["devices"] == ["CPU"]


def test_image_serves_both_models_to_tritonclient_and_perf_analyzer(engine, image) -> None:  # noqa: F811
    port = free_port()
    container = docker(
        engine, "run", "-d", "--name", f"{IMAGE_NAME}-{port}", "--network", "host", "--read-only", "--tmpfs", "/tmp",
        "-e", f"PORT={port}", "-e", "TOOLKIT_HOST=127.0.0.1", image["image"],
    ).stdout.strip()
    try:
        wait_ready(f"http://127.0.0.1:{port}", container, engine)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        data = np.random.default_rng(5).standard_normal((4, 16)).astype(np.float32)
        inputs = [httpclient.InferInput("INPUT0", [4, 16], "FP32")]
        inputs[0].set_data_from_numpy(data, binary_data=True)
        xml = image["repository"] / "ov_relu" / "1" / "model.xml"
        np.testing.assert_allclose(client.infer("ov_relu", inputs).as_numpy("OUTPUT0"),
                                   ovm.openvino_outputs(xml, {"INPUT0": data})["OUTPUT0"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(client.infer("ort_ov", inputs).as_numpy("OUTPUT0"),
                                   ovm.onnxruntime_outputs(image["source"], {"INPUT0": data})["OUTPUT0"], rtol=1e-5, atol=1e-5)

        for model in ("ov_relu", "ort_ov"):
            out = subprocess.run(
                [perf_analyzer(), "-u", f"127.0.0.1:{port}", "-m", model, "--concurrency-range", "2",
                 "--measurement-interval", "500", "--stability-percentage", "999", "--max-trials", "4"],
                capture_output=True, text=True, timeout=300,
            )
            assert out.returncode == 0, out.stdout + out.stderr
            stats = client.get_inference_statistics(model)["model_stats"][0]
            assert stats["inference_stats"]["success"]["count"] > 0 and stats["inference_stats"]["fail"]["count"] == 0
    finally:
        docker(engine, "rm", "-f", container, check=False)


def test_build_report_gives_size_and_cold_start(image) -> None:
    assert image["image_size"] > 0 and image["cold_start"]["seconds"] > 0
    models = {m["name"]: m for m in image["models"]}
    assert models["ov_relu"]["backend"] == "openvino"
