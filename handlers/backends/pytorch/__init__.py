"""Triton's pytorch backend (platform `pytorch_libtorch`): TorchScript `model.pt` files, served
with the semantics of tritonserver 2.51's pytorch_backend.

- `config.py`: the backend's reading of the config (parameters, `INPUT__0` / forward-argument
  naming, datatypes), without torch: the compiler's checks use it too;
- `instance.py`: an instance (torch.jit.load, one forward per batch, outputs per request);
- `settings.py`: torch's process-wide settings (thread pools, JIT switches).

torch is imported when the first instance is created, so importing this package costs nothing.

CPU budget (handlers/cpu_budget.py): torch has one intra-op pool per process. Without
INTRA_OP_THREAD_COUNT, the pool is sized to the smallest share the budget gives this process's
torch instances (`slot.threads`), so concurrent forwards never use more threads than the CPUs;
INTRA_OP_THREAD_COUNT is the explicit count (`explicit_threads`) and wins (settings.py).
"""

from __future__ import annotations

from typing import Any


def create_instance(spec: Any, version: int, slot: Any) -> Any:
    """One instance (the backend contract, handlers/backends/__init__.py)."""
    from .instance import PyTorchInstance

    return PyTorchInstance(spec, version, slot.name, slot.kind, slot.device_id, getattr(slot, "threads", None))


def explicit_threads(config: dict) -> int | None:
    """The intra-op threads a forward uses because the config sets INTRA_OP_THREAD_COUNT (the CPU
    budget's hook); None when it is unset, not positive or not a number."""
    from .config import ConfigError, parse_parameters

    try:
        return parse_parameters(config).intra_op_threads
    except ConfigError:
        return None
