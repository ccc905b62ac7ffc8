"""`toolkit invoke` and `toolkit proxy` against `toolkit serve` (a real server process).

Private deployments are represented by a verifying gateway (below): a local HTTP server in front of
`toolkit serve` that refuses any request whose credentials it cannot verify, then forwards it.

- SigV4 (Lambda Function URLs with AWS_IAM): the gateway recomputes the signature of the request
  it received with botocore's own signer (SigV4Auth: canonical request, string to sign, HMAC with
  the secret key for the date, region and service in the Credential scope) and compares it with
  the one in the Authorization header. What is verified: the method, path, query, every signed
  header (host, x-amz-date, x-amz-security-token, content-type ...), the body's hash, the key id,
  the region `us-east-1` and the service `lambda`.
- Google ID tokens (private Cloud Run): the proxy gets its token through google-auth's real
  service-account flow (GOOGLE_APPLICATION_CREDENTIALS names a key generated here; google-auth
  signs an assertion, the local token endpoint verifies it with the key's certificate and mints
  an ID token signed by a second local key); the gateway verifies the token with
  `google.oauth2.id_token.verify_token` against a local certificates URL: signature, expiry,
  audience (the gateway's URL) and issuer (https://accounts.google.com). What stands in for Google
  is the token endpoint and the certificates URL, nothing else.
"""

from __future__ import annotations

import datetime
import hmac
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qs

import numpy as np
import pytest
import tritonclient.http as httpclient
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from tritonclient.utils import InferenceServerException

import model_builders as mb
from conftest import write_config
from serving import free_port, serve
from tools import perf_analyzer
from toolkit.deploy.errors import DeployError
from toolkit.deploy.invoke import Endpoint, invoke
from toolkit.deploy.proxy import SigningProxy
from toolkit.deploy.signing import GoogleIdTokenSigner, NoSigner, SigV4Signer, signer_for

ROOT = Path(__file__).resolve().parents[1]
KEY_ID, SECRET, SESSION = "AKIDTOOLKITTEST", "toolkit-test-secret", "toolkit-session-token"
GOOGLE_ISSUER = "https://accounts.google.com"


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("invoke") / "models"
    mb.add_sub(repo / "add_sub" / "1" / "model.onnx")
    write_config(repo, "add_sub", """
        backend: "onnxruntime"
        max_batch_size: 8
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        dynamic_batching { }
    """)
    mb.identity(repo / "strings" / "1" / "model.onnx", {"TEXT": ("BYTES", ["N", 1])}, ["ECHO"])
    mb.identity(repo / "raw" / "1" / "model.onnx", {"DATA": ("UINT8", ["N", "L"])}, ["DATA_OUT"])
    write_config(repo, "raw", """
        backend: "onnxruntime"
        max_batch_size: 4
        input [ { name: "DATA" data_type: TYPE_UINT8 dims: [ -1 ] } ]
        output [ { name: "DATA_OUT" data_type: TYPE_UINT8 dims: [ -1 ] } ]
    """)
    return repo


@pytest.fixture(scope="module")
def server(repository):
    with serve(repository, "--device", "cpu") as s:
        yield s


# ------------------------------------------------------------------------------------------
# the verifying gateway


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


_AUTH = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, SignedHeaders=([^,]+), Signature=([0-9a-f]{64})")


def verify_sigv4(method: str, url: str, headers: dict[str, str], body: bytes) -> str | None:
    """None if botocore's signer computes the same signature for this request, else why not."""
    match = _AUTH.fullmatch(headers.get("authorization", ""))
    if not match:
        return "no SigV4 Authorization header"
    key_id, date, region, service, signed, signature = match.groups()
    if (key_id, region, service) != (KEY_ID, "us-east-1", "lambda"):
        return f"unexpected credential scope {key_id}/{region}/{service}"
    timestamp = headers.get("x-amz-date", "")
    if not timestamp.startswith(date):
        return "x-amz-date does not match the credential scope"
    names = signed.split(";")
    request = AWSRequest(method=method, url=url, data=body, headers={n: headers[n] for n in names if n in headers})
    request.context["timestamp"] = timestamp
    signer = SigV4Auth(Credentials(KEY_ID, SECRET, SESSION), service, region)
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    if not hmac.compare_digest(expected, signature):
        return "signature mismatch"
    if headers.get("x-amz-security-token") != SESSION or "x-amz-security-token" not in names:
        return "session token missing or unsigned"
    return None


