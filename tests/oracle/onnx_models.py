"""ONNX models for the oracle corpus, built with onnx.helper (see materialize.py)."""

from __future__ import annotations

from pathlib import Path

import model_builders as mb
from onnx import TensorProto, helper


def identity(path: Path, inputs: dict[str, list], outputs: list[str] | None = None) -> Path:
    """Each input [dtype, shape] passed through to the output of the same position."""
    return mb.identity(path, {name: (dtype, shape) for name, (dtype, shape) in inputs.items()}, outputs)


def add_sub(path: Path, dims: list | None = None, dtype: str = "FP32") -> Path:
    return mb.add_sub(path, dims or ["N", 16], dtype)


def text_recognition(path: Path) -> Path:
    """`input.1` FP32 [N,1,32,100] -> `308` FP32 [N,26,37]."""
    return mb.text_recognition(path)


def text_detection(path: Path) -> Path:
    """A model matching the text_detection config of Triton's conceptual guide (max_batch_size 256,
    dims [-1,-1,-1,3]): `input_images:0` FP32 [N,-1,-1,-1,3] -> `feature_fusion/Conv_7/Sigmoid:0`
    [N,-1,-1,-1,1] and `feature_fusion/concat_3:0` [N,-1,-1,-1,5]."""
    dims = ["N", "D", "H", "W"]
    vin = [helper.make_tensor_value_info("input_images:0", TensorProto.FLOAT, [*dims, 3])]
    vout = [
        helper.make_tensor_value_info("feature_fusion/Conv_7/Sigmoid:0", TensorProto.FLOAT, [*dims, 1]),
        helper.make_tensor_value_info("feature_fusion/concat_3:0", TensorProto.FLOAT, [*dims, 5]),
    ]
    nodes = [
        helper.make_node("ReduceMean", ["input_images:0"], ["mean"], axes=[4], keepdims=1),
        helper.make_node("Sigmoid", ["mean"], ["feature_fusion/Conv_7/Sigmoid:0"]),
        helper.make_node(
            "Concat", ["input_images:0", "mean", "mean"], ["feature_fusion/concat_3:0"], axis=4
        ),
    ]
    return mb.save_graph(path, vin, vout, nodes)
