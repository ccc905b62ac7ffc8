"""SIGTERM under sustained load: in-flight requests complete, new ones are refused cleanly, the
process exits 0 within the grace period, and no request is dropped.

"Dropped" is measured, not guessed: the model appends the id of every request it answered to a
log, so a request the server executed but whose answer never reached the client would show up
(executed minus answered). A request that got no answer and was never executed was refused
(connection refused, or an idle keep-alive connection closed before the server read it): a
client may retry it. tests/test_lifecycle.py covers a drain of 6 queued requests under
`toolkit serve`; this runs the image entry point under continuous load. CI: 48 clients for about
2 s; `bench/reliability.py drain` repeats it longer (docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import signal
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from test_reliability_harness import (
    build_mixed_repository,
    compile_manifest,
    python_model,
    runtime,
    wait_until,
)

LOGGING_MODEL = '''
import json
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Y = 2 * X after ~50 ms per batch; appends the request ids it answered to a log."""

    def initialize(self, args):
        self.log = json.loads(args["model_config"])["parameters"]["LOG"]["string_value"]

    def execute(self, requests):
        time.sleep(0.05)
        responses = [
            pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2)])
            for r in requests
        ]
        with open(self.log, "a") as log:
            log.write("".join(r.request_id() + "\\n" for r in requests))
        return responses
