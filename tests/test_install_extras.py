"""onnxruntime and onnxruntime-gpu ship the same module: the extras keep them apart, and the
runtime refuses to load ONNX models when both distributions are installed."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_extras_never_pull_both_runtimes():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("onnxruntime") for d in project["dependencies"])
    extras = project["optional-dependencies"]
    assert any(d.startswith("onnxruntime>=") for d in extras["cpu"])
    assert any(d.startswith("onnxruntime-gpu") for d in extras["gpu"])

    def closure(name: str, seen: frozenset = frozenset()) -> set[str]:
        found: set[str] = set()
        for requirement in extras[name]:
            if requirement.startswith("triton-serverless-toolkit["):
                for inner in requirement.split("[", 1)[1].rstrip("]").split(","):
                    if inner not in seen:
                        found |= closure(inner, seen | {name})
            else:
                found.add(requirement.split(">")[0].split("=")[0].split("<")[0].split("[")[0])
        return found

    for extra in extras:
        packages = closure(extra)
        assert not {"onnxruntime", "onnxruntime-gpu"} <= packages, extra


def test_runtime_refuses_both_distributions(tmp_path):
    # a second distribution's metadata next to the real onnxruntime (what `pip install` of both leaves)
    dist = tmp_path / "onnxruntime_gpu-1.31.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: onnxruntime-gpu\nVersion: 1.31.1\n")
    script = (
        "from handlers.backends.onnxruntime import _ort, ModelLoadError\n"
        "try:\n    _ort()\nexcept ModelLoadError as e:\n    print(e)\nelse:\n    print('loaded')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert "onnxruntime and onnxruntime-gpu are all installed" in out.stdout, out.stdout + out.stderr
    assert "pip uninstall -y onnxruntime onnxruntime-gpu" in out.stdout


def test_with_one_distribution_the_check_imports_nothing(tmp_path):
    """The usual case (one ONNX Runtime distribution, every image): the check lists the import
    path's folders and asks importlib.metadata nothing (its imports are ~12 ms of a cold start).
    A `.dist-info` of another project whose name starts the same way does not count."""
    (tmp_path / "onnxruntime_extensions-0.14.0.dist-info").mkdir()
    script = (
        "import sys\n"
        "from handlers.backends.onnxruntime import _ort, _several_onnxruntime_dist_infos\n"
        "print(_ort().__name__, _several_onnxruntime_dist_infos(), 'importlib.metadata' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert out.stdout.split() == ["onnxruntime", "False", "False"], out.stdout + out.stderr
