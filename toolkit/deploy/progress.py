"""How deploy code reports progress: the CLI shows it with Rich, tests and libraries stay silent."""

from __future__ import annotations

from typing import Protocol


class DeployUI(Protocol):
    def step(self, message: str) -> None:
        """A new stage started (pushing, creating the function, waiting for the revision...)."""

    def line(self, message: str) -> None:
        """Output of a tool (the container engine's push) or a detail of the current stage."""

    def warn(self, message: str) -> None:
        """Something the user should know and may want to change (a public URL, a guessed size)."""


class SilentUI:
    def step(self, message: str) -> None:
        pass

    def line(self, message: str) -> None:
        pass

    def warn(self, message: str) -> None:
        pass


class RecordingUI:
    """Keeps every message; what `--json` runs and tests read back."""

    def __init__(self) -> None:
        self.steps: list[str] = []
        self.lines: list[str] = []
        self.warnings: list[str] = []

    def step(self, message: str) -> None:
        self.steps.append(message)

    def line(self, message: str) -> None:
        self.lines.append(message)

    def warn(self, message: str) -> None:
        self.warnings.append(message)
