"""One fil model version: its file loaded by Treelite, with FIL's prediction semantics.

Shared by the runtime's instances and by `toolkit validate` / `build`, which load the model once
to check it against its config (one implementation of each rule).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .errors import CODE_INVALID_ARG, CODE_UNAVAILABLE, CODE_UNKNOWN, FilModelError
from .parameters import DEFAULT_FILENAMES, FilParameters
from .tensors import OUTPUT, TensorLayout, expected_values
from .treelite import MULTICLASS, TASK_TYPES, Forest, TreeliteError, TreeliteMissing

FORMAT_NAMES = {
    "xgboost": "an XGBoost binary (legacy) model",
    "xgboost_json": "an XGBoost JSON model",
    "xgboost_ubj": "an XGBoost UBJSON model",
    "lightgbm": "a LightGBM text model",
    "treelite_checkpoint": "a Treelite checkpoint",
}
_UBJSON_MARKERS = b"UiIlLdD#$"


def model_path(version_dir: Path, default_model_filename: str, model_type: str) -> Path:
    """The file FIL reads: `default_model_filename` in the version directory, or, when that is a
    directory (also when the name is empty), the model_type's default file in it
    (RAPIDS-Triton's instance path, FIL's RapidsModel::model_file)."""
    path = version_dir / default_model_filename if default_model_filename else version_dir
    if path.is_dir():
        path = path / DEFAULT_FILENAMES[model_type]
    return path


def sniff(path: Path) -> str | None:
    """The model_type whose format `path` looks like, from its first bytes; None when unsure."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(64)
    except OSError:
        return None
    text = head.lstrip()
    if head.startswith(b"binf"):
        return "xgboost"
    if text.startswith(b"{"):
        rest = text[1:].lstrip()
        if rest[:1] == b'"' or rest[:1] == b"}":
            return "xgboost_json"
        if head[1:2] and head[1:2] in _UBJSON_MARKERS:
            return "xgboost_ubj"
    if text.startswith((b"tree\n", b"tree\r\n")):
        return "lightgbm"
    if len(head) >= 12:
        major, minor, _patch = np.frombuffer(head[:12], dtype="<i4")
        if 3 <= major <= 9 and 0 <= minor < 100:
            return "treelite_checkpoint"
    return None


def load_forest(path: Path, params: FilParameters) -> Forest:
    """Treelite's loader for the model_type, with FIL's messages; when the file plainly is in
    another format, that is said instead of handing it to the wrong parser."""
    if not path.is_file():
        if params.model_type == "treelite_checkpoint":
            message = f'Could not open model file "{path}"'  # FIL's own check (src/tl_utils.h)
            code = CODE_UNAVAILABLE
        else:
            message = f'Check failed: std::filesystem::exists(path): Path "{path}" does not exist'  # Treelite's
            code = CODE_UNKNOWN
        raise FilModelError(
            message,
            code=code,
            file=str(path),
            detail=f"model_type '{params.model_type}' reads '{params.default_filename}' in the version directory "
            "unless default_model_filename names another file",
        )
    looks_like = sniff(path)
    if looks_like is not None and looks_like != params.model_type:
        raise FilModelError(
            f"model file '{path}' is {FORMAT_NAMES[looks_like]}, but model_type is '{params.model_type}' "
            f"({FORMAT_NAMES[params.model_type]})",
            key="model_type",
            file=str(path),
            detail=f'set model_type to "{looks_like}"',
        )
    try:
        return Forest.load(path, params.model_type, allow_unknown_field=params.xgboost_allow_unknown_field)
    except TreeliteMissing as exc:
        raise FilModelError(str(exc), code=CODE_UNAVAILABLE) from None
    except TreeliteError as exc:
        raise FilModelError(
            str(exc),
            code=CODE_UNKNOWN,
            file=str(path),
            detail=f"Treelite could not read '{path.name}' as {FORMAT_NAMES[params.model_type]} (model_type "
            f"'{params.model_type}')",
        ) from None


