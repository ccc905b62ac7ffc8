"""OpenVINO IR models for tests, made by OpenVINO itself: an ONNX file built with onnx.helper
(model_builders) is converted with `openvino.convert_model` and written with `openvino.save_model`
(model.xml + model.bin). Nothing binary is committed."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

import model_builders as mb


def convert(onnx_path: Path, xml_path: Path, *, batch_layout: bool = False) -> Path:
    """IR of an ONNX file. `batch_layout` marks every input and output "N..." (a batch first),
    which the backend's auto-complete reads as 'this model batches'."""
    import openvino as ov

    model = ov.convert_model(str(onnx_path))
    if batch_layout:
        for port in [*model.inputs, *model.outputs]:
            ov.layout_helpers.set_layout(port, ov.Layout("N..."))
    xml_path = Path(xml_path)
    xml_path.parent.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, str(xml_path))
    return xml_path


def add_sub_ir(xml_path: Path, dims: Sequence = ("N", 16), *, batch_layout: bool = False) -> Path:
    """Triton's add_sub (OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1) as an IR."""
    onnx_path = Path(xml_path).with_name("source.onnx")
    mb.add_sub(onnx_path, dims=dims)
    try:
        return convert(onnx_path, xml_path, batch_layout=batch_layout)
    finally:
        onnx_path.unlink()


def matmul_relu_ir(xml_path: Path, onnx_path: Path, size: int = 16, *, seed: int = 0) -> Path:
    """relu(INPUT0 @ W) as an IR, converted from `onnx_path` (kept, for ONNX Runtime's outputs)."""
    mb.matmul_relu(onnx_path, size=size, seed=seed)
    return convert(onnx_path, xml_path)


def openvino_outputs(model_path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What OpenVINO itself computes for `feeds` (the model compiled for the CPU, no server)."""
    import openvino as ov

    compiled = ov.Core().compile_model(str(model_path), "CPU")
    result = compiled.create_infer_request().infer(feeds)
    return {port.get_any_name(): np.array(value) for port, value in result.items()}


def onnxruntime_outputs(onnx_path: Path, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What ONNX Runtime computes for the same model (its source ONNX file)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def cpu_inference_precision() -> str:
    """The precision OpenVINO's CPU plugin computes FP32 models in here by default: "bf16" on CPUs
    with bfloat16 instructions, else "f32"."""
    import openvino as ov

    return ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").get_type_name()
