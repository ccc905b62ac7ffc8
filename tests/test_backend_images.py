"""Images carry only what their models need: each backend's frameworks (runtime_deps.BACKEND_RUNTIME),
the wheelhouse that downloads them (PyTorch's CPU build from PyTorch's index, without torch's
compiler tools), what each backend adds to an image (build report), and `toolkit validate`
naming the backends a repository needs."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import torch
import torch_models as tm
from typer.testing import CliRunner

from toolkit.build.base_image import BaseImage
from toolkit.build.errors import BuildError
from toolkit.build.footprint import backend_footprints
from toolkit.build.report import add_ready_seconds, backend_entries
from toolkit.build.runtime_deps import (
    CUDA_LINES,
    FORBIDDEN_DISTRIBUTIONS,
    ONNXRUNTIME_OPENVINO_KEY,
    TORCH_BUILD_TIME_DEPENDENCIES,
    TORCH_INDEX_ENV,
    allowed_runtime_imports,
    runtime_requirements,
)
from toolkit.build.wheelhouse import ModelRequirements, Wheel, Wheelhouse, build_wheelhouse, canonical_name, declared_dependencies
from toolkit.cli import app
from toolkit.repository.compile import compile_repository

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "samples" / "quickstart"
BASE = BaseImage("toolkit-ci/python:3.11-bookworm", "3.11", (2, 36), "x86_64", False, "--python-version")
runner = CliRunner()


def _names(requirements) -> list[str]:
    return [canonical_name(r.name) for r in requirements]


# -- which frameworks an image gets ---------------------------------------------------------------


def test_onnx_only_images_are_unchanged_and_carry_no_torch(monkeypatch):
    monkeypatch.delenv(TORCH_INDEX_ENV, raising=False)
    for cuda in (None, 12, 13):
        runtime = runtime_requirements(server=True, aws_lambda=False, runtime_client=False, gpu_cuda=cuda, backends={"onnxruntime"})
        names = _names([*runtime.resolved, *runtime.no_deps])
        assert "torch" not in names and not any(n.startswith("nvidia-cudnn-cu13") for n in names if cuda == 12)
        assert list(runtime.backends) == ["onnxruntime"]


def test_torch_comes_from_pytorchs_index_as_the_cpu_or_matching_cuda_build(monkeypatch):
    monkeypatch.delenv(TORCH_INDEX_ENV, raising=False)
    expected = {None: ("+cpu", "https://download.pytorch.org/whl/cpu"), 12: ("+cu128", "https://download.pytorch.org/whl/cu128"),
                13: ("+cu130", "https://download.pytorch.org/whl/cu130")}
    for cuda, (label, index) in expected.items():
        runtime = runtime_requirements(server=True, aws_lambda=False, runtime_client=False, gpu_cuda=cuda, backends={"pytorch"})
        (torch_requirement,) = runtime.no_deps  # no ONNX Runtime for a pytorch-only repository
        assert torch_requirement.spec == f"torch==2.13.0{label}" and torch_requirement.index_url == index
        assert torch_requirement.skip_dependencies == TORCH_BUILD_TIME_DEPENDENCIES
        names = _names(runtime.resolved)
        assert not any(n.startswith("nvidia-cu") for n in names)  # ONNX Runtime's CUDA libraries are not needed
        assert ("nvidia-ml-py" in names) == (cuda is not None)
    both = runtime_requirements(server=True, aws_lambda=False, runtime_client=False, gpu_cuda=12, backends={"pytorch", "python"})
    assert _names(both.no_deps) == ["onnxruntime-gpu", "torch"]  # python models keep ONNX Runtime
    assert sorted(both.backends) == ["python", "pytorch"]


def test_the_torch_index_is_configurable(monkeypatch):
    monkeypatch.setenv(TORCH_INDEX_ENV, "https://mirror.example/pytorch/cpu")
    runtime = runtime_requirements(server=True, aws_lambda=False, runtime_client=False, gpu_cuda=None, backends={"pytorch"})
    assert runtime.no_deps[0].index_url == "https://mirror.example/pytorch/cpu"
    monkeypatch.setenv(TORCH_INDEX_ENV, "")
    runtime = runtime_requirements(server=True, aws_lambda=False, runtime_client=False, gpu_cuda=None, backends={"pytorch"})
    assert runtime.no_deps[0].index_url is None  # pip's own configuration (PIP_INDEX_URL, PIP_FIND_LINKS)


def test_the_runtime_may_import_every_backends_framework():
    assert {"torch", "onnxruntime"} <= allowed_runtime_imports()


def test_torch_beside_openvino_and_the_openvino_accelerator(monkeypatch):
    """onnxruntime-openvino replaces onnxruntime in the image and in what each backend brings;
    torch and openvino stay their own backends' frameworks."""
    monkeypatch.delenv(TORCH_INDEX_ENV, raising=False)
    keys = {"onnxruntime", "python", ONNXRUNTIME_OPENVINO_KEY, "openvino", "pytorch"}
    runtime = runtime_requirements(server=True, aws_lambda=False, runtime_client=False, gpu_cuda=None, backends=keys)
    assert sorted(_names(runtime.no_deps)) == ["onnxruntime-openvino", "openvino", "torch"]
    assert {b: _names(r) for b, r in runtime.backends.items()} == {
        ONNXRUNTIME_OPENVINO_KEY: ["onnxruntime-openvino"], "openvino": ["openvino"], "pytorch": ["torch"],
    }
    assert runtime.prune and all(not p.startswith("torch/") for p in runtime.prune)


