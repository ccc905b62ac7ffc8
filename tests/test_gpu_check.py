"""The GPU proof (scripts/gpu-check.sh, bench/gpu.py) up to the point where a GPU is needed: it
detects what is missing here, runs the CPU mode against a real `toolkit serve`, compiles the
CUDA and TensorRT repositories for `--device gpu` (the seeds' optimization block included), and
says exactly what it would run on a GPU. No GPU is lent to CI: the GPU modes themselves run
only on a machine with one (docs/performance.md, "The GPU proof")."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import gpu  # noqa: E402


def quick_check(tmp_path: Path, models: str) -> tuple[Path, str]:
    """bench/gpu.py --check on `models` at x0.25 width (the full width is the same code, slower):
    its work folder and output, once it has exited 0 (skipped where an NVIDIA driver is)."""
    work = tmp_path / "work"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu.py"), "--check", "--models", models, "--width", "0.25",
         "--window", "1", "--concurrency", "2", "--work", str(work), "--out", str(tmp_path / "results")],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    out = done.stdout + done.stderr
    if shutil.which("nvidia-smi") is not None:
        pytest.skip("this machine has an NVIDIA driver: the GPU modes ran (see the output)")
    assert done.returncode == 0, out
    return work, out


def test_gpu_check_runs_everything_but_the_gpu_and_prints_the_plan(tmp_path):
    work, out = quick_check(tmp_path, "text_recognition")
    assert "text_recognition [cpu]: toolkit serve" in out and "infer/s at c2" in out
    assert "No usable NVIDIA GPU here:" in out and "no nvidia-smi: no NVIDIA driver on this machine" in out
    assert "onnxruntime has no CUDAExecutionProvider" in out
    assert "TensorRT 10 libraries (libnvinfer.so.10, libnvonnxparser.so.10" in out
    for mode in ("cuda", "tensorrt cold", "tensorrt warm"):
        assert f"text_recognition [{mode}]: toolkit serve {work}/repos/text_recognition-{mode.split()[0]} --device gpu" in out
    assert f"TOOLKIT_TRT_CACHE_DIR={work}/trt-cache emptied first" in out
    assert not (tmp_path / "results").exists()  # results are written for GPU runs only
    # the repositories the GPU modes would serve: the guide's config on KIND_GPU, TensorRT FP16 for tensorrt
    config = (work / "repos" / "text_recognition-tensorrt" / "text_recognition" / "config.pbtxt").read_text()
    assert "kind: KIND_GPU" in config and 'parameters { key: "precision_mode" value: "FP16" }' in config
    assert gpu.compile_check(work / "repos" / "text_recognition-tensorrt", "tensorrt cold") == []


def test_without_check_a_machine_without_gpu_exits_2(tmp_path):
    code = gpu.main(["--models", "text_recognition", "--width", "0.25", "--window", "1", "--concurrency", "1",
                     "--work", str(tmp_path / "w"), "--out", str(tmp_path / "r")]) \
        if shutil.which("nvidia-smi") is None else pytest.skip("an NVIDIA driver is here")
    assert code == 2


def test_the_tensorrt_repository_carries_the_seeds_optimization_block(tmp_path):
    onnx, how = gpu.text_recognition_onnx(tmp_path / "m.onnx", width=0.25)
    repo = gpu.text_repository(tmp_path, "tensorrt warm", onnx)
    from toolkit.repository.compile import compile_repository

    config = compile_repository(repo, None, "gpu").models["text_recognition"].config
    accelerator = config["optimization"]["execution_accelerators"]["gpu_execution_accelerator"][0]
    assert accelerator["name"] == "tensorrt"
    assert accelerator["parameters"] == {"precision_mode": "FP16", "max_workspace_size_bytes": "1073741824"}
    assert config["optimization"]["graph"]["level"] == 1
    assert [(g["kind"], g["count"]) for g in config["instance_group"]] == [("KIND_GPU", 2)]
    assert "onnx.helper" in how


def test_outputs_are_compared_relative_to_their_scale_and_by_argmax():
    rng = np.random.default_rng(0)
    reference = rng.standard_normal((4, 26, 37)).astype(np.float32) * 10
    close = reference + 0.01
    assert gpu.compare_text(reference, close, "cuda")["ok"]
    fp16 = reference.astype(np.float16).astype(np.float32)
    assert gpu.compare_text(reference, fp16, "tensorrt cold")["ok"]
    wrong = reference.copy()
    wrong[:, :, 0] += 50  # the argmax moves everywhere
    result = gpu.compare_text(reference, wrong, "cuda")
    assert not result["ok"] and result["argmax_agreement"] < 0.5
    lines = [("HELLO TRITON", 0.98, [10, 10, 200, 40])]
    assert gpu.compare_ocr(lines, [("HELLO TRITON", 0.97, [11, 10, 200, 41])], "cuda")["ok"]
    assert not gpu.compare_ocr(lines, [("HELL0 TRITON", 0.97, [11, 10, 200, 41])], "cuda")["ok"]


def test_gpu_check_installs_the_cuda_12_line_and_tensorrt_10():
    """The venv gets the GPU images' onnxruntime-gpu (the CUDA 12 line) and the TensorRT 10
    libraries its TensorRT provider links (libnvinfer.so.10)."""
    from toolkit.build.runtime_deps import CUDA_LINES

    out = subprocess.run([str(ROOT / "scripts" / "gpu-check.sh"), "--print-requirements"], capture_output=True,
                         text=True, check=True, timeout=60).stdout.splitlines()
    assert out[0].endswith("[gpu,tune]")
    assert out[1:] == [CUDA_LINES[12].onnxruntime.spec, *(lib.spec for lib in CUDA_LINES[12].libraries),
                       "pillow>=10.1", "tensorrt-cu12-libs>=10.14,<11",
                       "torch==2.13.0+cu128", "--extra-index-url https://download.pytorch.org/whl/cu128"]


def test_gpu_check_installs_the_gpu_images_torch_from_the_configured_index():
    """torch is the GPU images' build (runtime_deps.torch_requirement for the CUDA 12 line), from
    TOOLKIT_TORCH_INDEX_URL where one is set; an empty value leaves the index to pip's settings."""
    from toolkit.build.runtime_deps import CUDA_LINES, torch_requirement

    def requirements(index: str | None) -> list[str]:
        env = {k: v for k, v in os.environ.items() if k != "TOOLKIT_TORCH_INDEX_URL"}
        if index is not None:
            env["TOOLKIT_TORCH_INDEX_URL"] = index
        return subprocess.run([str(ROOT / "scripts" / "gpu-check.sh"), "--print-requirements"], capture_output=True,
                              text=True, check=True, timeout=60, env=env).stdout.splitlines()

    assert requirements(None)[-2] == torch_requirement(CUDA_LINES[12]).spec
    assert requirements("http://mirror.internal/simple")[-1] == "--extra-index-url http://mirror.internal/simple"
    assert requirements("")[-1] == "torch==2.13.0+cu128"


