"""Where `toolkit serve` spends its time under load: py-spy samples the server process while
perf_analyzer drives it, and the samples are summarised per thread and per stage of a request.

py-spy (a sampling profiler that attaches to a running process; from the `bench` extra) writes
folded stacks; `summarise` groups the event-loop thread's samples into the stages of the hot
path (HTTP server, the runtime's request handling, decode, validation, batcher hand-off, response
encoding, sending) and lists the functions of this repository with the largest inclusive share.
"""

from __future__ import annotations

import collections
import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

# Stages of a request on the event-loop thread, by the first frame that names them (innermost
# wins: frames are matched from the leaf up).
_STAGES = [
    ("decode request", ("decode_request",)),
    ("validate request", ("validate_request",)),
    ("batcher hand-off (submit, await)", ("DynamicBatcher.infer", "DynamicBatcher.submit", "LoadedModel.infer")),
    ("encode response", ("encode_response",)),
    ("send response (uvicorn, socket write)", ("_send_reply", "RequestResponseCycle.send", "Response.__call__")),
    ("read body", ("read_limited", "_body_chunks")),
    ("other request handling (routes, app)", ("run_infer", "RuntimeApp", "infer ")),
    ("FastAPI / Starlette", ("routing.py", "starlette", "fastapi")),
    ("HTTP parsing (uvicorn httptools)", ("httptools_impl", "h11_impl")),
]


_OURS = re.compile(r"[( /]handlers/")


def py_spy() -> str | None:
    candidate = Path(sys.executable).with_name("py-spy")
    return str(candidate) if candidate.exists() else shutil.which("py-spy")


@dataclass
class Profile:
    samples: int = 0
    threads: dict[str, int] = field(default_factory=dict)
    stages: dict[str, int] = field(default_factory=dict)  # event-loop thread only
    loop_samples: int = 0
    functions: list[tuple[str, float]] = field(default_factory=list)  # (function, inclusive % of loop thread)
    worker: list[tuple[str, float]] = field(default_factory=list)  # same for the batcher threads


def record(pid: int, seconds: float, output: Path, rate: int = 250) -> Path:
    tool = py_spy()
    if tool is None:
        raise RuntimeError("py-spy is not installed (pip install 'triton-serverless-toolkit[bench]')")
    subprocess.run([tool, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", str(rate), "-f", "raw", "-o",
                    str(output), "--threads", "--nonblocking"], check=True, capture_output=True, timeout=seconds + 120)
    return output


def record_under_load(pid: int, seconds: float, output: Path, load) -> Path:
    """Record while `load()` (a perf_analyzer run) drives the server; py-spy starts once the load
    has had a few seconds to settle."""
    done = threading.Event()
    errors: list[BaseException] = []

    def drive() -> None:
        try:
            load()
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=drive)
    thread.start()
    done.wait(3.0)
    try:
        record(pid, seconds, output)
    finally:
        thread.join()
    if errors:
        raise errors[0]
    return output


def _short(frame: str) -> str:
    # py-spy raw frames: "function (path/to/file.py:line)"
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    parts = Path(path).parts
    if "handlers" in parts:
        path = "/".join(parts[parts.index("handlers"):])
    else:
        path = Path(path).name
    return f"{name} ({path})"


def summarise(folded: Path, top: int = 15) -> Profile:
    profile = Profile()
    loop_functions: collections.Counter[str] = collections.Counter()
    worker_functions: collections.Counter[str] = collections.Counter()
    worker_samples = 0
    for line in folded.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = stack.split(";")
        thread = frames[0]
        name = "event loop (MainThread)" if "MainThread" in thread else (
            "batcher workers" if "batcher-" in thread else "other threads")
        profile.samples += count
        profile.threads[name] = profile.threads.get(name, 0) + count
        ours = {_short(f) for f in frames[1:] if _OURS.search(f)}
        if name == "event loop (MainThread)":
            profile.loop_samples += count
            for function in ours:
                loop_functions[function] += count
            stage = "event loop internals (uvloop, asyncio)"
            for frame in reversed(frames[1:]):
                hit = next((s for s, keys in _STAGES if any(k in frame for k in keys)), None)
                if hit is not None:
                    stage = hit
                    break
            profile.stages[stage] = profile.stages.get(stage, 0) + count
        elif name == "batcher workers":
            worker_samples += count
            for function in ours | {_short(f) for f in frames[1:] if f.startswith("Session.run ")}:
                worker_functions[function] += count
    if profile.loop_samples:
        profile.functions = [(f, 100 * c / profile.loop_samples) for f, c in loop_functions.most_common(top)]
    if worker_samples:
        profile.worker = [(f, 100 * c / worker_samples) for f, c in worker_functions.most_common(top)]
    return profile


def markdown(profile: Profile, seconds: float, rate: int = 250) -> str:
    lines = []
    possible = seconds * rate
    lines.append("| thread | samples | busy (share of the wall time) |")
    lines.append("|---|---|---|")
    for name, count in sorted(profile.threads.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {name} | {count} | {100 * count / possible:.0f} % |")
    lines.append("")
    lines.append("Event-loop thread by stage (innermost stage frame wins):")
    lines.append("")
    lines.append("| stage | share of the event loop's samples |")
    lines.append("|---|---|")
    for stage, count in sorted(profile.stages.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {stage} | {100 * count / max(1, profile.loop_samples):.1f} % |")
    lines.append("")
    lines.append("Functions of handlers/ on the event-loop thread (inclusive):")
    lines.append("")
    lines.append("| function | inclusive share |")
    lines.append("|---|---|")
    for function, share in profile.functions:
        lines.append(f"| `{function}` | {share:.1f} % |")
    if profile.worker:
        lines.append("")
        lines.append("Batcher worker threads (inclusive; waiting for work is included, ORT's `run` is the model):")
        lines.append("")
        lines.append("| function | inclusive share |")
        lines.append("|---|---|")
        for function, share in profile.worker:
            lines.append(f"| `{function}` | {share:.1f} % |")
    return "\n".join(lines)
