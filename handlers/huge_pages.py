"""Transparent huge pages for the memory the loaded models hold (a deliberate improvement over Triton).

A model's weights, prepacked kernels and activation arenas are hundreds of megabytes that every
forward reads again. On 4 KiB pages those reads miss the TLB, and in a virtual machine (what
Lambda, Cloud Run and most Kubernetes nodes run on) each miss walks two page tables, the guest's
and the host's. With 2 MiB pages one TLB entry covers 512 times the memory. Measured on this
project's 2-CPU VM (docs/performance.md, "huge pages for the models' memory"): forwards 1.08-1.23x
faster in-process (ONNX Runtime and TorchScript, large and small models), and `toolkit serve` on
the conceptual guide's full-width text recognition model went from a tie with tritonserver to
1.02-1.18x its throughput (four runs).

The kernel gives huge pages to anonymous memory in one of three modes
(/sys/kernel/mm/transparent_hugepage/enabled): `always` (every region: nothing to do here),
`never` (none: nothing can be done), or `madvise`, the default of Debian, Ubuntu and Firecracker
guests, where only regions marked with madvise(MADV_HUGEPAGE) get them. glibc's own switch
(`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`) marks only the main heap and large mmap'd blocks, not the
heaps of threads, which is where the runtime's loading threads put a model's weights: on the
guide's model it covered 47 of 420 MiB. So, once the models are loaded and warmed up, `start`
marks every private anonymous region of the process that is mostly resident and at least one
huge page long (the C allocator's heaps and blocks), with the reserved but inaccessible rest of
each thread heap (what a heap grows into later stays marked, for the kernel's khugepaged to
collapse in its own time), and asks the kernel to collapse the resident part into huge pages now
(MADV_COLLAPSE, Linux 6.1+; older kernels leave that to khugepaged too). It runs on a background
thread: readiness does not wait for it (~1.5 s of one CPU for 420 MiB here).

Off with TOOLKIT_HUGE_PAGES=0. Regions mostly not resident (thread stacks, reservations that are
not heaps) are left alone, so the process's resident memory stays what it was (measured on the
guide's model: 508.2 MB against 508.0 MB).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("handlers.huge_pages")

ENV = "TOOLKIT_HUGE_PAGES"  # "0": leave the process's pages as the kernel gives them
MODE_FILE = Path("/sys/kernel/mm/transparent_hugepage/enabled")
HUGE_PAGE = 2 * 1024 * 1024  # x86-64 and arm64 (4 KiB base pages): the PMD size THP uses
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25


@dataclass(frozen=True)
class Region:
    """One mapping of /proc/self/smaps: [start, end), its permissions, what it maps ('' for
    anonymous memory, '[heap]' for the main heap) and how much of it is resident."""

    start: int
    end: int
    perms: str
    path: str
    rss: int

    @property
    def anonymous(self) -> bool:
        return self.perms.endswith("p") and self.path in ("", "[heap]")


@dataclass(frozen=True)
class Plan:
    """What `apply` asks of the kernel: mark `advise` (huge pages from now on), collapse `collapse`
    (what is resident there, now)."""

    advise: tuple[tuple[int, int], ...]
    collapse: tuple[tuple[int, int], ...]

    @property
    def collapse_bytes(self) -> int:
        return sum(end - start for start, end in self.collapse)


def mode(path: Path = MODE_FILE) -> str | None:
    """The kernel's THP mode (the bracketed word of `path`): always, madvise or never; None where
    the kernel has no THP (or no such file: not Linux)."""
    try:
        text = path.read_text()
    except OSError:
        return None
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else None


def parse_smaps(text: str) -> list[Region]:
    """The mappings of a /proc/PID/smaps text, with their resident bytes."""
    regions: list[Region] = []
    current: list | None = None
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if fields[0].endswith(":"):  # "Rss:  1234 kB" and the other counters
            if fields[0] == "Rss:" and current is not None and len(fields) >= 2:
                current[4] = int(fields[1]) * 1024
            continue
        if "-" in fields[0] and len(fields) >= 5:  # "start-end perms offset dev inode [path]"
            start, _, end = fields[0].partition("-")
            if current is not None:
                regions.append(Region(*current))
            current = [int(start, 16), int(end, 16), fields[1], " ".join(fields[5:]), 0]
    if current is not None:
        regions.append(Region(*current))
    return regions


def _whole_pages(start: int, end: int) -> tuple[int, int] | None:
    start = -(-start // HUGE_PAGE) * HUGE_PAGE
    end = end // HUGE_PAGE * HUGE_PAGE
    return (start, end) if end > start else None


def plan(regions: list[Region]) -> Plan:
    """The huge-page-aligned parts of every private anonymous read-write region that is at least
    half resident (a heap, a large block), and of the inaccessible region that directly follows
    one of those (the rest of a thread heap: glibc grows the heap into it with mprotect, and what
    it grows into keeps the mark, for khugepaged). Thread stacks and other mostly empty regions
    are left out: collapsing them would make memory resident that nothing uses."""
    advise: list[tuple[int, int]] = []
    collapse: list[tuple[int, int]] = []
    heap_end = None  # where the last marked region without a name (a thread heap's used part) ends
    for region in regions:
        whole = _whole_pages(region.start, region.end)
        marked = False
        if region.anonymous and whole is not None:
            if region.perms.startswith("rw") and 2 * region.rss >= region.end - region.start:
                advise.append(whole)
                collapse.append(whole)
                marked = True
            elif region.perms.startswith("---") and region.start == heap_end:
                advise.append(whole)
        heap_end = region.end if marked and region.path == "" else None
    return Plan(tuple(advise), tuple(collapse))


@dataclass(frozen=True)
class Outcome:
    advised: int  # bytes marked MADV_HUGEPAGE
    collapsed: int  # bytes collapsed into huge pages now
    seconds: float
    note: str = ""  # why nothing was done, or what the kernel refused


def apply(environ=None, mode_file: Path = MODE_FILE, smaps: Path = Path("/proc/self/smaps")) -> Outcome:
    """Mark and collapse this process's model memory (the module's docstring); says what it did."""
    environ = os.environ if environ is None else environ
    started = time.perf_counter()
    if environ.get(ENV, "").strip() == "0":
        return Outcome(0, 0, 0.0, f"{ENV}=0")
    thp = mode(mode_file)
    if thp != "madvise":
        note = "the kernel has no transparent huge pages" if thp is None else (
            "the kernel gives every region huge pages already (transparent_hugepage: always)" if thp == "always"
            else f"the kernel's transparent_hugepage mode is {thp}")
        return Outcome(0, 0, 0.0, note)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        madvise.restype = ctypes.c_int
        chosen = plan(parse_smaps(smaps.read_text()))
    except (OSError, AttributeError, ValueError) as exc:
        return Outcome(0, 0, time.perf_counter() - started, f"not possible here: {exc}")
    advised = collapsed = 0
    refused: set[str] = set()
    for start, end in chosen.advise:
        if madvise(start, end - start, MADV_HUGEPAGE) == 0:
            advised += end - start
        else:
            refused.add(f"MADV_HUGEPAGE: {os.strerror(ctypes.get_errno())}")
    for start, end in chosen.collapse:
        if madvise(start, end - start, MADV_COLLAPSE) == 0:
            collapsed += end - start
        else:  # EINVAL before Linux 6.1; EAGAIN/ENOMEM where no huge page was free: khugepaged's turn
            refused.add(f"MADV_COLLAPSE: {os.strerror(ctypes.get_errno())}")
    return Outcome(advised, collapsed, time.perf_counter() - started, "; ".join(sorted(refused)))


def start(environ=None) -> threading.Thread | None:
    """`apply` on a daemon thread, logged; None where it is turned off."""
    environ = os.environ if environ is None else environ
    if environ.get(ENV, "").strip() == "0":
        log.info("huge pages: left to the kernel (%s=0)", ENV)
        return None

    def run() -> None:
        outcome = apply(environ)
        if outcome.advised:
            log.info(
                "huge pages: %d MiB of model memory marked, %d MiB collapsed in %.2f s%s",
                outcome.advised >> 20, outcome.collapsed >> 20, outcome.seconds,
                f" ({outcome.note})" if outcome.note else "",
            )
        else:
            log.info("huge pages: none (%s)", outcome.note or "no region to mark")

    thread = threading.Thread(target=run, name="huge-pages", daemon=True)
    thread.start()
    return thread
