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
