"""toolkit.build.lambda_emulator against the real AWS runtime interface client (awslambdaric).

No container engine needed: awslambdaric runs as a host process and polls the emulated Runtime
API, exactly as it does inside an image. The last test serves samples/quickstart through the
runtime's Lambda entry point (Mangum) and drives it with tritonclient through the Function URL
front; tests/test_build_e2e.py does the same with the built image.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from toolkit.build.lambda_emulator import FunctionURL, RuntimeAPI, function_url_event
from toolkit.repository.compile import compile_repository

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "samples" / "quickstart"


def start_function(api: RuntimeAPI, handler: str, cwd: Path, log: Path, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "TOOLKIT_"))}
    env.update(api.environment())
    env.update(extra_env or {})
    env["PYTHONPATH"] = os.pathsep.join([str(cwd), str(ROOT)])
    return subprocess.Popen(
        [sys.executable, "-m", "awslambdaric", handler], cwd=cwd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT
    )


@pytest.fixture
def function_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "fn"
    folder.mkdir()
    (folder / "echo.py").write_text(
        textwrap.dedent(
            """\
            def handler(event, context):
                if event.get("fail"):
                    raise ValueError("asked to fail")
                return {"event": event, "function": context.function_name, "request_id": context.aws_request_id}
            """
        )
    )
    (folder / "broken.py").write_text("raise ImportError('cannot initialise')\n")
    return folder


@pytest.fixture
def api() -> Iterator[RuntimeAPI]:
    with RuntimeAPI(function_name="echo-fn") as runtime:
        yield runtime


def _stop(process: subprocess.Popen) -> None:
    process.kill()
    process.wait(timeout=30)


def test_runtime_client_gets_events_and_posts_responses_and_errors(api: RuntimeAPI, function_dir: Path, tmp_path: Path) -> None:
    process = start_function(api, "echo.handler", function_dir, tmp_path / "fn.log")
    try:
        first = api.invoke({"n": 1}, timeout=60, alive=lambda: process.poll() is None)
        assert first.outcome == "response"
        assert first.payload["event"] == {"n": 1}
        assert first.payload["function"] == "echo-fn"
        assert first.payload["request_id"] == first.request_id
        assert api.first_poll.is_set()

        failed = api.invoke({"fail": True}, timeout=60)
        assert failed.outcome == "error"
        assert failed.payload["errorType"] == "ValueError"
        assert failed.payload["errorMessage"] == "asked to fail"

        again = api.invoke({"n": 2}, timeout=60)  # the same environment keeps serving
        assert again.outcome == "response" and again.payload["event"] == {"n": 2}
    finally:
        _stop(process)


def test_init_failure_is_reported_instead_of_waiting(api: RuntimeAPI, function_dir: Path, tmp_path: Path) -> None:
    process = start_function(api, "broken.handler", function_dir, tmp_path / "fn.log")
    try:
        with pytest.raises(RuntimeError, match="failed to initialise|exited before answering"):
            api.invoke({"n": 1}, timeout=60, alive=lambda: process.poll() is None)
        assert api.init_failed.wait(30)
        assert "cannot initialise" in str(api.init_error)
    finally:
        _stop(process)


def test_function_url_events_follow_payload_format_2() -> None:
    text = function_url_event("POST", "/v2/models/m/infer?x=1", {"content-type": "application/json"}, b'{"a":1}', "h")
    assert text["version"] == "2.0" and text["rawPath"] == "/v2/models/m/infer" and text["rawQueryString"] == "x=1"
    assert text["requestContext"]["http"]["method"] == "POST"
    assert text["body"] == '{"a":1}' and text["isBase64Encoded"] is False
    binary = function_url_event("POST", "/x", {"content-type": "application/octet-stream"}, b"\x00\xff", "h")
    assert binary["isBase64Encoded"] is True and base64.b64decode(binary["body"]) == b"\x00\xff"


@pytest.fixture
def compiled_repository(tmp_path: Path) -> Path:
    """samples/quickstart with its compiled manifest next to the models (as in an image)."""
    root = tmp_path / "repository"
    shutil.copytree(QUICKSTART, root)
    compiled = compile_repository(root)
    assert compiled.ok
    compiled.write_manifest(root / "models.json")
    return root


def test_tritonclient_through_function_url_to_the_runtime_lambda_entry_point(compiled_repository: Path, tmp_path: Path) -> None:
    with RuntimeAPI() as api, FunctionURL(api, timeout=120) as url:
        process = start_function(
            api,
            "handlers.entrypoints.aws_lambda.handler",
            tmp_path,
            tmp_path / "fn.log",
            {"TOOLKIT_MANIFEST": str(compiled_repository / "models.json"), "TOOLKIT_LOG_LEVEL": "warning"},
        )
        try:
            client = httpclient.InferenceServerClient(url.address, network_timeout=120)
            assert client.is_server_ready(), (tmp_path / "fn.log").read_text()
            assert client.is_model_ready("add_sub")
            a = np.arange(32, dtype=np.float32).reshape(2, 16)
            b = np.ones((2, 16), dtype=np.float32)
            inputs = [httpclient.InferInput("INPUT0", [2, 16], "FP32"), httpclient.InferInput("INPUT1", [2, 16], "FP32")]
            inputs[0].set_data_from_numpy(a, binary_data=False)
            inputs[1].set_data_from_numpy(b, binary_data=True)
            result = client.infer("add_sub", inputs)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
            assert client.get_model_config("add_sub")["max_batch_size"] == 8
        finally:
            _stop(process)
