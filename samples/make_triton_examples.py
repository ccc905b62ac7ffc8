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

| `simple_sequence` | onnxruntime | `sequence_batching` (direct), controls START and READY: `OUTPUT` = READY x (`INPUT` + START) |
| `simple_dyna_sequence` | onnxruntime | `sequence_batching` (oldest, 2 instances), controls START, END, READY and CORRID: `OUTPUT` = READY x (`INPUT` + START + END x CORRID) |
| `simple_string_dyna_sequence` | python | `sequence_batching` (oldest), a STRING CORRID: `OUTPUT` = the sum of the sequence's `INPUT`s so far, plus the correlation ID (a decimal string) on its last request |

All batch (`max_batch_size: 8`). The ONNX files are a few hundred bytes; `scripts/triton-client-examples.sh`
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


def _save(path: Path, name: str, nodes: list, inputs: list, outputs: list) -> None:
    model = helper.make_model(helper.make_graph(nodes, name, inputs, outputs), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model.producer_name = "samples/make_triton_examples.py"
    onnx.checker.check_model(model)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


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
    _save(path, name, nodes, inputs, outputs)


SEQUENCE_CONFIG = """\
# {comment}
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {{
{strategy}  control_input [
{controls}
  ]
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
"""
BOOLEAN_CONTROL = '    {{ name: "{name}" control [ {{ kind: CONTROL_SEQUENCE_{name} int32_false_true: [ 0, 1 ] }} ] }}'
CORRID_CONTROL = '    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }'


STRING_DYNA_MODEL = '''\
"""simple_string_dyna_sequence: each sequence (a decimal string correlation ID) accumulates its
INPUTs; OUTPUT is the sum so far, and on the sequence's last request the sum plus the ID."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = lambda name: pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0]
            corrid = value("CORRID")
            corrid = corrid.decode() if isinstance(corrid, bytes) else str(corrid)
            if value("START"):
                self.sums[corrid] = 0
            self.sums[corrid] = self.sums.get(corrid, 0) + int(value("INPUT"))
            output = self.sums[corrid]
            if value("END"):
                output += int(corrid)
                del self.sums[corrid]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.array([[output]], np.int32))]))
        return responses
'''
STRING_DYNA_CONFIG = """\
# the sum of a sequence's INPUTs so far; its last request adds the correlation ID (python backend)
name: "simple_string_dyna_sequence"
backend: "python"
max_batch_size: 8
sequence_batching {
  max_sequence_idle_microseconds: 10000000
  oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""


def _sequence(path: Path, name: str, with_end: bool) -> None:
    """OUTPUT = READY * (INPUT + START [+ END * CORRID]), in INT32; the controls are [-1, 1]."""
    controls = ["START", "END", "READY"] if with_end else ["START", "READY"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT32, ["N", 1]) for n in ["INPUT", *controls]]
    nodes = [helper.make_node("Add", ["INPUT", "START"], ["started"])]
    total = "started"
    if with_end:
        inputs.append(helper.make_tensor_value_info("CORRID", TensorProto.UINT64, ["N", 1]))
        nodes += [
            helper.make_node("Cast", ["CORRID"], ["corrid"], to=TensorProto.INT32),
            helper.make_node("Mul", ["END", "corrid"], ["ending"]),
            helper.make_node("Add", ["started", "ending"], ["total"]),
        ]
        total = "total"
    nodes.append(helper.make_node("Mul", ["READY", total], ["OUTPUT"]))
    outputs = [helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, ["N", 1])]
    _save(path, name, nodes, inputs, outputs)


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
    sequences = {
        "simple_sequence": (False, "", 1, "OUTPUT = READY * (INPUT + START): the first request of a sequence adds 1"),
        "simple_dyna_sequence": (
            True,
            "  max_sequence_idle_microseconds: 10000000\n"
            "  oldest { max_candidate_sequences: 1024 max_queue_delay_microseconds: 10000 }\n",
            2,
            "OUTPUT = READY * (INPUT + START + END * CORRID): the last request of a sequence adds its correlation ID",
        ),
    }
    for name, (with_end, strategy, count, comment) in sequences.items():
        _sequence(root / name / "1" / "model.onnx", name, with_end)
        controls = [BOOLEAN_CONTROL.format(name=n) for n in (("START", "END", "READY") if with_end else ("START", "READY"))]
        if with_end:
            controls.append(CORRID_CONTROL)
        (root / name / "config.pbtxt").write_text(SEQUENCE_CONFIG.format(
            comment=comment, name=name, strategy=strategy, controls=",\n".join(controls), count=count))
    string_dyna = root / "simple_string_dyna_sequence"
    (string_dyna / "1").mkdir(parents=True, exist_ok=True)
    (string_dyna / "1" / "model.py").write_text(STRING_DYNA_MODEL)
    (string_dyna / "config.pbtxt").write_text(STRING_DYNA_CONFIG)
    return root


if __name__ == "__main__":
    print(write(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE))
