"""bench/servers.py's --frontends values: the per-backend benches (pytorch, fil, openvino) name
each arm's front end, optionally with environment for its server (`NAME+VAR=VALUE`), so that arms
differing only in a setting are measured interleaved in one run; how bench/serving_threads.py
tells a server's threads apart, and finds the server's process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import servers  # noqa: E402


def test_a_front_end_with_settings_is_its_own_arm_with_that_environment() -> None:
    plain, tuned = servers.frontends("http-uvicorn,http-uvicorn+TOOLKIT_INSTANCE_NICE=0+TOOLKIT_WORKERS=2")
    assert plain == servers.FRONTENDS["http-uvicorn"]
    assert plain.env() == {"TOOLKIT_HTTP_FRONTEND": "uvicorn"}
    assert tuned.name == "http-uvicorn+TOOLKIT_INSTANCE_NICE=0+TOOLKIT_WORKERS=2"
    assert tuned.protocol == "http"
    assert tuned.env() == {"TOOLKIT_HTTP_FRONTEND": "uvicorn", "TOOLKIT_INSTANCE_NICE": "0", "TOOLKIT_WORKERS": "2"}
    assert tuned.as_dict()["env"]["TOOLKIT_WORKERS"] == "2"
    # a setting may also override the front end's own variable; an empty value is a value
    (empty,) = servers.frontends("http-uvicorn+TOOLKIT_HTTP_FRONTEND=")
    assert empty.env() == {"TOOLKIT_HTTP_FRONTEND": ""}


@pytest.mark.parametrize(("spec", "message"), [
    ("http-hyper", "unknown 'http-hyper'"),
    ("http-uvicorn+TOOLKIT_WORKERS", "'TOOLKIT_WORKERS' is not VARIABLE=VALUE"),
    ("http-uvicorn+=2", "'=2' is not VARIABLE=VALUE"),
])
def test_a_wrong_front_end_or_setting_is_refused_by_name(spec: str, message: str) -> None:
    with pytest.raises(SystemExit, match=message):
        servers.frontends(spec)


def test_serving_threads_tells_the_threads_apart_and_batches_only_the_serving_ones(tmp_path: Path) -> None:
    """bench/serving_threads.py reads a real process's threads from /proc: the main thread is the
    event loop, a thread at raised niceness an instance (the batcher runs them at niceness 10),
    any other a front end's; SCHED_BATCH goes to the threads at the process's priority only."""
    import os
    import subprocess
    import time

    import serving_threads

    ready = tmp_path / "ready"
    child = subprocess.Popen([sys.executable, "-c", f"""
