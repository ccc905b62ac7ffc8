"""The benchmark's ONNX models, built with onnx.helper (random weights: timing only).

- `text_recognition`: the seeds' text recognition model, shaped as deep-text-recognition-benchmark's
  None-ResNet-None-CTC (the model of Triton's conceptual guide, part 2): input `input.1` FP32
  [N, 1, 32, 100] -> output `308` FP32 [N, 26, 37]. ResNet feature extractor with that
  repository's layout (conv0 pair, max-pool, 1/2/5/3 residual BasicBlocks with a conv after each
  stage, the (2,1)-strided pools that keep the width, the 2x2 convs that end at height 1 and width
  26), then the CTC head: a Linear layer to 37 classes per time step. `width` scales every
  channel count (1.0 is the original 32/64/128/256/512); BatchNorm is folded into the convs, as an
  exported inference graph has it. The benchmark uses width 0.25: ~1/16 of the original's FLOPs,
  so one run of every configuration finishes in minutes on 2 cores (bench prints the
  per-inference cost it measured).
- `tiny`: OUTPUT0 = relu(INPUT0 @ W), INPUT0 FP32 [N, 16] (tests/model_builders.matmul_relu): an
  overhead-bound model, for the per-request cost of the serving stack itself.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
OPSET = [helper.make_opsetid("", 17)]
CLASSES = 37  # 36 characters + the CTC blank
TIME_STEPS = 26


class _Graph:
    """Collects nodes and initializers; every tensor gets a fresh name."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def name(self, prefix: str) -> str:
        self._count += 1
        return f"{prefix}_{self._count}"

    def weight(self, shape: tuple[int, ...], fan_in: int) -> str:
        name = self.name("w")
        value = (self.rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def bias(self, size: int) -> str:
        name = self.name("b")
        self.initializers.append(numpy_helper.from_array(np.zeros(size, np.float32), name))
        return name

    def conv(self, x: str, cin: int, cout: int, kernel: tuple[int, int], stride=(1, 1), pads=(0, 0, 0, 0),
             relu: bool = True) -> str:
        w = self.weight((cout, cin, *kernel), cin * kernel[0] * kernel[1])
        out = self.name("conv")
        self.nodes.append(helper.make_node("Conv", [x, w, self.bias(cout)], [out], kernel_shape=list(kernel),
                                           strides=list(stride), pads=list(pads)))
        return self.relu(out) if relu else out

    def relu(self, x: str) -> str:
        out = self.name("relu")
        self.nodes.append(helper.make_node("Relu", [x], [out]))
        return out

    def maxpool(self, x: str, kernel=(2, 2), stride=(2, 2), pads=(0, 0, 0, 0)) -> str:
        out = self.name("pool")
        self.nodes.append(helper.make_node("MaxPool", [x], [out], kernel_shape=list(kernel), strides=list(stride),
                                           pads=list(pads)))
        return out

    def basic_block(self, x: str, cin: int, cout: int) -> str:
        """ResNet BasicBlock: two 3x3 convs, a 1x1 projection when the channels change."""
        y = self.conv(x, cin, cout, (3, 3), pads=(1, 1, 1, 1))
        y = self.conv(y, cout, cout, (3, 3), pads=(1, 1, 1, 1), relu=False)
        shortcut = x if cin == cout else self.conv(x, cin, cout, (1, 1), relu=False)
        out = self.name("add")
        self.nodes.append(helper.make_node("Add", [y, shortcut], [out]))
        return self.relu(out)

    def stage(self, x: str, cin: int, cout: int, blocks: int) -> str:
        for i in range(blocks):
            x = self.basic_block(x, cin if i == 0 else cout, cout)
        return x


def text_recognition(path: Path, width: float = 0.25, seed: int = 0) -> Path:
    """See the module doc. Returns `path`."""
    c = [max(4, int(round(n * width))) for n in (32, 64, 128, 256, 512)]  # 512/4, 512/2, 512, 512 in the original
    g = _Graph(seed)
    x = g.conv("input.1", 1, c[0], (3, 3), pads=(1, 1, 1, 1))  # conv0_1: 32x100
    x = g.conv(x, c[0], c[1], (3, 3), pads=(1, 1, 1, 1))  # conv0_2
    x = g.maxpool(x)  # 16x50
    x = g.stage(x, c[1], c[2], 1)  # layer1
    x = g.conv(x, c[2], c[2], (3, 3), pads=(1, 1, 1, 1))  # conv1
    x = g.maxpool(x)  # 8x25
    x = g.stage(x, c[2], c[3], 2)  # layer2
    x = g.conv(x, c[3], c[3], (3, 3), pads=(1, 1, 1, 1))  # conv2
    x = g.maxpool(x, stride=(2, 1), pads=(0, 1, 0, 1))  # 4x26
    x = g.stage(x, c[3], c[4], 5)  # layer3
    x = g.conv(x, c[4], c[4], (3, 3), pads=(1, 1, 1, 1))  # conv3
    x = g.stage(x, c[4], c[4], 3)  # layer4
    x = g.conv(x, c[4], c[4], (2, 2), stride=(2, 1), pads=(0, 1, 0, 1))  # conv4_1: 2x27
    x = g.conv(x, c[4], c[4], (2, 2))  # conv4_2: 1x26
    # AdaptiveAvgPool((None, 1)) over the height of 1, then [N, C, 26] -> [N, 26, C]
    squeezed = g.name("squeeze")
    axes = g.name("axes")
    g.initializers.append(numpy_helper.from_array(np.array([2], np.int64), axes))
    g.nodes.append(helper.make_node("Squeeze", [x, axes], [squeezed]))
    sequence = g.name("seq")
    g.nodes.append(helper.make_node("Transpose", [squeezed], [sequence], perm=[0, 2, 1]))
    # CTC head: Linear(C, 37) per time step
    w = g.weight((c[4], CLASSES), c[4])
    logits = g.name("mm")
    g.nodes.append(helper.make_node("MatMul", [sequence, w], [logits]))
    g.nodes.append(helper.make_node("Add", [logits, g.bias(CLASSES)], ["308"]))

    vin = [helper.make_tensor_value_info("input.1", TensorProto.FLOAT, ["N", 1, 32, 100])]
    vout = [helper.make_tensor_value_info("308", TensorProto.FLOAT, ["N", TIME_STEPS, CLASSES])]
    graph = helper.make_graph(g.nodes, "text_recognition", vin, vout, initializer=g.initializers)
    model = helper.make_model(graph, opset_imports=OPSET)
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return path


def tiny(path: Path) -> Path:
    """OUTPUT0 = relu(INPUT0 @ W), 16x16 (see the module doc)."""
    sys.path.insert(0, str(ROOT / "tests"))
    import model_builders

    return model_builders.matmul_relu(path, size=16)


def wide(path: Path, floats: int) -> Path:
    """`tiny` with a wider input: OUTPUT0 = relu(INPUT0[:, :16] @ W), INPUT0 FP32 [N, floats]: the
    same compute as tiny for request bodies of any size (bench/overhead.py --input-floats)."""
    w = np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32)
    constants = {"starts": [0], "ends": [16], "axes": [1]}
    nodes = [helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, np.int64), name))
             for name, value in constants.items()]
    nodes += [helper.make_node("Slice", ["INPUT0", "starts", "ends", "axes"], ["head"]),
              helper.make_node("MatMul", ["head", "W"], ["mm"]), helper.make_node("Relu", ["mm"], ["OUTPUT0"])]
    graph = helper.make_graph(nodes, "wide", [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["N", floats])],
                              [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["N", 16])],
                              initializer=[numpy_helper.from_array(w, "W")])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph, opset_imports=OPSET), str(path))
    return path
