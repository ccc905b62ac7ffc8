"""The wheelhouse: every wheel the image installs, downloaded on the host for the image's platform.

`pip download --only-binary=:all: --platform ... --python-version ... --abi ...` fetches the
runtime's wheels (and the models' requirements.txt) for the base image's Python and C library,
so the image build needs no network and no compiler: the Dockerfile installs them with
`pip install --no-index --no-deps --require-hashes` from the wheelhouse's `requirements.txt`,
which pins every wheel by version and sha256.

Resolution runs in two steps: the `no_deps` requirements (ONNX Runtime, torch) are downloaded
alone first, each from its own index where it names one (PyTorch's wheels); the dependencies a
`skip_dependencies` requirement's wheel declares (markers evaluated for the image's Python and
platform), minus the skipped ones, then join the requirements installed with their
dependencies, which are resolved together. A pip wheel is added to bootstrap the install in base
images that have no pip (it is not installed into the image).

A model's requirements.txt may name local wheels (`./wheels/acme-0.1-py3-none-any.whl`,
`--find-links ./wheels`): paths are relative to the requirements.txt's folder, as one expects
(pip takes a requirement's path relative to its working directory, so the file is handed to pip
with such paths made absolute); a path that does not exist is an error naming the file and line.

Wheelhouses are cached by everything that decides their content (requirements, model
requirement files and the local files they name, Python, platform tags, pip's index settings),
so rebuilding the same inputs gives the same wheels and the same context digest. `refresh=True`
resolves again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from .base_image import BaseImage
from .errors import BuildError
from .runtime_deps import RuntimeSet

LOCK_FILENAME = "wheelhouse.json"
REQUIREMENTS_FILENAME = "requirements.txt"
ONNXRUNTIME_DISTRIBUTIONS = frozenset({"onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino", "onnxruntime-directml"})
_WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(?:-\d[^-]*)?-[^-]+-[^-]+-[^-]+\.whl$")

Progress = Callable[[str], None]


def canonical_name(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def default_cache_dir() -> Path:
    """``$TOOLKIT_WHEEL_CACHE``, default ``~/.cache/toolkit/wheelhouse``."""
    return Path(os.environ.get("TOOLKIT_WHEEL_CACHE", "~/.cache/toolkit/wheelhouse")).expanduser()


@dataclass(frozen=True)
class Wheel:
    filename: str
    name: str  # canonical
    version: str
    sha256: str
    size: int

    @classmethod
    def from_file(cls, path: Path) -> Wheel:
        match = _WHEEL_NAME.match(path.name)
        if not match:
            raise BuildError(f"unexpected file in wheelhouse: {path.name}")
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        return cls(path.name, canonical_name(match["name"]), match["version"], digest.hexdigest(), path.stat().st_size)

    @property
    def requirement_line(self) -> str:
        return f"{self.name}=={self.version} --hash=sha256:{self.sha256}"


# Requirement-file options whose value is a path (pip resolves -r/-c and existing --find-links
# folders relative to the file; they are made absolute all the same).
_PATH_OPTIONS = ("-r", "--requirement", "-c", "--constraint", "-f", "--find-links")
_ARCHIVE_SUFFIXES = (".whl", ".zip", ".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz", ".txz", ".tar")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _looks_like_path(token: str) -> bool:
    """A requirement that pip takes as a local path rather than a project name."""
    return token.startswith((".", "/", "~")) or "/" in token or token.lower().endswith(_ARCHIVE_SUFFIXES)


@dataclass(frozen=True)
class ModelRequirements:
    """A model's requirements.txt (Python-backend models' own dependencies)."""

    model: str
    path: Path

    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")

    def _local(self, value: str, line: int, *, must_exist: bool) -> Path:
        """`value` (not a URL) as a path relative to this file's folder."""
        path = (self.path.parent / Path(value).expanduser()).resolve()
        if must_exist and not path.exists():
            raise BuildError(
                f"{self.path}:{line}: '{value}' does not exist (model '{self.model}'; local paths in requirements.txt "
                f"are relative to its folder, {self.path.parent})"
            )
        return path

    def resolved(self) -> tuple[str, list[Path]]:
        """The file's text with local paths made absolute (comments dropped), and the local
        files and folders it names (their content is part of the wheelhouse's cache key)."""
        lines: list[str] = []
        local: list[Path] = []
        raw = self.text().splitlines()
        index = 0
        while index < len(raw):
            number, text = index + 1, raw[index]
            while text.endswith("\\") and index + 1 < len(raw):  # pip joins continued lines
                index += 1
                text = text[:-1] + raw[index]
            index += 1
            content = re.sub(r"(^|\s)#.*$", "", text).strip()  # pip's comment rule
            lines.append(self._resolve_line(content, number, local) if content else "")
        return "\n".join(lines) + "\n", local

    def _resolve_line(self, content: str, line: int, local: list[Path]) -> str:
        if content.startswith("-"):
            match = re.match(r"^(--?[A-Za-z-]+)(?:\s*=\s*|\s+)(\S+)(.*)$", content)
            if match is None or match[1] not in _PATH_OPTIONS or _URL.match(match[2]):
                return content
            option, value, rest = match[1], match[2], match[3]
            if option in ("-f", "--find-links"):
                path = self._local(value, line, must_exist=False)
                if not path.exists():
                    return content  # pip looks for it elsewhere (and says so)
            else:
                path = self._local(value, line, must_exist=True)
            local.append(path)
            return f"{option} {path}{rest}"
        token = content.split(None, 1)[0].split(";", 1)[0]
        if _URL.match(token) or not _looks_like_path(token):
            return content  # a project name, or a URL
        path = self._local(token, line, must_exist=True)
        local.append(path)
        return f"{path}{content[len(token):]}"


