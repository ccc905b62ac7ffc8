"""Treelite's C library (libtreelite), called through its C API.

Triton's FIL backend loads every model with Treelite's model loaders and, on CPU, predicts with
Treelite's GTIL (General Tree Inference Library); this backend calls the same two parts of the
same library. It uses the treelite wheel's shared library only: the wheel's Python package
imports scipy at import time (for sparse input, 113 MB installed) and the runtime passes dense
rows only, so the image installs the wheel without its dependencies and never imports the
Python package (docs/fil.md). The functions called here are the ones that package calls, with
the same arguments.

ctypes releases the GIL for the length of every call, so instances predict in parallel.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import logging
import os
import re
import sys
import threading
from pathlib import Path

import numpy as np

log = logging.getLogger("handlers.fil")

# Triton FIL's `model_type` values and the Treelite loader each one uses (fil_backend
# src/tl_utils.h, load_tl_base_model).
LOADERS = {
    "xgboost": "TreeliteLoadXGBoostModelLegacyBinary",
    "xgboost_json": "TreeliteLoadXGBoostModelJSON",
    "xgboost_ubj": "TreeliteLoadXGBoostModelUBJSON",
    "lightgbm": "TreeliteLoadLightGBMModel",
    "treelite_checkpoint": "TreeliteDeserializeModelFromFile",
}

# treelite::TaskType
TASK_TYPES = {0: "binary classifier", 1: "regressor", 2: "multiclass classifier", 3: "ranker", 4: "isolation forest"}
MULTICLASS = 2

_NUMPY_FORMATS = {b"=b": np.int8, b"=l": np.int32, b"=Q": np.uint64, b"=L": np.uint32, b"=B": np.uint8, b"=f": np.float32, b"=d": np.float64}
_DTYPES = {"float32": np.float32, "float64": np.float64}
# "[13:51:38] /project/src/model_loader/lightgbm.cc:282: " before Treelite's own words
_LOG_PREFIX = re.compile(r"^\[\d\d:\d\d:\d\d\] [^:\s]+:\d+: ")


class TreeliteError(Exception):
    """Treelite refused a call; the message is Treelite's (without its timestamp and source line)."""


class TreeliteMissing(TreeliteError):
    """The treelite wheel is not installed."""


class _Frame(ctypes.Structure):
    """TreelitePyBufferFrame: a header field's memory, owned by the model."""

    _fields_ = [
        ("buf", ctypes.c_void_p),
        ("format", ctypes.c_char_p),
        ("itemsize", ctypes.c_size_t),
        ("nitem", ctypes.c_size_t),
    ]


_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()


def library_path() -> Path | None:
    """libtreelite.so of the installed treelite wheel (found without importing its package)."""
    spec = importlib.util.find_spec("treelite")
    if spec is None or not spec.submodule_search_locations:
        return None
    name = {"darwin": "libtreelite.dylib", "win32": "treelite.dll"}.get(sys.platform, "libtreelite.so")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "lib" / name
        if candidate.is_file():
            return candidate
    return None


@ctypes.CFUNCTYPE(None, ctypes.c_char_p)
def _on_log(message: bytes) -> None:
    log.info("treelite: %s", message.decode("utf-8", "replace").rstrip())


@ctypes.CFUNCTYPE(None, ctypes.c_char_p)
def _on_warning(message: bytes) -> None:
    log.warning("treelite: %s", message.decode("utf-8", "replace").rstrip())


# The wheel's own OpenMP runtime (libgomp) reads its settings once, when it is loaded.
OMP_WAIT_POLICY = "OMP_WAIT_POLICY"


def _load(path: Path) -> ctypes.CDLL:
    """dlopen libtreelite with its OpenMP threads sleeping between parallel regions (passive
    waiting) unless OMP_WAIT_POLICY is set: by default libgomp spins after every prediction,
    which takes the CPU from the event loop that answers requests and, in a container with a
    CPU quota, spends the quota. The variable is restored afterwards, so libraries loaded later
    (a python model's torch) keep their defaults."""
    previous = os.environ.get(OMP_WAIT_POLICY)
    if previous is None:
        os.environ[OMP_WAIT_POLICY] = "PASSIVE"
    try:
        return ctypes.CDLL(str(path))
    finally:
        if previous is None:
            os.environ.pop(OMP_WAIT_POLICY, None)


def library() -> ctypes.CDLL:
    """The loaded library (loaded once per process)."""
    global _lib
    with _lib_lock:
        if _lib is None:
            path = library_path()
            if path is None:
                raise TreeliteMissing(
                    "treelite is not installed, and the fil backend loads and runs tree models with it: "
                    "pip install 'triton-serverless-toolkit[fil]' (images built by `toolkit build` carry it)"
                )
            lib = _load(path)
            lib.TreeliteGetLastError.restype = ctypes.c_char_p
            lib.TreeliteRegisterLogCallback(_on_log)
            lib.TreeliteRegisterWarningCallback(_on_warning)
            _lib = lib
        return _lib


