"""Errors raised while reading and compiling a model repository.

Messages follow Triton's wording where Triton defines the check (so users recognise them and can
search for them); `location` adds the file, and the line and column where one is known.
"""

from __future__ import annotations


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
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.model = model
        self.file = file
        self.line = line
        self.column = column
        # A token (field name or quoted tensor name) whose first occurrence in config.pbtxt is
        # the line to point at when the error has no position of its own.
        self.hint = hint

    @property
    def location(self) -> str | None:
        if self.file is None:
            return None
        if self.line is None:
            return self.file
        if self.column is None:
            return f"{self.file}:{self.line}"
        return f"{self.file}:{self.line}:{self.column}"

    def __str__(self) -> str:
        where = self.location
        return f"{where}: {self.message}" if where else self.message


class ConfigParseError(ModelError):
    """config.pbtxt is not valid protobuf text for Triton's ModelConfig message."""

    def __init__(self, file: str, line: int | None, column: int | None, message: str) -> None:
        super().__init__(message, file=file, line=line, column=column)


class UnsupportedModelError(ModelError):
    """A valid Triton config that this product deliberately cannot serve (e.g. a TensorRT plan)."""