import os, threading, time
def niced():
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    time.sleep(60)
threading.Thread(target=niced, daemon=True).start()
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
time.sleep(0.5)
open({str(ready)!r}, "w").close()
time.sleep(60)
"""])
    try:
        for _ in range(100):
            if ready.exists():
                break
            time.sleep(0.1)  # the child writes the file once its threads run: nothing to wait on
        counters = serving_threads.thread_counters(child.pid)
        roles = sorted(serving_threads.role(child.pid, tid, nice) for tid, (_, nice, _, _) in counters.items())
        assert roles == ["event loop", "front end", "instance"]
        serving_threads.sched_batch(child.pid)
        policies = {serving_threads.role(child.pid, tid, nice): os.sched_getscheduler(tid)
                    for tid, (_, nice, _, _) in counters.items()}
        assert policies == {"event loop": os.SCHED_BATCH, "front end": os.SCHED_BATCH, "instance": os.SCHED_OTHER}
    finally:
        child.kill()
        child.wait()


def test_serving_threads_arms_name_a_tree_and_its_environment(tmp_path: Path) -> None:
    """bench/serving_threads.py --arm NAME=TREE[,VAR=VALUE...]: a checkout to serve from (one
    with handlers/) and the environment its server gets; anything else is refused by name."""
    import serving_threads

    assert serving_threads.parse_arm(f"after={ROOT}") == ("after", ROOT, {})
    assert serving_threads.parse_arm(f"4k={ROOT},TOOLKIT_HUGE_PAGES=0,A=b=c") == (
        "4k", ROOT, {"TOOLKIT_HUGE_PAGES": "0", "A": "b=c"})
    for spec, message in [(str(ROOT), "expected NAME=TREE"), (f"x={ROOT},NOVALUE", "expected NAME=TREE"),
                          ("x=", "expected NAME=TREE"), (f"x={tmp_path}", "has no handlers/")]:
        with pytest.raises(SystemExit, match=message):
            serving_threads.parse_arm(spec)


def test_serving_threads_results_name_a_tree_by_its_commit_not_its_path(tmp_path: Path) -> None:
    """The results file says which checkout served and at which commit, never where it lay."""
    import subprocess

    import serving_threads

    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    described = serving_threads.describe_tree(ROOT)
    assert described.startswith(f"this checkout at {head}") and str(ROOT) not in described
    (tmp_path / "before" / "handlers").mkdir(parents=True)
    assert serving_threads.describe_tree(tmp_path / "before") == "checkout 'before'"  # (not a git checkout)


def test_toolkit_serve_names_the_process_that_serves(tmp_path: Path) -> None:
    """bench/servers.toolkit_serve hands out the server's process id (serving_threads.py reads its
    threads): the process that runs `toolkit serve`, pinned where asked (taskset execs it, so the id
    is the server's own), and gone once the block ends."""
    import os

    pids: list[int] = []
    cpu = min(os.sched_getaffinity(0))
    with servers.toolkit_serve(ROOT / "samples" / "quickstart", tmp_path / "serve.log", cpus=str(cpu), pids=pids):
        (pid,) = pids
        command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        assert command[1:4] == [b"-m", b"toolkit.cli", b"serve"]
        assert os.sched_getaffinity(pid) == {cpu}
    assert not Path(f"/proc/{pid}").exists()  # stopped and reaped


def test_every_arm_takes_every_place_in_turn() -> None:
    """bench/servers.rotated: repeat r serves the arms starting from the r-th, so over as many
    repeats as arms each arm is served first, second, ... once."""
    arms = [servers.Arm("pinned", "0", "1", servers.FRONTENDS[name]) for name in ("http-uvicorn", "http-native", "grpc-native")]
    orders = [[arm.frontend.name for arm in servers.rotated(arms, repeat)] for repeat in range(4)]
    assert orders == [["http-uvicorn", "http-native", "grpc-native"], ["http-native", "grpc-native", "http-uvicorn"],
                      ["grpc-native", "http-uvicorn", "http-native"], ["http-uvicorn", "http-native", "grpc-native"]]
    assert servers.rotated([], 3) == []


def test_a_ceiling_counts_each_thread_up_to_its_last_completed_call() -> None:
    """bench/servers.threads_rate (every in-process ceiling: ONNX Runtime, pytorch, fil, OpenVINO):
    calls of 0.25 s in a 0.6 s window finish twice per thread, at 0.5 s; the rate is 2 / 0.5 s per
    thread, 4 calls/s, not 2 / 0.6 s (the call cut off by the window's end neither counted nor
    timed); a window shorter than one call waits for each thread's first."""
    import time

    def call() -> None:
        time.sleep(0.25)

    assert servers.threads_rate([call, call], 0.6) == pytest.approx(8.0, rel=0.08)
    assert servers.threads_rate([call], 0.05) == pytest.approx(4.0, rel=0.08)


def test_the_serving_budget_is_what_a_request_may_cost_beside_the_model() -> None:
    """bench/servers.serving_budget_us: at a ceiling of 27,679 rows/s on one CPU a 16-row request
    is 578 us of model, and 90 % of the ceiling leaves it 578 / 9 = 64 us of everything else; on
    two CPUs twice that; a server that spends exactly the budget lands on the target."""
    budget = servers.serving_budget_us(27_679.0, 16, "1")
    assert budget == pytest.approx(16 / 27_679.0 * 1e6 / 9)
    assert round(budget) == 64
    assert servers.serving_budget_us(27_679.0, 16, "1,2") == pytest.approx(2 * budget)
    model_us = 16 / 27_679.0 * 1e6
    served_rate = 16 / ((model_us + budget) / 1e6)  # rows/s of a server spending `budget` a request
    assert served_rate / 27_679.0 == pytest.approx(0.9)
    assert servers.serving_budget_us(1_000.0, 2, "1", target=0.5) == pytest.approx(2_000.0)
    assert servers.serving_budget_us(27_679.0, 16, "0-2,5") == pytest.approx(4 * budget)
    assert servers.cpu_set("1-3,6") == {1, 2, 3, 6}
