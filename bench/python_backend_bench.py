"""Python-backend instance modes measured: model processes (the default, Triton's layout) against
in-process instances. Numbers quoted in docs/python-backend.md come from this script.

    .venv/bin/python bench/python_backend_bench.py [--quick]

1. cold start: creating N instances of a small model in parallel (as the repository does);
2. per-batch overhead: one request with a [1, 16] FP32 pair (add_sub) and with 4 MiB inputs;
3. CPU-bound Python (a pure-Python loop in execute): throughput with count 1 and count 2, each
   instance driven by its own thread as the batcher's workers drive them;
4. the latency of a small in-process model while a CPU-bound model runs next to it (GIL);
5. auto_complete_config: a model process per model vs importing model.py in the compiler process.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from handlers.backends.python.inprocess_instance import InProcessInstance
from handlers.backends.python.process_instance import ProcessInstance
from handlers.inference import InferRequest
from handlers.manifest import ModelSpec

ADD_SUB = (ROOT / "tests" / "python_models" / "add_sub.py").read_text()
BUSY = textwrap.dedent(
    """
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def execute(self, requests):
            responses = []
            for request in requests:
                n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().reshape(-1)[0])
                total = 0
                for i in range(n):  # CPU-bound pure Python: holds the GIL
                    total += i * i % 7
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([total], np.int64))]))
            return responses
    """
)


def _tensor(name: str, dtype: str, dims: list[int]) -> dict:
    return {"name": name, "data_type": dtype, "dims": dims}


def model(root: Path, name: str, source: str, inputs: list[dict], outputs: list[dict], max_batch_size: int = 0) -> ModelSpec:
    directory = root / name
    (directory / "1").mkdir(parents=True)
    (directory / "1" / "model.py").write_text(source)
    config = {"name": name, "backend": "python", "max_batch_size": max_batch_size, "input": inputs, "output": outputs,
              "instance_group": [{"name": name, "kind": "KIND_CPU", "count": 1}], "parameters": {}}
    return ModelSpec(name, directory, (1,), {1: directory / "1" / "model.py"}, config)


def create(kind: str, spec: ModelSpec, count: int) -> tuple[list, float]:
    cls = ProcessInstance if kind == "process" else InProcessInstance
    started = time.perf_counter()
    with ThreadPoolExecutor(max(1, count)) as pool:
        instances = list(pool.map(lambda i: cls(spec, 1, f"{spec.name}_{i}"), range(count)))
    return instances, time.perf_counter() - started


def close(instances: list) -> None:
    for instance in instances:
        instance.close()


def cold_start(root: Path, repeats: int) -> dict:
    results = {}
    for kind in ("process", "inprocess"):
        for count in (1, 2, 4):
            times = []
            for r in range(repeats):
                spec = model(root, f"cold_{kind}_{count}_{r}", ADD_SUB, [_tensor("INPUT0", "TYPE_FP32", [16]), _tensor("INPUT1", "TYPE_FP32", [16])],
                             [_tensor("OUTPUT0", "TYPE_FP32", [16]), _tensor("OUTPUT1", "TYPE_FP32", [16])])
                instances, seconds = create(kind, spec, count)
                times.append(seconds)
                close(instances)
            results[f"{kind} count={count}"] = f"{statistics.median(times) * 1000:.0f} ms"
    return results


def latency(root: Path, iterations: int) -> dict:
    results = {}
    for size, label in ((16, "[1,16] fp32"), (1 << 20, "[1,1M] fp32 (4 MiB)")):
        spec = model(root, f"lat_{size}", ADD_SUB, [_tensor("INPUT0", "TYPE_FP32", [size]), _tensor("INPUT1", "TYPE_FP32", [size])],
                     [_tensor("OUTPUT0", "TYPE_FP32", [size]), _tensor("OUTPUT1", "TYPE_FP32", [size])], max_batch_size=8)
        a = np.random.default_rng(0).standard_normal((1, size), dtype=np.float32)
        for kind in ("process", "inprocess"):
            instances, _ = create(kind, spec, 1)
            instance = instances[0]
            n = iterations if size == 16 else max(20, iterations // 50)
            samples = []
            for _ in range(n + 10):
                request = InferRequest(spec.name, 1, {"INPUT0": a, "INPUT1": a})
                started = time.perf_counter()
                outcome = instance.execute([request])[0]
                samples.append(time.perf_counter() - started)
                assert np.array_equal(outcome.outputs["OUTPUT0"], a + a)
            samples = samples[10:]
            results[f"{label} {kind}"] = f"p50 {statistics.median(samples) * 1e6:.0f} us, p90 {np.percentile(samples, 90) * 1e6:.0f} us"
            close(instances)
    return results


def cpu_bound(root: Path, seconds: float, work: int) -> dict:
    spec = model(root, "busy", BUSY, [_tensor("N", "TYPE_INT64", [1])], [_tensor("OUT", "TYPE_INT64", [1])])
    results = {}
    for kind in ("process", "inprocess"):
        for count in (1, 2):
            instances, _ = create(kind, spec, count)
            done = [0] * count
            stop = time.perf_counter() + seconds

            def drive(index: int, instances: list = instances, done: list = done, stop: float = stop) -> None:
                while time.perf_counter() < stop:
                    request = InferRequest("busy", 1, {"N": np.array([work], np.int64)})
                    instances[index].execute([request])
                    done[index] += 1

            threads = [threading.Thread(target=drive, args=(i,)) for i in range(count)]
            started = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.perf_counter() - started
            results[f"{kind} count={count}"] = f"{sum(done) / elapsed:.1f} req/s"
            close(instances)
    return results


def neighbour_latency(root: Path, seconds: float) -> dict:
    """What a CPU-bound model costs *other* traffic: p50/p99 of a small in-process add_sub call
    made every millisecond while the busy model runs flat out in-process or in its process."""
    busy_spec = model(root, "busy_neighbour", BUSY, [_tensor("N", "TYPE_INT64", [1])], [_tensor("OUT", "TYPE_INT64", [1])])
    small_spec = model(root, "small_neighbour", ADD_SUB, [_tensor("INPUT0", "TYPE_FP32", [16]), _tensor("INPUT1", "TYPE_FP32", [16])],
                       [_tensor("OUTPUT0", "TYPE_FP32", [16]), _tensor("OUTPUT1", "TYPE_FP32", [16])], max_batch_size=8)
    small = InProcessInstance(small_spec, 1, "small_neighbour")
    a = np.ones((1, 16), np.float32)
    results = {}
    for kind in ("none", "process", "inprocess"):
        busy = [] if kind == "none" else create(kind, busy_spec, 1)[0]
        stop = time.perf_counter() + seconds

        def spin(busy: list = busy, stop: float = stop) -> None:
            while busy and time.perf_counter() < stop:
                busy[0].execute([InferRequest("busy_neighbour", 1, {"N": np.array([200_000], np.int64)})])

        thread = threading.Thread(target=spin)
        thread.start()
        samples = []
        while time.perf_counter() < stop:
            started = time.perf_counter()
            small.execute([InferRequest("small_neighbour", 1, {"INPUT0": a, "INPUT1": a})])
            samples.append(time.perf_counter() - started)
            time.sleep(0.001)
        thread.join()
        close(busy)
        label = {"none": "alone", "process": "busy model in its process", "inprocess": "busy model in-process"}[kind]
        results[label] = f"p50 {statistics.median(samples) * 1e6:.0f} us, p99 {np.percentile(samples, 99) * 1e6:.0f} us"
    small.close()
    return results


def autocomplete(repeats: int) -> dict:
    from toolkit.repository.python_autocomplete import run_model_autocomplete

    source = (ROOT / "tests" / "python_models" / "auto_complete.py").read_text()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "auto"
        (directory / "1").mkdir(parents=True)
        (directory / "1" / "model.py").write_text(source)
        config = {"name": "auto", "max_batch_size": 0, "input": [], "output": []}
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            run_model_autocomplete(config, directory / "1" / "model.py", directory, 1)
            times.append(time.perf_counter() - started)
        in_process = []
        from handlers.backends.python.autocomplete import run

        for i in range(repeats):
            sys.modules.pop("1.model", None)
            sys.modules.pop("1", None)
            started = time.perf_counter()
            run({"model_file": str(directory / "1" / "model.py"), "model_dir": str(directory), "version": 1, "config": config})
            in_process.append(time.perf_counter() - started)
    return {"model process per model": f"{statistics.median(times) * 1000:.0f} ms",
            "in the compiler process (numpy already imported)": f"{statistics.median(in_process) * 1000:.1f} ms"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats, iterations, seconds = (2, 200, 2.0) if args.quick else (5, 2000, 5.0)
    report = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        report["cold start (instances created in parallel)"] = cold_start(root, repeats)
        report["execute() round trip, one request"] = latency(root, iterations)
        report["CPU-bound pure-Python execute (5M-iteration loop per request)"] = cpu_bound(root, seconds, 5_000_000 if not args.quick else 1_000_000)
        report["a small in-process model's latency next to a CPU-bound model"] = neighbour_latency(root, seconds)
    report["auto_complete_config"] = autocomplete(repeats)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
