"""No import circles among the modules of `handlers` and `toolkit`: each package reads top-down.

The import graph is read from the sources with `ast` (nothing is imported). Its nodes are the
modules (a package is its `__init__.py`); an edge A -> B is any `import` statement in A that
names B, wherever it stands:

- at module level, also under `if TYPE_CHECKING:` or `try:`;
- inside a function or method: a deferred import only hides a circle from the interpreter (the
  import runs later, when both modules exist), not from a reader, so it counts the same. Deferred
  imports stay fine for what they are for (a heavy library, or a backend module loaded only when
  a model uses it), as long as they close no circle.

`import a.b.c` and `from a.b import c` point at the deepest of `a.b.c`, `a.b`, `a` that is one of
our modules (`from a.b import name` at `a.b` when `name` is not a submodule); relative imports are
resolved against the importing module's package. The parent packages that Python initialises on
the way (importing `a.b.c` runs `a/__init__.py` and `a/b/__init__.py`) are not edges: a package's
`__init__` re-exporting its own submodules is the package's face, not a dependency of them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("handlers", "toolkit")


@dataclass(frozen=True)
class Edge:
    target: str
    line: int


def modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of `packages` under `root`."""
    found: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def imports(name: str, path: Path, known: dict[str, Path]) -> list[Edge]:
    """The edges from module `name` (file `path`) to modules in `known`."""
    tree = ast.parse(path.read_bytes(), filename=str(path))
    package = name if _is_package(path) else name.rpartition(".")[0]
    edges: list[Edge] = []

    def point(dotted: str, line: int) -> None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        if dotted and dotted != name and Edge(dotted, line) not in edges:
            edges.append(Edge(dotted, line))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                point(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                point(submodule if submodule in known else source, node.lineno)
    return edges


def graph(root: Path, packages: tuple[str, ...]) -> dict[str, list[Edge]]:
    known = modules(root, packages)
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, list[Edge]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:
        nonlocal counter
        # iterative depth-first search: (module, iterator over its targets)
        work: list[tuple[str, Iterator[str]]] = []

        def enter(module: str) -> None:
            nonlocal counter
            index[module] = low[module] = counter
            counter += 1
            stack.append(module)
            on_stack.add(module)
            work.append((module, iter(sorted({e.target for e in edges.get(module, [])}))))

        enter(start)
        while work:
            module, targets = work[-1]
            advanced = False
            for target in targets:
                if target not in index:
                    enter(target)
                    advanced = True
                    break
                if target in on_stack:
                    low[module] = min(low[module], index[target])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return sorted(found)


def describe(component: list[str], edges: dict[str, list[Edge]], files: dict[str, Path]) -> str:
    members = set(component)
    lines = []
    for module in component:
        for edge in edges[module]:
            if edge.target in members:
                lines.append(f"  {files[module].relative_to(ROOT)}:{edge.line}: {module} -> {edge.target}")
    return "\n".join(lines)


def test_handlers_and_toolkit_have_no_import_cycles() -> None:
    edges = graph(ROOT, PACKAGES)
    files = modules(ROOT, PACKAGES)
    assert len(files) > 100 and any(edges.values())  # the whole tree was read
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n\n".join(describe(c, edges, files) for c in found)


def test_the_detector_finds_cycles_through_every_kind_of_import(tmp_path: Path) -> None:
    """A cycle closed by a relative, a TYPE_CHECKING or a function-level import is found; a
    package that re-exports its submodules is not a cycle."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    sources = {
        "__init__.py": "from .a import A\nfrom .sub import S\n",
        "a.py": "from .b import B\nA = 1\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\nB = 2\n",
        "c.py": "def late():\n    from pkg import a\n    return a\nC = 3\n",
        "sub/__init__.py": "from .leaf import S\n",
        "sub/leaf.py": "from .. import d\nS = 4\n",
        "d.py": "import pkg.sub.other\n",
        "sub/other.py": "X = 5\n",
    }
    for relative, text in sources.items():
        (package / relative).write_text(text)
    edges = graph(tmp_path, ("pkg",))
    assert {e.target for e in edges["pkg.d"]} == {"pkg.sub.other"}
    assert {e.target for e in edges["pkg.sub.leaf"]} == {"pkg.d"}
    assert cycles(edges) == [["pkg.a", "pkg.b", "pkg.c"]]

    (package / "sub/other.py").write_text("from pkg.sub import leaf\n")  # leaf -> d -> other -> leaf
    assert cycles(graph(tmp_path, ("pkg",))) == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.d", "pkg.sub.leaf", "pkg.sub.other"]]
