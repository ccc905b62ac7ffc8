"""`toolkit validate` against real tritonserver 2.51.0, model by model.

tests/oracle/corpus holds small repositories (groups) of valid and invalid models;
tests/oracle/expected.json holds what tritonserver itself said about each model, recorded by
tests/oracle/record.py from a real run (never typed by hand). This test compiles the same
repositories with the toolkit, in the same two modes, and requires for every model:

* the same verdict: tritonserver READY <=> toolkit READY. A model whose reason is "unable to find
  backend library" passed tritonserver's own checks (the oracle build has only the python
  backend), so the toolkit must accept it too;
* for a refused model, the same message, after this normalisation of tritonserver's text:
  - the temporary repository path is "$REPO" on both sides;
  - the status code tritonserver puts before load-time errors ("Invalid argument: ",
    "Internal: ") is dropped: the toolkit keeps it in `ModelError.code`;
* the same stage: INVALID (refused when the repository is read) <=> stage "config";
  UNAVAILABLE (the load failed) <=> stage "load" or "ensemble";
* the same versions for a model both accept.

Circular dependencies between ensembles are the one place where tritonserver's log does not say
which model a message belongs to (it gives every ensemble of a cycle one of the cycle's messages,
depending on the order it checks them), so for those the group's messages are compared as a whole.

Deliberate differences are listed in DEVIATIONS, each with its reason (and in
docs/triton-compatibility.md); they are asserted too, so a deviation cannot widen silently.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from oracle.materialize import CORPUS, materialize
from toolkit.repository.compile import CompiledRepository, compile_repository

EXPECTED = json.loads((Path(__file__).parent / "oracle" / "expected.json").read_text())
STATUS_PREFIX = re.compile(r"^(Invalid argument|Internal|Not found|Unavailable|Unknown|Unsupported|Already exists): ")
BACKEND_MISSING = "unable to find backend library"

# (group, model) -> what the toolkit does instead, and why. "modes" limits a deviation to some
# modes. "expect": "ready" (the toolkit accepts, with a warning containing "warning"),
# "unsupported" (a valid Triton config this product does not serve; `contains` is in the message)
# or "failed" (both refuse, with a different message containing `contains`).
DEVIATIONS: dict[tuple[str, str], dict] = {
    ("core", "instances_kind_gpu"): {
        "expect": "ready",
        "warning": "mapped to KIND_CPU",
        "why": "instances are computed for the target device (--device cpu here), not the build host; "
        "a CPU target runs KIND_GPU groups on the CPU (tritonserver on a GPU-less host refuses them)",
    },
    ("core", "instances_kind_gpu_ids"): {
        "expect": "ready",
        "warning": "mapped to KIND_CPU with count 4",
        "why": "as instances_kind_gpu: 2 instances on each of 2 GPUs become 4 CPU instances",
    },
    ("core", "backend_tensorrt"): {"expect": "unsupported", "contains": "backend 'tensorrt'", "why": "TensorRT"},
    ("core", "platform_libtorch"): {
        "expect": "failed",
        "contains": "unable to find '",
        "why": "the oracle's tritonserver has no pytorch backend (\"unable to find backend library\"); the toolkit runs "
        "the backend's own checks, and the model's version directory holds no model.pt (ModelState::LoadModel)",
    },
    ("core", "custom.identity"): {"expect": "unsupported", "contains": "backend 'identity'", "why": "custom backend"},
    ("crashes", "c_version_negative"): {
        "expect": "failed",
        "contains": "gives the negative version -1",
        "why": "tritonserver loads a lone '-1' directory as version -1, but hangs when it loads it next to "
        "another version (c_version_negative_and_positive): negative versions are refused",
    },
    ("warmup", "w_file_escapes_no_warmup_dir"): {
        "expect": "failed",
        "contains": "outside the model's warmup directory",
        "why": "tritonserver would read any file a warmup sample names (here it fails only because "
        "the model has no warmup/ directory)",
    },
}


# Models tritonserver's own checks accept but its onnxruntime backend refuses: the oracle build
# has no onnxruntime backend ("unable to find backend library"), so these checks are the
# toolkit's rendering of the backend's (onnx_autocomplete.py, tests/test_onnx_autocomplete.py).
# In autofill mode tritonserver validates inputs and outputs only after the backend auto-completed
# them, so there a config error also shows up after the backend: the strict run of the same model
# shows tritonserver's message for it.
AFTER_BACKEND: dict[tuple[str, str, str], str] = {
    ("onnx", "strict", "add_sub_name_only"): "configuration expects 0 inputs, model provides 2",
    ("onnx", "autofill", "text_detection_negative_dim"): "dimension must be integer >= 1",
}


# Models that alone make tritonserver 2.51 abort or hang (state "CRASH" in expected.json): the
# toolkit must refuse them cleanly, with a message that says what is wrong.
CRASHES: dict[str, str] = {
    "c_version_out_of_range": "out of the range of a 64-bit version number",
    "c_version_negative_and_positive": "gives the negative version -1",
    "c_python_model_file_missing": "Python model file not found",
    "c_warmup_file_is_directory": "Is a directory",
    "c_warmup_huge": "more than the 1073741824 a warmup sample may use",
    # an ensemble using a cycle it is not part of: tritonserver's circular-dependency check
    # recurses without end (the three are loaded together)
    "c_cycle_behind": "depends on 'c_cycle_b' which is not valid",
    "c_cycle_b": "circular dependency between ensembles: c_cycle_b -> ... -> c_cycle_c -> c_cycle_b",
    "c_cycle_c": "circular dependency between ensembles: c_cycle_c -> ... -> c_cycle_b -> c_cycle_c",
}


_compiled: dict[tuple[str, str], tuple[Path, CompiledRepository]] = {}


def compiled(group: str, mode: str, tmp_path_factory) -> tuple[Path, CompiledRepository]:
    key = (group, mode)
    if key not in _compiled:
        root = tmp_path_factory.mktemp(f"oracle-{group}-{mode}").resolve() / "models"
        materialize(group, root)
        _compiled[key] = (root, compile_repository(root, device="cpu", auto_complete=(mode == "autofill")))
    return _compiled[key]


CASES = [
    pytest.param(group, mode, model, id=f"{group}-{mode}-{model}")
    for group, by_mode in sorted(EXPECTED["groups"].items())
    for mode, recorded in sorted(by_mode.items())
    for model in sorted(recorded["models"])
]
GROUP_MODES = [
    pytest.param(group, mode, id=f"{group}-{mode}")
    for group, by_mode in sorted(EXPECTED["groups"].items())
    for mode in sorted(by_mode)
]


def test_corpus_and_expected_agree():
    """Every corpus model has a recorded verdict in both modes (rerun record.py after edits)."""
    on_disk = {
        (g.name, m.name) for g in CORPUS.iterdir() if g.is_dir() for m in g.iterdir() if m.is_dir()
    }
    for mode in ("strict", "autofill"):
        recorded = {
            (g, m) for g, by_mode in EXPECTED["groups"].items() for m in by_mode.get(mode, {}).get("models", {})
        }
        assert recorded == on_disk, f"{mode}: rerun tests/oracle/record.py"


def test_deviations_refer_to_corpus_models():
    for group, model in DEVIATIONS:
        assert model in EXPECTED["groups"][group]["strict"]["models"], (group, model)


@pytest.mark.parametrize("group, mode, model", CASES)
def test_toolkit_agrees_with_tritonserver(group, mode, model, tmp_path_factory):
    triton = EXPECTED["groups"][group][mode]["models"][model]
    assert triton["state"] != "UNKNOWN", "tritonserver gave no verdict: fix the corpus model"
    root, result = compiled(group, mode, tmp_path_factory)
    ours = result.models.get(model)
    error = result.failures.get(model)
    assert (ours is None) != (error is None), "the model must be selected exactly once"

    deviation = DEVIATIONS.get((group, model))
    if deviation and mode in deviation.get("modes", [mode]):
        expect = deviation["expect"]
        if expect == "ready":
            assert ours is not None, error
            assert any(deviation["warning"] in w for w in ours.warnings), ours.warnings
        else:
            assert error is not None
            assert error.unsupported == (expect == "unsupported"), error
            assert deviation["contains"] in error.message, error.message
        return

    if triton.get("circular"):
        assert error is not None and error.message.startswith("circular dependency between ensembles: ")
        assert error.stage == "ensemble"
        return  # the messages themselves: test_circular_dependency_messages

    if triton["state"] == "CRASH":
        assert error is not None, f"tritonserver crashes on {model} ({triton['reason']}); the toolkit accepts it"
        assert CRASHES[model] in error.message and error.stage in ("load", "ensemble"), error
        return

    after_backend = AFTER_BACKEND.get((group, mode, model))
    if after_backend is not None:
        assert BACKEND_MISSING in triton["reason"]
        assert error is not None and error.stage == "load" and after_backend in error.message, error
        return

    triton_passed = triton["state"] == "READY" or BACKEND_MISSING in triton["reason"]
    if triton_passed:
        assert error is None, f"tritonserver accepts {model}; the toolkit says: {error} [{error.stage}]"
        if triton["state"] == "READY":
            assert ours.versions == triton["versions"]
        return

    assert error is not None, f"tritonserver refuses {model} ({triton['reason']}); the toolkit accepts it"
    expected_message = STATUS_PREFIX.sub("", triton["reason"])
    assert error.message.replace(str(root), "$REPO") == expected_message
    if triton["state"] == "INVALID":
        assert error.stage == "config"
    else:
        assert error.stage in ("load", "ensemble")


@pytest.mark.parametrize("group, mode", GROUP_MODES)
def test_circular_dependency_messages(group, mode, tmp_path_factory):
    """The circular-dependency messages of a group, as a whole (see the module docstring)."""
    recorded = EXPECTED["groups"][group][mode]
    triton = sorted(STATUS_PREFIX.sub("", line) for line in recorded["circular"])
    if not triton:
        return
    _, result = compiled(group, mode, tmp_path_factory)
    ours = sorted(
        error.message
        for name, error in result.failures.items()
        if recorded["models"].get(name, {}).get("circular")
    )
    assert ours == triton


# Fields of tritonclient's ModelConfig that tritonserver 2.51's does not have.
NEWER_FIELDS = [("ensemble_scheduling", "max_inflight_requests")]

CONFIG_CASES = [
    pytest.param(group, mode, model, id=f"{group}-{mode}-{model}")
    for group, by_mode in sorted(EXPECTED["groups"].items())
    for mode, recorded in sorted(by_mode.items())
    for model in sorted(recorded.get("configs", {}))
    if (group, model) not in DEVIATIONS
]


@pytest.mark.parametrize("group, mode, model", CONFIG_CASES)
def test_completed_config_is_what_tritonserver_serves(group, mode, model, tmp_path_factory):
    """The config JSON the runtime gets is exactly tritonserver's GET /v2/models/<model>/config
    (for the models tritonserver loaded: python models and ensembles)."""
    triton = EXPECTED["groups"][group][mode]["configs"][model]
    root, result = compiled(group, mode, tmp_path_factory)
    assert model in result.models, result.failures.get(model)
    ours = json.loads(json.dumps(result.models[model].config).replace(str(root), "$REPO"))
    # The only normalisation: fields newer than tritonserver 2.51's ModelConfig (the toolkit uses
    # tritonclient's newer model_config.proto, whose JSON prints them with their defaults).
    for path in NEWER_FIELDS:
        *parents, leaf = path
        node = ours
        for key in parents:
            node = node.get(key, {})
        if isinstance(node, dict) and node.get(leaf) in (0, "", False, [], {}):
            node.pop(leaf)
    assert ours == triton
