"""Triton's generated gRPC modules: `model_config_pb2`, `service_pb2` (grpc_service.proto) and
`service_pb2_grpc`, exactly as tritonclient ships them (protoc and grpcio-tools output; nothing
here is written by hand).

They are loaded from their files, under their own module names (`tritonclient.grpc.service_pb2`,
...), without importing the `tritonclient` package: the runtime never needs tritonclient's client
code or its dependencies. The folder holding the three files is

- `$TOOLKIT_GRPC_MODULES` when set: gRPC images carry the files `toolkit build --protocol grpc`
  copied from the build host's tritonclient (toolkit/build/grpc_modules.py);
- otherwise the `grpc` folder of an installed tritonclient (`toolkit serve`, tests).

The generated code imports its siblings with `from tritonclient.grpc import ...`; while the files
load, a stand-in `tritonclient.grpc` package that holds only them answers those imports, and it is
removed afterwards, so a real `import tritonclient.grpc` later (a client in the same process)
finds these same modules in `sys.modules` instead of loading the files twice.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
from pathlib import Path
from types import ModuleType

MODULES_ENV = "TOOLKIT_GRPC_MODULES"
PACKAGE = "tritonclient.grpc"
FILES = ("model_config_pb2", "service_pb2", "service_pb2_grpc")

_lock = threading.Lock()


def modules_directory() -> Path:
    """Where the generated files are read from (see the module doc)."""
    explicit = os.environ.get(MODULES_ENV)
    if explicit:
        return Path(explicit)
    spec = importlib.util.find_spec(PACKAGE.split(".")[0])  # finds the folder, imports nothing
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"Triton's generated gRPC modules were not found: set {MODULES_ENV} to a folder holding "
            f"{', '.join(name + '.py' for name in FILES)}, or install tritonclient"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "grpc"


def _load(directory: Path) -> dict[str, ModuleType]:
    loaded: dict[str, ModuleType] = {}
    missing = [name for name in FILES if f"{PACKAGE}.{name}" not in sys.modules]
    if not missing:
        return {name: sys.modules[f"{PACKAGE}.{name}"] for name in FILES}
    stand_in = None
    if PACKAGE not in sys.modules:
        stand_in = ModuleType(PACKAGE)
        stand_in.__path__ = []  # a package that can import nothing else
        sys.modules[PACKAGE] = stand_in
    try:
        for name in FILES:
            qualified = f"{PACKAGE}.{name}"
            module = sys.modules.get(qualified)
            if module is None:
                path = directory / f"{name}.py"
                if not path.is_file():
                    raise ImportError(f"Triton's generated gRPC module {path} is missing ({MODULES_ENV})")
                spec = importlib.util.spec_from_file_location(qualified, path)
                assert spec is not None and spec.loader is not None
                module = importlib.util.module_from_spec(spec)
                sys.modules[qualified] = module
                try:
                    spec.loader.exec_module(module)
                except BaseException:
                    del sys.modules[qualified]
                    raise
            if stand_in is not None:
                setattr(stand_in, name, module)
            loaded[name] = module
    finally:
        if stand_in is not None and sys.modules.get(PACKAGE) is stand_in:
            del sys.modules[PACKAGE]
    return loaded


def load() -> tuple[ModuleType, ModuleType, ModuleType]:
    """(model_config_pb2, service_pb2, service_pb2_grpc), loaded once per process."""
    with _lock:
        modules = _load(modules_directory())
    return modules["model_config_pb2"], modules["service_pb2"], modules["service_pb2_grpc"]
