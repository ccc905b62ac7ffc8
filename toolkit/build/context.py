"""The build context: a folder holding exactly what goes into the image, and its digest.

    <output>/
      Dockerfile            rendered from templates/Dockerfile.j2
      .dockerignore         rendered from templates/dockerignore.j2
      wheelhouse/           every wheel the image installs + requirements.txt (hash-pinned) + pip
      app/handlers/         the runtime package (checked: it imports no build-time code)
      repository/           models.json (the compiled manifest) + the selected models and versions
      envs/                 python models' EXECUTION_ENV_PATH environments (execution_envs.py)
      build.json            what was built and how (not part of the context)

Every file gets a fixed mode (0644, or 0755 when executable) and modification time, so the same
inputs give a byte-identical context: its digest (sha256 over paths, modes and contents) is the
default image tag, and the image's COPY layers are reproducible too.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from handlers.backends.python import INSTANCE_MODE_ENV

from .. import __version__
from ..repository.compile import MANIFEST_FILENAME, CompiledModel, CompiledRepository
from ..repository.discover import is_version_directory_name
from . import execution_envs
from .base_image import ARCH_PLATFORM, BaseImage
from .errors import BuildError
from .grpc_modules import FOLDER as GRPC_MODULES_FOLDER
from .grpc_modules import copy_generated_modules
from .hooks import python_autocomplete_command
from .runtime_deps import HTTP_NATIVE, RuntimeSet
from .runtime_imports import RUNTIME_PACKAGE, check_runtime_imports
from .targets import CONTAINER_MODULE, IMAGE_USER, LAMBDA_HANDLER, ImageLayout, Target
from .wheelhouse import Wheelhouse, file_sha256, install_into

# 1980-01-01T00:00:00Z: the oldest time every archive format (zip, tar) stores exactly.
EPOCH = 315532800
METADATA_FILENAME = "build.json"
REPORT_FILENAME = "build-report.json"
# The build report, metadata and deployment manifests (toolkit.deploy) describe the build and
# stay out of the image and its digest.
DEPLOY_FOLDER = "deploy"
NOT_IN_CONTEXT = (METADATA_FILENAME, REPORT_FILENAME, DEPLOY_FOLDER)
LABEL_PREFIX = "io.triton-serverless-toolkit"
CONTAINER_PORT = 8080


def templates_dir() -> Path:
    """`$TOOLKIT_TEMPLATES`, else the `templates/` folder of the toolkit checkout."""
    explicit = os.environ.get("TOOLKIT_TEMPLATES")
    if explicit:
        return Path(explicit)
    return Path(__file__).resolve().parents[2] / "templates"


def _environment() -> jinja2.Environment:
    folder = templates_dir()
    if not (folder / "Dockerfile.j2").is_file():
        raise BuildError(f"Dockerfile template not found in {folder} (set TOOLKIT_TEMPLATES to the templates folder)")
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


@dataclass(frozen=True)
class ImagePlan:
    """Everything that decides the image, settled before the context is written."""

    target: Target
    base: BaseImage
    device: str  # "cpu" or "gpu"
    layout: ImageLayout
    runtime: RuntimeSet
    name: str

    @property
    def platform(self) -> str:
        return ARCH_PLATFORM[self.base.arch]


@dataclass
class BuildContext:
    directory: Path
    digest: str  # "sha256:<hex>" over the whole context
    repository_digest: str  # "sha256:<hex>" over the shipped models (manifest included)
    labels: dict[str, str]
    model_bytes: dict[str, int]
    files: int
    size: int
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def dockerfile(self) -> Path:
        return self.directory / "Dockerfile"

    @property
    def default_tag(self) -> str:
        return self.digest.split(":", 1)[1][:12]


def check_output(output: Path) -> None:
    """Refuse an output that is not a folder toolkit build may replace (checked before any work)."""
    if output.exists():
        if not output.is_dir():
            raise BuildError(f"--output {output} exists and is not a directory")
        if any(output.iterdir()) and not (output / METADATA_FILENAME).is_file():
            raise BuildError(
                f"--output {output} is not empty and was not written by toolkit build ({METADATA_FILENAME} missing); "
                "choose another folder"
            )


def prepare_output(output: Path) -> None:
    """Empty `output` for a new context; refuse folders toolkit build did not write."""
    check_output(output)
    if output.exists():
        shutil.rmtree(output)
    output.mkdir(parents=True)


def _copy_tree(source: Path, destination: Path) -> None:
    shutil.copytree(
        source,
        destination,
        symlinks=False,
        ignore=shutil.ignore_patterns(".*", "__pycache__", "*.pyc"),
        copy_function=shutil.copyfile,
    )


def check_links(path: Path, allowed: tuple[Path, ...]) -> None:
    """Refuse a symbolic link, at or under `path`, that leads outside every `allowed` folder
    (resolved): copying follows links, so one to a host file (credentials, a home folder) would put
    that file into the image. Hidden entries and __pycache__ are never copied, so not checked."""
    bases = tuple(base.resolve() for base in allowed)
    entries = [path]
    if path.is_dir():
        for folder, dirs, files in os.walk(path, followlinks=True):
            dirs[:] = [d for d in dirs if not d.startswith(".") and d != "__pycache__"]
            entries += [Path(folder) / n for n in (*dirs, *files) if not n.startswith(".")]
    for entry in entries:
        if entry.is_symlink():
            target = entry.resolve()
            if not any(target.is_relative_to(base) for base in bases):
                raise BuildError(
                    f"{entry} is a symbolic link to {target}, outside the model repository: the image would "
                    "ship that file; copy what the model needs into its directory instead"
                )


def _shipped_entries(model: CompiledModel, elsewhere: set[Path] = frozenset()) -> list[Path]:
    """The entries of a model directory that go into the image: its files and folders, only the
    selected versions, no hidden entries or __pycache__, nor the `elsewhere` ones (execution
    environments, which the image gets unpacked)."""
    selected = {str(v) for v in model.versions}
    entries = []
    for entry in sorted(model.path.iterdir()):
        if entry.name.startswith(".") or entry.name == "__pycache__":
            continue
        if elsewhere and entry.resolve() in elsewhere:
            continue
        if entry.is_dir():
            numeric = entry.name.isascii() and entry.name.isdigit()
            if numeric and (not is_version_directory_name(entry.name) or entry.name not in selected):
                continue  # a version that is not served (or a folder Triton ignores)
        elif not entry.is_file():
            continue
        entries.append(entry)
    return entries


def check_model_links(compiled: CompiledRepository) -> None:
    """Links in what ships must stay inside the repository or the model's own directory
    (checked before the output folder is touched)."""
    elsewhere = execution_envs.shipped_elsewhere(compiled)
    for name in sorted(compiled.models):
        model = compiled.models[name]
        for entry in _shipped_entries(model, elsewhere):
            check_links(entry, (compiled.root, model.path))


def copy_models(compiled: CompiledRepository, repository: Path) -> dict[str, int]:
    """Copy the selected models with only their selected versions; returns bytes per model.
    Links are followed: call check_model_links first (render_context does)."""
    sizes: dict[str, int] = {}
    elsewhere = execution_envs.shipped_elsewhere(compiled)
    for name in sorted(compiled.models):
        model = compiled.models[name]
        destination = repository / model.path.relative_to(compiled.root)
        destination.mkdir(parents=True)
        for entry in _shipped_entries(model, elsewhere):
            if entry.is_dir():
                _copy_tree(entry, destination / entry.name)
            else:
                shutil.copyfile(entry, destination / entry.name)
        sizes[name] = sum(p.stat().st_size for p in destination.rglob("*") if p.is_file())
    compiled.write_manifest(repository / MANIFEST_FILENAME)
    return sizes


def copy_runtime(destination: Path) -> None:
    """Copy the `handlers` package (sources only) after checking what it imports. A native gRPC
    front end built in the tree (handlers/protocol/grpc/_grpcnative*.so, linked against this
    machine's grpc++) stays out, with its C++ source and build script (handlers/protocol/grpc/native,
    build-time code): the image serves gRPC with grpcio's server, or with the front end's wheel.
    The native HTTP front end (handlers/protocol/httpnative/_httpnative*.so and its native/) stays
    out too: an HTTP image serves with its wheel (TOOLKIT_HTTP_FRONTEND=native), or with uvicorn.
    handlers/protocol/native (the builder and the shared header) is build-time code as well."""
    import handlers

    package = Path(handlers.__file__).resolve().parent
    problems = check_runtime_imports(package)
    if problems:
        raise BuildError(
            "the runtime package cannot ship: " + "; ".join(str(p) for p in problems[:10])
            + (f" (and {len(problems) - 10} more)" if len(problems) > 10 else "")
        )
    shutil.copytree(
        package,
        destination / RUNTIME_PACKAGE,
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*", "_grpcnative*", "_httpnative*", "native"),
        copy_function=shutil.copyfile,
    )


def normalize_tree(root: Path) -> None:
    """Fixed modes and times for every entry, so archives of the context are reproducible."""
    for path in sorted(root.rglob("*"), reverse=True):
        if path.is_symlink():
            continue
        if path.is_dir():
            os.chmod(path, 0o755)
        else:
            executable = path.stat().st_mode & 0o111
            os.chmod(path, 0o755 if executable else 0o644)
        os.utime(path, (EPOCH, EPOCH))
    os.chmod(root, 0o755)
    os.utime(root, (EPOCH, EPOCH))


def tree_digest(root: Path, exclude: tuple[str, ...] = ()) -> str:
    """sha256 over (relative path, mode, content sha256) of every file under `root`."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*"), key=lambda p: p.relative_to(root).as_posix()):
        relative = path.relative_to(root).as_posix()
        if relative in exclude or relative.split("/", 1)[0] in exclude or not path.is_file():
            continue
        mode = path.stat().st_mode & 0o777
        digest.update(f"{relative}\0{mode:o}\0{file_sha256(path)}\n".encode())
    return "sha256:" + digest.hexdigest()


