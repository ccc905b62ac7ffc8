"""Writes samples/triton-examples: the models tritonclient's example scripts talk to.

    python samples/make_triton_examples.py [DIR]      # default: samples/triton-examples

tritonclient's `simple_http_*` / `simple_grpc_*` examples expect the models of Triton's example
repository (`docs/examples/model_repository` of triton-inference-server/server). Those are made
here from scratch, with the same names, tensors and behaviour:

| model | backend | behaviour |
|---|---|---|
| `simple` | onnxruntime | INT32 `INPUT0`, `INPUT1` [-1, 16] -> `OUTPUT0` = sum, `OUTPUT1` = difference |
| `simple_int8` | onnxruntime | the same on INT8 (computed in INT32, cast back) |
| `simple_string` | onnxruntime | BYTES elements that are decimal integers -> their sum and difference, as BYTES |
| `simple_identity` | python | BYTES `INPUT0` [-1, -1] -> `OUTPUT0`, unchanged |

All batch (`max_batch_size: 8`). The sequence models of that repository (`simple_sequence`,
`simple_dyna_sequence`) are not made: the toolkit does not serve `sequence_batching`
(docs/triton-compatibility.md). The ONNX files are a few hundred bytes; `scripts/triton-client-examples.sh`
runs this script, so the repository can be rebuilt at any time.
"""

from __future__ import annotations

import sys
from pathlib import Path

import onnx
from onnx import TensorProto, helper

HERE = Path(__file__).resolve().parent / "triton-examples"

CONFIG = """\
# {comment}
name: "{name}"
{runtime}
max_batch_size: 8
input [
  {{ name: "INPUT0" data_type: {dtype} dims: [ {dims} ] }}{second_input}
]
output [
  {{ name: "OUTPUT0" data_type: {dtype} dims: [ {dims} ] }}{second_output}
]
"""

IDENTITY_MODEL = '''\
"""simple_identity: every request's INPUT0 comes back as OUTPUT0, unchanged."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests
        ]
'''


def _add_sub(path: Path, io_type: int, compute_type: int, name: str) -> None:
    """OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, computed in `compute_type`."""
    inputs = [helper.make_tensor_value_info(n, io_type, ["N", 16]) for n in ("INPUT0", "INPUT1")]
    outputs = [helper.make_tensor_value_info(n, io_type, ["N", 16]) for n in ("OUTPUT0", "OUTPUT1")]
    nodes = [
        helper.make_node("Cast", ["INPUT0"], ["a"], to=compute_type),
        helper.make_node("Cast", ["INPUT1"], ["b"], to=compute_type),
        helper.make_node("Add", ["a", "b"], ["sum"]),
        helper.make_node("Sub", ["a", "b"], ["difference"]),
        helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=io_type),
        helper.make_node("Cast", ["difference"], ["OUTPUT1"], to=io_type),
    ]
    model = helper.make_model(helper.make_graph(nodes, name, inputs, outputs), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model.producer_name = "samples/make_triton_examples.py"
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def _config(name: str, comment: str, runtime: str, dtype: str, dims: str, pair: bool) -> str:
    second = lambda tensor: f',\n  {{ name: "{tensor}" data_type: {dtype} dims: [ {dims} ] }}' if pair else ""
    return CONFIG.format(
        comment=comment, name=name, runtime=runtime, dtype=dtype, dims=dims,
        second_input=second("INPUT1"), second_output=second("OUTPUT1"),
    )


def write(root: Path) -> Path:
    onnx_models = {
        "simple": (TensorProto.INT32, "TYPE_INT32", "OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1"),
        "simple_int8": (TensorProto.INT8, "TYPE_INT8", "the same as simple, on INT8"),
        "simple_string": (TensorProto.STRING, "TYPE_STRING", "decimal integers as strings: their sum and difference"),
    }
    for name, (io_type, dtype, comment) in onnx_models.items():
        _add_sub(root / name / "1" / "model.onnx", io_type, TensorProto.INT32, name)
        (root / name / "config.pbtxt").write_text(
            _config(name, comment, 'platform: "onnxruntime_onnx"', dtype, "16", pair=True)
        )
    identity = root / "simple_identity"
    (identity / "1").mkdir(parents=True, exist_ok=True)
    (identity / "1" / "model.py").write_text(IDENTITY_MODEL)
    (identity / "config.pbtxt").write_text(
        _config("simple_identity", "OUTPUT0 = INPUT0 (python backend)", 'backend: "python"', "TYPE_STRING", "-1", pair=False)
    )
    return root


if __name__ == "__main__":
    print(write(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE))