class Gateway:
    def __init__(self, upstream: str, mode: str) -> None:
        self.upstream = upstream
        self.mode = mode  # "sigv4" or "google"
        self.verified = 0
        self.rejected: list[str] = []
        self.token_requests = 0
        self.lock = threading.Lock()
        self.url = ""
        self.sa_key_id = uuid.uuid4().hex
        self.sa_private, self.sa_cert = _key_and_cert("caller")
        self.google_key_id = uuid.uuid4().hex
        self.google_private, self.google_cert = _key_and_cert("google")

    def mint_id_token(self, form: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        from google.auth import crypt, jwt

        claims = jwt.decode(form["assertion"][0], certs={self.sa_key_id: self.sa_cert}, audience="https://oauth2.googleapis.com/token")
        now = int(time.time())
        payload = {"iss": GOOGLE_ISSUER, "aud": claims["target_audience"], "sub": "1234", "email": claims["iss"],
                   "iat": now, "exp": now + 3600}
        signer = crypt.RSASigner.from_string(self.google_private, self.google_key_id)
        with self.lock:
            self.token_requests += 1
        return 200, {"id_token": jwt.encode(signer, payload).decode()}

    def verify_google(self, headers: dict[str, str]) -> str | None:
        import google.auth.transport.requests
        import google.oauth2.id_token

        token = headers.get("authorization", "").removeprefix("Bearer ")
        try:
            claims = google.oauth2.id_token.verify_token(
                token, google.auth.transport.requests.Request(), audience=self.url, certs_url=f"{self.url}/certs"
            )
        except Exception as exc:
            return f"ID token refused: {exc}"
        return None if claims.get("iss") == GOOGLE_ISSUER else f"wrong issuer {claims.get('iss')}"


class _GatewayHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_GatewayServer"

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response(status)
        for key, value in headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _handle(self) -> None:
        gateway = self.server.gateway
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k.lower(): v for k, v in self.headers.items()}
        if gateway.mode == "google" and self.path == "/certs":
            self._send(200, [("Content-Type", "application/json")], json.dumps({gateway.google_key_id: gateway.google_cert}).encode())
            return
        if gateway.mode == "google" and self.path == "/token":
            status, document = gateway.mint_id_token(parse_qs(body.decode()))
            self._send(status, [("Content-Type", "application/json")], json.dumps(document).encode())
            return
        if gateway.mode == "sigv4":
            problem = verify_sigv4(self.command, f"http://{headers.get('host')}{self.path}", headers, body)
        else:
            problem = gateway.verify_google(headers)
        with gateway.lock:
            if problem:
                gateway.rejected.append(problem)
            else:
                gateway.verified += 1
        if problem:
            self._send(403, [("Content-Type", "application/json")], json.dumps({"message": f"Forbidden: {problem}"}).encode())
            return
        forward = {k: v for k, v in self.headers.items()
                   if k.lower() not in ("host", "authorization", "connection", "content-length") and not k.lower().startswith("x-amz-")}
        request = urllib.request.Request(gateway.upstream + self.path, data=body if body else None, headers=forward, method=self.command)
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                status, answer, relayed = response.status, response.read(), list(response.headers.items())
        except urllib.error.HTTPError as error:
            status, answer, relayed = error.code, error.read(), list(error.headers.items())
        relayed = [(k, v) for k, v in relayed if k.lower() not in ("content-length", "connection", "transfer-encoding", "date", "server")]
        self._send(status, relayed, answer)

    do_GET = do_POST = do_HEAD = _handle  # noqa: N815


class _GatewayServer(ThreadingHTTPServer):
    daemon_threads = True
    gateway: Gateway