def _quote(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)


def _labels(plan: ImagePlan, compiled: CompiledRepository, repository_digest: str) -> dict[str, str]:
    models = sorted(compiled.models)
    versions = ";".join(f"{m}:{','.join(map(str, compiled.models[m].versions))}" for m in models)
    labels = {
        "org.opencontainers.image.description": (
            f"Triton model repository served over the KServe/Triton v2 inference protocol ({plan.target.name})"
        ),
        "org.opencontainers.image.base.name": plan.base.reference,
        f"{LABEL_PREFIX}.version": __version__,
        f"{LABEL_PREFIX}.target": plan.target.name,
        f"{LABEL_PREFIX}.device": plan.device,
        f"{LABEL_PREFIX}.models": ",".join(models),
        f"{LABEL_PREFIX}.versions": versions,
        f"{LABEL_PREFIX}.repository.digest": repository_digest,
        f"{LABEL_PREFIX}.python": plan.base.python,
        f"{LABEL_PREFIX}.protocol": plan.runtime.protocol,
    }
    if plan.runtime.cuda is not None:
        labels[f"{LABEL_PREFIX}.cuda"] = f"{plan.runtime.cuda.cuda_major} (driver >= {plan.runtime.cuda.min_driver})"
    return labels


def _env(plan: ImagePlan, wheelhouse: Wheelhouse) -> list[str]:
    env: list[tuple[str, str]] = []
    if not plan.base.lambda_base:
        env.append(("PYTHONPATH", plan.layout.python_path))
    env += [
        ("PYTHONDONTWRITEBYTECODE", "1"),
        ("PYTHONUNBUFFERED", "1"),
        ("HOME", "/tmp"),
        ("TOOLKIT_MANIFEST", plan.layout.manifest),
        (INSTANCE_MODE_ENV, plan.target.python_instance_mode),
    ]
    if plan.target.server:
        env.append(("PORT", str(CONTAINER_PORT)))
    if any(HTTP_NATIVE.imports == r.imports for r in plan.runtime.resolved):  # the native HTTP front end's wheel
        env.append(("TOOLKIT_HTTP_FRONTEND", "native"))
    if plan.runtime.protocol == "grpc":
        env.append(("TOOLKIT_PROTOCOL", "grpc"))
        env.append(("TOOLKIT_GRPC_MODULES", f"{plan.layout.app_dir}/{GRPC_MODULES_FOLDER}"))
    libraries = wheelhouse.library_dirs(plan.layout.deps_dir)
    if libraries:
        env.append(("LD_LIBRARY_PATH", ":".join(libraries)))
    return [f"{k}={_quote(v)}" for k, v in env]


