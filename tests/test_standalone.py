"""The repository stands alone: no tracked file names a path of the machine it was written on.

A clone on a fresh machine has nothing beside it, so a test, doc or script that points at a
machine's folders (a sibling checkout, a home directory, a workspace) works only where it was
written. The reference tools live in scripts/tools/ (docs/tools.md); results say how to reproduce
them with the project's own commands.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Written in pieces, so that this file does not name them itself.
_MACHINE_PATHS = re.compile(
    "|".join([
        r"(?<![\w.~-])/" + "work/",  # a workspace at the file system's root
        r"\.\./" + "shared/",  # a folder beside the checkout
        "shared/" + "anchors",
        r"(?<![\w.~-])/" + r"(?:root|home/[\w.-]+)/",  # someone's home directory
    ])
)


def _tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
        return [ROOT / name for name in out.stdout.decode().split("\0") if name]
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an unpacked archive)
        skip = {".git", ".venv", "node_modules", "__pycache__"}
        return [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]


def machine_paths(files: list[Path], root: Path = ROOT) -> list[str]:
    found = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary files (ONNX models, images); a file deleted in the work tree
        for number, line in enumerate(text.splitlines(), 1):
            match = _MACHINE_PATHS.search(line)
            if match:
                found.append(f"{path.relative_to(root)}:{number}: {match.group(0)!r} in {line.strip()[:120]!r}")
    return found


def test_no_tracked_file_names_a_machine_path():
    found = machine_paths(_tracked_files())
    assert not found, "machine paths in tracked files (use the project's own tools, docs/tools.md):\n" + "\n".join(found)


def test_the_check_finds_each_kind_of_machine_path(tmp_path: Path):
    samples = {
        "workspace.md": "run " + "/work" + "/main/scripts/x",
        "sibling.py": "TOOL = '.." + "/shared/" + "tool'",
        "anchors.sh": "shared" + "/anchors/triton-anchor REPO",
        "home.txt": "cache in " + "/root" + "/.cache/x and " + "/home" + "/alice/x",
        "fine.md": "https://example.com/work/x ~/.cache/toolkit-tools ../../shared-wheels ./work/x",
    }
    for name, text in samples.items():
        (tmp_path / name).write_text(text + "\n")
    found = machine_paths(sorted(tmp_path.iterdir()), root=tmp_path)
    flagged = {line.split(":")[0] for line in found}
    assert flagged == {"workspace.md", "sibling.py", "anchors.sh", "home.txt"}, found
