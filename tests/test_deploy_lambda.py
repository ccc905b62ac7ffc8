"""`toolkit deploy --target lambda` against a moto server process (real boto3 HTTP calls).

moto (moto[server], run as `python -m moto.server` on 127.0.0.1 with MOTO_LAMBDA_STUB_ECR=false,
so Lambda checks that the image exists in moto's ECR) implements the ECR layer upload and
PutImage, IAM roles, Lambda create/update of image functions, versions, aliases, Function URLs,
resource policies and waiters. It does not implement provisioned concurrency (404) nor Invoke of
image functions (500): those calls are tested at the request level instead, with botocore's
Stubber, or with a `before-call` hook that answers Invoke alone while every other call goes to
moto. Each such test says so. No test reaches AWS: dummy keys and AWS_ENDPOINT_URL everywhere.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import socket
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.response import StreamingBody
from botocore.stub import ANY, Stubber

import model_builders as mb
from conftest import write_config
from toolkit.deploy.aws_lambda.deploy import LambdaDeployOptions, deploy_lambda
from toolkit.deploy.aws_lambda.function import Waiting, apply_provisioned_concurrency, smoke_test
from toolkit.deploy.aws_lambda.settings import LambdaOverrides
from toolkit.deploy.errors import DeployError
from toolkit.deploy.progress import RecordingUI
from toolkit.repository.compile import compile_repository

ROOT = Path(__file__).resolve().parents[1]
DUMMY = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
FAST = Waiting(poll_s=0.05, timeout_s=30, sleep=lambda s: None)


# ------------------------------------------------------------------------------------------
# image archives, written the way `podman save --format oci-archive` / `docker save` lay them out


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _tar(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in entries.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _config(raw_layers: list[bytes], arch: str) -> bytes:
    return json.dumps({
        "architecture": arch, "os": "linux", "config": {"Entrypoint": ["/lambda-entrypoint.sh"]},
        "rootfs": {"type": "layers", "diff_ids": [_sha(r) for r in raw_layers]},
    }).encode()


def oci_archive(path: Path, content: str, arch: str = "amd64", compressed: bool = True) -> str:
    """An OCI image archive with two layers; returns its manifest digest."""
    raws = [_tar({"var/task/app.txt": content.encode()}), _tar({"opt/toolkit/models.json": b"{}"})]
    layers = [gzip.compress(r, mtime=0) if compressed else r for r in raws]
    config = _config(raws, arch)
    layer_type = "application/vnd.oci.image.layer.v1.tar" + ("+gzip" if compressed else "")
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": len(config), "digest": _sha(config)},
        "layers": [{"mediaType": layer_type, "size": len(l), "digest": _sha(l)} for l in layers],
    }).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "size": len(manifest), "digest": _sha(manifest),
        "platform": {"os": "linux", "architecture": arch},
    }]}).encode()
    entries = {"oci-layout": b'{"imageLayoutVersion":"1.0.0"}', "index.json": index}
    for blob in (config, manifest, *layers):
        entries["blobs/sha256/" + _sha(blob)[7:]] = blob
    path.write_bytes(_tar(entries))
    return _sha(manifest)


def docker_archive(path: Path, content: str) -> None:
    raw = _tar({"var/task/app.txt": content.encode()})
    config = _config([raw], "amd64")
    manifest = json.dumps([{"Config": "config.json", "RepoTags": ["add-sub:1"], "Layers": ["l1/layer.tar"]}]).encode()
    path.write_bytes(_tar({"manifest.json": manifest, "config.json": config, "l1/layer.tar": raw}))


# ------------------------------------------------------------------------------------------
# moto server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def moto(tmp_path_factory) -> Iterator[dict[str, Any]]:
    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    handle = open(log, "wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, **DUMMY, "MOTO_LAMBDA_STUB_ECR": "false"}, stdout=handle, stderr=subprocess.STDOUT,
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
    yield {"endpoint": f"http://127.0.0.1:{port}", "log": log}
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    handle.close()


@pytest.fixture
def aws(moto, monkeypatch, tmp_path) -> dict[str, Any]:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    for key, value in DUMMY.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto["endpoint"])
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return {**moto, "lambda": boto3.client("lambda"), "ecr": boto3.client("ecr"), "iam": boto3.client("iam")}


def _name() -> str:
    return f"fn-{uuid.uuid4().hex[:10]}"


def _options(name: str, image: str, **kwargs: Any) -> LambdaDeployOptions:
    # moto cannot invoke image functions: the smoke test is exercised in the tests that answer Invoke
    return LambdaDeployOptions(name=name, image=image, smoke_test=False, waiting=FAST, **kwargs)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    repo = tmp_path_factory.mktemp("lambda-repo") / "models"
    mb.add_sub(repo / "add_sub" / "1" / "model.onnx")
    write_config(repo, "add_sub", """
        backend: "onnxruntime"
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
    """)
    result = compile_repository(repo, None, "cpu")
    assert result.ok
    return result


# ------------------------------------------------------------------------------------------
# create, update, idempotency


def test_first_deploy_creates_everything(aws, tmp_path, compiled):
    name = _name()
    digest = oci_archive(tmp_path / "image.tar", "v1")
    ui = RecordingUI()
    record = deploy_lambda(_options(name, f"oci-archive:{tmp_path / 'image.tar'}"), compiled, ui)

    # the image went through ECR's layer API, byte for byte, pinned by digest
    ecr = aws["ecr"]
    assert record.image_digest == digest
    assert record.image == f"123456789012.dkr.ecr.us-east-1.amazonaws.com/{name}@{digest}"
    (image,) = ecr.batch_get_image(repositoryName=name, imageIds=[{"imageDigest": digest}])["images"]
    stored = json.loads(image["imageManifest"])
    archived = json.loads(tarfile.open(tmp_path / "image.tar").extractfile("blobs/sha256/" + digest[7:]).read())
    assert stored == archived
    blobs = [stored["config"]["digest"], *(l["digest"] for l in stored["layers"])]
    availability = ecr.batch_check_layer_availability(repositoryName=name, layerDigests=blobs)
    assert {l["layerDigest"] for l in availability["layers"]} == set(blobs) and not availability["failures"]

    # least-privilege role: assumable by Lambda, logs of this function only
    role = aws["iam"].get_role(RoleName=f"{name}-toolkit-exec")["Role"]
    assert role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {"Service": "lambda.amazonaws.com"}
    assert aws["iam"].list_attached_role_policies(RoleName=role["RoleName"])["AttachedPolicies"] == []
    policy = aws["iam"].get_role_policy(RoleName=role["RoleName"], PolicyName="cloudwatch-logs")["PolicyDocument"]
    resources = {s["Resource"] for s in policy["Statement"]}
    assert resources == {
        f"arn:aws:logs:us-east-1:123456789012:log-group:/aws/lambda/{name}",
        f"arn:aws:logs:us-east-1:123456789012:log-group:/aws/lambda/{name}:*",
    }

    lam = aws["lambda"]
    function = lam.get_function(FunctionName=name)
    config = function["Configuration"]
    assert config["PackageType"] == "Image" and config["Role"] == role["Arn"]
    assert function["Code"]["ImageUri"] == record.image
    assert config["MemorySize"] == 1769 and config["Timeout"] == 60 and config["EphemeralStorage"] == {"Size": 512}
    assert config["Architectures"] == ["x86_64"]
    assert lam.get_alias(FunctionName=name, Name="live")["FunctionVersion"] == record.version == "1"
    url = lam.get_function_url_config(FunctionName=name, Qualifier="live")
    assert url["AuthType"] == "AWS_IAM" and record.url == url["FunctionUrl"] and record.auth == "AWS_IAM"
    assert record.resource == config["FunctionArn"] and record.alias.endswith(f":{name}:live")
    # an AWS_IAM URL carries no public statement
    with pytest.raises(lam.exceptions.ResourceNotFoundException):
        lam.get_policy(FunctionName=name, Qualifier="live")
    assert not ui.warnings


def test_second_deploy_updates_in_place_and_is_idempotent(aws, tmp_path, compiled):
    name = _name()
    oci_archive(tmp_path / "v1.tar", "v1")
    v2_digest = oci_archive(tmp_path / "v2.tar", "v2")
    first = deploy_lambda(_options(name, f"oci-archive:{tmp_path / 'v1.tar'}"), compiled)
    options = _options(
        name, f"oci-archive:{tmp_path / 'v2.tar'}",
        overrides=LambdaOverrides(memory_mb=3008, timeout_s=120, environment={"TOOLKIT_LOG_LEVEL": "debug"}),
    )
    second = deploy_lambda(options, compiled)
    lam = aws["lambda"]
    assert second.resource == first.resource and second.url == first.url  # same function, same URL
    assert second.version == "2" and lam.get_alias(FunctionName=name, Name="live")["FunctionVersion"] == "2"
    live = lam.get_function(FunctionName=name, Qualifier="live")
    assert live["Code"]["ImageUri"].endswith(v2_digest)
    assert live["Configuration"]["MemorySize"] == 3008 and live["Configuration"]["Timeout"] == 120
    assert live["Configuration"]["Environment"]["Variables"] == {"TOOLKIT_LOG_LEVEL": "debug"}
    # version 1 is untouched: it still runs the first image (compared by CodeSha256, the image
    # digest: moto's versions share $LATEST's Code.ImageUri field, Lambda's do not)
    assert lam.get_function(FunctionName=name, Qualifier="1")["Configuration"]["CodeSha256"] == first.image_digest[7:]
    assert live["Configuration"]["CodeSha256"] == v2_digest[7:]

    # the same deploy again: nothing new to upload, same function, URL, role, repository
    ui = RecordingUI()
    third = deploy_lambda(options, compiled, ui)
    assert "3 of 3 blobs already in ECR" in ui.lines
    assert not any(s.startswith(("creating", "uploaded")) for s in ui.steps + ui.lines)
    assert (third.resource, third.url, third.image) == (second.resource, second.url, second.image)
    assert lam.get_alias(FunctionName=name, Name="live")["FunctionVersion"] == third.version
    assert [r["repositoryName"] for r in aws["ecr"].describe_repositories()["repositories"]].count(name) == 1


def test_docker_archive_layers_are_compressed_deterministically(aws, tmp_path, compiled):
    name = _name()
    docker_archive(tmp_path / "saved.tar", "docker")
    first = deploy_lambda(_options(name, f"docker-archive:{tmp_path / 'saved.tar'}"), compiled)
    (image,) = aws["ecr"].batch_get_image(repositoryName=name, imageIds=[{"imageDigest": first.image_digest}])["images"]
    manifest = json.loads(image["imageManifest"])
    assert manifest["mediaType"] == "application/vnd.docker.distribution.manifest.v2+json"
    assert [l["mediaType"] for l in manifest["layers"]] == ["application/vnd.docker.image.rootfs.diff.tar.gzip"]
    # the pushed layer is the gzip of the saved tar
    raw = tarfile.open(tmp_path / "saved.tar").extractfile("l1/layer.tar").read()
    assert json.loads(tarfile.open(tmp_path / "saved.tar").extractfile("config.json").read())["rootfs"]["diff_ids"] == [_sha(raw)]
    # same archive, same digest: the compression has no timestamp
    again = deploy_lambda(_options(name, f"docker-archive:{tmp_path / 'saved.tar'}"), compiled)
    assert again.image_digest == first.image_digest


def test_uncompressed_oci_layers_are_compressed(aws, tmp_path, compiled):
    name = _name()
    original = oci_archive(tmp_path / "plain.tar", "plain", compressed=False)
    record = deploy_lambda(_options(name, f"oci-archive:{tmp_path / 'plain.tar'}"), compiled)
    assert record.image_digest != original  # the manifest now names the compressed layers
    (image,) = aws["ecr"].batch_get_image(repositoryName=name, imageIds=[{"imageDigest": record.image_digest}])["images"]
    assert {l["mediaType"] for l in json.loads(image["imageManifest"])["layers"]} == {"application/vnd.oci.image.layer.v1.tar+gzip"}


# ------------------------------------------------------------------------------------------
# failures leave `live` where it was


def test_failed_update_leaves_live_on_the_previous_version(aws, tmp_path, compiled):
    name = _name()
    oci_archive(tmp_path / "v1.tar", "v1")
    first = deploy_lambda(_options(name, f"oci-archive:{tmp_path / 'v1.tar'}"), compiled)
    lam = aws["lambda"]

    # Lambda refuses the update: the image digest is not in the repository
    missing = f"123456789012.dkr.ecr.us-east-1.amazonaws.com/{name}@sha256:" + "0" * 64
    with pytest.raises(DeployError, match="UpdateFunctionCode .* failed: .*does not exist"):
        deploy_lambda(_options(name, missing, overrides=LambdaOverrides(memory_mb=4096)), compiled)
    alias = lam.get_alias(FunctionName=name, Name="live")
    assert alias["FunctionVersion"] == first.version
    live = lam.get_function(FunctionName=name, Qualifier="live")
    assert live["Code"]["ImageUri"] == first.image and live["Configuration"]["MemorySize"] == 1769
    assert [v["Version"] for v in lam.list_versions_by_function(FunctionName=name)["Versions"]] == ["$LATEST", "1"]

    # refused before any Lambda call: an arm64 image for an x86_64 function
    oci_archive(tmp_path / "arm.tar", "arm", arch="arm64")
    with pytest.raises(DeployError, match="is a linux/arm64 image; the function runs linux/amd64"):
        deploy_lambda(_options(name, f"oci-archive:{tmp_path / 'arm.tar'}"), compiled)
    assert lam.get_alias(FunctionName=name, Name="live")["FunctionVersion"] == first.version


def _answer_invoke(session: boto3.Session, answers: list[dict[str, Any]], seen: list[dict[str, Any]]) -> None:
    """Answer lambda:Invoke at the request level (moto cannot run image functions); every other
    call of clients made from `session` still goes to moto."""

    def record(params: dict[str, Any], **_: Any) -> None:
        seen.append(dict(params))  # the API parameters, as the Stubber would check them

    def before_call(model: Any, **_: Any) -> Any:
        answer = answers.pop(0)
        payload = json.dumps(answer.pop("payload")).encode()
        parsed = {"StatusCode": 200, "Payload": StreamingBody(io.BytesIO(payload), len(payload)), **answer}
        return (AWSResponse(None, 200, {}, None), parsed)

    session.events.register("before-parameter-build.lambda.Invoke", record)
    session.events.register("before-call.lambda.Invoke", before_call)


def test_smoke_test_gates_the_alias(aws, tmp_path, compiled):
    name = _name()
    oci_archive(tmp_path / "v1.tar", "v1")
    oci_archive(tmp_path / "v2.tar", "v2")
    oci_archive(tmp_path / "v3.tar", "v3")
    session = boto3.Session()
    seen: list[dict[str, Any]] = []
    _answer_invoke(session, [
        {"payload": {"statusCode": 200, "body": ""}},
        {"payload": {"statusCode": 503, "body": '{"error":"model add_sub failed to load"}'}},
        {"payload": {"errorMessage": "Runtime exited", "errorType": "Runtime.ExitError"}, "FunctionError": "Unhandled"},
    ], seen)
    first = deploy_lambda(LambdaDeployOptions(name=name, image=f"oci-archive:{tmp_path / 'v1.tar'}", waiting=FAST), compiled, session=session)
    assert first.version == "1"
    event = json.loads(seen[0]["Payload"])
    assert seen[0]["Qualifier"] == "1" and seen[0]["FunctionName"] == name
    assert event["version"] == "2.0" and event["rawPath"] == "/v2/health/ready"
    assert event["requestContext"]["http"]["method"] == "GET"

    lam = aws["lambda"]
    with pytest.raises(DeployError, match="is not ready .*answered 503.*alias 'live' was not moved") as info:
        deploy_lambda(LambdaDeployOptions(name=name, image=f"oci-archive:{tmp_path / 'v2.tar'}", waiting=FAST), compiled, session=session)
    assert "failed to load" in info.value.detail
    assert lam.get_alias(FunctionName=name, Name="live")["FunctionVersion"] == "1"
    with pytest.raises(DeployError, match="failed its smoke test \\(Unhandled\\)"):
        deploy_lambda(LambdaDeployOptions(name=name, image=f"oci-archive:{tmp_path / 'v3.tar'}", waiting=FAST), compiled, session=session)
    assert lam.get_alias(FunctionName=name, Name="live")["FunctionVersion"] == "1"
    assert [p["Qualifier"] for p in seen] == ["1", "2", "3"]


# ------------------------------------------------------------------------------------------
# Function URL auth


def test_url_auth_types(aws, tmp_path, compiled):
    name = _name()
    oci_archive(tmp_path / "v1.tar", "v1")
    image = f"oci-archive:{tmp_path / 'v1.tar'}"
    ui = RecordingUI()
    public = deploy_lambda(_options(name, image, overrides=LambdaOverrides(auth="none")), compiled, ui)
    assert public.auth == "NONE"
    assert any("will be PUBLIC" in w and "lambda:InvokeFunction" in w for w in ui.warnings)
    lam = aws["lambda"]
    assert lam.get_function_url_config(FunctionName=name, Qualifier="live")["AuthType"] == "NONE"
    statements = {s["Sid"]: s for s in json.loads(lam.get_policy(FunctionName=name, Qualifier="live")["Policy"])["Statement"]}
    assert statements["toolkit-public-url"]["Action"] == "lambda:InvokeFunctionUrl"
    assert statements["toolkit-public-url"]["Principal"] == "*"
    assert statements["toolkit-public-url-invoke"]["Action"] == "lambda:InvokeFunction"
    assert statements["toolkit-public-url-invoke"]["InvokedViaFunctionUrl"] is True
    assert all(s["Resource"].endswith(f":{name}:live") for s in statements.values())

    # back to AWS_IAM: the URL is kept, the public statements are removed
    private = deploy_lambda(_options(name, image), compiled)
    assert private.url == public.url and private.auth == "AWS_IAM"
    assert lam.get_function_url_config(FunctionName=name, Qualifier="live")["AuthType"] == "AWS_IAM"
    with pytest.raises(lam.exceptions.ResourceNotFoundException):  # no statement left: no policy at all
        lam.get_policy(FunctionName=name, Qualifier="live")


# ------------------------------------------------------------------------------------------
# provisioned concurrency and the smoke test, at the request level (botocore Stubber)


def _stubbed_lambda() -> tuple[Any, Stubber]:
    client = boto3.client("lambda", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="y",
                          endpoint_url="http://127.0.0.1:9")  # never contacted: the Stubber answers
    return client, Stubber(client)


def test_provisioned_concurrency_on_the_alias():
    """Stubber: moto answers 404 to provisioned concurrency."""
    client, stubber = _stubbed_lambda()
    expected = {"FunctionName": "fn", "Qualifier": "live"}
    stubber.add_response("put_provisioned_concurrency_config", {"RequestedProvisionedConcurrentExecutions": 2, "Status": "IN_PROGRESS"},
                         {**expected, "ProvisionedConcurrentExecutions": 2})
    stubber.add_response("get_provisioned_concurrency_config", {"Status": "IN_PROGRESS", "AvailableProvisionedConcurrentExecutions": 0}, expected)
    stubber.add_response("get_provisioned_concurrency_config", {"Status": "READY", "AvailableProvisionedConcurrentExecutions": 2}, expected)
    sleeps: list[float] = []
    with stubber:
        status = apply_provisioned_concurrency(client, "fn", 2, Waiting(poll_s=5, sleep=sleeps.append), RecordingUI())
        stubber.assert_no_pending_responses()
    assert status == "READY" and sleeps == [5]


def test_provisioned_concurrency_failure_and_removal():
    """Stubber: moto answers 404 to provisioned concurrency."""
    client, stubber = _stubbed_lambda()
    stubber.add_response("put_provisioned_concurrency_config", {"Status": "IN_PROGRESS"})
    stubber.add_response("get_provisioned_concurrency_config",
                         {"Status": "FAILED", "StatusReason": "FUNCTION_ERROR_INIT_FAILURE"})
    stubber.add_response("delete_provisioned_concurrency_config", {}, {"FunctionName": "fn", "Qualifier": "live"})
    stubber.add_client_error("delete_provisioned_concurrency_config", "ProvisionedConcurrencyConfigNotFoundException", http_status_code=404)
    with stubber:
        with pytest.raises(DeployError, match="failed: FUNCTION_ERROR_INIT_FAILURE"):
            apply_provisioned_concurrency(client, "fn", 4, FAST, RecordingUI())
        assert apply_provisioned_concurrency(client, "fn", 0, FAST, RecordingUI()) == "REMOVED"
        assert apply_provisioned_concurrency(client, "fn", 0, FAST, RecordingUI()) == "REMOVED"  # nothing to remove
        assert apply_provisioned_concurrency(client, "fn", None, FAST, RecordingUI()) is None  # no call at all
        stubber.assert_no_pending_responses()


def test_smoke_test_request():
    """Stubber: moto cannot invoke image functions."""
    client, stubber = _stubbed_lambda()
    body = b'{"statusCode": 200, "headers": {}, "body": ""}'
    stubber.add_response(
        "invoke", {"StatusCode": 200, "Payload": StreamingBody(io.BytesIO(body), len(body))},
        {"FunctionName": "fn", "Qualifier": "7", "InvocationType": "RequestResponse", "Payload": ANY},
    )
    denied = b'{"statusCode": 503, "body": "{\\"error\\": \\"not ready\\"}"}'
    stubber.add_response("invoke", {"StatusCode": 200, "Payload": StreamingBody(io.BytesIO(denied), len(denied))})
    with stubber:
        smoke_test(client, "fn", "7", RecordingUI())
        with pytest.raises(DeployError, match="answered 503") as info:
            smoke_test(client, "fn", "8", RecordingUI())
        assert "not ready" in info.value.detail
        stubber.assert_no_pending_responses()


# ------------------------------------------------------------------------------------------
# the CLI: dry run and record


def _cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "deploy", *args], capture_output=True, text=True, timeout=300,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}, cwd=cwd,
    )


def _requests_logged(log: Path) -> int:
    """Requests in moto's access log (werkzeug: `"GET /path HTTP/1.1" 200`, maybe colourised)."""
    return len(re.findall(r"(?:GET|POST|PUT|DELETE|HEAD|PATCH) /\S* HTTP/1\.1", log.read_text(errors="replace")))