@dataclass
class Wheelhouse:
    directory: Path
    wheels: list[Wheel]  # installed into the image
    pip: Wheel  # bootstraps the install; not installed
    key: str
    reused: bool = False

    @property
    def size(self) -> int:
        return sum(w.size for w in self.wheels)

    def requirements_text(self) -> str:
        lines = ["# Every wheel the image installs, pinned by version and hash (toolkit build)."]
        lines += [w.requirement_line for w in sorted(self.wheels, key=lambda w: w.name)]
        return "\n".join(lines) + "\n"

    def versions(self) -> dict[str, str]:
        return {w.name: w.version for w in sorted(self.wheels, key=lambda w: w.name)}

    def library_dirs(self, site_packages: str) -> list[str]:
        """Folders of shared libraries shipped by NVIDIA's wheels (CUDA, cuDNN) after install,
        for LD_LIBRARY_PATH: onnxruntime's CUDA provider dlopens them by soname."""
        import zipfile

        folders: set[str] = set()
        for wheel in self.wheels:
            if not wheel.name.startswith("nvidia-"):
                continue
            with zipfile.ZipFile(self.directory / wheel.filename) as archive:
                for entry in archive.namelist():
                    if ".dist-info/" in entry or ".data/" in entry:
                        continue
                    if re.search(r"\.so(\.\d+)*$", entry):
                        folders.add(entry.rsplit("/", 1)[0])
        return [f"{site_packages}/{folder}" for folder in sorted(folders)]


def _pip_base(base: BaseImage) -> list[str]:
    command = [
        sys.executable, "-m", "pip", "download",
        "--disable-pip-version-check", "--progress-bar", "off",
        "--only-binary=:all:",
        "--implementation", "cp",
        "--python-version", base.python,
        "--abi", base.python_tag,
    ]
    for tag in base.wheel_platforms():
        command += ["--platform", tag]
    return command


