#!/usr/bin/env python3
"""Run the gRPC examples of Triton's client repository, unchanged, against `toolkit serve`.

    .venv/bin/python scripts/grpc_examples.py /path/to/triton-inference-server/client [--json]

The examples (src/python/examples/*grpc*.py) cannot be committed or fetched in CI, so this script
takes a checkout the user provides. It builds the models the examples expect, as Triton's QA
repository has them: `simple` (INT32 add/sub, ONNX), `simple_int8` (INT8 add/sub), `simple_string`
(BYTES holding integers as text, add/sub), `simple_identity` (BYTES identity) and the decoupled
`repeat_int32` (tests/python_models/decoupled_repeat.py), all but the first as python-backend models; serves them with `toolkit serve` on a free gRPC port; runs each example
with `-u 127.0.0.1:PORT`, and prints what passed, what failed, and for examples that cannot pass
here, why (each expected failure is checked to fail). Exit status 1 when an example that should
pass fails, or one expected to fail passes (update the list). docs/grpc.md records a run.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

# example -> None (must pass) or the reason it cannot pass against this server.
EXAMPLES: dict[str, str | None] = {
    "simple_grpc_infer_client.py": None,
    "simple_grpc_async_infer_client.py": None,
    "simple_grpc_aio_infer_client.py": None,
    "simple_grpc_string_infer_client.py": None,
    "simple_grpc_custom_args_client.py": None,
    "simple_grpc_keepalive_client.py": None,
    "grpc_explicit_int_content_client.py": None,
    "grpc_explicit_int8_content_client.py": None,
    "grpc_explicit_byte_content_client.py": None,
    "simple_grpc_health_metadata.py": None,
    "simple_grpc_model_control.py": "loads and unloads models: the model control mode is NONE, as tritonserver's default",
    "simple_grpc_shm_client.py": "system shared memory: a serverless server never shares a host with its client",
    "simple_grpc_shm_string_client.py": "system shared memory: a serverless server never shares a host with its client",
    "simple_grpc_cudashm_client.py": "CUDA shared memory: a serverless server never shares a host with its client",
    "simple_grpc_sequence_stream_infer_client.py": "needs sequence batching (simple_sequence), not supported",
    "simple_grpc_sequence_sync_infer_client.py": "needs sequence batching (simple_dyna_sequence), not supported",
    "simple_grpc_aio_sequence_stream_infer_client.py": "needs sequence batching (simple_sequence), not supported",
    "simple_grpc_custom_repeat.py": None,
}
NEEDS_OTHER_MODELS = {"grpc_client.py": "densenet_onnx", "grpc_image_client.py": "an image classification model"}

ADD_SUB_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Triton QA's {name}: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 ({kind})."""

    def execute(self, requests):
        responses = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            {body}
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", s), pb_utils.Tensor("OUTPUT1", d)]))
        return responses
'''
IDENTITY_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())])
            for r in requests
        ]
'''


REPEAT_CONFIG = """\
name: "repeat_int32"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
        { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
"""


def _config(name: str, backend: str, datatype: str, dims: str, outputs: int = 2, max_batch: int = 8) -> str:
    inputs = ", ".join(f'{{ name: "INPUT{i}" data_type: {datatype} dims: [ {dims} ] }}' for i in range(2 if outputs == 2 else 1))
    outs = ", ".join(f'{{ name: "OUTPUT{i}" data_type: {datatype} dims: [ {dims} ] }}' for i in range(outputs))
    return textwrap.dedent(f"""\
        name: "{name}"
        backend: "{backend}"
        max_batch_size: {max_batch}
        input [ {inputs} ]
        output [ {outs} ]
    """)


