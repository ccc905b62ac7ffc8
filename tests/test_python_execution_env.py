"""Python models with EXECUTION_ENV_PATH (a conda-pack environment), as Triton's python backend
runs them: `toolkit validate` accepts an environment the model process can run in and refuses the
others naming the file, what is wrong and what works; `toolkit serve` runs the model on the
environment's own interpreter, where model.py imports a package only the environment has.

The environments are execution_envs.py's stand-ins for conda-pack archives (conda's channels are
unreachable where these tests run): the running interpreter's own installation, numpy and a
package made here, laid out and packed as conda-pack does.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import tritonclient.http as httpclient
from cli_runner import invoke
from execution_envs import fake_environment, find_python, make_environment, pack
from serving import serve

from handlers.backends.python import IN_PROCESS, INSTANCE_MODE_ENV, PROCESS, instance_mode
from handlers.backends.python.execution_env import MIN_PYTHON, activation_environment
from handlers.backends.python.ipc import Channel
from toolkit.repository.compile import compile_repository

ENV_ONLY = {"envonly_marker/__init__.py": "OFFSET = 42\n"}
MODEL = '''
import sys

import numpy as np
import envonly_marker  # installed in the execution environment only
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            info = "|".join([sys.executable, sys.prefix, np.__version__, "%d.%d.%d" % sys.version_info[:3],
                             str(sys.path)])
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", (x + envonly_marker.OFFSET).astype(np.float32)),
                pb_utils.Tensor("INFO", np.array([info.encode()], dtype=object)),
            ]))
        return responses
'''
CONFIG = """
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 3 ] }} ]
output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 3 ] }}, {{ name: "INFO" data_type: TYPE_STRING dims: [ 1 ] }} ]
parameters {{ key: "EXECUTION_ENV_PATH" value {{ string_value: "{env}" }} }}
"""


def env_model(repo: Path, name: str, env: str) -> Path:
    directory = repo / name
    (directory / "1").mkdir(parents=True)
    (directory / "1" / "model.py").write_text(MODEL)
    (directory / "config.pbtxt").write_text(textwrap.dedent(CONFIG.format(name=name, env=env)).lstrip())
    return directory


@pytest.fixture(scope="module")
def environment(tmp_path_factory) -> Path:
    return make_environment(tmp_path_factory.mktemp("execution_env") / "env", ENV_ONLY)


@pytest.fixture(scope="module")
def archive(environment, tmp_path_factory) -> Path:
    return pack(environment, tmp_path_factory.mktemp("execution_env_archive") / "env.tar.gz")


def _failure(repo: Path, name: str):
    result = compile_repository(repo)
    assert name in result.failures, f"{name} compiled"
    return result.failures[name]


def test_validate_accepts_an_archive_in_the_model_directory_and_an_unpacked_folder(tmp_path, archive, environment):
    repo = tmp_path / "models"
    directory = env_model(repo, "packed", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    shutil.copy(archive, directory / "env.tar.gz")
    env_model(repo, "unpacked", str(environment))
    result = invoke(["validate", str(repo)])
    assert result.exit_code == 0, result.output
    compiled = compile_repository(repo)
    assert compiled.ok and set(compiled.models) == {"packed", "unpacked"}


def test_the_model_directory_keyword_is_the_model_directory_when_the_repository_path_is_relative(
        tmp_path, archive, monkeypatch):
    """`toolkit validate models` run from the repository's parent: the keyword names the archive
    once (it was joined to the relative model directory twice), and a missing one is named by its
    absolute path, as tritonserver's canonical model paths are."""
    repo = tmp_path / "models"
    shutil.copy(archive, env_model(repo, "packed", "$$TRITON_MODEL_DIRECTORY/env.tar.gz") / "env.tar.gz")
    missing = env_model(repo, "missing", "$$TRITON_MODEL_DIRECTORY/nowhere.tar.gz")
    monkeypatch.chdir(tmp_path)
    result = invoke(["validate", "models"])
    assert result.exit_code != 0
    compiled = compile_repository(Path("models"))
    assert "packed" in compiled.models, compiled.failures.get("packed")
    error = compiled.failures["missing"]
    assert error.message == f"Failed to get the canonical path for {missing / 'nowhere.tar.gz'}."
    assert "packed" in result.output and "nowhere.tar.gz" in result.output


