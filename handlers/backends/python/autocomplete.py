"""Run a Python model's `auto_complete_config` (python -m handlers.backends.python.autocomplete).

The toolkit's compiler runs this in a process of its own (Triton does the same: an auto-complete
stub process), in the environment that has the model's dependencies: `toolkit serve`'s, or the
image's at build time. It reads one JSON request on stdin,

    {"model_file": ".../1/model.py", "model_dir": "...", "version": 1, "config": {<config JSON>}}

imports model.py as Triton does (model_runner), calls `TritonPythonModel.auto_complete_config`
when the class has one with a `pb_utils.ModelConfig` built from the config JSON, and writes one
JSON answer on stdout: {"config": {...}} (the dict the model returned) or {"error": "..."} with
Triton's message (plus "import_error": true and "missing_module" when importing a dependency
failed). Whatever the model prints goes to stderr. `autocomplete_process.py` runs it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from . import host
from .model_runner import ModelRunner, describe_exception, install_pb_utils


def run(request: dict[str, Any]) -> dict[str, Any]:
    install_pb_utils()
    from .model_config import ModelConfig

    config = request["config"]
    name = str(config.get("name", ""))
    runner = ModelRunner(
        model_file=Path(request["model_file"]),
        model_dir=Path(request["model_dir"]),
        version=int(request["version"]),
        config=config,
        instance_name=name,
    )
    token = host.enter_context(runner.context.with_phase(host.Phase.AUTO_COMPLETE))
    try:
        if runner.model_file.suffix != ".py":
            return {"error": f'Model name must end with \'.py\'. Model name is "{runner.model_file.name}".'}
        try:
            module = runner._import()
            model_class = module.TritonPythonModel
            model_config: Any = ModelConfig(json.dumps(config))
            if hasattr(model_class, "auto_complete_config"):
                model_config = model_class.auto_complete_config(model_config)
        except ImportError as exc:
            # A dependency that is not installed where this runs: the caller may run it again
            # where it is (toolkit build defers such models to the image build).
            return {"error": describe_exception(exc), "import_error": True, "missing_module": exc.name}
        except Exception as exc:  # noqa: BLE001 - anything the model's code raises
            return {"error": describe_exception(exc)}
        if not isinstance(model_config, ModelConfig):
            return {"error": f"auto_complete_config function in model '{name}' must return a valid pb.ModelConfig object."}
        try:
            return {"config": json.loads(json.dumps(model_config._model_config))}
        except (TypeError, ValueError) as exc:
            return {"error": f"auto_complete_config function in model '{name}' returned a configuration that is not JSON: {exc}"}
    finally:
        host.leave_context(token)


def main() -> int:
    answer_fd = os.dup(1)
    os.dup2(2, 1)  # the model's prints must not mix with the answer
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    request = json.loads(sys.stdin.read())
    answer = run(request)
    with os.fdopen(answer_fd, "w") as out:
        json.dump(answer, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