@pytest.fixture
def aws_credentials(monkeypatch, tmp_path) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def _start_gateway(upstream: str, mode: str) -> tuple[Gateway, _GatewayServer]:
    gateway = Gateway(upstream, mode)
    httpd = _GatewayServer(("127.0.0.1", 0), _GatewayHandler)
    httpd.gateway = gateway
    gateway.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return gateway, httpd


@pytest.fixture
def sigv4_gateway(server, aws_credentials) -> Iterator[Gateway]:
    gateway, httpd = _start_gateway(server.http, "sigv4")
    yield gateway
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture
def google_gateway(server, monkeypatch, tmp_path) -> Iterator[Gateway]:
    for name in list(os.environ):
        if name.startswith(("GOOGLE_", "GCLOUD_", "CLOUDSDK_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")  # no https request may leave this machine
    gateway, httpd = _start_gateway(server.http, "google")
    key_file = tmp_path / "caller.json"
    key_file.write_text(json.dumps({
        "type": "service_account", "project_id": "toolkit-test", "private_key_id": gateway.sa_key_id,
        "private_key": gateway.sa_private, "client_email": "caller@toolkit-test.iam.gserviceaccount.com",
        "client_id": "1", "token_uri": f"{gateway.url}/token",
    }))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(key_file))
    yield gateway
    httpd.shutdown()
    httpd.server_close()


def _add_sub_inputs(a: np.ndarray, b: np.ndarray, binary: bool) -> list[httpclient.InferInput]:
    inputs = [httpclient.InferInput("INPUT0", list(a.shape), "FP32"), httpclient.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    return inputs


# ------------------------------------------------------------------------------------------
# toolkit invoke against toolkit serve (plain HTTP)


@pytest.fixture
def arrays(tmp_path) -> tuple[np.ndarray, np.ndarray, Path, Path]:
    rng = np.random.default_rng(7)
    a = rng.standard_normal((3, 16), dtype=np.float32)
    b = rng.standard_normal((3, 16), dtype=np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    return a, b, tmp_path / "a.npy", tmp_path / "b.npy"


@pytest.mark.parametrize("binary", [False, True])
def test_invoke_npy_inputs(server, arrays, binary):
    a, b, pa, pb = arrays
    result = invoke(Endpoint(server.http, NoSigner()), "add_sub", [("INPUT0", pa), ("INPUT1", pb)], binary=binary, request_id="r7")
    np.testing.assert_array_equal(result.outputs["OUTPUT0"], a + b)
    np.testing.assert_array_equal(result.outputs["OUTPUT1"], a - b)
    assert result.response["id"] == "r7" and result.response["model_name"] == "add_sub"
    sizes = [o.get("parameters", {}).get("binary_data_size") for o in result.response["outputs"]]
    assert all(sizes) if binary else not any(sizes)


def test_invoke_json_and_raw_inputs(server, tmp_path):
    endpoint = Endpoint(server.http, NoSigner())
    (tmp_path / "a.json").write_text(json.dumps([[1.5] * 16]))  # datatype from the model's metadata
    (tmp_path / "b.json").write_text(json.dumps({"datatype": "FP32", "shape": [1, 16], "data": list(range(16))}))
    result = invoke(endpoint, "add_sub", [("INPUT0", tmp_path / "a.json"), ("INPUT1", tmp_path / "b.json")], outputs=["OUTPUT0"])
    assert list(result.outputs) == ["OUTPUT0"]
    np.testing.assert_array_equal(result.outputs["OUTPUT0"], np.arange(16, dtype=np.float32)[None] + 1.5)
    # raw bytes: one BYTES element, shaped [1, 1] for the batching model
    (tmp_path / "note.txt").write_bytes("h\u00e9llo\n".encode())
    for binary in (False, True):
        result = invoke(endpoint, "strings", [("TEXT", tmp_path / "note.txt")], binary=binary)
        assert result.outputs["ECHO"].shape == (1, 1) and result.outputs["ECHO"][0, 0] == "h\u00e9llo\n".encode()
    # raw bytes as a UINT8 tensor of the model's shape
    (tmp_path / "blob.bin").write_bytes(bytes(range(200)))
    result = invoke(endpoint, "raw", [("DATA", tmp_path / "blob.bin")], binary=True)
    np.testing.assert_array_equal(result.outputs["DATA_OUT"], np.arange(200, dtype=np.uint8)[None])


def _toolkit(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkit.cli", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)}, cwd=cwd)


def test_invoke_cli(server, arrays, tmp_path):
    a, b, pa, pb = arrays
    out = _toolkit("invoke", server.http, "-m", "add_sub", "-i", f"INPUT0={pa}", "-i", f"INPUT1={pb}", "--binary",
                   "--output", "npy", "--output-dir", str(tmp_path / "out"))
    assert out.returncode == 0, out.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "OUTPUT0.npy"), a + b)
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "OUTPUT1.npy"), a - b)
    response = json.loads((tmp_path / "out" / "response.json").read_text())
    assert response["outputs"][0]["data"] == (a + b).reshape(-1).tolist()

    printed = _toolkit("invoke", server.http, "-m", "add_sub", "-i", f"INPUT0={pa}", "-i", f"INPUT1={pb}")
    assert printed.returncode == 0, printed.stderr
    document = json.loads(printed.stdout)
    assert document["outputs"][1]["name"] == "OUTPUT1" and document["outputs"][1]["shape"] == [3, 16]

    # Triton's own error comes back (batch 9 > max_batch_size 8), exit status 1
    np.save(tmp_path / "big.npy", np.zeros((9, 16), np.float32))
    failed = _toolkit("invoke", server.http, "-m", "add_sub", "-i", f"INPUT0={tmp_path / 'big.npy'}", "-i", f"INPUT1={tmp_path / 'big.npy'}")
    assert failed.returncode == 1 and "HTTP 400" in failed.stderr and "batch-size must be <= 8" in failed.stderr
    unknown = _toolkit("invoke", server.http, "-m", "add_sub", "-i", f"NOPE={pa}")
    assert unknown.returncode == 2 and "the model has no input 'NOPE' (inputs: INPUT0, INPUT1)" in unknown.stderr
    missing = _toolkit("invoke", server.http, "-m", "nope", "-i", f"X={pa}")
    assert missing.returncode == 1 and "Request for unknown model: 'nope' is not found" in missing.stderr


