"""Cold start per backend: the same small model (Triton's add_sub: OUTPUT0 = INPUT0 + INPUT1,
OUTPUT1 = INPUT0 - INPUT1, FP32 [16], max_batch_size 8, 2 instances, one warmup sample) served by
each backend, started the way an image starts it, so the difference is the backend's framework:
ONNX (onnxruntime), TorchScript (pytorch), the ONNX converted to an IR by OpenVINO (openvino),
Triton's Python add_sub (python); fil serves a tree model of the same input instead (an XGBoost
regressor, 300 trees of depth 6, input__0 [16] -> output__0 [1]), since trees cannot add tensors.

    .venv/bin/python bench/backend_cold_start.py [--runs 5] [--backend onnxruntime --backend pytorch]

For each backend: `python -m handlers.entrypoints.container` with the compiled manifest, timed from
spawn to the first 200 on /v2/health/ready (bench/cold_start.py's `measure`), median of `--runs`;
plus the time its framework takes to load in a fresh interpreter (the import; for fil, libtreelite
loaded with ctypes, as the backend does). A backend is one entry of MODELS:
a function writing its add_sub into a repository. The numbers go in docs/cold-start.md.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from cold_start import measure
from servers import free_port

_IO = """max_batch_size: 8
input [ {{ name: "{i0}" data_type: TYPE_FP32 dims: [ 16 ] }}, {{ name: "{i1}" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "{o0}" data_type: TYPE_FP32 dims: [ 16 ] }}, {{ name: "{o1}" data_type: TYPE_FP32 dims: [ 16 ] }} ]
dynamic_batching {{ }}
instance_group [ {{ count: 2 kind: KIND_CPU }} ]
model_warmup [ {{ name: "zeros" batch_size: 1
  inputs {{ key: "{i0}" value: {{ data_type: TYPE_FP32 dims: [ 16 ] zero_data: true }} }}
  inputs {{ key: "{i1}" value: {{ data_type: TYPE_FP32 dims: [ 16 ] zero_data: true }} }} }} ]
"""


def _onnxruntime(directory: Path) -> None:
    shutil.copy(ROOT / "samples" / "quickstart" / "add_sub" / "1" / "model.onnx", directory / "1" / "model.onnx")
    (directory / "config.pbtxt").write_text(
        'name: "add_sub"\nbackend: "onnxruntime"\n' + _IO.format(i0="INPUT0", i1="INPUT1", o0="OUTPUT0", o1="OUTPUT1")
    )


def _pytorch(directory: Path) -> None:
    import torch

    class AddSub(torch.nn.Module):
        def forward(self, x: torch.Tensor, y: torch.Tensor):
            return x + y, x - y

    torch.jit.script(AddSub()).save(str(directory / "1" / "model.pt"))
    (directory / "config.pbtxt").write_text(
        'name: "add_sub"\nplatform: "pytorch_libtorch"\n'
        + _IO.format(i0="INPUT__0", i1="INPUT__1", o0="OUTPUT__0", o1="OUTPUT__1")
    )


def _openvino(directory: Path) -> None:
    import openvino as ov

    model = ov.convert_model(str(ROOT / "samples" / "quickstart" / "add_sub" / "1" / "model.onnx"))
    ov.save_model(model, str(directory / "1" / "model.xml"))  # and model.bin beside it
    (directory / "config.pbtxt").write_text(
        'name: "add_sub"\nbackend: "openvino"\n' + _IO.format(i0="INPUT0", i1="INPUT1", o0="OUTPUT0", o1="OUTPUT1")
    )


_PYTHON_ADD_SUB = """import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            y = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x + y),
                                                         pb_utils.Tensor("OUTPUT1", x - y)]))
        return responses
