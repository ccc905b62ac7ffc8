"""A repository of `backend: "fil"` models in a built image (real container engine, as
tests/test_build_e2e.py): XGBoost JSON and legacy binary, LightGBM and a scikit-learn forest
(Treelite checkpoint) trained here; the running container is driven by tritonclient and
perf_analyzer, and its outputs are the frameworks' own. The image carries Treelite's library
and nothing of scipy, the frameworks, ONNX Runtime or CUDA."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import fil_models
import numpy as np
import pytest
import tritonclient.http as httpclient
from serving import free_port
from test_build_e2e import docker, engine, toolkit_build, wait_ready  # noqa: F401 (engine is a fixture)
from tools import perf_analyzer

pytestmark = pytest.mark.docker

SERVED = ("xgb_multiclass", "xgb_binary_threshold", "xgb_legacy", "lgb_binary_output_class", "sk_forest")


@pytest.fixture(scope="module")
def fil_image(engine: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    root = tmp_path_factory.mktemp("fil-image")
    trained = root / "trained"
    cases = fil_models.all_models(trained)
    repo = root / "models"
    for name in SERVED:
        shutil.copytree(trained / name, repo / name)
    report = toolkit_build(engine, root / "ctx", "--target", "cloudrun", "--name", "fil-e2e", repository=repo)
    report["cases"] = {name: cases[name] for name in SERVED}
    yield report
    docker(engine, "rmi", "-f", report["image"], check=False)


def test_fil_image_carries_treelite_and_no_other_framework(engine: dict[str, str], fil_image: dict) -> None:  # noqa: F811
    deps = set(fil_image["python_deps"])
    assert "treelite" in deps
    assert not deps & {"scipy", "xgboost", "xgboost-cpu", "lightgbm", "scikit-learn", "onnxruntime", "openvino", "packaging"}
    assert not any(d.startswith("nvidia") for d in deps)
    check = (
        "import importlib.util as u, pathlib; "
        "print(sorted(m for m in ('scipy', 'xgboost', 'lightgbm', 'sklearn', 'onnxruntime', 'openvino') if u.find_spec(m))); "
        "print(sorted(str(p.name) for p in pathlib.Path('/').rglob('libcu*.so*')))"
    )
    found = docker(engine, "run", "--rm", "--network", "none", "--entrypoint", "python3", fil_image["image"], "-c", check).stdout
    assert found.split() == ["[]", "[]"], found


def test_fil_image_serves_the_frameworks_predictions(engine: dict[str, str], fil_image: dict, tmp_path: Path) -> None:  # noqa: F811
    port = free_port()
    container = docker(
        engine, "run", "-d", "--name", f"fil-e2e-{port}", "--network", "host", "--read-only", "--tmpfs", "/tmp",
        "--cpus", "1", "-e", f"PORT={port}", "-e", "TOOLKIT_HOST=127.0.0.1", fil_image["image"],
    ).stdout.strip()
    try:
        wait_ready(f"http://127.0.0.1:{port}", container, engine)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        for name, case in fil_image["cases"].items():
            source = httpclient.InferInput("input__0", list(case.rows.shape), "FP32")
            source.set_data_from_numpy(case.rows)
            got = client.infer(name, [source]).as_numpy("output__0")
            fil_models.assert_matches(name, got, case.expected)

        case = fil_image["cases"]["xgb_binary_threshold"]
        clean = ~np.isnan(case.rows).any(axis=1)
        data = {
            "data": [{"input__0": {"content": [float(v) for v in row], "shape": [8]}} for row in case.rows[clean]],
            "validation_data": [{"output__0": {"content": [float(v)], "shape": [1]}} for v in case.expected[clean]],
        }
        (tmp_path / "data.json").write_text(json.dumps(data))
        out = subprocess.run(
            [perf_analyzer(), "-u", f"127.0.0.1:{port}", "-m", "xgb_binary_threshold", "--input-data",
             str(tmp_path / "data.json"), "--concurrency-range", "4", "--measurement-interval", "500",
             "--stability-percentage", "999", "--max-trials", "4"],
            check=False, capture_output=True, text=True, timeout=300,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert int(re.findall(r"Client: \n\s+Request count: (\d+)", out.stdout)[0]) > 0
    finally:
        docker(engine, "rm", "-f", container, check=False)
