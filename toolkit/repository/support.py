"""Valid Triton configs that this product deliberately does not serve, each with the reason and
the way forward. Checked after Triton's own checks pass, so an invalid config still gets
Triton's message first.

The backend is checked here (which backends the runtime has is the build's knowledge, with
advice on converting the others); the features this product refuses in any config (sequence
batching, decoupled models other than Python ones, decoupled ensembles, conda-pack environments
that cannot host the model process) are handlers/config/support.py's, which the image build's
completion step runs too.
"""

from __future__ import annotations

from google.protobuf.message import Message

from handlers.backends import BACKEND_MODULES

from .backend_fields import ENSEMBLE_PLATFORM
from .errors import UnsupportedModelError
from .validate import check_supported_features

# The backends the runtime has a module for (handlers/backends/__init__.py).
SUPPORTED_BACKENDS = tuple(BACKEND_MODULES)

_BACKEND_ADVICE = {
    "tensorrt": (
        "TensorRT plans are engines built for one GPU architecture and TensorRT version; export the "
        "source model to ONNX and serve it with backend \"onnxruntime\" (add "
        "optimization { execution_accelerators { gpu_execution_accelerator: [{ name: \"tensorrt\" }] } } "
        "to keep TensorRT speed on GPU targets)"
    ),
    "tensorflow": "convert the model to ONNX (tf2onnx) and serve it with backend \"onnxruntime\"",
    "vllm": (
        "vLLM serves large language models on GPUs with streaming (decoupled) responses, which serverless "
        "containers here do not carry; deploy it on a GPU service with its own server (vllm serve)"
    ),
    "tensorrtllm": (
        "TensorRT-LLM engines are built for one GPU and stream (decoupled) responses; deploy them with Triton on "
        "a GPU service"
    ),
    "dali": (
        "move the DALI pipeline's pre-processing into a python model (model.py, e.g. with Pillow or numpy) in front "
        "of the model, in an ensemble"
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
    check_supported_features(config)
