"""Server-side auto-completion of `platform`, `backend` and `default_model_filename`.

Follows Triton's `AutoCompleteBackendFields` (core/src/model_config_utils.cc): the fields are
derived from each other and, when none is given, from the files in the model's first version
directory (first in lexicographic order of all its subdirectories, as Triton does).
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf.message import Message

from .errors import ModelError

ENSEMBLE_PLATFORM = "ensemble"
ONNXRUNTIME_BACKEND = "onnxruntime"
ONNXRUNTIME_PLATFORM = "onnxruntime_onnx"
ONNX_FILENAME = "model.onnx"
PYTHON_BACKEND = "python"
PYTHON_FILENAME = "model.py"
TENSORRT_BACKEND = "tensorrt"
TENSORRT_PLATFORM = "tensorrt_plan"
TENSORRT_FILENAME = "model.plan"
TENSORFLOW_BACKEND = "tensorflow"
TF_SAVEDMODEL_PLATFORM = "tensorflow_savedmodel"
TF_SAVEDMODEL_FILENAME = "model.savedmodel"
TF_GRAPHDEF_PLATFORM = "tensorflow_graphdef"
TF_GRAPHDEF_FILENAME = "model.graphdef"
OPENVINO_BACKEND = "openvino"
OPENVINO_FILENAME = "model.xml"
PYTORCH_BACKEND = "pytorch"
PYTORCH_PLATFORM = "pytorch_libtorch"
PYTORCH_FILENAME = "model.pt"

def _first_version_dir(model_path: Path) -> Path | None:
    subdirs = sorted(p.name for p in model_path.iterdir() if p.is_dir())
    return model_path / subdirs[0] if subdirs else None


def autocomplete_backend_fields(model_name: str, model_path: Path, config: Message) -> None:
    version_path = _first_version_dir(model_path)
    has_version = version_path is not None
    content = {p.name: p for p in version_path.iterdir()} if version_path else {}

    if not config.name:
        config.name = model_name

    # TensorFlow: the platform is required; derive it from the file name or the directory.
    if not config.platform and config.backend in ("", TENSORFLOW_BACKEND):
        if config.default_model_filename == TF_SAVEDMODEL_FILENAME:
            config.platform = TF_SAVEDMODEL_PLATFORM
        elif config.default_model_filename == TF_GRAPHDEF_FILENAME:
            config.platform = TF_GRAPHDEF_PLATFORM
        elif not config.default_model_filename and has_version:
            if TF_SAVEDMODEL_FILENAME in content and content[TF_SAVEDMODEL_FILENAME].is_dir():
                config.platform = TF_SAVEDMODEL_PLATFORM
            if TF_GRAPHDEF_FILENAME in content and not content[TF_GRAPHDEF_FILENAME].is_dir():
                config.platform = TF_GRAPHDEF_PLATFORM
    if config.platform in (TF_SAVEDMODEL_PLATFORM, TF_GRAPHDEF_PLATFORM):
        config.backend = config.backend or TENSORFLOW_BACKEND
        if not config.default_model_filename:
            config.default_model_filename = (
                TF_SAVEDMODEL_FILENAME if config.platform == TF_SAVEDMODEL_PLATFORM else TF_GRAPHDEF_FILENAME
            )
        return

    # TensorRT
    if not config.backend:
        if config.platform == TENSORRT_PLATFORM or config.default_model_filename == TENSORRT_FILENAME:
            config.backend = TENSORRT_BACKEND
        elif not config.platform and not config.default_model_filename and has_version:
            if TENSORRT_FILENAME in content and not content[TENSORRT_FILENAME].is_dir():
                config.backend = TENSORRT_BACKEND
    if config.backend == TENSORRT_BACKEND:
        config.platform = config.platform or TENSORRT_PLATFORM
        config.default_model_filename = config.default_model_filename or TENSORRT_FILENAME
        return

    # ONNX Runtime (the model may be a file, or a directory for models with external data)
    if not config.backend:
        if config.platform == ONNXRUNTIME_PLATFORM or config.default_model_filename == ONNX_FILENAME:
            config.backend = ONNXRUNTIME_BACKEND
        elif not config.platform and not config.default_model_filename and has_version:
            if ONNX_FILENAME in content:
                config.backend = ONNXRUNTIME_BACKEND
    if config.backend == ONNXRUNTIME_BACKEND:
        config.platform = config.platform or ONNXRUNTIME_PLATFORM
        config.default_model_filename = config.default_model_filename or ONNX_FILENAME
        return

    # OpenVINO
    if not config.backend:
        if config.default_model_filename == OPENVINO_FILENAME:
            config.backend = OPENVINO_BACKEND
        elif not config.platform and not config.default_model_filename and has_version:
            if OPENVINO_FILENAME in content:
                config.backend = OPENVINO_BACKEND
    if config.backend == OPENVINO_BACKEND:
        config.default_model_filename = config.default_model_filename or OPENVINO_FILENAME
        return

    # PyTorch
    if not config.backend:
        if config.platform in (PYTORCH_PLATFORM, "pytorch") or config.default_model_filename == PYTORCH_FILENAME:
            config.backend = PYTORCH_BACKEND
        elif not config.platform and not config.default_model_filename and has_version:
            if PYTORCH_FILENAME in content and not content[PYTORCH_FILENAME].is_dir():
                config.backend = PYTORCH_BACKEND
                config.platform = PYTORCH_PLATFORM
    if config.backend == PYTORCH_BACKEND:
        if not config.platform:
            config.platform = PYTORCH_PLATFORM
            config.default_model_filename = config.default_model_filename or PYTORCH_FILENAME
        return

    # Python
    if not config.backend:
        if config.default_model_filename == PYTHON_FILENAME:
            config.backend = PYTHON_BACKEND
        elif not config.platform and not config.default_model_filename and has_version:
            if PYTHON_FILENAME in content:
                config.backend = PYTHON_BACKEND
    if config.backend == PYTHON_BACKEND:
        config.default_model_filename = config.default_model_filename or PYTHON_FILENAME
        return

    # Custom backend: only when nothing is given, from a model name of the form 'model.<backend>'.
    if not config.backend and not config.platform and not config.default_model_filename:
        if "." not in model_name:
            raise ModelError(
                f"Invalid model name: Could not determine backend for model '{model_name}' with no "
                "backend in model configuration. Expected model name of the form 'model.<backend_name>'.",
                model=model_name,
            )
        backend = model_name.split(".", 1)[1]
        config.backend = backend
        config.default_model_filename = f"model.{backend}"
