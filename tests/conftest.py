from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Callable

import pytest


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """An empty model repository directory."""
    root = tmp_path / "models"
    root.mkdir()
    return root


def write_config(repo: Path, model: str, text: str) -> Path:
    path = repo / model / "config.pbtxt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


@pytest.fixture
def config_writer(repo: Path) -> Callable[[str, str], Path]:
    return lambda model, text: write_config(repo, model, text)