def _pip_settings() -> dict[str, str]:
    """pip's index settings decide what resolves: part of the cache key."""
    return {k: v for k, v in sorted(os.environ.items()) if k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS")}


def _local_digest(path: Path) -> str:
    """sha256 of a local file, or of a folder's files (name, size, content) one level deep."""
    if path.is_file():
        return file_sha256(path)
    entries = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else []
    return hashlib.sha256("".join(f"{p.name}\0{file_sha256(p)}\n" for p in entries).encode()).hexdigest()


def file_sha256(path: Path) -> str:
    """The hex sha256 of a file's content."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _spec_key(spec: str) -> str:
    """A requirement as the cache key sees it: a local wheel file (the native gRPC front end's, from
    the wheel cache or TOOLKIT_GRPC_NATIVE_WHEELS) by its name and content, wherever it lies."""
    path = Path(spec)
    if spec.endswith(".whl") and path.is_file():
        return f"{path.name} sha256:{file_sha256(path)}"
    return spec


def cache_key(runtime: RuntimeSet, model_requirements: Iterable[ModelRequirements], base: BaseImage) -> str:
    models = []
    for m in model_requirements:
        _, local = m.resolved()
        models.append([m.model, m.text(), [[str(p), _local_digest(p)] for p in local]])
    document = {
        "python": base.python,
        "platforms": base.wheel_platforms(),
        "resolved": [_spec_key(r.spec) for r in runtime.resolved],
        "no_deps": [r.key for r in runtime.no_deps],
        "models": models,
        "pip": _pip_settings(),
    }
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


def _run_pip(command: list[str], what: str, progress: Progress | None) -> None:
    if progress:
        progress(f"pip download ({what})")
    process = subprocess.run(command, check=False, capture_output=True, text=True)
    if process.returncode != 0:
        output = (process.stdout + process.stderr).splitlines()
        useful = [ln for ln in output if "is ignored: it is neither a file nor a directory" not in ln]
        hint = ""
        if any("No matching distribution" in ln or "Could not find a version" in ln for ln in useful):
            hint = (
                " (no wheel for this Python/platform: the image installs wheels only, never source "
                "distributions; check the requirement or choose another --base-image/--platform)"
            )
        raise BuildError(f"pip could not download the {what}{hint}", detail="\n".join(useful[-25:]))


def _load_cached(entry: Path) -> Wheelhouse | None:
    lock = entry / LOCK_FILENAME
    if not lock.is_file():
        return None
    try:
        data = json.loads(lock.read_text())
        wheels = [Wheel(**w) for w in data["wheels"]]
        pip = Wheel(**data["pip"])
    except (ValueError, KeyError, TypeError):
        return None
    for wheel in [*wheels, pip]:
        path = entry / wheel.filename
        if not path.is_file() or path.stat().st_size != wheel.size:
            return None
    return Wheelhouse(entry, wheels, pip, data["key"], reused=True)


def build_wheelhouse(
    runtime: RuntimeSet,
    model_requirements: list[ModelRequirements],
    base: BaseImage,
    *,
    cache_dir: Path | None = None,
    refresh: bool = False,
    progress: Progress | None = None,
) -> Wheelhouse:
    """Download (or reuse from the cache) the wheels of an image."""
    key = cache_key(runtime, model_requirements, base)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    entry = root / key[:32]
    if not refresh:
        cached = _load_cached(entry)
        if cached is not None:
            if progress:
                progress(f"wheelhouse reused from cache {entry}")
            return cached
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=root))
    try:
        wheels, pip = _download(runtime, model_requirements, base, work, progress)
        (work / LOCK_FILENAME).write_text(
            json.dumps({"key": key, "wheels": [asdict(w) for w in wheels], "pip": asdict(pip)}, indent=1) + "\n"
        )
        if entry.exists():
            # Move the old entry aside atomically: a build that uses it keeps its files (hard
            # links into its context were made already), later builds see the new one.
            entry.rename(root / f".stale-{key[:12]}-{os.getpid()}-{time.monotonic_ns()}")
        try:
            work.rename(entry)
        except OSError:  # another build filled the same entry meanwhile: use theirs
            cached = _load_cached(entry)
            if cached is None:
                raise
            return cached
    finally:
        if work.exists():
            shutil.rmtree(work, ignore_errors=True)
        for stale in root.glob(f".stale-{key[:12]}-*"):
            shutil.rmtree(stale, ignore_errors=True)
    return Wheelhouse(entry, wheels, pip, key)


def _marker_environment(base: BaseImage) -> dict[str, str]:
    """PEP 508 marker values of the image's Python (for a wheel's declared dependencies)."""
    return {
        "python_version": base.python, "python_full_version": f"{base.python}.0", "implementation_name": "cpython",
        "platform_python_implementation": "CPython", "implementation_version": f"{base.python}.0",
        "os_name": "posix", "sys_platform": "linux", "platform_system": "Linux", "platform_machine": base.arch,
        "extra": "",
    }


def declared_dependencies(wheel: Path, base: BaseImage, skip: frozenset[str]) -> list[str]:
    """The dependencies a wheel declares for the image (Requires-Dist whose markers hold there,
    no extras), except the `skip`ped names, as requirement lines without their markers."""
    import zipfile
    from email.parser import HeaderParser

    from packaging.requirements import InvalidRequirement, Requirement

    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
        if not names:
            raise BuildError(f"{wheel.name} has no .dist-info/METADATA")
        metadata = HeaderParser().parsestr(archive.read(names[0]).decode("utf-8"))
    environment = _marker_environment(base)
    lines: list[str] = []
    for text in metadata.get_all("Requires-Dist") or []:
        try:
            requirement = Requirement(text)
        except InvalidRequirement as exc:
            raise BuildError(f"{wheel.name} declares a dependency pip cannot read: {text!r} ({exc})") from None
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        if canonical_name(requirement.name) in skip:
            continue
        requirement.marker = None
        lines.append(str(requirement))
    return lines


def _download_alone(runtime: RuntimeSet, base: BaseImage, dest: Path, progress: Progress | None) -> dict[str, Path]:
    """The `no_deps` requirements, each group from its index; canonical name -> wheel."""
    groups: dict[str | None, list[str]] = {}
    for requirement in runtime.no_deps:
        groups.setdefault(requirement.index_url, []).append(requirement.spec)
    for index, specs in groups.items():
        command = [*_pip_base(base), "--dest", str(dest), "--no-deps"]
        if index:
            command += ["--extra-index-url", index]
        try:
            _run_pip([*command, *specs], ", ".join(specs) + (f" (from {index})" if index else ""), progress)
        except BuildError as exc:
            if not index:
                raise
            raise BuildError(
                f"{exc.message}: this machine must reach {index}, or a mirror of it named by the requirement's "
                "override (docs/backends.md: TOOLKIT_TORCH_INDEX_URL for PyTorch)", detail=exc.detail,
            ) from None
    found = {Wheel.from_file(p).name: p for p in dest.glob("*.whl")}
    for requirement in runtime.no_deps:
        if canonical_name(requirement.name) not in found:
            raise BuildError(f"pip downloaded nothing for {requirement.spec}")
    return found


def _download(
    runtime: RuntimeSet, model_requirements: list[ModelRequirements], base: BaseImage, dest: Path, progress: Progress | None
) -> tuple[list[Wheel], Wheel]:
    alone_dir = dest / "alone"
    alone_dir.mkdir()
    alone = _download_alone(runtime, base, alone_dir, progress)
    derived: list[str] = []
    for requirement in runtime.no_deps:
        if requirement.skip_dependencies is not None:
            wheel = alone[canonical_name(requirement.name)]
            derived += declared_dependencies(wheel, base, requirement.skip_dependencies)

    resolved_in = dest / "runtime.in"
    resolved_in.write_text("\n".join([*(r.spec for r in runtime.resolved), *derived]) + "\n")
    command = [*_pip_base(base), "--dest", str(dest), "-r", str(resolved_in)]
    what = "runtime dependencies" + (" and model requirements" if model_requirements else "")
    with tempfile.TemporaryDirectory(prefix="toolkit-requirements-") as folder:
        for index, model in enumerate(model_requirements):
            # the model's file with its local paths made absolute (see the module doc)
            copy = Path(folder) / f"{index}-{model.model}.txt"
            copy.write_text(model.resolved()[0], encoding="utf-8")
            command += ["-r", str(copy)]
        _run_pip(command, what, progress)
    resolved_wheels = {w.name: w for w in (Wheel.from_file(p) for p in dest.glob("*.whl"))}
    resolved = set(resolved_wheels)
    owners = ", ".join(m.model for m in model_requirements) or "the runtime"
    pulled = sorted(resolved & ONNXRUNTIME_DISTRIBUTIONS)
    if pulled:
        raise BuildError(
            f"the requirements of {owners} pull in {', '.join(pulled)}: the image's ONNX Runtime is chosen by "
            "toolkit build (onnxruntime on CPU, onnxruntime-gpu for GPU images, onnxruntime-openvino for models "
            "with the openvino execution accelerator); remove it from requirements.txt"
        )
    chosen = sorted(resolved & set(alone))
    if chosen:
        raise BuildError(
            f"the requirements of {owners} pull in {', '.join(chosen)}, which toolkit build chooses for this image "
            f"({', '.join(r.spec for r in runtime.no_deps if canonical_name(r.name) in chosen)}, for the repository's "
            "models); remove it from requirements.txt"
        )
    torch = resolved_wheels.get("torch")
    if torch is not None and runtime.cuda is None and "+cpu" not in torch.version:
        raise BuildError(
            f"the requirements of {owners} pull in torch {torch.version}, PyTorch's CUDA build (with gigabytes of CUDA "
            "libraries), into a CPU image: take the CPU build from PyTorch's index instead: put "
            "`--extra-index-url https://download.pytorch.org/whl/cpu` and `torch==<version>+cpu` in requirements.txt"
        )
    forbidden = sorted(resolved & runtime.forbidden_distributions)
    if forbidden and not model_requirements:
        raise BuildError(f"the runtime's dependencies unexpectedly bring {', '.join(forbidden)} (toolkit/build/runtime_deps.py)")

    for wheel in alone.values():
        wheel.rename(dest / wheel.name)
    alone_dir.rmdir()
    # pip itself only bootstraps the install (any recent pip runs on Python >= 3.9).
    pip_dir = dest / "bootstrap"
    pip_dir.mkdir()
    _run_pip([*_pip_base(base), "--dest", str(pip_dir), "--no-deps", "pip"], "pip (installer bootstrap)", progress)
    (pip_file,) = pip_dir.glob("pip-*.whl")
    pip_file.rename(dest / pip_file.name)
    pip_dir.rmdir()
    resolved_in.unlink()

    wheels = [Wheel.from_file(p) for p in sorted(dest.glob("*.whl")) if p.name != pip_file.name]
    names = [w.name for w in wheels]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise BuildError(f"conflicting versions downloaded for {', '.join(duplicates)}: pin them in requirements.txt")
    return wheels, Wheel.from_file(dest / pip_file.name)


def install_into(wheelhouse: Wheelhouse, target: Path, epoch: int) -> None:
    """Place the wheelhouse (wheels, pip, requirements.txt) into the build context."""
    target.mkdir(parents=True, exist_ok=True)
    for wheel in [*wheelhouse.wheels, wheelhouse.pip]:
        source = wheelhouse.directory / wheel.filename
        destination = target / wheel.filename
        try:
            os.link(source, destination)
        except OSError:
            shutil.copyfile(source, destination)
        os.chmod(destination, 0o644)
        os.utime(destination, (epoch, epoch))
    requirements = target / REQUIREMENTS_FILENAME
    requirements.write_text(wheelhouse.requirements_text())
    os.chmod(requirements, 0o644)
    os.utime(requirements, (epoch, epoch))
