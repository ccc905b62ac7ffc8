"""Triton's pytorch backend (platform `pytorch_libtorch`): TorchScript `model.pt` files, served
with the semantics of tritonserver 2.51's pytorch_backend.

- `config.py`: the backend's reading of the config (parameters, `INPUT__0` / forward-argument
  naming, datatypes), without torch: the compiler's checks use it too;
- `instance.py`: an instance (torch.jit.load, one forward per batch, outputs per request);
- `settings.py`: torch's process-wide settings (thread pools, JIT switches).

torch is imported when the first instance is created, so importing this package costs nothing.
"""

from __future__ import annotations

from typing import Any


def create_instance(spec: Any, version: int, slot: Any) -> Any:
    """One instance (the backend contract, handlers/backends/__init__.py)."""
    from .instance import PyTorchInstance

    return PyTorchInstance(spec, version, slot.name, slot.kind, slot.device_id)
