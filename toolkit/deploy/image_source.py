"""Where the image to deploy comes from: `--image VALUE`.

- `oci-archive:PATH`: an OCI image archive (`podman save --format oci-archive`, `buildah push
  IMAGE oci-archive:PATH`, `docker buildx build --output type=oci,dest=PATH`)
- `docker-archive:PATH`: `docker save -o PATH IMAGE`
- `oci:DIR`: an OCI image layout directory
- anything else: an image reference, `[REGISTRY/]REPOSITORY[:TAG][@sha256:DIGEST]`, either already
  in the target registry (used as it is) or a local image of the container engine (pushed).

The transport prefixes are the ones skopeo, podman and buildah use (containers-transports(5)).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .errors import DeployOptionError

ARCHIVE_TRANSPORTS = ("oci-archive", "docker-archive", "oci")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class ArchiveImage:
    transport: str  # oci-archive, docker-archive or oci
    path: Path

    def __str__(self) -> str:
        return f"{self.transport}:{self.path}"


@dataclass(frozen=True)
class ImageReference:
    registry: str | None  # host[:port], None for a short name (docker.io or a local image)
    repository: str
    tag: str | None
    digest: str | None

    def __str__(self) -> str:
        text = f"{self.registry}/{self.repository}" if self.registry else self.repository
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text

    @property
    def name(self) -> str:
        """The last path component: what a pushed copy is named by default."""
        return self.repository.rsplit("/", 1)[-1]

    def pinned(self, digest: str) -> "ImageReference":
        return ImageReference(self.registry, self.repository, None, digest)


def parse_reference(value: str) -> ImageReference:
    text = value.strip()
    if not text or any(c.isspace() for c in text):
        raise DeployOptionError(f"invalid image reference '{value}'")
    digest = None
    if "@" in text:
        text, digest = text.split("@", 1)
        if not _DIGEST.match(digest):
            raise DeployOptionError(f"invalid image digest '{digest}' in '{value}': expected sha256:<64 hex digits>")
    registry = None
    first, _, rest = text.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        registry, text = first, rest
    tag = None
    last_slash = text.rfind("/")
    colon = text.rfind(":")
    if colon > last_slash:
        text, tag = text[:colon], text[colon + 1:]
    if not text or not re.match(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$", text):
        raise DeployOptionError(f"invalid image reference '{value}': repository names are lower-case")
    if tag is not None and not re.match(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$", tag):
        raise DeployOptionError(f"invalid image tag '{tag}' in '{value}'")
    return ImageReference(registry, text, tag, digest)


def parse_image(value: str) -> ArchiveImage | ImageReference:
    transport, sep, rest = value.partition(":")
    if sep and transport in ARCHIVE_TRANSPORTS:
        path = Path(rest.split(":", 1)[0]).expanduser()  # an optional ":reference" suffix is ignored
        if not path.exists():
            raise DeployOptionError(f"image archive {path} does not exist")
        if transport == "oci" and not path.is_dir():
            raise DeployOptionError(f"oci:{path} must be an OCI layout directory (use oci-archive: for a tar file)")
        if transport != "oci" and not path.is_file():
            raise DeployOptionError(f"{transport}:{path} must be a tar file")
        return ArchiveImage(transport, path)
    return parse_reference(value)