def _command(plan: ImagePlan) -> tuple[list[str] | None, list[str]]:
    """(ENTRYPOINT, CMD) of the image."""
    if plan.target.server:
        return ["python3", "-m", CONTAINER_MODULE], []
    if plan.base.lambda_base:
        return None, [LAMBDA_HANDLER]  # the AWS base image's entrypoint runs its own runtime client
    return ["python3", "-m", "awslambdaric"], [LAMBDA_HANDLER]


def render_dockerfile(plan: ImagePlan, wheelhouse: Wheelhouse, labels: dict[str, str], autocomplete: str | None,
                      environments: list[execution_envs.PackedEnvironment] = ()) -> str:
    entrypoint, cmd = _command(plan)
    template = _environment().get_template("Dockerfile.j2")
    return template.render(
        toolkit_version=__version__,
        target=plan.target.name,
        base_image=plan.base.reference,
        python_version=plan.base.python,
        platform=plan.platform,
        device=plan.device,
        layout=plan.layout,
        pip_wheel=wheelhouse.pip.filename,
        prune=list(plan.runtime.prune),
        python_autocomplete_command=autocomplete,
        environments=sorted({e.key: e for e in environments}.values(), key=lambda e: e.key),
        envs_folder=execution_envs.FOLDER,
        envs_dir=execution_envs.ENVS_DIR,
        env=_env(plan, wheelhouse),
        labels=[f"{k}={_quote(v)}" for k, v in labels.items()],
        user=IMAGE_USER,
        port=CONTAINER_PORT if plan.target.server else None,
        entrypoint=json.dumps(entrypoint) if entrypoint else None,
        cmd=json.dumps(cmd) if cmd else None,
    )


