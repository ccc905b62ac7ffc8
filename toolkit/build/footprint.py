"""What each backend adds to an image: the distributions only its models need, and their size.

A backend's distributions are its requirements (runtime_deps.BACKEND_RUNTIME) and everything they
depend on in the wheelhouse (the dependencies each wheel declares for the image, less those a
requirement skips), minus what the rest of the image needs anyway: the runtime's own
requirements and the other backends'. So the size is what leaving the backend's models out of
the repository would save. Sizes are installed sizes (the files in the wheels, uncompressed,
less those the image prunes: RuntimeRequirement.prune), the measure of what an image layer grows
by.
"""

from __future__ import annotations

import fnmatch
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from .base_image import BaseImage
from .runtime_deps import RuntimeSet
from .wheelhouse import Wheel, Wheelhouse, canonical_name, declared_dependencies


@dataclass(frozen=True)
class Footprint:
    backends: tuple[str, ...]  # backends that bring the same requirements share one footprint
    distributions: dict[str, str]  # canonical name -> version
    installed_bytes: int


def installed_size(path: Path, prune: Iterable[str] = ()) -> int:
    """The bytes a wheel's files take once installed (their uncompressed sizes), less the files
    matching `prune` (globs relative to the install folder; a folder's files with it)."""
    globs = [g for p in prune for g in (p, f"{p}/*")]
    with zipfile.ZipFile(path) as archive:
        return sum(
            info.file_size
            for info in archive.infolist()
            if not info.is_dir() and not any(fnmatch.fnmatchcase(info.filename, g) for g in globs)
        )


def _closure(roots: set[str], edges: dict[str, set[str]]) -> set[str]:
    seen: set[str] = set()
    pending = [r for r in roots if r in edges]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        pending.extend(d for d in edges[name] if d not in seen)
    return seen


def backend_footprints(runtime: RuntimeSet, wheelhouse: Wheelhouse, base: BaseImage) -> list[Footprint]:
    wheels: dict[str, Wheel] = {w.name: w for w in wheelhouse.wheels}
    skips = {
        canonical_name(r.name): r.skip_dependencies
        for requirements in runtime.backends.values()
        for r in requirements
        if r.skip_dependencies is not None
    }
    edges: dict[str, set[str]] = {}
    for name, wheel in wheels.items():
        if name in skips or not any(r.alone and canonical_name(r.name) == name for r in runtime.no_deps):
            declared = declared_dependencies(wheelhouse.directory / wheel.filename, base, skips.get(name, frozenset()))
            edges[name] = {canonical_name(_requirement_name(line)) for line in declared} & set(wheels)
        else:
            edges[name] = set()  # installed alone: its declared dependencies are not in the image for it
    groups: dict[frozenset[str], list[str]] = {}
    for backend, requirements in sorted(runtime.backends.items()):
        groups.setdefault(frozenset(canonical_name(r.name) for r in requirements), []).append(backend)
    backend_names = set().union(*groups) if groups else set()
    core = _closure({canonical_name(r.name) for r in runtime.resolved} - backend_names, edges)
    closures = {tuple(backends): _closure(set(names), edges) for names, backends in groups.items()}
    footprints = []
    for backends in sorted(closures):
        others = set(core).union(*(c for b, c in closures.items() if b != backends))
        own = sorted(closures[backends] - others)
        footprints.append(
            Footprint(
                backends,
                {name: wheels[name].version for name in own},
                sum(installed_size(wheelhouse.directory / wheels[name].filename, runtime.prune) for name in own),
            )
        )
    return footprints


def _requirement_name(line: str) -> str:
    for i, ch in enumerate(line):
        if ch in "<>=!~[; (@":
            return line[:i]
    return line
