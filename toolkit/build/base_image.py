"""The base image an image is built on: its Python, C library and CPU architecture.

The wheelhouse is downloaded on the host for the image (pip's --python-version, --abi and
--platform), so the build must know the base image's Python minor version and glibc before the
build starts. Known base images (AWS Lambda's Python images, the official `python` images) are
described by their tag; any other base image is probed by running its `python3` once with the
container engine, or described with --python-version.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .errors import BuildError

# CPU architectures: OCI platform -> the machine name in wheel platform tags.
PLATFORM_ARCH = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}
ARCH_PLATFORM = {arch: platform for platform, arch in PLATFORM_ARCH.items()}

# When nothing says otherwise: Debian 12 (bookworm), the base of python:3.X-slim-bookworm.
DEFAULT_GLIBC = (2, 36)

# AWS Lambda base images: Amazon Linux 2023 (glibc 2.34) from Python 3.12 on, Amazon Linux 2
# (glibc 2.26) before.
_LAMBDA_IMAGE = re.compile(r"^(?:public\.ecr\.aws/lambda/python|amazon/aws-lambda-python):(3\.\d+)")
_PYTHON_IMAGE = re.compile(r"^(?:(?:docker\.io/)?(?:library/)?)python:(3\.\d+)(?:\.\d+)?(-.*)?$")
# Debian releases of the official python image variants, by tag suffix.
_DEBIAN_GLIBC = {"bookworm": (2, 36), "trixie": (2, 41), "bullseye": (2, 31)}

PROBE_SCRIPT = (
    "import json, os, platform, sys; "
    "print(json.dumps({'python': '%d.%d' % sys.version_info[:2], "
    "'implementation': sys.implementation.name, "
    "'libc': os.confstr('CS_GNU_LIBC_VERSION') if 'CS_GNU_LIBC_VERSION' in os.confstr_names else '', "
    "'machine': platform.machine(), "
    "'lambda_base': os.path.exists('/lambda-entrypoint.sh') and os.path.isdir('/var/runtime')}))"
)


@dataclass(frozen=True)
class BaseImage:
    reference: str
    python: str  # "3.12"
    glibc: tuple[int, int]
    arch: str  # "x86_64" or "aarch64"
    lambda_base: bool  # an AWS Lambda base image (its own runtime interface client)
    source: str  # how it was learned: "known tag", "probed", "--python-version"

    @property
    def python_tag(self) -> str:
        """cp312 for 3.12."""
        return "cp" + self.python.replace(".", "")

    def wheel_platforms(self) -> list[str]:
        """Every manylinux platform tag this base can run, newest first (pip --platform)."""
        major, minor = self.glibc
        if major != 2:
            raise BuildError(f"unsupported C library version {major}.{minor} in base image {self.reference}")
        tags = [f"manylinux_2_{m}_{self.arch}" for m in range(minor, 16, -1)]
        tags.append(f"manylinux2014_{self.arch}")
        if self.arch == "x86_64":
            tags += [f"manylinux_2_{m}_{self.arch}" for m in range(16, 4, -1)]
            tags += [f"manylinux2010_{self.arch}", f"manylinux1_{self.arch}"]
        return tags


def known_base_image(reference: str, arch: str) -> BaseImage | None:
    """Describe a well-known base image from its reference alone (no engine needed)."""
    match = _LAMBDA_IMAGE.match(reference)
    if match:
        python = match.group(1)
        glibc = (2, 34) if tuple(map(int, python.split("."))) >= (3, 12) else (2, 26)
        return BaseImage(reference, python, glibc, arch, True, "known tag")
    match = _PYTHON_IMAGE.match(reference)
    if match and match.group(2) and "alpine" in match.group(2):
        return None  # musl: no manylinux wheels
    if match:
        suffix = match.group(2) or ""
        glibc = next((v for k, v in _DEBIAN_GLIBC.items() if k in suffix), DEFAULT_GLIBC)
        return BaseImage(reference, match.group(1), glibc, arch, False, "known tag")
    return None


def parse_probe(reference: str, output: str, arch: str) -> BaseImage:
    """Read the JSON line PROBE_SCRIPT printed inside the base image."""
    line = next((ln for ln in reversed(output.strip().splitlines()) if ln.startswith("{")), "")
    try:
        data = json.loads(line)
    except json.JSONDecodeError:
        raise BuildError(f"could not read the Python of base image {reference}", detail=output[-2000:]) from None
    if data.get("implementation") != "cpython":
        raise BuildError(f"base image {reference} runs {data.get('implementation')}, not CPython")
    libc = str(data.get("libc") or "")
    match = re.match(r"glibc (\d+)\.(\d+)", libc)
    if not match:
        raise BuildError(
            f"base image {reference} has no glibc ({libc or 'unknown C library'}): the runtime's wheels "
            "(numpy, onnxruntime) are manylinux wheels; use a glibc-based image (Debian, Ubuntu, Amazon Linux)"
        )
    machine = str(data.get("machine"))
    if machine != arch:
        raise BuildError(f"base image {reference} is {machine}, not {arch} (--platform {ARCH_PLATFORM.get(arch, arch)})")
    return BaseImage(
        reference,
        str(data["python"]),
        (int(match.group(1)), int(match.group(2))),
        machine,
        bool(data.get("lambda_base")),
        "probed",
    )


def from_python_version(reference: str, python: str, arch: str) -> BaseImage:
    if not re.fullmatch(r"3\.\d+", python):
        raise BuildError(f"--python-version must look like 3.12, not '{python}'")
    lambda_base = bool(_LAMBDA_IMAGE.match(reference))
    return BaseImage(reference, python, DEFAULT_GLIBC if not lambda_base else (2, 34), arch, lambda_base, "--python-version")
