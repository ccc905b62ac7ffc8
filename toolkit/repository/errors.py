"""Errors raised while reading and compiling a model repository.

`message` is Triton's own message wherever tritonserver defines the check (so users recognise it
and can search for it, and `toolkit validate` can be compared with tritonserver); anything we add
(the protobuf parser's explanation, advice) goes to `detail`. `location` is the file, and the
line and column where one is known.

`stage` says where tritonserver would have stopped the model:

* `config`: when it reads the repository (the model is listed as INVALID; config.pbtxt parsing,
  auto-complete of backend fields, ValidateModelConfig, the directory name);
* `load`: while loading it (the model is UNAVAILABLE: versions, instance groups, the backend's
  checks, label files, warmup);
* `ensemble`: the ensemble's dependency checks (composing models, versions, tensors).
"""

from __future__ import annotations

# Triton's Status::CodeString() for the codes its load errors use: the config rules' own.
from handlers.config.errors import CODE_INTERNAL as CODE_INTERNAL
from handlers.config.errors import CODE_INVALID_ARG as CODE_INVALID_ARG

STAGE_CONFIG = "config"
STAGE_LOAD = "load"
STAGE_ENSEMBLE = "ensemble"


class RepositoryError(Exception):
    """The repository as a whole cannot be read (missing path, unreachable bucket, ...)."""


class ModelError(Exception):
    """One problem with one model: its configuration, files or relation to other models."""

    def __init__(
        self,
        message: str,
        *,
        model: str | None = None,
        file: str | None = None,
        line: int | None = None,
        column: int | None = None,
        hint: str | tuple[str, ...] | None = None,
        detail: str | None = None,
        stage: str | None = None,
        code: str = CODE_INVALID_ARG,
        versions: list[int] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.model = model
        self.file = file
        self.line = line
        self.column = column
        # A token (field name or quoted tensor name), or tokens tried in turn, whose first
        # occurrence in config.pbtxt is the line to point at when the error has no position.
        self.hint = hint
        self.detail = detail
        self.stage = stage
        # Triton's status code of the error (shown by tritonserver as "<code>: <message>").
        self.code = code
        # The versions whose load failed, for errors raised once versions were chosen (Triton
        # loads each version on its own and reports "version N is at UNAVAILABLE state: ...").
        self.versions = versions

    @property
    def location(self) -> str | None:
        if self.file is None:
            return None
        if self.line is None:
            return self.file
        if self.column is None:
            return f"{self.file}:{self.line}"
        return f"{self.file}:{self.line}:{self.column}"

    @property
    def unsupported(self) -> bool:
        return False

    def __str__(self) -> str:
        where = self.location
        text = f"{where}: {self.message}" if where else self.message
        return f"{text} ({self.detail})" if self.detail else text


class ConfigParseError(ModelError):
    """config.pbtxt is not valid protobuf text for Triton's ModelConfig message."""

    def __init__(self, file: str, line: int | None, column: int | None, message: str) -> None:
        super().__init__(message, file=file, line=line, column=column, stage=STAGE_CONFIG)


class UnsupportedModelError(ModelError):
    """A valid Triton config that this product deliberately cannot serve (e.g. a TensorRT plan)."""

    @property
    def unsupported(self) -> bool:
        return True
