"""What a fil model's inputs and outputs must be, and the shape of what it returns.

Triton's FIL backend reads one input, `input__0`, as FP32 rows of features, and writes one
output, `output__0`, as FP32 (docs/model_config.md of fil_backend). It checks none of this when
it loads: a config that names its tensors otherwise, declares another data type or a feature
count that is not the model's, loads, and then every request fails or reads memory that is not
its own. Here each of those is refused when the model loads (and by `toolkit validate`), with
the reason.

The response's shape is RAPIDS-Triton's for FIL (`squeeze_output`): the output's dims (or its
`reshape`) without the dimensions of size 1, after the number of rows. An output declared
`dims: [ 1 ]` comes back as `[rows]`, `dims: [ 3 ]` as `[rows, 3]`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import CODE_INVALID_ARG, CODE_UNSUPPORTED, FilModelError

INPUT = "input__0"
OUTPUT = "output__0"
SHAP_OUTPUT = "treeshap_output"
FP32 = "TYPE_FP32"
VARIABLE = -1


@dataclass(frozen=True)
class TensorLayout:
    features: int  # features per row from the config; -1 when variable (checked per request)
    output_dims: tuple[int, ...]  # per row, as declared (reshape applied)
    ignored_inputs: tuple[str, ...] = ()
    ignored_outputs: tuple[str, ...] = ()

    @property
    def values_per_row(self) -> int:
        return math.prod(self.output_dims)

    @property
    def response_dims(self) -> tuple[int, ...]:
        """Per-row dims of the response (RAPIDS-Triton's squeeze_output)."""
        return tuple(d for d in self.output_dims if d != 1)


def _shape(io: Mapping[str, Any]) -> list[int]:
    reshape = io.get("reshape")
    if isinstance(reshape, Mapping):
        return [int(d) for d in reshape.get("shape", [])]
    return [int(d) for d in io.get("dims", [])]


def _find(ios: list[Mapping[str, Any]], name: str) -> Mapping[str, Any] | None:
    return next((io for io in ios if io.get("name") == name), None)


def tensor_layout(config: Mapping[str, Any]) -> TensorLayout:
    """Check the config's tensors against what FIL reads and writes (no model needed)."""
    model = config.get("name", "")
    batching = int(config.get("max_batch_size", 0)) > 0
    inputs = list(config.get("input", []))
    outputs = list(config.get("output", []))

    source = _find(inputs, INPUT)
    if source is None:
        names = ", ".join(f"'{io.get('name')}'" for io in inputs) or "none"
        raise FilModelError(
            f"model '{model}' has no input '{INPUT}': the fil backend reads its rows from input '{INPUT}' "
            f"(inputs declared: {names})",
            key="input",
            detail="tritonserver loads such a model and fails every request; rename the input to input__0",
        )
    if source.get("data_type") != FP32:
        raise FilModelError(
            f"input '{INPUT}' of model '{model}' is {source.get('data_type')}: the fil backend reads "
            f"{INPUT} as {FP32}",
            key=f'"{INPUT}"',
            detail="tritonserver refuses every request of such a model ('incorrect type ... for input with required type')",
        )
    shape = _shape(source)
    expected_rank = 1 if batching else 2
    if len(shape) != expected_rank:
        what = "[ features ]" if batching else "[ rows, features ] (e.g. [ -1, 32 ]) for a model without batching"
        raise FilModelError(
            f"input '{INPUT}' of model '{model}' has shape {shape}: the fil backend reads it as rows of features, "
            f"dims {what}",
            key=f'"{INPUT}"',
        )
    features = shape[-1]

    target = _find(outputs, OUTPUT)
    if target is None:
        names = ", ".join(f"'{io.get('name')}'" for io in outputs) or "none"
        raise FilModelError(
            f"model '{model}' has no output '{OUTPUT}': the fil backend writes its predictions to output "
            f"'{OUTPUT}' (outputs declared: {names})",
            key="output",
            detail=f"tritonserver fails every request of such a model (No output with name {OUTPUT} in configuration.)",
        )
    if target.get("data_type") != FP32:
        raise FilModelError(
            f"output '{OUTPUT}' of model '{model}' is {target.get('data_type')}: the fil backend writes {OUTPUT} as {FP32}",
            key=f'"{OUTPUT}"',
        )
    if _find(outputs, SHAP_OUTPUT) is not None:
        raise FilModelError(
            f"model '{model}' declares output '{SHAP_OUTPUT}': FIL's SHAP values are not computed by this backend",
            code=CODE_UNSUPPORTED,
            key=f'"{SHAP_OUTPUT}"',
            detail="remove the output to serve the predictions, or compute SHAP values in a python model",
        )
    dims = _shape(target)
    if not batching and dims and dims[0] == VARIABLE:
        dims = dims[1:]  # the rows: RAPIDS-Triton puts the row count there
    if any(d == VARIABLE for d in dims):
        raise FilModelError(
            f"output '{OUTPUT}' of model '{model}' has a variable dimension (dims {_shape(target)}): the fil backend "
            "needs the number of values per row",
            code=CODE_INVALID_ARG,
            key=f'"{OUTPUT}"',
            detail="tritonserver fails every request of such a model (Backends with variable-shape outputs must "
            "request desired output shape)",
        )
    return TensorLayout(
        features=features,
        output_dims=tuple(dims),
        ignored_inputs=tuple(io.get("name", "") for io in inputs if io.get("name") != INPUT),
        ignored_outputs=tuple(io.get("name", "") for io in outputs if io.get("name") != OUTPUT),
    )


def expected_values(is_classifier: bool, predict_proba: bool, num_classes: int) -> tuple[int, ...]:
    """How many values per row FIL gives (fil_backend src/tl_model.h): a class index per row for a
    classifier without predict_proba; with it, a score per class, and for a binary classifier 1
    (the positive class) or 2 (both classes) as the output's dims ask; a regressor's prediction."""
    if is_classifier and not predict_proba:
        return (1,)
    if is_classifier and predict_proba and num_classes == 1:
        return (1, 2)
    return (num_classes,)
