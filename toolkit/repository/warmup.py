"""`model_warmup` checks at compile time, so a bad warmup fails `toolkit validate`, not a cold
start.

The rule is implemented once, on Triton's config JSON, in the runtime package
(handlers/config/warmup.py: GenerateWarmupData, PrepareForInference and the backend's batch, in
tritonserver 2.51's order and words, verified by tests/oracle), because the image build's
completion step of python models runs it too. Here the compiler's `ModelConfig` message is
rendered with Triton's JSON printer and its `ConfigError` becomes a `ModelError` pointing at the
sample in config.pbtxt.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf.message import Message

from handlers.config.warmup import check_warmup
from handlers.manifest import ModelSpec

from .model_config import to_triton_json
from .validate import rule_errors


def validate_warmup(config: Message, model_path: Path, warnings: list[str] | None = None) -> None:
    """Check every `model_warmup` sample the way tritonserver prepares and runs it."""
    spec = ModelSpec(config.name, model_path, (), {}, to_triton_json(config))
    with rule_errors(config.name or None):
        found = check_warmup(spec, 1)
    if warnings is not None:
        warnings.extend(found)
