"""`model_repository_agents`: Triton's checksum agent runs as tritonserver runs it (after reading
config.pbtxt, before normalizing it; an error makes the model INVALID, with the agent's own
message), and any other agent is refused as UNSUPPORTED after tritonserver's message for an agent
it cannot find. Seen in a public repository (zzk0/triton agents/example_python)."""

from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path

import pytest
from cli_runner import invoke

from toolkit.repository.compile import compile_repository

MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())])
                for r in requests]
"""


def agent_model(repo: Path, agents: str, name: str = "m") -> Path:
    directory = repo / name
    (directory / "1").mkdir(parents=True)
    (directory / "1" / "model.py").write_text(MODEL)
    (directory / "config.pbtxt").write_text(textwrap.dedent(f"""
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 1 ] }} ]
        output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 1 ] }} ]
        model_repository_agents {{ agents [ {agents} ] }}
        """).lstrip())
    return directory


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def checksum(*pairs: tuple[str, str]) -> str:
    parameters = " ".join(f'parameters {{ key: "{key}" value: "{value}" }}' for key, value in pairs)
    return f'{{ name: "checksum" {parameters} }}'


def test_the_checksum_agent_accepts_matching_files(tmp_path):
    repo = tmp_path / "models"
    agent_model(repo, checksum(("MD5:1/model.py", hashlib.md5(MODEL.encode()).hexdigest())))
    assert compile_repository(repo).ok
    assert invoke(["validate", str(repo)]).exit_code == 0


@pytest.mark.parametrize("key, value, message", [
    ("MD5:1/model.py", "4e2c177998feb5539d8ec8d820f990bd",
     "Mismatched MD5 hash for file 1/model.py, expect: 4e2c177998feb5539d8ec8d820f990bd, got: {got}"),
    ("md5:1/nowhere.py", "0", "failed to open text file for read 1/nowhere.py: No such file or directory"),
    ("1/model.py", "0", "failed to parse key: 1/model.py"),
])
def test_the_checksum_agent_makes_the_model_invalid_with_its_message(tmp_path, key, value, message):
    repo = tmp_path / "models"
    directory = agent_model(repo, checksum((key, value)))
    error = compile_repository(repo).failures["m"]
    assert error.message == message.format(got=md5(directory / "1" / "model.py"))
    assert not error.unsupported and error.stage == "config"
    assert error.file == str(directory / "config.pbtxt") and error.line == 6  # the agents' line
    result = invoke(["validate", str(repo)])
    assert result.exit_code == 1 and message.split(":")[0].split(" 1/")[0] in result.output


def test_another_agent_or_algorithm_is_refused_as_unsupported(tmp_path):
    repo = tmp_path / "models"
    agent_model(repo, '{ name: "encryption" parameters { key: "k" value: "v" } }', "custom")
    agent_model(repo, checksum(("SHA256:1/model.py", "0")), "sha")
    failures = compile_repository(repo).failures
    assert failures["custom"].unsupported and failures["custom"].message == (
        "unable to find 'libtritonrepoagent_encryption.so' for repo agent 'encryption', searched: "
        "/opt/tritonserver/repoagents")
    assert "runs Triton's 'checksum' repository agent only" in failures["custom"].detail
    assert failures["sha"].unsupported and failures["sha"].message == "Unsupported checksum algorithm: SHA256"