# -- a wheel's declared dependencies --------------------------------------------------------------


def _wheel(folder: Path, name: str, version: str, requires: list[str], files: dict[str, bytes] | None = None) -> Path:
    path = folder / f"{name}-{version}-py3-none-any.whl"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{info}/METADATA", metadata)
        archive.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        for file, content in (files or {}).items():
            archive.writestr(file, content)
        archive.writestr(f"{info}/RECORD", "")
    return path


def test_declared_dependencies_follow_the_images_python_and_platform(tmp_path):
    wheel = _wheel(tmp_path, "torch", "2.13.0+cu130", [
        "filelock", "typing-extensions>=4.10.0", "sympy>=1.13.3", "jinja2",
        'cuda-toolkit[cublas,cudart]==13.0.3; platform_system == "Linux"',
        'triton==3.7.1; platform_system == "Linux" and python_version < "3.15"',
        'pywin32; sys_platform == "win32"', 'optree>=0.13.0; extra == "optree"',
    ])
    assert declared_dependencies(wheel, BASE, TORCH_BUILD_TIME_DEPENDENCIES) == [
        "typing-extensions>=4.10.0", "cuda-toolkit[cublas,cudart]==13.0.3",
    ]


def test_what_each_backend_adds_is_what_only_its_models_need(tmp_path):
    folder = tmp_path / "wheels"
    folder.mkdir()
    made = [
        _wheel(folder, "numpy", "2.0.0", []),
        _wheel(folder, "typing_extensions", "4.12.0", []),
        _wheel(folder, "fastapi", "0.110.0", ["typing-extensions"]),
        _wheel(folder, "onnxruntime", "1.20.0", ["numpy", "protobuf"], {"onnxruntime/capi.so": b"o" * 5000}),
        _wheel(folder, "torch", "2.13.0+cpu", ["typing-extensions", "sympy", "mpmath-only-for-sympy"], {"torch/lib/libtorch.so": b"t" * 70000}),
    ]
    wheels = [Wheel.from_file(p) for p in made]
    pip = Wheel.from_file(_wheel(folder, "pip", "25.0", []))
    runtime = runtime_requirements(server=False, aws_lambda=False, runtime_client=False, gpu_cuda=None,
                                   backends={"onnxruntime", "python", "pytorch"})
    footprints = {f.backends: f for f in backend_footprints(runtime, Wheelhouse(folder, wheels, pip, "k"), BASE)}
    assert set(footprints) == {("onnxruntime", "python"), ("pytorch",)}
    assert footprints[("pytorch",)].distributions == {"torch": "2.13.0+cpu"}  # typing-extensions: fastapi needs it too
    assert 70000 <= footprints[("pytorch",)].installed_bytes < 71000
    assert footprints[("onnxruntime", "python")].distributions == {"onnxruntime": "1.20.0"}

    repo = tmp_path / "models"
    tm.write_model(repo, "t", tm.config("t", [tm.tensor("x", "TYPE_FP32", [4])], [tm.tensor("y", "TYPE_FP32", [4])]),
                   lambda p: tm.save_script(tm.Raises(), p))
    entries = backend_entries(compile_repository(repo), list(footprints.values()))
    metrics = (
        '# TYPE toolkit_model_load_duration_seconds gauge\n'
        'toolkit_model_load_duration_seconds{model="t",version="1"} 0.75\n'
        'toolkit_model_warmup_duration_seconds{model="t",version="1"} 0.25\n'
    )
    add_ready_seconds(entries, compile_repository(repo), metrics)
    by_backend = {tuple(e.backends): e for e in entries}
    assert by_backend[("pytorch",)].models == ["t"] and by_backend[("pytorch",)].ready_seconds == 1.0
    assert by_backend[("onnxruntime", "python")].ready_seconds is None


def test_what_a_backend_adds_leaves_out_the_files_the_image_prunes(tmp_path):
    folder = tmp_path / "wheels"
    folder.mkdir()
    made = [
        _wheel(folder, "numpy", "2.0.0", []),
        _wheel(folder, "openvino", "2026.4.1", ["numpy", "openvino-telemetry"], {
            "openvino/libs/libopenvino.so.2026.4.1": b"k" * 3000,
            "openvino/libs/libopenvino_intel_gpu_plugin.so": b"g" * 50000,  # pruned
            "openvino/include/openvino/core.hpp": b"h" * 20000,  # pruned with its folder
        }),
        _wheel(folder, "torch", "2.13.0+cpu", [], {"torch/lib/libtorch.so": b"t" * 7000}),
    ]
    pip = Wheel.from_file(_wheel(folder, "pip", "25.0", []))
    runtime = runtime_requirements(server=False, aws_lambda=False, runtime_client=False, gpu_cuda=None,
                                   backends={"openvino", "pytorch"})
    wheelhouse = Wheelhouse(folder, [Wheel.from_file(p) for p in made], pip, "k")
    footprints = {f.backends: f for f in backend_footprints(runtime, wheelhouse, BASE)}
    assert 3000 <= footprints[("openvino",)].installed_bytes < 4000
    assert 7000 <= footprints[("pytorch",)].installed_bytes < 8000


