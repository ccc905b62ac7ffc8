"""ONNX Runtime with and without the OpenVINO execution accelerator, served by `toolkit serve`.

    .venv/bin/python bench/openvino_vs_ort.py              # 3 interleaved repeats
    .venv/bin/python bench/openvino_vs_ort.py --quick      # 1 repeat, short windows (checks it runs)

The accelerator is `optimization { execution_accelerators { cpu_execution_accelerator:
[ { name: "openvino" } ] } }` on an onnxruntime model; images then carry `onnxruntime-openvino`
instead of `onnxruntime` (the same module, never both). So the arms run in two environments:

- `ort`: this checkout's .venv (onnxruntime, CPU execution provider), the repository as it is;
- `ort-openvino (cpu ep)`: a venv with onnxruntime-openvino (the version toolkit/build/runtime_deps.py
  pins), the repository as it is: the same ONNX Runtime build without the accelerator, so the
  version difference between the two wheels is visible on its own;
- `ort-openvino (openvino ep)`: that venv, with the accelerator added to the onnxruntime models.

The venv is made once (`--venv`, default ~/.cache/toolkit/bench/ort-openvino): this checkout
installed with its base dependencies, Pillow (the OCR sample's Python models), and
onnxruntime-openvino without dependencies, as the images install it.

Workloads:
- `text_recognition` (bench/perf_models.py, as in bench/serve_vs_triton.py configuration (3):
  max_batch_size 8, dynamic batching, 2 instances, 1 intra-op thread): perf_analyzer 2.51
  `-b 2 --shape input.1:1,32,100` at concurrency 1 and 16;
- `ocr` (samples/ocr, prepared by scripts/demo.sh or samples/ocr/prepare.py): the ensemble end to
  end (Python pre/post-processing, PP-OCRv6 detection and recognition with their real weights) on
  the demo's rendered image, driven by tritonclient in a closed loop at concurrency 1 and 4.

Every repeat runs every arm, in an order that rotates from repeat to repeat; the tables give
medians of the repeats.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "samples" / "ocr"))

import perf_analyzer  # noqa: E402
import perf_models  # noqa: E402
from openvino_bench import toolkit_serve  # noqa: E402

ACCELERATOR = 'optimization { execution_accelerators { cpu_execution_accelerator: [ { name: "openvino" } ] } }\n'
TEXT_CONFIG = """name: "text_recognition"
backend: "onnxruntime"
max_batch_size: 8
input [ { name: "input.1" data_type: TYPE_FP32 dims: [ 1, 32, 100 ] } ]
output [ { name: "308" data_type: TYPE_FP32 dims: [ 26, 37 ] } ]
dynamic_batching { }
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
parameters { key: "inter_op_thread_count" value: { string_value: "1" } }
"""
ORT = "ort"
OV_CPU = "ort-openvino (cpu ep)"
OV_EP = "ort-openvino (openvino ep)"
ARMS = (ORT, OV_CPU, OV_EP)


def ort_openvino_spec() -> str:
    from toolkit.build.runtime_deps import ONNXRUNTIME_OPENVINO

    return ONNXRUNTIME_OPENVINO.spec


def ensure_venv(path: Path) -> Path:
    """A venv with this checkout, Pillow and onnxruntime-openvino (no onnxruntime); made once."""
    python = path / "bin" / "python"
    stamp = path / ".toolkit-bench"
    want = ort_openvino_spec()
    if python.exists() and stamp.exists() and stamp.read_text() == want:
        return python
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "-e", str(ROOT), "pillow>=10.1"], check=True)
    subprocess.run([*pip, "--no-deps", want], check=True)
    check = subprocess.run([str(python), "-c", "import onnxruntime as o; print(o.get_available_providers())"],
                           capture_output=True, text=True, check=True)
    if "OpenVINOExecutionProvider" not in check.stdout:
        raise RuntimeError(f"{want} in {path} has no OpenVINOExecutionProvider: {check.stdout}{check.stderr}")
    stamp.write_text(want)
    return python


def with_accelerator(source: Path, destination: Path) -> Path:
    """A copy of repository `source` whose onnxruntime models ask for the OpenVINO accelerator."""
    shutil.copytree(source, destination, symlinks=False)
    for config in destination.glob("*/config.pbtxt"):
        text = config.read_text()
        if 'backend: "onnxruntime"' in text:
            config.write_text(text + ACCELERATOR)
    return destination


def text_recognition_repo(directory: Path) -> Path:
    repo = directory / "text"
    perf_models.text_recognition(repo / "text_recognition" / "1" / "model.onnx")
    (repo / "text_recognition" / "config.pbtxt").write_text(TEXT_CONFIG)
    return repo


def measure_text(url: str, concurrency: int, measurement_ms: int) -> perf_analyzer.Level:
    levels = perf_analyzer.run_levels("text_recognition", url, batch=2, shape="input.1:1,32,100",
                                      concurrency=str(concurrency), measurement_ms=measurement_ms, max_trials=10)
    return levels[-1]


def measure_ocr(url: str, image: bytes, concurrency: int, seconds: float) -> tuple[float, float, float, str]:
    """Closed loop: `concurrency` clients sending the image back to back for `seconds`.
    Returns (requests/s, p50 ms, p95 ms, the text read)."""
    import tritonclient.http as httpclient
    from client import read_text

    text = " / ".join(t for t, _, _ in read_text(httpclient.InferenceServerClient(url), image))
    for _ in range(2):  # warm
        read_text(httpclient.InferenceServerClient(url), image)
    latencies: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def loop() -> None:
        client = httpclient.InferenceServerClient(url, network_timeout=120)
        while time.monotonic() < stop:
            began = time.perf_counter()
            read_text(client, image)
            with lock:
                latencies.append(time.perf_counter() - began)

    threads = [threading.Thread(target=loop) for _ in range(concurrency)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    ordered = sorted(latencies)
    return len(ordered) / elapsed, 1000 * ordered[len(ordered) // 2], 1000 * ordered[int(len(ordered) * 0.95) - 1], text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--venv", type=Path, default=Path("~/.cache/toolkit/bench/ort-openvino").expanduser())
    parser.add_argument("--measurement-ms", type=int, default=3000)
    parser.add_argument("--ocr-seconds", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="1 repeat, short windows")
    parser.add_argument("--skip-ocr", action="store_true", help="text_recognition only")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.measurement_ms, args.ocr_seconds = 1, 1000, 3.0
    ocr_sample = ROOT / "samples" / "ocr"
    if not args.skip_ocr and not (ocr_sample / "text_detection" / "1" / "model.onnx").exists():
        print("samples/ocr is not prepared: run .venv/bin/python samples/ocr/prepare.py (or scripts/demo.sh)")
        return 2
    ov_python = ensure_venv(args.venv)
    pythons = {ORT: sys.executable, OV_CPU: str(ov_python), OV_EP: str(ov_python)}
    from client import DEFAULT_LINES, render

    image = render(DEFAULT_LINES)
    results: dict[tuple[str, str], list] = {}
    with tempfile.TemporaryDirectory(prefix="openvino-vs-ort-") as scratch:
        scratch_path = Path(scratch)
        text_plain = text_recognition_repo(scratch_path)
        repos = {
            "text_recognition": {ORT: text_plain, OV_CPU: text_plain,
                                 OV_EP: with_accelerator(text_plain, scratch_path / "text-ov")},
        }
        if not args.skip_ocr:
            plain = scratch_path / "ocr"
            shutil.copytree(ocr_sample, plain)
            repos["ocr"] = {ORT: plain, OV_CPU: plain, OV_EP: with_accelerator(plain, scratch_path / "ocr-ov")}
        logs = scratch_path / "logs"
        for repeat in range(args.repeats):
            order = ARMS[repeat % len(ARMS):] + ARMS[: repeat % len(ARMS)]
            for arm in order:
                for workload, by_arm in repos.items():
                    log = logs / f"{workload}-{arm.split()[0]}-{repeat}.log"
                    with toolkit_serve(by_arm[arm], log, python=pythons[arm]) as url:
                        if workload == "text_recognition":
                            for concurrency in (1, 16):
                                level = measure_text(url, concurrency, args.measurement_ms)
                                results.setdefault((workload, f"{arm}|c{concurrency}"), []).append(
                                    (level.throughput, level.p50_us / 1000, level.p95_us / 1000, ""))
                        else:
                            for concurrency in (1, 4):
                                results.setdefault((workload, f"{arm}|c{concurrency}"), []).append(
                                    measure_ocr(url, image, concurrency, args.ocr_seconds))
                    last = {k: v[-1] for k, v in results.items() if k[1].split("|")[0] == arm}
                    print(f"repeat {repeat + 1} {workload} {arm}: " + "; ".join(
                        f"{k[1].split('|')[1]} {v[0]:.1f}/s p50 {v[1]:.1f} ms" for k, v in last.items() if k[0] == workload),
                        flush=True)

    print()
    print(f"{args.repeats} repeat(s), medians; onnxruntime {_version(sys.executable)} vs {ort_openvino_spec()}")
    print()
    print("| workload | concurrency | arm | throughput | p50 ms | p95 ms | vs ort |")
    print("|---|---|---|---|---|---|---|")
    for (workload, key), values in sorted(results.items(), key=lambda kv: (kv[0][0], kv[0][1].split("|")[1],
                                                                          ARMS.index(kv[0][1].split("|")[0]))):
        arm, level = key.split("|")
        throughput = statistics.median(v[0] for v in values)
        base = statistics.median(v[0] for v in results[(workload, f"{ORT}|{level}")])
        unit = "infer/s" if workload == "text_recognition" else "images/s"
        print(f"| {workload} | {level[1:]} | {arm} | {throughput:.1f} {unit} | {statistics.median(v[1] for v in values):.1f} "
              f"| {statistics.median(v[2] for v in values):.1f} | {throughput / base:.2f}x |")
    texts = {v[3] for (w, _), values in results.items() if w == "ocr" for v in values}
    if texts:
        print(f"\nOCR text read by every arm: {sorted(texts)}")
    return 0


def _version(python: str) -> str:
    out = subprocess.run([python, "-c", "import onnxruntime; print(onnxruntime.__version__)"], capture_output=True,
                         text=True)
    return out.stdout.strip() or "?"


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