'''
LOGGING_CONFIG = """
    backend: "python"
    max_batch_size: 8
    input [ {{ name: "X" data_type: TYPE_INT64 dims: [ 4 ] }} ]
    output [ {{ name: "Y" data_type: TYPE_INT64 dims: [ 4 ] }} ]
    dynamic_batching {{ }}
    parameters [ {{ key: "LOG" value: {{ string_value: "{log}" }} }} ]
"""


@dataclass
class DrainResult:
    grace_seconds: float
    exit_code: int
    exit_seconds: float  # SIGTERM -> process exit
    answered: set = field(default_factory=set)  # 200 with the right values and id
    executed: set = field(default_factory=set)  # answered by the model (its log)
    in_flight_at_term: set = field(default_factory=set)
    answered_after_term: int = 0
    wrong: list = field(default_factory=list)  # 200 with wrong values or id
    statuses: Counter = field(default_factory=Counter)  # non-200 answers
    no_answer: Counter = field(default_factory=Counter)  # exception type -> count
    no_answer_ids: set = field(default_factory=set)
    refused_new_connection: bool = False

    @property
    def dropped(self) -> set:
        return self.executed - self.answered

    def summary(self) -> dict:
        return {
            "grace_s": self.grace_seconds, "exit_code": self.exit_code, "exit_s": round(self.exit_seconds, 2),
            "answered": len(self.answered), "in_flight_at_sigterm": len(self.in_flight_at_term),
            "answered_after_sigterm": self.answered_after_term, "dropped": len(self.dropped),
            "wrong": len(self.wrong), "error_statuses": dict(self.statuses),
            "refused": sum(self.no_answer.values()), "refused_kinds": dict(self.no_answer),
        }


def drain_under_load(workdir: Path, *, clients: int = 48, load_seconds: float = 2.0, grace: float = 5.0) -> DrainResult:
    import tritonclient.http.aio as aioclient
    from tritonclient.utils import InferenceServerException

    repo = build_mixed_repository(workdir / "models")
    log = workdir / "executed.log"
    log.unlink(missing_ok=True)
    python_model(repo, "logged", LOGGING_MODEL, LOGGING_CONFIG.format(log=log))
    manifest = compile_manifest(repo)
    with runtime(manifest, env={"TOOLKIT_GRACEFUL_SECONDS": str(grace)}) as server:
        result = DrainResult(grace, -1, 0.0)
        in_flight: set[str] = set()
        stop = threading.Event()
        terminated = threading.Event()
        counter = iter(range(10**9))

        async def client_loop() -> None:
            client = aioclient.InferenceServerClient(server.url, conn_limit=1, conn_timeout=60)
            try:
                while not stop.is_set():
                    tag = next(counter)
                    request_id = f"d{tag}"
                    x = np.arange(4, dtype=np.int64).reshape(1, 4) + tag * 10
                    tensor = aioclient.InferInput("X", [1, 4], "INT64")
                    tensor.set_data_from_numpy(x, binary_data=True)
                    in_flight.add(request_id)
                    try:
                        answer = await client.infer("logged", [tensor], request_id=request_id, timeout=60_000_000)
                    except InferenceServerException as exc:
                        if exc.status() is None:
                            result.no_answer[f"{type(exc).__name__}: {exc.message()[:60]}"] += 1
                            result.no_answer_ids.add(request_id)
                            if terminated.is_set():
                                return
                        else:
                            result.statuses[str(exc.status())] += 1
                        continue
                    except Exception as exc:  # noqa: BLE001 - aiohttp's connection errors, classified below
                        result.no_answer[type(exc).__name__] += 1
                        result.no_answer_ids.add(request_id)
                        if terminated.is_set():
                            return
                        await asyncio.sleep(0.01)
                        continue
                    finally:
                        in_flight.discard(request_id)
                    y = answer.as_numpy("Y")
                    if answer.get_response().get("id") == request_id and y is not None and np.array_equal(y, 2 * x):
                        result.answered.add(request_id)
                        if terminated.is_set():
                            result.answered_after_term += 1
                    else:
                        result.wrong.append(request_id)
            finally:
                await client.close()

        async def load() -> None:
            await asyncio.gather(*(client_loop() for _ in range(clients)))

        loader = threading.Thread(target=lambda: asyncio.run(load()), name="drain-load")
        loader.start()
        wait_until(lambda: len(result.answered) >= 50, 60, "the load never got going")
        time.sleep(load_seconds)  # sustained load: the duration is the point
        result.in_flight_at_term = set(in_flight)
        started = time.monotonic()
        terminated.set()
        server.process.send_signal(signal.SIGTERM)
        while server.process.poll() is None:  # a new connection, while the server drains
            try:
                socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
            except OSError:
                result.refused_new_connection = server.process.poll() is None
                break
            time.sleep(0.002)
        result.exit_code = server.process.wait(grace + 30)
        result.exit_seconds = time.monotonic() - started
        stop.set()
        loader.join(60)
    result.executed = set(log.read_text().split()) if log.exists() else set()
    return result


def check(result: DrainResult) -> None:
    summary = result.summary()
    assert result.exit_code == 0, summary
    assert result.exit_seconds < result.grace_seconds + 2, summary
    assert not result.dropped, (sorted(result.dropped)[:10], summary)
    assert not result.wrong and not result.statuses, summary
    assert result.in_flight_at_term and result.answered_after_term > 0, summary
    # every in-flight request was answered, or refused before the server took it
    unanswered = result.in_flight_at_term - result.answered
    assert not unanswered & result.executed and unanswered <= result.no_answer_ids, summary
    assert result.refused_new_connection, summary


def test_sigterm_under_sustained_load_drops_nothing(tmp_path: Path) -> None:
    check(drain_under_load(tmp_path, clients=48, load_seconds=2.0, grace=5.0))


def test_stopped_ensemble_answers_503_not_500(tmp_path: Path) -> None:
    """An ensemble that stopped accepting (shutdown) answers like the batchers: UNAVAILABLE with
    Triton's stopping message (it was an INTERNAL error, HTTP 500)."""
    from handlers.errors import ErrorCode, InferenceError
    from handlers.inference import InferRequest
    from handlers.manifest import Manifest
    from handlers.model_repository import ModelRepository

    manifest = Manifest.load(compile_manifest(build_mixed_repository(tmp_path / "models")))
    repository = ModelRepository(manifest)
    repository.load()
    try:
        repository.stop(drain=True, timeout=30)
        a = np.ones((1, 16), np.float32)
        request = InferRequest("pipeline", 1, {"A": a, "B": a}, id="late")
        try:
            asyncio.run(repository.get("pipeline").scheduler.infer(request))
        except InferenceError as error:
            assert error.code is ErrorCode.UNAVAILABLE and error.http_status == 503
            assert error.message == (
                "[request id: late] Server is stopping, scheduler for model has stopped accepting new inference requests"
            )
        else:
            raise AssertionError("a stopped ensemble accepted a request")
    finally:
        repository.stop(drain=False, timeout=5)
