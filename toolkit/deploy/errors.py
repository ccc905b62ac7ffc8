"""Errors of `toolkit deploy`, `toolkit invoke` and `toolkit proxy`: each says what to do next."""

from __future__ import annotations


class DeployError(Exception):
    """The deployment (or the request) cannot go on: a refused API call, a missing tool, a timeout."""

    def __init__(self, message: str, *, detail: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        # The platform's own answer (an API error body, a tool's output) that explains the failure.
        self.detail = detail

    def __str__(self) -> str:
        return self.message if not self.detail else f"{self.message}\n{self.detail}"


class DeployOptionError(DeployError):
    """The options contradict each other or the platform's documented limits (exit status 2)."""


class ManualSteps(DeployError):
    """Nothing was applied because a credential or a tool is missing; these commands do it instead."""

    def __init__(self, message: str, commands: list[str], manifest: str | None = None) -> None:
        super().__init__(message)
        self.commands = commands
        self.manifest = manifest
