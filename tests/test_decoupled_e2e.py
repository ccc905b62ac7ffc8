"""A Cloud Run image of decoupled models, built by `toolkit build` with the real engine and run as
Cloud Run runs it (read-only root, $PORT): generate_stream events reach the client while the
model is still streaming (nothing in the image buffers them), a client that leaves cancels its
request, the build report says how the target streams, and SIGTERM lets a stream in flight finish."""

from __future__ import annotations

import http.client
import json
import signal
import threading
import time
from pathlib import Path

import pytest
from decoupled_repository import write_repository
from serving import free_port
from test_build_e2e import docker, engine, toolkit_build, wait_ready  # noqa: F401 - engine is a fixture

pytestmark = pytest.mark.docker


def _post(port: int, path: str, body: dict) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", path, body=json.dumps(body))
    response = connection.getresponse()
    payload = response.read()
    connection.close()
    return response.status, payload


def _cancelled(port: int) -> int:
    status, body = _post(port, "/v2/models/probe/generate", {"MODE": 6})
    assert status == 200, body
    return sum(line.startswith("cancelled") for line in json.loads(json.loads(body)["OUT"]))


def test_cloudrun_image_streams_decoupled_responses(engine: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    repo = write_repository(tmp_path / "models", models=("probe", "repeat"))
    report = toolkit_build(engine, tmp_path / "ctx", "--target", "cloudrun", "--name", "decoupled-e2e", repository=repo)
    assert any("decoupled (streaming) model(s) stream server-sent events" in w for w in report["warnings"]), report
    port = free_port()
    container = docker(
        engine, "run", "-d", "--network", "host", "--read-only", "--tmpfs", "/tmp", "-e", f"PORT={port}",
        "-e", "TOOLKIT_HOST=127.0.0.1", report["image"],
    ).stdout.strip()
    try:
        wait_ready(f"http://127.0.0.1:{port}", container, engine)
        # the model sends one event, then waits for its request to be cancelled: the event can
        # only arrive if the image streams it, and only the client leaving ends the wait
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        connection.request("POST", "/v2/models/probe/generate_stream", body=json.dumps({"MODE": 10}))
        response = connection.getresponse()
        assert response.status == 200 and response.getheader("content-type") == "text/event-stream; charset=utf-8"
        first = b""
        while not first.endswith(b"\n\n"):
            first += response.read1(4096)
        assert json.loads(first[len(b"data: "):])["OUT"] == "waiting for cancellation"
        before = _cancelled(port)
        connection.close()
        deadline = time.monotonic() + 30
        while _cancelled(port) == before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _cancelled(port) == before + 1
        assert _post(port, "/v2/models/repeat/infer", {})[0] == 501

        # SIGTERM with a stream in flight: it finishes, then the container exits 0
        stream = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        stream.request("POST", "/v2/models/repeat/generate_stream",
                       body=json.dumps({"IN": [1, 2, 3, 4], "DELAY": [300] * 4, "WAIT": 0}))
        answer = stream.getresponse()
        received = [answer.read1(4096)]
        reader = threading.Thread(target=lambda: received.append(answer.read()), daemon=True)
        reader.start()
        docker(engine, "kill", "--signal", str(int(signal.SIGTERM)), container)
        reader.join(60)
        assert b"".join(received).count(b"data: ") == 4
        docker(engine, "wait", container, timeout=60)
        state = json.loads(docker(engine, "inspect", "--format", "{{json .State}}", container).stdout)
        assert state["ExitCode"] == 0, docker(engine, "logs", container).stderr
    finally:
        docker(engine, "rm", "-f", container, check=False)
        docker(engine, "rmi", report["image"], check=False)
