"""Remote model repositories (``s3://`` and ``gs://``), copied to a local cache.

Triton localises a remote repository into a temporary directory each time it loads it; the
toolkit keeps one cache directory per repository location instead and re-fetches it
incrementally, then treats it exactly like a local directory.

Locations (Triton's forms, see docs/remote-repositories.md):

    s3://bucket[/prefix]                          boto3's endpoint (AWS, or AWS_ENDPOINT_URL[_S3])
    s3://host:port/bucket[/prefix]                an S3-compatible server, over http
    s3://http://host:port/bucket[/prefix]         the same, explicitly http
    s3://https://host:port/bucket[/prefix]        the same over https
    gs://bucket[/prefix]                          Google Cloud Storage (STORAGE_EMULATOR_HOST honoured)

Credentials: boto3's default chain and google-auth's application default credentials, or the
entry of Triton's ``TRITON_CLOUD_CREDENTIAL_PATH`` file whose name is the longest prefix of the
location. With no credentials at all, requests are sent anonymously (as Triton does), so public
buckets work.

Cache: ``$TOOLKIT_CACHE_DIR`` (default ``~/.cache/toolkit/repositories``) holds one directory per
location (scheme, endpoint, bucket, prefix)::

    <scheme>-<bucket>-<hash>/
      repository/     the copy handed to the compiler
      manifest.json   per file: the object's size and fingerprint, and the local file's identity
      .partial/       downloads in progress (emptied at the start of every fetch)
      .lock           serialises fetches of the same location (flock)

A cached file is reused only when the object's size and fingerprint (S3 ETag; GCS generation
and MD5) match the manifest AND the local file is still the very file that was written after a
complete download (inode, size, mtime). Downloads land in ``.partial/`` and are renamed into
place only when complete, so an interrupted fetch never leaves a file a later fetch trusts.
Local files whose objects are gone are deleted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import stat
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .errors import RepositoryError

__all__ = [
    "CACHE_DIR_ENV",
    "CREDENTIAL_FILE_ENV",
    "ObjectStore",
    "RemoteLocation",
    "RemoteObject",
    "RemoteSync",
    "cache_root",
    "fetch_repository",
    "open_store",
    "parse_remote_url",
    "sync_repository",
]

logger = logging.getLogger(__name__)

CACHE_DIR_ENV = "TOOLKIT_CACHE_DIR"
CREDENTIAL_FILE_ENV = "TRITON_CLOUD_CREDENTIAL_PATH"
DEFAULT_CACHE_DIR = Path("~/.cache/toolkit/repositories")
REPOSITORY_DIRNAME = "repository"
MANIFEST_FILENAME = "manifest.json"
PARTIAL_DIRNAME = ".partial"
LOCK_FILENAME = ".lock"
MANIFEST_FORMAT = 1
DOWNLOAD_WORKERS = 8

_S3_EXTRA = "pip install 'triton-serverless-toolkit[s3]'"
_GCS_EXTRA = "pip install 'triton-serverless-toolkit[gcs]'"
# Triton's S3 endpoint form: s3://[http://|https://]host:port/bucket/path (a port is required).
_HOST_PORT = re.compile(r"[0-9A-Za-z.\-]+:[0-9]+")


# --------------------------------------------------------------------------------------------
# Locations


@dataclass(frozen=True)
class RemoteLocation:
    """A parsed remote repository location."""

    url: str  # as the user wrote it (messages and credential-file matching use it)
    scheme: str  # "s3" or "gs"
    bucket: str
    prefix: str  # object-key prefix without leading/trailing '/', "" for the bucket root
    endpoint: str | None = None  # "http(s)://host:port" from Triton's s3://host:port/... form

    @property
    def list_prefix(self) -> str:
        """The key prefix that selects the repository's objects."""
        return f"{self.prefix}/" if self.prefix else ""

    def object_url(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}/{key}"

    @property
    def directory_url(self) -> str:
        return f"{self.scheme}://{self.bucket}/{self.list_prefix}"


