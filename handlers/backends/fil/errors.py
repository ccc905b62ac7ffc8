"""The fil backend's load errors: Triton's message and status code, and the config key involved."""

from __future__ import annotations

# Triton's Status::CodeString() of the codes FIL's errors use (rapids::Error).
CODE_INVALID_ARG = "Invalid argument"
CODE_INTERNAL = "Internal"
CODE_UNSUPPORTED = "Unsupported"
CODE_UNAVAILABLE = "Unavailable"
CODE_UNKNOWN = "Unknown"


class FilModelError(Exception):
    """A fil model cannot load. `message` is Triton FIL's own where it has one, `detail` what we
    add (advice); `key` is the parameter or tensor name to point at in config.pbtxt."""

    def __init__(self, message: str, *, code: str = CODE_INVALID_ARG, key: str | None = None, detail: str | None = None,
                 file: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.key = key
        self.detail = detail
        self.file = file

    def __str__(self) -> str:
        return f"{self.message} ({self.detail})" if self.detail else self.message
