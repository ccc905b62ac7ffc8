"""Turn an oracle corpus group (tests/oracle/corpus/<group>/) into a model repository.

The corpus is committed as text only. Two kinds of file are expanded on the way:

* an empty `.py` file (`model.py`, or the file `default_model_filename` names) becomes
  `trivial_model.py` (every python model of the corpus is the same trivial model; only its
  config matters);
* `<name>.onnx.json` becomes `<name>.onnx`, a tiny ONNX model built with onnx.helper from the
  spec in the file: {"builder": "<function in onnx_models.py>", ...keyword arguments}.

Everything else is copied as it is. `ORACLE.json` at the top of a group holds options for
record.py (it is not copied).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from . import onnx_models

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
TRIVIAL_MODEL = HERE / "trivial_model.py"
GROUP_OPTIONS = "ORACLE.json"
ONNX_SPEC_SUFFIX = ".onnx.json"


def groups() -> list[str]:
    return sorted(p.name for p in CORPUS.iterdir() if p.is_dir())


def group_options(group: str) -> dict:
    path = CORPUS / group / GROUP_OPTIONS
    return json.loads(path.read_text()) if path.is_file() else {}


def models(group: str) -> list[str]:
    return sorted(p.name for p in (CORPUS / group).iterdir() if p.is_dir())


def materialize(group: str, destination: Path, only: list[str] | None = None) -> Path:
    """Write the repository of `group` (or of the models `only`) under `destination`."""
    source = CORPUS / group
    destination.mkdir(parents=True, exist_ok=True)
    for model in models(group):
        if only is not None and model not in only:
            continue
        for path in sorted((source / model).rglob("*")):
            target = destination / model / path.relative_to(source / model)
            if path.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if path.name.endswith(ONNX_SPEC_SUFFIX):
                spec = json.loads(path.read_text())
                builder = getattr(onnx_models, spec.pop("builder"))
                builder(target.with_name(path.name[: -len(".json")]), **spec)
            elif path.suffix == ".py" and path.stat().st_size == 0:
                shutil.copyfile(TRIVIAL_MODEL, target)
            else:
                shutil.copyfile(path, target)
        (destination / model).mkdir(parents=True, exist_ok=True)
    return destination
