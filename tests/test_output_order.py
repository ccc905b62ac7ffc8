"""The order of a response's outputs, as the model's Triton backend adds them to its response:
the model's own order for Python models (python_backend's InferResponse::Send walks the list
the model returned), by name for onnxruntime and pytorch (their outputs are a std::map), the
config's order for openvino (its ReadOutputTensors walks the config). Served by `toolkit serve`
and read by tritonclient over HTTP (JSON and binary) and gRPC, and by a Python model's BLS call
(its response's `output_tensors()`)."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from python_models.repository import python_model
from serving import serve

import model_builders as mb
from handlers.model_io import ModelIO

CLASSIFIER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            out.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("LABEL", np.array([[b"positive"]] * len(x), dtype=object)),
                pb_utils.Tensor("CONFIDENCE", x[:, :1] * 0 + 0.9),
                pb_utils.Tensor("B_SCORE", x[:, :1]),
            ]))
        return out
"""
CALLER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X")
            called = pb_utils.InferenceRequest(model_name="onnx", inputs=[x], requested_output_names=["Z", "A"]).exec()
            names = ",".join(t.name() for t in called.output_tensors())
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("NAMES", np.array([names.encode()], dtype=object))]))
        return out
"""
OUTPUTS = """
output [
  { name: "CONFIDENCE" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "B_SCORE" data_type: TYPE_FP32 dims: [ 1 ] },
  { name: "LABEL" data_type: TYPE_STRING dims: [ 1 ] }
]
"""


def _config(backend: str) -> dict:
    return {"name": "m", "backend": backend, "max_batch_size": 4,
            "output": [{"name": n, "data_type": "TYPE_FP32", "dims": [1]} for n in ("Z", "A", "M")]}


@pytest.mark.parametrize("backend, expected", [
    ("python", ["M", "Z", "A"]),  # as the model returned them
    ("onnxruntime", ["A", "M", "Z"]),
    ("pytorch", ["A", "M", "Z"]),
    ("openvino", ["Z", "A", "M"]),  # the config's
    ("fil", ["Z", "A", "M"]),
])
def test_each_backend_answers_in_its_tritons_order(backend, expected):
    assert ModelIO(_config(backend)).response_order(iter(["M", "Z", "A"])) == expected


def test_an_ensemble_and_a_platform_only_config_answer_by_name():
    assert ModelIO({**_config(""), "platform": "ensemble"}).response_order(["M", "Z", "A"]) == ["A", "M", "Z"]
    assert ModelIO({**_config(""), "platform": "onnxruntime_onnx"}).response_order(["M", "Z", "A"]) == ["A", "M", "Z"]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("output-order") / "models"
    python_model(repo, "classifier", None, f"""
        name: "classifier"
        backend: "python"
        max_batch_size: 4
        input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 2 ] }} ]
        {OUTPUTS}
        """, source=CLASSIFIER)
    (repo / "onnx" / "1").mkdir(parents=True)
    (repo / "onnx" / "config.pbtxt").write_text(
        'name: "onnx"\nbackend: "onnxruntime"\nmax_batch_size: 4\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]\n'
        'output [ { name: "Z" data_type: TYPE_FP32 dims: [ 2 ] }, { name: "A" data_type: TYPE_FP32 dims: [ 2 ] } ]\n')
    mb.save_graph(repo / "onnx" / "1" / "model.onnx",
                  [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 2])],
                  [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 2]) for n in ("Z", "A")],
                  [helper.make_node("Identity", ["X"], ["Z"]), helper.make_node("Neg", ["X"], ["A"])])
    python_model(repo, "caller", None, """
        name: "caller"
        backend: "python"
        max_batch_size: 0
        input [ { name: "X" data_type: TYPE_FP32 dims: [ 2, 2 ] } ]
        output [ { name: "NAMES" data_type: TYPE_STRING dims: [ 1 ] } ]
        """, source=CALLER)
    with serve(repo, "--device", "cpu") as running:
        yield running


def _http(server, model: str, binary: bool, outputs: list[str] | None) -> list[str]:
    client = httpclient.InferenceServerClient(server.url)
    try:
        x = httpclient.InferInput("X", [2, 2], "FP32")
        x.set_data_from_numpy(np.ones((2, 2), np.float32), binary_data=binary)
        requested = None if outputs is None else [httpclient.InferRequestedOutput(n, binary_data=binary) for n in outputs]
        result = client.infer(model, [x], outputs=requested)
        return [o["name"] for o in result.get_response()["outputs"]]
    finally:
        client.close()


def _grpc(server, model: str, outputs: list[str] | None) -> list[str]:
    client = grpcclient.InferenceServerClient(server.grpc)
    try:
        x = grpcclient.InferInput("X", [2, 2], "FP32")
        x.set_data_from_numpy(np.ones((2, 2), np.float32))
        requested = None if outputs is None else [grpcclient.InferRequestedOutput(n) for n in outputs]
        return [o.name for o in client.infer(model, [x], outputs=requested).get_response().outputs]
    finally:
        client.close()


@pytest.mark.parametrize("outputs", [None, ["CONFIDENCE", "LABEL"], ["B_SCORE", "LABEL", "CONFIDENCE"]])
def test_a_python_models_outputs_come_in_the_order_the_model_returned_them(server, outputs):
    """Requested outputs are a filter, not an order (python_backend prunes the model's list)."""
    expected = [n for n in ("LABEL", "CONFIDENCE", "B_SCORE") if outputs is None or n in outputs]
    assert _http(server, "classifier", True, outputs) == expected
    assert _http(server, "classifier", False, outputs) == expected
    assert _grpc(server, "classifier", outputs) == expected


def test_an_onnx_models_outputs_come_by_name(server):
    assert _http(server, "onnx", True, None) == ["A", "Z"]
    assert _http(server, "onnx", False, ["Z", "A"]) == ["A", "Z"]
    assert _grpc(server, "onnx", ["Z", "A"]) == ["A", "Z"]


def test_a_bls_callers_response_lists_the_called_models_outputs_in_its_backends_order(server):
    client = httpclient.InferenceServerClient(server.url)
    try:
        x = httpclient.InferInput("X", [2, 2], "FP32")
        x.set_data_from_numpy(np.ones((2, 2), np.float32))
        assert client.infer("caller", [x]).as_numpy("NAMES").tolist() == [b"A,Z"]
    finally:
        client.close()
