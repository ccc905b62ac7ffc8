"""Loading a Triton python-backend model.py and running it, as the python backend's stub does.

Used in a model process (stub.py, Triton's layout: one instance per process) and in the serving
process (in-process instances). Requests arrive as plain payloads (`RequestPayload`) and results
leave as `OutcomePayload`s, so the same code serves both.

Triton's rules kept here (pb_stub.cc, model_context.cc, python_be.cc in tritonserver 2.51):

- the model's version folder and model folder are appended to sys.path and model.py is imported
  as module "<version>.<file stem>" (so `from .helpers import x` and `import helpers` both work);
  in-process instances import it under a private package name instead (see `isolated`);
- `TritonPythonModel()` is created and `initialize(args)` called with string values:
  model_config (JSON), model_instance_kind ("CPU"/"GPU"), model_instance_name,
  model_instance_device_id, model_repository (the model's folder), model_version, model_name;
- `execute(requests)` (plain or `async def`, run on the instance's own event loop thread) must
  return a list with one InferenceResponse per request, in order; otherwise, or when it raises,
  every request of the batch fails with "Failed to process the request(s) for model '<instance>',
  message: ..." (INTERNAL). A response's own error fails just its request, with its code;
- responses are pruned to the outputs the request asked for (all outputs when it asked none);
- `finalize()` on unload; exceptions there are logged.

Decoupled models (`model_transaction_policy { decoupled: true }`, pb_stub.cc ProcessRequests):
each request's response sender (`request.get_response_sender()`) sends its responses to the
`responses` channel under the request's token; `execute` must return None (anything else fails the
batch with "Python model '<instance>' is using the decoupled mode and the execute function must
return None."); an `async def execute` runs in the background (the instance takes its next batch
at once) and, where Triton only logs its exception, the requests it left open end with the error.
When `execute` fails, every sender of the batch is closed and the requests not yet finished end
with the batch's error (the serving side sends it).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import itertools
import json
import logging
import os
import sys
import threading
import traceback
from pathlib import Path
from types import CoroutineType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import asyncio

from . import host
from .request import DecoupledResponseSender, InferenceRequest, InferenceResponseSender, ResponseChannel
from .response import InferenceResponse, outcome_payload
from .tensor import Tensor

log = logging.getLogger("handlers.python")

PB_UTILS = "triton_python_backend_utils"
INTERNAL = 1  # TRITONSERVER_ERROR_INTERNAL

# (request_id, correlation_id, inputs [(name, array, datatype)], requested output names, flags,
#  timeout_us, parameters JSON, response token (decoupled models) or None)
RequestPayload = tuple
# ("ok", [(name, array, datatype)]) or ("error", message, TRITONSERVER_Error_Code number)
OutcomePayload = tuple
EXECUTED: OutcomePayload = ("ok", [])  # a decoupled request whose execute returned

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_STDLIB = os.path.dirname(os.path.abspath(threading.__file__))
# Frames of the runtime itself (and of the stdlib machinery it calls the model through) are not
# the model's: pybind's traceback starts at the model's own code.
_RUNTIME_DIRS = tuple(os.path.join(_STDLIB, d) + os.sep for d in ("asyncio", "importlib", "concurrent")) + (
    _PACKAGE_DIR + os.sep,
)
_isolated_names = itertools.count()


class ModelLoadError(Exception):
    """model.py could not be imported or initialised; the message is Triton's."""


def install_pb_utils() -> None:
    """Make `import triton_python_backend_utils` give this runtime's module."""
    if PB_UTILS not in sys.modules:
        from . import triton_python_backend_utils

        sys.modules[PB_UTILS] = triton_python_backend_utils


def describe_exception(exc: BaseException) -> str:
    """An exception as pybind11's error_already_set prints it (what Triton reports): "Type:
    message", then the model's frames, innermost first."""
    message = str(exc)
    text = type(exc).__name__ + (f": {message}" if message else "")
    frames = [
        f for f in traceback.extract_tb(exc.__traceback__)
        if not os.path.abspath(f.filename).startswith(_RUNTIME_DIRS)
    ]
    if frames:
        text += "\n\nAt:\n" + "".join(f"  {f.filename}({f.lineno}): {f.name}\n" for f in reversed(frames))
    return text


