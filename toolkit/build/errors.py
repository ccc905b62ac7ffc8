"""Errors of `toolkit build`: every one carries a message that says what to do."""

from __future__ import annotations


class BuildError(Exception):
    """The image cannot be built as asked (bad option, failed download, failed engine run)."""

    def __init__(self, message: str, *, detail: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        # Tail of a tool's output (pip, the container engine) that explains the failure.
        self.detail = detail
        # True when that output was already shown line by line while the tool ran.
        self.streamed = False

    def __str__(self) -> str:
        return self.message if not self.detail else f"{self.message}\n{self.detail}"


class BuildOptionError(BuildError):
    """The options contradict each other or the target (usage error, exit status 2)."""