class FilModel:
    """A loaded model whose `predict` returns what Triton's FIL returns for the same rows."""

    def __init__(self, forest: Forest, params: FilParameters, layout: TensorLayout, name: str) -> None:
        self.forest = forest
        self.params = params
        self.layout = layout
        self.name = name
        if forest.num_target != 1:
            raise FilModelError("Multi-target model not supported", code=CODE_UNKNOWN)
        self.num_classes = forest.num_class[0]
        # FIL's TreeliteModel: with predict_proba, a multiclass model returns probabilities.
        if params.predict_proba and forest.task_type == MULTICLASS:
            forest.postprocessor = "softmax" if forest.leaf_vector_shape[1] == 1 else "identity_multiclass"
        self._check_config()
        self.binary_pairs = (
            params.is_classifier and params.predict_proba and self.num_classes == 1 and layout.values_per_row == 2
        )

    @property
    def kind(self) -> str:
        what = TASK_TYPES.get(self.forest.task_type, "model")
        classes = f", {self.num_classes} classes" if self.num_classes > 1 else ""
        return f"{what}{classes}"

    def _check_config(self) -> None:
        features = self.layout.features
        if features != -1 and features != self.forest.num_feature:
            raise FilModelError(
                f"input 'input__0' of model '{self.name}' has {features} features per row, but the model was "
                f"trained on {self.forest.num_feature} features",
                code=CODE_INVALID_ARG,
                key='"input__0"',
                detail=f"set its dims to [ {self.forest.num_feature} ] (tritonserver would read each row with the "
                "model's feature count, so every prediction would be wrong)",
            )
        expected = expected_values(self.params.is_classifier, self.params.predict_proba, self.num_classes)
        values = self.layout.values_per_row
        if values not in expected:
            p = self.params
            choices = " or ".join(f"[ {e} ]" for e in expected)
            raise FilModelError(
                f"output '{OUTPUT}' of model '{self.name}' has {values} values per row (dims "
                f"{list(self.layout.output_dims)}), but this {self.kind} gives {' or '.join(map(str, expected))} "
                f"with {p.classifier_parameter} {str(p.is_classifier).lower()} and predict_proba "
                f"{str(p.predict_proba).lower()}",
                code=CODE_INVALID_ARG,
                key=f'"{OUTPUT}"',
                detail=f"set its dims to {choices} (tritonserver would write past the output or leave it partly unset)",
            )

    def verify(self, path: Path) -> None:
        """The model's trees are sound (Treelite checks none of it when it loads a checkpoint)
        and it predicts rows of zeros, missing values and random values: the compile-time check
        (probe.py), run where a crash takes down only the checking process."""
        try:
            self.forest.check_structure()
            rng = np.random.default_rng(0)
            features = self.forest.num_feature
            rows = np.concatenate([np.zeros((1, features)), np.full((1, features), np.nan),
                                   rng.standard_normal((6, features)) * 10.0]).astype(np.float32)
            self.predict(rows, 1)
        except TreeliteError as exc:
            raise FilModelError(
                f"model file '{path}' is damaged: {exc}",
                code=CODE_UNKNOWN,
                file=str(path),
                detail="Treelite loads it; a prediction reaching the damage would crash the server (tritonserver too)",
            ) from None

    def check_rows(self, rows: np.ndarray) -> None:
        if rows.ndim != 2 or rows.shape[1] != self.forest.num_feature:
            got = rows.shape[1] if rows.ndim == 2 else f"shape {list(rows.shape)}"
            raise FilModelError(
                f"input 'input__0' of model '{self.name}' has {got} features per row; the model was trained on "
                f"{self.forest.num_feature} features",
                code=CODE_INVALID_ARG,
            )

    def predict(self, rows: np.ndarray, nthread: int) -> np.ndarray:
        """FIL's output__0 for `rows` [n, features] (float32; NaN is a missing value), shaped
        [n] + the output's per-row dims without 1s."""
        p = self.params
        scores = self.forest.predict(rows, nthread)  # [n, num_classes], the model's output type
        if p.is_classifier and not p.predict_proba:
            if self.num_classes > 1:
                # FIL's loop: the first class whose score beats all before it, starting from 0.0
                best = scores.argmax(axis=1)
                result = np.where(scores.max(axis=1) > 0.0, best, 0).astype(np.float32)
            else:
                result = (scores[:, 0] > p.threshold).astype(np.float32)
        elif self.binary_pairs:
            positive = scores[:, 0]
            result = np.stack([1.0 - positive, positive], axis=1).astype(np.float32)
        else:
            result = scores.astype(np.float32, copy=False)
        return result.reshape((rows.shape[0], *self.layout.response_dims))

    def close(self) -> None:
        self.forest.close()


def load_model(path: Path, config: Mapping[str, Any], params: FilParameters, layout: TensorLayout) -> FilModel:
    """The model in `path` (model_path's file), checked against the config."""
    forest = load_forest(path, params)
    try:
        return FilModel(forest, params, layout, config.get("name", ""))
    except FilModelError as exc:
        forest.close()
        if exc.file is None and exc.key is None:
            exc.file = str(path)
        raise