def initialize_args(
    *, config: dict[str, Any], instance_name: str, kind: str, device_id: int, model_dir: Path, version: int
) -> dict[str, str]:
    """The `args` dict `initialize` receives (python_be.cc; every value a string)."""
    return {
        "model_config": json.dumps(config, separators=(",", ":")),
        "model_instance_kind": kind.removeprefix("KIND_"),
        "model_instance_name": instance_name,
        "model_instance_device_id": str(device_id),
        "model_repository": str(model_dir),
        "model_version": str(version),
        "model_name": str(config.get("name", "")),
    }


class ModelRunner:
    def __init__(
        self,
        *,
        model_file: Path,
        model_dir: Path,
        version: int,
        config: dict[str, Any],
        instance_name: str,
        kind: str = "KIND_CPU",
        device_id: int = 0,
        isolated: bool = False,
        responses: ResponseChannel | None = None,
    ) -> None:
        self.model_file = Path(model_file)
        self.model_dir = Path(model_dir)
        self.version = version
        self.config = config
        self.model_name = str(config.get("name", ""))
        self.instance_name = instance_name
        self.kind = kind
        self.device_id = device_id
        self.isolated = isolated
        self.decoupled = bool((config.get("model_transaction_policy") or {}).get("decoupled", False))
        self.responses = responses  # where a decoupled model's senders send
        self.context = host.ModelContext(self.model_name, instance_name, str(self.model_file.parent), host.Phase.INITIALIZE)
        self.outputs = [o["name"] for o in config.get("output", [])]
        self.model: Any = None
        self.module: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: threading.Thread | None = None

    # -- load ------------------------------------------------------------------------------------------

    def load(self) -> None:
        """Import model.py, create TritonPythonModel and call initialize; ModelLoadError with
        Triton's message on failure."""
        install_pb_utils()
        if self.model_file.suffix != ".py":
            raise ModelLoadError(f'Model name must end with \'.py\'. Model name is "{self.model_file.name}".')
        token = host.enter_context(self.context.with_phase(host.Phase.INITIALIZE))
        try:
            try:
                self.module = self._import()
                model_class = self.module.TritonPythonModel
                self.model = model_class()
            except Exception as exc:  # noqa: BLE001 - anything the model's code raises
                raise ModelLoadError(describe_exception(exc)) from None
            args = initialize_args(
                config=self.config, instance_name=self.instance_name, kind=self.kind, device_id=self.device_id,
                model_dir=self.model_dir, version=self.version,
            )
            if hasattr(self.model, "initialize"):
                try:
                    result = self.model.initialize(args)
                    if isinstance(result, CoroutineType):
                        self._run_coroutine(result)
                except Exception as exc:  # noqa: BLE001 - anything the model's code raises
                    raise ModelLoadError(describe_exception(exc)) from None
        finally:
            host.leave_context(token)

    def _import(self) -> Any:
        version_dir = str(self.model_file.parent)
        stem = self.model_file.stem
        if self.isolated:
            # Several models share this process: a private package per instance keeps their
            # "1.model" modules apart (relative imports still resolve in the version folder).
            package = f"_toolkit_python_model_{next(_isolated_names)}"
            spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
            spec.submodule_search_locations = [version_dir]
            sys.modules[package] = importlib.util.module_from_spec(spec)
            for path in (version_dir, str(self.model_dir)):
                if path not in sys.path:
                    sys.path.append(path)
            return importlib.import_module(f"{package}.{stem}")
        sys.path.append(version_dir)
        sys.path.append(str(self.model_dir))
        return importlib.import_module(f"{self.model_file.parent.name}.{stem}")

    # -- execute ------------------------------------------------------------------------------------

    def _request(self, payload: RequestPayload) -> InferenceRequest:
        request_id, correlation_id, inputs, requested, flags, timeout_us, parameters, token = payload
        names = list(requested) if requested is not None else list(self.outputs)
        sender = None
        if self.decoupled:
            sender = DecoupledResponseSender(self.responses or _DROP, token or 0, names, self.instance_name)
        return InferenceRequest._from_server(
            request_id=request_id,
            correlation_id=correlation_id,
            inputs=[Tensor._wrap(name, array, datatype) for name, array, datatype in inputs],
            requested_output_names=names,
            model_name=self.model_name,
            model_version=self.version,
            flags=flags,
            timeout=timeout_us,
            parameters=parameters,
            sender=sender,
        )

    def execute(self, payloads: list[RequestPayload]) -> list[OutcomePayload]:
        requests = [self._request(p) for p in payloads]
        token = host.enter_context(self.context.with_phase(host.Phase.EXECUTE))
        try:
            if self.decoupled:
                self._execute_decoupled(requests)
                return [EXECUTED] * len(requests)
            responses = self._responses(requests, self._call_execute(requests))
        except _BatchFailure as failure:
            self._close_senders(requests)
            return [self._batch_error(failure.message)] * len(requests)
        except Exception as exc:  # noqa: BLE001 - anything the model's code raises
            self._close_senders(requests)
            message = describe_exception(exc)
            log.error("%s", f"Failed to process the request(s) for model '{self.instance_name}', message: {message}")
            return [self._batch_error(message)] * len(requests)
        finally:
            host.leave_context(token)
        return [self._outcome(request, response) for request, response in zip(requests, responses)]

    def _execute_decoupled(self, requests: list[InferenceRequest]) -> None:
        execute = getattr(self.model, "execute", None)
        if execute is None:
            raise _BatchFailure(f"Python model {self.model_file} does not implement `execute` method.")
        result = execute(requests)
        if isinstance(result, CoroutineType):
            self._run_in_background(result, requests)
        elif result is not None:
            raise _BatchFailure(self._must_return_none())

    def _must_return_none(self) -> str:
        return f"Python model '{self.instance_name}' is using the decoupled mode and the execute function must return None."

    def _close_senders(self, requests: list[InferenceRequest]) -> None:
        """A failed batch: the server ends the open requests with the batch's error, so the
        model's threads may not send to them any more (as pb_stub closes every sender)."""
        if self.decoupled:
            for request in requests:
                sender = request.response_sender
                if isinstance(sender, DecoupledResponseSender):
                    sender._close()

    def _run_in_background(self, coroutine: Any, requests: list[InferenceRequest]) -> None:
        """A decoupled `async def execute`: run on the instance's event loop without waiting."""
        future = self._schedule_coroutine(coroutine)

        def done(f: Any) -> None:
            if f.cancelled():
                message = "the model's execute coroutine was cancelled"
            elif f.exception() is not None:
                message = describe_exception(f.exception())
            elif f.result() is not None:
                message = self._must_return_none()
            else:
                return
            text = f"Failed to process the request(s) for model '{self.instance_name}', message: {message}"
            log.error("%s", text)
            for request in requests:  # the ones the coroutine left open end with its error
                sender = request.response_sender
                if isinstance(sender, DecoupledResponseSender):
                    sender._fail(text)

        future.add_done_callback(done)

    def _call_execute(self, requests: list[InferenceRequest]) -> Any:
        execute = getattr(self.model, "execute", None)
        if execute is None:
            raise _BatchFailure(f"Python model {self.model_file} does not implement `execute` method.")
        result = execute(requests)
        if isinstance(result, CoroutineType):
            result = self._run_coroutine(result)
        return result

    def _responses(self, requests: list[InferenceRequest], result: Any) -> list[InferenceResponse | str]:
        if result is None:  # every response went through the requests' response senders
            return [_sent(r.response_sender) for r in requests]
        if not isinstance(result, list):
            raise _BatchFailure(f"Expected a list in the execute return, found type '{type(result)}'.")
        if len(result) != len(requests):
            raise _BatchFailure(
                "Number of InferenceResponse objects do not match the number of InferenceRequest objects. "
                f"InferenceRequest(s) size is:{len(requests)}, and InferenceResponse(s) size is:{len(result)}\n"
            )
        responses: list[InferenceResponse | str] = []
        for request, response in zip(requests, result):
            if response is None:
                responses.append(_sent(request.response_sender))
            elif not isinstance(response, InferenceResponse):
                raise _BatchFailure(
                    "Expected an 'InferenceResponse' object in the execute function return list, found type "
                    f"'{type(response)}'."
                )
            elif request.response_sender is not None and request.response_sender.sent is not None:
                responses.append("Unable to send response. Non-decoupled model cannot send more than one response.")
            else:
                responses.append(response)
        return responses

    def _outcome(self, request: InferenceRequest, response: InferenceResponse | str) -> OutcomePayload:
        if isinstance(response, str):
            return self._batch_error(response)
        return outcome_payload(response, request.requested_names)

    def _batch_error(self, message: str) -> OutcomePayload:
        return ("error", f"Failed to process the request(s) for model '{self.instance_name}', message: {message}", INTERNAL)

    # -- async ----------------------------------------------------------------------------------------

    def _run_coroutine(self, coroutine: Any) -> Any:
        """Run an `async def` execute on this instance's event loop (a thread of its own, as the
        python backend does), waiting for its result."""
        return self._schedule_coroutine(coroutine).result()

    def _schedule_coroutine(self, coroutine: Any) -> Any:
        """Start a coroutine on the instance's event loop, in the current model context; its
        concurrent.futures.Future."""
        import asyncio

        if self._loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name=f"pb-asyncio-{self.instance_name}", daemon=True)
            thread.start()
            self._loop, self._loop_thread = loop, thread
        context = host.current_context()

        async def with_context() -> Any:
            if context is not None:
                host.enter_context(context)
            return await coroutine

        return asyncio.run_coroutine_threadsafe(with_context(), self._loop)

    # -- readiness and unload ---------------------------------------------------------------------------

    def is_ready(self) -> bool:
        """The model's own `is_ready()` when it has one (True otherwise)."""
        check = getattr(self.model, "is_ready", None)
        if check is None:
            return True
        token = host.enter_context(self.context.with_phase(host.Phase.EXECUTE))
        try:
            result = check()
            if isinstance(result, CoroutineType):
                result = self._run_coroutine(result)
            return bool(result)
        except Exception as exc:  # noqa: BLE001 - anything the model's code raises
            log.error("is_ready() of model instance '%s' failed: %s", self.instance_name, describe_exception(exc))
            return False
        finally:
            host.leave_context(token)

    def finalize(self) -> None:
        if self.model is not None and hasattr(self.model, "finalize"):
            token = host.enter_context(self.context.with_phase(host.Phase.FINALIZE))
            try:
                result = self.model.finalize()
                if isinstance(result, CoroutineType):
                    self._run_coroutine(result)
            except Exception as exc:  # noqa: BLE001 - anything the model's code raises
                log.error("finalize() of model instance '%s' failed: %s", self.instance_name, describe_exception(exc))
            finally:
                host.leave_context(token)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._loop_thread is not None:
                self._loop_thread.join(timeout=5)
            self._loop = None


class _BatchFailure(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _sent(sender: InferenceResponseSender | None) -> InferenceResponse | str:
    if sender is not None and sender.sent is not None:
        return sender.sent
    return "execute() returned no response for this request and sent none through its response sender"


class _DropResponses:
    """The channel of a decoupled model run without a server around it (its responses are
    dropped)."""

    def send(self, token: int, payload: Any, final: bool) -> None:
        pass

    def is_cancelled(self, token: int) -> bool:
        return False


_DROP = _DropResponses()