def test_the_torchscript_set_runs_on_cpu_and_plans_its_cuda_mode(tmp_path):
    """The guide's STRModel traced by torch, served by pytorch_libtorch (x0.25 width: quick); its
    KIND_GPU repository compiles for --device gpu; without a GPU the cuda mode is planned, and
    torch's CPU build is named as what stands in the way."""
    work, out = quick_check(tmp_path, "text_recognition_torch")
    assert "text_recognition_torch [cpu]: toolkit serve" in out and "infer/s at c2" in out
    assert "is a CPU build: the text_recognition_torch set's cuda mode needs torch's CUDA build" in out
    assert f"text_recognition_torch [cuda]: toolkit serve {work}/repos/text_recognition_torch-cuda --device gpu " \
           "(KIND_GPU instances of pytorch_libtorch on cuda:0" in out
    assert "text_recognition_torch [tensorrt" not in out  # pytorch_libtorch has no TensorRT accelerator
    from toolkit.repository.compile import compile_repository

    repo = work / "repos" / "text_recognition_torch-cuda"
    assert gpu.compile_check(repo, "cuda") == []
    config = compile_repository(repo, None, "gpu").models["text_recognition"].config
    assert config["platform"] == "pytorch_libtorch" and config["backend"] == "pytorch"
    assert [(g["kind"], g["count"]) for g in config["instance_group"]] == [("KIND_GPU", 2)]
    assert [i["name"] for i in config["input"]] == ["INPUT__0"] and [o["name"] for o in config["output"]] == ["OUTPUT__0"]


