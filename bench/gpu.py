"""The GPU proof: the OCR sample and the guide's text_recognition served on an NVIDIA GPU through
ONNX Runtime's CUDA and TensorRT execution providers, and the same text_recognition as TorchScript
through the pytorch_libtorch backend on KIND_GPU, each checked against the CPU. One command
(scripts/gpu-check.sh installs the `[gpu]` extra and torch's CUDA build into its own venv and
runs this with it):

    scripts/gpu-check.sh                  # on a machine with an NVIDIA GPU and PyPI
    scripts/gpu-check.sh --check          # anywhere: everything up to the GPU, then what it would do
    python bench/gpu.py [--check] [--models text_recognition,ocr,text_recognition_torch] [--window 10]
                        [--out bench/results]

For each model set and each of its modes, `toolkit serve` is started as users start it:

- `cpu`: the configs compiled for `--device cpu` (KIND_CPU instances): the reference.
- `cuda`: `--device gpu`, KIND_GPU instances on the CUDA execution provider.
- `tensorrt`: as `cuda` plus the seeds' `optimization` block (graph level 1, the `tensorrt` GPU
  execution accelerator, precision_mode FP16, max_workspace_size_bytes 1 GiB), the engine cache on
  disk (TOOLKIT_TRT_CACHE_DIR): started once with an empty cache (`tensorrt cold`: the engines are
  built) and once more with the cache the first start wrote (`tensorrt warm`).

The TorchScript set (`text_recognition_torch`) has the `cpu` and `cuda` modes only: Triton's
pytorch_libtorch backend has no TensorRT accelerator. Its `cuda` mode places the two KIND_GPU
instances on cuda:0 (torch's CUDA build, the CUDA 12 line's: torch==2.13.0+cu128, as the GPU
images carry it, toolkit/build/runtime_deps.py).

and measured for: cold start (process start to /v2/health/ready, then the first inference, where
TensorRT builds engines for shapes it has not seen), outputs against the CPU's on the same inputs
(text_recognition: the logits within a tolerance relative to their scale, and the argmax per time
step; OCR: the same text lines, scores and boxes), and throughput under closed-loop load
(toolkit/tune/load.py: tritonclient-encoded requests; text_recognition as the seeds' perf_analyzer
command, batch 2 at concurrency 16; OCR one image per request at concurrency 4).

Models: `text_recognition`, the guide's STRModel at full width (exported with torch when torch is
installed, else the same layout built with onnx.helper, bench/perf_models.py at width 1.0; random
weights) with the guide's config.pbtxt (dynamic_batching { }, 2 instances, KIND_GPU); `ocr`, the
OCR sample (samples/ocr, prepared by samples/ocr/prepare.py: trained PP-OCRv6 weights);
`text_recognition_torch`, the same STRModel saved with torch.jit.trace as a user saves it for
Triton, served as `text_recognition` with the guide's config on `platform: "pytorch_libtorch"`
(INPUT__0 / OUTPUT__0; bench/str_model.py).

Without a usable GPU it runs the CPU mode, compiles the GPU repositories as `toolkit validate
--device gpu` would, prints what it found missing and exactly what it would run, and exits 2 (0
with --check, whose purpose that is). With a GPU it writes bench/results/<date>-gpu-<GPU>.md and
.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

import str_model  # noqa: E402
from servers import free_port, ready  # noqa: E402

TEXT = "text_recognition"
OCR = "ocr"
TORCH = "text_recognition_torch"  # the model set; the model it serves is named text_recognition
SETS = (TEXT, OCR, TORCH)
MODES = ("cpu", "cuda", "tensorrt cold", "tensorrt warm")
SET_MODES = {TEXT: MODES, OCR: MODES, TORCH: MODES[:2]}
SERVED = {TEXT: TEXT, OCR: OCR, TORCH: TEXT}  # the model each set's requests go to
TENSORS = {TEXT: (str_model.INPUT_NAME, str_model.OUTPUT_NAME), TORCH: ("INPUT__0", "OUTPUT__0")}


# The seeds' optimization block (002: ONNX Runtime accelerators), verbatim.
TRT_OPTIMIZATION = """
optimization {
    graph : {
        level : 1
    }
    execution_accelerators {
        gpu_execution_accelerator : [ {
            name : "tensorrt",
            parameters { key: "precision_mode" value: "FP16" },
            parameters { key: "max_workspace_size_bytes" value: "1073741824" }
        }]
    }
}
"""
OCR_ONNX_MODELS = ("text_detection", "text_recognition")
OCR_LINES = ("HELLO TRITON", "serverless 2026")
# |gpu - cpu| <= tolerance x max(1, max |cpu|); argmax per time step agreeing at least this often.
TOLERANCE = {"cuda": 1e-2, "tensorrt cold": 5e-2, "tensorrt warm": 5e-2}
ARGMAX_AGREEMENT = {"cuda": 0.99, "tensorrt cold": 0.95, "tensorrt warm": 0.95}


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- the environment ------------------------------------------------------------------------------


def nvidia_library_dirs() -> list[str]:
    """Folders of the NVIDIA libraries pip installed (nvidia-*-cu12 wheels, tensorrt_libs):
    onnxruntime-gpu's CUDA and TensorRT providers dlopen them from the library path."""
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    dirs = sorted(str(p) for p in site.glob("nvidia/*/lib") if p.is_dir())
    dirs += [str(p) for p in (site / "tensorrt_libs",) if p.is_dir()]
    return dirs


