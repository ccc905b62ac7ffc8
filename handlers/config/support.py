"""Valid Triton configs this product deliberately does not serve, each with the reason and the
way forward. Run after Triton's own checks pass, so an invalid config still gets Triton's
message first. (Which backends exist is the compiler's knowledge: toolkit/repository/support.py
checks the backend, then calls this.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import CODE_UNSUPPORTED, ConfigError

Config = Mapping[str, Any]


def check_supported(config: Config) -> None:
    """ConfigError with code CODE_UNSUPPORTED for a feature this product refuses."""
    name = config.get("name", "")
    if "sequence_batching" in config:
        raise ConfigError(
            f"model '{name}' uses sequence_batching: stateful models need every request of a sequence "
            "routed to the same instance (sticky routing), which serverless platforms do not provide; "
            "keep the state in the client or an external store and use dynamic_batching",
            code=CODE_UNSUPPORTED,
        )
    if (config.get("model_transaction_policy") or {}).get("decoupled", False):
        if config.get("platform") == "ensemble":
            raise ConfigError(decoupled_ensemble_message(name), code=CODE_UNSUPPORTED)
        backend = config.get("backend", "")
        if backend != "python":
            raise ConfigError(
                f"model '{name}' uses model_transaction_policy {{ decoupled: true }} with backend '{backend}': "
                "decoupled (streaming) models are served for backend \"python\" only",
                code=CODE_UNSUPPORTED,
            )
    if "EXECUTION_ENV_PATH" in config.get("parameters", {}):
        raise ConfigError(
            f"model '{name}' sets parameter EXECUTION_ENV_PATH (a conda-pack environment): list the "
            "model's Python dependencies in a requirements.txt in the model directory instead; the "
            "build installs them into the image",
            code=CODE_UNSUPPORTED,
        )


def decoupled_ensemble_message(name: str, steps: Any = ()) -> str:
    """The refusal of an ensemble that a decoupled step makes decoupled (Triton's
    ValidateEnsembleConfig marks such an ensemble decoupled); `steps`: the decoupled ones."""
    which = f" ('{steps[0]}')" if steps else ""
    return (
        f"ensemble '{name}' is decoupled (a step's model{which} has model_transaction_policy {{ decoupled: true }}): "
        "streaming responses through an ensemble is not supported; call the decoupled model directly "
        "(generate_stream, gRPC ModelStreamInfer) or from a Python model with BLS exec(decoupled=True)"
    )


__all__ = ["check_supported", "decoupled_ensemble_message"]
