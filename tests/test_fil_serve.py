"""`backend: "fil"` models served by `toolkit serve`, driven by tritonclient and perf_analyzer.

Every model is trained here by its framework (XGBoost JSON / UBJSON / legacy binary, LightGBM,
scikit-learn forests through Treelite checkpoints); the server's output__0 must equal the
framework's own predict / predict_proba for the same rows (NaN = missing) within float32
rounding, with FIL's response shapes (dims [1] -> [rows], dims [k] -> [rows, k]).
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import fil_models
import numpy as np
import pytest
import tritonclient.http as httpclient
from serving import serve
from tools import perf_analyzer
from tritonclient.utils import InferenceServerException


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, dict[str, fil_models.FilCase]]:
    repo = tmp_path_factory.mktemp("fil") / "models"
    return repo, fil_models.all_models(repo)


@pytest.fixture(scope="module")
def server(models):
    repo, _ = models
    with serve(repo, "--device", "cpu") as s:
        yield s


def _infer(url: str, model: str, rows: np.ndarray, binary: bool = True) -> httpclient.InferResult:
    client = httpclient.InferenceServerClient(url)
    source = httpclient.InferInput("input__0", list(rows.shape), "FP32")
    source.set_data_from_numpy(rows, binary_data=binary)
    return client.infer(model, [source], outputs=[httpclient.InferRequestedOutput("output__0", binary_data=binary)])


def _stats(http: str, model: str) -> dict:
    with urllib.request.urlopen(f"{http}/v2/models/{model}/stats") as r:
        return json.load(r)["model_stats"][0]


CASES = ["xgb_multiclass", "xgb_multiclass_class", "xgb_binary_pair", "xgb_binary_positive", "xgb_binary_threshold",
         "xgb_regressor", "xgb_legacy", "lgb_multiclass", "lgb_binary_output_class", "lgb_regressor", "sk_forest",
         "sk_boosting"]


@pytest.mark.parametrize("name", CASES)
def test_outputs_equal_the_frameworks_own(server, models, name):
    _, cases = models
    case = cases[name]
    result = _infer(server.url, name, case.rows)
    got = result.as_numpy("output__0")
    per_row = [d for d in case.expected.shape[1:] if d != 1]
    assert list(got.shape) == [len(case.rows), *per_row]  # FIL's squeezed shape
    assert got.dtype == np.float32
    fil_models.assert_matches(name, got, case.expected)


def test_json_tensors_with_missing_values(server, models):
    """Rows sent as JSON (NaN cannot be JSON: the non-missing rows) give the same output."""
    _, cases = models
    case = cases["lgb_multiclass"]
    rows = case.rows[~np.isnan(case.rows).any(axis=1)]
    got = _infer(server.url, "lgb_multiclass", rows, binary=False).as_numpy("output__0")
    fil_models.assert_matches("lgb_multiclass", got, case.expected[~np.isnan(case.rows).any(axis=1)])


def test_concurrent_single_rows_are_batched_and_each_gets_its_own_answer(server, models):
    """48 one-row requests at once on the 2-instance LightGBM model (20 ms queue delay): each answer
    is that row's prediction, and the server ran them in fewer executions than requests (dynamic
    batching)."""
    _, cases = models
    case = cases["lgb_multiclass"]
    before = _stats(server.http, "lgb_multiclass")
    indices = [i % len(case.rows) for i in range(48)]
    with ThreadPoolExecutor(16) as pool:
        outputs = list(pool.map(lambda i: _infer(server.url, "lgb_multiclass", case.rows[i : i + 1]).as_numpy("output__0"), indices))
    for i, got in zip(indices, outputs):
        fil_models.assert_matches(f"row {i}", got, case.expected[i : i + 1])
    after = _stats(server.http, "lgb_multiclass")
    assert after["inference_count"] - before["inference_count"] == 48
    assert after["execution_count"] - before["execution_count"] < 48


def test_wrong_feature_count_is_refused_and_the_server_keeps_serving(server, models):
    _, cases = models
    with pytest.raises(InferenceServerException) as info:
        _infer(server.url, "xgb_multiclass", np.zeros((2, 5), np.float32))
    assert "unexpected shape for input 'input__0' for model 'xgb_multiclass'. Expected [-1,8], got [2,5]" in str(info.value)
    with pytest.raises(InferenceServerException) as info:
        client = httpclient.InferenceServerClient(server.url)
        wrong = httpclient.InferInput("input__0", [2, 8], "FP64")
        wrong.set_data_from_numpy(np.zeros((2, 8), np.float64))
        client.infer("xgb_multiclass", [wrong])
    assert "inference input 'input__0' data-type is 'FP64', but model 'xgb_multiclass' expects 'FP32'" in str(info.value)
    case = cases["xgb_multiclass"]
    fil_models.assert_matches("after errors", _infer(server.url, "xgb_multiclass", case.rows).as_numpy("output__0"), case.expected)


def test_model_config_and_metadata(server):
    client = httpclient.InferenceServerClient(server.url)
    metadata = client.get_model_metadata("xgb_binary_pair")
    assert metadata["inputs"] == [{"name": "input__0", "datatype": "FP32", "shape": [-1, 8]}]
    assert metadata["outputs"] == [{"name": "output__0", "datatype": "FP32", "shape": [-1, 2]}]
    config = client.get_model_config("xgb_binary_pair")
    assert config["backend"] == "fil"
    assert config["parameters"]["model_type"] == {"string_value": "xgboost_ubj"}


def test_perf_analyzer_drives_a_fil_model_and_validates_its_outputs(server, models, tmp_path):
    """perf_analyzer 2.51 sends the test rows (one per request, concurrency 2:8) and checks each
    response against XGBoost's own classes (validation_data): a wrong output fails the run."""
    _, cases = models
    case = cases["xgb_binary_threshold"]
    rows = case.rows[~np.isnan(case.rows).any(axis=1)][:16]  # JSON input data has no NaN
    expected = case.expected[~np.isnan(case.rows).any(axis=1)][:16]
    data = {
        "data": [{"input__0": {"content": [float(v) for v in row], "shape": [8]}} for row in rows],
        "validation_data": [{"output__0": {"content": [float(v)], "shape": [1]}} for v in expected],
    }
    (tmp_path / "data.json").write_text(json.dumps(data))
    before = _stats(server.http, "xgb_binary_threshold")
    out = subprocess.run(
        [perf_analyzer(), "-u", server.url, "-m", "xgb_binary_threshold", "--input-data", str(tmp_path / "data.json"),
         "--concurrency-range", "2:8:6", "--measurement-interval", "500", "--stability-percentage", "999",
         "--max-trials", "6"],
        check=False, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    measured = [int(n) for n in re.findall(r"Client: \n\s+Request count: (\d+)", out.stdout)]
    assert len(measured) == 2 and all(n > 0 for n in measured), out.stdout
    after = _stats(server.http, "xgb_binary_threshold")
    assert after["inference_stats"]["fail"]["count"] == before["inference_stats"]["fail"]["count"]
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"]["success"]["count"] >= sum(measured)


def test_grpc_clients_get_the_same_predictions(server, models):
    """tritonclient.grpc against the same server's gRPC port (Triton's inference.GRPCInferenceService)."""
    import tritonclient.grpc as grpcclient

    _, cases = models
    client = grpcclient.InferenceServerClient(server.grpc)
    for name in ("xgb_binary_pair", "lgb_regressor", "sk_forest"):
        case = cases[name]
        source = grpcclient.InferInput("input__0", list(case.rows.shape), "FP32")
        source.set_data_from_numpy(case.rows)
        got = client.infer(name, [source]).as_numpy("output__0")
        fil_models.assert_matches(name, got, case.expected)
