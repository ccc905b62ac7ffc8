"""Python models whose auto_complete_config needs a package from their requirements.txt.

`toolkit validate` / `serve` (host compile) report the missing module with the pip command to run;
`toolkit build` defers such a model to the image build (the manifest says `"autocomplete":
"image"`) and the Dockerfile runs `python -m handlers.backends.python.complete` where the
requirements are installed. Here that image step runs for real, without a container engine: the
"image environment" is a PYTHONPATH holding the runtime copied into the build context and a
folder with the package (`acme_features`), which the host (this test process) cannot import.
The completed manifest is then served by the container entrypoint and read with tritonclient.

Expected Triton messages for the same models were recorded from tritonserver 2.51
(`scripts/tools/tritonserver validate --autofill` on the same model.py files, docs/tools.md).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from serving import free_port
from typer.testing import CliRunner

from toolkit.build.base_image import BaseImage
from toolkit.build.context import ImagePlan, render_context
from toolkit.build.errors import BuildError
from toolkit.build.hooks import python_autocomplete_command
from toolkit.build.runtime_deps import runtime_requirements
from toolkit.build.targets import LAMBDA_TASK_LAYOUT, OPT_LAYOUT, TARGETS
from toolkit.build.wheelhouse import ModelRequirements, Wheel, Wheelhouse, cache_key
from toolkit.cli import app
from toolkit.repository.compile import AUTOCOMPLETE_IMAGE, compile_repository

ROOT = Path(__file__).resolve().parents[1]

MODEL_PY = '''
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        import acme_features  # only in requirements.txt: the image has it, the host does not

        config.set_max_batch_size(acme_features.MAX_BATCH)
        config.add_input({"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]})
        config.add_output({"name": "FEATURES", "data_type": "TYPE_FP32", "dims": [acme_features.WIDTH]})
        config.set_dynamic_batching()
        return config

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.width = config["output"][0]["dims"][0]

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            lengths = np.array([[float(len(t[0]))] * self.width for t in text], dtype=np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("FEATURES", lengths)]))
        return responses
'''

ENSEMBLE_PBTXT = """
name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input [ { name: "RAW" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "SCORE" data_type: TYPE_FP32 dims: [ 3 ] } ]
ensemble_scheduling { step [
  { model_name: "featurize" model_version: -1 input_map { key: "TEXT" value: "RAW" } output_map { key: "FEATURES" value: "feat" } },
  { model_name: "score" model_version: -1 input_map { key: "X" value: "feat" } output_map { key: "Y" value: "SCORE" } }
] }
"""

SCORE_PBTXT = """
name: "score"
backend: "python"
max_batch_size: 8
input [ { name: "X" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] } ]
"""

SCORE_PY = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy() * 2)])
            for r in requests
        ]
'''


def write_model(repo: Path, name: str, source: str, config: str | None = None, requirements: str = "acme-features==0.1\n") -> Path:
    directory = repo / name
    (directory / "1").mkdir(parents=True, exist_ok=True)
    (directory / "1" / "model.py").write_text(textwrap.dedent(source))
    if config is not None:
        (directory / "config.pbtxt").write_text(textwrap.dedent(config).lstrip())
    if requirements:
        (directory / "requirements.txt").write_text(requirements)
    return directory


@pytest.fixture
def acme(tmp_path: Path) -> Path:
    """A folder with the `acme_features` package: the image's site-packages, in these tests."""
    folder = tmp_path / "image-site-packages"
    (folder / "acme_features").mkdir(parents=True)
    (folder / "acme_features" / "__init__.py").write_text("MAX_BATCH = 8\nWIDTH = 3\n")
    return folder


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    write_model(root, "featurize", MODEL_PY)
    write_model(root, "score", SCORE_PY, SCORE_PBTXT, requirements="")
    (root / "pipeline" / "1").mkdir(parents=True)
    (root / "pipeline" / "config.pbtxt").write_text(textwrap.dedent(ENSEMBLE_PBTXT).lstrip())
    return root


