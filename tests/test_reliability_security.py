"""Security defaults of what `toolkit build` ships: build contexts hold no credentials or host
files, and every image runs as a non-root user.

The build host is set up the way a developer's machine looks: credentials in $HOME (~/.aws,
~/.docker, ~/.ssh, ~/.netrc, a Google key file), secrets in environment variables, and a model
repository with a .git folder, a .env file and a symlink to the credentials. None of it may reach
the context (the context is all an engine sees, and all an image can contain).

Covered elsewhere and referenced in docs/security.md: the image's user and read-only root under a
real engine (tests/test_build_e2e.py), Lambda Function URLs with AWS_IAM and a least-privilege
execution role (tests/test_deploy_manifests.py::test_sam_template_defaults,
tests/test_deploy_lambda.py::test_first_deploy_creates_everything), Cloud Run services private
unless --allow-unauthenticated (tests/test_deploy_cloudrun.py).
"""

from __future__ import annotations

import re
import shutil
import zipfile
from pathlib import Path

import pytest

from toolkit.build.base_image import BaseImage, known_base_image
from toolkit.build.context import ImagePlan, render_context
from toolkit.build.errors import BuildError
from toolkit.build.runtime_deps import runtime_requirements
from toolkit.build.targets import LAMBDA_TASK_LAYOUT, OPT_LAYOUT, TARGETS
from toolkit.build.wheelhouse import Wheel, Wheelhouse
from toolkit.repository.compile import compile_repository

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "samples" / "quickstart"
MARKER = "TOOLKIT-TEST-SECRET-7f3a9c"  # in every planted secret: found anywhere = leaked

VARIANTS = {
    "cloudrun": ("cloudrun", "python:3.12-slim-bookworm"),
    "knative": ("knative", "python:3.12-slim-bookworm"),
    "lambda-aws-base": ("lambda", "public.ecr.aws/lambda/python:3.12"),
    "lambda-other-base": ("lambda", "python:3.12-slim-bookworm"),
}


def _wheel(folder: Path, filename: str) -> Wheel:
    with zipfile.ZipFile(folder / filename, "w") as archive:
        archive.writestr("placeholder.txt", b"x")
    return Wheel.from_file(folder / filename)


@pytest.fixture
def wheelhouse(tmp_path: Path) -> Wheelhouse:
    folder = tmp_path / "wheels"
    folder.mkdir()
    wheels = [_wheel(folder, "numpy-2.0.0-cp312-cp312-manylinux_2_28_x86_64.whl")]
    return Wheelhouse(folder, wheels, _wheel(folder, "pip-25.0-py3-none-any.whl"), "k" * 64)


def _plan(variant: str) -> ImagePlan:
    target, base = VARIANTS[variant]
    described = known_base_image(base, "x86_64") or BaseImage(base, "3.12", (2, 36), "x86_64", False, "test")
    spec = TARGETS[target]
    runtime = runtime_requirements(server=spec.server, aws_lambda=target == "lambda",
                                   runtime_client=not described.lambda_base, gpu_cuda=None)
    layout = LAMBDA_TASK_LAYOUT if (target == "lambda" and described.lambda_base) else OPT_LAYOUT
    return ImagePlan(spec, described, "cpu", layout, runtime, "quickstart")


