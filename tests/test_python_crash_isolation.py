"""A python model that dies mid-request fails only its own request, where other requests are in
flight: in `toolkit serve` and in the Cloud Run image (their default runs python models in model
processes); the Lambda image keeps single-instance models in-process (one request per execution
environment, and a faster cold start).

The repository: `errors` (tests/python_models/errors.py: MODE 13 calls `os._exit(7)` in execute)
and `hold` (tests/python_models/hold.py: signals that execute began, then holds its batch until the
test releases it), so the test knows requests to another model are in flight when `errors` dies.

What tritonserver 2.51 does (python_backend r24.10, src/python_be.cc / stub_launcher.cc): the
batch the dead stub was executing fails with INTERNAL "Stub process '<instance>' is not healthy."
(HTTP 500), the server and the other models go on. Then it keeps failing that instance's later
requests the same way (python_backend up to r24.07 started a new stub for the next batch,
logging "Stub process is unhealthy and it will be restarted."); this runtime restarts, as those
releases did (docs/python-backend.md, deviation 3), so the next request succeeds.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from python_models.repository import python_model
from serving import free_port, serve
from test_build_e2e import docker, engine, toolkit_build, wait_ready  # noqa: F401 (engine: a fixture)

MODE = "TOOLKIT_PYTHON_INSTANCE_MODE"
ERRORS_CONFIG = """
    backend: "python"
    max_batch_size: 0
    input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
HOLD_CONFIG = """
    backend: "python"
    max_batch_size: 0
    input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
    output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
"""
CRASH = 13  # errors.py: os._exit(7) in execute
DEAD = "Stub process 'errors_0' is not healthy."  # the instance: group "errors", index 0
RESTART_LOG = "Stub process 'errors_0' is unhealthy and it will be restarted."


def write_repository(root: Path) -> Path:
    python_model(root, "errors", "errors.py", ERRORS_CONFIG)
    python_model(root, "hold", "hold.py", HOLD_CONFIG)
    return root