# -- the real download ----------------------------------------------------------------------------


@pytest.mark.network
def test_the_wheelhouse_takes_torchs_cpu_build_without_its_compiler_tools(tmp_path):
    """pip downloads torch 2.13.0+cpu (from PyTorch's CPU index, or pip's own configuration where
    that index is not reachable), and the image gets typing-extensions from its declared
    dependencies but none of sympy, networkx, jinja2, fsspec, filelock, setuptools."""
    runtime = runtime_requirements(server=True, aws_lambda=False, runtime_client=False, gpu_cuda=None, backends={"pytorch"})
    wheelhouse = build_wheelhouse(runtime, [], BASE, cache_dir=tmp_path / "cache")
    versions = wheelhouse.versions()
    assert versions["torch"] == "2.13.0+cpu"
    assert "typing-extensions" in versions and "onnxruntime" not in versions
    assert not set(versions) & (TORCH_BUILD_TIME_DEPENDENCIES | FORBIDDEN_DISTRIBUTIONS | {"mpmath", "markupsafe"})
    assert not any(name.startswith("nvidia-") for name in versions)
    (footprint,) = backend_footprints(runtime, wheelhouse, BASE)
    assert footprint.distributions == {"torch": "2.13.0+cpu"} and footprint.installed_bytes > 300_000_000

    # a python model whose requirements.txt pulls torch into an image that already has it
    requirements = tmp_path / "pm" / "requirements.txt"
    requirements.parent.mkdir()
    wheels = tmp_path / "pm" / "wheels"
    wheels.mkdir()
    _wheel(wheels, "torch", "2.13.0", [])  # PyPI's name and version: PyTorch's CUDA build
    requirements.write_text("./wheels/torch-2.13.0-py3-none-any.whl\n")
    both = runtime_requirements(server=True, aws_lambda=False, runtime_client=False, gpu_cuda=None, backends={"pytorch", "python"})
    with pytest.raises(BuildError, match="pull in torch, which toolkit build chooses for this image"):
        build_wheelhouse(both, [ModelRequirements("pm", requirements)], BASE, cache_dir=tmp_path / "cache")
    python_only = runtime_requirements(server=True, aws_lambda=False, runtime_client=False, gpu_cuda=None, backends={"python"})
    with pytest.raises(BuildError, match=r"pull in torch 2\.13\.0, PyTorch's CUDA build .* into a CPU image"):
        build_wheelhouse(python_only, [ModelRequirements("pm", requirements)], BASE, cache_dir=tmp_path / "cache")


# -- toolkit validate names the backends ----------------------------------------------------------


def test_validate_prints_the_backends_a_repository_needs(tmp_path):
    repo = tmp_path / "models"
    import shutil

    shutil.copytree(QUICKSTART, repo)
    tm.write_model(repo, "t", tm.config("t", [tm.tensor("x", "TYPE_FP32", [4])], [tm.tensor("y", "TYPE_FP32", [4])]),
                   lambda p: tm.save_script(tm.Raises(), p))
    result = runner.invoke(app, ["validate", str(repo)])
    assert result.exit_code == 0, result.output
    assert "backends needed: onnxruntime (onnxruntime>=1.18), pytorch (torch==2.13.0+cpu)" in result.output
    document = json.loads(runner.invoke(app, ["validate", str(repo), "--json", "--device", "gpu"]).stdout)
    assert document["backends"] == {"onnxruntime": ["onnxruntime-gpu==1.26.0"], "pytorch": ["torch==2.13.0+cu128"]}
    only_onnx = json.loads(runner.invoke(app, ["validate", str(QUICKSTART), "--json"]).stdout)
    assert only_onnx["backends"] == {"onnxruntime": ["onnxruntime>=1.18"]}

    config = repo / "add_sub" / "config.pbtxt"  # the onnxruntime model asks for OpenVINO's execution provider
    config.write_text(config.read_text() + '\noptimization { execution_accelerators { cpu_execution_accelerator: [ { name: "openvino" } ] } }\n')
    accelerated = json.loads(runner.invoke(app, ["validate", str(repo), "--json"]).stdout)
    assert accelerated["backends"] == {
        "onnxruntime": [], ONNXRUNTIME_OPENVINO_KEY: ["onnxruntime-openvino==1.24.1"], "pytorch": ["torch==2.13.0+cpu"],
    }