def build_repository(root: Path) -> Path:
    import model_builders as mb

    repo = root / "models"
    mb.add_sub(repo / "simple" / "1" / "model.onnx", dtype="INT32")
    (repo / "simple" / "config.pbtxt").write_text(_config("simple", "onnxruntime", "TYPE_INT32", "16"))
    int8 = "s, d = (a + b).astype(np.int8), (a - b).astype(np.int8)"
    strings = (
        "x, y = a.astype(np.int32), b.astype(np.int32)\n"
        "            s = np.array([str(v).encode() for v in (x + y).reshape(-1)], dtype=object).reshape(a.shape)\n"
        "            d = np.array([str(v).encode() for v in (x - y).reshape(-1)], dtype=object).reshape(a.shape)"
    )
    for name, datatype, body in (("simple_int8", "TYPE_INT8", int8), ("simple_string", "TYPE_STRING", strings)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.py").write_text(ADD_SUB_PY.format(name=name, kind=datatype, body=body))
        (repo / name / "config.pbtxt").write_text(_config(name, "python", datatype, "16"))
    (repo / "simple_identity" / "1").mkdir(parents=True)
    (repo / "simple_identity" / "1" / "model.py").write_text(IDENTITY_PY)
    (repo / "simple_identity" / "config.pbtxt").write_text(_config("simple_identity", "python", "TYPE_STRING", "-1", outputs=1))
    # the decoupled repeat_int32 (Triton's repeat backend) as the python-backend model that behaves alike
    (repo / "repeat_int32" / "1").mkdir(parents=True)
    (repo / "repeat_int32" / "1" / "model.py").write_text((ROOT / "tests" / "python_models" / "decoupled_repeat.py").read_text())
    (repo / "repeat_int32" / "config.pbtxt").write_text(REPEAT_CONFIG)
    return repo


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(port: int, process: subprocess.Popen, timeout: float = 180) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"toolkit serve exited with {process.returncode}")
            try:
                if stub.Check(health_pb2.HealthCheckRequest(), timeout=2).status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise TimeoutError("toolkit serve did not become ready")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("client", type=Path, help="a checkout of github.com/triton-inference-server/client")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    examples = args.client / "src" / "python" / "examples"
    if not examples.is_dir():
        parser.error(f"{examples} is not a folder: pass the root of a triton-inference-server/client checkout")
    found = sorted(p.name for p in examples.glob("*grpc*.py"))
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="toolkit-grpc-examples-") as folder:
        repo = build_repository(Path(folder))
        port = _free_port()
        log = open(Path(folder) / "serve.log", "w")
        server = subprocess.Popen(
            [sys.executable, "-m", "toolkit.cli", "serve", str(repo), "--device", "cpu", "--http-port", "0",
             "--grpc-port", str(port), "--metrics-port", "0", "--log-level", "warning"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        )
        try:
            _wait_ready(port, server)
            for name in found:
                if name in NEEDS_OTHER_MODELS:
                    results.append({"example": name, "status": "not run", "why": f"needs {NEEDS_OTHER_MODELS[name]}"})
                    continue
                expected = EXAMPLES.get(name, None)
                started = time.monotonic()
                try:
                    run = subprocess.run([sys.executable, str(examples / name), "-u", f"127.0.0.1:{port}"],
                                         capture_output=True, text=True, timeout=120, cwd=examples)
                    code, output = run.returncode, (run.stdout + run.stderr)[-1500:]
                except subprocess.TimeoutExpired:
                    code, output = -1, "timed out after 120 s"
                passed = code == 0
                if expected is None:
                    status = "PASS" if passed else "FAIL"
                else:
                    status = "expected failure" if not passed else "UNEXPECTED PASS"
                results.append({"example": name, "status": status, "exit": code, "seconds": round(time.monotonic() - started, 1),
                                "why": expected or "", "output": "" if status in ("PASS", "expected failure") else output})
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()
            log.close()
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for result in results:
            line = f"{result['status']:>17}  {result['example']}"
            if result["why"]:
                line += f"  ({result['why']})"
            print(line)
            if result.get("output"):
                print(textwrap.indent(result["output"].strip(), "      | "))
    bad = [r for r in results if r["status"] in ("FAIL", "UNEXPECTED PASS")]
    print(f"{sum(r['status'] == 'PASS' for r in results)} passed, {len(bad)} failed", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
