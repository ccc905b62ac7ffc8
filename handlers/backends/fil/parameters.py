"""The `parameters` of a fil model, read as Triton's FIL backend reads them.

FIL's shared state (fil_backend src/shared_state.h) reads each parameter with RAPIDS-Triton's
`get_config_param` (rapids_triton/model/shared_state.hpp), whose rules are kept here:

- a boolean must be exactly `true` or `false` ("Expected 'true' or 'false' for parameter 'p',
  got: 'v'");
- a number or a word is read like C++'s `istringstream >> value`: leading blanks skipped, the
  longest prefix that parses taken ("4x" is 4, "xgboost_json extra" is "xgboost_json"); when
  nothing parses, the default is used, or, for a parameter without one, "Bad input for parameter p";
- a parameter without a default that is absent: "Required parameter p not found in config".

Both generations of FIL's parameters are read: `is_classifier` (FIL 25.09 on) and the
deprecated `output_class` (tritonserver 2.51's FIL, r24.10), which wins when it is `true` or
`false` (as in FIL's own code), with a note. The GPU-only tuning parameters are
accepted and do nothing here (this backend runs on CPU); each one set is reported in a note, with
what tritonserver would say about its value on a GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import CODE_INTERNAL, CODE_INVALID_ARG, CODE_UNSUPPORTED, FilModelError

MODEL_TYPES = ("xgboost", "xgboost_json", "xgboost_ubj", "lightgbm", "treelite_checkpoint")
# The file FIL reads in a version directory for each model_type (src/model.h, model_file()).
DEFAULT_FILENAMES = {
    "xgboost": "xgboost.model",
    "xgboost_json": "xgboost.json",
    "xgboost_ubj": "xgboost.ubj",
    "lightgbm": "model.txt",
    "treelite_checkpoint": "checkpoint.tl",
}

# GPU-only parameters and the values FIL accepts on a GPU (None: a number), with its message
# for another value (src/fil_config.h of r24.10, src/nvforest_config.h of 25.09 on).
GPU_PARAMETERS: dict[str, tuple[tuple[str, ...] | None, str]] = {
    "algo": (("ALGO_AUTO", "NAIVE", "TREE_REORG", "BATCH_TREE_REORG"), "Unknown FIL algorithm name: {}"),
    "storage_type": (("AUTO", "DENSE", "SPARSE", "SPARSE8"), "Unknown FIL storage type name: {}"),
    "layout": (("depth_first", "breadth_first", "layered", "layered_children_together"), "Unknown nvForest layout name: {}"),
    "threads_per_tree": (None, ""),
    "blocks_per_sm": (None, ""),
    "chunk_size": (None, ""),
    "transfer_threshold": (None, ""),
}
# GPU parameters FIL 25.09 renamed.
RENAMED = {"algo": "layout", "threads_per_tree": "chunk_size"}

_INT = re.compile(r"\s*[+-]?\d+")
_FLOAT = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_MISSING = object()


@dataclass(frozen=True)
class FilParameters:
    model_type: str = "xgboost"
    is_classifier: bool = False
    predict_proba: bool = False
    threshold: float = 0.5
    xgboost_allow_unknown_field: bool = False
    cpu_nthread: int = -1
    use_experimental_optimizations: bool = False
    notes: tuple[str, ...] = field(default=(), compare=False)
    # the parameter that set is_classifier: the deprecated `output_class` where it decided
    classifier_parameter: str = field(default="is_classifier", compare=False)

    @property
    def default_filename(self) -> str:
        return DEFAULT_FILENAMES[self.model_type]


def _raw(parameters: Mapping[str, Any], name: str) -> str | None:
    value = parameters.get(name)
    if value is None:
        return None
    return value.get("string_value", "") if isinstance(value, Mapping) else str(value)


def _read(parameters: Mapping[str, Any], name: str, kind: type, default: Any = _MISSING) -> Any:
    """RAPIDS-Triton's get_config_param<kind>(name[, default])."""
    text = _raw(parameters, name)
    if text is None:
        if default is _MISSING:
            raise FilModelError(f"Required parameter {name} not found in config", code=CODE_INVALID_ARG, key=name)
        return default
    if kind is bool:
        if text == "true":
            return True
        if text == "false":
            return False
        raise FilModelError(
            f"Expected 'true' or 'false' for parameter '{name}', got: '{text}'", code=CODE_INTERNAL, key=name
        )
    if kind is str:
        words = text.split()
        value = words[0] if words else None
    else:
        match = (_INT if kind is int else _FLOAT).match(text)
        value = kind(match.group(0)) if match else None
    if value is None:
        if default is _MISSING:
            raise FilModelError(f"Bad input for parameter {name}", code=CODE_INVALID_ARG, key=name)
        return default
    return value