def server_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    dirs = nvidia_library_dirs()
    if dirs:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(dirs + [p for p in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p])
    env.update(extra or {})
    return env


@dataclass
class Environment:
    gpus: list[str] = field(default_factory=list)  # "NVIDIA H100 80GB HBM3, driver 550.54.15"
    onnxruntime: str = ""
    distribution: str = ""  # onnxruntime or onnxruntime-gpu
    providers: list[str] = field(default_factory=list)
    cuda_session: str = ""  # "ok" or why a CUDA session could not run
    tensorrt_libraries: str = ""  # where libnvinfer.so.10 was found, or why not
    torch: str = ""  # "2.13.0+cu128 (CUDA 12.8)", or "not installed"
    torch_cuda: str = ""  # "ok" or why a convolution could not run on cuda:0
    problems: list[str] = field(default_factory=list)

    @property
    def gpu_name(self) -> str:
        return self.gpus[0].split(",")[0] if self.gpus else ""

    @property
    def cuda_ready(self) -> bool:
        return bool(self.gpus) and "CUDAExecutionProvider" in self.providers and self.cuda_session == "ok"

    @property
    def tensorrt_ready(self) -> bool:
        return self.cuda_ready and "TensorrtExecutionProvider" in self.providers and \
            self.tensorrt_libraries.startswith("/")

    @property
    def torch_ready(self) -> bool:
        return bool(self.gpus) and self.torch_cuda == "ok"

    @property
    def usable(self) -> bool:
        """A GPU mode can run here (ONNX Runtime's CUDA provider or torch's CUDA build)."""
        return self.cuda_ready or self.torch_ready

    def why_not(self, model: str, mode: str) -> str:
        """Why the set's GPU mode cannot run here ("" when it can)."""
        if model == TORCH:
            return "" if self.torch_ready else f"torch's CUDA build is not usable here ({self.torch_cuda})"
        if mode == "cuda":
            return "" if self.cuda_ready else "ONNX Runtime's CUDA provider is not usable here"
        return "" if self.tensorrt_ready else "TensorRT is not usable here"


def _probe(code: str, env: dict[str, str], timeout: float = 120) -> tuple[int, str]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)
    return out.returncode, (out.stdout + out.stderr).strip()


# torch's version, its CUDA build and, where torch sees a GPU, a convolution run on cuda:0.
TORCH_PROBE = """
import json, torch
found = [torch.__version__, torch.version.cuda, torch.cuda.is_available() and torch.cuda.device_count()]
if found[2]:
    x = torch.ones(1, 1, 8, 8, device="cuda:0")
    found.append(float(torch.nn.functional.conv2d(x, torch.ones(1, 1, 3, 3, device="cuda:0")).sum().cpu()))
print(json.dumps(found))
"""


