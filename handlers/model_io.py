"""A model's inputs and outputs as the request path reads them, taken once from its config.

`ModelIO(config)` holds what validating a request (handlers/protocol/validation.py) and encoding
its response (handlers/protocol/codec.py) would otherwise derive from the config JSON on every
request: the inputs and outputs by name, their protocol datatypes and dims, which inputs are
required or shape tensors, and max_batch_size. A loaded model keeps one (`LoadedModel.io`); the
functions that take a config build one when they are not given it, so both ways answer alike.
The config must not change after the ModelIO is made (a loaded model's never does).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .datatypes import from_config_type

__all__ = ["ModelIO"]


class ModelIO:
    __slots__ = (
        "batched",
        "input_datatypes",
        "input_dims",
        "inputs",
        "max_batch_size",
        "output_datatypes",
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

    def output_types(self) -> dict[str, str]:
        """The outputs' protocol datatypes by name, for encoding a response; a config output
        without data_type raises KeyError('data_type'), as reading it from the config would."""
        if None in self.output_datatypes.values():
            raise KeyError("data_type")
        return self.output_datatypes  # type: ignore[return-value]