def infer(base: str, model: str, name: str, value: int, timeout: float = 150) -> tuple[int, dict]:
    body = json.dumps({"inputs": [{"name": name, "shape": [1], "datatype": "INT32", "data": [value]}]}).encode()
    request = urllib.request.Request(
        f"{base}/v2/models/{model}/infer", body, {"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def ready(base: str, path: str = "/v2/health/ready") -> int:
    try:
        with urllib.request.urlopen(base + path, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)  # a file another process writes: there is nothing to wait on


def crash_while_others_are_in_flight(base: str, signals: Path, alive: Callable[[], bool]) -> None:
    """`errors` dies while three requests to `hold` are in flight (one executing, two queued):
    only its own request fails, the others and the later ones succeed."""
    with ThreadPoolExecutor(3) as pool:
        try:
            held = [pool.submit(infer, base, "hold", "X", value) for value in (1, 2, 3)]
            wait_for(lambda: any(signals.glob("started-*")), "hold's execute to begin")

            status, body = infer(base, "errors", "MODE", CRASH)
            assert (status, body) == (500, {"error": DEAD})
            assert alive() and ready(base) == 200
        finally:
            (signals / "release").write_text("")
        answers = [future.result(timeout=150) for future in held]
    assert [(status, body["outputs"][0]["data"]) for status, body in answers] == [(200, [1]), (200, [2]), (200, [3])]

    # The instance is started again for the next request (python_backend <= r24.07's behaviour).
    assert ready(base, "/v2/models/errors/ready") == 200
    status, body = infer(base, "errors", "MODE", 7)
    assert (status, body["outputs"][0]["data"]) == (200, [7])
    assert alive()


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    return write_repository(tmp_path / "models")


def test_serve_isolates_a_python_model_that_exits_by_default(repository: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv(MODE, raising=False)  # the default, whatever the caller's environment says
    signals = tmp_path / "signals"
    signals.mkdir()
    with serve(repository, env={"HOLD_SIGNALS": str(signals)}) as server:
        crash_while_others_are_in_flight(server.http, signals, lambda: server.process.poll() is None)
        assert RESTART_LOG in server.output()


def test_in_process_the_same_crash_takes_the_server_down(repository: Path, tmp_path: Path) -> None:
    """Why serve and Cloud Run do not run models in-process: the crash ends the whole server and
    every request in flight."""
    signals = tmp_path / "signals"
    signals.mkdir()
    with serve(repository, env={"HOLD_SIGNALS": str(signals), MODE: "inprocess"}) as server:
        with ThreadPoolExecutor(3) as pool:
            held = [pool.submit(infer, server.http, "hold", "X", value) for value in (1, 2, 3)]
            wait_for(lambda: any(signals.glob("started-*")), "hold's execute to begin")
            with pytest.raises(OSError):  # the connection is cut: no response at all
                infer(server.http, "errors", "MODE", CRASH)
            assert server.process.wait(30) == 7  # os._exit(7) ended `toolkit serve`
            for future in held:
                with pytest.raises(OSError):
                    future.result(timeout=60)


# --- the images -------------------------------------------------------------------------------------------


@pytest.mark.docker
def test_cloudrun_image_isolates_and_lambda_image_keeps_in_process(engine: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    env = engine
    repo = write_repository(tmp_path / "models")

    cloudrun = toolkit_build(env, tmp_path / "cloudrun", "--target", "cloudrun", "--name", "crash-isolation", repository=repo)
    assert cloudrun["python_instance_mode"] == "process"
    assert f"{MODE}=process" in _image_env(env, cloudrun["image"])
    signals = tmp_path / "signals"
    signals.mkdir()
    signals.chmod(0o777)  # the image's user (65532) writes there
    port = free_port()
    container = docker(
        env, "run", "-d", "--name", f"crash-isolation-{port}", "--network", "host", "--read-only", "--tmpfs", "/tmp",
        "-e", f"PORT={port}", "-e", "TOOLKIT_HOST=127.0.0.1", "-e", "HOLD_SIGNALS=/signals",
        "-v", f"{signals}:/signals", cloudrun["image"],
    ).stdout.strip()
    try:
        base = f"http://127.0.0.1:{port}"
        wait_ready(base, container, env)

        def running() -> bool:
            state = docker(env, "inspect", "--format", "{{.State.Running}}", container, check=False).stdout.strip()
            return state == "true"

        crash_while_others_are_in_flight(base, signals, running)
        logs = docker(env, "logs", container)
        assert RESTART_LOG in logs.stdout + logs.stderr
    finally:
        docker(env, "rm", "-f", container, check=False)
        docker(env, "rmi", cloudrun["image"], check=False)

    lambda_ = toolkit_build(env, tmp_path / "lambda", "--target", "lambda", "--name", "crash-isolation", repository=repo)
    assert lambda_["python_instance_mode"] == "auto"
    assert f"{MODE}=auto" in _image_env(env, lambda_["image"])
    # The image's own runtime decides where the instances run: load the repository inside it.
    load = (
        "import os; from handlers.manifest import Manifest; from handlers.model_repository import ModelRepository; "
        "r = ModelRepository(Manifest.load(os.environ['TOOLKIT_MANIFEST'])); r.load(); "
        "print(sorted((n, type(r.get(n).instances[0]).__name__) for n in r.models)); r.stop(drain=False)"
    )
    try:
        found = docker(
            env, "run", "--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp", "-e", "HOLD_SIGNALS=/tmp",
            "--entrypoint", "python3", lambda_["image"], "-c", load,
        ).stdout
        assert found.strip().splitlines()[-1] == "[('errors', 'InProcessInstance'), ('hold', 'InProcessInstance')]"
    finally:
        docker(env, "rmi", lambda_["image"], check=False)


def _image_env(env: dict[str, str], image: str) -> list[str]:
    return json.loads(docker(env, "image", "inspect", "--format", "{{json .Config.Env}}", image).stdout)


def test_serve_default_is_not_forced_over_the_users_choice(repository: Path, tmp_path: Path) -> None:
    """TOOLKIT_PYTHON_INSTANCE_MODE set by the user wins over serve's default (here: auto, which
    runs these single-instance models in-process, so the server's own pid serves them)."""
    signals = tmp_path / "signals"
    signals.mkdir()
    (signals / "release").write_text("")
    with serve(repository, env={"HOLD_SIGNALS": str(signals), MODE: "auto"}) as server:
        assert infer(server.http, "hold", "X", 5)[0] == 200
        (started,) = signals.glob("started-*")
        assert started.name.split("-")[1] == str(server.process.pid)

