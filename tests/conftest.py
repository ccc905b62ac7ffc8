from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Callable

import pytest

from toolkit.build.context import LABEL_PREFIX


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


# -- images the end-to-end tests build ------------------------------------------------------------
# Every `toolkit build` in the tests makes an image in the test engine (tests/test_build_e2e.py's
# `engine`), some 300 MB each and more in the engine's build cache: with the vfs storage driver of
# the private engine (scripts/ci-docker.sh, /tmp/toolkit-docker) a run left ~10 GB behind, and a
# few runs filled the disk. Once the session ends, the images `toolkit build` labelled
# (io.triton-serverless-toolkit.version: LABEL_PREFIX) that were made during it are removed, by image id (the
# tags of pushed copies go too); in the private engine, which only the tests use, every such image
# and the build cache go (its base images stay). TOOLKIT_KEEP_TEST_IMAGES=1 keeps all of it; so
# does a pytest-xdist worker (the others may still run those images).
_SESSION_STARTED = 0.0


def pytest_sessionstart(session: pytest.Session) -> None:
    global _SESSION_STARTED
    _SESSION_STARTED = time.time()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    e2e = sys.modules.get("test_build_e2e")  # imported: this session ran tests with the engine
    if e2e is None or os.environ.get("TOOLKIT_KEEP_TEST_IMAGES") == "1" or "PYTEST_XDIST_WORKER" in os.environ:
        return
    env = e2e.engine_env()
    private = env.get("DOCKER_HOST") == f"unix://{e2e.ENGINE_DIR / 'docker.sock'}"
    removed = remove_images_built_since(e2e.DOCKER, env, 0.0 if private else _SESSION_STARTED)
    pruned, problem = False, ""
    # one session here saw a prune fail, its reason not kept: try twice, then say why
    for _ in range(2 if private else 0):
        prune = subprocess.run([e2e.DOCKER, "builder", "prune", "-a", "-f"], check=False, capture_output=True,
                               text=True, env=env, timeout=600)
        pruned, problem = prune.returncode == 0, prune.stderr.strip()[-300:]
        if pruned:
            break
    if removed or private:
        cache = ""
        if private:
            cache = " and the build cache" if pruned else f"; the build cache stays ({problem})"
        print(f"\nremoved {len(removed)} image(s) the tests built{cache} (TOOLKIT_KEEP_TEST_IMAGES=1 keeps them)")


def remove_images_built_since(docker: str, env: dict[str, str], since: float) -> list[str]:
    """Remove the images `toolkit build` labelled that were created at or after `since` (a Unix
    time); returns their ids. An engine that does not answer removes nothing."""
    try:
        listed = subprocess.run(
            [docker, "image", "ls", "--no-trunc", "--filter", f"label={LABEL_PREFIX}.version",
             "--format", "{{.ID}}\t{{.CreatedAt}}"],
            check=False, capture_output=True, text=True, env=env, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    ids = []
    for line in listed.stdout.splitlines():
        image, _, created = line.partition("\t")
        stamp = " ".join(created.split()[:3])  # "2026-11-30 01:02:03 +0000" (then the zone's name)
        try:
            when = dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S %z").timestamp()
        except ValueError:
            continue
        if when >= since - 1 and image not in ids:  # (CreatedAt has whole seconds)
            ids.append(image)
    if ids:
        subprocess.run([docker, "rmi", "-f", *ids], check=False, capture_output=True, env=env, timeout=600)
    return ids
