"""toolkit build without a container engine: runtime dependencies, the runtime's import check,
base images, the build context (selection, manifest, digest), Dockerfiles (hadolint), the CLI.

Tests marked `network` download the real wheelhouse from the package index (CI has PyPI).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile
from importlib.metadata import requires
from pathlib import Path

import model_builders
import pytest
from conftest import write_config
from typer.testing import CliRunner

import handlers
from handlers.manifest import Manifest
from toolkit.build.base_image import BaseImage, known_base_image, parse_probe
from toolkit.build.context import (
    METADATA_FILENAME,
    ImagePlan,
    render_context,
    tree_digest,
)
from toolkit.build.errors import BuildError
from toolkit.build.report import full_batch_bytes, target_warnings
from toolkit.build.runtime_deps import (
    CORE,
    CUDA_LINES,
    FORBIDDEN_DISTRIBUTIONS,
    LAMBDA,
    ONNXRUNTIME_CPU,
    SERVER,
    runtime_requirements,
)
from toolkit.build.runtime_imports import check_runtime_imports
from toolkit.build.targets import LAMBDA_TASK_LAYOUT, OPT_LAYOUT, TARGETS
from toolkit.build.wheelhouse import Wheel, Wheelhouse, canonical_name
from toolkit.cli import app
from toolkit.repository.compile import compile_repository

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "samples" / "quickstart"
HADOLINT = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")


# -- runtime dependencies --------------------------------------------------------------------------


def _pyproject_requirements() -> dict[str, str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    specs = list(data["project"]["dependencies"])
    for extra in ("cpu", "lambda"):
        specs += data["project"]["optional-dependencies"][extra]
    found = {}
    for spec in specs:
        name = spec.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip()
        found[canonical_name(name)] = spec
    return found


def _floor(spec: str) -> str:
    return spec.split(">=", 1)[1].split(",")[0].strip() if ">=" in spec else ""


def test_runtime_requirements_declare_the_same_floors_as_pyproject() -> None:
    pyproject = _pyproject_requirements()
    for requirement in [*CORE, SERVER[0], *LAMBDA, ONNXRUNTIME_CPU]:
        name = canonical_name(requirement.name)
        assert name in pyproject, f"{name} is a runtime dependency but not in pyproject.toml"
        assert _floor(requirement.spec) == _floor(pyproject[name]), (requirement.spec, pyproject[name])


def test_uvicorn_accelerators_are_those_of_uvicorn_standard() -> None:
    standard = [r for r in requires("uvicorn") or [] if "extra == 'standard'" in r.replace('"', "'")]
    for requirement in SERVER[1:]:
        assert any(r.startswith(requirement.name) for r in standard), requirement.name


@pytest.mark.parametrize(
    "server, aws_lambda, runtime_client, gpu",
    [(True, False, False, None), (True, False, False, 12), (True, False, False, 13), (False, True, True, None), (False, True, False, None)],
)
def test_runtime_sets_never_carry_the_build_time_side(server: bool, aws_lambda: bool, runtime_client: bool, gpu: int | None) -> None:
    runtime = runtime_requirements(server=server, aws_lambda=aws_lambda, runtime_client=runtime_client, gpu_cuda=gpu)
    names = {canonical_name(r.name) for r in [*runtime.resolved, *runtime.no_deps]}
    assert not names & FORBIDDEN_DISTRIBUTIONS
    assert ("uvicorn" in names) == server
    assert ("mangum" in names) == aws_lambda
    assert ("awslambdaric" in names) == runtime_client
    assert [r.name for r in runtime.no_deps] == (["onnxruntime"] if gpu is None else ["onnxruntime-gpu"])
    assert all(r.no_deps for r in runtime.no_deps)
    if gpu is not None:
        assert runtime.cuda is CUDA_LINES[gpu]
        assert any(r.name.startswith("nvidia-cudnn") for r in runtime.resolved)


def test_cuda_12_line_is_the_last_onnxruntime_gpu_release_for_cuda_12() -> None:
    line = CUDA_LINES[12]
    assert line.onnxruntime.spec == "onnxruntime-gpu==1.26.0"
    assert line.min_driver == "525.60.13"
    assert all("cu12" in r.spec for r in line.libraries)


# -- the runtime ships alone -----------------------------------------------------------------------


def test_handlers_package_imports_only_the_standard_library_and_runtime_dependencies() -> None:
    assert check_runtime_imports(Path(handlers.__file__).parent) == []


def test_import_check_names_file_and_line_of_each_bad_import(tmp_path: Path) -> None:
    package = tmp_path / "handlers"
    package.mkdir()
    (package / "__init__.py").write_text("import json\nfrom . import sub\n")
    (package / "sub.py").write_text(
        textwrap.dedent(
            """\
            from __future__ import annotations
            import numpy as np
            from toolkit.cli import app

            def later():
                import boto3
                from requests import get
                from .other import thing
            """
        )
    )
    problems = check_runtime_imports(package)
    assert [(p.file.name, p.line, p.module) for p in problems] == [
        ("sub.py", 3, "toolkit.cli"),
        ("sub.py", 6, "boto3"),
        ("sub.py", 7, "requests"),
    ]
    assert "never import the build-time side" in problems[0].reason
    assert "not a declared runtime dependency" in problems[2].reason


# -- base images -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "reference, python, glibc, lambda_base",
    [
        ("public.ecr.aws/lambda/python:3.12", "3.12", (2, 34), True),
        ("public.ecr.aws/lambda/python:3.11", "3.11", (2, 26), True),
        ("python:3.12-slim-bookworm", "3.12", (2, 36), False),
        ("docker.io/library/python:3.13-slim-trixie", "3.13", (2, 41), False),
        ("python:3.11.9-slim", "3.11", (2, 36), False),
    ],
)
def test_known_base_images(reference: str, python: str, glibc: tuple[int, int], lambda_base: bool) -> None:
    base = known_base_image(reference, "x86_64")
    assert base is not None
    assert (base.python, base.glibc, base.lambda_base) == (python, glibc, lambda_base)


@pytest.mark.parametrize("reference", ["python:3.12-alpine", "debian:bookworm", "toolkit-ci/python:3.11-bookworm"])
def test_other_base_images_must_be_probed(reference: str) -> None:
    assert known_base_image(reference, "x86_64") is None


def test_wheel_platforms_cover_every_manylinux_tag_the_glibc_runs() -> None:
    x86 = BaseImage("b", "3.12", (2, 36), "x86_64", False, "test").wheel_platforms()
    assert x86[0] == "manylinux_2_36_x86_64"
    assert {"manylinux_2_28_x86_64", "manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64"} <= set(x86)
    arm = BaseImage("b", "3.12", (2, 34), "aarch64", False, "test").wheel_platforms()
    assert arm[0] == "manylinux_2_34_aarch64" and arm[-1] == "manylinux2014_aarch64"
    assert not any("manylinux1" in tag or "_2_5_" in tag for tag in arm)


def test_probe_output_is_parsed_and_checked() -> None:
    good = '{"python": "3.11", "implementation": "cpython", "libc": "glibc 2.36", "machine": "x86_64", "lambda_base": false}'
    base = parse_probe("img", "noise\n" + good + "\n", "x86_64")
    assert (base.python, base.glibc, base.source) == ("3.11", (2, 36), "probed")
    with pytest.raises(BuildError, match="not x86_64"):
        parse_probe("img", good.replace("x86_64", "aarch64"), "x86_64")
    with pytest.raises(BuildError, match="has no glibc"):
        parse_probe("img", good.replace("glibc 2.36", ""), "x86_64")


# -- the build context -----------------------------------------------------------------------------


def _tiny_wheel(folder: Path, filename: str, files: dict[str, bytes] | None = None) -> Wheel:
    path = folder / filename
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in (files or {"placeholder.txt": b"x"}).items():
            archive.writestr(name, data)
    return Wheel.from_file(path)


@pytest.fixture
def small_wheelhouse(tmp_path: Path) -> Wheelhouse:
    """A wheelhouse of small wheel files, for rendering tests (the download is tested elsewhere)."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    wheels = [_tiny_wheel(folder, "numpy-2.0.0-cp312-cp312-manylinux_2_28_x86_64.whl")]
    pip = _tiny_wheel(folder, "pip-25.0-py3-none-any.whl")
    return Wheelhouse(folder, wheels, pip, "k" * 64)