@pytest.fixture
def developer_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A $HOME and environment full of credentials, and a repository with files that must not ship."""
    home = tmp_path / "home"
    for relative in (".aws/credentials", ".aws/config", ".docker/config.json", ".ssh/id_ed25519", ".netrc",
                     ".config/gcloud/application_default_credentials.json", ".kube/config"):
        path = home / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"secret = {MARKER}\n")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", f"AKIA{MARKER}")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", MARKER)
    monkeypatch.setenv("AWS_SESSION_TOKEN", MARKER)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(home / ".config/gcloud/application_default_credentials.json"))
    monkeypatch.setenv("DOCKER_AUTH_CONFIG", MARKER)
    monkeypatch.setenv("PIP_INDEX_URL", f"https://user:{MARKER}@pypi.example.com/simple")

    repo = tmp_path / "repo"
    shutil.copytree(QUICKSTART, repo)
    (repo / ".git").mkdir()
    (repo / ".git" / "config").write_text(f"[remote]\n url = https://{MARKER}@github.com/x/y\n")
    (repo / ".env").write_text(f"TOKEN={MARKER}\n")
    (repo / "add_sub" / ".env").write_text(f"TOKEN={MARKER}\n")
    (repo / "add_sub" / "1" / ".aws").mkdir()
    (repo / "add_sub" / "1" / ".aws" / "credentials").write_text(MARKER)
    (repo / "add_sub" / "1" / "__pycache__").mkdir()
    (repo / "add_sub" / "1" / "__pycache__" / "x.pyc").write_text(MARKER)
    (repo / "add_sub" / ".cache-link").symlink_to(home / ".aws" / "credentials")  # hidden: never copied
    return repo


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_context_holds_no_credentials_or_host_files(developer_machine: Path, wheelhouse: Wheelhouse,
                                                    tmp_path: Path, variant: str) -> None:
    repo = developer_machine
    compiled = compile_repository(repo, device="cpu")
    assert compiled.ok, compiled.failures
    context = render_context(_plan(variant), compiled, wheelhouse, tmp_path / "ctx", [])
    directory = context.directory

    assert sorted(p.name for p in directory.iterdir()) == [".dockerignore", "Dockerfile", "app", "repository", "wheelhouse"]
    shipped = sorted(p.relative_to(directory / "repository").as_posix()
                     for p in (directory / "repository").rglob("*") if p.is_file())
    assert shipped == ["add_sub/1/model.onnx", "add_sub/config.pbtxt", "models.json"]
    assert not list(directory.rglob("__pycache__")) and not [p for p in directory.rglob(".*") if p.name != ".dockerignore"]
    assert not [p for p in directory.rglob("*") if p.is_symlink()]
    for path in directory.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert MARKER.encode() not in data, path
            assert str(Path.home()).encode() not in data, path  # no host path either
    assert not (directory / "app" / "toolkit").exists() and not (directory / "app" / "tests").exists()


def test_link_out_of_the_repository_is_refused(developer_machine: Path, wheelhouse: Wheelhouse, tmp_path: Path) -> None:
    """Copying follows links, so a link to a host file would ship that file: refused, naming it.
    Links that stay inside the repository (shared weights, a symlinked version) still work."""
    repo = developer_machine
    credentials = Path.home() / ".aws" / "credentials"
    (repo / "add_sub" / "notes.txt").symlink_to(credentials)
    compiled = compile_repository(repo, device="cpu")
    with pytest.raises(BuildError, match=re.escape(f"{repo / 'add_sub' / 'notes.txt'} is a symbolic link to {credentials}")):
        render_context(_plan("cloudrun"), compiled, wheelhouse, tmp_path / "ctx", [])
    (repo / "add_sub" / "notes.txt").unlink()
    (repo / "add_sub" / "1" / "keys").symlink_to(credentials.parent, target_is_directory=True)
    with pytest.raises(BuildError, match="outside the model repository"):
        render_context(_plan("cloudrun"), compile_repository(repo, device="cpu"), wheelhouse, tmp_path / "ctx", [])
    (repo / "add_sub" / "1" / "keys").unlink()

    (repo / "shared").mkdir()
    (repo / "shared" / "labels.txt").write_text("a\nb\n")
    (repo / "add_sub" / "labels.txt").symlink_to(repo / "shared" / "labels.txt")
    context = render_context(_plan("cloudrun"), compile_repository(repo, device="cpu"), wheelhouse, tmp_path / "ctx", [])
    assert (context.directory / "repository" / "add_sub" / "labels.txt").read_text() == "a\nb\n"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_images_run_as_a_non_root_user(wheelhouse: Wheelhouse, tmp_path: Path, variant: str) -> None:
    context = render_context(_plan(variant), compile_repository(QUICKSTART, device="cpu"), wheelhouse, tmp_path / "ctx", [])
    dockerfile = context.dockerfile.read_text()
    final_stage = dockerfile.rsplit("\nFROM ", 1)[1]
    users = re.findall(r"^USER\s+(\S+)", final_stage, flags=re.MULTILINE)
    assert users == ["65532:65532"], users  # numeric (no passwd entry needed), never root
    assert not re.search(r"^(ARG|ENV)\s.*(SECRET|TOKEN|PASSWORD|KEY_ID)", dockerfile, flags=re.MULTILINE | re.IGNORECASE)