def test_the_torchscript_outputs_agree_with_torch_and_the_onnx_export(tmp_path):
    """The set's model file is torch's own module: served on CPU it gives what torch gives, and
    what the ONNX export of the same network gives (the sets are the same model)."""
    import onnxruntime
    import torch

    pt = gpu.text_recognition_torchscript(tmp_path / "m.pt", width=0.25)
    rows = gpu._text_inputs()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.load, as the backend loads it
        expected = torch.jit.load(str(pt))(torch.from_numpy(rows)).numpy()
    assert expected.shape == (4, 26, 37)
    onnx = gpu.str_model.export(tmp_path / "m.onnx", output_channels=128)
    exported = onnxruntime.InferenceSession(str(onnx)).run(None, {gpu.str_model.INPUT_NAME: rows})[0]
    assert gpu.compare_text(expected, exported, "cuda")["max_error_relative"] < 1e-4
    repo = gpu.torch_repository(tmp_path / "repos", "cpu", pt)
    with gpu.Served(repo, "cpu", tmp_path / "serve.log", gpu.server_environment()) as server:
        found = gpu.text_outputs(server.url, gpu.TORCH)
    assert gpu.compare_text(expected, found, "cuda")["max_error_relative"] < 1e-5



def test_a_machine_with_its_own_frameworks_gets_only_toolkits_wheels_and_runs_the_check(tmp_path):
    """--prepare-slim: toolkit's requirements and its tune extra's as wheels, without numpy, onnx
    or a framework, the OCR sample's weights, and an ONNX Runtime wheel cut into pieces; --stash:
    the pieces brought over a few at a time (as to a machine that takes little at once) are kept
    and what is missing is named; --slim: a Python that has only numpy and onnx (a stand-in for a
    CUDA image with its own frameworks: its python3 and no package index) gets the wheels and the
    joined ONNX Runtime in a folder of their own and serves the check's CPU mode with them. Here
    the pieces are the CPU onnxruntime of this interpreter's version, in pieces of 4 MB; for the
    lent GPU machines they are onnxruntime-gpu's CUDA 13 wheel (255 MB) in pieces of 50 MB."""
    from importlib.metadata import version

    sys.path.insert(0, str(ROOT / "samples" / "ocr"))
    import prepare as ocr_prepare

    wheels, parts, stash = tmp_path / "wheels", tmp_path / "parts", tmp_path / "stash"
    env = {**os.environ, "TOOLKIT_GPU_PARTS_REQUIREMENT": f"onnxruntime=={version('onnxruntime')}",
           "TOOLKIT_GPU_PART_SIZE": "4M", "TOOLKIT_GPU_STASH": str(stash)}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([str(ROOT / "scripts" / "gpu-check.sh"), "--prepare-slim", str(wheels), str(parts)],
                          capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    names = {path.name.split("-")[0].lower() for path in wheels.glob("*.whl")}
    assert {"fastapi", "uvicorn", "tritonclient", "protobuf", "orjson", "aiohttp", "geventhttpclient"} <= names
    assert not names & {"numpy", "onnx", "onnxruntime", "onnxruntime_gpu", "torch", "ml_dtypes"}
    assert ocr_prepare.sha256(wheels / "ocr" / ocr_prepare.WHEEL_NAME) == ocr_prepare.WHEEL_SHA256
    (checksum,) = parts.glob("onnxruntime-*.whl.sha256")
    wheel_name = checksum.name.removesuffix(".sha256")
    pieces = sorted(parts.glob(f"{wheel_name}.part-*"))
    count = len(pieces)
    assert count >= 3 and all(p.name.endswith(f"-of-{count:02d}") for p in pieces)
    assert all(p.stat().st_size == 4 << 20 for p in pieces[:-1]) and 0 < pieces[-1].stat().st_size <= 4 << 20

    def bring(*chosen: Path) -> str:
        """One call to the machine: the chosen pieces and the checksum arrive in a fresh copy."""
        call = tmp_path / "call"
        shutil.rmtree(call, ignore_errors=True)
        call.mkdir()
        for path in (checksum, *chosen):
            shutil.copy(path, call)
        done = subprocess.run([str(ROOT / "scripts" / "gpu-check.sh"), "--stash", str(call)], capture_output=True,
                              text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout

    out = bring(pieces[0], pieces[2])
    missing = ",".join(f"{i:02d}" for i in range(1, count + 1) if i not in (1, 3))
    assert f"{wheel_name}: 2 of {count} pieces here; still to bring: part-{{{missing}}}-of-{count:02d}" in out

    machine = tmp_path / "machine"
    subprocess.run([sys.executable, "-m", "venv", str(machine)], check=True, timeout=300)
    subprocess.run([str(machine / "bin" / "python"), "-m", "pip", "install", "-q", *(
        f"{name}=={version(name)}" for name in ("numpy", "onnx"))], check=True, timeout=600)
    work = tmp_path / "work"
    env.update(PYTHON=str(machine / "bin" / "python"), TOOLKIT_GPU_SITE=str(tmp_path / "site"))
    slim = [str(ROOT / "scripts" / "gpu-check.sh"), "--slim", str(wheels), "--check", "--models", "text_recognition",
            "--width", "0.25", "--window", "1", "--concurrency", "2", "--work", str(work), "--out", str(tmp_path / "r")]
    done = subprocess.run(slim, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 2
    assert f"error: {wheel_name} has 2 of its {count} pieces in {stash}: bring the rest" in done.stderr

    out = bring(*pieces[1:])
    assert f"{wheel_name}: all {count} pieces are here" in out
    (stash / pieces[-1].name).write_bytes(b"not the piece that was cut")
    done = subprocess.run(slim, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 2 and f"error: {wheel_name} joined from {count} pieces in {stash} does not match" in done.stderr
    bring(pieces[-1])

    done = subprocess.run(slim, capture_output=True, text=True, timeout=600, env=env)
    out = done.stdout + done.stderr
    if shutil.which("nvidia-smi") is not None:
        pytest.skip("this machine has an NVIDIA driver: the GPU modes ran (see the output)")
    assert done.returncode == 0, out
    assert f"==> {wheel_name} joined from {count} pieces (sha256 checked)" in out
    assert f"wheels from {wheels} and {stash} into {tmp_path / 'site'}" in out
    assert "text_recognition [cpu]: toolkit serve" in out and "infer/s at c2" in out
    assert f"onnxruntime {version('onnxruntime')}, providers" in out  # the joined wheel, imported
    installed = subprocess.run([str(machine / "bin" / "python"), "-c", "import importlib.util as u; "
                                "print(*(u.find_spec(m) is None for m in ('fastapi', 'tritonclient', 'onnxruntime')))"],
                               capture_output=True, text=True, check=True,
                               env={k: v for k, v in env.items() if k != "PYTHONPATH"}).stdout.split()
    assert installed == ["True", "True", "True"]  # the machine's own packages were not touched
