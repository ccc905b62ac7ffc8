"""scripts/decoupled_examples.py, which runs python_backend's decoupled examples unchanged from a
user's checkout (Triton's files cannot be committed or fetched in CI): here it runs on a checkout
laid out as python_backend's, holding this project's equivalent models
(tests/python_models/decoupled_{repeat,square}.py with the examples' configs) and clients
(tests/decoupled_clients, which stream over gRPC to localhost:8001 as the examples do, redirected
to the server's free port). The real examples' run is recorded in docs/python-backend.md."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from decoupled_repository import CONFIGS, DECOUPLED

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import decoupled_examples  # noqa: E402


def _checkout(root: Path) -> Path:
    folder = root / "examples" / "decoupled"
    folder.mkdir(parents=True)
    here = Path(__file__).resolve().parent
    for name, model in (("repeat", "repeat"), ("square", "square")):
        fixture, config = CONFIGS[model]
        shutil.copyfile(here / "python_models" / fixture, folder / f"{name}_model.py")
        text = config.replace("@DECOUPLED@", DECOUPLED).replace("@MODE@", "")
        (folder / f"{name}_config.pbtxt").write_text(f'name: "{name}_int32"\n{text}')
        shutil.copyfile(here / "decoupled_clients" / f"{name}_client.py", folder / f"{name}_client.py")
    return root


def test_the_examples_script_serves_the_models_and_runs_the_clients(tmp_path):
    results = decoupled_examples.run_examples(_checkout(tmp_path / "python_backend"), free_ports=True)
    by_example = {r["example"]: r for r in results}
    for client, line in (("decoupled/repeat_client.py", "PASS: repeat_int32"), ("decoupled/square_client.py", "PASS: square_int32")):
        assert by_example[client]["status"] == "PASS", by_example[client]
        assert by_example[client]["pass_line"] == line and by_example[client]["ports"] == "redirected"
    for client in ("bls_decoupled/sync_client.py", "bls_decoupled/async_client.py"):
        assert by_example[client]["status"] == "not run" and "is not in this checkout" in by_example[client]["why"]
