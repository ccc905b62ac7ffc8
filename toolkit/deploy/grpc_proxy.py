"""`toolkit proxy URL --grpc-port 8001`: a local gRPC endpoint for a private deployment.

Unmodified `tritonclient.grpc` scripts and `perf_analyzer -i grpc` talk to it as they would to
tritonserver's gRPC port. Two upstreams:

- `http` (AWS Lambda, or any service built with `--protocol http`): each unary RPC becomes the
  equivalent v2 REST call, signed (SigV4 or a Google ID token, signing.py): ModelInfer is
  `POST /v2/models/M[/versions/V]/infer` with the binary tensor data extension (raw input bytes
  travel unchanged, outputs come back binary into `raw_output_contents`), ServerReady is
  `GET /v2/health/ready`, and so on. The REST status becomes Triton's gRPC status (400
  INVALID_ARGUMENT, 404 NOT_FOUND, 413 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, ...) with the
  server's message. `ModelStreamInfer` cannot be carried by one HTTP request and response: it is
  refused with UNIMPLEMENTED and what to use instead; shared memory never reaches a remote server.
- `grpc` (a Cloud Run / Knative service built with `--protocol grpc`): every RPC, streams
  included, is relayed as it is over HTTP/2 (TLS for https URLs) with `authorization: Bearer <ID
  token>` in the metadata; the client's own credentials are never forwarded.

It listens on 127.0.0.1 by default: anyone who can reach it calls the deployment with your
credentials.
"""

from __future__ import annotations

import json
import struct
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote, urlsplit

from .errors import DeployError
from .signing import Signer

SERVICE = "inference.GRPCInferenceService"
UPSTREAMS = ("http", "grpc")
MAX_MESSAGE_BYTES = 2**31 - 1
HEADER_LENGTH = "Inference-Header-Content-Length"
# Metadata a client sends that is never forwarded (the proxy's token replaces credentials).
_DROPPED_METADATA = frozenset({"authorization", "x-amz-date", "x-amz-security-token", "x-amz-content-sha256"})


def _grpc_modules() -> tuple[Any, Any]:
    try:
        import grpc
        from tritonclient.grpc import service_pb2
    except ImportError:
        raise DeployError("toolkit proxy --grpc-port needs grpcio: pip install 'triton-serverless-toolkit[grpc]'") from None
    return grpc, service_pb2


def status_for_http(status: int) -> Any:
    """The gRPC status for a REST status (Triton's mapping read backwards, and the platform's)."""
    grpc, _ = _grpc_modules()
    codes = {
        400: grpc.StatusCode.INVALID_ARGUMENT,
        401: grpc.StatusCode.UNAUTHENTICATED,
        403: grpc.StatusCode.PERMISSION_DENIED,
        404: grpc.StatusCode.NOT_FOUND,
        409: grpc.StatusCode.ALREADY_EXISTS,
        413: grpc.StatusCode.RESOURCE_EXHAUSTED,
        429: grpc.StatusCode.RESOURCE_EXHAUSTED,
        499: grpc.StatusCode.CANCELLED,
        500: grpc.StatusCode.INTERNAL,
        501: grpc.StatusCode.UNIMPLEMENTED,
        502: grpc.StatusCode.UNAVAILABLE,
        503: grpc.StatusCode.UNAVAILABLE,
        504: grpc.StatusCode.DEADLINE_EXCEEDED,
    }
    return codes.get(status, grpc.StatusCode.INVALID_ARGUMENT if 400 <= status < 500 else grpc.StatusCode.UNKNOWN)