def test_dry_run_makes_no_calls(aws, tmp_path, compiled):
    name = _name()
    oci_archive(tmp_path / "v1.tar", "v1")
    repo = compiled.root
    before = _requests_logged(aws["log"])
    env = {**DUMMY, "AWS_ENDPOINT_URL": aws["endpoint"]}
    result = _cli([str(repo), "--target", "lambda", "--name", name, "--image", f"oci-archive:{tmp_path / 'v1.tar'}",
                   "--dry-run", "--region", "us-east-1", "--auth", "none", "--provisioned-concurrency", "2"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "dry run: nothing was changed" in result.stdout
    assert "AuthType NONE (PUBLIC" in result.stdout and "1769 MB" in result.stdout and "2 on 'live'" in result.stdout
    assert "will be PUBLIC" in result.stderr
    time.sleep(0.5)  # let moto flush its request log (there must be nothing to flush)
    assert _requests_logged(aws["log"]) == before
    with pytest.raises(aws["lambda"].exceptions.ResourceNotFoundException):
        aws["lambda"].get_function(FunctionName=name)
    time.sleep(0.5)
    assert _requests_logged(aws["log"]) == before + 1  # the log does see requests: that one
    template = tmp_path / "deploy" / f"{name}-lambda" / "template.yaml"
    assert "AuthType: NONE" in template.read_text()
    # not even credentials are needed, and an unreachable endpoint is never contacted
    bare = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
            "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none")}
    result = _cli(["--target", "lambda", "--name", name, "--image", f"oci-archive:{tmp_path / 'v1.tar'}", "--dry-run", "--json"], bare, tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["dry_run"] is True


def test_cli_deploy_prints_and_writes_the_record(aws, tmp_path, compiled):
    name = _name()
    digest = oci_archive(tmp_path / "v1.tar", "v1")
    env = {**DUMMY, "AWS_ENDPOINT_URL": aws["endpoint"]}
    result = _cli([str(compiled.root), "--target", "lambda", "--name", name, "--image", f"oci-archive:{tmp_path / 'v1.tar'}",
                   "--no-smoke-test", "--json", "--output", str(tmp_path / "out")], env, tmp_path)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["target"] == "lambda" and record["name"] == name and record["image_digest"] == digest
    assert record["url"] == aws["lambda"].get_function_url_config(FunctionName=name, Qualifier="live")["FunctionUrl"]
    assert record["version"] == "1" and record["account"] == "123456789012" and record["dry_run"] is False
    assert json.loads((tmp_path / "out" / "deploy-record.json").read_text()) == record
    assert (tmp_path / "out" / "template.yaml").read_text().count(digest) == 1  # the SAM template of what was deployed

    # options of another target are refused before anything happens
    result = _cli(["--target", "lambda", "--name", name, "--image", "x:1", "--gpu", "nvidia-l4"], env, tmp_path)
    assert result.returncode == 2 and "--gpu does not apply to --target lambda" in result.stderr


# ------------------------------------------------------------------------------------------
# archives written by a real container engine


@pytest.fixture(scope="module")
def engine():
    from toolkit.deploy.engine import find_engine

    try:
        return find_engine("auto")
    except DeployError as exc:
        pytest.skip(f"needs a running container engine: {exc.message}")


def test_engine_saved_archive_is_pushed_faithfully(aws, tmp_path, compiled, engine):
    """`podman save --format oci-archive` / `docker save` output, pushed through ECR's layer API:
    the config blob ECR holds is the engine's image (its id is the config's digest)."""
    rootfs = tmp_path / "rootfs.tar"
    rootfs.write_bytes(_tar({"var/task/handler.txt": b"toolkit", "opt/toolkit/models.json": b"{}"}))
    reference = f"localhost/toolkit-deploy-test:{uuid.uuid4().hex[:8]}"
    subprocess.run([engine.path, "import", str(rootfs), reference], check=True, capture_output=True, timeout=120)
    try:
        image_id = subprocess.run([engine.path, "image", "inspect", "--format", "{{.Id}}", reference],
                                  check=True, capture_output=True, text=True, timeout=60).stdout.strip()
        archive = tmp_path / "saved.tar"
        if engine.name == "podman":
            subprocess.run([engine.path, "save", "--format", "oci-archive", "-o", str(archive), reference], check=True, capture_output=True, timeout=120)
            transport = "oci-archive"
        else:
            subprocess.run([engine.path, "save", "-o", str(archive), reference], check=True, capture_output=True, timeout=120)
            transport = "docker-archive"
    finally:
        subprocess.run([engine.path, "rmi", reference], capture_output=True, timeout=60)
    name = _name()
    record = deploy_lambda(_options(name, f"{transport}:{archive}"), compiled)
    (image,) = aws["ecr"].batch_get_image(repositoryName=name, imageIds=[{"imageDigest": record.image_digest}])["images"]
    manifest = json.loads(image["imageManifest"])
    assert manifest["config"]["digest"] == (image_id if image_id.startswith("sha256:") else f"sha256:{image_id}")
    assert all(l["mediaType"].endswith("gzip") for l in manifest["layers"])
    assert aws["lambda"].get_function(FunctionName=name)["Code"]["ImageUri"] == record.image