def configured_threads(config: Mapping[str, Any]) -> int | None:
    """`cpu_nthread` when it sets a count (positive); None for FIL's default (-1, "all cores")."""
    threads = _read(config.get("parameters") or {}, "cpu_nthread", int, -1)
    return threads if threads > 0 else None


def parse_parameters(config: Mapping[str, Any]) -> FilParameters:
    """The model's FIL parameters, in the order FIL reads them (so the first error is FIL's)."""
    parameters: Mapping[str, Any] = config.get("parameters") or {}
    notes: list[str] = []

    output_class: bool | None = None
    value = _read(parameters, "output_class", str, "")
    if value:
        notes.append(
            "parameter 'output_class' is the name tritonserver 2.51's FIL reads; FIL 25.09 renamed it "
            "'is_classifier' (both are read here; output_class wins when it is true or false, as in FIL)"
        )
        if value in ("true", "false"):
            output_class = value == "true"
    for name, (choices, message) in GPU_PARAMETERS.items():
        text = _raw(parameters, name)
        if text is None:
            continue
        renamed = f" (FIL 25.09 renamed it '{RENAMED[name]}')" if name in RENAMED else ""
        note = f"parameter '{name}' tunes FIL on GPUs{renamed}; no effect here: this backend predicts on CPU with Treelite"
        if choices is not None and text not in choices:
            note += f" (tritonserver refuses its value on a GPU instance: {message.format(text)})"
        notes.append(note)

    predict_proba = _read(parameters, "predict_proba", bool, False)
    model_type = _read(parameters, "model_type", str, "xgboost")
    if model_type not in MODEL_TYPES:
        raise FilModelError(
            f"{model_type} not recognized as a valid serialization format.",
            code=CODE_UNSUPPORTED,
            key="model_type",
            detail=f"model_type is one of {', '.join(MODEL_TYPES)}",
        )
    allow_unknown = _read(parameters, "xgboost_allow_unknown_field", bool, False)
    _read(parameters, "transfer_threshold", int, 0)
    if output_class is not None:
        is_classifier = output_class
    else:
        try:
            is_classifier = _read(parameters, "is_classifier", bool)
        except FilModelError as exc:
            if "output_class" not in parameters:
                exc.detail = "set is_classifier (tritonserver 2.51's FIL reads the older name output_class)"
            raise
    threshold = _read(parameters, "threshold", float) if is_classifier else 0.5
    cpu_nthread = _read(parameters, "cpu_nthread", int, -1)
    experimental = _read(parameters, "use_experimental_optimizations", bool, False)
    if experimental:
        notes.append(
            "use_experimental_optimizations: FIL's alternative CPU predictor is not used; this backend always "
            "predicts with Treelite's GTIL (FIL's default CPU predictor), which gives the same predictions"
        )
    return FilParameters(
        model_type=model_type,
        is_classifier=is_classifier,
        predict_proba=predict_proba,
        threshold=threshold,
        xgboost_allow_unknown_field=allow_unknown,
        cpu_nthread=cpu_nthread,
        use_experimental_optimizations=experimental,
        notes=tuple(notes),
        classifier_parameter="output_class" if output_class is not None else "is_classifier",
    )
