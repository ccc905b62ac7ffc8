"""scripts/tools/tritonserver: the real tritonserver 2.51 the project compares against (docs/tools.md).

A few quick checks of the tool itself (each starts the real server once): `validate` reports
tritonserver's own verdicts, which are those `toolkit validate` reproduces (the whole corpus is
tests/test_validation_oracle.py's job); `serve` runs ONNX models through the python backend with
dynamic batching on the ports the caller chose; and `toolkit serve` answers server metadata as
this tritonserver does, less the extensions it does not implement.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

import model_builders as mb
from conftest import write_config
from serving import ROOT, serve
from tools import serve_tritonserver, tritonserver

EXAMPLES = ROOT / "samples" / "triton-examples"


def _get(url: str) -> tuple[int, bytes]:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.status, response.read()


def test_validate_prints_tritonservers_verdicts_and_toolkit_validate_agrees(repo: Path):
    write_config(repo, "neg", 'backend: "python"\nmax_batch_size: -1\n')
    write_config(repo, "pref", """
        backend: "python"
        max_batch_size: 4
        dynamic_batching { preferred_batch_size: [ 8 ] }
    """)
    (repo / "ok" / "1").mkdir(parents=True)
    (repo / "ok" / "1" / "model.py").write_text((EXAMPLES / "simple_identity" / "1" / "model.py").read_text())
    write_config(repo, "ok", """
        backend: "python"
        max_batch_size: 2
        input [ { name: "INPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [ -1 ] } ]
    """)
    out = subprocess.run([tritonserver(), "validate", str(repo), "--json", "--configs"],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 1, out.stderr  # two models are INVALID
    result = json.loads(out.stdout)
    assert result["server"] == "tritonserver 2.51.0" and result["mode"] == "strict"
    verdicts = {m["name"]: m for m in result["models"]}
    assert verdicts["ok"]["state"] == "READY" and verdicts["ok"]["version"] == "1"
    assert verdicts["neg"]["state"] == verdicts["pref"]["state"] == "INVALID"
    assert result["configs"]["ok"]["max_batch_size"] == 2 and set(result["configs"]) == {"ok"}

    ours = subprocess.run([sys.executable, "-m", "toolkit.cli", "validate", str(repo), "--json",
                           "--disable-auto-complete-config"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    toolkit = {m["name"]: m for m in json.loads(ours.stdout)["models"]}
    for name in ("neg", "pref"):
        assert toolkit[name]["status"] == "INVALID" and toolkit[name]["error"] == verdicts[name]["reason"]
    assert toolkit["ok"]["status"] == "READY"


@pytest.fixture(scope="module")
def triton():
    """tritonserver 2.51 serving the tritonclient examples' models (samples/triton-examples)."""
    with serve_tritonserver(EXAMPLES) as server:
        yield server


def test_serve_runs_onnx_models_on_the_chosen_ports(triton):
    client = httpclient.InferenceServerClient(triton.http)
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 3, dtype=np.int32)
    inputs = [httpclient.InferInput("INPUT0", [2, 16], "INT32"), httpclient.InferInput("INPUT1", [2, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer("simple", inputs)
    assert (result.as_numpy("OUTPUT0") == a + b).all() and (result.as_numpy("OUTPUT1") == a - b).all()
    # The ONNX model runs in Triton's python backend (the tool's rewrite), BYTES through ORT included.
    assert client.get_model_metadata("simple")["platform"] == "python"
    strings = [httpclient.InferInput(n, [1, 16], "BYTES") for n in ("INPUT0", "INPUT1")]
    strings[0].set_data_from_numpy(np.array([[str(i).encode() for i in range(16)]], dtype=object))
    strings[1].set_data_from_numpy(np.array([[b"2"] * 16], dtype=object))
    result = client.infer("simple_string", strings)
    assert [int(x) for x in result.as_numpy("OUTPUT1")[0]] == [i - 2 for i in range(16)]

    status, body = _get(f"http://127.0.0.1:{triton.metrics_port}/metrics")
    assert status == 200 and b'nv_inference_request_success{model="simple",version="1"} 1\n' in body
    assert b'nv_inference_count{model="simple",version="1"} 2\n' in body  # one request of batch 2
    with socket.create_connection(("127.0.0.1", triton.grpc_port), timeout=5):
        pass  # tritonserver's gRPC endpoint listens on the port asked for


def test_toolkit_server_metadata_is_tritonservers_less_what_it_does_not_implement(triton):
    from handlers.protocol.routes import EXTENSIONS

    real = httpclient.InferenceServerClient(triton.http).get_server_metadata()
    with serve(EXAMPLES) as ours:
        metadata = httpclient.InferenceServerClient(ours.url).get_server_metadata()
    assert (metadata["name"], metadata["version"]) == (real["name"], real["version"]) == ("triton", "2.51.0")
    assert metadata["extensions"] == [e for e in real["extensions"] if e in EXTENSIONS] == EXTENSIONS
    assert metadata["toolkit_version"]  # the toolkit's identity, where clients do not look