class _Failure(Exception):
    def __init__(self, code: Any, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _error_text(body: bytes, status: int) -> str:
    try:
        document = json.loads(body)
        if isinstance(document, dict):
            for key in ("error", "message", "Message"):
                if key in document:
                    return str(document[key])
    except (ValueError, UnicodeDecodeError):
        pass
    return body[:500].decode(errors="replace") or f"HTTP {status}"


def _model_path(name: str, version: str) -> str:
    path = f"/v2/models/{quote(name, safe='')}"
    return path + (f"/versions/{quote(version, safe='')}" if version else "")


def _parameter_json(parameter: Any) -> Any:
    kind = parameter.WhichOneof("parameter_choice")
    return None if kind is None else getattr(parameter, kind)


class RestTranslator:
    """gRPC request messages -> signed v2 REST calls -> gRPC response messages."""

    def __init__(self, upstream: str, signer: Signer, timeout_s: float) -> None:
        import urllib3

        self.upstream = upstream
        self.signer = signer
        self.pool = urllib3.PoolManager(maxsize=64, block=False, timeout=urllib3.Timeout(connect=30.0, read=timeout_s))
        _, self.pb = _grpc_modules()

    def call(self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        import urllib3

        url = self.upstream + path
        try:
            signed = self.signer.sign(method, url, headers or {}, body)
        except DeployError as exc:
            grpc, _ = _grpc_modules()
            raise _Failure(grpc.StatusCode.UNAUTHENTICATED, f"toolkit proxy cannot sign the request: {exc.message}") from None
        try:
            response = self.pool.request(method, url, body=body or (b"" if method == "POST" else None), headers=signed,
                                         redirect=False, retries=False)
        except urllib3.exceptions.HTTPError as exc:
            grpc, _ = _grpc_modules()
            raise _Failure(grpc.StatusCode.UNAVAILABLE, f"toolkit proxy cannot reach {self.upstream}: {exc}") from None
        return response.status, {k.lower(): v for k, v in response.headers.items()}, response.data

    def _json(self, method: str, path: str, body: bytes = b"") -> Any:
        status, _, data = self.call(method, path, body, {"Content-Type": "application/json"} if body else None)
        if status != 200:
            raise _Failure(status_for_http(status), _error_text(data, status))
        try:
            return json.loads(data)
        except ValueError:
            grpc, _ = _grpc_modules()
            raise _Failure(grpc.StatusCode.INTERNAL, f"{self.upstream}{path} did not answer JSON") from None

    def _parse(self, document: Any, message: Any) -> Any:
        from google.protobuf import json_format

        json_format.ParseDict(document, message, ignore_unknown_fields=True)
        return message

    # -- the RPCs ---------------------------------------------------------------------------------

    def ServerLive(self, request: Any) -> Any:  # noqa: N802
        status, _, data = self.call("GET", "/v2/health/live")
        if status >= 500:
            raise _Failure(status_for_http(status), _error_text(data, status))
        return self.pb.ServerLiveResponse(live=status == 200)

    def ServerReady(self, request: Any) -> Any:  # noqa: N802
        status, _, data = self.call("GET", "/v2/health/ready")
        if status >= 500 and status != 503:
            raise _Failure(status_for_http(status), _error_text(data, status))
        return self.pb.ServerReadyResponse(ready=status == 200)

    def ModelReady(self, request: Any) -> Any:  # noqa: N802
        status, _, data = self.call("GET", _model_path(request.name, request.version) + "/ready")
        if status >= 500 and status != 503:
            raise _Failure(status_for_http(status), _error_text(data, status))
        return self.pb.ModelReadyResponse(ready=status == 200)

    def ServerMetadata(self, request: Any) -> Any:  # noqa: N802
        return self._parse(self._json("GET", "/v2"), self.pb.ServerMetadataResponse())

    def ModelMetadata(self, request: Any) -> Any:  # noqa: N802
        return self._parse(self._json("GET", _model_path(request.name, request.version)), self.pb.ModelMetadataResponse())

    def ModelConfig(self, request: Any) -> Any:  # noqa: N802
        document = self._json("GET", _model_path(request.name, request.version) + "/config")
        response = self.pb.ModelConfigResponse()
        self._parse(document, response.config)
        return response

    def ModelStatistics(self, request: Any) -> Any:  # noqa: N802
        path = _model_path(request.name, request.version) + "/stats" if request.name else "/v2/models/stats"
        return self._parse(self._json("GET", path), self.pb.ModelStatisticsResponse())

    def RepositoryIndex(self, request: Any) -> Any:  # noqa: N802
        path = f"/v2/repository/{quote(request.repository_name, safe='')}/index" if request.repository_name else "/v2/repository/index"
        entries = self._json("POST", path, json.dumps({"ready": request.ready}).encode())
        return self._parse({"models": entries}, self.pb.RepositoryIndexResponse())

    def RepositoryModelLoad(self, request: Any) -> Any:  # noqa: N802
        self._json("POST", f"/v2/repository/models/{quote(request.model_name, safe='')}/load", b"{}")
        return self.pb.RepositoryModelLoadResponse()

    def RepositoryModelUnload(self, request: Any) -> Any:  # noqa: N802
        self._json("POST", f"/v2/repository/models/{quote(request.model_name, safe='')}/unload", b"{}")
        return self.pb.RepositoryModelUnloadResponse()

    def TraceSetting(self, request: Any) -> Any:  # noqa: N802
        path = _model_path(request.model_name, "") + "/trace/setting" if request.model_name else "/v2/trace/setting"
        if request.settings:
            body = json.dumps({k: list(v.value) for k, v in request.settings.items()}).encode()
            document = self._json("POST", path, body)
        else:
            document = self._json("GET", path)
        response = self.pb.TraceSettingResponse()
        for key, value in document.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [str(value)])
        return response

    def LogSettings(self, request: Any) -> Any:  # noqa: N802
        if request.settings:
            body = json.dumps({k: _parameter_json(v) for k, v in request.settings.items()}).encode()
            document = self._json("POST", "/v2/logging", body)
        else:
            document = self._json("GET", "/v2/logging")
        response = self.pb.LogSettingsResponse()
        for key, value in document.items():
            setting = response.settings[key]
            if isinstance(value, bool):
                setting.bool_param = value
            elif isinstance(value, int):
                setting.uint32_param = value
            else:
                setting.string_param = str(value)
        return response

    def _shared_memory(self, request: Any) -> Any:
        grpc, _ = _grpc_modules()
        raise _Failure(
            grpc.StatusCode.UNIMPLEMENTED,
            f"shared memory cannot reach {self.upstream}: the deployment does not share a host with this client; "
            "send tensors in the request",
        )

    SystemSharedMemoryStatus = SystemSharedMemoryRegister = SystemSharedMemoryUnregister = _shared_memory  # noqa: N815
    CudaSharedMemoryStatus = CudaSharedMemoryRegister = CudaSharedMemoryUnregister = _shared_memory  # noqa: N815

    def ModelInfer(self, request: Any) -> Any:  # noqa: N802
        body, headers = self.rest_infer_request(request)
        path = _model_path(request.model_name, request.model_version) + "/infer"
        status, response_headers, data = self.call("POST", path, body, headers)
        if status != 200:
            raise _Failure(status_for_http(status), _error_text(data, status))
        return self.grpc_infer_response(data, response_headers)

    # -- ModelInfer <-> REST ------------------------------------------------------------------------

    def rest_infer_request(self, request: Any) -> tuple[bytes, dict[str, str]]:
        """A ModelInferRequest as a v2 REST body with the binary tensor data extension."""
        from handlers.errors import InferenceError
        from handlers.protocol.binary import BytesContext
        from handlers.protocol.codec import log_prefix, output_bytes
        from handlers.protocol.grpc.tensors import contents_array

        grpc, _ = _grpc_modules()
        document: dict[str, Any] = {}
        if request.id:
            document["id"] = request.id
        from handlers.protocol.grpc.tensors import EMPTY_FINAL_RESPONSE

        # triton_enable_empty_final_response concerns gRPC streams only (perf_analyzer sends it on
        # every request); REST reserves every triton_ key.
        parameters = {
            key: _parameter_json(value) for key, value in request.parameters.items() if key != EMPTY_FINAL_RESPONSE
        }
        chunks: list[bytes] = []
        inputs = []
        raw_index = 0
        for tensor in request.inputs:
            entry: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
            entry_parameters = {key: _parameter_json(value) for key, value in tensor.parameters.items()}
            if "shared_memory_region" in entry_parameters:
                raise _Failure(grpc.StatusCode.NOT_FOUND,
                               f"Unable to find shared memory region: '{entry_parameters['shared_memory_region']}'")
            if tensor.HasField("contents"):
                if request.raw_input_contents:
                    raise _Failure(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"contents field must not be specified when using raw_input_contents for "
                                   f"'{tensor.name}' for model '{request.model_name}'")
                try:
                    where = BytesContext(tensor.name, request.model_name, log_prefix(request.id))
                    raw = output_bytes(contents_array(tensor, tensor.datatype, list(tensor.shape), where), tensor.datatype)
                except InferenceError as error:
                    raise _Failure(grpc.StatusCode.INVALID_ARGUMENT, error.message) from None
                except (KeyError, ValueError, TypeError, OverflowError) as exc:
                    raise _Failure(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"input '{tensor.name}': its contents cannot be sent as {tensor.datatype}: {exc}") from None
                raw = raw if isinstance(raw, bytes) else raw.tobytes()
            elif raw_index < len(request.raw_input_contents):
                raw = request.raw_input_contents[raw_index]
                raw_index += 1
            else:
                raise _Failure(grpc.StatusCode.INVALID_ARGUMENT,
                               f"unable to find data for input tensor '{tensor.name}' for model '{request.model_name}' "
                               "in request.")
            entry_parameters["binary_data_size"] = len(raw)
            entry["parameters"] = entry_parameters
            chunks.append(raw)
            inputs.append(entry)
        if parameters:
            document["parameters"] = parameters
        document["inputs"] = inputs
        if request.outputs:
            outputs = []
            for output in request.outputs:
                output_parameters = {key: _parameter_json(value) for key, value in output.parameters.items()}
                output_parameters["binary_data"] = True
                outputs.append({"name": output.name, "parameters": output_parameters})
            document["outputs"] = outputs
        else:
            document.setdefault("parameters", {})["binary_data_output"] = True
        header = json.dumps(document, separators=(",", ":")).encode()
        return header + b"".join(chunks), {"Content-Type": "application/octet-stream", HEADER_LENGTH: str(len(header))}

    def grpc_infer_response(self, body: bytes, headers: dict[str, str]) -> Any:
        """A v2 REST response (JSON + binary outputs) as a ModelInferResponse."""
        from handlers.protocol.codec import output_bytes
        from handlers.protocol.grpc.tensors import set_parameter

        grpc, _ = _grpc_modules()
        length_text = headers.get(HEADER_LENGTH.lower())
        length = int(length_text) if length_text is not None and length_text.isdigit() else len(body)
        try:
            document = json.loads(body[:length])
        except (ValueError, UnicodeDecodeError):
            raise _Failure(grpc.StatusCode.INTERNAL, f"{self.upstream} answered a body that is not v2 JSON") from None
        response = self.pb.ModelInferResponse(
            model_name=str(document.get("model_name", "")), model_version=str(document.get("model_version", "")),
            id=str(document.get("id", "")),
        )
        for key, value in (document.get("parameters") or {}).items():
            set_parameter(response.parameters[key], value)
        offset = length
        for output in document.get("outputs", []):
            size = (output.get("parameters") or {}).get("binary_data_size")
            if size is not None:
                raw = body[offset: offset + size]
                if len(raw) != size:
                    raise _Failure(grpc.StatusCode.INTERNAL, f"output '{output['name']}': the response ends early")
                offset += size
            else:
                raw = _json_output_bytes(output, output_bytes)
            tensor = response.outputs.add(name=output["name"], datatype=output["datatype"], shape=output["shape"])
            response.raw_output_contents.append(raw)
            del tensor
        return response


def _json_output_bytes(output: dict[str, Any], output_bytes: Callable[..., Any]) -> bytes:
    """An output the server sent as JSON `data`, as raw bytes."""
    import numpy as np

    from handlers.datatypes import numpy_dtype
    from handlers.protocol.codec import bf16_from_float32

    datatype = output["datatype"]
    data = output.get("data", [])
    if datatype == "BYTES":
        items = [x.encode() if isinstance(x, str) else bytes(x) for x in np.array(data, dtype=object).reshape(-1).tolist()]
        return b"".join(struct.pack("<I", len(x)) + x for x in items)
    if datatype == "BF16":
        return bf16_from_float32(np.array(data, dtype=np.float32)).tobytes()
    raw = output_bytes(np.array(data, dtype=numpy_dtype(datatype)), datatype)
    return raw if isinstance(raw, bytes) else raw.tobytes()


class GrpcProxy:
    """Start with `start()`, stop with `stop()`; `port` is the bound port."""

    def __init__(self, upstream: str, signer: Signer, host: str = "127.0.0.1", port: int = 8001, *,
                 upstream_protocol: str = "http", timeout_s: float = 300.0, audience: str | None = None,
                 log: Callable[[str], None] | None = None, workers: int = 64) -> None:
        grpc, self.pb = _grpc_modules()
        parts = urlsplit(upstream)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise DeployError(f"invalid upstream URL '{upstream}': expected https://HOST[/PATH]")
        if upstream_protocol not in UPSTREAMS:
            raise DeployError(f"--upstream {upstream_protocol}: choose http or grpc")
        self.upstream = upstream.rstrip("/")
        self.upstream_protocol = upstream_protocol
        self.signer = signer
        self.timeout_s = timeout_s
        self.log = log
        self.forwarded = 0
        self._lock = threading.Lock()
        self._channel = None
        if upstream_protocol == "http":
            self.translator: RestTranslator | None = RestTranslator(self.upstream, signer, timeout_s)
        else:
            self.translator = None
            target = parts.netloc if parts.port else f"{parts.hostname}:{443 if parts.scheme == 'https' else 80}"
            options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.max_send_message_length", MAX_MESSAGE_BYTES)]
            self._channel = (
                grpc.secure_channel(target, grpc.ssl_channel_credentials(), options=options)
                if parts.scheme == "https" else grpc.insecure_channel(target, options=options)
            )
        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="toolkit-grpc-proxy"),
            options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                     ("grpc.max_send_message_length", MAX_MESSAGE_BYTES), ("grpc.so_reuseport", 0)],
        )
        self._server.add_generic_rpc_handlers((self._handler(),))
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            self.port = self._server.add_insecure_port(address)
        except RuntimeError as exc:
            raise DeployError(f"cannot listen for gRPC on {address}: {exc}") from None
        if not self.port:
            raise DeployError(f"cannot listen for gRPC on {address}: the address is in use")
        self.host = host

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _count(self) -> None:
        with self._lock:
            self.forwarded += 1

    def _handler(self) -> Any:
        grpc, pb = _grpc_modules()
        descriptor = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
        handlers = {}
        for method in descriptor.methods:
            request_class = getattr(pb, method.input_type.name)
            streaming = method.client_streaming or method.server_streaming
            if self.translator is not None:
                behavior = self._stream_refused if streaming else self._translated(method.name, request_class)
            else:
                behavior = self._relay_stream(method.name) if streaming else self._relay_unary(method.name)
            factory = grpc.stream_stream_rpc_method_handler if streaming else grpc.unary_unary_rpc_method_handler
            handlers[method.name] = factory(behavior, request_deserializer=None, response_serializer=_serialize)
        return grpc.method_handlers_generic_handler(SERVICE, handlers)

    def _translated(self, name: str, request_class: Any) -> Callable[[bytes, Any], Any]:
        grpc, _ = _grpc_modules()
        from google.protobuf.message import DecodeError

        implementation = getattr(self.translator, name)

        def behavior(data: bytes, context: Any) -> Any:
            try:
                request = request_class.FromString(data)
            except DecodeError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"failed to parse the request: not a valid inference.{request_class.DESCRIPTOR.name} ({exc})")
            try:
                response = implementation(request)
            except _Failure as failure:
                if self.log is not None:
                    self.log(f"{name}: {failure.code.name} {failure.message}")
                context.abort(failure.code, failure.message)
            self._count()
            if self.log is not None:
                self.log(f"{name} -> {self.upstream} (REST)")
            return response

        return behavior

    def _stream_refused(self, requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
        grpc, _ = _grpc_modules()
        context.abort(
            grpc.StatusCode.UNIMPLEMENTED,
            f"ModelStreamInfer cannot be forwarded to {self.upstream}: it is an HTTP deployment (AWS Lambda has no "
            "gRPC and answers each request with one response), so toolkit proxy carries unary RPCs only; use "
            "ModelInfer (tritonclient's infer / async_infer, perf_analyzer without --streaming), or deploy to Cloud "
            "Run with --protocol grpc and run toolkit proxy with --upstream grpc",
        )
        yield b""  # pragma: no cover - abort raises

    def _metadata(self, context: Any) -> list[tuple[str, str]]:
        forwarded = [(k, v) for k, v in context.invocation_metadata() if k.lower() not in _DROPPED_METADATA
                     and not k.startswith(":") and k.lower() not in ("content-type", "user-agent", "te", "grpc-timeout")]
        authorization = self.signer.sign("POST", self.upstream, {}, b"").get("Authorization")
        if authorization:
            forwarded.append(("authorization", authorization))
        return forwarded

    def _relay_unary(self, name: str) -> Callable[[bytes, Any], bytes]:
        grpc, _ = _grpc_modules()
        assert self._channel is not None
        call = self._channel.unary_unary(f"/{SERVICE}/{name}", request_serializer=None, response_deserializer=None)

        def behavior(data: bytes, context: Any) -> bytes:
            try:
                metadata = self._metadata(context)
            except DeployError as exc:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, f"toolkit proxy cannot sign the request: {exc.message}")
            try:
                answer = call(data, metadata=metadata, timeout=self.timeout_s)
            except grpc.RpcError as error:
                context.abort(error.code(), error.details() or "")
            self._count()
            return answer

        return behavior

    def _relay_stream(self, name: str) -> Callable[[Iterator[bytes], Any], Iterator[bytes]]:
        grpc, _ = _grpc_modules()
        assert self._channel is not None
        call = self._channel.stream_stream(f"/{SERVICE}/{name}", request_serializer=None, response_deserializer=None)

        def behavior(requests: Iterator[bytes], context: Any) -> Iterator[bytes]:
            try:
                metadata = self._metadata(context)
            except DeployError as exc:
                context.abort(grpc.StatusCode.UNAUTHENTICATED, f"toolkit proxy cannot sign the request: {exc.message}")
            upstream = call(requests, metadata=metadata)
            context.add_callback(upstream.cancel)
            try:
                for answer in upstream:
                    yield answer
            except grpc.RpcError as error:
                if error.code() != grpc.StatusCode.CANCELLED:
                    context.abort(error.code(), error.details() or "")
            self._count()

        return behavior

    def start(self) -> "GrpcProxy":
        self._server.start()
        return self

    def wait(self) -> None:
        self._server.wait_for_termination()

    def stop(self, grace: float | None = 5.0) -> None:
        self._server.stop(grace).wait()
        if self._channel is not None:
            self._channel.close()

    def __enter__(self) -> "GrpcProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _serialize(message: Any) -> bytes:
    return message if isinstance(message, bytes) else message.SerializeToString()
