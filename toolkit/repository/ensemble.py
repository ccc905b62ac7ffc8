"""Ensembles across models, as tritonserver's model repository manager resolves them.

1. ConnectDependencyGraph: every step names a model whose config was accepted, else
   "ensemble E contains models that are not available or ambiguous: M" (the first missing one);
2. CircularDependencyCheck: "circular dependency between ensembles: A -> ... -> B -> A", set on
   the nodes of the chain the way Triton sets it;
3. once its composing models are loaded (CheckNode): each composing model is valid, has a loaded
   version, and the versions steps require are loaded;
4. ValidateEnsembleConfig (ensemble_utils.cc): max_batch_size, input and output maps, data types
   and shapes consistent along the data flow; it also sets the ensemble's
   `model_transaction_policy { decoupled }`, which then shows in its config;
5. then the ensemble itself loads (its version directories).

Nested ensembles are resolved after the ensembles they use, as Triton does. Messages are
tritonserver 2.51's (tests/oracle).
"""

from __future__ import annotations

from typing import Any, Callable

from google.protobuf.message import Message

from handlers.config.ensemble import validate_ensemble_config as _validate_ensemble_config
from handlers.config.errors import ConfigError

from .compiled import CompiledModel, CompiledRepository
from .errors import STAGE_ENSEMBLE, ModelError, UnsupportedModelError
from .model_config import to_triton_json


def validate_ensemble_config(ensemble: dict[str, Any], composing: dict[str, dict[str, Any]]) -> bool:
    """ValidateEnsembleConfig over completed (Triton JSON) configs: the rule's one implementation
    (handlers/config/ensemble.py, which the image build also runs); whether the ensemble is
    decoupled."""
    try:
        return _validate_ensemble_config(ensemble, composing)
    except ConfigError as exc:
        raise ModelError(exc.message, hint=exc.hint) from None


def _load_failure_message(error: ModelError) -> str:
    """How tritonserver reports a model's failed load to the ensembles that depend on it."""
    if error.versions:
        return "".join(f"version {v} is at UNAVAILABLE state: {error.code}: {error.message};" for v in error.versions)
    return error.message


def _fail(name: str, message: str, cls: type[ModelError] = ModelError, about: str | None = None) -> ModelError:
    """An ensemble's error; `about` is the composing model (or tensor) the config line shows."""
    hint = f'"{about}"' if about else "ensemble_scheduling"
    return cls(message, model=name, stage=STAGE_ENSEMBLE, hint=hint)


def resolve_ensembles(
    result: CompiledRepository,
    ensembles: dict[str, Message],
    accepted: set[str],
    load: Callable[[str, list[str]], CompiledModel],
) -> None:
    """Resolve the ensembles whose config was accepted (`ensembles`), given the models whose
    config was accepted (`accepted`) and the load results of the others in `result`; `load`
    loads an ensemble itself (its versions). Outcomes go to `result.models` / `result.failures`."""
    steps: dict[str, list[tuple[str, int]]] = {
        name: [(s.model_name, int(s.model_version)) for s in config.ensemble_scheduling.step]
        for name, config in ensembles.items()
    }
    status: dict[str, ModelError | None] = {name: None for name in ensembles}

    def upstreams(name: str) -> list[str]:
        return list(dict.fromkeys(m for m, _ in steps.get(name, []) if m in accepted))

    # ConnectDependencyGraph: the status names the first step model that is not available.
    for name in sorted(ensembles):
        for model, _ in steps[name]:
            if model not in accepted:
                status[name] = _fail(
                    name, f"ensemble {name} contains models that are not available or ambiguous: {model}", about=model
                )
                break

    # CircularDependencyCheck, including the way Triton propagates the status along the chain.
    def circular(current: str, start: str, path: set[str]) -> ModelError | None:
        for up in upstreams(current):
            if up == start:
                return _fail(
                    start, f"circular dependency between ensembles: {start} -> ... -> {current} -> {start}", about=up
                )
            if up in path:
                continue  # a cycle that does not return to `start` (tritonserver recurses forever)
            error = circular(up, start, path | {up})
            if error is not None:
                if current in status:
                    status[current] = _fail(current, error.message)
                return error
        return None

    for name in sorted(ensembles):
        if status[name] is None:
            error = circular(name, name, {name})
            if error is not None:
                status[name] = error

    # CheckNode in dependency order, then ValidateEnsembleConfig and the ensemble's own load.
    checked = {n for n in accepted if n not in ensembles}
    remaining = sorted(ensembles)
    while remaining:
        progressed = False
        for name in list(remaining):
            error = status[name]
            if error is None and not all(up in checked for up in upstreams(name)):
                continue
            remaining.remove(name)
            checked.add(name)
            progressed = True
            if error is None:
                error = _check_upstreams(name, steps[name], status, result)
            decoupled = False
            if error is None:
                try:
                    decoupled = validate_ensemble_config(
                        to_triton_json(ensembles[name]),
                        {m: result.models[m].config for m, _ in steps[name]},
                    )
                except ModelError as exc:
                    error = _fail(name, exc.message, about=exc.hint)
            if error is not None:
                status[name] = error
                result.failures[name] = error
                continue
            # ValidateEnsembleConfig marks the ensemble decoupled when a step of its data flow is;
            # the ensemble then streams (handlers/backends/ensemble.py).
            policy = ensembles[name].model_transaction_policy
            policy.SetInParent()
            policy.decoupled = decoupled
            try:
                result.models[name] = load(name, [])
            except ModelError as exc:
                result.failures[name] = exc
        if not progressed:  # cannot happen: cycles carry a status; kept as a guard
            for name in remaining:
                result.failures[name] = _fail(name, f"ensemble '{name}' could not be resolved")
            break


def _check_upstreams(
    name: str, steps: list[tuple[str, int]], status: dict[str, ModelError | None], result: CompiledRepository
) -> ModelError | None:
    """CheckNode: the composing models' state, in step order."""
    required: dict[str, list[int]] = {}
    for model, version in steps:
        required.setdefault(model, []).append(version)
    for model, versions in required.items():
        upstream_status = status.get(model)
        if upstream_status is not None:
            return _fail(
                name,
                f"ensemble '{name}' depends on '{model}' which is not valid. Model '{model}' failed with error: "
                f"{upstream_status.message}",
                about=model,
            )
        failure = result.failures.get(model)
        if failure is not None and failure.unsupported:
            return _fail(
                name,
                f"ensemble '{name}' depends on '{model}', which cannot be served here: {failure.message}",
                UnsupportedModelError,
                about=model,
            )
        if failure is not None or model not in result.models:
            message = f"ensemble '{name}' depends on '{model}' which has no loaded version."
            if failure is not None:
                message += f" Model '{model}' loading failed with error: {_load_failure_message(failure)}"
            return _fail(name, message, about=model)
        error = None
        for version in versions:
            if version != -1 and version not in result.models[model].versions:
                error = _fail(
                    name,
                    f"ensemble '{name}' depends on '{model}' whose required version {version} is not loaded.",
                    about=model,
                )
        if error is not None:
            return error
    return None
