"""Which front end serves a protocol: the native one where its module is built
(handlers/protocol/grpc/native, handlers/protocol/httpnative/native; built by
handlers/protocol/native/build.py), else the protocol's Python server (grpcio's, uvicorn). An
environment variable may choose (TOOLKIT_GRPC_FRONTEND, TOOLKIT_HTTP_FRONTEND); asking for the
native one where it is not built is an error, not a silent fallback."""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence


def importable(module: str) -> bool:
    """Whether `module` imports (a native front end's Python side imports its extension)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True


def choose(variable: str, choices: Sequence[str], fallback: str, module: str, build: str) -> str:
    """The front end named by `variable` (one of `choices`), else "native" when `module` imports,
    else `fallback`. ValueError with the reason for another value, or for native when `module`
    does not import (`build`: what builds it)."""
    chosen = os.environ.get(variable, "").strip().lower()
    if chosen and chosen not in choices:
        raise ValueError(f"{variable}={chosen!r}: expected one of {', '.join(choices)}")
    if chosen == "native" and not importable(module):
        raise ValueError(f"{variable}=native but the native {build}")
    return chosen or ("native" if importable(module) else fallback)
