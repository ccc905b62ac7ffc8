"""What huge pages give a model's forward, in-process (handlers/huge_pages.py).

    .venv/bin/python bench/huge_pages.py                 # 4 interleaved repeats of 4 models, ~4 min
    .venv/bin/python bench/huge_pages.py --models onnx_full --repeats 6

Each measurement is a fresh process that loads one model on a thread (as the runtime's loading
threads do, so its weights land in a thread heap), runs a batch of 8 a few times, then either
leaves its pages alone (`4k`) or runs `handlers.huge_pages.apply()` (`huge`: mark and collapse,
what the runtime does once its models are loaded), and times 6 more forwards of a batch of 8 on
one thread (one intra-op thread, as the bench configs set). The two arms alternate in every
repeat; the table gives the median of the per-process medians, the ratio, and what `apply` did
(MiB marked, MiB collapsed, seconds), which is the cost a cold start pays on its background
thread. Models: `onnx_full`, the conceptual guide's STRModel at full width exported to ONNX
(bench/str_model.py; 177 MB of weights; needs a CPU torch to export); `onnx_text`, the x0.25
text_recognition of bench/perf_models.py; `torch_full`, the same STRModel as TorchScript;
`torch_cnn`, bench/pytorch_ceiling.py's small CNN (the two torch ones under the pytorch
backend's allocator setting, as served). Results go to bench/results/huge-pages-<date>-<host>.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("onnx_full", "onnx_text", "torch_full", "torch_cnn")

# One measurement, in a fresh process: argv = model kind, model path, arm.
_MEASURE = r"""
import json, statistics, sys, threading, time
sys.path[:0] = [sys.argv[4], sys.argv[4] + "/bench"]
import numpy as np
from handlers import huge_pages
kind, path, arm = sys.argv[1:4]
x = np.random.default_rng(0).random((8, 1, 32, 100), dtype=np.float32)
held = {}
if kind.startswith("onnx"):
    import onnxruntime as ort
    def load():
        options = ort.SessionOptions(); options.intra_op_num_threads = 1; options.inter_op_num_threads = 1
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        held["run"] = lambda: session.run(None, {name: x})
else:
    import torch
    from handlers.backends.pytorch import settings
    settings.keep_freed_memory()
    torch.set_num_threads(1)
    def load():
        module = torch.jit.load(path)
        tensor = torch.from_numpy(x)
        def run():
            with torch.inference_mode():
                module(tensor)
        held["run"] = run
def warm():
    load()
    for _ in range(3):
        held["run"]()
thread = threading.Thread(target=warm); thread.start(); thread.join()
outcome = huge_pages.apply() if arm == "huge" else None
times = []
def timed():
    for _ in range(6):
        started = time.perf_counter(); held["run"](); times.append(time.perf_counter() - started)
thread = threading.Thread(target=timed); thread.start(); thread.join()
huge = next(int(l.split()[1]) for l in open("/proc/self/smaps_rollup") if l.startswith("AnonHugePages:"))
print(json.dumps({"ms": statistics.median(times) * 1e3, "anon_huge_mib": huge >> 10,
                  "apply": None if outcome is None else [outcome.advised >> 20, outcome.collapsed >> 20,
                                                         round(outcome.seconds, 3), outcome.note]}))
"""


def build(kind: str, folder: Path) -> Path:
    sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
    if kind == "onnx_full":
        import str_model

        return str_model.export(folder / "full.onnx")
    if kind == "onnx_text":
        import perf_models

        return perf_models.text_recognition(folder / "text.onnx")
    import pytorch_ceiling

    return pytorch_ceiling.build_model(folder / f"{kind}.pt", "str" if kind == "torch_full" else "text_cnn")


def measure(kind: str, path: Path, arm: str) -> dict:
    result = subprocess.run([sys.executable, "-c", _MEASURE, kind, str(path), arm, str(ROOT)],
                            capture_output=True, text=True, timeout=600, cwd=ROOT)
    if result.returncode != 0:
        raise RuntimeError(f"{kind} {arm}: {result.stderr[-2000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    kinds = [k for k in args.models.split(",") if k]
    from handlers import huge_pages

    runs: dict[str, dict[str, list[dict]]] = {k: {"4k": [], "huge": []} for k in kinds}
    with tempfile.TemporaryDirectory(prefix="huge-pages-") as folder:
        paths = {k: build(k, Path(folder)) for k in kinds}
        for repeat in range(args.repeats):
            for kind in kinds:
                arms = ("4k", "huge") if repeat % 2 == 0 else ("huge", "4k")
                for arm in arms:
                    runs[kind][arm].append(measure(kind, paths[kind], arm))
                print(f"repeat {repeat + 1} {kind}: 4k {runs[kind]['4k'][-1]['ms']:.1f} ms, "
                      f"huge {runs[kind]['huge'][-1]['ms']:.1f} ms {runs[kind]['huge'][-1]['apply']}", flush=True)
    print(f"\ntransparent_hugepage: {huge_pages.mode()}; batch 8, one thread; medians of {args.repeats} processes per arm\n")
    print("| model | 4 KiB pages ms | huge pages ms | ratio | marked / collapsed MiB | apply s |")
    print("|---|---|---|---|---|---|")
    summary = {}
    for kind in kinds:
        small = statistics.median(r["ms"] for r in runs[kind]["4k"])
        huge = statistics.median(r["ms"] for r in runs[kind]["huge"])
        applied = [r["apply"] for r in runs[kind]["huge"]]
        seconds = statistics.median(a[2] for a in applied)
        summary[kind] = {"4k_ms": small, "huge_ms": huge, "speedup": small / huge}
        print(f"| {kind} | {small:.1f} | {huge:.1f} | {small / huge:.2f}x | {applied[0][0]} / {applied[0][1]} | {seconds:.2f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"huge-pages-{dt.date.today()}-{socket.gethostname()}.json"
    out.write_text(json.dumps({"mode": huge_pages.mode(), "repeats": args.repeats, "summary": summary, "runs": runs}, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