def torch_status(env: dict[str, str], gpus: bool) -> tuple[str, str, list[str]]:
    """(torch's version and CUDA build, "ok" or why its cuda mode cannot run, the problems)."""
    code, text = _probe(TORCH_PROBE, env)
    if code != 0:
        missing = "No module named 'torch'" in text
        why = "torch is not installed" if missing else f"torch does not import: {text[-300:]}"
        return ("not installed" if missing else "broken"), why, [
            f"{why}: the {TORCH} set needs torch's CUDA build (scripts/gpu-check.sh installs it from PyTorch's index)"]
    version, cuda, devices, *result = json.loads(text.splitlines()[-1])
    described = f"{version} ({'CUDA ' + cuda if cuda else 'a CPU build'})"
    if cuda is None:
        why = f"torch {version} is a CPU build"
    elif not devices:
        why = f"torch {described} sees no CUDA device" + ("" if gpus else " (no GPU here)")
    elif result != [36.0 * 9]:
        why = f"a convolution on cuda:0 gave {result}, not {36.0 * 9}"
    else:
        return described, "ok", []
    return described, why, [f"{why}: the {TORCH} set's cuda mode needs torch's CUDA build and a GPU it can use"]


def detect(work: Path, torch: bool = True) -> Environment:
    """What this machine has for the GPU modes (every check runs, each failure is a problem);
    torch's only when a TorchScript set is asked for."""
    found = Environment()
    smi = shutil.which("nvidia-smi")
    if smi is None:
        found.problems.append("no nvidia-smi: no NVIDIA driver on this machine")
    else:
        out = subprocess.run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=60)
        found.gpus = [f"{name.strip()}, driver {driver.strip()}" for name, _, driver in
                      (line.partition(",") for line in out.stdout.splitlines() if line.strip())]
        if not found.gpus:
            found.problems.append(f"nvidia-smi lists no GPU ({(out.stderr or out.stdout).strip()[:200]})")
    from importlib import metadata

    for name in ("onnxruntime-gpu", "onnxruntime"):
        try:
            found.distribution, found.onnxruntime = name, metadata.version(name)
            break
        except metadata.PackageNotFoundError:
            continue
    env = server_environment()
    code, text = _probe("import onnxruntime, json; print(json.dumps(onnxruntime.get_available_providers()))", env)
    found.providers = json.loads(text.splitlines()[-1]) if code == 0 else []
    if found.distribution != "onnxruntime-gpu":
        found.problems.append(f"{found.distribution or 'no onnxruntime'} {found.onnxruntime} is installed, not "
                              "onnxruntime-gpu: install the [gpu] extra (scripts/gpu-check.sh does, in its own venv)")
    if "CUDAExecutionProvider" not in found.providers:
        found.problems.append(f"onnxruntime has no CUDAExecutionProvider (providers: {', '.join(found.providers)})")
    if found.gpus and "CUDAExecutionProvider" in found.providers:
        import perf_models

        tiny = perf_models.tiny(work / "probe" / "tiny.onnx")
        code, text = _probe(
            "import onnxruntime as ort, numpy as np\n"
            f"s = ort.InferenceSession({str(tiny)!r}, providers=['CUDAExecutionProvider'])\n"
            "assert s.get_providers()[0] == 'CUDAExecutionProvider', s.get_providers()\n"
            "s.run(None, {'INPUT0': np.ones((1, 16), np.float32)}); print('ok')", env)
        found.cuda_session = "ok" if code == 0 and text.endswith("ok") else text[-400:]
        if found.cuda_session != "ok":
            found.problems.append(f"a CUDA session does not run: {found.cuda_session}")
    code, text = _probe("import ctypes; ctypes.CDLL('libnvinfer.so.10'); ctypes.CDLL('libnvonnxparser.so.10'); "
                        "import os; print([d for d in os.environ.get('LD_LIBRARY_PATH', '').split(':') "
                        "if os.path.exists(os.path.join(d, 'libnvinfer.so.10'))][:1])", env)
    if code == 0:
        where = re.findall(r"'([^']+)'", text)
        found.tensorrt_libraries = where[0] if where else "/ (system library path)"
    else:
        found.tensorrt_libraries = "libnvinfer.so.10 / libnvonnxparser.so.10 not loadable"
        found.problems.append("TensorRT 10 libraries (libnvinfer.so.10, libnvonnxparser.so.10: the tensorrt-cu12-libs "
                              "or -cu13-libs wheel, as onnxruntime-gpu's CUDA major) are not on the library path: "
                              "the tensorrt mode needs them")
    if torch:
        found.torch, found.torch_cuda, problems = torch_status(env, bool(found.gpus))
        found.problems += problems
    return found