@pytest.fixture
def gpu_wheelhouse(small_wheelhouse: Wheelhouse) -> Wheelhouse:
    folder = small_wheelhouse.directory
    small_wheelhouse.wheels.append(
        _tiny_wheel(
            folder,
            "nvidia_cudnn_cu12-9.0.0-py3-none-manylinux_2_27_x86_64.whl",
            {"nvidia/cudnn/lib/libcudnn.so.9": b"", "nvidia/cudnn/include/cudnn.h": b"", "nvidia_cudnn_cu12-9.0.0.dist-info/METADATA": b""},
        )
    )
    return small_wheelhouse


def _repository(root: Path) -> Path:
    """add_sub with versions 1-3 (policy: latest 2), a label file, and files that must not ship."""
    shutil.copytree(QUICKSTART, root)
    config = root / "add_sub" / "config.pbtxt"
    config.write_text(config.read_text() + 'version_policy: { latest: { num_versions: 2 } }\n')
    for version in (2, 3):
        shutil.copytree(root / "add_sub" / "1", root / "add_sub" / str(version))
    (root / "add_sub" / "labels.txt").write_text("a\nb\n")
    (root / "add_sub" / ".secret").write_text("do not ship")
    (root / "add_sub" / "3" / "__pycache__").mkdir()
    (root / "add_sub" / "3" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    (root / "add_sub" / "010").mkdir()  # not a version for Triton
    (root / ".git").mkdir()
    return root


def _plan(target: str = "cloudrun", base: str = "python:3.12-slim-bookworm", device: str = "cpu", cuda: int | None = None) -> ImagePlan:
    described = known_base_image(base, "x86_64") or BaseImage(base, "3.11", (2, 36), "x86_64", False, "test")
    spec = TARGETS[target]
    runtime = runtime_requirements(
        server=spec.server, aws_lambda=target == "lambda", runtime_client=not described.lambda_base, gpu_cuda=cuda
    )
    layout = LAMBDA_TASK_LAYOUT if (target == "lambda" and described.lambda_base) else OPT_LAYOUT
    return ImagePlan(spec, described, device, layout, runtime, "quickstart")


def test_context_ships_only_selected_versions_and_a_loadable_manifest(tmp_path: Path, small_wheelhouse: Wheelhouse) -> None:
    repo = _repository(tmp_path / "repo")
    compiled = compile_repository(repo)
    assert compiled.ok and compiled.models["add_sub"].versions == [2, 3]
    context = render_context(_plan(), compiled, small_wheelhouse, tmp_path / "ctx", [])

    shipped = sorted(p.relative_to(context.directory / "repository").as_posix() for p in (context.directory / "repository").rglob("*") if p.is_file())
    assert shipped == [
        "add_sub/2/model.onnx", "add_sub/3/model.onnx", "add_sub/config.pbtxt", "add_sub/labels.txt", "models.json",
    ]
    manifest = Manifest.load(context.directory / "repository" / "models.json")
    spec = manifest.models["add_sub"]
    assert spec.versions == (2, 3)
    assert all(path.is_file() for path in spec.model_files.values())
    assert spec.directory == (context.directory / "repository" / "add_sub").resolve()
    assert (context.directory / "app" / "handlers" / "protocol" / "routes.py").is_file()
    assert not list((context.directory / "app").rglob("__pycache__"))
    requirements = (context.directory / "wheelhouse" / "requirements.txt").read_text()
    assert "numpy==2.0.0 --hash=sha256:" in requirements and "pip==" not in requirements


def test_same_inputs_give_the_same_digest_and_a_model_change_changes_it(tmp_path: Path, small_wheelhouse: Wheelhouse) -> None:
    repo = _repository(tmp_path / "repo")
    first = render_context(_plan(), compile_repository(repo), small_wheelhouse, tmp_path / "a", [])
    second = render_context(_plan(), compile_repository(repo), small_wheelhouse, tmp_path / "b", [])
    assert first.digest == second.digest and first.repository_digest == second.repository_digest
    assert first.default_tag == first.digest.removeprefix("sha256:")[:12]

    # build.json and the report describe the build: never part of the digest
    (second.directory / METADATA_FILENAME).write_text("{}")
    (second.directory / "build-report.json").write_text("{}")
    assert tree_digest(second.directory, exclude=("build.json", "build-report.json")) == first.digest

    (repo / "add_sub" / "labels.txt").write_text("a\nc\n")
    third = render_context(_plan(), compile_repository(repo), small_wheelhouse, tmp_path / "c", [])
    assert third.digest != first.digest and third.repository_digest != first.repository_digest
    dockerfile = third.dockerfile.read_text()
    assert third.repository_digest in dockerfile


def test_output_folder_not_written_by_toolkit_is_refused(tmp_path: Path, small_wheelhouse: Wheelhouse) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(BuildError, match="was not written by toolkit build"):
        render_context(_plan(), compile_repository(QUICKSTART), small_wheelhouse, mine, [])
    assert (mine / "notes.txt").read_text() == "keep me"


VARIANTS = {
    "cloudrun-cpu": {"target": "cloudrun"},
    "cloudrun-gpu": {"target": "cloudrun", "device": "gpu", "cuda": 12},
    "knative-gpu-cuda13": {"target": "knative", "device": "gpu", "cuda": 13},
    "lambda-aws-base": {"target": "lambda", "base": "public.ecr.aws/lambda/python:3.12"},
    "lambda-other-base": {"target": "lambda", "base": "toolkit-ci/python:3.11-bookworm"},
}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_generated_dockerfiles_pass_hadolint(variant: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    plan = _plan(**VARIANTS[variant])
    wheelhouse = request.getfixturevalue("gpu_wheelhouse" if plan.device == "gpu" else "small_wheelhouse")
    context = render_context(plan, compile_repository(QUICKSTART), wheelhouse, tmp_path / "ctx", [])
    dockerfile = context.dockerfile.read_text()
    result = subprocess.run([HADOLINT, "--no-color", str(context.dockerfile)], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr + dockerfile

    assert "USER 65532:65532" in dockerfile
    assert "--no-index" in dockerfile and "--require-hashes" in dockerfile
    assert 'io.triton-serverless-toolkit.models="add_sub"' in dockerfile
    assert 'io.triton-serverless-toolkit.versions="add_sub:1"' in dockerfile
    assert 'io.triton-serverless-toolkit.version="0.1.0"' in dockerfile
    if plan.target.server:
        assert 'ENTRYPOINT ["python3", "-m", "handlers.entrypoints.container"]' in dockerfile
        assert "EXPOSE 8080" in dockerfile and 'PORT="8080"' in dockerfile
    elif plan.base.lambda_base:
        assert "ENTRYPOINT" not in dockerfile
        assert 'CMD ["handlers.entrypoints.aws_lambda.handler"]' in dockerfile
        assert "--target /var/task" in dockerfile and "PYTHONPATH" not in dockerfile
    else:
        assert 'ENTRYPOINT ["python3", "-m", "awslambdaric"]' in dockerfile
        assert 'CMD ["handlers.entrypoints.aws_lambda.handler"]' in dockerfile
    if plan.device == "gpu":
        assert 'LD_LIBRARY_PATH="/opt/toolkit/python/nvidia/cudnn/lib"' in dockerfile
        assert f'io.triton-serverless-toolkit.cuda="{plan.runtime.cuda.cuda_major} (driver >= ' in dockerfile
    else:
        assert "LD_LIBRARY_PATH" not in dockerfile


# -- target warnings -------------------------------------------------------------------------------


def test_lambda_warns_about_gpu_batching_and_payload(repo: Path) -> None:
    write_config(
        repo,
        "big",
        """
        name: "big"
        backend: "onnxruntime"
        max_batch_size: 64
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
        output [ { name: "y" data_type: TYPE_FP32 dims: [ 3, 224, 224 ] } ]
        dynamic_batching { }
        instance_group [ { kind: KIND_GPU } ]
        """,
    )
    model_builders.identity(repo / "big" / "1" / "model.onnx", {"x": ("FP32", ["N", 3, 224, 224])}, ["y"])
    compiled = compile_repository(repo, device="cpu")
    assert compiled.ok, compiled.failures
    assert full_batch_bytes(compiled.models["big"].config) == 64 * 3 * 224 * 224 * 4
    warnings = "\n".join(target_warnings(TARGETS["lambda"], compiled, ["big"]))
    assert "AWS Lambda has no GPU: big asked for KIND_GPU" in warnings
    assert "mapped to KIND_CPU" in warnings  # the compiler's own warning is carried along
    assert "dynamic_batching of big never batches across requests" in warnings
    assert "6 MB" in warnings and "big: a request carrying a full batch (64)" in warnings
    cloudrun = "\n".join(target_warnings(TARGETS["cloudrun"], compiled, ["big"]))
    assert "32 MiB" in cloudrun and "no GPU" not in cloudrun


# -- the command line ------------------------------------------------------------------------------

runner = CliRunner()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--target", "appengine"], "unknown target 'appengine'"),
        (["--target", "cloudrun", "--platform", "linux/arm64"], "cloudrun runs linux/amd64 images only"),
        (["--target", "lambda", "--device", "gpu"], "lambda has no GPU"),
        (["--target", "cloudrun", "--tag", "bad tag"], "invalid image tag"),
        (["--target", "cloudrun", "--name", "Quick"], "invalid image name"),
        (["--target", "cloudrun", "--cuda", "11"], "unsupported CUDA major 11"),
    ],
)
def test_option_errors_exit_2_before_any_work(args: list[str], message: str, tmp_path: Path) -> None:
    result = runner.invoke(app, ["build", str(QUICKSTART), "--builder", "none", "--output", str(tmp_path / "o"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert not (tmp_path / "o").exists()


def test_invalid_model_fails_with_file_and_line(repo: Path, tmp_path: Path) -> None:
    write_config(repo, "bad", 'name: "bad"\nbackend: "onnxruntime"\nmax_batch_size: -1\n')
    result = runner.invoke(app, ["build", str(repo), "--target", "cloudrun", "--builder", "none", "--output", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "nothing was built" in result.output
    assert "'max_batch_size' must be non-negative value for bad" in result.output
    assert str(repo / "bad" / "config.pbtxt") in result.output


@pytest.mark.network
def test_builder_none_writes_a_reproducible_context_and_prints_the_command(tmp_path: Path) -> None:
    """The real wheelhouse (pip download for Python 3.12, manylinux) and the whole pipeline."""
    out = tmp_path / "ctx"
    result = runner.invoke(app, ["build", str(QUICKSTART), "--target", "cloudrun", "--builder", "none", "--output", str(out), "-q"])
    assert result.exit_code == 0, result.output
    metadata = json.loads((out / METADATA_FILENAME).read_text())
    report = json.loads((out / "build-report.json").read_text())
    tag = metadata["tag"]
    assert tag == metadata["digest"].removeprefix("sha256:")[:12]
    assert report["image"] is None and report["cold_start"]["measured"] is False
    assert f"-t quickstart:{tag}" in report["build_command"] and "--network none" in report["build_command"]
    assert f"quickstart:{tag}" in result.output
    # Cloud Run sends a container concurrent requests: python models run in model processes
    assert report["python_instance_mode"] == "process"
    assert 'TOOLKIT_PYTHON_INSTANCE_MODE="process"' in (out / "Dockerfile").read_text()
    # the runtime's CPU thread budget on the service's CPUs (2 instances -> --cpu 2 -> 1 thread each)
    assert report["cpu_budget"]["cpus"] == 2 and report["cpu_budget"]["basis"] == "cloudrun --cpu 2"
    assert [m["cpu_threads"] for m in report["models"]] == ["1 (budget)"]
    deps = report["python_deps"]
    assert {"numpy", "onnxruntime", "fastapi", "uvicorn", "uvloop", "httptools", "orjson", "prometheus-client"} <= set(deps)
    assert not set(deps) & (FORBIDDEN_DISTRIBUTIONS | {"mangum", "awslambdaric", "flatbuffers", "onnxruntime-gpu"})
    wheels = sorted(p.name for p in (out / "wheelhouse").glob("*.whl"))
    assert any(w.startswith("onnxruntime-") and "cp312" in w and "manylinux" in w for w in wheels)
    lint = subprocess.run([HADOLINT, "--no-color", str(out / "Dockerfile")], check=False, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout

    again = runner.invoke(app, ["build", str(QUICKSTART), "--target", "cloudrun", "--builder", "none", "--output", str(out), "-q"])
    assert again.exit_code == 0, again.output
    assert json.loads((out / METADATA_FILENAME).read_text())["digest"] == metadata["digest"]


@pytest.mark.network
def test_lambda_context_selects_models_and_adds_model_requirements(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(QUICKSTART, repo)
    pm = repo / "pm"
    write_config(
        repo,
        "pm",
        """
        name: "pm"
        backend: "python"
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
        """,
    )
    (pm / "1").mkdir()
    (pm / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    (pm / "requirements.txt").write_text("six==1.16.0\n")
    out = tmp_path / "ctx"
    result = runner.invoke(
        app,
        ["build", str(repo), "--target", "lambda", "--model", "pm", "--builder", "none", "--output", str(out),
         "--base-image", "public.ecr.aws/lambda/python:3.12", "-q"],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "build-report.json").read_text())
    assert [m["name"] for m in report["models"]] == ["pm"]
    assert not (out / "repository" / "add_sub").exists()
    assert report["python_deps"]["six"] == "1.16.0"
    assert "mangum" in report["python_deps"] and "awslambdaric" not in report["python_deps"]  # AWS base has its own
    assert not any("auto_complete_config" in w for w in report["warnings"])  # pm has none: nothing runs in the image
    assert any("6 MB" in w for w in report["warnings"])
    # one request per environment: single-instance python models stay in the serving process
    assert report["python_instance_mode"] == "auto"
    assert 'TOOLKIT_PYTHON_INSTANCE_MODE="auto"' in (out / "Dockerfile").read_text()
    assert "python instances" in result.output and "TOOLKIT_PYTHON_INSTANCE_MODE=auto" in result.output

    (pm / "requirements.txt").write_text("onnxruntime\n")
    clash = runner.invoke(
        app, ["build", str(repo), "--target", "lambda", "--model", "pm", "--builder", "none", "--output", str(out),
              "--base-image", "public.ecr.aws/lambda/python:3.12", "-q"],
    )
    assert clash.exit_code == 1
    assert "pull in onnxruntime" in clash.output and "remove it from requirements.txt" in clash.output


def test_foreign_platform_needs_qemu_to_build() -> None:
    import platform as host

    from toolkit.build.builders import check_platform_buildable

    machine = host.machine().lower()
    native = "linux/arm64" if machine in ("aarch64", "arm64") else "linux/amd64"
    foreign = "linux/amd64" if native == "linux/arm64" else "linux/arm64"
    check_platform_buildable(native)
    qemu = Path("/proc/sys/fs/binfmt_misc") / ("qemu-x86_64" if foreign == "linux/amd64" else "qemu-aarch64")
    if qemu.exists():
        check_platform_buildable(foreign)  # emulation registered: the RUN step can execute
    else:
        with pytest.raises(BuildError, match="needs QEMU user emulation"):
            check_platform_buildable(foreign)


@pytest.mark.network
def test_arm64_lambda_context_gets_aarch64_wheels(tmp_path: Path) -> None:
    out = tmp_path / "ctx"
    result = runner.invoke(
        app, ["build", str(QUICKSTART), "--target", "lambda", "--platform", "linux/arm64", "--builder", "none", "--output", str(out), "-q"]
    )
    assert result.exit_code == 0, result.output
    wheels = [p.name for p in (out / "wheelhouse").glob("*.whl")]
    binary = [w for w in wheels if not w.endswith("-none-any.whl")]
    assert binary and all("aarch64" in w for w in binary), binary
    assert "--platform linux/arm64" in json.loads((out / "build-report.json").read_text())["build_command"]


def test_output_inside_the_repository_is_refused(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(QUICKSTART, repo)
    result = runner.invoke(app, ["build", str(repo), "--target", "cloudrun", "--builder", "none", "--output", str(repo / "ctx")])
    assert result.exit_code == 2, result.output
    assert "inside the model repository" in result.output
    assert not (repo / "ctx").exists()


def test_buildah_image_sizes_are_read_as_bytes_whatever_form_buildah_prints() -> None:
    """buildah 1.2x prints `"size": "309 MB"` (go-units text, decimal) in `images --json`; newer
    ones print bytes. Both read as bytes; anything else is a clear build error, not a crash."""
    from toolkit.build.builders import _buildah_size
    from toolkit.build.errors import BuildError

    assert _buildah_size("309 MB") == 309_000_000
    assert _buildah_size("1.5 GB") == 1_500_000_000
    assert _buildah_size("512 B") == 512
    assert _buildah_size(303_456_789) == 303_456_789
    with pytest.raises(BuildError, match="cannot read"):
        _buildah_size("lots")
