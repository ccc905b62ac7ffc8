"""`pb_utils.ModelConfig`: what `auto_complete_config(auto_complete_model_config)` receives.

The model sees the normalised config as a dict (`as_dict()`, Triton's config JSON) and may add
inputs and outputs, set max_batch_size, dynamic batching and the transaction policy, with the
python backend's checks and messages (triton_python_backend_utils.py, r24.10). Triton then keeps
only some fields of what comes back (`TritonModel::UpdateModelConfig`); the toolkit applies that
rule at compile time (toolkit/repository/python_autocomplete.py).
"""

from __future__ import annotations

import json
from typing import Any

_INPUT_PROPERTIES = ("name", "data_type", "dims", "optional")
_OUTPUT_PROPERTIES = ("name", "data_type", "dims")


class ModelConfig:
    def __init__(self, model_config: str) -> None:
        self._model_config = json.loads(model_config)

    def as_dict(self) -> dict[str, Any]:
        return self._model_config

    @property
    def _name(self) -> str:
        return str(self._model_config.get("name", ""))

    def set_max_batch_size(self, max_batch_size: int) -> None:
        configured = self._model_config["max_batch_size"]
        if configured > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {configured}, but in auto-complete-config function for "
                f"model '{self._name}' specified max_batch_size {max_batch_size}"
            )
        self._model_config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        for scheduler in ("sequence_batching", "ensemble_scheduling"):
            if scheduler in self._model_config:
                raise ValueError(
                    f"Configuration specified scheduling_choice as '{scheduler}', but auto-complete-config function "
                    f"for model '{self._name}' tries to set scheduling_choice as 'dynamic_batching'"
                )
        self._model_config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:
        self._add("input", input, _INPUT_PROPERTIES)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output, _OUTPUT_PROPERTIES)

    def _add(self, kind: str, tensor: dict[str, Any], allowed: tuple[str, ...]) -> None:
        name = self._name
        for key in tensor:
            if key not in allowed:
                listed = ", ".join(f"'{p}'" for p in allowed[:-1]) + f" and '{allowed[-1]}'"
                raise ValueError(
                    f"{kind} '{tensor.get('name')}' in auto-complete-config function for model '{name}' contains "
                    f"property other than {listed}."
                )
        if "name" not in tensor:
            raise ValueError(f"{kind} in auto-complete-config function for model '{name}' is missing 'name' property.")
        for required in ("data_type", "dims"):
            if required not in tensor:
                raise ValueError(
                    f"{kind} '{tensor['name']}' in auto-complete-config function for model '{name}' is missing "
                    f"'{required}' property."
                )
        for current in self._model_config[kind]:
            if current["name"] != tensor["name"]:
                continue
            if current["data_type"] != "TYPE_INVALID" and current["data_type"] != tensor["data_type"]:
                raise ValueError(
                    f"unable to load model '{name}', configuration expects datatype {current['data_type']} for {kind} "
                    f"'{tensor['name']}', model provides {tensor['data_type']}"
                )
            if current["dims"] and current["dims"] != tensor["dims"]:
                raise ValueError(
                    f"model '{name}', tensor '{tensor['name']}': the model expects dims {tensor['dims']} but the model "
                    f"configuration specifies dims {current['dims']}"
                )
            if kind == "input" and "optional" in current and "optional" in tensor and current["optional"] != tensor["optional"]:
                raise ValueError(
                    f"model '{name}', tensor '{tensor['name']}': the model expects optional {tensor['optional']} but the "
                    f"model configuration specifies optional {current['optional']}"
                )
            current["data_type"] = tensor["data_type"]
            current["dims"] = tensor["dims"]
            if kind == "input" and "optional" in tensor:
                current["optional"] = tensor["optional"]
            return
        self._model_config[kind].append(tensor)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        name = self._name
        for key in transaction_policy_dict:
            if key != "decoupled":
                raise ValueError(
                    f"model transaction property in auto-complete-config function for model '{name}' contains "
                    "property other than 'decoupled'."
                )
        policy = self._model_config.setdefault("model_transaction_policy", {})
        if "decoupled" in transaction_policy_dict:
            wanted = transaction_policy_dict["decoupled"]
            if "decoupled" in policy and policy["decoupled"] != wanted:
                raise ValueError(
                    f"trying to change decoupled property in auto-complete-config for model '{name}', which is already "
                    f"set to '{policy['decoupled']}'."
                )
            policy["decoupled"] = wanted
