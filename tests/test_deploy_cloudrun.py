"""`toolkit deploy --target cloudrun` against a local HTTP server standing in for Google's APIs.

The stand-in (below, on 127.0.0.1) is NOT Google: it implements the subset of Google's OAuth 2.0
token endpoint, the Cloud Run Admin API v1 (namespaces.services get / create / replaceService,
projects.locations.services getIamPolicy / setIamPolicy) and Artifact Registry (repositories,
operations) that toolkit calls, with the documented behaviour it relies on: 404 for a missing
service, Knative `Ready` conditions reported once `observedGeneration` catches up,
`metadata.resourceVersion` checked on replace, `serving.knative.dev/*` annotations immutable.
No test here claims a real Cloud Run deployment.

Credentials take google-auth's real path: GOOGLE_APPLICATION_CREDENTIALS names a service-account
key generated here whose `token_uri` is the stand-in; google-auth signs a JWT assertion with the
key, the stand-in verifies it with the key's certificate (google.auth.jwt) and issues an access
token, which every API call must carry.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import re
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

import model_builders as mb
from conftest import write_config
from toolkit.deploy.cloudrun.admin_api import Endpoints
from toolkit.deploy.cloudrun.artifact_registry import ensure_repository
from toolkit.deploy.cloudrun.deploy import CloudRunDeployOptions, deploy_cloudrun
from toolkit.deploy.errors import DeployError, ManualSteps
from toolkit.deploy.progress import RecordingUI
from toolkit.deploy.service_settings import ServiceOverrides
from toolkit.repository.compile import compile_repository

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "toolkit-test"
REGION = "us-central1"
IMAGE = f"{REGION}-docker.pkg.dev/{PROJECT}/toolkit/add-sub@sha256:" + "ab" * 32


def _key_and_cert(common_name: str) -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1)).sign(key, hashes.SHA256())
    )
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    return private.decode(), cert.public_bytes(serialization.Encoding.PEM).decode()


class GoogleStandIn:
    """State and behaviour of the stand-in (see the module docstring)."""

    def __init__(self, service_account_cert: str, key_id: str) -> None:
        self.certs = {key_id: service_account_cert}
        self.tokens: set[str] = set()
        self.services: dict[str, dict[str, Any]] = {}
        self.pending_gets: dict[str, int] = {}
        self.fail_generations: dict[str, str] = {}  # "name:generation" -> failure message
        self.policies: dict[str, dict[str, Any]] = {}
        self.repositories: set[str] = set()
        self.operations: dict[str, int] = {}
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.url = ""

    def error(self, code: int, status: str, message: str) -> tuple[int, dict[str, Any]]:
        return code, {"error": {"code": code, "status": status, "message": message}}

    def token(self, form: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        from google.auth import jwt

        if form.get("grant_type") != ["urn:ietf:params:oauth:grant-type:jwt-bearer"]:
            return 400, {"error": "unsupported_grant_type"}
        try:
            # google-auth addresses its assertions to Google's token endpoint, whatever token_uri says
            claims = jwt.decode(form["assertion"][0], certs=self.certs, audience="https://oauth2.googleapis.com/token")
        except Exception as exc:  # a bad signature, audience or expiry
            return 400, {"error": "invalid_grant", "error_description": str(exc)}
        assert "cloud-platform" in claims.get("scope", ""), claims
        token = f"ya29.{uuid.uuid4().hex}"
        self.tokens.add(token)
        return 200, {"access_token": token, "expires_in": 3600, "token_type": "Bearer"}

    # -- Cloud Run Admin API v1 (Knative) ---------------------------------------------------

    def _status(self, name: str) -> None:
        """One reconciliation step per GET: after two GETs the new generation is observed."""
        service = self.services[name]
        generation = service["metadata"]["generation"]
        settled = {c["type"]: c["status"] for c in service["status"].get("conditions", [])}.get("Ready") in ("True", "False")
        if service["status"].get("observedGeneration", 0) >= generation and settled:
            return
        self.pending_gets[name] = self.pending_gets.get(name, 0) + 1
        if self.pending_gets[name] < 2:
            # Knative observes the new generation at once and reports it as in progress
            service["status"]["observedGeneration"] = generation
            service["status"]["conditions"] = [{"type": "Ready", "status": "Unknown", "reason": "Deploying",
                                                "message": "Creating Revision."}]
            return
        self.pending_gets[name] = 0
        revision = f"{name}-{generation:05d}-abc"
        failure = self.fail_generations.get(f"{name}:{generation}")
        if failure:
            service["status"]["conditions"] = [
                {"type": "Ready", "status": "False", "reason": "HealthCheckContainerError", "message": failure},
                {"type": "ConfigurationsReady", "status": "False", "message": failure},
            ]
            service["status"]["latestCreatedRevisionName"] = revision
            return
        service["status"].update({
            "conditions": [{"type": "Ready", "status": "True"}, {"type": "ConfigurationsReady", "status": "True"},
                           {"type": "RoutesReady", "status": "True"}],
            "latestCreatedRevisionName": revision, "latestReadyRevisionName": revision,
            "url": f"https://{name}-4f3c2b1a0-uc.a.run.app",
        })

    def services_call(self, method: str, project: str, name: str | None, body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        if project == "forbidden-project":
            return self.error(403, "PERMISSION_DENIED", "Permission 'run.services.get' denied on resource")
        if method == "GET":
            if name not in self.services:
                return self.error(404, "NOT_FOUND", f"Resource '{name}' of kind 'SERVICE' in region '{REGION}' in project '{project}' does not exist.")
            self._status(name)
            return 200, self.services[name]
        assert body is not None
        problem = self._invalid(body, project)
        if problem:
            return self.error(400, "INVALID_ARGUMENT", problem)
        meta = body["metadata"]
        if method == "POST":
            if meta["name"] in self.services:
                return self.error(409, "ALREADY_EXISTS", "Resource already exists")
            stored = copy.deepcopy(body)
            stored["metadata"].update({"generation": 1, "resourceVersion": "rv-1", "uid": str(uuid.uuid4())})
            stored["metadata"].setdefault("annotations", {})["serving.knative.dev/creator"] = "deployer@toolkit-test.iam.gserviceaccount.com"
            stored["status"] = {}
            self.services[meta["name"]] = stored
            self.policies.setdefault(meta["name"], {"etag": "BwA", "bindings": []})
            return 200, stored
        current = self.services.get(name or "")
        if current is None:
            return self.error(404, "NOT_FOUND", f"service {name} does not exist")
        if meta.get("resourceVersion") != current["metadata"]["resourceVersion"]:
            return self.error(409, "ABORTED", "the resourceVersion does not match: the service changed since it was read")
        for key, value in current["metadata"]["annotations"].items():
            if key.startswith("serving.knative.dev/") and meta.get("annotations", {}).get(key) != value:
                return self.error(400, "INVALID_ARGUMENT", f"annotation {key} is immutable")
        stored = copy.deepcopy(body)
        generation = current["metadata"]["generation"] + 1
        stored["metadata"].update({"generation": generation, "resourceVersion": f"rv-{generation}", "uid": current["metadata"]["uid"]})
        stored["status"] = current["status"]
        self.services[name or ""] = stored
        return 200, stored

    @staticmethod
    def _invalid(body: dict[str, Any], project: str) -> str | None:
        if (body.get("apiVersion"), body.get("kind")) != ("serving.knative.dev/v1", "Service"):
            return "expected a serving.knative.dev/v1 Service"
        if body.get("metadata", {}).get("namespace") != project:
            return "metadata.namespace must be the project"
        if "status" in body:
            return "status is output only"
        container = body["spec"]["template"]["spec"]["containers"][0]
        if not container.get("image"):
            return "spec.template.spec.containers[0].image is required"
        return None

    # -- IAM and Artifact Registry ----------------------------------------------------------

    def iam(self, name: str, verb: str, body: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
        if name not in self.policies:
            return self.error(404, "NOT_FOUND", f"service {name} does not exist")
        if verb == "setIamPolicy":
            assert body is not None
            self.policies[name] = body["policy"]
        return 200, self.policies[name]

    def artifact_registry(self, method: str, path: str, query: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        match = re.fullmatch(r"/v1/(projects/[^/]+/locations/[^/]+)/(repositories|operations)(?:/([^/]+))?", path)
        assert match, path
        parent, collection, item = match.groups()
        if collection == "operations":
            self.operations[item] += 1
            return 200, {"name": f"{parent}/operations/{item}", "done": self.operations[item] >= 2}
        if method == "GET":
            if item in self.repositories:
                return 200, {"name": f"{parent}/repositories/{item}", "format": "DOCKER"}
            return self.error(404, "NOT_FOUND", f"Requested entity was not found.")
        repository = query["repositoryId"][0]
        self.repositories.add(repository)
        operation = uuid.uuid4().hex
        self.operations[operation] = 0
        return 200, {"name": f"{parent}/operations/{operation}", "done": False}


class _Handler(BaseHTTPRequestHandler):
    server: "_Server"

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, document: dict[str, Any]) -> None:
        body = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _handle(self) -> None:
        google = self.server.google
        parts = urlsplit(self.path)
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with google.lock:
            google.requests.append((self.command, parts.path))
            if parts.path == "/token":
                self._answer(*google.token(parse_qs(raw.decode())))
                return
            token = self.headers.get("Authorization", "").removeprefix("Bearer ")
            if token not in google.tokens:
                self._answer(*google.error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials."))
                return
            body = json.loads(raw) if raw else None
            knative = re.fullmatch(r"/apis/serving\.knative\.dev/v1/namespaces/([^/]+)/services(?:/([^/]+))?", parts.path)
            iam = re.fullmatch(r"/v1/projects/[^/]+/locations/[^/]+/services/([^/:]+):(getIamPolicy|setIamPolicy)", parts.path)
            if knative:
                self._answer(*google.services_call(self.command, knative.group(1), knative.group(2), body))
            elif iam:
                self._answer(*google.iam(iam.group(1), iam.group(2), body))
            else:
                self._answer(*google.artifact_registry(self.command, parts.path, parse_qs(parts.query)))

    do_GET = do_POST = do_PUT = _handle  # noqa: N815


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    google: GoogleStandIn


@pytest.fixture
def cloud(tmp_path, monkeypatch) -> Iterator[GoogleStandIn]:
    for name in list(os.environ):
        if name.startswith(("GOOGLE_", "GCLOUD_", "CLOUDSDK_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # google-auth: do not probe a metadata server
    # Every real Google endpoint is https: send any such request (google-auth's background
    # regional-access-boundary lookup at iamcredentials.googleapis.com) to a closed local port.
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    private, cert = _key_and_cert("deployer")
    key_id = uuid.uuid4().hex
    stand_in = GoogleStandIn(cert, key_id)
    server = _Server(("127.0.0.1", 0), _Handler)
    server.google = stand_in
    stand_in.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    key_file = tmp_path / "deployer.json"
    key_file.write_text(json.dumps({
        "type": "service_account", "project_id": PROJECT, "private_key_id": key_id, "private_key": private,
        "client_email": "deployer@toolkit-test.iam.gserviceaccount.com", "client_id": "1",
        "token_uri": f"{stand_in.url}/token",
    }))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))
    yield stand_in
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    repo = tmp_path_factory.mktemp("cloudrun-repo") / "models"
    mb.add_sub(repo / "add_sub" / "1" / "model.onnx")
    write_config(repo, "add_sub", """
        backend: "onnxruntime"
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        dynamic_batching { }
        instance_group [ { count: 2 kind: KIND_GPU } ]
    """)
    result = compile_repository(repo, None, "gpu")
    assert result.ok
    return result


def _options(cloud: GoogleStandIn, tmp_path: Path, **kwargs: Any) -> CloudRunDeployOptions:
    values: dict[str, Any] = dict(name="add-sub", region=REGION, image=IMAGE, output_dir=tmp_path / "out",
                                  api_endpoint=cloud.url, poll_s=0, sleep=lambda s: None)
    values.update(kwargs)
    return CloudRunDeployOptions(**values)


def test_create_applies_the_rendered_yaml_as_it_is(cloud, tmp_path, compiled):
    ui = RecordingUI()
    record = deploy_cloudrun(_options(cloud, tmp_path), compiled, ui)
    assert record.url == "https://add-sub-4f3c2b1a0-uc.a.run.app"
    assert record.version == "add-sub-00001-abc" and record.account == PROJECT and record.auth == "google-id-token"
    assert record.resource == f"projects/{PROJECT}/locations/{REGION}/services/add-sub"
    # what the API received is the manifest on disk, plus the namespace (the project)
    manifest = yaml.safe_load(Path(record.manifest).read_text())
    stored = copy.deepcopy(cloud.services["add-sub"])
    for key in ("generation", "resourceVersion", "uid", "namespace"):
        stored["metadata"].pop(key)
    stored["metadata"]["annotations"].pop("serving.knative.dev/creator")
    stored.pop("status")
    assert stored == manifest
    template = manifest["spec"]["template"]
    assert template["spec"]["nodeSelector"] == {"run.googleapis.com/accelerator": "nvidia-l4"}
    assert template["spec"]["containers"][0]["image"] == IMAGE
    # google-auth's service-account flow: one assertion exchanged, then Bearer on every call
    calls = [c for c in cloud.requests if c[1] != "/token"]
    assert cloud.requests[0] == ("POST", "/token") and len(cloud.tokens) == 1
    assert ("POST", f"/apis/serving.knative.dev/v1/namespaces/{PROJECT}/services") in calls
    assert calls[-1][1].endswith(":getIamPolicy")  # private unless asked: only read, never set
    assert "Creating Revision." in ui.lines
    assert cloud.policies["add-sub"]["bindings"] == []


def test_replace_carries_resource_version_and_serving_annotations(cloud, tmp_path, compiled):
    deploy_cloudrun(_options(cloud, tmp_path), compiled)
    options = _options(cloud, tmp_path, overrides=ServiceOverrides(environment={"TOOLKIT_LOG_LEVEL": "debug"}, max_instances=5))
    record = deploy_cloudrun(options, compiled)
    stored = cloud.services["add-sub"]
    assert stored["metadata"]["generation"] == 2 and record.version == "add-sub-00002-abc"
    container = stored["spec"]["template"]["spec"]["containers"][0]
    assert container["env"] == [{"name": "TOOLKIT_LOG_LEVEL", "value": "debug"}]
    assert stored["spec"]["template"]["metadata"]["annotations"]["autoscaling.knative.dev/maxScale"] == "5"
    assert ("PUT", f"/apis/serving.knative.dev/v1/namespaces/{PROJECT}/services/add-sub") in cloud.requests


def test_failed_revision_is_reported(cloud, tmp_path, compiled):
    deploy_cloudrun(_options(cloud, tmp_path), compiled)
    cloud.fail_generations["add-sub:2"] = (
        "The user-provided container failed the configured startup probe checks."
    )
    with pytest.raises(DeployError, match="the new revision of add-sub failed: The user-provided container failed") as info:
        deploy_cloudrun(_options(cloud, tmp_path, overrides=ServiceOverrides(min_instances=1)), compiled)
    assert "ConfigurationsReady" in info.value.detail


def test_allow_unauthenticated(cloud, tmp_path, compiled):
    ui = RecordingUI()
    record = deploy_cloudrun(_options(cloud, tmp_path, allow_unauthenticated=True), compiled, ui)
    assert record.auth == "NONE"
    assert {"role": "roles/run.invoker", "members": ["allUsers"]} in cloud.policies["add-sub"]["bindings"]
    assert any("will be PUBLIC" in w for w in ui.warnings)
    # a later deploy without the flag does not silently keep it public: it says so
    ui = RecordingUI()
    again = deploy_cloudrun(_options(cloud, tmp_path), compiled, ui)
    assert again.auth == "NONE" and any("already grants allUsers" in w for w in ui.warnings)


def test_api_errors_are_explained(cloud, tmp_path, compiled):
    with pytest.raises(DeployError, match="403 PERMISSION_DENIED: Permission 'run.services.get' denied"):
        deploy_cloudrun(_options(cloud, tmp_path, project="forbidden-project"), compiled)


def test_artifact_registry_repository_is_created(cloud, tmp_path):
    import google.auth
    from google.auth.transport.requests import AuthorizedSession

    credentials, project = google.auth.default(scopes=["https://www.googleapis.com/auth/cloud-platform"])
    session = AuthorizedSession(credentials)
    ui = RecordingUI()
    ensure_repository(session, Endpoints.override(cloud.url), project, REGION, "toolkit", ui, poll_s=0, sleep=lambda s: None)
    assert cloud.repositories == {"toolkit"} and ui.steps == [f"creating Artifact Registry repository toolkit in {REGION}"]
    operations = [p for m, p in cloud.requests if "/operations/" in p]
    assert len(operations) == 2  # polled until done
    ensure_repository(session, Endpoints.override(cloud.url), project, REGION, "toolkit", RecordingUI(), poll_s=0)
    assert len([r for r in cloud.requests if r[0] == "POST" and "repositories" in r[1]]) == 1


def test_without_credentials_prints_the_gcloud_commands(cloud, tmp_path, compiled, monkeypatch):
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    with pytest.raises(ManualSteps) as info:
        deploy_cloudrun(_options(cloud, tmp_path, project=PROJECT, allow_unauthenticated=True), compiled)
    manifest = tmp_path / "out" / "service.yaml"
    assert info.value.manifest == str(manifest) and manifest.is_file()
    assert info.value.commands == [
        f"gcloud run services replace {manifest} --region {REGION} --project {PROJECT}",
        f"gcloud run services add-iam-policy-binding add-sub --region {REGION} --project {PROJECT} "
        "--member=allUsers --role=roles/run.invoker",
    ]
    assert cloud.requests == []

    # a local image: the commands push it to Artifact Registry first, and the manifest names it there
    with pytest.raises(ManualSteps) as info:
        deploy_cloudrun(_options(cloud, tmp_path, project=PROJECT, image="add-sub:0a1b2c"), compiled)
    target = f"{REGION}-docker.pkg.dev/{PROJECT}/toolkit/add-sub:0a1b2c"
    assert f"docker push {target}" in info.value.commands
    assert yaml.safe_load(manifest.read_text())["spec"]["template"]["spec"]["containers"][0]["image"] == target


def _cli(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "toolkit.cli", "deploy", *args], capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}, cwd=tmp_path,
    )


def test_cli(cloud, tmp_path, compiled, monkeypatch):
    repo = str(compiled.root)
    dry = _cli([repo, "--target", "cloudrun", "--name", "add-sub", "--image", IMAGE, "--region", REGION, "--dry-run"], tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "1 x nvidia-l4" in dry.stdout and "16 requests per instance" in dry.stdout
    assert cloud.requests == []  # a dry run calls nothing
    result = _cli([repo, "--target", "cloudrun", "--name", "add-sub", "--image", IMAGE, "--region", REGION,
                   "--api-endpoint", cloud.url, "--json"], tmp_path)
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    assert record["url"] == "https://add-sub-4f3c2b1a0-uc.a.run.app" and record["settings"]["gpu"] == "nvidia-l4"
    assert json.loads((tmp_path / "deploy" / "add-sub-cloudrun" / "deploy-record.json").read_text()) == record

    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
    manual = _cli([repo, "--target", "cloudrun", "--name", "add-sub", "--image", IMAGE, "--region", REGION,
                   "--project", PROJECT], tmp_path)
    assert manual.returncode == 1
    assert "not deployed" in manual.stderr
    assert f"gcloud run services replace deploy/add-sub-cloudrun/service.yaml --region {REGION}" in manual.stdout
    refused = _cli([repo, "--target", "cloudrun", "--image", IMAGE, "--region", REGION, "--gpu", "nvidia-l4", "--cpu", "2"], tmp_path)
    assert refused.returncode == 2 and "at least 4 CPU and 16 GiB" in refused.stderr


# ------------------------------------------------------------------------------------------
# the push: a real container engine and a real registry (distribution's docker-registry on
# 127.0.0.1 stands in for Artifact Registry's host; the login takes any password, as a registry
# without auth does, so what is checked is the engine's login, tag and push and the digest)


def _engine_missing(reason: str) -> None:
    """Skip locally without an engine (the README's test command); CI sets TOOLKIT_REQUIRE_DOCKER=1
    and starts one, so there the test must run: fail instead."""
    if os.environ.get("TOOLKIT_REQUIRE_DOCKER") == "1":
        pytest.fail(f"TOOLKIT_REQUIRE_DOCKER=1 but {reason}")
    pytest.skip(reason)


@pytest.fixture
def registry(tmp_path) -> Iterator[str]:
    import shutil
    import socket
    import time

    binary = shutil.which("docker-registry") or shutil.which("registry")
    if binary is None:
        _engine_missing("needs distribution's docker-registry (scripts/ci-docker.sh install)")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = tmp_path / "registry.yml"
    config.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'blobs'}\nhttp:\n  addr: 127.0.0.1:{port}\n")
    process = subprocess.Popen([binary, "serve", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while True:  # a separate process offers no readiness event: poll its port
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert process.poll() is None and time.monotonic() < deadline, "docker-registry did not start"
            time.sleep(0.05)
    yield f"127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=20)


def test_engine_push_to_a_registry(registry, tmp_path, monkeypatch):
    import io
    import tarfile
    import urllib.request

    from toolkit.deploy.cloudrun.artifact_registry import push
    from toolkit.deploy.engine import find_engine

    try:
        engine = find_engine("auto")
    except DeployError as exc:
        _engine_missing(f"needs a running container engine: {exc.message}")
    conf = tmp_path / "registries.conf"  # podman: the local registry speaks plain HTTP (docker allows 127.0.0.1 itself)
    conf.write_text(f'[[registry]]\nlocation = "{registry}"\ninsecure = true\n')
    monkeypatch.setenv("CONTAINERS_REGISTRIES_CONF", str(conf))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))  # keep the login out of ~/.docker
    monkeypatch.setenv("REGISTRY_AUTH_FILE", str(tmp_path / "podman-auth.json"))
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("srv/app.txt")
        info.size = 7
        tar.addfile(info, io.BytesIO(b"toolkit"))
    (tmp_path / "rootfs.tar").write_bytes(buffer.getvalue())
    source = f"localhost/toolkit-push-test:{uuid.uuid4().hex[:8]}"
    subprocess.run([engine.path, "import", str(tmp_path / "rootfs.tar"), source], check=True, capture_output=True, timeout=120)
    target = f"{registry}/{PROJECT}/toolkit/push-test:1"
    ui = RecordingUI()
    try:
        digest = push(source, target, "ya29.access-token", engine, ui)
    finally:
        subprocess.run([engine.path, "rmi", source, target], capture_output=True, timeout=60)
    request = urllib.request.Request(
        f"http://{registry}/v2/{PROJECT}/toolkit/push-test/manifests/1",
        headers={"Accept": "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json"},
        method="HEAD",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert response.headers["Docker-Content-Digest"] == digest
    assert ui.steps == [f"logging {engine.name} in to {registry}", f"pushing {source} to {target} with {engine.name}"]
