"""The local container engine (docker or podman) as deploy uses it: log in, tag, push.

Registry credentials come from the cloud SDK (an ECR authorization token, a Google access token)
and reach the engine on stdin (`login --password-stdin`), never on a command line.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .errors import DeployError

ENGINES = ("docker", "podman")
_DIGEST_LINE = re.compile(r"digest: (sha256:[0-9a-f]{64})")


@dataclass(frozen=True)
class ContainerEngine:
    name: str
    path: str

    def _run(self, args: list[str], *, stdin: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [self.path, *args], input=stdin, capture_output=True, text=True, timeout=timeout, check=False
        )

    def available(self) -> bool:
        try:
            return self._run(["info"], timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def has_image(self, reference: str) -> bool:
        try:
            return self._run(["image", "inspect", reference], timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    def login(self, registry: str, username: str, password: str) -> None:
        result = self._run(["login", "--username", username, "--password-stdin", registry], stdin=password)
        if result.returncode != 0:
            raise DeployError(f"{self.name} login to {registry} failed", detail=(result.stderr or result.stdout)[-2000:])

    def tag(self, source: str, target: str) -> None:
        result = self._run(["tag", source, target])
        if result.returncode != 0:
            raise DeployError(f"{self.name} tag {source} {target} failed", detail=(result.stderr or result.stdout)[-2000:])

    def push(self, reference: str, on_line: Callable[[str], None]) -> str | None:
        """Push; the pushed manifest's digest when the engine reports it."""
        with tempfile.TemporaryDirectory(prefix="toolkit-push-") as tmp:
            digest_file = Path(tmp) / "digest"
            args = ["push", reference]
            if self.name == "podman":
                args = ["push", "--digestfile", str(digest_file), reference]
            process = subprocess.Popen(
                [self.path, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
            )
            assert process.stdout is not None
            digest = None
            tail: list[str] = []
            for line in process.stdout:
                line = line.rstrip()
                on_line(line)
                tail = (tail + [line])[-40:]
                match = _DIGEST_LINE.search(line)
                if match:
                    digest = match.group(1)
            if process.wait() != 0:
                raise DeployError(f"{self.name} push {reference} failed", detail="\n".join(tail))
            if digest_file.is_file():
                digest = digest_file.read_text().strip() or digest
            return digest


def find_engine(preferred: str = "auto", image: str | None = None) -> ContainerEngine:
    """The engine to push with: `preferred`, or the first that runs (and holds `image`)."""
    names = ENGINES if preferred == "auto" else (preferred,)
    if preferred not in ("auto", *ENGINES):
        raise DeployError(f"unknown container engine '{preferred}': choose docker or podman")
    found = []
    for name in names:
        path = shutil.which(name)
        if path is None:
            continue
        engine = ContainerEngine(name, path)
        if not engine.available():
            continue
        found.append(engine)
        if image is None or engine.has_image(image):
            return engine
    if found and image is not None:
        raise DeployError(
            f"image {image} is not in the local {' or '.join(e.name for e in found)} image store: "
            "build it first (toolkit build), or pass --image with a registry reference or an image archive"
        )
    raise DeployError(
        "no running container engine (docker or podman) to push the image with: start one, or pass "
        "--image oci-archive:PATH / docker-archive:PATH (pushed through the registry API), or an image "
        "already in the target registry"
    )
