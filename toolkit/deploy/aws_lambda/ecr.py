"""Amazon ECR: the function's repository and the image push.

Two ways in, both ending with the image in ECR, pinned by digest:

- a local engine image: an ECR authorization token from boto3 (GetAuthorizationToken), handed to
  `docker|podman login --password-stdin`, then the engine's own tag and push;
- an image archive (oci-archive:, docker-archive:, oci:): ECR's layer API, the calls the Docker CLI
  makes for a push: BatchCheckLayerAvailability, InitiateLayerUpload / UploadLayerPart /
  CompleteLayerUpload for each missing blob (parts of the size ECR asks for, in order), PutImage
  with the manifest. No container engine needed.

An image already in the target registry is resolved to its digest and used as it is.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engine import ContainerEngine, find_engine
from ..errors import DeployError
from ..image_archive import ArchivedImage, open_archive
from ..image_source import ArchiveImage, ImageReference
from ..progress import DeployUI

MAX_PART_BYTES = 20 * 1024 * 1024  # UploadLayerPart's layerPartBlob limit
DEFAULT_PART_BYTES = 10 * 1024 * 1024


@dataclass(frozen=True)
class PushedImage:
    uri: str  # REGISTRY/REPOSITORY@sha256:DIGEST: what the function runs
    digest: str
    tag: str | None


def registry_host(account: str, region: str) -> str:
    suffix = ".amazonaws.com.cn" if region.startswith("cn-") else ".amazonaws.com"
    return f"{account}.dkr.ecr.{region}{suffix}"


def _error_code(exc: Exception) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Code", "")


def ensure_repository(ecr: Any, name: str, ui: DeployUI) -> dict[str, Any]:
    """The repository `name`, created (scan on push, mutable tags) when missing."""
    try:
        return ecr.describe_repositories(repositoryNames=[name])["repositories"][0]
    except Exception as exc:  # botocore.exceptions.ClientError
        if _error_code(exc) != "RepositoryNotFoundException":
            raise
    ui.step(f"creating ECR repository {name}")
    return ecr.create_repository(repositoryName=name, imageScanningConfiguration={"scanOnPush": True})["repository"]


def _upload_blob(ecr: Any, repository: str, blob: Any, ui: DeployUI) -> None:
    started = ecr.initiate_layer_upload(repositoryName=repository)
    upload_id = started["uploadId"]
    part_size = min(MAX_PART_BYTES, int(started.get("partSize") or DEFAULT_PART_BYTES))
    first = 0
    with blob.open() as handle:
        while True:
            chunk = handle.read(part_size)
            if not chunk:
                break
            ecr.upload_layer_part(
                repositoryName=repository, uploadId=upload_id, partFirstByte=first,
                partLastByte=first + len(chunk) - 1, layerPartBlob=chunk,
            )
            first += len(chunk)
    if first != blob.size:
        raise DeployError(f"blob {blob.digest}: read {first} bytes, the manifest says {blob.size}")
    try:
        done = ecr.complete_layer_upload(repositoryName=repository, uploadId=upload_id, layerDigests=[blob.digest])
    except Exception as exc:
        if _error_code(exc) == "LayerAlreadyExistsException":
            return
        raise
    if done.get("layerDigest") != blob.digest:
        raise DeployError(
            f"ECR computed {done.get('layerDigest')} for the blob declared as {blob.digest}: the archive is corrupt"
        )
    ui.line(f"uploaded {blob.digest} ({blob.size} bytes)")


def push_archived(ecr: Any, repository: str, image: ArchivedImage, tag: str, ui: DeployUI) -> str:
    """Upload the blobs ECR lacks and put the manifest; the image digest."""
    digests = [b.digest for b in image.blobs]
    answer = ecr.batch_check_layer_availability(repositoryName=repository, layerDigests=digests)
    available = {l["layerDigest"] for l in answer.get("layers", []) if l.get("layerAvailability") == "AVAILABLE"}
    missing = [b for b in image.blobs if b.digest not in available]
    ui.line(f"{len(image.blobs) - len(missing)} of {len(image.blobs)} blobs already in ECR")
    for blob in missing:
        _upload_blob(ecr, repository, blob, ui)
    try:
        put = ecr.put_image(
            repositoryName=repository, imageManifest=image.manifest.decode("utf-8"),
            imageManifestMediaType=image.media_type, imageTag=tag, imageDigest=image.digest,
        )
        digest = put["image"]["imageId"]["imageDigest"]
    except Exception as exc:
        if _error_code(exc) != "ImageAlreadyExistsException":
            raise
        digest = image.digest  # same manifest, same tag: already pushed
    if digest != image.digest:
        raise DeployError(f"ECR stored the manifest as {digest}, expected {image.digest}")
    return digest


def digest_in_ecr(ecr: Any, repository: str, reference: ImageReference) -> str:
    image_id = {"imageDigest": reference.digest} if reference.digest else {"imageTag": reference.tag or "latest"}
    try:
        details = ecr.describe_images(repositoryName=repository, imageIds=[image_id])["imageDetails"]
    except Exception as exc:
        if _error_code(exc) in ("ImageNotFoundException", "RepositoryNotFoundException"):
            raise DeployError(f"image {reference} is not in ECR") from None
        raise
    return details[0]["imageDigest"]


def engine_push(ecr: Any, source: str, registry: str, repository: str, tag: str, engine: ContainerEngine, ui: DeployUI) -> str:
    """Log the engine in with an ECR token, tag, push; the digest ECR holds."""
    token = ecr.get_authorization_token()["authorizationData"][0]
    username, _, password = base64.b64decode(token["authorizationToken"]).decode().partition(":")
    endpoint = token.get("proxyEndpoint") or f"https://{registry}"
    ui.step(f"logging {engine.name} in to {endpoint}")
    engine.login(endpoint, username, password)
    target = f"{registry}/{repository}:{tag}"
    engine.tag(source, target)
    ui.step(f"pushing {source} to {target} with {engine.name}")
    engine.push(target, ui.line)
    return digest_in_ecr(ecr, repository, ImageReference(registry, repository, tag, None))


def push_image(
    ecr: Any,
    source: ArchiveImage | ImageReference,
    *,
    account: str,
    region: str,
    repository: str,
    tag: str | None,
    platform: str,
    engine_name: str,
    workdir: Path,
    ui: DeployUI,
) -> PushedImage:
    registry = registry_host(account, region)
    if isinstance(source, ImageReference) and source.registry == registry:
        # Already in this account's registry: no push, just the digest to pin.
        digest = source.digest or digest_in_ecr(ecr, source.repository, source)
        return PushedImage(f"{registry}/{source.repository}@{digest}", digest, source.tag)
    # the engine (and the image in it) is checked before anything is created in the account
    engine = None if isinstance(source, ArchiveImage) else find_engine(engine_name, image=str(source))
    ensure_repository(ecr, repository, ui)
    if isinstance(source, ArchiveImage):
        with open_archive(source, platform, workdir) as image:
            if image.platform != platform:
                raise DeployError(f"{source} is a {image.platform} image; the function runs {platform}")
            tag = tag or f"toolkit-{image.digest[7:19]}"
            ui.step(f"pushing {source} to {registry}/{repository}:{tag} through the ECR API")
            digest = push_archived(ecr, repository, image, tag, ui)
    else:
        assert engine is not None
        tag = tag or source.tag or "latest"
        digest = engine_push(ecr, str(source), registry, repository, tag, engine, ui)
    return PushedImage(f"{registry}/{repository}@{digest}", digest, tag)