# -- repositories ---------------------------------------------------------------------------------


def text_recognition_onnx(path: Path, width: float = 1.0) -> tuple[Path, str]:
    """The guide's STRModel at full width: torch.onnx.export when torch is here, else the same
    layout with onnx.helper (random weights either way); `width` < 1 (a quick check): onnx.helper."""
    if width != 1.0:
        import perf_models

        return perf_models.text_recognition(path, width=width), \
            f"the guide's STRModel layout at x{width:g} width, built with onnx.helper (bench/perf_models.py)"
    try:
        return str_model.export(path), "the guide's STRModel exported with torch.onnx.export (bench/str_model.py)"
    except ImportError:
        import perf_models

        return perf_models.text_recognition(path, width=1.0), \
            "the guide's STRModel layout at full width, built with onnx.helper (bench/perf_models.py; no torch here)"


def _mode_device(mode: str) -> str:
    return "cpu" if mode == "cpu" else "gpu"


def _linked_repository(repo: Path, model_file: Path, filename: str, config: str) -> Path:
    """REPO/text_recognition/ with config.pbtxt and 1/<filename> linked to `model_file` (made once)."""
    if not repo.exists():
        (repo / TEXT / "1").mkdir(parents=True)
        (repo / TEXT / "1" / filename).symlink_to(model_file)
        (repo / TEXT / "config.pbtxt").write_text(config)
    return repo


def text_repository(root: Path, mode: str, onnx: Path) -> Path:
    config = str_model.guide_config("KIND_CPU" if mode == "cpu" else "KIND_GPU")
    return _linked_repository(root / f"{TEXT}-{mode.split()[0]}", onnx, "model.onnx",
                              config + (TRT_OPTIMIZATION if mode.startswith("tensorrt") else ""))


def text_recognition_torchscript(path: Path, width: float = 1.0) -> Path:
    """The guide's STRModel saved with torch.jit.trace (needs torch); `width` < 1: a quick check."""
    return str_model.save_torchscript(path, max(16, round(str_model.OUTPUT_CHANNELS * width)))


def torch_repository(root: Path, mode: str, model_file: Path) -> Path:
    """The guide's config for pytorch_libtorch: KIND_CPU for cpu, KIND_GPU (cuda:0) for cuda."""
    return _linked_repository(root / f"{TORCH}-{mode}", model_file, "model.pt",
                              str_model.torchscript_config("KIND_CPU" if mode == "cpu" else "KIND_GPU"))


def prepare_ocr(cache_dir: Path | None) -> None:
    command = [sys.executable, str(ROOT / "samples" / "ocr" / "prepare.py")]
    if cache_dir is not None:
        command += ["--cache-dir", str(cache_dir)]
    subprocess.run(command, check=True)


def ocr_repository(root: Path, mode: str) -> Path:
    """A copy of samples/ocr (files linked), with the seeds' optimization block on its ONNX models
    for tensorrt. Its instance groups name no kind: --device decides (KIND_GPU on a GPU)."""
    repo = root / f"{OCR}-{mode.split()[0]}"
    if repo.exists():
        return repo
    source = ROOT / "samples" / "ocr"
    shutil.copytree(source, repo, ignore=lambda folder, names: [
        n for n in names if n == "__pycache__" or (Path(folder) == source and n.endswith(".py"))])
    if mode.startswith("tensorrt"):
        for name in OCR_ONNX_MODELS:
            config = repo / name / "config.pbtxt"
            config.write_text(config.read_text() + TRT_OPTIMIZATION)
    return repo


def compile_check(repo: Path, mode: str) -> list[str]:
    """The repository compiled for the mode's device, as `toolkit validate --device` does."""
    from toolkit.repository.compile import compile_repository

    result = compile_repository(repo, None, _mode_device(mode))
    return result.failure_lines()