def run_image_step(manifest: Path, *pythonpath: Path) -> subprocess.CompletedProcess:
    """`python -m handlers.backends.python.complete MANIFEST` as the Dockerfile runs it, with
    PYTHONPATH = the image's folders only (the host's PYTHONPATH is not inherited)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join(str(p) for p in pythonpath)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "handlers.backends.python.complete", str(manifest)],
        capture_output=True, text=True, env=env, cwd=manifest.parent, timeout=300, check=False,
    )


# --- host compile ------------------------------------------------------------------------------------


def test_validate_names_the_missing_module_and_the_requirements_file(repo: Path) -> None:
    result = compile_repository(repo)
    error = result.failures["featurize"]
    model_py = repo / "featurize" / "1" / "model.py"
    assert error.message.startswith("ModuleNotFoundError: No module named 'acme_features'\n\nAt:\n")
    assert error.message.endswith(f"  {model_py}(11): auto_complete_config\n")
    assert error.detail == (
        f"auto_complete_config needs 'acme_features', which is not installed here: pip install -r "
        f"{repo / 'featurize' / 'requirements.txt'} (toolkit build runs it in the image, where that file is installed)"
    )
    assert result.failures["pipeline"].message.startswith("ensemble 'pipeline' depends on 'featurize' which has no loaded version.")

    cli = CliRunner().invoke(app, ["validate", str(repo)])
    assert cli.exit_code == 1
    assert "No module named 'acme_features'" in cli.output and "pip install -r" in cli.output

    (repo / "featurize" / "requirements.txt").unlink()
    detail = compile_repository(repo, models=["featurize"]).failures["featurize"].detail
    assert detail == (
        f"auto_complete_config needs 'acme_features', which is not installed here: list it in "
        f"{repo / 'featurize' / 'requirements.txt'} (the image build installs that file) and pip install -r it "
        "where the toolkit runs"
    )


def test_build_compile_defers_the_model_and_the_checks_that_need_its_io(repo: Path) -> None:
    # a warmup sample for an input only auto_complete_config declares: checked in the image
    (repo / "featurize" / "config.pbtxt").write_text(
        'model_warmup [ { name: "w" batch_size: 2 inputs { key: "TEXT" value { data_type: TYPE_STRING dims: [ 1 ] zero_data: true } } } ]\n'
    )
    result = compile_repository(repo, python_autocomplete=AUTOCOMPLETE_IMAGE)
    assert result.ok, {n: str(e) for n, e in result.failures.items()}
    featurize = result.models["featurize"]
    assert featurize.autocomplete == AUTOCOMPLETE_IMAGE
    assert featurize.autocomplete_reason == "its auto_complete_config imports 'acme_features', which is not installed here"
    assert (featurize.config["input"], featurize.config["max_batch_size"]) == ([], 0)  # what the model will receive
    assert result.models["score"].autocomplete is None and "pipeline" in result.models
    entries = {e["name"]: e for e in result.manifest()["models"]}
    assert entries["featurize"]["autocomplete"] == "image"
    assert "autocomplete" not in entries["score"] and "autocomplete" not in entries["pipeline"]
    # the ensemble's own config is untouched (its steps are all there for the image step)
    assert [s["model_name"] for s in entries["pipeline"]["config"]["ensemble_scheduling"]["step"]] == ["featurize", "score"]
    assert entries["pipeline"]["config"]["model_transaction_policy"] == {"decoupled": False}

    with pytest.raises(ValueError, match="python_autocomplete must be"):
        compile_repository(repo, python_autocomplete="container")


def test_build_compile_still_reports_what_it_can_check(repo: Path) -> None:
    # an error that is not a missing package fails on the host, as in toolkit validate
    write_model(repo, "broken", "class TritonPythonModel:\n    @staticmethod\n    def auto_complete_config(c):\n        raise ValueError('no')\n")
    # the ensemble's other steps are checked on the host; so are the versions of the deferred step
    (repo / "score" / "config.pbtxt").write_text(
        SCORE_PBTXT.replace('output [ { name: "Y" data_type: TYPE_FP32', 'output [ { name: "Y" data_type: TYPE_INT32')
    )
    (repo / "pipe2" / "1").mkdir(parents=True)
    (repo / "pipe2" / "config.pbtxt").write_text(
        textwrap.dedent(ENSEMBLE_PBTXT).replace('"pipeline"', '"pipe2"').replace(
            'model_name: "featurize" model_version: -1', 'model_name: "featurize" model_version: 2')
    )
    result = compile_repository(repo, python_autocomplete=AUTOCOMPLETE_IMAGE)
    assert result.failures["broken"].message.startswith("ValueError: no")
    assert result.failures["pipeline"].message == (
        "in ensemble pipeline, ensemble tensor SCORE: inconsistent data type: TYPE_FP32 is inferred from model "
        "pipeline while TYPE_INT32 is inferred from model score"
    )
    assert result.failures["pipe2"].message == "ensemble 'pipe2' depends on 'featurize' whose required version 2 is not loaded."
    assert result.models["featurize"].autocomplete == AUTOCOMPLETE_IMAGE


# --- the image step -----------------------------------------------------------------------------------


def _tiny_wheel(folder: Path, filename: str) -> Wheel:
    path = folder / filename
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("placeholder.txt", b"x")
    return Wheel.from_file(path)


def _context(tmp_path: Path, compiled, target: str = "cloudrun"):
    """The build context toolkit build writes (a stand-in wheelhouse: the download is tested
    elsewhere, the image installs nothing here)."""
    folder = tmp_path / "wheels"
    folder.mkdir(exist_ok=True)
    wheelhouse = Wheelhouse(folder, [_tiny_wheel(folder, "numpy-2.0.0-cp311-cp311-manylinux_2_28_x86_64.whl")],
                            _tiny_wheel(folder, "pip-25.0-py3-none-any.whl"), "k" * 64)
    base = BaseImage("toolkit-ci/python:3.11-bookworm", "3.11", (2, 36), "x86_64", False, "test")
    spec = TARGETS[target]
    runtime = runtime_requirements(server=spec.server, aws_lambda=target == "lambda", runtime_client=True, gpu_cuda=None)
    plan = ImagePlan(spec, base, "cpu", OPT_LAYOUT, runtime, "models")
    deferred = sorted(n for n, m in compiled.models.items() if m.autocomplete == AUTOCOMPLETE_IMAGE)
    return render_context(plan, compiled, wheelhouse, tmp_path / "ctx", deferred)


def test_image_step_completes_the_manifest_as_the_host_would_and_the_image_serves_it(
    repo: Path, acme: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled = compile_repository(repo, python_autocomplete=AUTOCOMPLETE_IMAGE)
    context = _context(tmp_path, compiled)
    dockerfile = context.dockerfile.read_text()
    command = python_autocomplete_command(["featurize"], OPT_LAYOUT)
    assert f"RUN {command}\n" in dockerfile
    assert command == (
        "PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=/opt/toolkit/app:/opt/toolkit/python "
        "python3 -m handlers.backends.python.complete /opt/toolkit/repository/models.json"
    )
    # after the repository is copied and the environment set, before the user changes
    assert dockerfile.index("COPY repository/") < dockerfile.index("ENV ") < dockerfile.index(f"RUN {command}") < dockerfile.index("USER ")
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    lint = subprocess.run([hadolint, "--no-color", str(context.dockerfile)], capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout

    manifest = context.directory / "repository" / "models.json"
    before = json.loads(manifest.read_text())
    done = run_image_step(manifest, context.directory / "app", acme)
    assert done.returncode == 0, done.stderr
    assert "completed the config of python model 'featurize' (auto_complete_config)" in done.stdout
    assert "checked ensemble 'pipeline' against the completed configs" in done.stdout
    after = json.loads(manifest.read_text())
    assert stat.S_IMODE(manifest.stat().st_mode) == 0o644  # the image's non-root user reads it
    assert sorted(p.name for p in manifest.parent.iterdir()) == ["featurize", "models.json", "pipeline", "score"]
    assert not list(manifest.parent.rglob("__pycache__"))
    entries = {e["name"]: e for e in after["models"]}
    assert "autocomplete" not in entries["featurize"]
    assert entries["score"] == {e["name"]: e for e in before["models"]}["score"]

    # byte for byte what the host compile gives where acme_features is installed
    monkeypatch.setenv("PYTHONPATH", str(acme))
    host = compile_repository(repo)
    assert host.ok, {n: str(e) for n, e in host.failures.items()}
    assert json.dumps(entries["featurize"]["config"]) == json.dumps(host.models["featurize"].config)

    # run again: nothing left to complete, the manifest stays as it is
    again = run_image_step(manifest, context.directory / "app", acme)
    assert again.returncode == 0 and "no python model left for the image build" in again.stdout
    assert json.loads(manifest.read_text()) == after

    # the image's entrypoint serves the completed configs (runtime from the context, no acme_features)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(context.directory / "app"), TOOLKIT_MANIFEST=str(manifest), PORT=str(port),
               TOOLKIT_HOST="127.0.0.1", TOOLKIT_LOG_LEVEL="warning")
    server = subprocess.Popen([sys.executable, "-m", "handlers.entrypoints.container"], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    try:
        _wait_ready(client, server)
        metadata = client.get_model_metadata("featurize")
        assert metadata["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": [-1, 1]}]
        assert metadata["outputs"] == [{"name": "FEATURES", "datatype": "FP32", "shape": [-1, 3]}]
        assert client.get_model_config("featurize") == entries["featurize"]["config"]
        raw = httpclient.InferInput("RAW", [2, 1], "BYTES")
        raw.set_data_from_numpy(np.array([[b"abc"], [b"hello"]], dtype=object))
        result = client.infer("pipeline", [raw])
        np.testing.assert_array_equal(result.as_numpy("SCORE"), [[6.0] * 3, [10.0] * 3])
    finally:
        client.close()
        server.terminate()
        server.wait(timeout=60)


def _wait_ready(client: httpclient.InferenceServerClient, server: subprocess.Popen, timeout: float = 120) -> None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"the entrypoint exited: {server.stdout.read() if server.stdout else ''}")
        try:
            if client.is_server_ready():
                return
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        time.sleep(0.1)  # polling an HTTP endpoint: there is no event to wait on
    raise AssertionError("the entrypoint did not become ready")


AUTO_COMPLETE = '''
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(c):
        import acme_features
        c.add_input({{"name": "X", "data_type": "TYPE_FP32", "dims": [2]}})
        c.add_output({{"name": "Y", "data_type": "TYPE_FP32", "dims": [2]}})
        {body}
        return c

    def execute(self, requests):
        return []
'''

# model -> (config.pbtxt after name/backend, auto_complete_config's extra line, tritonserver 2.51's message)
TRITON_CASES = {
    "pref": ("", 'c.set_max_batch_size(4); c.as_dict()["dynamic_batching"] = {"preferred_batch_size": [16]}',
             "dynamic batching preferred size must be <= max batch size for pref"),
    "negmbs": ("", 'c.as_dict()["max_batch_size"] = -2', "'max_batch_size' must be non-negative value for negmbs"),
    "zerodim": ("", 'c.as_dict()["input"][0]["dims"] = [0]',
                "model input 'X' dimension must be integer >= 1, or -1 to indicate a variable-size dimension for zerodim"),
    "cachedec": ("response_cache { enable: true }\n", 'c.set_model_transaction_policy({"decoupled": True})',
                 "Response Cache does not currently support model cachedec with 'decoupled' transaction policy. Please "
                 "disable the response cache."),
    "warmbad": ('model_warmup [ { name: "w" batch_size: 1 inputs { key: "X" value { data_type: TYPE_INT32 dims: [ 2 ] zero_data: true } } } ]\n',
                "pass", "[request id: <id_unknown>] inference input 'X' data-type is 'INT32', but model 'warmbad' expects 'FP32'"),
}


@pytest.mark.parametrize("model", sorted(TRITON_CASES))
def test_checks_after_completion_give_tritons_message_on_the_host_and_in_the_image(
    model: str, tmp_path: Path, acme: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pbtxt, body, message = TRITON_CASES[model]
    repo = tmp_path / "models"
    write_model(repo, model, AUTO_COMPLETE.format(body=body), f'name: "{model}"\nbackend: "python"\n{pbtxt}')
    deferred = compile_repository(repo, python_autocomplete=AUTOCOMPLETE_IMAGE)
    assert deferred.ok and deferred.models[model].autocomplete == AUTOCOMPLETE_IMAGE
    manifest = deferred.write_manifest(repo / "models.json")
    text = manifest.read_text()
    done = run_image_step(manifest, ROOT, acme)
    assert done.returncode == 1
    assert f"auto_complete_config of python models failed in the image build:\n  {model}: {message}" in done.stderr
    assert manifest.read_text() == text  # left as it was

    monkeypatch.setenv("PYTHONPATH", str(acme))
    assert compile_repository(repo).failures[model].message == message


@pytest.mark.parametrize(
    "case",
    ["missing-in-image-too", "ensemble-mismatch", "warmup-batch-size", "raises"],
)
def test_image_step_failures_name_the_model(case: str, repo: Path, acme: Path) -> None:
    pythonpath = [ROOT, acme]
    expected: str
    if case == "missing-in-image-too":
        pythonpath = [ROOT]
        expected = ("featurize: ModuleNotFoundError: No module named 'acme_features'", "(the image cannot import "
                    f"'acme_features' either: list it in {repo / 'featurize' / 'requirements.txt'}, which toolkit build "
                    "installs into the image)")
    elif case == "ensemble-mismatch":
        (acme / "acme_features" / "__init__.py").write_text("MAX_BATCH = 8\nWIDTH = 5\n")
        expected = ("pipeline: in ensemble pipeline, ensemble tensor feat: inconsistent shape: [-1,5] is inferred from model "
                    "featurize while [-1,3] is inferred from model score",)
    elif case == "warmup-batch-size":
        (repo / "featurize" / "config.pbtxt").write_text(
            'model_warmup [ { name: "w" batch_size: 9 inputs { key: "TEXT" value { data_type: TYPE_STRING dims: [ 1 ] zero_data: true } } } ]\n'
        )
        expected = ("featurize: failed to run warmup sample 'w': batch size 9 for 'featurize_0', max allowed is 8; ",)
    else:
        write_model(repo, "featurize", MODEL_PY.replace("config.set_dynamic_batching()", "raise RuntimeError('bad width')"))
        expected = ("featurize: RuntimeError: bad width\n\nAt:\n",)
    compiled = compile_repository(repo, python_autocomplete=AUTOCOMPLETE_IMAGE)
    assert compiled.ok, {n: str(e) for n, e in compiled.failures.items()}
    manifest = compiled.write_manifest(repo / "models.json")
    done = run_image_step(manifest, *pythonpath)
    assert done.returncode == 1, done.stdout
    for part in expected:
        assert part in done.stderr, done.stderr
    assert json.loads(manifest.read_text())["models"][0].get("autocomplete") == "image"


def test_image_step_marks_an_ensemble_decoupled_when_a_completed_step_makes_itself_decoupled(repo: Path, acme: Path) -> None:
    source = MODEL_PY.replace("config.set_dynamic_batching()", 'config.set_model_transaction_policy({"decoupled": True})')
    write_model(repo, "featurize", source)
    compiled = compile_repository(repo, python_autocomplete=AUTOCOMPLETE_IMAGE)
    assert compiled.ok, {n: str(e) for n, e in compiled.failures.items()}
    manifest = compiled.write_manifest(repo / "models.json")
    done = run_image_step(manifest, ROOT, acme)
    assert done.returncode == 0, done.stderr
    entries = {m["name"]: m for m in json.loads(manifest.read_text())["models"]}
    assert entries["featurize"]["config"]["model_transaction_policy"] == {"decoupled": True}
    # ValidateEnsembleConfig's verdict on the completed configs: the ensemble streams
    assert entries["pipeline"]["config"]["model_transaction_policy"] == {"decoupled": True}


def test_image_step_warns_about_warmup_inputs_the_model_does_not_have(repo: Path, acme: Path) -> None:
    (repo / "featurize" / "config.pbtxt").write_text(
        'model_warmup [ { name: "w" batch_size: 2 inputs [\n'
        '  { key: "TEXT" value { data_type: TYPE_STRING dims: [ 1 ] zero_data: true } },\n'
        '  { key: "EXTRA" value { data_type: TYPE_FP32 dims: [ 2 ] random_data: true } } ] } ]\n'
    )
    manifest = compile_repository(repo, python_autocomplete=AUTOCOMPLETE_IMAGE).write_manifest(repo / "models.json")
    done = run_image_step(manifest, ROOT, acme)
    assert done.returncode == 0, done.stderr
    assert (
        "warning: model_warmup sample 'w' gives input 'EXTRA', which is not an input of model 'featurize': "
        "tritonserver hands it to the backend as an extra input, this runtime ignores it"
    ) in done.stderr


def test_lambda_layout_command_sets_the_task_root_on_the_path() -> None:
    assert python_autocomplete_command([], OPT_LAYOUT) is None
    assert python_autocomplete_command(["m"], LAMBDA_TASK_LAYOUT) == (
        "PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=/var/task python3 -m handlers.backends.python.complete "
        "/opt/toolkit/repository/models.json"
    )


# --- local wheels in requirements.txt --------------------------------------------------------------------


def test_requirements_paths_are_relative_to_the_requirements_file(tmp_path: Path) -> None:
    model = tmp_path / "repo" / "m"
    (model / "wheels").mkdir(parents=True)
    wheel = _tiny_wheel(model / "wheels", "acme_features-0.1-py3-none-any.whl")
    shared = tmp_path / "shared-wheels"
    shared.mkdir()
    (model / "requirements.txt").write_text(
        "# local wheels\n"
        "./wheels/acme_features-0.1-py3-none-any.whl ; python_version >= '3'  # ours\n"
        "--find-links ../../shared-wheels\n"
        "-f https://example.invalid/wheels\n"
        "six==1.16.0 \\\n"
        "   --hash=sha256:abc\n"
        "requests[socks]>=2\n"
    )
    requirements = ModelRequirements("m", model / "requirements.txt")
    text, local = requirements.resolved()
    assert text.splitlines() == [
        "",
        f"{model / 'wheels' / wheel.filename} ; python_version >= '3'",
        f"--find-links {shared}",
        "-f https://example.invalid/wheels",
        "six==1.16.0    --hash=sha256:abc",
        "requests[socks]>=2",
    ]
    assert local == [model / "wheels" / wheel.filename, shared]

    base = BaseImage("python:3.11", "3.11", (2, 36), "x86_64", False, "test")
    runtime = runtime_requirements(server=True, aws_lambda=False, runtime_client=False, gpu_cuda=None)
    key = cache_key(runtime, [requirements], base)
    assert cache_key(runtime, [requirements], base) == key
    with zipfile.ZipFile(model / "wheels" / wheel.filename, "a") as archive:
        archive.writestr("changed.txt", b"y")  # a rebuilt local wheel: a new wheelhouse
    assert cache_key(runtime, [requirements], base) != key

    (model / "requirements.txt").write_text("six\n./wheels/missing-0.1-py3-none-any.whl\n")
    with pytest.raises(BuildError) as raised:
        requirements.resolved()
    assert raised.value.message == (
        f"{model / 'requirements.txt'}:2: './wheels/missing-0.1-py3-none-any.whl' does not exist (model 'm'; local "
        f"paths in requirements.txt are relative to its folder, {model})"
    )


def test_runtime_refuses_a_manifest_whose_image_completion_did_not_run(tmp_path):
    from handlers.manifest import Manifest

    manifest = tmp_path / "models.json"
    manifest.write_text(json.dumps({"format": 1, "device": "cpu", "models": [
        {"name": "pm", "path": "pm", "versions": [1], "model_files": {"1": "1/model.py"},
         "config": {"name": "pm", "backend": "python"}, "autocomplete": "image"}]}))
    with pytest.raises(ValueError, match="model 'pm' still waits for its auto_complete_config"):
        Manifest.load(manifest)
