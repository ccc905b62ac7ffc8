"""Tiny ONNX models built with onnx.helper for tests (no committed binaries)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

Dim = int | str | None
OPSET = [helper.make_opsetid("", 17)]

TYPES = {
    "FP32": TensorProto.FLOAT, "FP16": TensorProto.FLOAT16, "FP64": TensorProto.DOUBLE,
    "INT8": TensorProto.INT8, "INT16": TensorProto.INT16, "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64, "UINT8": TensorProto.UINT8, "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32, "UINT64": TensorProto.UINT64, "BOOL": TensorProto.BOOL,
    "BYTES": TensorProto.STRING,
}


def _save(model: onnx.ModelProto, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def identity(path: Path, inputs: dict[str, tuple[str, Sequence[Dim]]], outputs: Sequence[str] | None = None) -> Path:
    """Each input passed through to an output (OUTPUT<i> unless names are given)."""
    names = list(outputs) if outputs else [f"OUTPUT{i}" for i in range(len(inputs))]
    vin, vout, nodes = [], [], []
    for (name, (dtype, shape)), out in zip(inputs.items(), names):
        vin.append(helper.make_tensor_value_info(name, TYPES[dtype], list(shape)))
        vout.append(helper.make_tensor_value_info(out, TYPES[dtype], list(shape)))
        nodes.append(helper.make_node("Identity", [name], [out]))
    return _save(helper.make_model(helper.make_graph(nodes, "identity", vin, vout), opset_imports=OPSET), path)


def add_sub(path: Path, dims: Sequence[Dim] = ("N", 16), dtype: str = "FP32") -> Path:
    """Triton's add_sub example: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1."""
    t = TYPES[dtype]
    vin = [helper.make_tensor_value_info(n, t, list(dims)) for n in ("INPUT0", "INPUT1")]
    vout = [helper.make_tensor_value_info(n, t, list(dims)) for n in ("OUTPUT0", "OUTPUT1")]
    nodes = [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]), helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])]
    return _save(helper.make_model(helper.make_graph(nodes, "add_sub", vin, vout), opset_imports=OPSET), path)


def matmul_relu(path: Path, size: int = 16, batch: Dim = "N", seed: int = 0) -> Path:
    """OUTPUT0 = relu(INPUT0 @ W), INPUT0 FP32 [batch, size]."""
    w = np.random.default_rng(seed).standard_normal((size, size)).astype(np.float32)
    vin = [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [batch, size])]
    vout = [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [batch, size])]
    nodes = [helper.make_node("MatMul", ["INPUT0", "W"], ["mm"]), helper.make_node("Relu", ["mm"], ["OUTPUT0"])]
    graph = helper.make_graph(nodes, "matmul_relu", vin, vout, initializer=[numpy_helper.from_array(w, "W")])
    return _save(helper.make_model(graph, opset_imports=OPSET), path)


# --- builders for tests/test_onnx_autocomplete.py -------------------------------------------------