# -- serving and measuring ------------------------------------------------------------------------


class Served:
    """`toolkit serve REPO --device D` on a free port; `seconds`: process start to ready."""

    def __init__(self, repo: Path, mode: str, log: Path, env: dict[str, str], timeout: float = 1800) -> None:
        self.port = free_port()
        self.log = log
        command = [sys.executable, "-m", "toolkit.cli", "serve", str(repo), "--port", str(self.port), "--device",
                   _mode_device(mode), "--log-level", "info"]
        started = time.perf_counter()
        with open(log, "w") as handle:
            self.process = subprocess.Popen(command, cwd=ROOT, stdout=handle, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)
        while not ready(self.port):
            if self.process.poll() is not None:
                raise RuntimeError(f"toolkit serve ({mode}) exited with {self.process.returncode}:\n"
                                   f"{log.read_text(errors='replace')[-4000:]}")
            if time.perf_counter() - started > timeout:
                self.stop()
                raise TimeoutError(f"toolkit serve ({mode}) not ready after {timeout:.0f} s")
            time.sleep(0.1)
        self.seconds = time.perf_counter() - started

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(30)

    def __enter__(self) -> Served:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _text_inputs() -> np.ndarray:
    return np.random.default_rng(0).random((4, 1, 32, 100), dtype=np.float32)


def text_outputs(url: str, model: str = TEXT) -> np.ndarray:
    """text_recognition's logits for the same four rows (`model`: the set, for its tensor names)."""
    import tritonclient.http as httpclient

    data = _text_inputs()
    source, result = TENSORS[model]
    with httpclient.InferenceServerClient(url, network_timeout=1800, connection_timeout=1800) as client:
        tensor = httpclient.InferInput(source, list(data.shape), "FP32")
        tensor.set_data_from_numpy(data, binary_data=True)
        return client.infer(SERVED[model], [tensor]).as_numpy(result)


def ocr_outputs(url: str) -> list[tuple[str, float, list[int]]]:
    import tritonclient.http as httpclient

    sys.path.insert(0, str(ROOT / "samples" / "ocr"))
    import client as ocr_client

    with httpclient.InferenceServerClient(url, network_timeout=1800, connection_timeout=1800) as client:
        return ocr_client.read_text(client, ocr_client.render(OCR_LINES))


def compare_text(reference: np.ndarray, found: np.ndarray, mode: str) -> dict[str, Any]:
    scale = max(1.0, float(np.abs(reference).max()))
    error = float(np.abs(found.astype(np.float64) - reference).max()) / scale
    agreement = float((found.argmax(-1) == reference.argmax(-1)).mean())
    ok = found.shape == reference.shape and error <= TOLERANCE[mode] and agreement >= ARGMAX_AGREEMENT[mode]
    return {"ok": ok, "max_error_relative": error, "argmax_agreement": agreement, "tolerance": TOLERANCE[mode],
            "shape": list(found.shape)}


def compare_ocr(reference: list, found: list, mode: str) -> dict[str, Any]:
    texts_ok = [t for t, _, _ in found] == [t for t, _, _ in reference]
    score_error = max((abs(a[1] - b[1]) for a, b in zip(reference, found)), default=0.0)
    box_error = max((max(abs(x - y) for x, y in zip(a[2], b[2])) for a, b in zip(reference, found)), default=0)
    ok = texts_ok and score_error <= 0.05 and box_error <= 4
    return {"ok": ok, "texts": [t for t, _, _ in found], "reference": [t for t, _, _ in reference],
            "max_score_error": score_error, "max_box_error_px": box_error}


def _body(model: str, batch: int) -> tuple[bytes, dict[str, str]]:
    import tritonclient.http as httpclient

    if model in TENSORS:
        data = np.random.default_rng(1).random((batch, 1, 32, 100), dtype=np.float32)
        tensor = httpclient.InferInput(TENSORS[model][0], list(data.shape), "FP32")
        tensor.set_data_from_numpy(data, binary_data=True)
    else:
        sys.path.insert(0, str(ROOT / "samples" / "ocr"))
        import client as ocr_client

        tensor = httpclient.InferInput("IMAGE", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([ocr_client.render(OCR_LINES)], dtype=object), binary_data=True)
    body, header_length = httpclient.InferenceServerClient.generate_request_body([tensor])
    headers = {"Content-Type": "application/octet-stream"}
    if header_length is not None:
        headers["Inference-Header-Content-Length"] = str(header_length)
    return bytes(body), headers


