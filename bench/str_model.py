"""The text recognition model of Triton's conceptual guide (parts 1 and 2), at full width, in torch.

The guide serves `STRModel(input_channels=1, output_channels=512, num_classes=37)` from its
utils/model.py, deep-text-recognition-benchmark's None-ResNet-None-CTC model (Baek et al. 2019),
exported with `torch.onnx.export` so that the ONNX input is `input.1` [N, 1, 32, 100] and the
output `308` [N, 26, 37], batch dimension dynamic. This module defines the same network (the
same layers, shapes and order; written here, not copied) and exports it the same way:

- ResNet feature extractor, output_channel 512: a 3x3 conv pair (32, 64 channels), then four
  stages of BasicBlocks (1, 2, 5, 3 blocks of 128, 256, 512, 512 channels, a 1x1 projection where
  the channels change), each stage followed by a 3x3 conv; max-pools 2x2, 2x2 and (2, 1)-strided
  with width padding before stages 1-3; then two 2x2 convs that end at height 1 and width 26.
  Every conv is bias-free and followed by BatchNorm (folded by the exporter) and ReLU.
- Prediction: AdaptiveAvgPool2d((512, 1)) over [N, W, C, H], then Linear(512, 37) per column.

Weights are random (torch's default initialisation, BatchNorm at its initial statistics): the
trained `None-ResNet-None-CTC.pth` the guide downloads is not on PyPI, and throughput does not
depend on the values. Needs torch (a CPU build: `pip install torch==2.13.0` from PyTorch's CPU
wheel index, or a local CPU wheel); bench/serve_vs_triton.py (its `text_recognition_full`
model), bench/ort_sessions.py, bench/pytorch_ceiling.py (`--model str`) and bench/gpu.py use it;
`save_torchscript` saves the same network for pytorch_libtorch.
"""

from __future__ import annotations

import warnings
from pathlib import Path

# The guide's config (Triton conceptual guide part 2: model_repository/text_recognition/config.pbtxt),
# verbatim: two KIND_GPU instances. guide_config() gives it with another kind or count.
GUIDE_CONFIG = """name: "text_recognition"
backend: "onnxruntime"
max_batch_size : 8
input [
  {
    name: "input.1"
    data_type: TYPE_FP32
    dims: [ 1, 32, 100 ]
  }
]
output [
  {
    name: "308"
    data_type: TYPE_FP32
    dims: [ 26, 37 ]
  }
]

dynamic_batching { }

instance_group [
    {
      count: 2
      kind: KIND_GPU
    }
]
"""


def guide_config(kind: str = "KIND_GPU", count: int = 2) -> str:
    """The guide's config.pbtxt text with `kind` and `count` in its instance group."""
    return GUIDE_CONFIG.replace("kind: KIND_GPU", f"kind: {kind}").replace("count: 2", f"count: {count}")


INPUT_NAME = "input.1"
OUTPUT_NAME = "308"
NUM_CLASSES = 37
OUTPUT_CHANNELS = 512


def build(output_channels: int = OUTPUT_CHANNELS, num_classes: int = NUM_CLASSES, seed: int = 0):
    """The STRModel in eval mode (see the module doc)."""
    import torch
    from torch import nn

    def conv_bn(cin: int, cout: int, kernel, stride=1, padding=0) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, bias=False), nn.BatchNorm2d(cout)]

    class BasicBlock(nn.Module):
        def __init__(self, cin: int, cout: int) -> None:
            super().__init__()
            self.first = nn.Sequential(*conv_bn(cin, cout, 3, padding=1), nn.ReLU(inplace=True))
            self.second = nn.Sequential(*conv_bn(cout, cout, 3, padding=1))
            self.shortcut = nn.Sequential(*conv_bn(cin, cout, 1)) if cin != cout else nn.Identity()
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.relu(self.second(self.first(x)) + self.shortcut(x))

    def stage(cin: int, cout: int, blocks: int) -> nn.Sequential:
        return nn.Sequential(*(BasicBlock(cin if i == 0 else cout, cout) for i in range(blocks)))

    def conv_bn_relu(cin: int, cout: int, kernel=3, stride=1, padding=1) -> list[nn.Module]:
        return [*conv_bn(cin, cout, kernel, stride, padding), nn.ReLU(inplace=True)]

    class STRModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            c = output_channels
            widths = [c // 4, c // 2, c, c]
            self.features = nn.Sequential(
                *conv_bn_relu(1, c // 16), *conv_bn_relu(c // 16, c // 8),           # 32 x 100
                nn.MaxPool2d(2, 2),                                                   # 16 x 50
                stage(c // 8, widths[0], 1), *conv_bn_relu(widths[0], widths[0]),
                nn.MaxPool2d(2, 2),                                                   # 8 x 25
                stage(widths[0], widths[1], 2), *conv_bn_relu(widths[1], widths[1]),
                nn.MaxPool2d(2, stride=(2, 1), padding=(0, 1)),                       # 4 x 26
                stage(widths[1], widths[2], 5), *conv_bn_relu(widths[2], widths[2]),
                stage(widths[2], widths[3], 3),
                *conv_bn_relu(widths[3], widths[3], 2, stride=(2, 1), padding=(0, 1)),  # 2 x 27
                *conv_bn_relu(widths[3], widths[3], 2, padding=0),                      # 1 x 26
            )
            self.pool = nn.AdaptiveAvgPool2d((c, 1))
            self.prediction = nn.Linear(c, num_classes)

        def forward(self, x):
            visual = self.features(x)                                # [N, C, 1, 26]
            visual = self.pool(visual.permute(0, 3, 1, 2)).squeeze(3)  # [N, 26, C]
            return self.prediction(visual.contiguous())

    torch.manual_seed(seed)
    return STRModel().eval()


def export(path: Path, output_channels: int = OUTPUT_CHANNELS) -> Path:
    """torch.onnx.export as the guide does: traced with a [1, 1, 32, 100] input, batch dynamic."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    model = build(output_channels)
    sample = torch.randn(1, 1, 32, 100)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the TorchScript exporter, as the guide used
        torch.onnx.export(model, (sample,), str(path), input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                          dynamic_axes={INPUT_NAME: {0: "N"}, OUTPUT_NAME: {0: "N"}}, opset_version=17,
                          dynamo=False)
    return path


def save_torchscript(path: Path, output_channels: int = OUTPUT_CHANNELS) -> Path:
    """The same network saved for pytorch_libtorch as a user saves it: torch.jit.trace with a
    [1, 1, 32, 100] input (TorchScript keeps the batch dimension free), then `.save`."""
    import torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.trace: what Triton's users save
        torch.jit.trace(build(output_channels), torch.randn(1, 1, 32, 100)).save(str(path))
    return path


def torchscript_config(kind: str = "KIND_GPU", count: int = 2) -> str:
    """The guide's config for the TorchScript model: platform pytorch_libtorch and the backend's
    INPUT__0 / OUTPUT__0 names, everything else as guide_config(kind, count)."""
    return guide_config(kind, count).replace('backend: "onnxruntime"', 'platform: "pytorch_libtorch"').replace(
        f'"{INPUT_NAME}"', '"INPUT__0"').replace(f'"{OUTPUT_NAME}"', '"OUTPUT__0"')


if __name__ == "__main__":
    import sys

    print(export(Path(sys.argv[1] if len(sys.argv) > 1 else "str.onnx")))
