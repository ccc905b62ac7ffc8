"""A model's repository agents (`model_repository_agents`), run as tritonserver runs them: when it
polls the repository, right after reading config.pbtxt and before normalizing it (core's
CreateAgentModelListWithLoadAction), each agent's LOAD action in turn; an agent's error makes the
model INVALID.

Triton's images ship one agent, `checksum` (its repository checksum_repository_agent): each
parameter `ALGORITHM:relative/file` -> hex digest is checked against the file under the model's
directory (MD5, the only algorithm it has), with its messages. Any other agent is a shared library
(`libtritonrepoagent_<name>.so`) this runtime cannot load: refused as UNSUPPORTED, after
tritonserver's own message for an agent it cannot find. The check runs at `toolkit validate`,
`build` and `serve`; an image holds the files it checked.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from .errors import ModelError, UnsupportedModelError

CHECKSUM = "checksum"
SEARCH_PATH = "/opt/tritonserver/repoagents"  # tritonserver's default --repoagent-directory


def run_repository_agents(model_path: Path, config: Any) -> None:
    """Run each agent of `config` (a ModelConfig message) on the model at `model_path`."""
    for agent in config.model_repository_agents.agents:
        if agent.name != CHECKSUM:
            raise UnsupportedModelError(
                f"unable to find 'libtritonrepoagent_{agent.name}.so' for repo agent '{agent.name}', searched: "
                f"{SEARCH_PATH}",
                hint="model_repository_agents",
                detail=f"this runtime runs Triton's '{CHECKSUM}' repository agent only; other agents are shared "
                "libraries it cannot load: apply what the agent does to the model files before the build",
            )
        for key in sorted(agent.parameters):  # a protobuf map: Triton's order is unspecified
            _check(model_path, key, agent.parameters[key])


def _check(model_path: Path, key: str, expected: str) -> None:
    algorithm, separator, relative = key.partition(":")
    if not separator:
        raise ModelError(f"failed to parse key: {key}", hint=key)
    if algorithm.lower() != "md5":
        raise UnsupportedModelError(f"Unsupported checksum algorithm: {algorithm}", hint=key)
    try:
        data = (model_path / relative).read_bytes()
    except OSError as exc:
        raise ModelError(f"failed to open text file for read {relative}: {os.strerror(exc.errno or 0)}",
                         hint=key) from None
    got = hashlib.md5(data, usedforsecurity=False).hexdigest()
    if got != expected:
        raise ModelError(f"Mismatched MD5 hash for file {relative}, expect: {expected}, got: {got}", hint=key)
