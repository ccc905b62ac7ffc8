"""Triton's FIL backend (`backend: "fil"`): XGBoost, LightGBM and Treelite tree models on CPU.

Models load with Treelite, as in Triton's FIL, and predict with Treelite's GTIL, FIL's CPU
predictor, so results are FIL's on CPU and the frameworks' own (docs/fil.md):

- parameters.py: the `parameters` FIL reads, with its defaults, rules and messages;
- tensors.py: `input__0` / `output__0`, what the config must declare, the response's shape;
- model.py: the model file (per `model_type`), its loading, the checks against the config,
  FIL's classifier / probability outputs;
- treelite.py: libtreelite's C API; probe.py: the compile-time load, in a child process;
- instance.py: the instance the batcher runs, and the threads it predicts with.
"""

from __future__ import annotations

from typing import Any

from .errors import FilModelError


def create_instance(spec: Any, version: int, slot: Any) -> Any:
    """One instance (the backend contract, handlers/backends/__init__.py)."""
    from .instance import FilInstance

    return FilInstance(spec, version, slot.name, slot.kind, slot.device_id, getattr(slot, "threads", None))


def explicit_threads(config: dict) -> int | None:
    """The CPU budget's hook (handlers/cpu_budget.py): FIL's `cpu_nthread` when it is positive."""
    from .parameters import configured_threads

    return configured_threads(config)


__all__ = ["FilModelError", "create_instance", "explicit_threads"]
