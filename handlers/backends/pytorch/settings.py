"""torch's process-wide settings that a model's parameters ask for.

In tritonserver, INTRA_OP_THREAD_COUNT and INTER_OP_THREAD_COUNT call at::set_num_threads and
at::set_num_interop_threads: one thread pool per process, shared by every model and instance.
The same holds here (torch.set_num_threads / torch.set_num_interop_threads), with the rule of
pytorch_backend since 25.11: the first model that sets a count decides it for the process; a
later model asking for another count is told so in the log and keeps the first one. (tritonserver
2.51 let the last model's intra-op count win and failed a second inter-op setting.) torch accepts
the inter-op count only before its inter-op pool starts; the load sets it before any model runs.

Where no model sets INTRA_OP_THREAD_COUNT, the CPU budget (handlers/cpu_budget.py) sizes the
pool: to the smallest share it gives the process's torch instances, so that forwards running
at the same time use no more threads than there are CPUs (tritonserver leaves torch's default,
all cores, to every instance). An explicit count always wins over the budget.

ENABLE_JIT_PROFILING, ENABLE_JIT_EXECUTOR and ENABLE_TENSOR_FUSER are process-wide too: as in
tritonserver, a model that sets them sets them before each of its executions, so models that
disagree overwrite each other's setting. DISABLE_CUDNN likewise (torch.backends.cudnn.enabled).
Graph-executor optimisation (DISABLE_OPTIMIZED_EXECUTION) and inference mode are per thread
and set around each execution.

The C allocator (`keep_freed_memory`): a CPU forward allocates and frees activations of
megabytes. glibc's malloc gives the top of a thread's heap back to the kernel (madvise) once more
than its trim threshold (twice the largest freed block, a few MB) is free, so every forward
faults its buffers back in, page by page, zeroed by the kernel: measured on the bench's CNN
(bench/pytorch_ceiling.py, batch 8), 90,000-170,000 page faults a second in the server and a
quarter of each instance thread's time in the kernel; in-process, two threads ran 1,600-2,100
infer/s with glibc's defaults and 2,450-2,490 without the trimming. So the first CPU instance
raises glibc's mmap threshold to its maximum (32 MiB: blocks below it come from the heaps) and
the trim threshold to 1 GiB (the heaps keep what they freed for the next forward), process-wide,
as `MALLOC_MMAP_THRESHOLD_` / `MALLOC_TRIM_THRESHOLD_` would at startup. The process keeps its
peak heap instead of returning it between batches (what jemalloc and tcmalloc, which PyTorch
recommends for CPU serving, do too). Not done where the environment already chose: those
variables, `GLIBC_TUNABLES`, or an `LD_PRELOAD`ed allocator; nor off glibc.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("handlers.pytorch")

_lock = threading.Lock()
_chosen: dict[str, tuple[int, str]] = {}  # "intra" / "inter" -> (count, model that set it)
_budget: dict[str, tuple[int, str]] = {}  # "intra" -> (the smallest budget share so far, its model)


def apply_thread_counts(torch, model: str, intra: int | None, inter: int | None) -> None:
    """Set the process's intra-/inter-op thread counts from a model's parameters (first wins)."""
    with _lock:
        for key, wanted, setter, getter in (
            ("intra", intra, torch.set_num_threads, torch.get_num_threads),
            ("inter", inter, torch.set_num_interop_threads, torch.get_num_interop_threads),
        ):
            if wanted is None:
                continue
            chosen = _chosen.get(key)
            if chosen is None:
                try:
                    setter(wanted)
                except RuntimeError as exc:  # the inter-op pool already started
                    log.warning("model '%s': %s-op thread count %d not applied: %s", model, key, wanted, exc)
                    continue
                _chosen[key] = (wanted, model)
                log.info("%s-op thread count is set to %d for model '%s' (process-wide)", key.capitalize(), getter(), model)
            elif chosen[0] != wanted:
                log.warning(
                    "model '%s' asks for %s-op thread count %d, but model '%s' set it to %d for the whole process "
                    "first (torch has one thread pool per process, as in tritonserver); keeping %d",
                    model, key, wanted, chosen[1], chosen[0], chosen[0],
                )


def apply_budget_threads(torch, model: str, share: int) -> None:
    """Size the intra-op pool to a budget share (handlers/cpu_budget.py), unless a model's
    INTRA_OP_THREAD_COUNT set it: the smallest share seen wins."""
    with _lock:
        if "intra" in _chosen:
            return  # explicit counts win
        current = _budget.get("intra")
        if current is not None and current[0] <= share:
            return
        torch.set_num_threads(share)
        _budget["intra"] = (share, model)
        log.info("Intra-op thread count is set to %d for model '%s' (CPU budget, process-wide)", torch.get_num_threads(), model)


# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's largest accepted value on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 1024 * 1024 * 1024
_ALLOCATOR_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES", "LD_PRELOAD")
_allocator: list[bool] = []  # [applied], once decided for the process


def keep_freed_memory(environ=None) -> bool:
    """Stop glibc from returning freed heap memory to the kernel after every forward (decided
    once per process; the module docstring says why). True where it is applied."""
    import os
    import platform

    with _lock:
        if _allocator:
            return _allocator[0]
        environ = os.environ if environ is None else environ
        chosen = [name for name in _ALLOCATOR_VARIABLES if environ.get(name)]
        applied = False
        if chosen:
            log.info("C allocator left as configured (%s is set)", ", ".join(chosen))
        elif platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
            import ctypes

            try:
                libc = ctypes.CDLL(None)
                applied = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and \
                    libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
            except (OSError, AttributeError) as exc:
                log.info("C allocator left as it is: %s", exc)
            if applied:
                log.info(
                    "C allocator: glibc keeps freed memory for the next forward (mmap threshold %d MiB, trim threshold "
                    "%d MiB)", MMAP_THRESHOLD >> 20, TRIM_THRESHOLD >> 20,
                )
        _allocator.append(applied)
        return applied


def chosen_thread_counts() -> dict[str, int]:
    """The counts set so far ({'intra': n, 'inter': m} where set)."""
    with _lock:
        return {key: value[0] for key, value in _chosen.items()}


def apply_jit_flags(torch, *, profiling: bool | None, executor: bool | None, fuser: bool | None, cudnn: bool) -> None:
    """The process-wide JIT switches a model sets before each execution (only those it sets)."""
    if profiling is not None:
        torch._C._jit_set_profiling_mode(profiling)
    if executor is not None:
        torch._C._jit_set_profiling_executor(executor)
    if fuser is not None:
        torch._C._jit_set_texpr_fuser_enabled(fuser)
    if torch.backends.cudnn.enabled != cudnn:
        torch.backends.cudnn.enabled = cudnn