def test_validate_refuses_an_environment_with_an_older_python(tmp_path):
    repo = tmp_path / "models"
    directory = env_model(repo, "old", "$$TRITON_MODEL_DIRECTORY/py37.tar.gz")
    pack(fake_environment(tmp_path / "py37"), directory / "py37.tar.gz")
    error = _failure(repo, "old")
    assert error.unsupported
    assert str(directory / "py37.tar.gz") in error.message
    assert "its Python is 3.7, older than 3.10" in error.message
    assert "Python 3.10 or newer and numpy 1.23 or newer works" in error.message
    assert error.file == str(directory / "config.pbtxt") and error.line == 6
    result = invoke(["validate", str(repo)])
    assert result.exit_code != 0 and "its Python is 3.7" in result.output.replace("\n", "")


def test_validate_refuses_a_missing_archive_naming_it(tmp_path):
    repo = tmp_path / "models"
    directory = env_model(repo, "missing", "$$TRITON_MODEL_DIRECTORY/nowhere.tar.gz")
    error = _failure(repo, "missing")
    assert not error.unsupported
    assert error.message == f"Failed to get the canonical path for {directory / 'nowhere.tar.gz'}."  # tritonserver's
    assert "names no file or folder" in error.detail and error.line == 6


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda root: root.write_text("not an archive"), "not a readable conda-pack archive (.tar.gz or .tar)"),
        (lambda root: pack(fake_environment(root.with_suffix(".d"), "3.12", numpy_version=None), root),
         "numpy is not installed in it (lib/python3.12/site-packages/numpy)"),
        (lambda root: pack(fake_environment(root.with_suffix(".d"), "3.12", numpy_version="1.21.6"), root),
         "its numpy is 1.21, older than 1.23"),
    ],
)
def test_validate_refuses_what_cannot_host_the_model_process(tmp_path, make, expected):
    repo = tmp_path / "models"
    directory = env_model(repo, "m", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    make(directory / "env.tar.gz")
    error = _failure(repo, "m")
    assert expected in error.message and str(directory / "env.tar.gz") in error.message


def test_validate_refuses_a_macos_environment(tmp_path):
    repo = tmp_path / "models"
    root = fake_environment(tmp_path / "mac", "3.12")
    (root / "bin" / "python3.12").write_bytes(b"\xcf\xfa\xed\xfe" + b"\0" * 60)
    env_model(repo, "m", str(root))
    error = _failure(repo, "m")
    assert error.unsupported and "its bin/python was built for macOS, not Linux" in error.message


def test_a_model_with_an_environment_always_runs_in_a_process(monkeypatch):
    spec = SimpleNamespace(name="m", config={"parameters": {"EXECUTION_ENV_PATH": {"string_value": "x.tar.gz"}}})
    monkeypatch.setenv(INSTANCE_MODE_ENV, IN_PROCESS)
    assert instance_mode(spec, 1) == PROCESS


def test_activation_sets_tritons_variables_and_drops_the_serving_pythonpath(tmp_path):
    env = activation_environment(tmp_path, {"PATH": "/usr/bin", "PYTHONPATH": "/opt/toolkit/python", "PYTHONHOME": "/x", "LD_LIBRARY_PATH": "/a"})
    assert env["PATH"] == f"{tmp_path}/bin:/usr/bin" and env["LD_LIBRARY_PATH"] == f"{tmp_path}/lib:/a"
    assert env["VIRTUAL_ENV"] == str(tmp_path) and "PYTHONPATH" not in env and "PYTHONHOME" not in env


def test_portable_channel_carries_arrays_without_numpys_private_modules():
    left, right = socket.socketpair()
    sender, receiver = Channel(left, portable=True), Channel(right)
    arrays = [
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.arange(40000, dtype=np.int64)[::2],  # not contiguous, sent out-of-band
        np.array([[b"a", b"bc"]], dtype=object),
        np.array(True),
        np.zeros((0, 3), dtype=np.uint16),
        np.frombuffer(b"\x01\x02", dtype=np.uint8),  # read-only
        np.array([(1, 2.0)], dtype=[("a", "<i4"), ("b", "<f8")]),
    ]
    message = ("result", 1, [("T", a, "X") for a in arrays] + [np.float32(1.5)])
    meta: list = []
    sender.send(message)
    received = receiver.receive()
    for (_, got, _), want in zip(received[2], arrays):
        assert got.dtype == want.dtype and got.shape == want.shape and got.tolist() == want.tolist()
        assert got.flags.writeable
    assert received[2][-1] == np.float32(1.5) and received[2][-1].dtype == np.float32
    # what travels names no numpy module: a numpy 1.x process can read what numpy 2.x wrote
    import io

    from handlers.backends.python import ipc

    stream = io.BytesIO()
    ipc._PortablePickler(stream, protocol=5, buffer_callback=meta.append).dump(message)
    assert b"numpy" not in stream.getvalue()
    sender.close()
    receiver.close()


def _served_infos(repo: Path, names: list[str]) -> dict[str, list[str]]:
    """Serve `repo`, send each model X; each answers X + 42 (the environment's package) and what its
    process runs on: executable, prefix, numpy version, Python version, sys.path."""
    infos = {}
    with serve(repo, "--device", "cpu") as server:
        client = httpclient.InferenceServerClient(server.url)
        try:
            for name in names:
                x = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32)
                inputs = [httpclient.InferInput("X", list(x.shape), "FP32")]
                inputs[0].set_data_from_numpy(x)
                result = client.infer(name, inputs)
                np.testing.assert_array_equal(result.as_numpy("Y"), x + 42)
                infos[name] = result.as_numpy("INFO")[0].decode().split("|", 4)
        finally:
            client.close()
    return infos


