"""Regenerates the tiny ONNX files of samples/quickstart (committed; a few hundred bytes each).

    python samples/make_quickstart.py
"""

from pathlib import Path

import onnx
from onnx import TensorProto, helper

HERE = Path(__file__).parent / "quickstart"


def add_sub(path: Path) -> None:
    vin = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 16]) for n in ("INPUT0", "INPUT1")]
    vout = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["N", 16]) for n in ("OUTPUT0", "OUTPUT1")]
    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
    ]
    model = helper.make_model(helper.make_graph(nodes, "add_sub", vin, vout), opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    model.producer_name = "samples/make_quickstart.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


if __name__ == "__main__":
    add_sub(HERE / "add_sub" / "1" / "model.onnx")
