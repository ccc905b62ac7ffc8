"""A TorchScript repository built into a Cloud Run image by a real container engine, run with a
read-only root, and driven by tritonclient and perf_analyzer; outputs are compared with torch's.

One torch image per test run (torch makes images large and builds slow): the build measures its
cold start, and the report says what the pytorch backend adds. Engine set-up and skipping rules
are test_build_e2e.py's (TOOLKIT_REQUIRE_DOCKER=1 makes a missing engine a failure).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch_models as tm
import tritonclient.http as httpclient
from serving import free_port
from test_build_e2e import docker, engine, toolkit_build, wait_ready  # noqa: F401  (engine is a fixture)
from tools import perf_analyzer

pytestmark = [pytest.mark.docker, pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")]

F32 = "TYPE_FP32"


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("torch-image") / "models"
    tm.write_model(
        repo, "linear",
        tm.config("linear", [tm.tensor("INPUT__0", F32, [16])], [tm.tensor("OUTPUT__0", F32, [4])], max_batch_size=8, extra="""
dynamic_batching { max_queue_delay_microseconds: 1000 }
instance_group [ { count: 2 kind: KIND_CPU } ]
model_warmup [ { name: "zeros" batch_size: 1 inputs { key: "INPUT__0" value { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } } } ]
"""),
        lambda p: tm.save_trace(tm.Linear(), torch.zeros(1, 16), p),
    )
    tm.write_model(
        repo, "upper",
        tm.config("upper", [tm.tensor("words", "TYPE_STRING", [-1])],
                  [tm.tensor("OUTPUT__0", "TYPE_STRING", [-1]), tm.tensor("OUTPUT__1", "TYPE_INT64", [-1])]),
        lambda p: tm.save_script(tm.Upper(), p),
    )
    return repo


@pytest.fixture(scope="module")
def image(engine: dict[str, str], repository: Path, tmp_path_factory) -> dict:  # noqa: F811
    output = tmp_path_factory.mktemp("pytorch-cloudrun") / "ctx"
    report = toolkit_build(engine, output, "--target", "cloudrun", "--name", "pytorch-e2e", "--measure-cold-start",
                           repository=repository)
    yield report
    docker(engine, "rmi", "-f", report["image"], check=False)


def test_the_image_carries_torchs_cpu_build_and_nothing_the_models_do_not_need(engine, image):  # noqa: F811
    deps = image["python_deps"]
    assert deps["torch"] == "2.13.0+cpu"
    unwanted = {"onnxruntime", "sympy", "networkx", "jinja2", "fsspec", "filelock", "setuptools", "triton", "mpmath"}
    assert not set(deps) & unwanted and not any(name.startswith("nvidia-") for name in deps)
    (backend,) = image["backends"]
    assert backend["backends"] == ["pytorch"] and backend["models"] == ["linear", "upper"]
    assert backend["distributions"] == {"torch": "2.13.0+cpu"} and backend["installed_bytes"] > 300_000_000
    assert image["cold_start"]["measured"] and backend["ready_seconds"] is not None
    assert 0 < backend["ready_seconds"] < image["cold_start"]["seconds"]
    check = "import importlib.util as u; print(sorted(m for m in ('onnxruntime', 'sympy', 'jinja2', 'toolkit') if u.find_spec(m)))"
    found = docker(engine, "run", "--rm", "--network", "none", "--entrypoint", "python3", image["image"], "-c", check).stdout
    assert found.strip() == "[]"
    print(f"pytorch cloudrun image: {image['image_size'] / 1e6:.0f} MB, cold start {image['cold_start']['seconds']} s, "
          f"torch adds {backend['installed_bytes'] / 1e6:.0f} MB, models ready in {backend['ready_seconds']} s")


def test_the_image_serves_tritonclient_and_perf_analyzer(engine, image, repository):  # noqa: F811
    port = free_port()
    container = docker(
        engine, "run", "-d", "--network", "host", "--read-only", "--tmpfs", "/tmp", "-e", f"PORT={port}",
        "-e", "TOOLKIT_HOST=127.0.0.1", image["image"],
    ).stdout.strip()
    try:
        wait_ready(f"http://127.0.0.1:{port}", container, engine)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}", concurrency=8)
        assert client.get_model_metadata("linear")["platform"] == "pytorch_libtorch"

        module = torch.jit.load(str(repository / "linear" / "1" / "model.pt"))
        rng = np.random.default_rng(3)
        cases = [rng.standard_normal((1 + i % 3, 16)).astype(np.float32) for i in range(24)]
        pending = []
        for x in cases:
            tensor = httpclient.InferInput("INPUT__0", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            pending.append(client.async_infer("linear", [tensor]))
        for x, request in zip(cases, pending):
            expected = module(torch.from_numpy(x)).detach().numpy()
            np.testing.assert_allclose(request.get_result(timeout=60).as_numpy("OUTPUT__0"), expected, rtol=1e-5, atol=1e-6)

        words = httpclient.InferInput("words", [2], "BYTES")
        words.set_data_from_numpy(np.array([b"cold", b"start"], dtype=object))
        result = client.infer("upper", [words])
        assert result.as_numpy("OUTPUT__0").tolist() == [b"COLD", b"START"]
        assert result.as_numpy("OUTPUT__1").tolist() == [4, 5]

        out = subprocess.run(
            [perf_analyzer(), "-u", f"127.0.0.1:{port}", "-m", "linear", "-b", "2", "--shape", "INPUT__0:16",
             "--concurrency-range", "4:4", "--measurement-interval", "500", "--stability-percentage", "999",
             "--max-trials", "3"],
            capture_output=True, text=True, timeout=300,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert re.search(r"Throughput: [\d.]+ infer/sec", out.stdout), out.stdout

        docker(engine, "stop", "--time", "30", container)
        state = json.loads(docker(engine, "inspect", "--format", "{{json .State}}", container).stdout)
        assert state["ExitCode"] == 0, docker(engine, "logs", container).stderr
    finally:
        docker(engine, "rm", "-f", container, check=False)
