"""Load a fil model file in a child process, for `toolkit validate` / `build` / `serve`.

Treelite's loaders trust their input: a damaged Treelite checkpoint loads, and the first
prediction that walks into the damage crashes the process (measured: 1 in 30 randomly damaged
checkpoints ends in SIGSEGV). The compiler therefore loads each model file in a process of its
own (`python -m handlers.backends.fil.probe`, a JSON request on stdin, the answer on stdout),
checks its trees (Forest.check_structure) and predicts a few rows there (FilModel.verify), so a
bad file is an error of its model instead of a crash of the toolkit or, later, of the server;
the runtime loads files that passed this check.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .errors import CODE_INTERNAL, FilModelError

PROBE_MODULE = "handlers.backends.fil.probe"
_ROOT = str(Path(__file__).resolve().parents[3])  # the folder holding the `handlers` package
# Time to read a model: a minute, plus a second per 2 MB (Treelite reads JSON at >= 20 MB/s on
# one slow core). A damaged checkpoint can also make Treelite's reader loop without end.
BASE_TIMEOUT_S = 60.0
BYTES_PER_SECOND = 2e6


def default_timeout(path: Path) -> float:
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    return BASE_TIMEOUT_S + size / BYTES_PER_SECOND


def probe(config: Mapping[str, Any], path: Path, *, timeout: float | None = None) -> None:
    """Load `path` as the model of `config` (FIL's parameters, checked against its tensors) in
    a child process; FilModelError when it fails, the child dies or does not finish in `timeout`
    seconds (default_timeout)."""
    timeout = default_timeout(path) if timeout is None else timeout
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH", "")) if p)
    request = json.dumps({"config": config, "path": str(path)})
    name = config.get("name", "")
    try:
        done = subprocess.run([sys.executable, "-m", PROBE_MODULE], input=request, capture_output=True, text=True,
                              timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise FilModelError(
            f"Treelite did not finish reading model file '{path}' of model '{name}' within {timeout:.0f} s",
            code=CODE_INTERNAL,
            file=str(path),
            detail="the file is damaged (a damaged Treelite checkpoint can make its reader loop without end), or "
            "too large to read in that time",
        ) from None
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        if done.returncode < 0:
            what = signal.Signals(-done.returncode).name
            raise FilModelError(
                f"Treelite crashed ({what}) while reading model file '{path}' of model '{name}'",
                code=CODE_INTERNAL,
                file=str(path),
                detail="the file is damaged, or is not a model of its model_type's format; tritonserver would crash "
                "loading it",
            ) from None
        tail = (done.stderr or done.stdout).strip()[-2000:]
        raise FilModelError(f"could not check model file '{path}' of model '{name}' (exit status {done.returncode})",
                            code=CODE_INTERNAL, file=str(path), detail=tail or None) from None
    error = answer.get("error")
    if error is not None:
        raise FilModelError(error["message"], code=error["code"], key=error["key"], detail=error["detail"],
                            file=error["file"])


def _main() -> None:
    from .model import load_model
    from .parameters import parse_parameters
    from .tensors import tensor_layout

    request = json.load(sys.stdin)
    config = request["config"]
    try:
        path = Path(request["path"])
        model = load_model(path, config, parse_parameters(config), tensor_layout(config))
        model.verify(path)
        model.close()
    except FilModelError as exc:
        answer: dict[str, Any] = {"error": {"message": exc.message, "code": exc.code, "key": exc.key,
                                            "detail": exc.detail, "file": exc.file}}
    else:
        answer = {"ok": True}
    sys.stdout.write("\n" + json.dumps(answer) + "\n")


if __name__ == "__main__":
    _main()