LOAD = {TEXT: (2, 16), TORCH: (2, 16), OCR: (1, 4)}  # (batch of a request, concurrency)


def throughput(url: str, model: str, window_s: float, concurrency: int | None = None) -> dict[str, Any]:
    from toolkit.tune import load

    batch, concurrency = LOAD[model][0], concurrency or LOAD[model][1]
    body, headers = _body(model, batch)
    level = load.measure(f"http://{url}", SERVED[model], body, headers, batch, concurrency, warmup_s=min(5.0, window_s / 2),
                         window_s=window_s, timeout_s=1800)
    return {"concurrency": concurrency, "batch": batch, "throughput": level.throughput, "p50_ms": level.p50_ms,
            "p95_ms": level.p95_ms, "avg_batch": level.batch_size, "requests": level.requests}


def run_mode(model: str, repo: Path, mode: str, work: Path, env: dict[str, str], window_s: float,
             reference: Any, concurrency: int | None = None) -> tuple[dict[str, Any], Any]:
    _log(f"{model} [{mode}]: toolkit serve {repo} --device {_mode_device(mode)}")
    result: dict[str, Any] = {"mode": mode}
    with Served(repo, mode, work / f"serve-{model}-{mode.replace(' ', '-')}.log", env) as server:
        result["ready_s"] = server.seconds
        started = time.perf_counter()
        outputs = text_outputs(server.url, model) if model in TENSORS else ocr_outputs(server.url)
        result["first_inference_s"] = time.perf_counter() - started
        result["cold_start_s"] = result["ready_s"] + result["first_inference_s"]
        if mode != "cpu":
            result["check"] = compare_text(reference, outputs, mode) if model in TENSORS else \
                compare_ocr(reference, outputs, mode)
        result["load"] = throughput(server.url, model, window_s, concurrency)
        plan = [line.split(": ", 1)[-1] for line in server.log.read_text(errors="replace").splitlines()
                if "CPU budget:" in line or "ONNX Runtime intra-op" in line]
        result["log"] = plan[:8]
    _log(f"  ready {result['ready_s']:.1f} s, first inference {result['first_inference_s']:.2f} s, "
         f"{result['load']['throughput']:.1f} infer/s at c{result['load']['concurrency']}"
         + (f", outputs {'OK' if result['check']['ok'] else 'DIFFER'}" if "check" in result else ""))
    return result, outputs


# -- the plan and the report ----------------------------------------------------------------------


def plan_lines(models: list[str], work: Path) -> list[str]:
    """What a run on a GPU does after the CPU mode (printed by --check)."""
    lines = []
    cache = work / "trt-cache"
    for model in models:
        for mode in SET_MODES[model][1:]:
            repo = work / "repos" / f"{model}-{mode.split()[0]}"
            how = {"cuda": "KIND_GPU instances of pytorch_libtorch on cuda:0, torch's CUDA build" if model == TORCH
                   else "KIND_GPU on the CUDA provider",
                   "tensorrt cold": f"the seeds' tensorrt FP16 accelerator, TOOLKIT_TRT_CACHE_DIR={cache} emptied first",
                   "tensorrt warm": f"the same with the engines the cold start wrote to {cache}"}[mode]
            lines.append(f"{model} [{mode}]: toolkit serve {repo} --device gpu ({how}); time to ready and to the "
                         f"first inference; outputs vs the cpu mode's; load batch {LOAD[model][0]} at concurrency "
                         f"{LOAD[model][1]}")
    lines.append("write bench/results/<date>-gpu-<GPU name>.md and .json")
    return lines


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "gpu"


