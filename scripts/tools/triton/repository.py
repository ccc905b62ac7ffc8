"""The repository `serve` hands to tritonserver: the user's models, ONNX ones as python models.

The user's repository is never modified: each model gets a directory in the run's own repository.
- ONNX models (platform onnxruntime_onnx or backend onnxruntime) become python-backend models:
  their version directories link the original files and get onnx_model.py as model.py; the config
  keeps everything (max_batch_size, inputs and outputs, dynamic_batching, instance_group,
  model_warmup, parameters, ...) except that instance groups become KIND_CPU and execution
  accelerators are dropped. The config must list its inputs and outputs: this server cannot
  auto-complete from an ONNX file.
- python-backend models and ensembles are linked unchanged.
- any other model is left out, with a warning.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from launcher import say

MODEL_PY = Path(__file__).resolve().parent / "onnx_model.py"


class RepositoryError(ValueError):
    pass


def _is_onnx(config: mc.ModelConfig) -> bool:
    return config.platform == "onnxruntime_onnx" or config.backend == "onnxruntime"


def _as_python_model(source: Path, target: Path, config: mc.ModelConfig) -> None:
    if not (config.input and config.output):
        raise RepositoryError(
            f"{source / 'config.pbtxt'}: list every input and output (this tritonserver has no "
            "onnxruntime backend, so it cannot auto-complete them from the ONNX file)"
        )
    config.parameters["onnx_model_filename"].string_value = config.default_model_filename or "model.onnx"
    config.ClearField("platform")
    config.ClearField("default_model_filename")
    config.backend = "python"
    if config.HasField("optimization"):
        config.optimization.ClearField("execution_accelerators")
    for group in config.instance_group:
        group.kind = mc.ModelInstanceGroup.KIND_CPU
        del group.gpus[:]
    target.mkdir()
    for entry in source.iterdir():
        if entry.is_dir() and entry.name.isdigit():  # a version: its files, plus model.py
            (target / entry.name).mkdir()
            for item in entry.iterdir():
                if item.name != "model.py":
                    (target / entry.name / item.name).symlink_to(item.resolve())
            shutil.copy(MODEL_PY, target / entry.name / "model.py")
        elif entry.name != "config.pbtxt":  # warmup data, label files, ...
            (target / entry.name).symlink_to(entry.resolve())
    (target / "config.pbtxt").write_text(text_format.MessageToString(config))


def prepare(source: Path, target: Path) -> list[str]:
    """Fill `target` from the repository `source`; returns the names of the models it serves."""
    target.mkdir(parents=True)
    names = []
    for model in sorted(p for p in source.iterdir() if p.is_dir() and not p.name.startswith(".")):
        config_file = model / "config.pbtxt"
        if not config_file.is_file():
            say(f"leaving out {model.name}: no config.pbtxt")
            continue
        try:
            config = text_format.Parse(config_file.read_text(), mc.ModelConfig())
        except text_format.ParseError as error:
            raise RepositoryError(f"{config_file}: {error}") from None
        if _is_onnx(config):
            _as_python_model(model, target / model.name, config)
        elif config.platform == "ensemble" or config.backend == "python":
            (target / model.name).symlink_to(model.resolve())
        else:
            say(f"leaving out {model.name}: platform {config.platform!r} / backend {config.backend!r} "
                "is not served here (only ONNX, python and ensemble models)")
            continue
        names.append(config.name or model.name)
    return names
