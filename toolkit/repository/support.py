"""Valid Triton configs that this product deliberately does not serve, each with the reason and
the way forward. Checked after Triton's own checks pass, so an invalid config still gets
Triton's message first.
"""

from __future__ import annotations

from google.protobuf.message import Message

from handlers.backends import BACKEND_MODULES
from handlers.backends.python.config_checks import decoupled_ensemble_message

from .backend_fields import ENSEMBLE_PLATFORM, PYTHON_BACKEND
from .errors import UnsupportedModelError

# The backends the runtime has a module for (handlers/backends/__init__.py).
SUPPORTED_BACKENDS = tuple(BACKEND_MODULES)

_BACKEND_ADVICE = {
    "tensorrt": (
        "TensorRT plans are engines built for one GPU architecture and TensorRT version; export the "
        "source model to ONNX and serve it with backend \"onnxruntime\" (add "
        "optimization { execution_accelerators { gpu_execution_accelerator: [{ name: \"tensorrt\" }] } } "
        "to keep TensorRT speed on GPU targets)"
    ),
    "pytorch": "export the model to ONNX (torch.onnx.export) and serve it with backend \"onnxruntime\"",
    "tensorflow": "convert the model to ONNX (tf2onnx) and serve it with backend \"onnxruntime\"",
    "openvino": (
        "serve the ONNX model with backend \"onnxruntime\" and "
        "optimization { execution_accelerators { cpu_execution_accelerator: [{ name: \"openvino\" }] } }"
    ),
}


def check_supported(config: Message) -> None:
    name = config.name
    is_ensemble = config.platform == ENSEMBLE_PLATFORM
    if not is_ensemble and config.backend not in SUPPORTED_BACKENDS:
        advice = _BACKEND_ADVICE.get(config.backend, "serve the model as ONNX (backend \"onnxruntime\") or wrap it in a Python-backend model.py")
        platform = f" (platform '{config.platform}')" if config.platform else ""
        raise UnsupportedModelError(
            f"model '{name}' uses backend '{config.backend}'{platform}, which cannot be served here: "
            f"supported are {', '.join('backend ' + b for b in SUPPORTED_BACKENDS)} and platform ensemble; {advice}",
            model=name,
        )
    if config.HasField("sequence_batching"):
        raise UnsupportedModelError(
            f"model '{name}' uses sequence_batching: stateful models need every request of a sequence "
            "routed to the same instance (sticky routing), which serverless platforms do not provide; "
            "keep the state in the client or an external store and use dynamic_batching",
            model=name,
        )
    if config.model_transaction_policy.decoupled:
        if is_ensemble:
            raise UnsupportedModelError(decoupled_ensemble_message(name), model=name)
        if config.backend != PYTHON_BACKEND:
            raise UnsupportedModelError(
                f"model '{name}' uses model_transaction_policy {{ decoupled: true }} with backend "
                f"'{config.backend}': decoupled (streaming) models are served for backend \"python\" only",
                model=name,
            )
    if "EXECUTION_ENV_PATH" in config.parameters:
        raise UnsupportedModelError(
            f"model '{name}' sets parameter EXECUTION_ENV_PATH (a conda-pack environment): list the "
            "model's Python dependencies in a requirements.txt in the model directory instead; the "
            "build installs them into the image",
            model=name,
        )
