"""Ensembles' rules on Triton's config JSON, with tritonserver 2.51's messages.

- `validate_ensemble_scheduling`: ValidateEnsembleSchedulingConfig (core model_config_utils.cc),
  part of ValidateModelConfig: one ensemble's own steps and data flow (every output written, no
  tensor unused); `hint` is the config.pbtxt token to point at.
- `validate_ensemble_config`: ValidateEnsembleConfig (core ensemble_utils.cc), once the
  composing models are loaded: the ensemble's max_batch_size, the input and output maps, and one
  data type and a compatible shape per ensemble tensor along the data flow; `hint` names the
  composing model or tensor concerned. It also walks the data flow from the ensemble's inputs,
  labelling each tensor with the decoupled step it descends from, refuses a step (or the ensemble's
  outputs) fed by two different labels, and returns whether any step on the way is decoupled:
  the ensemble's own `model_transaction_policy { decoupled }`.

The compiler (toolkit/repository) and the image build's completion step (for ensembles calling a
python model completed in the image) both run these.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import ConfigError

Config = Mapping[str, Any]

ENSEMBLE_PLATFORM = "ensemble"


# --- ValidateEnsembleSchedulingConfig ------------------------------------------------------------


def validate_ensemble_scheduling(config: Config) -> None:
    name = config.get("name", "")
    if config.get("platform", "") != ENSEMBLE_PLATFORM:
        raise ConfigError(
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not {ENSEMBLE_PLATFORM}",
            hint="ensemble_scheduling",
        )
    if config.get("instance_group"):
        raise ConfigError(f"instance group should not be specified for ensemble '{name}'", hint="instance_group")
    if "optimization" in config:
        raise ConfigError(f"optimization should not be specified for ensemble '{name}'", hint="optimization")
    if config.get("model_warmup"):
        raise ConfigError(f"model_warmup can not be specified for ensemble '{name}'", hint="model_warmup")
    steps = config["ensemble_scheduling"].get("step", [])
    if not steps:
        raise ConfigError(f"must specify 'step' for ensemble '{name}'", hint="ensemble_scheduling")

    # The data-flow graph: one node per ensemble tensor.
    is_output: dict[str, bool] = {}
    prev: dict[str, list[str]] = {}
    nxt: dict[str, list[str]] = {}
    order: list[str] = []

    def node(tensor: str, output: bool) -> None:
        if tensor not in is_output:
            is_output[tensor] = output
            prev[tensor] = []
            nxt[tensor] = []
            order.append(tensor)

    for idx, step in enumerate(steps):
        if not step.get("model_name", ""):
            raise ConfigError(f"must specify 'model_name' in step {idx} of ensemble '{name}'", hint="step")
        input_map: Mapping[str, str] = step.get("input_map", {})
        output_map: Mapping[str, str] = step.get("output_map", {})
        if not input_map:
            raise ConfigError(f"must specify 'input_map' in step {idx} of ensemble '{name}'", hint="step")
        if not output_map:
            raise ConfigError(f"must specify 'output_map' in step {idx} of ensemble '{name}'", hint="step")
        produced: list[str] = []
        for _, tensor in sorted(output_map.items()):
            if tensor in is_output:
                if is_output[tensor]:
                    raise ConfigError(
                        f"ensemble tensor '{tensor}' can appear in an output map only once for ensemble "
                        f"'{name}' step {idx}",
                        hint=f'"{tensor}"',
                    )
                is_output[tensor] = True
            else:
                node(tensor, True)
            produced.append(tensor)
        for _, tensor in sorted(input_map.items()):
            node(tensor, False)
            for out in produced:
                prev[out].append(tensor)
                nxt[tensor].append(out)

    ready = {t: False for t in order}
    queue: list[str] = []
    for io in config.get("input", []):
        tensor = io.get("name", "")
        if tensor not in ready:
            raise ConfigError(f"ensemble input '{tensor}' for ensemble {name}' is not used", hint=f'"{tensor}"')
        ready[tensor] = True
        queue.append(tensor)
    while queue:
        current = queue.pop(0)
        for candidate in nxt[current]:
            if ready[candidate]:
                continue
            if all(ready[p] for p in prev[candidate]):
                ready[candidate] = True
                queue.append(candidate)

    outputs: set[str] = set()
    for io in config.get("output", []):
        tensor = io.get("name", "")
        if tensor not in ready:
            raise ConfigError(f"ensemble output '{tensor}' for ensemble {name}' is not used", hint=f'"{tensor}"')
        if not ready[tensor]:
            message = f"output '{tensor}' for ensemble '{name}' is not written"
            last = tensor
            seen: set[str] = set()
            frontier = prev[tensor]
            while frontier:
                following = None
                for p in frontier:
                    if not ready[p] and p not in seen:
                        seen.add(p)
                        last = p
                        following = prev[p]
                        break
                frontier = following or []
            if last != tensor:
                message += f": at least one of its depending tensors, '{last}', is not connected"
            raise ConfigError(message, hint=f'"{tensor}"')
        outputs.add(tensor)

    for tensor in sorted(order):
        if tensor in outputs:
            continue
        if not ready[tensor] or not nxt[tensor]:
            raise ConfigError(f"ensemble tensor '{tensor}' is unused in ensemble '{name}'", hint=f'"{tensor}"')


# --- ValidateEnsembleConfig ----------------------------------------------------------------------


def _shape(dims: list[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


class _Tensor:
    """TensorNode: a tensor's type and shape and the model it was inferred from; its place in the
    data flow (the tensors it is computed from and those computed from it) and, once visited, the
    decoupled step it descends from (`label`, 0: none)."""

    def __init__(self, model: str, batching: bool = False, data_type: str = "", dims: list[int] | None = None):
        self.model = model
        self.data_type = data_type
        self.dims = list(dims or [])
        self.full_dims = ([-1] if batching else []) + self.dims
        self.decoupled = False
        self.label = 0
        self.visited = False
        self.prev: list[_Tensor] = []
        self.next: list[_Tensor] = []
        self.sibling: _Tensor | None = None  # shared by the outputs of one step: one label per step


def _dims_match(a: list[int], b: list[int]) -> bool:
    """CompareDimsWithWildcard."""
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b))


def _consistent(lhs: _Tensor, rhs: _Tensor, prefix: str, tensor: str) -> None:
    """ValidateTensorConsistency."""
    if lhs.data_type != rhs.data_type:
        raise ConfigError(
            f"{prefix}inconsistent data type: {lhs.data_type} is inferred from model {lhs.model} while "
            f"{rhs.data_type} is inferred from model {rhs.model}",
            hint=tensor,
        )
    if not _dims_match(lhs.dims, rhs.dims) and not _dims_match(lhs.full_dims, rhs.full_dims):
        raise ConfigError(
            f"{prefix}inconsistent shape: {_shape(lhs.full_dims)} is inferred from model {lhs.model} while "
            f"{_shape(rhs.full_dims)} is inferred from model {rhs.model}",
            hint=tensor,
        )


def _io_dims(io: Config) -> list[int]:
    if "reshape" in io:
        return list(io["reshape"].get("shape", []))
    return list(io.get("dims", []))


def validate_ensemble_config(ensemble: Config, composing: Mapping[str, Config]) -> bool:
    """ConfigError with Triton's message when `ensemble`'s steps do not fit the `composing`
    models' configs (by model name); else whether the ensemble is decoupled."""
    name = ensemble["name"]
    ensemble_mbs = int(ensemble.get("max_batch_size", 0))
    batching = ensemble_mbs > 0
    tensors: dict[str, _Tensor] = {}
    for io in ensemble.get("input", []):
        tensors.setdefault(io["name"], _Tensor(name, batching, io["data_type"], _io_dims(io)))
    sink = _Tensor(name)  # the ensemble's response: fed by all of its outputs
    for io in ensemble.get("output", []):
        tensor = tensors.setdefault(io["name"], _Tensor(name, batching, io["data_type"], _io_dims(io)))
        sink.prev.append(tensor)
        tensor.next.append(sink)

    for step in ensemble["ensemble_scheduling"]["step"]:
        model = step["model_name"]
        config = composing[model]
        mbs = int(config.get("max_batch_size", 0))
        if mbs != 0 and mbs < ensemble_mbs:
            raise ConfigError(
                f"ensemble {name} allows maximum batch size {ensemble_mbs}, but it contains model {model} which "
                f"only allows maximum batch size to be {mbs}",
                hint=model,
            )
        step_batching = mbs > 0
        input_map: Mapping[str, str] = step.get("input_map", {})
        output_map: Mapping[str, str] = step.get("output_map", {})
        prefix = f"in ensemble {name}, "

        input_names = {io["name"] for io in config.get("input", [])}
        for model_input, tensor in input_map.items():
            if model_input not in input_names:
                raise ConfigError(
                    f"{prefix}ensemble tensor {tensor} is mapping to non-existing input {model_input} in model {model}",
                    hint=model_input,
                )
        for io in config.get("input", []):
            if io["name"] in input_map:
                tensor = input_map[io["name"]]
                node = _Tensor(model, step_batching, io["data_type"], list(io.get("dims", [])))
                if tensor in tensors:
                    _consistent(tensors[tensor], node, f"{prefix}ensemble tensor {tensor}: ", tensor)
                else:
                    tensors[tensor] = node
            elif not io.get("optional", False):
                raise ConfigError(
                    f"{prefix}input {io['name']} in model {model} is not mapped to any ensemble tensors", hint=model
                )

        outputs = {io["name"]: io for io in config.get("output", [])}
        for model_output, tensor in output_map.items():
            if model_output not in outputs:
                raise ConfigError(
                    f"{prefix}ensemble tensor {tensor} is mapped from non-existing output {model_output} in model {model}",
                    hint=model_output,
                )
        sibling = _Tensor(model)
        for model_output, tensor in output_map.items():
            io = outputs[model_output]
            node = _Tensor(model, step_batching, io["data_type"], list(io.get("dims", [])))
            if tensor in tensors:
                _consistent(tensors[tensor], node, f"{prefix}ensemble tensor {tensor}: ", tensor)
            else:
                tensors[tensor] = node
            tensors[tensor].sibling = sibling
        decoupled = bool((config.get("model_transaction_policy") or {}).get("decoupled", False))
        for tensor in output_map.values():  # link the data flow
            node = tensors[tensor]
            node.decoupled = decoupled
            for source in input_map.values():
                node.prev.append(tensors[source])
                tensors[source].next.append(node)
    return _decoupled_labels(name, [tensors[io["name"]] for io in ensemble.get("input", [])])


