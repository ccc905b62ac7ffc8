"""Valid Triton configs this product deliberately does not serve, each with the reason and the
way forward. Run after Triton's own checks pass, so an invalid config still gets Triton's
message first. (Which backends exist is the compiler's knowledge: toolkit/repository/support.py
checks the backend, then calls this.)
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import CODE_INTERNAL, CODE_UNSUPPORTED, ConfigError

Config = Mapping[str, Any]

# Backends whose models may use sequence_batching: their instances take the control tensors as inputs.
SEQUENCE_BACKENDS = ("python", "onnxruntime", "onnxruntime_onnx", "pytorch", "pytorch_libtorch")
# Backends whose models may use implicit state (`sequence_batching { state }`): they take the state
# as an input and produce its next value as an output.
STATE_BACKENDS = ("onnxruntime", "onnxruntime_onnx", "pytorch", "pytorch_libtorch")


def check_supported(config: Config) -> None:
    """ConfigError with code CODE_UNSUPPORTED for a feature this product refuses."""
    name = config.get("name", "")
    groups = config.get("instance_group") or []
    if groups and all(group.get("passive", False) for group in groups):
        raise ConfigError(
            f"every instance group of model '{name}' is passive (instance_group {{ passive: true }}): passive "
            "instances take no requests, so the model could answer none (tritonserver 2.51 loads it and dies with "
            "signal 11 at its first request); make one group active (passive: false)",
            code=CODE_UNSUPPORTED,
        )
    sequence = config.get("sequence_batching")
    if sequence is not None:
        backend = config.get("backend") or config.get("platform", "")
        if backend not in SEQUENCE_BACKENDS:
            raise ConfigError(
                f"model '{name}' uses sequence_batching with backend '{backend}': stateful models are served for "
                'backends "python", "onnxruntime" and "pytorch"',
                code=CODE_UNSUPPORTED,
            )
        if sequence.get("state") and backend not in STATE_BACKENDS:
            raise ConfigError(
                f"model '{name}' uses implicit state (sequence_batching {{ state }}) with backend '{backend}': served "
                'for backends "onnxruntime" and "pytorch"; a python model keeps its sequences\' state itself, by '
                "correlation ID",
                code=CODE_UNSUPPORTED,
            )
    if (config.get("model_transaction_policy") or {}).get("decoupled", False) and config.get("platform") != "ensemble":
        backend = config.get("backend", "")
        if backend != "python":
            raise ConfigError(
                f"model '{name}' uses model_transaction_policy {{ decoupled: true }} with backend '{backend}': "
                "decoupled (streaming) models are served for backend \"python\" only",
                code=CODE_UNSUPPORTED,
            )


def check_execution_environment(config: Config, model_dir: Path) -> None:
    """A python model's EXECUTION_ENV_PATH (a conda-pack archive or an unpacked environment,
    handlers/backends/python/execution_env.py): it must exist and be readable (CODE_INTERNAL, as
    tritonserver fails to load it), and the model process must be able to run in it: a Linux
    build of Python 3.11 or newer with numpy (CODE_UNSUPPORTED otherwise, with what works)."""
    if config.get("backend") != "python":
        return
    from ..backends.python import execution_env

    value = execution_env.configured_value(config)
    if value is None:
        return
    name = config.get("name", "")
    path = execution_env.resolve(value, model_dir)
    if not value.strip() or not path.exists():
        # tritonserver's words (its realpath() fails), then ours
        raise ConfigError(
            f"Failed to get the canonical path for {path}.",
            detail=f"parameter EXECUTION_ENV_PATH of model '{name}' ('{value}') names no file or folder: put the "
            "conda-pack archive there, or correct the path ($$TRITON_MODEL_DIRECTORY stands for the model's directory)",
            hint="EXECUTION_ENV_PATH",
            code=CODE_INTERNAL,
        )
    try:
        info = execution_env.inspect(path)
    except execution_env.EnvironmentError_ as exc:
        raise ConfigError(f"model '{name}': {exc}", hint="EXECUTION_ENV_PATH", code=CODE_INTERNAL) from None
    try:
        execution_env.check(info)
    except execution_env.EnvironmentError_ as exc:
        raise ConfigError(f"model '{name}': {exc}", hint="EXECUTION_ENV_PATH", code=CODE_UNSUPPORTED) from None


__all__ = ["check_execution_environment", "check_supported"]
