"""Triton's model configuration checks, for the compiler's protobuf configs.

The rules are implemented once, on Triton's config JSON, in the runtime package
(handlers/config: ValidateModelConfig, ValidateModelIOConfig, ValidateInstanceGroup, label files,
this product's support checks), because the image build's completion step runs them too, where
no protobuf is installed. Here the compiler's `ModelConfig` message is rendered with Triton's JSON
printer (`to_triton_json`), the rule runs, and its `ConfigError` becomes a `ModelError` with the
same message, status code and config.pbtxt hint. The first problem found is reported, as Triton
does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from google.protobuf.message import Message

from handlers.config import support as _support
from handlers.config import validate as _rules
from handlers.config.errors import CODE_UNSUPPORTED, ConfigError

from .errors import ModelError, UnsupportedModelError
from .model_config import to_triton_json


def model_error(exc: ConfigError, model: str | None) -> ModelError:
    """The compiler's error for a rule's ConfigError (UnsupportedModelError for this product's
    refusals)."""
    if exc.code == CODE_UNSUPPORTED:
        return UnsupportedModelError(exc.message, model=model, hint=exc.hint, detail=exc.detail)
    return ModelError(exc.message, model=model, hint=exc.hint, detail=exc.detail, code=exc.code)


@contextmanager
def rule_errors(model: str | None) -> Iterator[None]:
    """Raise the ConfigError of a rule run inside as the compiler's ModelError."""
    try:
        yield
    except ConfigError as exc:
        raise model_error(exc, model) from None


def _run(rule: Callable[..., Any], config: Message, *args: Any) -> None:
    with rule_errors(config.name or None):
        rule(to_triton_json(config), *args)


def validate_model_config(config: Message) -> None:
    _run(_rules.validate_model_config, config)


def validate_model_io_config(config: Message) -> None:
    _run(_rules.validate_model_io_config, config)


def validate_instance_groups(config: Message, supported_gpus: set[int]) -> None:
    _run(_rules.validate_instance_groups, config, supported_gpus)


def check_label_files(config: Message, model_dir: Path) -> None:
    _run(_rules.check_label_files, config, model_dir)


def check_supported_features(config: Message) -> None:
    """handlers/config/support.py: sequence batching, decoupled models, conda-pack environments."""
    _run(_support.check_supported, config)


def duplicate_tensor_warnings(config: Message) -> list[str]:
    return _rules.duplicate_tensor_warnings(to_triton_json(config))