def _decoupled_labels(name: str, inputs: list[_Tensor]) -> bool:
    """ValidateEnsembleConfig's walk of the data flow, breadth first from the ensemble's inputs: a
    tensor gets the label of the tensors it is computed from, or a new one where a decoupled step
    computes it (the outputs of one step share one); a step fed by two labels is refused, as are
    outputs of the ensemble from two. True when some label was made: the ensemble is decoupled."""
    made = 0
    queue = list(inputs)
    for tensor in queue:
        tensor.visited = True
    while queue:
        current = queue.pop(0)
        for candidate in current.next:
            if candidate.visited or not all(p.visited for p in candidate.prev):
                continue
            label = candidate.prev[0].label
            if any(p.label != label for p in candidate.prev):
                raise ConfigError(
                    f"in ensemble {name}, step of model '{candidate.model}' receives inputs originated from different "
                    "decoupled models",
                    hint=candidate.model,
                )
            sibling = candidate.sibling
            if sibling is not None and sibling.visited:
                candidate.label = sibling.label
            else:
                if candidate.decoupled:
                    made += 1
                    label = made
                candidate.label = label
                if sibling is not None:
                    sibling.label, sibling.visited = label, True
            candidate.visited = True
            queue.append(candidate)
    return made != 0


__all__ = ["ENSEMBLE_PLATFORM", "validate_ensemble_config", "validate_ensemble_scheduling"]
