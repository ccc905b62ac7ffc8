"""What the toolkit's Lambda handler adds to an invocation, under AWS's Lambda RIE.

    .venv/bin/python bench/lambda_overhead.py [--rounds 10] [--per-round 100] [--json OUT.json] [--quick]

`--quick` is a smoke run (2 rounds x 20 invocations): it checks the script, the RIE and every
function's answers; its numbers mean nothing.

Three functions run side by side, each as Lambda runs it: AWS's Runtime Interface Emulator (the
binary Lambda's base images carry, toolkit/build/lambda_rie.py) starting the real awslambdaric
with the handler, on samples/quickstart (add_sub, FP32 [1, 16] inputs):

- `bare`: bench/lambda_bare.py, ONNX Runtime called directly (the floor of any handler);
- `toolkit`: `handlers.entrypoints.aws_lambda.handler` as images run it (inference requests on
  the direct path, handlers/entrypoints/lambda_handler.py);
- `toolkit via Mangum`: the same with TOOLKIT_LAMBDA_DIRECT=0 (every request through Mangum's
  ASGI cycle and the app: the handler before the direct path).

Warm invocations only (each function is invoked before timing starts). The rounds interleave the
functions (their order rotates) and the two request kinds: a JSON request and a binary one
(tritonclient's binary tensor extension; the Function URL event carries it base64-encoded). Each
function gets 1 vCPU (AWS_LAMBDA_FUNCTION_MEMORY_SIZE=1769, so the runtime's CPU budget gives its
instance one thread, as bench/lambda_bare.py's session has).

Two latencies per invocation: `client` (the Invoke API call on a kept-alive connection to the
RIE, as the Function URL front would make it) and `handler` (the RIE's REPORT Duration: from
handing the event to the runtime to its response). The added cost is the difference of medians
from `bare`. Prints a markdown table; docs/aws-lambda.md has the numbers.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402

from toolkit.build.lambda_rie import ensure_rie  # noqa: E402
from toolkit.build.local_run import INVOKE_PATH, free_port  # noqa: E402
from toolkit.deploy.function_url import request_event  # noqa: E402
from toolkit.repository.compile import compile_repository  # noqa: E402

QUICKSTART = ROOT / "samples" / "quickstart"
_DURATION = re.compile(r"REPORT RequestId: \S+\s+(?:Init Duration: [0-9.]+ ms\s+)?Duration: ([0-9.]+) ms")


@dataclass
class Function:
    name: str
    handler: str
    env: dict[str, str]
    cwd: Path
    log: Path
    port: int = 0
    process: subprocess.Popen | None = None
    connection: http.client.HTTPConnection | None = None
    client_ms: dict[str, list[float]] = field(default_factory=dict)
    reports_seen: int = 0
    handler_ms: dict[str, list[float]] = field(default_factory=dict)

    def start(self, rie: Path) -> None:
        self.port = free_port()
        environment = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TOOLKIT_"))}
        environment.update(self.env)
        environment["PYTHONPATH"] = os.pathsep.join([str(self.cwd), str(ROOT)])
        self.process = subprocess.Popen(
            [str(rie), "--runtime-interface-emulator-address", f"127.0.0.1:{self.port}",
             "--runtime-api-address", f"127.0.0.1:{free_port()}", sys.executable, "-m", "awslambdaric", self.handler],
            cwd=self.cwd, env=environment, stdout=self.log.open("w"), stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name}: the RIE exited:\n{self.log.read_text()[-3000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name}: the RIE did not listen within 60 s") from None
                time.sleep(0.02)
        self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)

    def invoke(self, payload: bytes) -> tuple[float, dict]:
        assert self.connection is not None
        started = time.perf_counter()
        self.connection.request("POST", INVOKE_PATH, body=payload, headers={"Content-Type": "application/json"})
        response = self.connection.getresponse()
        data = response.read()
        elapsed = (time.perf_counter() - started) * 1000
        if response.status != 200:
            raise RuntimeError(f"{self.name}: invoke answered {response.status}: {data[:500]!r}")
        return elapsed, json.loads(data)

    def reports(self) -> list[float]:
        """Every REPORT Duration the RIE has logged so far (ms)."""
        return [float(m) for m in _DURATION.findall(self.log.read_text(errors="replace"))]

    def stop(self) -> None:
        if self.connection is not None:
            self.connection.close()
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(30)


def requests() -> dict[str, bytes]:
    """The Function URL events (as JSON documents) of the two request kinds."""
    a = np.arange(16, dtype=np.float32).reshape(1, 16)
    events = {}
    for kind, binary in (("JSON", False), ("binary", True)):
        inputs = []
        for name, data in (("INPUT0", a), ("INPUT1", a * 2)):
            tensor = httpclient.InferInput(name, list(data.shape), "FP32")
            tensor.set_data_from_numpy(data, binary_data=binary)
            inputs.append(tensor)
        outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
        body, length = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
        headers = {"Content-Type": "application/octet-stream" if binary else "application/json"}
        if length is not None:
            headers["Inference-Header-Content-Length"] = str(length)
        event = request_event("POST", "/v2/models/add_sub/infer", headers, bytes(body))
        events[kind] = json.dumps(event).encode()
    return events


def check(function: Function, kind: str, answer: dict) -> None:
    """The function computed add_sub (OUTPUT0 = a + b)."""
    import base64

    raw = base64.b64decode(answer["body"]) if answer.get("isBase64Encoded") else answer["body"].encode()
    length = {k.lower(): v for k, v in answer.get("headers", {}).items()}.get("inference-header-content-length")
    result = httpclient.InferResult.from_response_body(raw, header_length=int(length) if length else None)
    expected = np.arange(16, dtype=np.float32).reshape(1, 16) * 3
    if answer.get("statusCode") != 200 or not np.array_equal(result.as_numpy("OUTPUT0"), expected):
        raise RuntimeError(f"{function.name} answered {kind} wrongly: {answer}")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--per-round", type=int, default=100, help="invocations per function, request kind and round")
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--json", type=Path, help="write every latency here")
    parser.add_argument("--quick", action="store_true", help="2 rounds x 20 invocations, 10 warm-up (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.per_round, args.warmup = 2, 20, 10

    scratch = Path(tempfile.mkdtemp(prefix="lambda-overhead-"))
    repository = scratch / "repository"
    shutil.copytree(QUICKSTART, repository)
    compiled = compile_repository(repository)
    if not compiled.ok:
        raise SystemExit(f"samples/quickstart does not compile: {compiled.failures}")
    manifest = compiled.write_manifest(repository / "models.json")
    common = {"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1769", "AWS_LAMBDA_FUNCTION_NAME": "quickstart"}
    toolkit_env = {**common, "TOOLKIT_MANIFEST": str(manifest), "TOOLKIT_LOG_LEVEL": "warning"}
    functions = [
        Function("bare", "lambda_bare.handler", {**common, "BENCH_ONNX_MODEL": str(repository / "add_sub" / "1" / "model.onnx")},
                 ROOT / "bench", scratch / "bare.log"),
        Function("toolkit", "handlers.entrypoints.aws_lambda.handler", {**toolkit_env, "TOOLKIT_LAMBDA_DIRECT": "1"},
                 scratch, scratch / "toolkit.log"),
        Function("toolkit via Mangum", "handlers.entrypoints.aws_lambda.handler",
                 {**toolkit_env, "TOOLKIT_LAMBDA_DIRECT": "0"}, scratch, scratch / "mangum.log"),
    ]
    events = requests()
    rie = ensure_rie("amd64" if platform.machine() in ("x86_64", "AMD64") else platform.machine())
    load = os.getloadavg()
    try:
        for function in functions:
            function.start(rie)
            for kind, payload in events.items():
                _, answer = function.invoke(payload)  # the cold invocation (init), then warm ones
                check(function, kind, answer)
                for _ in range(args.warmup):
                    function.invoke(payload)
            time.sleep(0.5)
            function.reports_seen = len(function.reports())
        for round_number in range(args.rounds):
            order = functions[round_number % len(functions):] + functions[:round_number % len(functions)]
            for function in order:
                for kind, payload in events.items():
                    times = function.client_ms.setdefault(kind, [])
                    for _ in range(args.per_round):
                        times.append(function.invoke(payload)[0])
                    time.sleep(0.05)  # let the RIE write its REPORT lines
                    reports = function.reports()
                    function.handler_ms.setdefault(kind, []).extend(reports[function.reports_seen:])
                    function.reports_seen = len(reports)
    finally:
        for function in functions:
            function.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    load_after = os.getloadavg()

    print(f"Lambda RIE, samples/quickstart add_sub; {args.rounds} rounds x {args.per_round} warm invocations per "
          f"function and request kind; load average {load[0]:.2f} before, {load_after[0]:.2f} after\n")
    print("| request | function | client p50 ms | client p99 ms | handler p50 ms | handler p99 ms | added at p50 (client / handler) |")
    print("|---|---|---|---|---|---|---|")
    results: dict = {"load_before": load, "load_after": load_after, "rounds": args.rounds, "per_round": args.per_round,
                     "functions": {}}
    for kind in events:
        base_client = percentile(functions[0].client_ms[kind], 50)
        base_handler = percentile(functions[0].handler_ms[kind], 50) if functions[0].handler_ms[kind] else float("nan")
        for function in functions:
            client, handler = function.client_ms[kind], function.handler_ms[kind]
            c50, c99 = percentile(client, 50), percentile(client, 99)
            h50 = percentile(handler, 50) if handler else float("nan")
            h99 = percentile(handler, 99) if handler else float("nan")
            added = "" if function is functions[0] else f"{c50 - base_client:+.3f} / {h50 - base_handler:+.3f} ms"
            print(f"| {kind} | {function.name} | {c50:.3f} | {c99:.3f} | {h50:.2f} | {h99:.2f} | {added} |")
            results["functions"].setdefault(function.name, {})[kind] = {"client_ms": client, "handler_ms": handler}
    if args.json:
        args.json.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
