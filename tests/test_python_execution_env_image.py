"""EXECUTION_ENV_PATH in images: `toolkit build` puts each environment into the context once
(named by its content), leaves the archive out of the model copy, unpacks it in the image's
install stage, and the built Cloud Run image answers tritonclient from a model whose model.py
imports a package only its environment has, on the environment's interpreter, read-only.

The environment is execution_envs.py's stand-in for a conda-pack archive (conda's channels are
unreachable here): this interpreter's installation with numpy and a package made by the test.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from cli_runner import invoke
from execution_envs import make_environment, pack
from serving import free_port
from test_build_e2e import docker, engine, toolkit_build, wait_ready  # noqa: F401 - engine is a fixture
from test_python_execution_env import ENV_ONLY, env_model


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("env_image")
    environment = make_environment(base / "env", ENV_ONLY)
    repo = base / "models"
    directory = env_model(repo, "packed", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    pack(environment, directory / "env.tar.gz")
    shared = env_model(repo, "shared", "$$TRITON_MODEL_DIRECTORY/../packed/env.tar.gz")
    assert shared.is_dir()
    return repo


def test_context_carries_each_environment_once_unpacked_by_the_install_stage(tmp_path, repository):
    out = tmp_path / "ctx"
    result = invoke(["build", str(repository), "--target", "cloudrun", "--builder", "none", "--output", str(out), "-q"])
    assert result.exit_code == 0, result.output
    (archive,) = (out / "envs").iterdir()  # two models, one environment
    assert archive.name.endswith(".tar.gz")
    with tarfile.open(archive) as tar:
        assert "bin/python" in tar.getnames()
    assert not (out / "repository" / "packed" / "env.tar.gz").exists()  # not shipped twice
    manifest = json.loads((out / "repository" / "models.json").read_text())
    key = archive.name.split(".")[0]
    assert {m["name"]: m["execution_env"] for m in manifest["models"]} == {
        "packed": f"/opt/toolkit/envs/{key}", "shared": f"/opt/toolkit/envs/{key}"}
    dockerfile = (out / "Dockerfile").read_text()
    assert f"python3 -m handlers.backends.python.execution_env unpack /tmp/envs/{archive.name} /opt/toolkit/envs/{key}" in dockerfile


@pytest.mark.docker
def test_cloudrun_image_runs_the_model_on_its_environment(engine, tmp_path, repository):  # noqa: F811
    report = toolkit_build(engine, tmp_path / "ctx", "--target", "cloudrun", "--name", "envpath-e2e", repository=repository)
    image = report["image"]
    port = free_port()
    container = docker(engine, "run", "-d", "--network", "host", "--read-only", "--tmpfs", "/tmp",
                       "-e", f"PORT={port}", "-e", "TOOLKIT_HOST=127.0.0.1", image).stdout.strip()
    try:
        wait_ready(f"http://127.0.0.1:{port}", container, engine)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        for name in ("packed", "shared"):
            x = np.array([[1, 2, 3]], dtype=np.float32)
            inputs = [httpclient.InferInput("X", [1, 3], "FP32")]
            inputs[0].set_data_from_numpy(x)
            result = client.infer(name, inputs)
            np.testing.assert_array_equal(result.as_numpy("Y"), x + 42)
            executable, prefix = result.as_numpy("INFO")[0].decode().split("|")[:2]
            assert prefix.startswith("/opt/toolkit/envs/") and executable == f"{prefix}/bin/python"
        client.close()
    finally:
        docker(engine, "rm", "-f", container, check=False)
        docker(engine, "rmi", "-f", image, check=False)