def render(data: dict[str, Any]) -> str:
    out = [f"# GPU proof: {data['gpu']} ({data['date']})", "", f"Produced by `{data['command']}`.", "",
           "## Setup", ""]
    out += [f"- **{k}**: {v}" for k, v in data["setup"].items()] + [""]
    for model, entry in data["models"].items():
        out += [f"## {model}", "", entry["description"], ""]
        out += ["| mode | ready s | first inference s | cold start s | infer/s | vs cpu | p95 ms | avg batch | "
                "outputs vs cpu |", "|---|---|---|---|---|---|---|---|---|"]
        cpu = entry["modes"].get("cpu", {}).get("load", {}).get("throughput")
        for mode, r in entry["modes"].items():
            load = r["load"]
            check = r.get("check")
            verdict = "reference" if check is None else ("OK" if check["ok"] else "**DIFFER**") + " " + ", ".join(
                f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in check.items()
                if k in ("max_error_relative", "argmax_agreement", "max_score_error", "max_box_error_px"))
            ratio = f"{load['throughput'] / cpu:.2f}x" if cpu else "n/a"
            out.append(f"| {mode} | {r['ready_s']:.1f} | {r['first_inference_s']:.2f} | {r['cold_start_s']:.1f} | "
                       f"{load['throughput']:.1f} | {ratio} | {load['p95_ms']:.1f} | {load['avg_batch']:.2f} | "
                       f"{verdict} |")
        out.append("")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="run what needs no GPU (the CPU mode, the GPU repositories compiled), report what is "
                             "missing for the GPU modes and what they would run; exit 0 when that all works")
    parser.add_argument("--models", default=",".join(SETS), help=f"model sets (default: {','.join(SETS)})")
    parser.add_argument("--window", type=float, default=10.0, help="seconds of load per measurement")
    parser.add_argument("--concurrency", type=int, help="requests in flight (default: text_recognition 16, ocr 4)")
    parser.add_argument("--width", type=float, default=1.0,
                        help="text_recognition's channel width (1.0: the guide's; less only for a quick --check)")
    parser.add_argument("--ocr-cache", type=Path, help="samples/ocr/prepare.py --cache-dir (an offline wheel cache)")
    parser.add_argument("--work", type=Path, help="work folder (default: a new temporary one)")
    parser.add_argument("--out", type=Path, default=BENCH / "results")
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = set(models) - set(SETS)
    if unknown:
        parser.error(f"unknown model(s) {', '.join(sorted(unknown))}: choose from {', '.join(SETS)}")
    work = args.work or Path(tempfile.mkdtemp(prefix="toolkit-gpu-"))
    work.mkdir(parents=True, exist_ok=True)
    _log(f"work folder {work}")

    found = detect(work, torch=TORCH in models)
    _log(f"GPUs: {'; '.join(found.gpus) or 'none'}; {found.distribution or 'onnxruntime'} {found.onnxruntime}, "
         f"providers {', '.join(found.providers) or 'none'}; TensorRT libraries: {found.tensorrt_libraries}"
         + (f"; torch {found.torch}" if TORCH in models else ""))
    trt_cache = work / "trt-cache"
    env = server_environment({"TOOLKIT_TRT_CACHE_DIR": str(trt_cache)})

    data: dict[str, Any] = {
        "date": dt.datetime.now().strftime("%Y-%m-%d %H:%M"), "gpu": found.gpus[0] if found.gpus else "none",
        "command": " ".join(["bench/gpu.py", *(argv if argv is not None else sys.argv[1:])]),
        "setup": {"GPUs": "; ".join(found.gpus) or "none", "onnxruntime": f"{found.distribution} {found.onnxruntime}",
                  "providers": ", ".join(found.providers), "TensorRT libraries": found.tensorrt_libraries,
                  **({"torch": found.torch} if TORCH in models else {}),
                  "load": "toolkit/tune/load.py closed loop, tritonclient-encoded binary requests; "
                          f"{args.window:g} s windows",
                  "tolerance": "text_recognition: |gpu - cpu| <= t x max(1, max |cpu|), t = 1e-2 (CUDA, TF32 convs) "
                               "or 5e-2 (TensorRT FP16), and argmax agreement >= 0.99 / 0.95 (the TorchScript "
                               "set as CUDA); OCR: same lines, "
                               "scores within 0.05, boxes within 4 px"},
        "models": {},
    }
    failures: list[str] = []
    repos = work / "repos"
    sets: dict[str, tuple[Any, str]] = {}
    if TEXT in models:
        onnx, how = text_recognition_onnx(work / "models" / "text_recognition.onnx", args.width)
        sets[TEXT] = (lambda mode, onnx=onnx: text_repository(repos, mode, onnx),
                      f"{how}, full width ({onnx.stat().st_size / 1e6:.0f} MB), random weights; the guide's config "
                      "(dynamic_batching { }, 2 instances; KIND_CPU for the cpu mode). Requests of batch 2 at "
                      "concurrency 16, as the seeds' perf_analyzer command.")
    if OCR in models:
        prepare_ocr(args.ocr_cache)
        sets[OCR] = (lambda mode: ocr_repository(repos, mode),
                     "samples/ocr (PP-OCRv6 small detection + recognition, trained weights; Python pre/post-processing; "
                     "the `ocr` ensemble), one rendered image of two lines per request at concurrency 4.")
    if TORCH in models:
        try:
            model_file = text_recognition_torchscript(work / "models" / "text_recognition.pt", args.width)
        except ImportError as exc:
            failures.append(f"{TORCH}: {exc}: its model is made by torch (scripts/gpu-check.sh installs torch)")
        else:
            sets[TORCH] = (lambda mode, model_file=model_file: torch_repository(repos, mode, model_file),
                           f"the guide's STRModel saved with torch.jit.trace (bench/str_model.py), "
                           f"{model_file.stat().st_size / 1e6:.0f} MB, random weights; served by the pytorch_libtorch "
                           "backend with the guide's config (platform pytorch_libtorch, INPUT__0 / OUTPUT__0; "
                           "dynamic_batching { }, 2 instances; KIND_CPU for the cpu mode, KIND_GPU on cuda:0 for cuda; "
                           "no tensorrt mode: the backend has no TensorRT accelerator). Requests of batch 2 at "
                           "concurrency 16.")
    for model, (make_repo, description) in sets.items():
        modes = SET_MODES[model]
        for mode in modes:
            problems = compile_check(make_repo(mode), mode)
            if problems:
                failures.append(f"{model} [{mode}] does not compile: {'; '.join(problems)}")
        entry: dict[str, Any] = {"description": description, "modes": {}}
        data["models"][model] = entry
        try:
            entry["modes"]["cpu"], reference = run_mode(model, make_repo("cpu"), "cpu", work, env, args.window, None,
                                                        args.concurrency)
        except Exception as exc:  # the server, the client or the load: reported, the rest goes on
            failures.append(f"{model} [cpu]: {type(exc).__name__}: {exc}")
            continue
        if not found.usable:
            continue
        for mode in modes[1:]:
            why = found.why_not(model, mode)
            if why:
                failures.append(f"{model} [{mode}] skipped: {why}")
                continue
            if mode == "tensorrt cold":
                shutil.rmtree(trt_cache, ignore_errors=True)
            try:
                entry["modes"][mode], _ = run_mode(model, make_repo(mode), mode, work, env, args.window, reference,
                                                   args.concurrency)
            except Exception as exc:
                failures.append(f"{model} [{mode}]: {type(exc).__name__}: {exc}")
                continue
            if not entry["modes"][mode]["check"]["ok"]:
                failures.append(f"{model} [{mode}]: outputs differ from the cpu's: {entry['modes'][mode]['check']}")

    if not found.usable:
        print("\nNo usable NVIDIA GPU here:")
        for problem in found.problems:
            print(f"  - {problem}")
        print("The CPU mode ran and the GPU repositories compile. On a machine with a GPU this would run:")
        for line in plan_lines(models, work):
            print(f"  - {line}")
        for failure in failures:
            print(f"FAILED: {failure}")
        return 1 if failures else (0 if args.check else 2)

    name = f"{dt.date.today().isoformat()}-gpu-{_slug(found.gpu_name)}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{name}.json").write_text(json.dumps(data, indent=1))
    (args.out / f"{name}.md").write_text(render(data))
    print(render(data))
    _log(f"wrote {args.out / name}.md and .json")
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
