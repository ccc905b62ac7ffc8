"""`toolkit invoke URL --model M --input NAME=FILE ...`: one v2 inference against a deployment.

The model's metadata (GET /v2/models/M) is read first, so inputs from JSON lists and raw files
get the model's datatypes and shapes; then POST /v2/models/M/infer. Both requests are signed
for private endpoints (see signing.py). Errors come back as the server's own `{"error": ...}`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .client_codec import InferResult, InputTensor, decode_response, encode_request, load_input
from .errors import DeployError, DeployOptionError
from .signing import Signer


@dataclass
class HttpAnswer:
    status: int
    headers: dict[str, str]
    body: bytes

    def error_message(self) -> str:
        try:
            document = json.loads(self.body)
            if isinstance(document, dict) and "error" in document:
                return str(document["error"])
            if isinstance(document, dict) and "message" in document:  # Lambda URL / API Gateway errors
                return str(document["message"])
        except (json.JSONDecodeError, UnicodeDecodeError):
            pass
        return self.body[:500].decode(errors="replace") or "(empty body)"


class Endpoint:
    """A deployment's base URL and how to authenticate to it."""

    def __init__(self, url: str, signer: Signer, timeout_s: float = 300.0) -> None:
        import urllib3

        if not url.startswith(("http://", "https://")):
            raise DeployOptionError(f"invalid URL '{url}': expected http(s)://HOST[/PATH]")
        self.base = url.rstrip("/")
        self.signer = signer
        self._pool = urllib3.PoolManager(retries=False, timeout=urllib3.Timeout(connect=30.0, read=timeout_s))

    def request(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> HttpAnswer:
        import urllib3

        url = self.base + path
        signed = self.signer.sign(method, url, headers or {}, body)
        try:
            response = self._pool.request(method, url, body=body or None, headers=signed, preload_content=True, redirect=False)
        except urllib3.exceptions.HTTPError as exc:
            raise DeployError(f"cannot reach {url}: {exc}") from None
        return HttpAnswer(response.status, dict(response.headers.items()), response.data)


def model_path(model: str, version: str | None) -> str:
    path = f"/v2/models/{quote(model, safe='')}"
    return path + (f"/versions/{quote(version, safe='')}" if version else "")


def parse_input_specs(specs: list[str]) -> list[tuple[str, Path]]:
    parsed = []
    for spec in specs:
        name, sep, file = spec.partition("=")
        if not sep or not name or not file:
            raise DeployOptionError(f"--input {spec}: expected NAME=FILE")
        parsed.append((name, Path(file).expanduser()))
    return parsed


def model_metadata(endpoint: Endpoint, model: str, version: str | None) -> dict[str, Any]:
    answer = endpoint.request("GET", model_path(model, version))
    if answer.status != 200:
        raise DeployError(f"GET {model_path(model, version)} answered {answer.status}: {answer.error_message()}")
    try:
        return json.loads(answer.body)
    except json.JSONDecodeError:
        raise DeployError(f"model metadata of {model} is not JSON", detail=answer.body[:500].decode(errors="replace")) from None


def invoke(
    endpoint: Endpoint,
    model: str,
    inputs: list[tuple[str, Path]],
    *,
    version: str | None = None,
    outputs: list[str] | None = None,
    binary: bool = False,
    request_id: str | None = None,
) -> InferResult:
    metadata = model_metadata(endpoint, model, version)
    tensors: list[InputTensor] = [load_input(name, path, metadata) for name, path in inputs]
    body, headers = encode_request(tensors, outputs, binary, request_id)
    answer = endpoint.request("POST", model_path(model, version) + "/infer", body, headers)
    if answer.status != 200:
        raise DeployError(f"inference failed with HTTP {answer.status}: {answer.error_message()}")
    return decode_response(answer.body, answer.headers)


def grpc_target(url: str) -> tuple[str, bool]:
    """(host:port, TLS) of a gRPC service URL: https -> TLS on 443 unless a port is given."""
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DeployOptionError(f"invalid URL '{url}': expected http(s)://HOST[:PORT]")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{port}", tls


def invoke_grpc(
    url: str,
    signer: Signer,
    model: str,
    inputs: list[tuple[str, Path]],
    *,
    version: str | None = None,
    outputs: list[str] | None = None,
    request_id: str | None = None,
    timeout_s: float = 300.0,
) -> InferResult:
    """One inference against a gRPC service (`toolkit build --protocol grpc`) with tritonclient.grpc;
    the signer's credentials (a Google ID token) travel in the call's metadata."""
    from .signing import SigV4Signer

    if isinstance(signer, SigV4Signer):
        raise DeployOptionError("AWS Lambda has no gRPC: invoke it with --protocol http (the default)")
    try:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException
    except ImportError:
        raise DeployError("toolkit invoke --protocol grpc needs grpcio: pip install 'triton-serverless-toolkit[grpc]'") from None
    target, tls = grpc_target(url)
    headers = {k.lower(): v for k, v in signer.sign("POST", url, {}, b"").items()}
    client = grpcclient.InferenceServerClient(target, ssl=tls)
    try:
        try:
            metadata = client.get_model_metadata(model, version or "", headers=headers, as_json=True, client_timeout=timeout_s)
        except InferenceServerException as exc:
            raise DeployError(f"ModelMetadata of {model} failed ({exc.status()}): {exc.message()}") from None
        for key in ("inputs", "outputs"):
            for tensor in metadata.get(key, []):
                tensor["shape"] = [int(d) for d in tensor.get("shape", [])]
        tensors = [load_input(name, path, metadata) for name, path in inputs]
        grpc_inputs = []
        for tensor in tensors:
            grpc_input = grpcclient.InferInput(tensor.name, list(tensor.array.shape), tensor.datatype)
            grpc_input.set_data_from_numpy(tensor.array)
            grpc_inputs.append(grpc_input)
        requested = [grpcclient.InferRequestedOutput(name) for name in outputs or []] or None
        try:
            result = client.infer(
                model, grpc_inputs, model_version=version or "", outputs=requested, request_id=request_id or "",
                headers=headers, client_timeout=timeout_s,
            )
        except InferenceServerException as exc:
            raise DeployError(f"inference failed with {exc.status()}: {exc.message()}") from None
    finally:
        client.close()
    response = result.get_response(as_json=True)
    document: dict[str, Any] = {}
    if response.get("id"):
        document["id"] = response["id"]
    document["model_name"] = response.get("model_name", model)
    document["model_version"] = response.get("model_version", "")
    document["outputs"] = [
        {"name": o["name"], "datatype": o["datatype"], "shape": [int(d) for d in o.get("shape", [])]}
        for o in response.get("outputs", [])
    ]
    arrays = {o["name"]: result.as_numpy(o["name"]) for o in document["outputs"]}
    return InferResult(document, arrays)