def parse_remote_url(url: str) -> RemoteLocation:
    """Parse ``s3://`` and ``gs://`` repository locations the way Triton reads them.

    Repeated, leading and trailing slashes in the path are dropped (Triton's CleanPath).
    """
    scheme, separator, rest = url.partition("://")
    if not separator:
        raise RepositoryError(f"'{url}' is not a remote model repository location (scheme://bucket/path)")
    if scheme == "s3":
        return _parse_s3(url, rest)
    if scheme == "gs":
        segments = [s for s in rest.split("/") if s]
        if not segments:
            raise RepositoryError(f"invalid model repository location '{url}': no bucket name found in path")
        return RemoteLocation(url, "gs", segments[0], "/".join(segments[1:]))
    if scheme == "as":
        raise RepositoryError(
            f"model repository '{url}': Azure Storage (as://) repositories are not supported; "
            "use s3://, gs:// or a local directory"
        )
    raise RepositoryError(
        f"unsupported model repository location '{url}': "
        "use a local directory, s3://bucket/path or gs://bucket/path"
    )


def _parse_s3(url: str, rest: str) -> RemoteLocation:
    protocol = None
    for candidate in ("https", "http"):
        if rest.startswith(candidate + "://"):
            protocol = candidate
            rest = rest[len(candidate) + 3 :]
            break
    segments = [s for s in rest.split("/") if s]
    endpoint = None
    if segments and _HOST_PORT.fullmatch(segments[0]):
        # Triton talks plain http to s3://host:port/... unless the form names https.
        endpoint = f"{protocol or 'http'}://{segments[0]}"
        segments = segments[1:]
    elif protocol is not None:
        raise RepositoryError(
            f"invalid model repository location '{url}': after s3://{protocol}:// Triton expects "
            f"host:port/bucket/path (e.g. s3://{protocol}://minio.local:9000/bucket/models)"
        )
    if not segments:
        raise RepositoryError(f"invalid model repository location '{url}': no bucket name found in path")
    return RemoteLocation(url, "s3", segments[0], "/".join(segments[1:]), endpoint)


# --------------------------------------------------------------------------------------------
# Object stores


@dataclass(frozen=True)
class RemoteObject:
    """One listed object: its full key, size and a fingerprint that changes with its content."""

    key: str
    size: int
    fingerprint: str


class ObjectStore(Protocol):
    """What a fetch needs from a storage service. Methods raise RepositoryError."""

    endpoint: str

    def list_objects(self, location: RemoteLocation) -> Iterator[RemoteObject]: ...

    def download(self, location: RemoteLocation, obj: RemoteObject, destination: Path) -> None: ...


def open_store(location: RemoteLocation) -> ObjectStore:
    """A client for the location's service, with credentials resolved the way Triton does."""
    if location.scheme == "s3":
        return S3Store(location)
    if location.scheme == "gs":
        return GCSStore(location)
    raise RepositoryError(f"unsupported model repository location '{location.url}'")


def _credential_entry(location: RemoteLocation) -> tuple[bool, Any]:
    """Triton's TRITON_CLOUD_CREDENTIAL_PATH lookup: the entry under the scheme's section whose
    name is the longest string prefix of the location. (False, None) when the variable is unset."""
    path = os.environ.get(CREDENTIAL_FILE_ENV)
    if path is None:
        return False, None
    try:
        document = json.loads(Path(path).read_text())
    except OSError as exc:
        raise RepositoryError(
            f"cannot read {CREDENTIAL_FILE_ENV} file '{path}': {exc.strerror or exc}"
        ) from None
    except json.JSONDecodeError as exc:
        raise RepositoryError(f"{CREDENTIAL_FILE_ENV} file '{path}' is not valid JSON: {exc}") from None
    section = document.get(location.scheme, {}) if isinstance(document, dict) else {}
    if not isinstance(section, dict):
        section = {}
    for name in sorted(section, key=len, reverse=True):
        if location.url.startswith(name):
            logger.debug("using credential '%s' of %s for %s", name, path, location.url)
            return True, section[name]
    raise RepositoryError(
        f"cannot match a credential for '{location.url}' in {CREDENTIAL_FILE_ENV} file '{path}' "
        f'(add an entry under "{location.scheme}" whose name is a prefix of the location, or "")'
    )