# ------------------------------------------------------------------------------------------
# SigV4


def test_signer_without_credentials(aws_credentials, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    with pytest.raises(DeployError, match="no AWS credentials to sign requests with"):
        signer_for("https://abcdefghij.lambda-url.eu-west-1.on.aws/")


def test_signer_choice(aws_credentials):
    sig = signer_for("https://abcdefghij.lambda-url.eu-west-1.on.aws/")
    assert isinstance(sig, SigV4Signer) and (sig.region, sig.service) == ("eu-west-1", "lambda")
    api = signer_for("https://x1.execute-api.ap-south-1.amazonaws.com/prod")
    assert isinstance(api, SigV4Signer) and (api.region, api.service) == ("ap-south-1", "execute-api")
    run = signer_for("https://add-sub-4f3c2b1a0-uc.a.run.app")
    assert isinstance(run, GoogleIdTokenSigner) and run.audience == "https://add-sub-4f3c2b1a0-uc.a.run.app"
    assert isinstance(signer_for("http://127.0.0.1:8000"), NoSigner)


def test_gateway_refuses_what_it_cannot_verify(sigv4_gateway, arrays):
    """The gateway is a real check: unsigned and wrongly signed requests are refused."""
    _, _, pa, pb = arrays
    with pytest.raises(DeployError, match="HTTP 403|answered 403"):
        invoke(Endpoint(sigv4_gateway.url, NoSigner()), "add_sub", [("INPUT0", pa), ("INPUT1", pb)])
    wrong = SigV4Signer("us-east-1", "lambda", Credentials(KEY_ID, "not-the-secret", SESSION))
    with pytest.raises(DeployError, match="403.*signature mismatch"):
        invoke(Endpoint(sigv4_gateway.url, wrong), "add_sub", [("INPUT0", pa), ("INPUT1", pb)])
    other_region = SigV4Signer("eu-west-1", "lambda")
    with pytest.raises(DeployError, match="unexpected credential scope"):
        invoke(Endpoint(sigv4_gateway.url, other_region), "add_sub", [("INPUT0", pa), ("INPUT1", pb)])
    assert sigv4_gateway.verified == 0 and len(sigv4_gateway.rejected) == 3


@pytest.mark.parametrize("binary", [False, True])
def test_invoke_signs_with_sigv4(sigv4_gateway, arrays, binary):
    a, b, pa, pb = arrays
    endpoint = Endpoint(sigv4_gateway.url, signer_for(sigv4_gateway.url, "iam", region="us-east-1"))
    result = invoke(endpoint, "add_sub", [("INPUT0", pa), ("INPUT1", pb)], binary=binary)
    np.testing.assert_array_equal(result.outputs["OUTPUT0"], a + b)
    assert sigv4_gateway.verified == 2 and not sigv4_gateway.rejected  # metadata GET + infer POST


def test_invoke_cli_with_sigv4(sigv4_gateway, arrays):
    a, b, pa, pb = arrays
    out = _toolkit("invoke", sigv4_gateway.url, "-m", "add_sub", "-i", f"INPUT0={pa}", "-i", f"INPUT1={pb}",
                   "--auth", "iam", "--region", "us-east-1")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["outputs"][0]["data"] == (a + b).reshape(-1).tolist()
    assert sigv4_gateway.verified == 2


@pytest.mark.parametrize("binary", [False, True])
def test_tritonclient_through_the_sigv4_proxy(sigv4_gateway, binary):
    signer = signer_for(sigv4_gateway.url, "iam", region="us-east-1")
    with SigningProxy(sigv4_gateway.url, signer, port=0) as proxy:
        host, port = proxy.address
        client = httpclient.InferenceServerClient(f"{host}:{port}")
        try:
            assert client.is_server_ready() and client.is_model_ready("add_sub")
            assert client.get_model_config("add_sub")["max_batch_size"] == 8
            a = np.arange(32, dtype=np.float32).reshape(2, 16)
            b = np.ones((2, 16), np.float32)
            outputs = [httpclient.InferRequestedOutput(n, binary_data=binary) for n in ("OUTPUT0", "OUTPUT1")]
            result = client.infer("add_sub", _add_sub_inputs(a, b, binary), outputs=outputs, request_id="via-proxy")
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
            assert result.get_response()["id"] == "via-proxy"
            text = np.array([[b"signed"]], dtype=object)
            inp = httpclient.InferInput("TEXT", [1, 1], "BYTES")
            inp.set_data_from_numpy(text, binary_data=binary)
            echoed = client.infer("strings", [inp]).as_numpy("ECHO")
            assert echoed.reshape(-1)[0] in (b"signed", "signed")
            # errors travel back unchanged (status and Triton's message)
            with pytest.raises(InferenceServerException, match="Request for unknown model: 'nope' is not found"):
                client.get_model_metadata("nope")
            # compressed request and response bodies go through as they are
            result = client.infer("add_sub", _add_sub_inputs(a, b, binary), request_compression_algorithm="gzip",
                                  response_compression_algorithm="gzip")
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        finally:
            client.close()
        assert proxy.forwarded == 7  # ready, model ready, config, 3 inferences, metadata
    assert sigv4_gateway.verified == 7 and not sigv4_gateway.rejected


def test_proxy_replaces_client_credentials_and_reports_upstream_failures(sigv4_gateway):
    signer = signer_for(sigv4_gateway.url, "iam", region="us-east-1")
    with SigningProxy(sigv4_gateway.url, signer, port=0) as proxy:
        request = urllib.request.Request(f"{proxy.url}/v2/health/ready", headers={"Authorization": "Bearer stolen"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 200
    assert sigv4_gateway.verified == 1 and not sigv4_gateway.rejected
    closed = free_port()
    with SigningProxy(f"http://127.0.0.1:{closed}", NoSigner(), port=0) as proxy:
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"{proxy.url}/v2/health/ready", timeout=30)
        assert info.value.code == 502
        assert json.loads(info.value.read())["error"].startswith(f"toolkit proxy: cannot reach http://127.0.0.1:{closed}")


def test_perf_analyzer_through_the_sigv4_proxy(sigv4_gateway):
    signer = signer_for(sigv4_gateway.url, "iam", region="us-east-1")
    with SigningProxy(sigv4_gateway.url, signer, port=0) as proxy:
        host, port = proxy.address
        out = subprocess.run(
            [perf_analyzer(), "-u", f"{host}:{port}", "-m", "add_sub", "-b", "2", "--shape", "INPUT0:16", "--shape", "INPUT1:16",
             "--concurrency-range", "2", "--request-count", "40"],
            capture_output=True, text=True, timeout=300,
        )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Throughput" in out.stdout
    assert sigv4_gateway.verified >= 40 and not sigv4_gateway.rejected


def test_proxy_cli(sigv4_gateway):
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "toolkit.cli", "proxy", sigv4_gateway.url, "--port", str(port), "--auth", "iam", "--region", "us-east-1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 60
        while True:  # a separate process offers no readiness event: poll its port
            assert process.poll() is None, process.stderr.read()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "toolkit proxy did not listen within 60 s"
                time.sleep(0.05)
        client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
        a = np.ones((1, 16), np.float32)
        np.testing.assert_array_equal(client.infer("add_sub", _add_sub_inputs(a, a, True)).as_numpy("OUTPUT0"), a + a)
        client.close()
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert f"proxying http://127.0.0.1:{port} -> {sigv4_gateway.url} (AWS SigV4 (lambda, us-east-1))" in err
    assert sigv4_gateway.verified >= 1 and not sigv4_gateway.rejected


# ------------------------------------------------------------------------------------------
# Google ID tokens


def test_tritonclient_through_the_google_proxy(google_gateway):
    signer = signer_for(google_gateway.url, "google")
    assert isinstance(signer, GoogleIdTokenSigner) and signer.audience == google_gateway.url
    with SigningProxy(google_gateway.url, signer, port=0) as proxy:
        host, port = proxy.address
        client = httpclient.InferenceServerClient(f"{host}:{port}")
        try:
            assert client.is_server_ready()
            a = np.full((4, 16), 2.0, np.float32)
            for binary in (False, True):
                result = client.infer("add_sub", _add_sub_inputs(a, a, binary))
                np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)
        finally:
            client.close()
    assert google_gateway.verified == 3 and not google_gateway.rejected
    assert google_gateway.token_requests == 1  # fetched once, then reused until it nears expiry


def test_google_gateway_refuses_other_tokens(google_gateway, arrays):
    """The gateway is a real check: a token for another audience is refused."""
    _, _, pa, pb = arrays
    wrong_audience = GoogleIdTokenSigner("https://some-other-service.a.run.app")
    with pytest.raises(DeployError, match="403.*ID token refused"):
        invoke(Endpoint(google_gateway.url, wrong_audience), "add_sub", [("INPUT0", pa), ("INPUT1", pb)])
    assert google_gateway.verified == 0 and len(google_gateway.rejected) == 1


def test_invoke_with_a_google_id_token(google_gateway, arrays):
    a, b, pa, pb = arrays
    result = invoke(Endpoint(google_gateway.url, signer_for(google_gateway.url, "google")), "add_sub",
                    [("INPUT0", pa), ("INPUT1", pb)], binary=True)
    np.testing.assert_array_equal(result.outputs["OUTPUT1"], a - b)
    assert google_gateway.verified == 2


# ------------------------------------------------------------------------------------------
# gRPC: toolkit proxy --grpc-port (REST upstream: Lambda; gRPC upstream: Cloud Run --protocol grpc)


def _grpc_add_sub(a: np.ndarray, b: np.ndarray) -> list:
    import tritonclient.grpc as grpcclient

    inputs = [grpcclient.InferInput("INPUT0", list(a.shape), "FP32"), grpcclient.InferInput("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def test_tritonclient_grpc_through_the_sigv4_proxy(sigv4_gateway):
    """Every unary RPC tritonclient.grpc makes becomes the signed REST call; answers and errors
    come back as Triton's gRPC statuses."""
    import tritonclient.grpc as grpcclient

    from toolkit.deploy.grpc_proxy import GrpcProxy

    signer = signer_for(sigv4_gateway.url, "iam", region="us-east-1")
    with GrpcProxy(sigv4_gateway.url, signer, port=0) as proxy:
        client = grpcclient.InferenceServerClient(proxy.address)
        try:
            assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("add_sub")
            assert not client.is_model_ready("nope")
            assert client.get_server_metadata().name == "triton"
            assert [i.name for i in client.get_model_metadata("add_sub").inputs] == ["INPUT0", "INPUT1"]
            assert client.get_model_config("add_sub").config.max_batch_size == 8
            a = np.arange(32, dtype=np.float32).reshape(2, 16)
            b = np.ones((2, 16), np.float32)
            result = client.infer("add_sub", _grpc_add_sub(a, b), request_id="via-grpc-proxy")
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
            assert result.get_response().id == "via-grpc-proxy"
            only = client.infer("add_sub", _grpc_add_sub(a, b), outputs=[grpcclient.InferRequestedOutput("OUTPUT1")])
            assert only.as_numpy("OUTPUT0") is None and (only.as_numpy("OUTPUT1") == a - b).all()
            text = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
            text.set_data_from_numpy(np.array([[b"signed \xe2\x82\xac"]], dtype=object))
            assert client.infer("strings", [text]).as_numpy("ECHO").tolist() == [[b"signed \xe2\x82\xac"]]
            stats = client.get_inference_statistics("add_sub").model_stats[0]
            assert stats.inference_stats.success.count >= 2
            assert {m.name for m in client.get_model_repository_index().models} >= {"add_sub", "strings"}
            with pytest.raises(InferenceServerException) as info:
                client.infer("nope", _grpc_add_sub(a, b))
            assert info.value.status() == "StatusCode.NOT_FOUND"
            assert info.value.message() == "Request for unknown model: 'nope' is not found"
            wrong = _grpc_add_sub(np.ones((1, 8), np.float32), np.ones((1, 8), np.float32))
            with pytest.raises(InferenceServerException) as info:
                client.infer("add_sub", wrong)
            assert info.value.status() == "StatusCode.INVALID_ARGUMENT" and "unexpected shape" in info.value.message()
            with pytest.raises(InferenceServerException) as info:
                client.register_system_shared_memory("r", "/k", 64)
            assert info.value.status() == "StatusCode.UNIMPLEMENTED"
            # streams cannot ride one HTTP request: refused with the reason
            answers: list = []
            client.start_stream(lambda result, error: answers.append(error))
            try:
                client.async_stream_infer("add_sub", _grpc_add_sub(a, b))
            except InferenceServerException:
                pass  # the stream may already be closed by the refusal, reported to the callback
            deadline = time.monotonic() + 30
            while not answers and time.monotonic() < deadline:
                time.sleep(0.05)
            client.stop_stream()
            assert answers and "ModelStreamInfer cannot be forwarded" in str(answers[0])
            assert "AWS Lambda has no gRPC" in str(answers[0])
        finally:
            client.close()
    assert sigv4_gateway.verified >= 14 and not sigv4_gateway.rejected


def test_perf_analyzer_grpc_through_the_sigv4_proxy(sigv4_gateway, server):
    from toolkit.deploy.grpc_proxy import GrpcProxy

    def successes() -> int:
        with urllib.request.urlopen(f"{server.http}/v2/models/add_sub/stats") as r:
            return json.load(r)["model_stats"][0]["inference_stats"]["success"]["count"]

    before = successes()
    signer = signer_for(sigv4_gateway.url, "iam", region="us-east-1")
    with GrpcProxy(sigv4_gateway.url, signer, port=0) as proxy:
        out = subprocess.run(
            [perf_analyzer(), "-i", "grpc", "-u", proxy.address, "-m", "add_sub", "-b", "2", "--shape", "INPUT0:16",
             "--shape", "INPUT1:16", "--concurrency-range", "2", "--request-count", "40"],
            capture_output=True, text=True, timeout=300,
        )
    assert out.returncode == 0, out.stdout + out.stderr
    assert [int(n) for n in re.findall(r"Request count: (\d+)", out.stdout)] == [40], out.stdout
    assert successes() - before == 40
    assert sigv4_gateway.verified >= 40 and not sigv4_gateway.rejected


class _GrpcGateway:
    """A private gRPC service stand-in: verifies the Google ID token in each call's metadata (as
    Cloud Run's front end does), then relays the call to toolkit serve's gRPC port."""

    def __init__(self, gateway: Gateway, upstream: str) -> None:
        import grpc
        from concurrent.futures import ThreadPoolExecutor

        self.gateway = gateway
        self.channel = grpc.insecure_channel(upstream)
        self.server = grpc.server(ThreadPoolExecutor(8))
        self.server.add_generic_rpc_handlers((self,))
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _check(self, context) -> None:
        import grpc

        metadata = {k: v for k, v in context.invocation_metadata()}
        problem = self.gateway.verify_google({"authorization": metadata.get("authorization", "")})
        with self.gateway.lock:
            if problem:
                self.gateway.rejected.append(problem)
            else:
                self.gateway.verified += 1
        if problem:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, problem)

    def service(self, details):
        import grpc

        method = details.method
        if method.endswith("/ModelStreamInfer"):
            call = self.channel.stream_stream(method, request_serializer=None, response_deserializer=None)

            def stream(requests, context):
                self._check(context)
                yield from call(requests)

            return grpc.stream_stream_rpc_method_handler(stream)
        call = self.channel.unary_unary(method, request_serializer=None, response_deserializer=None)

        def unary(request, context):
            self._check(context)
            return call(request)

        return grpc.unary_unary_rpc_method_handler(unary)

    def close(self) -> None:
        self.server.stop(None)
        self.channel.close()


def test_grpc_upstream_gets_the_id_token_in_metadata(google_gateway, server, arrays):
    """`toolkit proxy --upstream grpc` and `toolkit invoke --protocol grpc` reach a private gRPC
    service with a Google ID token in the call metadata; streams are relayed too."""
    import queue

    import tritonclient.grpc as grpcclient

    from toolkit.deploy.grpc_proxy import GrpcProxy
    from toolkit.deploy.invoke import invoke_grpc

    private = _GrpcGateway(google_gateway, server.grpc)
    upstream = f"http://127.0.0.1:{private.port}"
    signer = GoogleIdTokenSigner(google_gateway.url)
    try:
        with GrpcProxy(upstream, signer, port=0, upstream_protocol="grpc") as proxy:
            client = grpcclient.InferenceServerClient(proxy.address)
            a = np.full((1, 16), 3.0, np.float32)
            assert client.is_server_ready(headers={"authorization": "Bearer stolen"})  # replaced by the proxy
            np.testing.assert_array_equal(client.infer("add_sub", _grpc_add_sub(a, a)).as_numpy("OUTPUT0"), a + a)
            answers: queue.Queue = queue.Queue()
            client.start_stream(lambda result, error: answers.put((result, error)))
            for n in range(3):
                client.async_stream_infer("add_sub", _grpc_add_sub(a, a), request_id=str(n))
            received = [answers.get(timeout=30) for _ in range(3)]
            client.stop_stream()
            client.close()
            assert [r.get_response().id for r, e in received] == ["0", "1", "2"]
        a_in, b_in, pa, pb = arrays
        result = invoke_grpc(upstream, signer, "add_sub", [("INPUT0", pa), ("INPUT1", pb)], request_id="direct")
        np.testing.assert_array_equal(result.outputs["OUTPUT1"], a_in - b_in)
        assert result.response["id"] == "direct"
        with pytest.raises(DeployError, match="UNAUTHENTICATED"):
            invoke_grpc(upstream, GoogleIdTokenSigner("https://other.a.run.app"), "add_sub", [("INPUT0", pa), ("INPUT1", pb)])
    finally:
        private.close()
    assert google_gateway.verified >= 5 and len(google_gateway.rejected) == 1
