"""Read a container image from an archive, ready to push blob by blob through a registry API.

Formats (see image_source.py): an OCI image layout (as a directory, or as a tar: oci-archive) and
docker-archive (`docker save`). The result is the image's manifest (the exact bytes to push), its
config blob and its layer blobs.

Layers stored uncompressed (docker save always does; podman's OCI archives often do) are gzip
compressed on the way, as `docker push` does, because registries and AWS Lambda expect compressed
layers. The compression is deterministic (no timestamp, no file name), so the same archive always
gives the same layer digests and the same image digest: pushing twice changes nothing.
An OCI manifest whose layers are already compressed is pushed byte for byte (its digest is kept).
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Callable, Iterator

from .errors import DeployError
from .image_source import ArchiveImage

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"
DOCKER_LAYER = "application/vnd.docker.image.rootfs.diff.tar"
UNCOMPRESSED_LAYERS = {OCI_LAYER: OCI_LAYER + "+gzip", DOCKER_LAYER: DOCKER_LAYER_GZIP}
_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class Blob:
    digest: str  # "sha256:<hex>"
    size: int
    media_type: str
    opener: Callable[[], IO[bytes]]

    def open(self) -> IO[bytes]:
        return self.opener()

    def descriptor(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "size": self.size, "digest": self.digest}


@dataclass(frozen=True)
class ArchivedImage:
    manifest: bytes  # exactly what is pushed; its sha256 is the image digest
    media_type: str
    config: Blob
    layers: tuple[Blob, ...]
    platform: str  # "linux/amd64" ... from the config

    @property
    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(self.manifest).hexdigest()

    @property
    def blobs(self) -> tuple[Blob, ...]:
        return (self.config, *self.layers)


class _Source:
    """Files of a directory or of a tar, by path."""

    def __init__(self, image: ArchiveImage) -> None:
        self.image = image
        self._tar: tarfile.TarFile | None = None
        if image.transport != "oci":
            try:
                self._tar = tarfile.open(image.path, "r:*")
                self._members = {m.name.removeprefix("./"): m for m in self._tar.getmembers() if m.isfile()}
            except (tarfile.TarError, OSError) as exc:
                raise DeployError(f"cannot read image archive {image.path}: {exc}") from None

    def exists(self, name: str) -> bool:
        if self._tar is None:
            return (self.image.path / name).is_file()
        return name in self._members

    def open(self, name: str) -> IO[bytes]:
        if self._tar is None:
            return open(self.image.path / name, "rb")
        member = self._members.get(name)
        handle = self._tar.extractfile(member) if member is not None else None
        if handle is None:
            raise DeployError(f"image archive {self.image.path} has no {name}")
        return handle

    def size(self, name: str) -> int:
        if self._tar is None:
            return (self.image.path / name).stat().st_size
        return self._members[name].size

    def read_json(self, name: str) -> Any:
        if not self.exists(name):
            raise DeployError(f"{self.image} is not a valid {self.image.transport} image: {name} is missing")
        with self.open(name) as handle:
            try:
                return json.loads(handle.read())
            except json.JSONDecodeError as exc:
                raise DeployError(f"{self.image}: {name} is not JSON ({exc})") from None

    def read(self, name: str) -> bytes:
        with self.open(name) as handle:
            return handle.read()


def _blob_path(digest: str) -> str:
    algorithm, _, hexdigest = digest.partition(":")
    return f"blobs/{algorithm}/{hexdigest}"


def _platform_of(config: dict[str, Any]) -> str:
    platform = f"{config.get('os', 'linux')}/{config.get('architecture', 'amd64')}"
    return platform + (f"/{config['variant']}" if config.get("variant") and config.get("architecture") == "arm" else "")


def _sha256_of(handle: IO[bytes]) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    while chunk := handle.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
    return "sha256:" + digest.hexdigest(), size


def _compress(source: Callable[[], IO[bytes]], workdir: Path) -> tuple[Path, str, int]:
    """gzip (deterministic: mtime 0, no file name) into workdir; (path, digest, size)."""
    workdir.mkdir(parents=True, exist_ok=True)
    partial = workdir / "layer.partial"
    with source() as raw, open(partial, "wb") as out:
        with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=6) as packed:
            shutil.copyfileobj(raw, packed, _CHUNK)
    with open(partial, "rb") as handle:
        digest, size = _sha256_of(handle)
    final = workdir / digest.replace(":", "-")
    partial.replace(final)
    return final, digest, size


def _file_opener(path: Path) -> Callable[[], IO[bytes]]:
    return lambda: open(path, "rb")


def _member_opener(source: _Source, name: str) -> Callable[[], IO[bytes]]:
    return lambda: source.open(name)


def _choose_manifest(source: _Source, index: dict[str, Any], platform: str) -> dict[str, Any]:
    """Follow an OCI index (possibly nested) to the manifest for `platform`."""
    manifests = index.get("manifests") or []
    if not manifests:
        raise DeployError(f"{source.image}: the image index lists no manifest")
    wanted_os, _, wanted_arch = platform.partition("/")
    candidates = [m for m in manifests if m.get("mediaType") in (OCI_MANIFEST, DOCKER_MANIFEST, OCI_INDEX, DOCKER_LIST, None)]
    matching = [
        m for m in candidates
        if m.get("platform") and m["platform"].get("os") == wanted_os and m["platform"].get("architecture") == wanted_arch.split("/")[0]
    ]
    chosen = matching[0] if matching else candidates[0] if len(candidates) == 1 else None
    if chosen is None:
        found = ", ".join(f"{m.get('platform', {}).get('os')}/{m.get('platform', {}).get('architecture')}" for m in candidates)
        raise DeployError(f"{source.image} has no {platform} image (it has: {found})")
    if chosen.get("mediaType") in (OCI_INDEX, DOCKER_LIST):
        return _choose_manifest(source, source.read_json(_blob_path(chosen["digest"])), platform)
    return chosen


def _load_oci(source: _Source, platform: str, workdir: Path) -> ArchivedImage:
    index = source.read_json("index.json")
    descriptor = _choose_manifest(source, index, platform)
    manifest_bytes = source.read(_blob_path(descriptor["digest"]))
    manifest = json.loads(manifest_bytes)
    media_type = manifest.get("mediaType") or descriptor.get("mediaType") or OCI_MANIFEST
    config_desc = manifest["config"]
    config_name = _blob_path(config_desc["digest"])
    config = Blob(config_desc["digest"], config_desc["size"], config_desc.get("mediaType", OCI_CONFIG), _member_opener(source, config_name))
    config_doc = source.read_json(config_name)

    layers: list[Blob] = []
    rewritten = False
    for layer in manifest.get("layers", []):
        name = _blob_path(layer["digest"])
        if not source.exists(name):
            raise DeployError(f"{source.image}: layer {layer['digest']} is missing from the archive")
        layer_type = layer.get("mediaType", OCI_LAYER)
        if layer_type in UNCOMPRESSED_LAYERS:
            path, digest, size = _compress(_member_opener(source, name), workdir)
            layers.append(Blob(digest, size, UNCOMPRESSED_LAYERS[layer_type], _file_opener(path)))
            rewritten = True
        else:
            layers.append(Blob(layer["digest"], layer["size"], layer_type, _member_opener(source, name)))
    if rewritten:
        document = {k: v for k, v in manifest.items() if k not in ("layers",)}
        document["layers"] = [b.descriptor() for b in layers]
        manifest_bytes = json.dumps(document, separators=(",", ":")).encode()
    return ArchivedImage(manifest_bytes, media_type, config, tuple(layers), _platform_of(config_doc))


def _load_docker(source: _Source, platform: str, workdir: Path) -> ArchivedImage:
    entries = source.read_json("manifest.json")
    if not isinstance(entries, list) or not entries:
        raise DeployError(f"{source.image}: manifest.json lists no image")
    if len(entries) > 1:
        raise DeployError(f"{source.image} holds {len(entries)} images: save one image per archive")
    entry = entries[0]
    config_name = entry["Config"]
    with source.open(config_name) as handle:
        config_digest, config_size = _sha256_of(handle)
    config = Blob(config_digest, config_size, DOCKER_CONFIG, _member_opener(source, config_name))
    layers = []
    for name in entry.get("Layers", []):
        with source.open(name) as probe:
            compressed = probe.read(2) == b"\x1f\x8b"
        if compressed:
            with source.open(name) as handle:
                digest, size = _sha256_of(handle)
            layers.append(Blob(digest, size, DOCKER_LAYER_GZIP, _member_opener(source, name)))
        else:
            path, digest, size = _compress(_member_opener(source, name), workdir)
            layers.append(Blob(digest, size, DOCKER_LAYER_GZIP, _file_opener(path)))
    document = {
        "schemaVersion": 2,
        "mediaType": DOCKER_MANIFEST,
        "config": config.descriptor(),
        "layers": [b.descriptor() for b in layers],
    }
    manifest = json.dumps(document, separators=(",", ":")).encode()
    return ArchivedImage(manifest, DOCKER_MANIFEST, config, tuple(layers), _platform_of(source.read_json(config_name)))


@contextlib.contextmanager
def open_archive(image: ArchiveImage, platform: str, workdir: Path) -> Iterator[ArchivedImage]:
    """The image in `image` for `platform`; compressed layers are written under `workdir`."""
    source = _Source(image)
    try:
        if source.exists("index.json") and image.transport != "docker-archive":
            yield _load_oci(source, platform, workdir)
        elif source.exists("manifest.json"):
            yield _load_docker(source, platform, workdir)
        elif source.exists("index.json"):
            yield _load_oci(source, platform, workdir)
        else:
            raise DeployError(f"{image} is neither an OCI layout (index.json) nor a docker archive (manifest.json)")
    finally:
        if source._tar is not None:
            source._tar.close()