class S3Store:
    """Amazon S3 and S3-compatible servers, through boto3."""

    def __init__(self, location: RemoteLocation) -> None:
        try:
            import boto3
            import botocore.exceptions
            from botocore import UNSIGNED
            from botocore.config import Config
        except ImportError:
            raise RepositoryError(
                f"reading the model repository '{location.url}' needs boto3: {_S3_EXTRA}"
            ) from None
        self._errors = botocore.exceptions
        try:
            session = self._session(boto3, location)
            config = Config(user_agent_extra="triton-serverless-toolkit")
            self.anonymous = session.get_credentials() is None
            if self.anonymous:
                # Like Triton (the AWS C++ SDK sends unsigned requests without credentials).
                config = config.merge(Config(signature_version=UNSIGNED))
            if location.endpoint is not None:
                # Triton's host:port form: path-style requests to that server.
                config = config.merge(Config(s3={"addressing_style": "path"}))
                self._client = session.client("s3", endpoint_url=location.endpoint, config=config)
            else:
                self._client = session.client("s3", config=config)
        except RepositoryError:
            raise
        except (self._errors.BotoCoreError, ValueError) as exc:
            raise RepositoryError(f"cannot read model repository '{location.url}': {exc}") from None
        self.endpoint: str = self._client.meta.endpoint_url

    @staticmethod
    def _session(boto3: Any, location: RemoteLocation) -> Any:
        found, entry = _credential_entry(location)
        if not found:
            return boto3.session.Session()
        if not isinstance(entry, dict):
            raise RepositoryError(
                f"{CREDENTIAL_FILE_ENV}: the s3 credential used for '{location.url}' must be an object "
                "with key_id, secret_key, region, session_token, profile"
            )
        key_id, secret = entry.get("key_id") or "", entry.get("secret_key") or ""
        region = entry.get("region") or None
        if key_id and secret:
            return boto3.session.Session(
                aws_access_key_id=key_id,
                aws_secret_access_key=secret,
                aws_session_token=entry.get("session_token") or None,
                region_name=region,
            )
        if entry.get("profile"):
            return boto3.session.Session(profile_name=entry["profile"])
        return boto3.session.Session()

    def _error(self, location: RemoteLocation, exc: Exception, what: str) -> RepositoryError:
        prefix = f"cannot read model repository '{location.url}'"
        errors = self._errors
        if isinstance(exc, errors.ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            message = error.get("Message") or ""
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            detail = f"S3 {code or status}" + (f": {message}" if message else "")
            if code == "NoSuchBucket":
                return RepositoryError(
                    f"{prefix}: bucket '{location.bucket}' does not exist at {self.endpoint} ({detail})"
                )
            if code in {
                "AccessDenied",
                "InvalidAccessKeyId",
                "SignatureDoesNotMatch",
                "ExpiredToken",
                "InvalidToken",
                "AllAccessDisabled",
                "AccountProblem",
                "403",
            } or status in (401, 403):
                hint = (
                    "no AWS credentials were found, so the request was sent unsigned; "
                    "configure credentials (environment, ~/.aws, a profile or an instance role)"
                    if self.anonymous
                    else "check the credentials (boto3's default chain or "
                    f"{CREDENTIAL_FILE_ENV}) and their permissions"
                )
                return RepositoryError(f"{prefix}: access denied while {what} ({detail}); {hint}")
            return RepositoryError(f"{prefix}: {what} failed ({detail})")
        if isinstance(exc, errors.EndpointConnectionError):
            return RepositoryError(f"{prefix}: cannot connect to the S3 endpoint {self.endpoint} ({exc})")
        if isinstance(exc, errors.NoCredentialsError | errors.PartialCredentialsError):
            return RepositoryError(f"{prefix}: {exc}")
        return RepositoryError(f"{prefix}: {what} failed: {exc}")

    def list_objects(self, location: RemoteLocation) -> Iterator[RemoteObject]:
        paginator = self._client.get_paginator("list_objects_v2")
        try:
            for page in paginator.paginate(Bucket=location.bucket, Prefix=location.list_prefix):
                for item in page.get("Contents", []):
                    fingerprint = item.get("ETag") or str(item.get("LastModified", ""))
                    yield RemoteObject(item["Key"], int(item.get("Size", 0)), fingerprint)
        except (self._errors.BotoCoreError, self._errors.ClientError) as exc:
            raise self._error(location, exc, f"listing {location.directory_url}") from None

    def download(self, location: RemoteLocation, obj: RemoteObject, destination: Path) -> None:
        try:
            self._client.download_file(location.bucket, obj.key, str(destination))
        except Exception as exc:  # noqa: BLE001 - botocore, s3transfer and file-system errors alike
            raise self._error(location, exc, f"downloading {location.object_url(obj.key)}") from None


_GCS_SCOPES = ["https://www.googleapis.com/auth/devstorage.read_only"]


def _google_credentials_file(location: RemoteLocation, path: str) -> tuple[Any, str | None]:
    """Credentials from a JSON key file named in the credential file: an authorized-user or a
    service-account file, the two kinds Triton reads."""
    from google.oauth2 import credentials as user_credentials
    from google.oauth2 import service_account

    def failure(cause: object) -> RepositoryError:
        return RepositoryError(
            f"cannot read model repository '{location.url}': the Google credentials file '{path}' "
            f"named in {CREDENTIAL_FILE_ENV} cannot be used: {cause}"
        )

    try:
        info = json.loads(Path(path).read_text())
    except OSError as exc:
        raise failure(exc.strerror or exc) from None
    except ValueError as exc:
        raise failure(f"not valid JSON ({exc})") from None
    kind = info.get("type") if isinstance(info, dict) else None
    try:
        if kind == "service_account":
            found = service_account.Credentials.from_service_account_info(info, scopes=_GCS_SCOPES)
            return found, info.get("project_id")
        if kind == "authorized_user":
            return user_credentials.Credentials.from_authorized_user_info(info, scopes=_GCS_SCOPES), None
    except (ValueError, KeyError) as exc:
        raise failure(exc) from None
    raise failure(f"type {kind!r}; expected 'service_account' or 'authorized_user'")


class GCSStore:
    """Google Cloud Storage (and its emulators), through google-cloud-storage."""

    def __init__(self, location: RemoteLocation) -> None:
        try:
            import google.api_core.exceptions as api_errors
            import google.auth
            import google.auth.exceptions as auth_errors
            import google.cloud.storage as storage  # noqa: PLR0402 (fails when the submodule is absent)
        except ImportError:
            raise RepositoryError(
                f"reading the model repository '{location.url}' needs google-cloud-storage: {_GCS_EXTRA}"
            ) from None
        self._api_errors = api_errors
        self._auth_errors = auth_errors
        self.anonymous = False
        found, entry = _credential_entry(location)
        try:
            if os.environ.get("STORAGE_EMULATOR_HOST") and not (found and entry):
                # The client goes anonymous by itself when talking to an emulator.
                client = storage.Client(project=None)
            elif found and entry:
                if not isinstance(entry, str):
                    raise RepositoryError(
                        f"{CREDENTIAL_FILE_ENV}: the gs credential used for '{location.url}' must be the "
                        "path of a credentials JSON file"
                    )
                credentials, project = _google_credentials_file(location, entry)
                client = storage.Client(project=project, credentials=credentials)
            else:
                try:
                    credentials, project = google.auth.default(scopes=_GCS_SCOPES)
                except auth_errors.DefaultCredentialsError:
                    # Triton falls back to anonymous access too (public buckets).
                    client = storage.Client.create_anonymous_client()
                    self.anonymous = True
                else:
                    client = storage.Client(project=project, credentials=credentials)
        except RepositoryError:
            raise
        except (auth_errors.GoogleAuthError, ValueError) as exc:
            raise RepositoryError(f"cannot read model repository '{location.url}': {exc}") from None
        self._client = client
        self.endpoint: str = getattr(client, "api_endpoint", None) or "https://storage.googleapis.com"

    def _error(self, location: RemoteLocation, exc: Exception, what: str) -> RepositoryError:
        prefix = f"cannot read model repository '{location.url}'"
        api = self._api_errors
        if isinstance(exc, api.NotFound) and what.startswith("listing"):
            return RepositoryError(
                f"{prefix}: bucket '{location.bucket}' does not exist at {self.endpoint} "
                f"(GCS 404: {exc.message})"
            )
        if isinstance(exc, api.Forbidden | api.Unauthorized):
            hint = (
                "no Google credentials were found, so the request was anonymous; set "
                "GOOGLE_APPLICATION_CREDENTIALS or run 'gcloud auth application-default login'"
                if self.anonymous
                else f"check the credentials (application default credentials or {CREDENTIAL_FILE_ENV}) "
                "and their permissions"
            )
            return RepositoryError(
                f"{prefix}: access denied while {what} (GCS {exc.code}: {exc.message}); {hint}"
            )
        if isinstance(exc, api.GoogleAPICallError):
            return RepositoryError(f"{prefix}: {what} failed (GCS {exc.code}: {exc.message})")
        if isinstance(exc, self._auth_errors.GoogleAuthError):
            return RepositoryError(f"{prefix}: {what} failed: credentials problem: {exc}")
        return RepositoryError(f"{prefix}: {what} failed: cannot reach {self.endpoint}: {exc}")

    def _wrapped(self) -> tuple[type[Exception], ...]:
        import requests

        return (
            self._api_errors.GoogleAPIError,
            self._auth_errors.GoogleAuthError,
            requests.exceptions.RequestException,
        )

    def list_objects(self, location: RemoteLocation) -> Iterator[RemoteObject]:
        try:
            for blob in self._client.list_blobs(location.bucket, prefix=location.list_prefix):
                fingerprint = f"{blob.generation}:{blob.md5_hash or blob.crc32c or blob.etag}"
                yield RemoteObject(blob.name, int(blob.size or 0), fingerprint)
        except self._wrapped() as exc:
            raise self._error(location, exc, f"listing {location.directory_url}") from None

    def download(self, location: RemoteLocation, obj: RemoteObject, destination: Path) -> None:
        blob = self._client.bucket(location.bucket).blob(obj.key)
        try:
            blob.download_to_filename(str(destination))
        except Exception as exc:  # noqa: BLE001 - API, transport, checksum and file-system errors alike
            raise self._error(location, exc, f"downloading {location.object_url(obj.key)}") from None


# --------------------------------------------------------------------------------------------
# Cache


def cache_root() -> Path:
    """``$TOOLKIT_CACHE_DIR``, default ``~/.cache/toolkit/repositories``."""
    configured = os.environ.get(CACHE_DIR_ENV)
    return Path(configured).expanduser() if configured else DEFAULT_CACHE_DIR.expanduser()


def _entry_name(location: RemoteLocation, endpoint: str) -> str:
    identity = "\n".join((location.scheme, endpoint, location.bucket, location.prefix))
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    readable = re.sub(r"[^A-Za-z0-9._-]", "_", location.bucket)[:63]
    return f"{location.scheme}-{readable}-{digest}"


@dataclass
class RemoteSync:
    """What one fetch did. Paths are relative to `path`, '/'-separated."""

    location: RemoteLocation
    path: Path  # the local repository directory
    downloaded: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    # File objects hidden by a directory of the same name ("m/1" next to "m/1/model.onnx"):
    # Triton sees the directory, so the file is not copied.
    shadowed: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class _Plan:
    files: dict[str, RemoteObject]
    directories: set[str]  # every directory the copy must have (markers and parents of files)
    shadowed: list[str]


def _relative_path(location: RemoteLocation, key: str) -> str:
    """The key's path under the repository; refuses keys that would escape the cache directory."""
    if not key.startswith(location.list_prefix):  # the service listed something outside the prefix
        raise RepositoryError(
            f"cannot read model repository '{location.url}': the service listed "
            f"'{location.object_url(key)}', which is outside {location.directory_url}"
        )
    relative = key[len(location.list_prefix) :]
    is_marker = relative.endswith("/")
    segments = relative[:-1].split("/") if is_marker else relative.split("/")
    if any(s in ("", ".", "..") for s in segments) or "\x00" in relative:
        raise RepositoryError(
            f"refusing model repository '{location.url}': object '{location.object_url(key)}' has a key "
            "that would escape the local copy (an empty, '.' or '..' path segment, or an absolute path)"
        )
    return relative


def _plan(location: RemoteLocation, objects: Iterable[RemoteObject]) -> _Plan:
    files: dict[str, RemoteObject] = {}
    directories: set[str] = set()
    for obj in objects:
        if obj.key == location.list_prefix:  # the marker of the repository directory itself
            continue
        relative = _relative_path(location, obj.key)
        if relative.endswith("/"):
            directories.add(relative[:-1])
        else:
            files[relative] = obj
    for name in [*files, *list(directories)]:
        parts = name.split("/")
        directories.update("/".join(parts[:i]) for i in range(1, len(parts)))
    shadowed = sorted(name for name in files if name in directories)
    for name in shadowed:
        del files[name]
    return _Plan(files, directories, shadowed)


def _local(root: Path, relative: str) -> Path:
    return root.joinpath(*relative.split("/"))


@contextmanager
def _locked(entry: Path) -> Iterator[None]:
    """Serialise fetches of one cache entry across threads and processes (POSIX flock)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX: no cross-process lock
        yield
        return
    with open(entry / LOCK_FILENAME, "a+") as handle:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another fetch of the same repository (%s)", entry)
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _load_manifest(path: Path) -> dict[str, dict[str, Any]]:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(document, dict) or document.get("format") != MANIFEST_FORMAT:
        return {}
    files = document.get("files")
    return files if isinstance(files, dict) else {}


def _save_manifest(
    path: Path, location: RemoteLocation, endpoint: str, files: dict[str, dict[str, Any]]
) -> None:
    document = {
        "format": MANIFEST_FORMAT,
        "url": location.url,
        "endpoint": endpoint,
        "bucket": location.bucket,
        "prefix": location.prefix,
        "files": dict(sorted(files.items())),
    }
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    temporary.write_text(json.dumps(document, indent=1))
    os.replace(temporary, path)


def _file_identity(path: Path) -> dict[str, int]:
    st = path.stat()
    return {"size": st.st_size, "ino": st.st_ino, "mtime_ns": st.st_mtime_ns}


def _trusted(path: Path, record: dict[str, Any] | None, obj: RemoteObject) -> bool:
    """The local file is the complete download of exactly this object version."""
    if not record or record.get("fingerprint") != obj.fingerprint or record.get("size") != obj.size:
        return False
    try:
        st = path.lstat()
    except OSError:
        return False
    return (
        stat.S_ISREG(st.st_mode)
        and st.st_size == obj.size
        and st.st_ino == record.get("ino")
        and st.st_mtime_ns == record.get("mtime_ns")
    )


def _prune(root: Path, plan: _Plan, result: RemoteSync) -> None:
    """Delete everything in the local copy that the remote repository no longer has."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        base = Path(dirpath)
        relative_dir = base.relative_to(root).as_posix()
        relative_dir = "" if relative_dir == "." else relative_dir + "/"
        for name in filenames:
            relative = relative_dir + name
            if relative not in plan.files:
                (base / name).unlink()
                result.removed.append(relative)
        for name in dirnames:
            path, relative = base / name, relative_dir + name
            if path.is_symlink():  # never created by a fetch
                path.unlink()
                result.removed.append(relative)
            elif relative not in plan.directories:
                shutil.rmtree(path)


def sync_repository(url: str, cache_dir: Path | None = None) -> RemoteSync:
    """Bring the local copy of a remote repository up to date and say what changed."""
    location = parse_remote_url(url)
    store = open_store(location)
    root_dir = Path(cache_dir) if cache_dir is not None else cache_root()
    entry = root_dir / _entry_name(location, store.endpoint)
    try:
        entry.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RepositoryError(f"cannot create the repository cache directory '{entry}': {exc}") from None
    with _locked(entry):
        return _sync(location, store, entry)


def _sync(location: RemoteLocation, store: ObjectStore, entry: Path) -> RemoteSync:
    objects = list(store.list_objects(location))
    if not objects and location.prefix:
        raise RepositoryError(
            f"model repository '{location.url}' does not exist or is empty: "
            f"no objects under {location.directory_url}"
        )
    plan = _plan(location, objects)

    root = entry / REPOSITORY_DIRNAME
    partial = entry / PARTIAL_DIRNAME
    manifest_path = entry / MANIFEST_FILENAME
    shutil.rmtree(partial, ignore_errors=True)  # leftovers of an interrupted fetch
    partial.mkdir(parents=True, exist_ok=True)
    root.mkdir(exist_ok=True)
    result = RemoteSync(location, root, shadowed=plan.shadowed)

    old = _load_manifest(manifest_path)
    manifest = {name: record for name, record in old.items() if name in plan.files}
    pending: list[str] = []
    for name, obj in sorted(plan.files.items()):
        if _trusted(_local(root, name), manifest.get(name), obj):
            result.reused.append(name)
        else:
            manifest.pop(name, None)
            pending.append(name)

    try:
        _prune(root, plan, result)
        for name in sorted(plan.directories):
            _local(root, name).mkdir(parents=True, exist_ok=True)
        _download_all(location, store, plan, pending, root, partial, manifest, result)
    except OSError as exc:
        raise RepositoryError(
            f"cannot update the local copy of model repository '{location.url}' in '{entry}': {exc}"
        ) from None
    finally:
        _save_manifest(manifest_path, location, store.endpoint, manifest)
        shutil.rmtree(partial, ignore_errors=True)
    result.removed.sort()
    logger.info(
        "%s: %d downloaded, %d unchanged, %d removed",
        location.url,
        len(result.downloaded),
        len(result.reused),
        len(result.removed),
    )
    return result


def _download_all(
    location: RemoteLocation,
    store: ObjectStore,
    plan: _Plan,
    pending: list[str],
    root: Path,
    partial: Path,
    manifest: dict[str, dict[str, Any]],
    result: RemoteSync,
) -> None:
    if not pending:
        return

    def fetch(name: str) -> dict[str, Any]:
        obj = plan.files[name]
        temporary = partial / uuid.uuid4().hex
        store.download(location, obj, temporary)
        with open(temporary, "rb") as handle:
            os.fsync(handle.fileno())
        target = _local(root, name)
        os.replace(temporary, target)
        identity = _file_identity(target)
        # An object rewritten between listing and download: keep the file, but do not trust it
        # next time (its content belongs to a version the listing did not show).
        fingerprint = obj.fingerprint if identity["size"] == obj.size else ""
        return {"key": obj.key, "fingerprint": fingerprint, **identity}

    pool = ThreadPoolExecutor(max_workers=min(DOWNLOAD_WORKERS, len(pending)), thread_name_prefix="fetch")
    futures: dict[Future[dict[str, Any]], str] = {pool.submit(fetch, name): name for name in pending}
    try:
        wait(futures, return_when=FIRST_EXCEPTION)
    finally:
        # On the first failure (or Ctrl-C) start nothing new, let running downloads finish, and
        # record every download that completed so the next fetch does not repeat it.
        pool.shutdown(wait=True, cancel_futures=True)
        for future, name in futures.items():
            if future.done() and not future.cancelled() and future.exception() is None:
                manifest[name] = future.result()
                result.downloaded.append(name)
    for future in futures:
        if future.done() and not future.cancelled() and future.exception() is not None:
            raise future.exception()  # type: ignore[misc]
    result.downloaded.sort()


def fetch_repository(url: str) -> Path:
    """The local directory holding an up-to-date copy of a remote model repository."""
    return sync_repository(url).path