def test_serve_runs_the_model_on_the_environments_interpreter(tmp_path, archive, environment):
    repo = tmp_path / "models"
    directory = env_model(repo, "packed", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    shutil.copy(archive, directory / "env.tar.gz")
    env_model(repo, "unpacked", str(environment))
    for name, (executable, prefix, numpy_version, python_version, path) in _served_infos(
            repo, ["packed", "unpacked"]).items():
        assert executable != sys.executable
        assert python_version == "%d.%d.%d" % sys.version_info[:3]
        assert executable.endswith("/bin/python") and prefix == executable[: -len("/bin/python")]
        if name == "unpacked":
            assert prefix == str(environment)
        else:  # unpacked at load time, as Triton does, into a folder of its own
            assert "toolkit_python_env_" in prefix
        assert numpy_version == np.__version__
        # nothing of the serving environment on the model's path: the environment's own
        # folders and the model's (Triton puts the model's folders there too)
        entries = [p for p in eval(path) if p]
        assert all(p.startswith((prefix, str(repo))) for p in entries), entries
    assert os.path.exists(archive)


def test_the_model_process_needs_no_python_newer_than_3_10():
    """Triton's 24.x containers run Python 3.10, so environments made for them are 3.10 ones.
    PyPI, Debian 12 and npm carry no Python 3.10, so besides running one where it is installed
    (test_serve_runs_a_model_in_a_python_3_10_environment, below) this checks statically, on any
    machine: vermin reads every module the model process can import (the python backend's package,
    the two package files above it and handlers/huge_pages.py; the bootstrap imports nothing else
    of this project) and finds nothing that 3.10 lacks, and that 3.9 would (the check has teeth:
    `-t=3.9-` fails)."""
    import handlers

    package = Path(handlers.__file__).parent
    files = [str(package / "__init__.py"), str(package / "backends" / "__init__.py"),
             str(package / "huge_pages.py"), str(package / "backends" / "python")]
    vermin = Path(sys.executable).parent / "vermin"

    def check(target: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(vermin), "--no-tips", "--eval-annotations", "--violations", f"-t={target}-", *files],
                              capture_output=True, text=True, timeout=300)

    supported = check("3.10")
    assert supported.returncode == 0, supported.stdout + supported.stderr
    assert "Minimum required versions: 3.10" in supported.stdout
    assert check("3.9").returncode != 0
    assert MIN_PYTHON == (3, 10)


# The oldest numpy with wheels for each Python: 1.23.5 is the oldest the stub supports (MIN_NUMPY).
OLDEST_NUMPY = {(3, 10): "1.23.5", (3, 11): "1.23.5", (3, 12): "1.26.4", (3, 13): "2.1.3"}


