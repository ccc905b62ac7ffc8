"""What a model version's instances share (an ONNX Runtime session, a TorchScript module).

The first instance that asks for a key makes the object; the others of the version, loading in
parallel threads, wait for it instead of making their own. The object is kept as long as
something holds it (the instances do; this registry only has a weak reference), so unloading the
instances frees it. The object must accept weak references (Python classes do).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any


class Shared:
    """A registry of shared objects by key (one per backend module)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._objects: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._making: dict[Hashable, threading.Lock] = {}

    def get(self, key: Hashable, make: Callable[[], Any]) -> tuple[Any, bool]:
        """(the object for `key`, whether it existed already). `make()` runs for one caller of a
        key at a time; when it raises, the error is that caller's, and the next waiting caller
        tries again (each instance of a model that fails to load fails with its own error)."""
        with self._lock:
            found = self._objects.get(key)
            if found is not None:
                return found, True
            gate = self._making.setdefault(key, threading.Lock())
        with gate:
            with self._lock:
                found = self._objects.get(key)
            if found is not None:
                return found, True
            made = make()
            with self._lock:
                self._objects[key] = made
                if self._making.get(key) is gate:
                    del self._making[key]  # callers from now on find the object
            return made, False

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._objects