"""


def _python(directory: Path) -> None:
    (directory / "1" / "model.py").write_text(_PYTHON_ADD_SUB)
    (directory / "config.pbtxt").write_text(
        'name: "add_sub"\nbackend: "python"\n' + _IO.format(i0="INPUT0", i1="INPUT1", o0="OUTPUT0", o1="OUTPUT1")
    )


def _fil(directory: Path) -> None:
    """A tree model cannot add or subtract tensors: FIL's own shape instead (input__0 FP32 [16] ->
    output__0 [1]), an XGBoost regressor of 300 trees of depth 6, with the same batching,
    instances and warmup as the others."""
    import numpy as np
    import xgboost

    rng = np.random.default_rng(0)
    rows = rng.standard_normal((2000, 16)).astype(np.float32)
    booster = xgboost.train({"max_depth": 6, "nthread": 1}, xgboost.DMatrix(rows, label=rows[:, 0] - rows[:, 1]), 300)
    booster.save_model(directory / "1" / "xgboost.json")
    (directory / "config.pbtxt").write_text(
        """name: "add_sub"
backend: "fil"
max_batch_size: 8
input [ { name: "input__0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "output__0" data_type: TYPE_FP32 dims: [ 1 ] } ]
dynamic_batching { }
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters [ { key: "model_type" value: { string_value: "xgboost_json" } },
             { key: "output_class" value: { string_value: "false" } } ]
model_warmup [ { name: "zeros" batch_size: 1
  inputs { key: "input__0" value: { data_type: TYPE_FP32 dims: [ 16 ] zero_data: true } } } ]
"""
    )


class Framework(NamedTuple):
    """How a backend's runtime loads its framework, timed in a fresh interpreter: `setup` runs
    first, untimed; `load` is timed."""

    label: str
    load: str
    setup: str = ""


# backend -> (writes add_sub into a model directory, its framework's load; None: nothing to load)
MODELS: dict[str, tuple[Callable[[Path], None], Framework | None]] = {
    "onnxruntime": (_onnxruntime, Framework("`import onnxruntime`", "import onnxruntime")),
    "pytorch": (_pytorch, Framework("`import torch`", "import torch")),
    "openvino": (_openvino, Framework("`import openvino`", "import openvino")),
    # the fil backend loads libtreelite with ctypes, without importing treelite's Python package
    "fil": (_fil, Framework("libtreelite (ctypes)", "treelite.library()",
                            "from handlers.backends.fil import treelite")),
    "python": (_python, None),
}


def load_seconds(framework: Framework) -> float:
    code = (f"{framework.setup}\nimport time\nt = time.perf_counter()\n{framework.load}\n"
            "print(time.perf_counter() - t)")
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                cwd=ROOT).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--backend", action="append", choices=sorted(MODELS), help="default: all")
    args = parser.parse_args()

    from toolkit.repository.compile import compile_repository

    print("| backend | cold start, median | runs (s) | framework import |")
    print("|---|---|---|---|")
    for backend in args.backend or sorted(MODELS):
        write, framework = MODELS[backend]
        work = Path(tempfile.mkdtemp(prefix=f"cold-start-{backend}-"))
        try:
            directory = work / "models" / "add_sub"
            (directory / "1").mkdir(parents=True)
            write(directory)
            result = compile_repository(work / "models", device="cpu")
            if not result.ok:
                raise SystemExit(f"{backend}: {result.failure_lines()}")
            manifest = result.write_manifest(work / "models.json")
            times = []
            for _ in range(args.runs):
                port = free_port()
                env = {**os.environ, "PORT": str(port), "TOOLKIT_MANIFEST": str(manifest), "TOOLKIT_HOST": "127.0.0.1",
                       "TOOLKIT_MODEL_ROOT": str((work / "models").resolve()), "TOOLKIT_LOG_LEVEL": "warning"}
                times.append(measure([sys.executable, "-m", "handlers.entrypoints.container"], port, env))
            imported = "-" if framework is None else \
                f"{framework.label} {statistics.median(load_seconds(framework) for _ in range(3)):.3f} s"
            runs = ", ".join(f"{t:.3f}" for t in times)
            print(f"| {backend} | {statistics.median(times):.3f} s | {runs} | {imported} |", flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
