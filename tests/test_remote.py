"""Remote model repositories (s3:// and gs://) copied to the local cache.

Every test talks to a real server started here: a moto server process for S3 (a second one with
IAM authentication enforced for the permission tests) and gcp-storage-emulator for GCS. Dummy
credentials and local endpoints are set for every test, so nothing can reach AWS or GCP.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import model_builders
import pytest
from typer.testing import CliRunner

from toolkit.cli import app
from toolkit.repository.compile import compile_repository
from toolkit.repository.discover import ensure_repository
from toolkit.repository.errors import RepositoryError
from toolkit.repository.remote import (
    RemoteLocation,
    cache_root,
    fetch_repository,
    parse_remote_url,
    sync_repository,
)

CONFIG = """\
name: "add_sub"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
"""
DUMMY_KEYS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@pytest.fixture(scope="module")
def repository_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """A small Triton repository (config.pbtxt + tiny ONNX model) as {relative path: bytes}."""
    root = tmp_path_factory.mktemp("source")
    model_builders.add_sub(root / "add_sub" / "1" / "model.onnx", dims=("N", 16))
    (root / "add_sub" / "config.pbtxt").write_text(CONFIG)
    (root / "add_sub" / "labels.txt").write_text("a\nb\n")
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------
# servers


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_moto(log: Path, extra_env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, **DUMMY_KEYS, **(extra_env or {})}
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while True:  # a separate process offers no readiness event: poll its port
        if process.poll() is not None:
            raise RuntimeError(f"moto server exited: {log.read_text()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline:
                process.kill()
                raise RuntimeError("moto server did not start in 60 s") from None
            time.sleep(0.05)
    return process, f"http://127.0.0.1:{port}"


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="module")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    process, endpoint = start_moto(tmp_path_factory.mktemp("moto") / "moto.log")
    yield endpoint
    stop(process)


@pytest.fixture(scope="module")
def moto_auth(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    """A moto server that enforces IAM: an admin user and a reader allowed only bucket 'other'."""
    # The first 6 requests (the IAM calls below) are let through unauthenticated.
    process, endpoint = start_moto(
        tmp_path_factory.mktemp("moto-auth") / "moto.log", {"INITIAL_NO_AUTH_ACTION_COUNT": "6"}
    )
    iam = boto3.client(
        "iam",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )

    def user(name: str, action: str, resource: str) -> dict[str, str]:
        iam.create_user(UserName=name)
        key = iam.create_access_key(UserName=name)["AccessKey"]
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": action, "Resource": resource}],
        }
        iam.put_user_policy(UserName=name, PolicyName="p", PolicyDocument=json.dumps(policy))
        return {"key_id": key["AccessKeyId"], "secret_key": key["SecretAccessKey"]}

    admin = user("admin", "*", "*")
    reader = user("reader", "s3:ListBucket", "arn:aws:s3:::other")
    yield {"endpoint": endpoint, "admin": admin, "reader": reader}
    stop(process)


@pytest.fixture(scope="module")
def gcs_endpoint() -> Iterator[str]:
    from gcp_storage_emulator.server import create_server

    port = free_port()
    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()  # returns once the server thread listens
    yield f"http://127.0.0.1:{port}"
    server.stop()


# ------------------------------------------------------------------------------------------
# environments


@pytest.fixture
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No real cloud configuration reaches a test; the cache lives in tmp_path."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "GOOGLE_", "GCLOUD_", "CLOUDSDK_")) or name in (
            "STORAGE_EMULATOR_HOST",
            "API_ENDPOINT_OVERRIDE",
            "TRITON_CLOUD_CREDENTIAL_PATH",
        ):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))
    monkeypatch.setenv("TOOLKIT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def aws(isolated: Path, monkeypatch: pytest.MonkeyPatch, moto_endpoint: str) -> str:
    for name, value in DUMMY_KEYS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_endpoint)
    return moto_endpoint


@pytest.fixture
def gcs(isolated: Path, monkeypatch: pytest.MonkeyPatch, gcs_endpoint: str) -> str:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_endpoint)
    return gcs_endpoint


def new_bucket_name() -> str:
    return f"t-{uuid.uuid4().hex[:16]}"


class S3Bucket:
    def __init__(self, endpoint: str, keys: dict[str, str] | None = None, acl: str = "private") -> None:
        keys = keys or {"key_id": "testing", "secret_key": "testing"}
        self.acl = acl
        self.client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id=keys["key_id"],
            aws_secret_access_key=keys["secret_key"],
        )
        self.name = new_bucket_name()
        self.client.create_bucket(Bucket=self.name, ACL=acl)

    def put(self, key: str, body: bytes = b"") -> None:
        self.client.put_object(Bucket=self.name, Key=key, Body=body, ACL=self.acl)

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.name, Key=key)

    def upload(self, files: dict[str, bytes], prefix: str = "models/") -> None:
        for relative, body in files.items():
            self.put(prefix + relative, body)


class GCSBucket:
    def __init__(self) -> None:
        from google.cloud import storage

        self.client = storage.Client(project="test")
        self.name = new_bucket_name()
        self.bucket = self.client.create_bucket(self.name)

    def put(self, key: str, body: bytes = b"") -> None:
        self.bucket.blob(key).upload_from_string(body)

    def delete(self, key: str) -> None:
        self.bucket.blob(key).delete()

    def upload(self, files: dict[str, bytes], prefix: str = "models/") -> None:
        for relative, body in files.items():
            self.put(prefix + relative, body)


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def assert_compiles(root: Path) -> None:
    result = compile_repository(root)
    assert result.ok, {name: str(error) for name, error in result.failures.items()}
    assert list(result.models) == ["add_sub"]
    assert result.models["add_sub"].config["max_batch_size"] == 8


# ------------------------------------------------------------------------------------------
# locations


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("s3://bucket/path/to/models", ("s3", "bucket", "path/to/models", None)),
        ("s3://bucket", ("s3", "bucket", "", None)),
        ("s3://bucket//models///", ("s3", "bucket", "models", None)),  # Triton's CleanPath
        ("s3://minio.local:9000/bucket/models", ("s3", "bucket", "models", "http://minio.local:9000")),
        ("s3://http://10.0.0.5:9000/bucket/m", ("s3", "bucket", "m", "http://10.0.0.5:9000")),
        ("s3://https://host-1.example.com:443/b/p/q", ("s3", "b", "p/q", "https://host-1.example.com:443")),
        ("gs://bucket/path/to/models", ("gs", "bucket", "path/to/models", None)),
        ("gs://bucket/", ("gs", "bucket", "", None)),
    ],
)
def test_locations_are_parsed_like_triton(url: str, expected: tuple) -> None:
    location = parse_remote_url(url)
    assert (location.scheme, location.bucket, location.prefix, location.endpoint) == expected
    assert location.url == url


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("s3://", "no bucket name found"),
        ("gs:///", "no bucket name found"),
        ("s3://host:9000/", "no bucket name found"),
        ("s3://https://bucket/models", "host:port/bucket/path"),
        ("as://account/container/models", "Azure Storage (as://) repositories are not supported"),
        ("http://example.com/models", "unsupported model repository location"),
    ],
)
def test_bad_locations_are_clear_errors(url: str, message: str) -> None:
    with pytest.raises(RepositoryError, match=re.escape(message)) as info:
        fetch_repository(url)
    assert url in str(info.value)


def test_cache_directory_is_deterministic_per_location(aws: str, isolated: Path, repository_files) -> None:
    bucket = S3Bucket(aws)
    bucket.upload(repository_files, "a/")
    bucket.upload(repository_files, "b/")
    first = fetch_repository(f"s3://{bucket.name}/a")
    assert first == fetch_repository(f"s3://{bucket.name}//a/")  # the same location
    second = fetch_repository(f"s3://{bucket.name}/b")
    assert first != second
    assert first.is_relative_to(isolated) and second.is_relative_to(isolated)
    assert first.parent.name.startswith(f"s3-{bucket.name}-")


def test_default_cache_directory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TOOLKIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_root() == tmp_path / ".cache" / "toolkit" / "repositories"
    monkeypatch.setenv("TOOLKIT_CACHE_DIR", "~/elsewhere")
    assert cache_root() == tmp_path / "elsewhere"


# ------------------------------------------------------------------------------------------
# S3


def test_s3_repository_is_copied_and_compiles(aws: str, repository_files) -> None:
    bucket = S3Bucket(aws)
    bucket.upload(repository_files)
    # Directory markers, as the S3 console's "Create folder" writes them.
    for marker in ("models/", "models/add_sub/", "models/add_sub/1/", "models/add_sub/warmup/"):
        bucket.put(marker)
    bucket.put("models-other/x/config.pbtxt", b"not part of the repository")

    root = fetch_repository(f"s3://{bucket.name}/models")
    assert tree(root) == repository_files
    assert (root / "add_sub" / "warmup").is_dir()  # an empty directory exists only as a marker
    assert_compiles(root)
    assert ensure_repository(f"s3://{bucket.name}/models") == root


def test_s3_cli_validate(aws: str, repository_files) -> None:
    bucket = S3Bucket(aws)
    bucket.upload(repository_files)
    result = CliRunner().invoke(app, ["validate", f"s3://{bucket.name}/models", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert [(m["name"], m["status"]) for m in document["models"]] == [("add_sub", "READY")]

    missing = CliRunner().invoke(app, ["validate", f"s3://{bucket.name}/nothing-here"])
    assert missing.exit_code == 2
    assert f"s3://{bucket.name}/nothing-here" in missing.output


def test_s3_triton_endpoint_forms(aws: str, monkeypatch: pytest.MonkeyPatch, repository_files) -> None:
    bucket = S3Bucket(aws)
    bucket.upload(repository_files)
    # The endpoint in the URL wins over the environment's (which points nowhere here).
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    host_port = aws.removeprefix("http://")
    for url in (f"s3://{host_port}/{bucket.name}/models", f"s3://http://{host_port}/{bucket.name}/models/"):
        result = sync_repository(url)
        assert result.location.endpoint == aws
        assert tree(result.path) == repository_files
        assert_compiles(result.path)


def test_s3_service_specific_endpoint_variable(
    aws: str, monkeypatch: pytest.MonkeyPatch, repository_files
) -> None:
    bucket = S3Bucket(aws)
    bucket.upload(repository_files)
    # boto3's own precedence: AWS_ENDPOINT_URL_S3 over AWS_ENDPOINT_URL.
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", aws)
    assert tree(fetch_repository(f"s3://{bucket.name}/models")) == repository_files


def test_s3_refetch_downloads_changes_and_deletes_removed_objects(aws: str, repository_files) -> None:
    bucket = S3Bucket(aws)
    bucket.upload(repository_files)
    url = f"s3://{bucket.name}/models"
    first = sync_repository(url)
    assert first.downloaded == sorted(repository_files) and first.reused == []
    root = first.path
    model = root / "add_sub" / "1" / "model.onnx"
    before = model.stat()

    again = sync_repository(url)
    assert again.downloaded == [] and again.removed == []
    assert again.reused == sorted(repository_files)

    bucket.put(
        "models/add_sub/config.pbtxt", CONFIG.replace("max_batch_size: 8", "max_batch_size: 4").encode()
    )
    bucket.delete("models/add_sub/labels.txt")
    bucket.put("models/add_sub/2/model.onnx", repository_files["add_sub/1/model.onnx"])
    changed = sync_repository(url)
    assert changed.downloaded == ["add_sub/2/model.onnx", "add_sub/config.pbtxt"]
    assert changed.removed == ["add_sub/labels.txt"]
    assert changed.reused == ["add_sub/1/model.onnx"]
    assert not (root / "add_sub" / "labels.txt").exists()
    after = model.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not rewritten
    compiled = compile_repository(root)
    assert compiled.ok and compiled.models["add_sub"].config["max_batch_size"] == 4

    # A whole model directory removed remotely disappears locally, directories included.
    bucket.delete("models/add_sub/2/model.onnx")
    sync_repository(url)
    assert not (root / "add_sub" / "2").exists()


def test_files_not_known_complete_are_downloaded_again(aws: str, repository_files) -> None:
    bucket = S3Bucket(aws)
    bucket.upload(repository_files)
    url = f"s3://{bucket.name}/models"
    root = fetch_repository(url)
    entry = root.parent
    config = root / "add_sub" / "config.pbtxt"
    model = root / "add_sub" / "1" / "model.onnx"

    # A torn write (half the bytes) and a file replaced behind the cache's back.
    with open(model, "r+b") as handle:
        handle.truncate(model.stat().st_size // 2)
    config.unlink()
    config.write_text(CONFIG)  # same bytes, but not the file the fetch wrote
    # The leftovers of a fetch killed mid-download, and a stray file in the copy.
    (entry / ".partial").mkdir(exist_ok=True)
    (entry / ".partial" / "0123abcd").write_bytes(b"half a model")
    (root / "add_sub" / "stray.txt").write_text("not in the bucket")

    result = sync_repository(url)
    assert result.downloaded == ["add_sub/1/model.onnx", "add_sub/config.pbtxt"]
    assert result.removed == ["add_sub/stray.txt"]
    assert tree(root) == repository_files
    assert not (entry / ".partial").exists()

    # Without its manifest (a fetch killed before saving it) nothing local is trusted.
    (entry / "manifest.json").unlink()
    assert sorted(sync_repository(url).downloaded) == sorted(repository_files)
    assert tree(root) == repository_files


@pytest.mark.parametrize(
    "key", ["models/../evil.txt", "models//etc/passwd", "models/add_sub/./x", "models/a/../../b"]
)
def test_keys_escaping_the_cache_are_refused(aws: str, isolated: Path, key: str, repository_files) -> None:
    bucket = S3Bucket(aws)
    bucket.upload(repository_files)
    bucket.put(key, b"payload")
    with pytest.raises(RepositoryError, match="would escape the local copy") as info:
        fetch_repository(f"s3://{bucket.name}/models")
    assert f"s3://{bucket.name}/{key}" in str(info.value)
    written = [p for p in isolated.parent.rglob("*") if p.is_file() and p.read_bytes() == b"payload"]
    assert written == []


def test_file_shadowed_by_directory_of_the_same_name(aws: str, repository_files) -> None:
    bucket = S3Bucket(aws)
    bucket.upload(repository_files)
    bucket.put("models/add_sub/1", b"a file where Triton sees the version directory")
    result = sync_repository(f"s3://{bucket.name}/models")
    assert result.shadowed == ["add_sub/1"]
    assert (result.path / "add_sub" / "1" / "model.onnx").is_file()
    assert_compiles(result.path)


def test_s3_missing_bucket(aws: str) -> None:
    url = f"s3://{new_bucket_name()}/models"
    with pytest.raises(RepositoryError, match="does not exist") as info:
        fetch_repository(url)
    assert url in str(info.value) and "NoSuchBucket" in str(info.value)


def test_s3_missing_prefix_and_empty_bucket(aws: str, repository_files) -> None:
    bucket = S3Bucket(aws)
    with pytest.raises(RepositoryError, match="does not exist or is empty") as info:
        fetch_repository(f"s3://{bucket.name}/models")
    assert f"s3://{bucket.name}/models" in str(info.value)
    # The root of an existing bucket is a directory even when empty (as in Triton).
    root = fetch_repository(f"s3://{bucket.name}")
    assert list(root.iterdir()) == []
    assert compile_repository(root).selected == []
    # A prefix that only shares the first characters is not the repository.
    bucket.upload(repository_files, "models2/")
    with pytest.raises(RepositoryError, match="does not exist or is empty"):
        fetch_repository(f"s3://{bucket.name}/models")


def test_concurrent_fetches_of_one_location(aws: str, repository_files) -> None:
    bucket = S3Bucket(aws)
    bucket.upload(repository_files)
    url = f"s3://{bucket.name}/models"
    barrier = threading.Barrier(3)
    results: list[object] = []

    def fetch() -> None:
        barrier.wait(timeout=30)
        try:
            results.append(sync_repository(url))
        except Exception as exc:  # noqa: BLE001 - reported below
            results.append(exc)

    threads = [threading.Thread(target=fetch) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert all(not isinstance(r, Exception) for r in results), results
    assert len({r.path for r in results}) == 1  # type: ignore[union-attr]
    # The lock serialised them: exactly one downloaded, the others reused its files.
    assert sorted(len(r.downloaded) for r in results) == [0, 0, len(repository_files)]  # type: ignore[union-attr]
    assert tree(results[0].path) == repository_files  # type: ignore[union-attr]


def test_unreachable_s3_endpoint(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in DUMMY_KEYS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    url = f"s3://127.0.0.1:{free_port()}/bucket/models"
    with pytest.raises(RepositoryError, match="cannot connect to the S3 endpoint") as info:
        fetch_repository(url)
    assert url in str(info.value)


def test_anonymous_requests_without_credentials(isolated: Path, moto_endpoint: str, repository_files) -> None:
    # No credentials anywhere: the requests go out unsigned (as Triton's do). That reads a
    # public bucket ...
    public = S3Bucket(moto_endpoint, acl="public-read")
    public.upload(repository_files)
    host_port = moto_endpoint.removeprefix("http://")
    assert tree(fetch_repository(f"s3://{host_port}/{public.name}/models")) == repository_files
    # ... and a private object is a clear error that says why.
    private = S3Bucket(moto_endpoint)
    private.upload(repository_files)
    url = f"s3://{host_port}/{private.name}/models"
    with pytest.raises(RepositoryError, match="access denied") as info:
        fetch_repository(url)
    assert url in str(info.value) and "no AWS credentials were found" in str(info.value)


def test_s3_access_denied(
    isolated: Path, moto_auth: dict, monkeypatch: pytest.MonkeyPatch, repository_files
) -> None:
    bucket = S3Bucket(moto_auth["endpoint"], moto_auth["admin"])
    bucket.upload(repository_files)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_auth["endpoint"])
    url = f"s3://{bucket.name}/models"

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto_auth["reader"]["key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", moto_auth["reader"]["secret_key"])
    with pytest.raises(RepositoryError, match=r"access denied .*AccessDenied") as info:
        fetch_repository(url)
    assert url in str(info.value)

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNUNKNOWN00")
    with pytest.raises(RepositoryError, match=r"access denied .*InvalidAccessKeyId"):
        fetch_repository(url)

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", moto_auth["admin"]["key_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", moto_auth["admin"]["secret_key"])
    assert tree(fetch_repository(url)) == repository_files


def test_triton_credential_file(
    isolated: Path, moto_auth: dict, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, repository_files
) -> None:
    bucket = S3Bucket(moto_auth["endpoint"], moto_auth["admin"])
    bucket.upload(repository_files)
    host_port = moto_auth["endpoint"].removeprefix("http://")
    url = f"s3://{host_port}/{bucket.name}/models"
    credentials = tmp_path / "cloud_credential.json"
    credentials.write_text(
        json.dumps(
            {
                "s3": {
                    "": {**moto_auth["reader"], "region": "us-east-1", "session_token": "", "profile": ""},
                    f"s3://{host_port}/{bucket.name}": {**moto_auth["admin"], "region": "us-east-1"},
                }
            }
        )
    )
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(credentials))
    # The environment's credentials are not used when the file is set (as in Triton).
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWNUNKNOWN00")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")

    assert tree(fetch_repository(url)) == repository_files  # the longest matching name: admin
    other = S3Bucket(moto_auth["endpoint"], moto_auth["admin"])
    other.upload(repository_files)
    with pytest.raises(RepositoryError, match="access denied"):  # "" matches: the reader
        fetch_repository(f"s3://{host_port}/{other.name}/models")

    credentials.write_text(json.dumps({"s3": {"s3://somewhere-else": moto_auth["admin"]}}))
    with pytest.raises(RepositoryError, match="cannot match a credential"):
        fetch_repository(url)
    credentials.write_text("{not json")
    with pytest.raises(RepositoryError, match="not valid JSON"):
        fetch_repository(url)


# ------------------------------------------------------------------------------------------
# GCS


def test_gcs_repository_is_copied_compiles_and_refetches(gcs: str, repository_files) -> None:
    bucket = GCSBucket()
    bucket.upload(repository_files)
    bucket.put("models/add_sub/warmup/")  # a directory marker
    url = f"gs://{bucket.name}/models"

    first = sync_repository(url)
    assert tree(first.path) == repository_files
    assert (first.path / "add_sub" / "warmup").is_dir()
    assert_compiles(first.path)

    assert sync_repository(url).downloaded == []
    bucket.put(
        "models/add_sub/config.pbtxt", CONFIG.replace("max_batch_size: 8", "max_batch_size: 2").encode()
    )
    bucket.delete("models/add_sub/labels.txt")
    changed = sync_repository(url)
    assert changed.downloaded == ["add_sub/config.pbtxt"]
    assert changed.removed == ["add_sub/labels.txt"]
    assert compile_repository(changed.path).models["add_sub"].config["max_batch_size"] == 2


def test_gcs_cli_validate(gcs: str, repository_files) -> None:
    bucket = GCSBucket()
    bucket.upload(repository_files)
    result = CliRunner().invoke(app, ["validate", f"gs://{bucket.name}/models", "--json"])
    assert result.exit_code == 0, result.output
    assert [m["status"] for m in json.loads(result.stdout)["models"]] == ["READY"]


def test_gcs_missing_bucket_and_prefix(gcs: str) -> None:
    url = f"gs://{new_bucket_name()}/models"
    with pytest.raises(RepositoryError, match="does not exist") as info:
        fetch_repository(url)
    assert url in str(info.value) and "404" in str(info.value)
    bucket = GCSBucket()
    with pytest.raises(RepositoryError, match="does not exist or is empty") as info:
        fetch_repository(f"gs://{bucket.name}/models")
    assert f"gs://{bucket.name}/models" in str(info.value)


def test_gcs_access_denied(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # gcp-storage-emulator does not enforce permissions, so a minimal HTTP server standing in for
    # GCS answers every request with the 403 error document GCS sends.
    class Forbidden(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(
                {
                    "error": {
                        "code": 403,
                        "message": "caller does not have storage.objects.list access",
                        "errors": [{"reason": "forbidden"}],
                    }
                }
            ).encode()
            self.send_response(403)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forbidden)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{server.server_port}")
        with pytest.raises(RepositoryError, match=r"access denied .*403.*storage\.objects\.list") as info:
            fetch_repository("gs://private-bucket/models")
        assert "gs://private-bucket/models" in str(info.value)
    finally:
        server.shutdown()
        server.server_close()


def test_gcs_credential_file_naming_a_bad_key_file(
    gcs: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "key.json").write_text('{"type": "nonsense"}')
    credentials = tmp_path / "cloud_credential.json"
    credentials.write_text(json.dumps({"gs": {"gs://": str(tmp_path / "key.json")}}))
    monkeypatch.setenv("TRITON_CLOUD_CREDENTIAL_PATH", str(credentials))
    with pytest.raises(RepositoryError, match="key.json") as info:
        fetch_repository("gs://bucket/models")
    assert "gs://bucket/models" in str(info.value)


# ------------------------------------------------------------------------------------------
# optional extras


@pytest.mark.parametrize(
    ("module", "url", "extra"),
    [("boto3", "s3://bucket/models", "[s3]"), ("google.cloud.storage", "gs://bucket/models", "[gcs]")],
)
def test_missing_extra_names_the_pip_command(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, module: str, url: str, extra: str
) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # what Python does for a module that is absent
    with pytest.raises(RepositoryError) as info:
        fetch_repository(url)
    assert f"pip install 'triton-serverless-toolkit{extra}'" in str(info.value)
    assert url in str(info.value)


def test_location_type_is_public() -> None:
    location = parse_remote_url("s3://b/p")
    assert isinstance(location, RemoteLocation)
    assert location.directory_url == "s3://b/p/" and location.object_url("p/x") == "s3://b/p/x"
