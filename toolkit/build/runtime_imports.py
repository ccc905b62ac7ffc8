"""The `handlers` package goes into images alone: check what it imports before shipping it.

Every `import` statement of every module (also those inside functions, which run later) is read
with `ast`. Allowed: the standard library, `handlers` itself (and relative imports), and the
modules of the declared runtime dependencies (runtime_deps.py), matched by their dotted name
(`google.protobuf` is allowed while the rest of `google` is forbidden). The gRPC package
(handlers/protocol/grpc) ships in every image but is imported only by gRPC images, which carry its
dependencies. Anything else would fail in the
image with ModuleNotFoundError, so it is refused at build time, naming the file and line.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

from .runtime_deps import FORBIDDEN_IMPORTS, allowed_runtime_imports

RUNTIME_PACKAGE = "handlers"


@dataclass(frozen=True)
class ImportProblem:
    file: Path
    line: int
    module: str
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: imports '{self.module}': {self.reason}"


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def _declared(module: str, allowed: set[str] | frozenset[str]) -> str:
    """The allowed name that covers `module` (itself or a parent package), or ""."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        name = ".".join(parts[:end])
        if name in allowed:
            return name
    return ""


def check_runtime_imports(package_dir: Path) -> list[ImportProblem]:
    """Problems in the `handlers` package at `package_dir` (empty when it can ship)."""
    allowed = allowed_runtime_imports() | set(sys.stdlib_module_names) | {RUNTIME_PACKAGE, "__future__"}
    problems: list[ImportProblem] = []
    for path in sorted(package_dir.rglob("*.py")):
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except SyntaxError as exc:
            problems.append(ImportProblem(path, exc.lineno or 0, "-", f"syntax error: {exc.msg}"))
            continue
        for line, module in _imported_modules(tree):
            top = module.split(".", 1)[0]
            if _declared(module, allowed) and "." in _declared(module, allowed):
                continue  # a dotted allowance (google.protobuf) inside a forbidden namespace
            if top in FORBIDDEN_IMPORTS:
                problems.append(
                    ImportProblem(path, line, module, "the runtime must never import the build-time side or its libraries")
                )
            elif not _declared(module, allowed):
                problems.append(
                    ImportProblem(
                        path, line, module, "not the standard library and not a declared runtime dependency "
                        "(toolkit/build/runtime_deps.py)"
                    )
                )
    return problems
