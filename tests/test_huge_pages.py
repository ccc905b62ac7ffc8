"""Transparent huge pages for the loaded models' memory (handlers/huge_pages.py): which regions are
marked, where nothing is done, and, on this kernel, a real thread heap and a real `toolkit serve`
whose model memory ends up on huge pages."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import urllib.request
import time
from pathlib import Path

import pytest

from handlers import huge_pages
from handlers.huge_pages import HUGE_PAGE, Region, parse_smaps, plan
from model_builders import matmul_relu
from serving import serve

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
THP = huge_pages.mode()


def _smaps(*regions: tuple[int, int, str, str, int]) -> str:
    lines = []
    for start, end, perms, path, rss_kb in regions:
        lines.append(f"{start:x}-{end:x} {perms} 00000000 00:00 0 {path}".rstrip())
        lines += [f"Size:           {(end - start) >> 10} kB", f"Rss:            {rss_kb} kB", "Pss:  0 kB",
                  "AnonHugePages:        0 kB", "VmFlags: rd wr mr mw me ac"]
    return "\n".join(lines) + "\n"


def test_smaps_are_read_with_their_resident_bytes_and_names():
    text = _smaps((0x1000, 0x3000, "r-xp", "/usr/lib/libc.so.6", 8), (0x7F00_0000_0000, 0x7F00_0400_0000, "rw-p", "", 65536),
                  (0x5000_0000, 0x5100_0000, "rw-p", "[heap]", 100))
    assert parse_smaps(text) == [
        Region(0x1000, 0x3000, "r-xp", "/usr/lib/libc.so.6", 8 << 10),
        Region(0x7F00_0000_0000, 0x7F00_0400_0000, "rw-p", "", 64 * MiB),
        Region(0x5000_0000, 0x5100_0000, "rw-p", "[heap]", 100 << 10),
    ]


def test_heaps_and_large_blocks_are_marked_and_collapsed_stacks_and_files_are_not():
    base = 0x7F00_0000_0000
    text = _smaps(
        (base, base + 20 * MiB + 4096, "rw-p", "", 20 * 1024),  # a thread heap's used part (mostly resident)
        (base + 20 * MiB + 4096, base + 64 * MiB, "---p", "", 0),  # ... and its reserved rest
        (base + 64 * MiB, base + 72 * MiB, "rw-p", "", 64),  # a thread stack: 8 MiB, 64 KiB of it used
        (base + 72 * MiB, base + 74 * MiB, "---p", "", 0),  # reserved after the stack: not a heap's rest
        (base + 100 * MiB + 4096, base + 104 * MiB + 8192, "rw-p", "", 4 * 1024),  # a large block: 2 whole MiB
        (base + 110 * MiB, base + 111 * MiB, "rw-p", "", 1024),  # under one huge page
        (base + 120 * MiB, base + 140 * MiB, "rw-p", "/usr/lib/model.bin", 20 * 1024),  # a file's pages
        (base + 140 * MiB, base + 150 * MiB, "rw-s", "", 10 * 1024),  # shared memory
        (base + 160 * MiB, base + 170 * MiB, "rw-p", "[anon:named]", 10 * 1024),  # another's named region
        (0x5600_0000_1000, 0x5600_0420_0000, "rw-p", "[heap]", 60 * 1024),  # the main heap
    )
    chosen = plan(parse_smaps(text))
    assert chosen.collapse == (
        (base, base + 20 * MiB),  # whole huge pages inside the region only
        (base + 102 * MiB, base + 102 * MiB + HUGE_PAGE),
        (0x5600_0020_0000, 0x5600_0420_0000),
    )
    assert chosen.advise == (
        (base, base + 20 * MiB),
        (base + 22 * MiB, base + 64 * MiB),  # the heap's rest: what it grows into stays marked
        (base + 102 * MiB, base + 102 * MiB + HUGE_PAGE),
        (0x5600_0020_0000, 0x5600_0420_0000),
    )
    assert chosen.collapse_bytes == (20 + 2 + 64) * MiB


@pytest.mark.parametrize("content, expected", [
    ("always [madvise] never\n", "madvise"), ("[always] madvise never\n", "always"), ("always madvise [never]\n", "never"),
])
def test_the_kernels_mode_is_the_bracketed_word(tmp_path, content, expected):
    (tmp_path / "enabled").write_text(content)
    assert huge_pages.mode(tmp_path / "enabled") == expected
    assert huge_pages.mode(tmp_path / "missing") is None


@pytest.mark.parametrize("environ, content, note", [
    ({"TOOLKIT_HUGE_PAGES": "0"}, "always [madvise] never\n", "TOOLKIT_HUGE_PAGES=0"),
    ({}, "[always] madvise never\n", "the kernel gives every region huge pages already (transparent_hugepage: always)"),
    ({}, "always madvise [never]\n", "the kernel's transparent_hugepage mode is never"),
    ({}, None, "the kernel has no transparent huge pages"),
])
def test_nothing_is_asked_of_the_kernel_where_it_decides_or_the_user_said_no(tmp_path, environ, content, note):
    mode_file = tmp_path / "enabled"
    if content is not None:
        mode_file.write_text(content)
    outcome = huge_pages.apply(environ, mode_file=mode_file, smaps=tmp_path / "no-smaps")
    assert (outcome.advised, outcome.collapsed, outcome.note) == (0, 0, note)
    assert huge_pages.start({"TOOLKIT_HUGE_PAGES": "0"}) is None


# A process whose thread fills its heap with 30 MiB of 100 KB blocks (below malloc's mmap threshold:
# they come from that thread's heap, where glibc's own huge page switch does not reach), then marks
# its memory, then lets the thread's heap grow by another 20 MiB (50 MiB in all: one thread heap
# holds 64 MiB). After each step it prints its AnonHugePages and the resident memory of its
# regions marked for huge pages (VmFlags "hg": what khugepaged collapses in its own time).
_THREAD_HEAP = textwrap.dedent("""
    import json, os, sys, threading
    sys.path.insert(0, sys.argv[1])
    from handlers import huge_pages
    def anon_huge():
        for line in open("/proc/self/smaps_rollup"):
            if line.startswith("AnonHugePages:"):
                return int(line.split()[1]) << 10
    def marked():
        total, rss = 0, 0
        for line in open("/proc/self/smaps"):
            if line.startswith("Rss:"):
                rss = int(line.split()[1]) << 10
            elif line.startswith("VmFlags:") and " hg" in line:
                total += rss
        return total
    blocks, report = [], {}
    def fill():
        blocks.extend(os.urandom(100_000) for _ in range(300))
    def grow():
        blocks.extend(bytes(99_999) + b"x" for _ in range(200))
    worker = threading.Thread(target=fill); worker.start(); worker.join()
    report["before"] = anon_huge()
    report["advised_before"] = marked()
    outcome = huge_pages.apply()
    report["outcome"] = [outcome.advised, outcome.collapsed, outcome.note]
    report["marked"] = anon_huge()
    report["advised_now"] = marked()
    worker = threading.Thread(target=grow); worker.start(); worker.join()
    report["grown"] = anon_huge()
    report["advised_marked"], report["advised_grown"] = report.pop("advised_now"), marked()
    print(json.dumps(report))
