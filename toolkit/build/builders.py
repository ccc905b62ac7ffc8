"""Container engines driven through their command lines: docker (BuildKit), podman, buildah.

`detect_builder("auto")` takes the first engine that answers: a docker client whose daemon is
reachable (preferring one that can use BuildKit), then podman, then buildah. `none` builds
nothing: the context is written and the exact build command printed.

Engine configuration stays the engine's: DOCKER_HOST for docker; containers-storage settings
(storage.conf, STORAGE_DRIVER, BUILDAH_ISOLATION) for podman and buildah. `TOOLKIT_DOCKER`
names the docker client to use when several are installed.
"""

from __future__ import annotations

import abc
import json
import os
import platform as host_platform
import re
import shlex
import shutil
import subprocess
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from ipaddress import ip_address
from pathlib import Path

from .base_image import PLATFORM_ARCH
from .errors import BuildError

OnLine = Callable[[str], None]
BUILDERS = ("auto", "docker", "podman", "buildah", "none")
PROBE_TIMEOUT = 30


@dataclass(frozen=True)
class Layer:
    created_by: str
    size: int


@dataclass
class ImageInfo:
    reference: str
    id: str
    size: int
    layers: list[Layer] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    user: str = ""
    architecture: str = ""
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)


def _run(command: Sequence[str], env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(list(command), check=False, capture_output=True, text=True, env=env, timeout=timeout)


def _stream(command: Sequence[str], env: dict[str, str] | None, on_line: OnLine | None, what: str) -> None:
    """Run `command`, handing each output line to `on_line`; raise with the output's tail on failure."""
    tail: deque[str] = deque(maxlen=40)
    process = subprocess.Popen(
        list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, bufsize=1
    )
    assert process.stdout is not None
    for line in process.stdout:
        line = line.rstrip("\n")
        tail.append(line)
        if on_line:
            on_line(line)
    code = process.wait()
    if code != 0:
        error = BuildError(f"{what} failed (exit {code}): {shlex.join(command)}", detail="\n".join(tail))
        error.streamed = on_line is not None
        raise error


def is_loopback_registry(registry: str) -> bool:
    host = registry.split("/", 1)[0].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ip_address(host).is_loopback
    except ValueError:
        return False


def check_platform_buildable(platform: str) -> None:
    """The install stage RUNs the image's python3: a foreign architecture needs QEMU binfmt."""
    arch = PLATFORM_ARCH[platform]
    machine = host_platform.machine().lower()
    host = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    if arch == host:
        return
    qemu = Path("/proc/sys/fs/binfmt_misc") / f"qemu-{arch}"
    if not qemu.exists():
        raise BuildError(
            f"cannot build {platform} images on this {host} host: the image build runs the base image's python3, "
            f"which needs QEMU user emulation (binfmt_misc qemu-{arch} is not registered; e.g. apt-get install "
            "qemu-user-static binfmt-support). Or build on a native host: --builder none writes the context"
        )


class Builder(abc.ABC):
    """One container engine CLI (DockerBuilder, PodmanBuilder, BuildahBuilder)."""

    name = "engine"
    can_run = False  # can start a service container (cold start measurement)

    def __init__(self, executable: str, env: dict[str, str] | None = None) -> None:
        self.executable = executable
        self.env = env

    # -- commands ---------------------------------------------------------------------------------
    @abc.abstractmethod
    def build_command(self, context: Path, tags: list[str], platform: str) -> list[str]:
        ...

    def env_prefix(self) -> str:
        """Environment assignments to print before the build command."""
        return ""

    def printable_build_command(self, context: Path, tags: list[str], platform: str) -> str:
        return self.env_prefix() + shlex.join(self.build_command(context, tags, platform))

    def build(self, context: Path, tags: list[str], platform: str, on_line: OnLine | None = None) -> None:
        _stream(self.build_command(context, tags, platform), self.env, on_line, f"{self.name} build")

    @abc.abstractmethod
    def push(self, reference: str, on_line: OnLine | None = None) -> None:
        ...

    @abc.abstractmethod
    def inspect(self, reference: str) -> ImageInfo:
        ...

    @abc.abstractmethod
    def probe(self, image: str, script: str, platform: str) -> str:
        """Run `python3 -c script` in `image` (no network); its output."""

    def run_detached(self, image: str, args: list[str], command: list[str] | None = None) -> str:
        """Start `image` in the background with engine options `args` (and `command` after the
        image: the entrypoint's arguments); return the container's name."""
        raise BuildError(f"{self.name} cannot run images here")

    def remove_container(self, container: str) -> None:
        pass

    def running(self, container: str) -> bool:
        return False

    def logs(self, container: str) -> str:
        return ""


class DockerBuilder(Builder):
    name = "docker"
    can_run = True

    def __init__(self, executable: str, env: dict[str, str] | None = None, buildkit: bool = True) -> None:
        env = dict(env if env is not None else os.environ)
        env["DOCKER_BUILDKIT"] = "1" if buildkit else "0"
        super().__init__(executable, env)
        self.buildkit = buildkit

    def env_prefix(self) -> str:
        return f"DOCKER_BUILDKIT={'1' if self.buildkit else '0'} "

    def build_command(self, context: Path, tags: list[str], platform: str) -> list[str]:
        command = [self.executable, "build"]
        if self.buildkit:
            command.append("--progress=plain")
        command += ["--network", "none", "--platform", platform]
        for tag in tags:
            command += ["-t", tag]
        return command + ["-f", str(context / "Dockerfile"), str(context)]

    def push(self, reference: str, on_line: OnLine | None = None) -> None:
        _stream([self.executable, "push", reference], self.env, on_line, "docker push")

    def inspect(self, reference: str) -> ImageInfo:
        result = _run([self.executable, "image", "inspect", reference], self.env)
        if result.returncode != 0:
            raise BuildError(f"docker image inspect {reference} failed", detail=result.stderr[-2000:])
        data = json.loads(result.stdout)[0]
        history = _run(
            [self.executable, "history", "--no-trunc", "--human=false", "--format", "{{json .}}", reference], self.env
        )
        layers: list[Layer] = []
        for line in history.stdout.splitlines():
            if line.strip():
                entry = json.loads(line)
                layers.append(Layer(entry.get("CreatedBy", ""), int(entry.get("Size") or 0)))
        config = data.get("Config") or {}
        return ImageInfo(
            reference, data["Id"], int(data["Size"]), layers[::-1], config.get("Labels") or {},
            config.get("User", ""), data.get("Architecture", ""), config.get("Entrypoint") or [], config.get("Cmd") or [],
        )

    def probe(self, image: str, script: str, platform: str) -> str:
        result = _run(
            [self.executable, "run", "--rm", "--network", "none", "--platform", platform, "--entrypoint", "python3",
             image, "-c", script],
            self.env,
            timeout=600,
        )
        if result.returncode != 0:
            raise BuildError(f"could not run python3 in base image {image}", detail=(result.stdout + result.stderr)[-2000:])
        return result.stdout

    def run_detached(self, image: str, args: list[str], command: list[str] | None = None) -> str:
        name = f"toolkit-build-{uuid.uuid4().hex[:12]}"
        try:
            result = _run([self.executable, "run", "-d", "--name", name, *args, image, *(command or [])], self.env, timeout=600)
        except BaseException:  # interrupted (Ctrl-C, SIGTERM, timeout) while the engine creates it
            self.remove_container(name)
            raise
        if result.returncode != 0:
            self.remove_container(name)  # created but not started: leave nothing behind
            raise BuildError(f"could not start {image}", detail=result.stderr[-2000:])
        return name

    def remove_container(self, container: str) -> None:
        _run([self.executable, "rm", "-f", container], self.env)

    def running(self, container: str) -> bool:
        result = _run([self.executable, "inspect", "--format", "{{.State.Running}}", container], self.env)
        return result.returncode == 0 and result.stdout.strip() == "true"

    def logs(self, container: str) -> str:
        result = _run([self.executable, "logs", container], self.env)
        return result.stdout + result.stderr


class PodmanBuilder(DockerBuilder):
    name = "podman"

    def __init__(self, executable: str, env: dict[str, str] | None = None) -> None:
        Builder.__init__(self, executable, dict(env if env is not None else os.environ))
        self.buildkit = False

    def env_prefix(self) -> str:
        return ""

    def _network_none(self) -> list[str]:
        """RUN steps need no network; chroot isolation has no network namespace to take away."""
        if (self.env or {}).get("BUILDAH_ISOLATION") == "chroot":
            return []
        return ["--network", "none"]

    def build_command(self, context: Path, tags: list[str], platform: str) -> list[str]:
        command = [self.executable, "build", *self._network_none(), "--platform", platform]
        for tag in tags:
            command += ["-t", tag]
        return command + ["-f", str(context / "Dockerfile"), str(context)]

    def push(self, reference: str, on_line: OnLine | None = None) -> None:
        command = [self.executable, "push"]
        if is_loopback_registry(reference):
            command.append("--tls-verify=false")
        _stream([*command, reference, f"docker://{reference}"], self.env, on_line, f"{self.name} push")

    def inspect(self, reference: str) -> ImageInfo:
        result = _run([self.executable, "image", "inspect", reference], self.env)
        if result.returncode != 0:
            raise BuildError(f"{self.name} image inspect {reference} failed", detail=result.stderr[-2000:])
        data = json.loads(result.stdout)[0]
        history = _run([self.executable, "history", "--no-trunc", "--human=false", "--format", "json", reference], self.env)
        layers: list[Layer] = []
        if history.returncode == 0 and history.stdout.strip():
            for entry in json.loads(history.stdout):
                layers.append(Layer(entry.get("CreatedBy") or entry.get("createdBy", ""), int(entry.get("Size") or entry.get("size") or 0)))
        config = data.get("Config") or {}
        return ImageInfo(
            reference, data["Id"], int(data.get("Size") or 0), layers[::-1], config.get("Labels") or {},
            config.get("User", ""), data.get("Architecture", ""), config.get("Entrypoint") or [], config.get("Cmd") or [],
        )


_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def _buildah_size(value: object) -> int:
    """`buildah images --json` gives the size as bytes or, in buildah 1.2x, as go-units text
    ("309 MB", decimal units): bytes either way (the text form to its 3 significant digits)."""
    if isinstance(value, (int, float)):
        return int(value)
    match = re.fullmatch(r"\s*([0-9.]+)\s*([kKmMgGtT]?B)\s*", str(value or "0B"))
    if match is None:
        raise BuildError(f"buildah reported an image size it cannot read: {value!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


class BuildahBuilder(PodmanBuilder):
    name = "buildah"
    can_run = False

    def build_command(self, context: Path, tags: list[str], platform: str) -> list[str]:
        command = [self.executable, "bud", *self._network_none(), "--platform", platform]
        for tag in tags:
            command += ["-t", tag]
        return command + ["-f", str(context / "Dockerfile"), str(context)]

    def inspect(self, reference: str) -> ImageInfo:
        podman = shutil.which("podman")
        if podman:  # same containers-storage: podman reads layer sizes that buildah does not print
            return PodmanBuilder(podman, self.env).inspect(reference)
        result = _run([self.executable, "images", "--json", reference], self.env)
        if result.returncode != 0:
            raise BuildError(f"buildah images {reference} failed", detail=result.stderr[-2000:])
        data = json.loads(result.stdout)[0]
        return ImageInfo(reference, data.get("id", ""), _buildah_size(data.get("size")))

    def probe(self, image: str, script: str, platform: str) -> str:
        made = _run([self.executable, "from", "--platform", platform, image], self.env, timeout=600)
        if made.returncode != 0:
            raise BuildError(f"buildah from {image} failed", detail=made.stderr[-2000:])
        container = made.stdout.strip().splitlines()[-1]
        try:
            result = _run([self.executable, "run", "--network", "none", container, "--", "python3", "-c", script], self.env)
        finally:
            _run([self.executable, "rm", container], self.env)
        if result.returncode != 0:
            raise BuildError(f"could not run python3 in base image {image}", detail=(result.stdout + result.stderr)[-2000:])
        return result.stdout

    def run_detached(self, image: str, args: list[str], command: list[str] | None = None) -> str:
        raise BuildError("buildah cannot run a service container; use docker or podman to measure the cold start")


def _docker_candidates() -> list[str]:
    explicit = os.environ.get("TOOLKIT_DOCKER")
    if explicit:
        return [explicit]
    found: list[str] = []
    for folder in os.environ.get("PATH", "").split(os.pathsep) + ["/usr/bin"]:
        candidate = os.path.join(folder, "docker")
        if os.access(candidate, os.X_OK) and os.path.realpath(candidate) not in map(os.path.realpath, found):
            found.append(candidate)
    return found


def _docker_builder(executable: str) -> tuple[DockerBuilder | None, str]:
    """A docker client whose daemon answers; BuildKit if the client can drive it."""
    try:
        version = _run([executable, "version", "--format", "{{.Client.Version}} {{.Server.Version}}"], timeout=PROBE_TIMEOUT)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{executable}: {exc}"
    if version.returncode != 0:
        lines = (version.stderr or version.stdout).strip().splitlines()
        return None, f"{executable}: {lines[-1] if lines else 'no daemon'}"
    client = version.stdout.split()[0] if version.stdout.split() else "0"
    try:
        client_major = int(client.split(".")[0])
    except ValueError:
        client_major = 0
    buildx = _run([executable, "buildx", "version"], timeout=PROBE_TIMEOUT).returncode == 0
    # Clients before 23 drive BuildKit themselves (DOCKER_BUILDKIT=1); later ones need buildx.
    if buildx or client_major < 23:
        return DockerBuilder(executable, buildkit=True), ""
    return DockerBuilder(executable, buildkit=False), f"{executable}: docker {client} without buildx (no BuildKit)"


def _engine_answers(executable: str, *args: str) -> bool:
    try:
        return _run([executable, *args], timeout=PROBE_TIMEOUT).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def detect_builder(choice: str) -> tuple[Builder | None, list[str]]:
    """The builder for `--builder choice` and notes on what was skipped; None for `none`."""
    if choice not in BUILDERS:
        raise BuildError(f"unknown builder '{choice}': choose one of {', '.join(BUILDERS)}")
    notes: list[str] = []
    if choice == "none":
        return None, notes
    if choice in ("auto", "docker"):
        fallback: DockerBuilder | None = None
        for executable in _docker_candidates():
            builder, note = _docker_builder(executable)
            if note:
                notes.append(note)
            if builder is not None and builder.buildkit:
                return builder, []  # skipped clients do not matter once one drives BuildKit
            fallback = fallback or builder
        if fallback is not None:
            notes.append("building with docker's legacy builder: no BuildKit-capable docker client found")
            return fallback, notes
        if choice == "docker":
            raise BuildError(
                "docker is not usable: " + ("; ".join(notes) or "no docker client found")
                + " (start the daemon or set DOCKER_HOST; TOOLKIT_DOCKER picks the client)"
            )
    if choice in ("auto", "podman"):
        podman = shutil.which("podman")
        if podman and _engine_answers(podman, "info"):
            return PodmanBuilder(podman), notes
        if choice == "podman":
            raise BuildError("podman is not installed or `podman info` fails")
    if choice in ("auto", "buildah"):
        buildah = shutil.which("buildah")
        if buildah and _engine_answers(buildah, "version"):
            return BuildahBuilder(buildah), notes
        if choice == "buildah":
            raise BuildError("buildah is not installed or `buildah version` fails")
    raise BuildError(
        "no container engine found (docker with a reachable daemon, podman or buildah): "
        + ("; ".join(notes) + "; " if notes else "")
        + "use --builder none to write the build context and print the build command"
    )


def printable_command(choice: str, context: Path, tags: list[str], platform: str) -> str:
    """The build command for `--builder none` (docker with BuildKit unless another engine is named)."""
    builder: Builder = DockerBuilder("docker", env={}, buildkit=True)
    return builder.printable_build_command(context, tags, platform)


def wait_ready(url: str, timeout: float, is_alive: Callable[[], bool]) -> float | None:
    """Seconds until `url` answers 200, or None on timeout / when the server died."""
    import urllib.error
    import urllib.request

    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return time.monotonic() - start
        except (urllib.error.URLError, OSError):
            pass
        if not is_alive():
            return None
        time.sleep(0.1)
    return None
