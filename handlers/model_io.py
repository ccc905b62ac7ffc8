"""A model's inputs and outputs as the request path reads them, taken once from its config.

`ModelIO(config)` holds what validating a request (handlers/protocol/validation.py) and encoding
its response (handlers/protocol/codec.py) would otherwise derive from the config JSON on every
request: the inputs and outputs by name, their protocol datatypes and dims, which inputs are
required or shape tensors, and max_batch_size. A loaded model keeps one (`LoadedModel.io`); the
functions that take a config build one when they are not given it, so both ways answer alike.
The config must not change after the ModelIO is made (a loaded model's never does).

`ModelIO.response_order(names)` is the order a response's outputs take, as the model's Triton
backend adds them: by name where the backend keeps its outputs in a `std::map` (onnxruntime,
pytorch; also ensembles, whose order in Triton's core is an unordered_map's, unspecified), the
config's order where the backend walks the config (openvino; fil, which answers with one output),
and the model's own where the model lists them (python: python_backend's InferResponse::Send).

`OutputReshape(config)` is the outputs' `reshape`, as Triton's core applies it to every
backend's responses (InferenceResponse::AddOutput): the model produces `reshape.shape`, the
client (and an ensemble's next step, a BLS caller) gets `dims`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from .datatypes import from_config_type
from .errors import internal
from .inference import InferOutcome, InferResponse

__all__ = ["ModelIO", "OutputReshape"]

_NAME_ORDER, _CONFIG_ORDER, _MODEL_ORDER = "name", "config", "model"


class ModelIO:
    __slots__ = (
        "batched",
        "input_datatypes",
        "input_dims",
        "inputs",
        "max_batch_size",
        "output_datatypes",
        "output_index",
        "output_order",
        "outputs",
        "required",
        "shape_tensors",
    )

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.inputs: dict[str, Mapping[str, Any]] = {io["name"]: io for io in config.get("input", ())}
        self.outputs: dict[str, Mapping[str, Any]] = {io["name"]: io for io in config.get("output", ())}
        self.max_batch_size = int(config.get("max_batch_size", 0))
        self.batched = self.max_batch_size > 0
        self.required = [name for name, io in self.inputs.items() if not io.get("optional", False)]
        # None where a config lacks data_type: validation then fails on it as it did unprepared
        self.input_datatypes = {
            name: from_config_type(io["data_type"]) if "data_type" in io else None for name, io in self.inputs.items()
        }
        self.input_dims = {name: tuple(int(d) for d in io.get("dims", ())) for name, io in self.inputs.items()}
        self.shape_tensors = frozenset(name for name, io in self.inputs.items() if io.get("is_shape_tensor", False))
        self.output_datatypes = {
            name: from_config_type(io["data_type"]) if "data_type" in io else None for name, io in self.outputs.items()
        }
        self.output_index = {name: index for index, name in enumerate(self.outputs)}
        backend = config.get("backend") or config.get("platform", "")
        self.output_order = _MODEL_ORDER if backend == "python" else _CONFIG_ORDER if backend in (
            "openvino", "fil") else _NAME_ORDER

    def response_order(self, names: Iterable[str]) -> list[str]:
        """`names` (a response's outputs, in the order the model gave them) in the order Triton's
        backend of this model answers with them."""
        if self.output_order is _MODEL_ORDER:
            return list(names)
        if self.output_order is _CONFIG_ORDER:
            last = len(self.output_index)
            return sorted(names, key=lambda name: (self.output_index.get(name, last), name))
        return sorted(names)

    def output_types(self) -> dict[str, str]:
        """The outputs' protocol datatypes by name, for encoding a response; a config output
        without data_type raises KeyError('data_type'), as reading it from the config would."""
        if None in self.output_datatypes.values():
            raise KeyError("data_type")
        return self.output_datatypes  # type: ignore[return-value]


class OutputReshape:
    """The outputs of a config that have a `reshape`; falsy when none has. `apply(outcome)` gives
    each such output of a response the shape Triton's InferenceResponse::Output::Reshape gives
    it: the batch dimension (when the model batches), then `dims`, each -1 there taking, in
    order, the produced size at a -1 of `reshape.shape`. Triton relabels the buffer without
    checking it; an output whose produced shape does not fit (another rank, another element
    count) makes the response an INTERNAL error naming the model and the output."""

    __slots__ = ("batched", "model", "outputs")

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.model = str(config.get("name", ""))
        self.batched = int(config.get("max_batch_size", 0)) > 0
        self.outputs: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {
            io["name"]: (tuple(int(d) for d in io["reshape"].get("shape", ())), tuple(int(d) for d in io.get("dims", ())))
            for io in config.get("output", ())
            if "reshape" in io
        }

    def __bool__(self) -> bool:
        return bool(self.outputs)

    def shape(self, name: str, produced: tuple[int, ...]) -> tuple[int, ...] | None:
        """What output `name` produced as `produced` is sent as; None where it does not fit."""
        model_shape, dims = self.outputs[name]
        offset = 1 if self.batched else 0
        if len(produced) != len(model_shape) + offset:
            return None
        variable = [produced[i + offset] for i, d in enumerate(model_shape) if d == -1]
        if sum(1 for d in dims if d == -1) != len(variable):
            return None
        sizes = iter(variable)
        target = (produced[:1] if self.batched else ()) + tuple(next(sizes) if d == -1 else d for d in dims)
        return target if math.prod(target) == math.prod(produced) else None

    def apply(self, outcome: InferOutcome) -> InferOutcome:
        if not isinstance(outcome, InferResponse):
            return outcome
        for name, array in outcome.outputs.items():
            if name not in self.outputs:
                continue
            target = self.shape(name, array.shape)
            if target is None:
                model_shape, dims = self.outputs[name]
                batch = "the batch dimension, then " if self.batched else ""
                return internal(
                    f"output '{name}' of model '{self.model}' has shape {list(array.shape)}, which its config's "
                    f"reshape cannot send as dims {list(dims)}: the model must produce {batch}"
                    f"reshape {{ shape: {list(model_shape)} }}"
                )
            outcome.outputs[name] = array.reshape(target)
        return outcome