""")


def test_a_threads_heap_is_collapsed_and_grows_in_huge_pages_on_this_kernel():
    result = subprocess.run([sys.executable, "-c", _THREAD_HEAP, str(ROOT)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    advised, collapsed, note = report["outcome"]
    if THP != "madvise":  # a kernel that decides alone: the outcome says why nothing was done
        assert (advised, collapsed) == (0, 0) and note, report
        return
    assert advised >= 30 * MiB and report["before"] < 8 * MiB, report
    if collapsed:  # Linux 6.1+ collapses now
        assert report["marked"] - report["before"] >= 24 * MiB, report
    else:
        assert "MADV_COLLAPSE" in note, report
    assert report["advised_before"] < 8 * MiB and report["advised_marked"] >= 28 * MiB, report
    # the heap grew into its marked reserve: those pages are marked too (khugepaged's to collapse)
    assert report["advised_grown"] - report["advised_marked"] >= 16 * MiB, report


def _anon_huge(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1]) << 10
    return 0


def _config(name: str) -> str:
    return textwrap.dedent(f"""
        name: "{name}"
        backend: "onnxruntime"
        max_batch_size: 8
        input [ {{ name: "INPUT0", data_type: TYPE_FP32, dims: [ 2048 ] }} ]
        output [ {{ name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 2048 ] }} ]
        instance_group [ {{ kind: KIND_CPU, count: 2 }} ]
    """)


@pytest.mark.parametrize("environ", [{}, {"TOOLKIT_HUGE_PAGES": "0"}])
def test_toolkit_serve_puts_its_models_weights_on_huge_pages(tmp_path, environ):
    """An ONNX model with 16 MiB of weights, loaded on the runtime's loading threads; the server
    logs what it marked and its weights are on huge pages, unless TOOLKIT_HUGE_PAGES=0."""
    model = tmp_path / "repo" / "mm"
    (model / "1").mkdir(parents=True)
    matmul_relu(model / "1" / "model.onnx", size=2048)
    (model / "config.pbtxt").write_text(_config("mm"))
    with serve(tmp_path / "repo", "--log-level", "info", env=environ) as server:
        deadline = time.monotonic() + 60
        while "huge pages:" not in server.output() and time.monotonic() < deadline:
            time.sleep(0.1)  # the marking runs on its own thread after readiness
        line = re.search(r"huge pages: .*", server.output())
        assert line, server.output()[-3000:]
        huge = _anon_huge(server.process.pid)
    if environ:
        assert line.group(0) == "huge pages: left to the kernel (TOOLKIT_HUGE_PAGES=0)"
        if THP == "madvise":
            assert huge < 16 * MiB, line.group(0)
    elif THP == "madvise":
        marked = re.match(r"huge pages: (\d+) MiB of model memory marked, (\d+) MiB collapsed", line.group(0))
        assert marked and int(marked.group(1)) >= 16, line.group(0)
        assert huge >= 16 * MiB, (huge, line.group(0))
    else:
        assert line.group(0).startswith("huge pages: none ("), line.group(0)


_PYTHON_MODEL = textwrap.dedent('''
    import numpy as np
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            # what a framework's weights would be: C allocations (not numpy's: numpy marks its own
            # large arrays MADV_HUGEPAGE already)
            self.weights = bytearray(b"\\x01") * (40 << 20)

        def execute(self, requests):
            huge = 0
            for line in open("/proc/self/smaps_rollup"):
                if line.startswith("AnonHugePages:"):
                    huge = int(line.split()[1]) << 10
            out = pb_utils.Tensor("HUGE", np.array([huge], dtype=np.int64))
            return [pb_utils.InferenceResponse([out]) for _ in requests]
''')


def _python_model_huge(server) -> int:
    body = json.dumps({"inputs": [{"name": "X", "datatype": "INT64", "shape": [1], "data": [0]}]}).encode()
    request = urllib.request.Request(f"{server.http}/v2/models/big/infer", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["outputs"][0]["data"][0]


@pytest.mark.parametrize("environ", [{}, {"TOOLKIT_HUGE_PAGES": "0"}])
def test_a_python_models_process_puts_what_it_loaded_on_huge_pages(tmp_path, environ):
    """The model process of a Python model (the stub) marks its memory after `initialize`: the
    model itself reads its AnonHugePages (40 MiB of weights), unless TOOLKIT_HUGE_PAGES=0."""
    model = tmp_path / "repo" / "big"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(_PYTHON_MODEL)
    (model / "config.pbtxt").write_text(textwrap.dedent('''
        name: "big"
        backend: "python"
        input [ { name: "X", data_type: TYPE_INT64, dims: [ 1 ] } ]
        output [ { name: "HUGE", data_type: TYPE_INT64, dims: [ 1 ] } ]
    '''))
    with serve(tmp_path / "repo", env=environ) as server:
        deadline = time.monotonic() + 30
        huge = _python_model_huge(server)
        while huge < 32 * MiB and not environ and THP == "madvise" and time.monotonic() < deadline:
            time.sleep(0.2)  # the marking runs on its own thread after `initialize`
            huge = _python_model_huge(server)
    if THP == "madvise":
        assert (huge >= 32 * MiB) == (not environ), huge
    elif THP == "always":  # the kernel's own doing, with or without the runtime
        assert huge >= 32 * MiB, huge
    else:
        assert huge == 0, huge
