"""Cold start per backend: the same small model (Triton's add_sub: OUTPUT0 = INPUT0 + INPUT1,
OUTPUT1 = INPUT0 - INPUT1, FP32 [16], max_batch_size 8, 2 instances, one warmup sample) served by
each backend, started the way an image starts it, so the difference is the backend's framework.

    .venv/bin/python bench/backend_cold_start.py [--runs 5] [--backend onnxruntime --backend pytorch]

For each backend: `python -m handlers.entrypoints.container` with the compiled manifest, timed from
spawn to the first 200 on /v2/health/ready (bench/cold_start.py's `measure`), median of `--runs`;
plus the framework's bare import time in a fresh interpreter. A backend is one entry of MODELS:
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


# backend -> (writes add_sub into a model directory, the framework module it imports)
MODELS: dict[str, tuple[Callable[[Path], None], str]] = {
    "onnxruntime": (_onnxruntime, "onnxruntime"),
    "pytorch": (_pytorch, "torch"),
}



def import_seconds(module: str) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--backend", action="append", choices=sorted(MODELS), help="default: all")
    args = parser.parse_args()

    from toolkit.repository.compile import compile_repository

    print("| backend | cold start, median | runs (s) | framework import |")
    print("|---|---|---|---|")
    for backend in args.backend or sorted(MODELS):
        write, module = MODELS[backend]
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
            imports = statistics.median(import_seconds(module) for _ in range(3))
            runs = ", ".join(f"{t:.3f}" for t in times)
            print(f"| {backend} | {statistics.median(times):.3f} s | {runs} | `import {module}` {imports:.3f} s |", flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