def render_context(
    plan: ImagePlan,
    compiled: CompiledRepository,
    wheelhouse: Wheelhouse,
    output: Path,
    python_models: list[str],
) -> BuildContext:
    """Write the build context for `plan` into `output` (emptied first)."""
    check_model_links(compiled)
    prepare_output(output)
    repository = output / "repository"
    repository.mkdir()
    environments = execution_envs.write(compiled, output, EPOCH)  # before the manifest is written
    model_bytes = copy_models(compiled, repository)
    copy_runtime(output / "app")
    if plan.runtime.protocol == "grpc":
        copy_generated_modules(output / "app")
    install_into(wheelhouse, output / "wheelhouse", EPOCH)
    normalize_tree(output)
    repository_digest = tree_digest(repository)

    labels = _labels(plan, compiled, repository_digest)
    autocomplete = python_autocomplete_command(python_models, plan.layout)
    (output / "Dockerfile").write_text(render_dockerfile(plan, wheelhouse, labels, autocomplete, list(environments.values())))
    (output / ".dockerignore").write_text(_environment().get_template("dockerignore.j2").render(ignored=NOT_IN_CONTEXT))
    normalize_tree(output)

    digest = tree_digest(output, exclude=NOT_IN_CONTEXT)
    files = [p for p in output.rglob("*") if p.is_file()]
    context = BuildContext(
        directory=output,
        digest=digest,
        repository_digest=repository_digest,
        labels=labels,
        model_bytes=model_bytes,
        files=len(files),
        size=sum(p.stat().st_size for p in files),
    )
    return context


def write_metadata(context: BuildContext, document: dict[str, Any]) -> None:
    """build.json: what this context is (never part of the digest)."""
    context.metadata = {"digest": context.digest, "repository_digest": context.repository_digest, **document}
    path = context.directory / METADATA_FILENAME
    path.write_text(json.dumps(context.metadata, indent=2) + "\n")


_NAME_COMPONENT = re.compile(r"[^a-z0-9._-]+")


def default_image_name(repository: Path) -> str:
    """An image name from the repository folder: lower case, [a-z0-9._-] only."""
    name = _NAME_COMPONENT.sub("-", repository.resolve().name.lower()).strip("-._")
    return name or "models"