def _check(lib: ctypes.CDLL, status: int) -> None:
    if status != 0:
        message = (lib.TreeliteGetLastError() or b"unknown Treelite error").decode("utf-8", "replace")
        raise TreeliteError(_LOG_PREFIX.sub("", message.strip()))


class Forest:
    """One loaded Treelite model and its GTIL predictor. Thread-safe for `predict`."""

    def __init__(self, lib: ctypes.CDLL, handle: ctypes.c_void_p) -> None:
        self._lib = lib
        self._handle: ctypes.c_void_p | None = handle
        self._configs: dict[int, ctypes.c_void_p] = {}
        self._configs_lock = threading.Lock()
        self.num_feature = self._query_int("TreeliteQueryNumFeature", ctypes.c_int)
        self.num_tree = self._query_int("TreeliteQueryNumTree", ctypes.c_size_t)
        self.input_type = self._query_str("TreeliteGetInputType")
        self.output_type = self._query_str("TreeliteGetOutputType")
        self.num_target = int(self.header("num_target")[0])
        self.num_class = [int(c) for c in self.header("num_class")]
        self.task_type = int(self.header("task_type")[0])
        self.leaf_vector_shape = [int(d) for d in self.header("leaf_vector_shape")]

    @classmethod
    def load(cls, path: Path | str, model_type: str, *, allow_unknown_field: bool = False) -> Forest:
        """Load `path` with the Treelite loader of FIL's `model_type`."""
        lib = library()
        loader = LOADERS[model_type]
        handle = ctypes.c_void_p()
        filename = ctypes.c_char_p(str(path).encode("utf-8"))
        if model_type == "treelite_checkpoint":
            status = lib.TreeliteDeserializeModelFromFile(filename, ctypes.byref(handle))
        else:
            options = json.dumps({"allow_unknown_field": allow_unknown_field} if model_type.startswith("xgboost_") else {})
            status = getattr(lib, loader)(filename, ctypes.c_char_p(options.encode()), ctypes.byref(handle))
        _check(lib, status)
        return cls(lib, handle)

    # -- header -----------------------------------------------------------------------------------

    def _query_int(self, function: str, ctype) -> int:
        out = ctype()
        _check(self._lib, getattr(self._lib, function)(self._handle, ctypes.byref(out)))
        return int(out.value)

    def _query_str(self, function: str) -> str:
        out = ctypes.c_char_p()
        _check(self._lib, getattr(self._lib, function)(self._handle, ctypes.byref(out)))
        return (out.value or b"").decode("utf-8")

    def header(self, name: str) -> np.ndarray | str:
        """A header field (Treelite's model spec): an array, or a string for string fields."""
        frame = _Frame()
        _check(self._lib, self._lib.TreeliteGetHeaderField(self._handle, name.encode(), ctypes.byref(frame)))
        raw = ctypes.string_at(frame.buf, frame.itemsize * frame.nitem) if frame.buf else b""
        dtype = _NUMPY_FORMATS.get(frame.format)
        if dtype is None:  # char array: a string field
            return raw.decode("utf-8")
        return np.frombuffer(raw, dtype=dtype).copy()

    def tree_field(self, tree: int, name: str) -> np.ndarray:
        frame = _Frame()
        _check(self._lib, self._lib.TreeliteGetTreeField(self._handle, ctypes.c_uint64(tree), name.encode(),
                                                          ctypes.byref(frame)))
        raw = ctypes.string_at(frame.buf, frame.itemsize * frame.nitem) if frame.buf else b""
        return np.frombuffer(raw, dtype=_NUMPY_FORMATS.get(frame.format, np.uint8))

    def check_structure(self) -> None:
        """What GTIL relies on and nothing checks when a model loads: children and split features
        in range, every node reached once (no cycles), leaf vectors and category lists inside
        their arrays, per-tree class and target ids in range. A damaged Treelite checkpoint loads
        and then crashes the first prediction that walks into the damage; TreeliteError here."""
        num_target, num_class = self.num_target, self.num_class
        max_class = max(num_class) if num_class else 0
        if num_target < 1 or len(num_class) != num_target or min(num_class) < 1 or len(self.leaf_vector_shape) != 2:
            raise TreeliteError(f"inconsistent model header (num_target {num_target}, num_class {num_class})")
        if len(self.header("base_scores")) != num_target * max_class:
            raise TreeliteError("inconsistent model header (base_scores)")
        targets, classes = self.header("target_id"), self.header("class_id")
        if len(targets) != self.num_tree or len(classes) != self.num_tree:
            raise TreeliteError("inconsistent model header (target_id / class_id per tree)")
        if ((targets < -1) | (targets >= num_target)).any() or ((classes < -1) | (classes >= max_class)).any():
            raise TreeliteError("a tree's target_id or class_id is out of range")
        leaf_size = self.leaf_vector_shape[0] * self.leaf_vector_shape[1]
        for tree in range(self.num_tree):
            n = int(self.tree_field(tree, "num_nodes")[0])
            f = {name: self.tree_field(tree, name) for name in (
                "cleft", "cright", "split_index", "node_type", "default_left", "leaf_value", "threshold", "cmp",
                "leaf_vector_begin", "leaf_vector_end", "category_list_begin", "category_list_end",
                "category_list_right_child")}
            if n < 1 or any(len(a) != n for a in f.values()):
                raise TreeliteError(f"tree {tree}: node arrays do not match its {n} nodes")
            left, right, split = f["cleft"], f["cright"], f["split_index"]
            inner = left != -1
            children = np.concatenate([left[inner], right[inner]])
            if ((children < 1) | (children >= n)).any():
                raise TreeliteError(f"tree {tree}: a child node is out of range")
            if ((split[inner] < 0) | (split[inner] >= self.num_feature)).any():
                raise TreeliteError(f"tree {tree}: a split uses a feature beyond the model's {self.num_feature}")
            if (np.bincount(children, minlength=n) > 1).any():
                raise TreeliteError(f"tree {tree}: a node is reached twice (the tree has a cycle)")
            for field in ("leaf_vector", "category_list"):
                begins, ends = f[f"{field}_begin"], f[f"{field}_end"]
                if ((begins > ends) | (ends > len(self.tree_field(tree, field)))).any():
                    raise TreeliteError(f"tree {tree}: a {field} range is out of bounds")
            lengths = (f["leaf_vector_end"] - f["leaf_vector_begin"])[~inner]
            if ((lengths != 0) & (lengths != leaf_size)).any():
                raise TreeliteError(f"tree {tree}: a leaf vector does not have {leaf_size} values")

    @property
    def postprocessor(self) -> str:
        return str(self.header("postprocessor"))

    @postprocessor.setter
    def postprocessor(self, name: str) -> None:
        data = ctypes.create_string_buffer(name.encode("utf-8"), len(name))
        frame = _Frame(ctypes.cast(data, ctypes.c_void_p), b"=c", 1, len(name))
        _check(self._lib, self._lib.TreeliteSetHeaderField(self._handle, b"postprocessor", frame))

    @property
    def values_per_row(self) -> int:
        """What GTIL writes per row: num_target x the largest num_class."""
        return self.num_target * max(self.num_class)

    # -- prediction -------------------------------------------------------------------------------

    def _config(self, nthread: int) -> ctypes.c_void_p:
        with self._configs_lock:
            config = self._configs.get(nthread)
            if config is None:
                config = ctypes.c_void_p()
                text = json.dumps({"predict_type": "default", "nthread": nthread}).encode()
                _check(self._lib, self._lib.TreeliteGTILParseConfig(text, ctypes.byref(config)))
                self._configs[nthread] = config
            return config

    def predict(self, rows: np.ndarray, nthread: int) -> np.ndarray:
        """GTIL's prediction (postprocessor applied) for `rows` [n, num_feature]: [n, values_per_row]
        in the model's output type. Rows are converted to the model's input type (float64 for
        LightGBM and scikit-learn models), as Treelite's own Python API does."""
        if self._handle is None:
            raise TreeliteError("the model was closed")
        dtype = _DTYPES[self.input_type]
        data = np.ascontiguousarray(rows, dtype=dtype)
        count = data.shape[0]
        out = np.empty((count, self.values_per_row), dtype=_DTYPES[self.output_type])
        if count:
            _check(
                self._lib,
                self._lib.TreeliteGTILPredict(
                    self._handle,
                    data.ctypes.data_as(ctypes.c_void_p),
                    self.input_type.encode(),
                    ctypes.c_uint64(count),
                    out.ctypes.data_as(ctypes.c_void_p),
                    self._config(nthread),
                ),
            )
        return out

    def close(self) -> None:
        handle, self._handle = self._handle, None
        if handle is None:
            return
        with self._configs_lock:
            for config in self._configs.values():
                self._lib.TreeliteGTILDeleteConfig(config)
            self._configs.clear()
        self._lib.TreeliteFreeModel(handle)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown
            self.close()
