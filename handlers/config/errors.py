"""The error a config rule raises: Triton's message and status code, and what we add."""

from __future__ import annotations

# Triton's Status::CodeString() of the codes config errors use; "Unsupported" is this product's
# (a valid config it does not serve).
CODE_INVALID_ARG = "Invalid argument"
CODE_INTERNAL = "Internal"
CODE_UNSUPPORTED = "Unsupported"


class ConfigError(Exception):
    """A config Triton would refuse; `message` is Triton's where Triton has one, `code` Triton's
    status code name, `detail` what we add."""

    def __init__(
        self,
        message: str,
        *,
        detail: str | None = None,
        code: str = CODE_INVALID_ARG,
        hint: str | tuple[str, ...] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.detail = detail
        self.code = code
        # A token to find in config.pbtxt, or tokens tried in turn (the compiler points at the
        # line of the first one found).
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} ({self.detail})" if self.detail else self.message