def numpy_for(python: tuple[int, int], download: Path) -> Path:
    """The oldest numpy for CPython `python` (OLDEST_NUMPY) unpacked from its manylinux wheel on
    PyPI into a site-packages folder, kept in the tools cache between runs."""
    version = OLDEST_NUMPY.get(python, OLDEST_NUMPY[max(OLDEST_NUMPY)])
    cache = Path(os.environ.get("TOOLKIT_TOOLS_CACHE", Path.home() / ".cache" / "toolkit-tools")) / f"numpy-{version}"
    tag = f"cp{python[0]}{python[1]}"
    site = cache / tag
    if not (site / "numpy" / "__init__.py").exists():
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                        "--python-version", f"{python[0]}.{python[1]}", "--implementation", "cp", "--abi", tag,
                        "--platform", f"manylinux2014_{platform.machine()}", f"numpy=={version}", "-d", str(download)],
                       check=True, timeout=600)
        wheel = next(download.glob(f"numpy-{version}-{tag}-*.whl"))
        partial = site.with_suffix(".partial")
        shutil.rmtree(partial, ignore_errors=True)
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(partial)
        for path in partial.rglob("*.so*"):  # zipfile drops the permission bits
            path.chmod(0o755)
        shutil.rmtree(site, ignore_errors=True)
        partial.rename(site)
    return site


@pytest.fixture(scope="module")
def oldest_numpy(tmp_path_factory) -> Path:
    """The oldest numpy for this Python (1.23.5 on 3.11, where the tests run)."""
    return numpy_for(sys.version_info[:2], tmp_path_factory.mktemp("numpy-wheel"))


def test_serve_runs_a_model_in_an_environment_with_the_oldest_numpy(tmp_path, oldest_numpy):
    environment = make_environment(tmp_path / "env", ENV_ONLY, numpy_site=oldest_numpy)
    repo = tmp_path / "models"
    env_model(repo, "old_numpy", str(environment))
    directory = env_model(repo, "old_numpy_packed", "$$TRITON_MODEL_DIRECTORY/env.tar.gz")
    pack(environment, directory / "env.tar.gz")
    infos = _served_infos(repo, ["old_numpy", "old_numpy_packed"])
    assert {name: info[2] for name, info in infos.items()} == dict.fromkeys(infos, oldest_numpy.parent.name.split("-")[1])


PYTHON_3_10 = find_python("3.10")


@pytest.mark.skipif(PYTHON_3_10 is None and os.environ.get("TOOLKIT_REQUIRE_TOOLS") != "1",
                    reason="no Python 3.10 installed (on PATH or among pyenv's versions)")
def test_serve_runs_a_model_in_a_python_3_10_environment(tmp_path):
    """An environment of Python 3.10, the Python of Triton's 24.x containers and so of the
    environments users pack for them, with the oldest numpy the stub supports: the model runs on
    that interpreter, packed and unpacked, and answers through the stub (its modules run on 3.10
    for real, not only by vermin's reading above). The interpreter is an installed CPython 3.10
    (pyenv's, where these tests run: PyPI, Debian 12 and npm carry none), laid out as conda-pack
    lays out an environment (execution_envs.py)."""
    assert PYTHON_3_10 is not None, "TOOLKIT_REQUIRE_TOOLS=1: this machine must have a Python 3.10"
    site = numpy_for((3, 10), tmp_path / "wheel")
    environment = make_environment(tmp_path / "env310", ENV_ONLY, numpy_site=site, python=PYTHON_3_10)
    assert (environment / "bin" / "python3.10").exists()
    repo = tmp_path / "models"
    env_model(repo, "py310", str(environment))
    pack(environment, env_model(repo, "py310_packed", "$$TRITON_MODEL_DIRECTORY/env.tar.gz") / "env.tar.gz")
    result = invoke(["validate", str(repo)])
    assert result.exit_code == 0, result.output
    infos = _served_infos(repo, ["py310", "py310_packed"])
    for name, (executable, prefix, numpy_version, python_version, path) in infos.items():
        assert python_version.startswith("3.10."), (name, python_version)
        assert numpy_version == OLDEST_NUMPY[(3, 10)]
        assert executable.endswith("/bin/python") and prefix == executable[: -len("/bin/python")]
        assert all(entry.startswith((prefix, str(repo))) for entry in eval(path) if entry), path
    assert infos["py310"][1] == str(environment)
    assert "toolkit_python_env_" in infos["py310_packed"][1]  # unpacked at load time into a folder of its own