def save_graph(
    path: Path,
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    nodes: Sequence[onnx.NodeProto],
    initializers: Sequence[onnx.TensorProto] = (),
    ir_version: int = 8,
    opsets: Sequence[onnx.OperatorSetIdProto] = tuple(OPSET),
    check: bool = True,
) -> Path:
    """Any graph, saved with the given IR version (the checker is skipped for custom domains)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    graph = helper.make_graph(list(nodes), "graph", list(inputs), list(outputs), initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=list(opsets))
    model.ir_version = ir_version
    if check:
        onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def initializer_input(path: Path, ir_version: int = 8) -> Path:
    """Y = X + W where W is a graph input that also has an initializer (a default value)."""
    w = numpy_helper.from_array(np.arange(4, dtype=np.float32), "W")
    vin = [
        helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 4]),
        helper.make_tensor_value_info("W", TensorProto.FLOAT, [4]),
    ]
    vout = [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["N", 4])]
    opsets = [helper.make_opsetid("", 8 if ir_version < 4 else 17)]
    return save_graph(path, vin, vout, [helper.make_node("Add", ["X", "W"], ["Y"])], [w], ir_version, opsets)


def passthrough(path: Path, dtype: int, in_shape: Sequence[Dim] | None, out_shape: Sequence[Dim] | None = None) -> Path:
    """OUT = Identity(IN) with any element type; a shape of None declares an unknown rank."""
    out_shape = in_shape if out_shape is None else out_shape
    vin = [helper.make_tensor_value_info("IN", dtype, None if in_shape is None else list(in_shape))]
    vout = [helper.make_tensor_value_info("OUT", dtype, None if out_shape is None else list(out_shape))]
    # onnx's checker insists on a shape for graph inputs and outputs; ORT does not.
    check = in_shape is not None and out_shape is not None
    return save_graph(path, vin, vout, [helper.make_node("Identity", ["IN"], ["OUT"])], check=check)


def sequence_input(path: Path) -> Path:
    """LEN = SequenceLength(SEQ): a non-tensor (sequence) input."""
    seq = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, ["N"]))
    vin = [helper.make_value_info("SEQ", seq)]
    vout = [helper.make_tensor_value_info("LEN", TensorProto.INT64, [])]
    return save_graph(path, vin, vout, [helper.make_node("SequenceLength", ["SEQ"], ["LEN"])])


def refined_output(path: Path) -> Path:
    """OUT = IN declared with shape [q, r]; ONNX shape inference knows it is [N, 16]."""
    vin = [helper.make_tensor_value_info("IN", TensorProto.FLOAT, ["N", 16])]
    vout = [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["q", "r"])]
    return save_graph(path, vin, vout, [helper.make_node("Relu", ["IN"], ["OUT"])])


def custom_op(path: Path) -> Path:
    """OUT = com.example.MyOp(IN): an operator from a custom-op library ORT does not know."""
    vin = [helper.make_tensor_value_info("IN", TensorProto.FLOAT, ["N", 8])]
    vout = [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["N", 8])]
    opsets = [*OPSET, helper.make_opsetid("com.example", 1)]
    node = helper.make_node("MyOp", ["IN"], ["OUT"], domain="com.example")
    return save_graph(path, vin, vout, [node], opsets=opsets, check=False)


def external_data_directory(directory: Path, size: int = 64) -> Path:
    """A model directory (`<version>/model.onnx/`) holding model.onnx plus its weights file."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    w = np.random.default_rng(0).standard_normal((size, size)).astype(np.float32)
    vin = [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["N", size])]
    vout = [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["N", size])]
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["INPUT0", "W"], ["OUTPUT0"])], "external", vin, vout,
        initializer=[numpy_helper.from_array(w, "W")],
    )
    model = helper.make_model(graph, opset_imports=OPSET)
    model.ir_version = 8
    onnx.save(model, str(directory / "model.onnx"), save_as_external_data=True, location="weights.bin", size_threshold=0)
    return directory


def text_recognition(path: Path, seed: int = 0) -> Path:
    """The seeds' text_recognition signature: `input.1` FP32 [N,1,32,100] -> `308` FP32 [N,26,37]
    (a single strided convolution standing in for the ResNet + CTC head; random weights)."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((37, 1, 32, 3)) * 0.05).astype(np.float32)
    vin = [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, ["N", 1, 32, 100])]
    vout = [helper.make_tensor_value_info("308", TensorProto.FLOAT, ["N", 26, 37])]
    nodes = [
        helper.make_node("Conv", ["input.1", "W"], ["c"], kernel_shape=[32, 3], strides=[1, 4], pads=[0, 2, 0, 2]),
        helper.make_node("Squeeze", ["c", "axes"], ["s"]),
        helper.make_node("Transpose", ["s"], ["308"], perm=[0, 2, 1]),
    ]
    graph = helper.make_graph(
        nodes, "text_recognition", vin, vout,
        initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array([2], np.int64), "axes")],
    )
    return _save(helper.make_model(graph, opset_imports=OPSET), path)


def slow_chain(path: Path, size: int = 512, depth: int = 16, seed: int = 0, batch: Dim = "N") -> Path:
    """OUTPUT0 = tanh applied after `depth` MatMuls with one shared [size, size] weight: a model
    whose execution takes long enough to observe in-flight requests (INPUT0 FP32 [N, size])."""
    w = (np.random.default_rng(seed).standard_normal((size, size)) / np.sqrt(size)).astype(np.float32)
    vin = [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [batch, size])]
    vout = [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [batch, size])]
    nodes, previous = [], "INPUT0"
    for i in range(depth):
        nodes.append(helper.make_node("MatMul", [previous, "W"], [f"m{i}"]))
        previous = f"m{i}"
    nodes.append(helper.make_node("Tanh", [previous], ["OUTPUT0"]))
    graph = helper.make_graph(nodes, "slow_chain", vin, vout, initializer=[numpy_helper.from_array(w, "W")])
    return _save(helper.make_model(graph, opset_imports=OPSET), path)
