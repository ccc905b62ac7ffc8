"""One instance of a TorchScript model: torch.jit.load, then the batch through `forward` once.

What tritonserver 2.51's pytorch_backend does (src/libtorch.cc), in Python:

- load: `torch.jit.load(model.pt, map_location=device)` under InferenceMode(INFERENCE_MODE);
  KIND_GPU instances on cuda:<device_id>, KIND_CPU on the CPU, KIND_MODEL where the model's
  own tensors say; ENABLE_WEIGHT_SHARING shares one module among a version's instances on one
  device;
- execute: the requests' inputs concatenated along the batch dimension (BYTES inputs as one
  `List[str]`), `forward` run once under no_grad and InferenceMode, with the optimisation and
  JIT switches the parameters set (settings.py); a Tensor, a `List[str]`, or a tuple of them
  comes back, and each config output takes its element by index (`OUTPUT__<n>` or config order);
  outputs are cut back per request along the batch dimension;
- errors: a failing forward fails the whole batch with "PyTorch execute failure: ..."
  (INTERNAL); an output index the model does not have, a datatype other than the config's, or a
  scalar output fail it with INVALID_ARG, in tritonserver's words.

Better than tritonserver here (docs/triton-compatibility.md): a batching model's `List[str]`
output is split per request (tritonserver gives every request the list's first elements), an
output whose first dimension is not the batch size is an error instead of a wrong split, and
BYTES that are not UTF-8 fail their own request (TorchScript strings are text) rather than reach
the model.
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from ...batching.batch_tensors import batch_inputs, batch_outputs
from ...batching.merge import (
    batch_responses, batch_sizes, merge_inputs, refuse_alone, requested_output_names, run_batch, stamp_compute,
)
from ...errors import ErrorCode, InferenceError, invalid_argument
from ...inference import InferOutcome, InferRequest
from ...manifest import ModelSpec
from ..sharing import Shared
from . import settings
from .config import (
    DEFAULT_FILENAME,
    STRING,
    TORCH_DTYPES,
    Argument,
    ConfigError,
    Signature,
    input_layout,
    output_layout,
    parse_parameters,
)

log = logging.getLogger("handlers.pytorch")

# Merged request tensors are read-only numpy arrays; torch shares their memory and warns once
# that it cannot protect them. Models read their inputs (as in tritonserver, which hands them its
# own input buffers).
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)


class ModelLoadError(Exception):
    """A model (instance) cannot be created; the message says why and what to do."""


def _torch():
    try:
        import torch
    except ImportError as exc:  # depends on what is installed
        raise ModelLoadError(
            "torch is not installed: the pytorch backend needs it (CPU: pip install torch --index-url "
            "https://download.pytorch.org/whl/cpu; toolkit build puts it into images whose models need it)"
        ) from exc
    return torch


def signature_of(module: Any) -> Signature:
    """The module's forward signature as plain data (config.py reads it)."""
    schema = module.forward.schema
    arguments = tuple(Argument(a.name, a.type.kind(), str(a.type)) for a in schema.arguments)
    returns = str(schema.returns[0].type) if len(schema.returns) == 1 else f"Tuple[{', '.join(str(r.type) for r in schema.returns)}]"
    return Signature(arguments, returns)


def load_module(torch, path: Path, device: Any, inference_mode: bool):
    """torch.jit.load as the backend loads it (device None: where the model's tensors say)."""
    with torch.inference_mode(inference_mode):
        if device is None:
            return torch.jit.load(str(path))
        return torch.jit.load(str(path), map_location=device)


def placement(torch, kind: str, device_id: int, model: str):
    """The torch device of an instance (None for KIND_MODEL: the model decides)."""
    if kind == "KIND_GPU":
        if not torch.cuda.is_available():
            build = "a CPU build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
            raise ModelLoadError(
                f"model '{model}' has a KIND_GPU instance group but torch {torch.__version__} ({build}) sees no CUDA "
                "device; serve it on a machine with an NVIDIA GPU and torch's CUDA build (toolkit build --device gpu), "
                "or on CPU with --device cpu"
            )
        if device_id >= torch.cuda.device_count():
            raise ModelLoadError(
                f"model '{model}' asks for GPU {device_id}, but torch sees {torch.cuda.device_count()} CUDA device(s)"
            )
        return torch.device("cuda", device_id)
    if kind == "KIND_MODEL":
        return None
    return torch.device("cpu")


# ENABLE_WEIGHT_SHARING: one module per (model, version, device), shared by its instances.
_MODULES = Shared()


def _datatype_of(torch, dtype) -> str | None:
    for name, torch_name in TORCH_DTYPES.items():
        if getattr(torch, torch_name) == dtype:
            return name
    return None


class PyTorchInstance:
    """One model instance: its module (or the version's shared one), run by one batcher worker
    thread at a time."""

    def __init__(
        self, spec: ModelSpec, version: int, name: str, kind: str = "KIND_CPU", device_id: int = 0,
        threads: int | None = None,
    ) -> None:
        torch = self.torch = _torch()
        self.name, self.kind, self.device_id = name, kind, device_id
        self.spec, self.version = spec, version
        config = spec.config
        try:
            self.parameters = parse_parameters(config)
        except ConfigError as exc:
            raise ModelLoadError(exc.message) from None
        settings.apply_thread_counts(torch, spec.name, self.parameters.intra_op_threads, self.parameters.inter_op_threads)
        if self.parameters.intra_op_threads is None and threads is not None:
            settings.apply_budget_threads(torch, spec.name, threads)
        self.device = placement(torch, kind, device_id, spec.name)
        if self.device is None or self.device.type == "cpu":
            settings.keep_freed_memory()
        path = Path(spec.model_files[version])
        if path.is_dir():
            path = path / DEFAULT_FILENAME
        if not path.is_file():
            raise ModelLoadError(f"unable to find '{path}' for model instance '{spec.name}'")
        started = time.perf_counter()
        self.module = self._load(path)
        self.load_seconds = time.perf_counter() - started
        notes: list[str] = []
        try:
            self.inputs = input_layout(config, signature_of(self.module), notes)
            self.outputs = output_layout(config, notes)
        except ConfigError as exc:
            raise ModelLoadError(exc.message) from None
        for note in notes:
            log.warning("%s", note)
        self.batching = spec.max_batch_size > 0
        self._output_names = [io["name"] for io in config.get("output", [])]
        states = (config.get("sequence_batching") or {}).get("state", [])
        self._string_inputs = {io["name"] for io in config.get("input", []) if io.get("data_type") == STRING} | {
            state.get("input_name") for state in states if state.get("data_type") == STRING
        }
        self._order = sorted(self.inputs.positions, key=self.inputs.positions.__getitem__)
        self._ragged = {io["name"] for io in config.get("input", []) if io.get("allow_ragged_batch")}
        try:
            self._batch_inputs = batch_inputs(config)
            self._batch_outputs = batch_outputs(config)
        except ValueError as exc:
            raise ModelLoadError(f"model '{spec.name}': {exc}") from None
        self._cuda = self.device is not None and self.device.type == "cuda"
        self._gpu_inputs = self._cuda  # KIND_GPU: inputs go to the instance's GPU; KIND_MODEL: stay on CPU
        self._jit_flags = any(
            v is not None for v in (self.parameters.jit_profiling, self.parameters.jit_executor, self.parameters.tensor_fuser)
        ) or not self.parameters.cudnn

    def _load(self, path: Path):
        torch, p = self.torch, self.parameters

        def make() -> Any:
            try:
                # As loaded, never .eval()'d: the backend runs the module in the mode it was saved in
                # (a module saved in training mode keeps its dropout and batch statistics, as in Triton).
                return load_module(torch, path, self.device, p.inference_mode)
            except Exception as exc:  # torch raises RuntimeError (and others) for unreadable archives
                raise ModelLoadError(f"failed to load model '{self.spec.name}': {exc}") from exc

        if not p.weight_sharing:
            return make()
        module, reused = _MODULES.get((self.spec.name, self.version, str(self.device), str(path)), make)
        if reused:
            log.info("Reusing TorchScript model for instance '%s'", self.name)
        return module

    def close(self) -> None:
        self.module = None
        if self._cuda and self.torch.cuda.is_available():
            self.torch.cuda.empty_cache()

    # -- execution ------------------------------------------------------------------------------

    def execute(self, requests: list[InferRequest]) -> list[InferOutcome]:
        """Run a batch. A batching model runs the whole batch at once; a non-batching model
        (max_batch_size 0) is never merged, so each of its requests runs alone. A request whose
        BYTES are not UTF-8 is refused alone; the rest of its batch runs."""
        refused = refuse_alone(requests, self._undecodable, self.execute)
        if refused is not None:
            return refused
        try:
            return run_batch(requests, self._run, batching=self.batching)
        finally:
            if self.parameters.cache_cleaning and self._cuda:
                self.torch.cuda.empty_cache()

    def _undecodable(self, request: InferRequest) -> InferenceError | None:
        for name in self._string_inputs:
            array = request.inputs.get(name)
            if array is None:
                continue
            for item in array.reshape(-1):
                if isinstance(item, bytes):
                    try:
                        item.decode("utf-8")
                    except UnicodeDecodeError:
                        return invalid_argument(
                            f"BYTES input '{name}' of model '{self.spec.name}' is not valid UTF-8: TorchScript takes "
                            "strings as List[str] (text)"
                        )
        return None

    def _arguments(self, requests: list[InferRequest]) -> list[Any]:
        """The forward's arguments: each input of the whole batch as one tensor (BYTES as one
        List[str]), or a Dict[str, Tensor] of them."""
        torch = self.torch
        try:
            merged = merge_inputs(requests, batching=self.batching, ragged=self._ragged)
        except ValueError as exc:
            raise invalid_argument(f"model '{self.spec.name}': {exc}") from None
        tensors: dict[str, Any] = {}
        for name, array in merged.items():
            if name in self._string_inputs:
                tensors[name] = [s.decode("utf-8") if isinstance(s, bytes) else str(s) for s in array.reshape(-1)]
                continue
            tensor = torch.from_numpy(array)  # shares the request's memory (read-only arrays warn once, silenced)
            if self._gpu_inputs:
                tensor = tensor.to(self.device)
            tensors[name] = tensor
        for batch_input in self._batch_inputs:
            try:
                array = batch_input.tensor(requests)
            except ValueError as exc:
                raise invalid_argument(f"model '{self.spec.name}': {exc}") from None
            tensor = torch.from_numpy(array)
            if self._gpu_inputs:
                tensor = tensor.to(self.device)
            tensors.update((target, tensor) for target in batch_input.targets)
        if self.inputs.dict_input:
            return [tensors]
        missing = [name for name in self._order if name not in tensors]
        if missing:
            raise invalid_argument(
                f"model '{self.spec.name}': input '{missing[0]}' is optional in the config, but the TorchScript forward "
                "needs every argument"
            )
        return [tensors[name] for name in self._order]

    def _run(self, requests: list[InferRequest]) -> list[InferOutcome]:
        torch, p = self.torch, self.parameters
        start = time.monotonic_ns()
        try:
            arguments = self._arguments(requests)
        except InferenceError as exc:
            return [exc] * len(requests)
        except Exception as exc:  # e.g. copying the inputs to the instance's GPU failed
            return [InferenceError(f"PyTorch execute failure: {exc}", ErrorCode.INTERNAL)] * len(requests)
        input_end = time.monotonic_ns()
        try:
            torch._C._set_graph_executor_optimize(p.optimized_execution)  # per thread
            if self._jit_flags:
                settings.apply_jit_flags(
                    torch, profiling=p.jit_profiling, executor=p.jit_executor, fuser=p.tensor_fuser, cudnn=p.cudnn
                )
            held = self._hold(arguments)
            with torch.no_grad(), torch.inference_mode(p.inference_mode):
                result = self.module(*arguments)
            del held  # here, with the GIL held, the inputs' last C++ references go
            produced = self._outputs(result)
        except InferenceError as exc:
            return [exc] * len(requests)
        except Exception as exc:  # torch.jit.Error, RuntimeError, ...: the model failed
            return [InferenceError(f"PyTorch execute failure: {exc}", ErrorCode.INTERNAL)] * len(requests)
        infer_end = time.monotonic_ns()
        try:
            parts = self._split(produced, requests)
        except InferenceError as exc:
            return [exc] * len(requests)
        outcomes: list[InferOutcome] = list(batch_responses(requests, parts))
        stamp_compute(requests, start, input_end, infer_end, time.monotonic_ns())
        return outcomes

    def _hold(self, arguments: list[Any]) -> Any:
        """A C++ reference to every input tensor for the length of `forward`, so that the
        TorchScript interpreter never drops the last C++ reference to a tensor Python made.

        A tensor made in Python (torch.from_numpy) has a PyObject; when its C++ reference count
        falls from 2 to 1, c10 decrefs that PyObject, which takes the GIL (TensorImpl::
        decref_pyobject, c10/util/intrusive_ptr.h). The interpreter drops its reference to an
        input after the input's last use, in the middle of forward, where this thread has let the
        GIL go: it then waits for the GIL (held by the event loop or another instance's Python)
        mid-forward. A torch.ScriptList holds the tensors as C++ values (IValues), so the count
        stays >= 2 until the list goes, after forward has returned, on this thread with the GIL."""
        tensors = [a for a in arguments if isinstance(a, self.torch.Tensor)]
        for argument in arguments:
            if isinstance(argument, dict):
                tensors.extend(v for v in argument.values() if isinstance(v, self.torch.Tensor))
        return self.torch._C.ScriptList(tensors) if tensors else None

    def _outputs(self, result: Any) -> list[Any]:
        """The forward's result as the list the output indices address (ModelInstanceState::Execute)."""
        torch = self.torch
        if isinstance(result, tuple):
            produced = []
            for index, item in enumerate(result):
                if isinstance(item, list):
                    if not all(isinstance(s, str) for s in item):
                        raise ValueError(
                            f"output at index {index} must be of type Tensor or List[str], received "
                            f"List[{_element_type(torch, item)}]"
                        )
                elif not isinstance(item, torch.Tensor):
                    raise ValueError(f"Expected Tensor but got {_type_name(torch, item)}")
                produced.append(item)
            return produced
        if isinstance(result, torch.Tensor):
            return [result]
        if isinstance(result, list):
            if not all(isinstance(s, str) for s in result):
                raise ValueError(f"output must be of type Tensor or List[str], received List[{_element_type(torch, result)}]")
            return [result]
        raise ValueError(
            "output must be of type Tensor, List[str] or Tuple containing one of these two types. It should not be a "
            "List / Dictionary of Tensors or a Scalar"
        )

    def _split(self, produced: list[Any], requests: list[InferRequest]) -> list[dict[str, np.ndarray]]:
        """ReadOutputTensors: every config output (in name order, as the backend walks them), its
        datatype checked, then cut per request."""
        torch = self.torch
        names = requested_output_names(requests, self._output_names)
        for name in sorted(self.outputs.positions):
            index = self.outputs.positions[name]
            if index >= len(produced):
                raise InferenceError(
                    f"The output {name} in the model configuration refers to an output index which doesn't exist. "
                    f"This model has {len(produced)} outputs",
                    ErrorCode.INVALID_ARG,
                )
        sizes = batch_sizes(requests, batching=self.batching)
        parts: list[dict[str, np.ndarray]] = [{} for _ in requests]
        for name in sorted(self.outputs.positions):
            value = produced[self.outputs.positions[name]]
            expected = self.outputs.datatypes[name]
            if isinstance(value, list):
                if expected != STRING:
                    raise InferenceError(
                        f"configuration expects datatype {expected} for output '{name}', model provides List[str] "
                        "(TYPE_STRING)",
                        ErrorCode.INVALID_ARG,
                    )
                pieces = self._split_strings(name, value, sizes)
            else:
                provided = _datatype_of(torch, value.dtype)
                if provided != expected:
                    shown = provided or f"TYPE_<invalid> ({value.dtype}, which has no Triton datatype)"
                    raise InferenceError(
                        f"configuration expects datatype {expected} for output '{name}', model provides {shown}",
                        ErrorCode.INVALID_ARG,
                    )
                if value.dim() == 0:
                    raise InferenceError(f"output '{name}' is a scalar which is not supported.", ErrorCode.INVALID_ARG)
                if name not in names:
                    continue
                array = value.detach().contiguous().cpu().numpy()
                if name in self._batch_outputs:
                    try:
                        pieces = self._batch_outputs[name].scatter(array, requests)
                    except ValueError as exc:
                        raise InferenceError(f"model '{self.spec.name}': {exc}", ErrorCode.INTERNAL) from None
                else:
                    pieces = self._split_array(name, array, sizes)
            if name in names:
                for part, piece in zip(parts, pieces):
                    part[name] = piece
        return parts

    def _split_array(self, name: str, array: np.ndarray, sizes: list[int]) -> list[np.ndarray]:
        if len(sizes) == 1 and not self.batching:
            return [array]
        total = sum(sizes)
        if array.shape[0] != total:
            raise InferenceError(
                f"model '{self.spec.name}': output '{name}' has shape {list(array.shape)}: its first dimension must be "
                f"the batch size {total}",
                ErrorCode.INTERNAL,
            )
        if len(sizes) == 1:
            return [array]
        bounds = np.cumsum([0, *sizes]).tolist()
        return [array[bounds[i] : bounds[i + 1]] for i in range(len(sizes))]

    def _split_strings(self, name: str, strings: list[str], sizes: list[int]) -> list[np.ndarray]:
        def encoded(items: list[str]) -> np.ndarray:
            array = np.empty(len(items), dtype=object)
            array[:] = [s.encode("utf-8") for s in items]
            return array

        if not self.batching:
            return [encoded(strings)]
        total = sum(sizes)
        if len(strings) != total:
            raise InferenceError(
                f"model '{self.spec.name}': output '{name}' is a List[str] of {len(strings)} strings: a batching model "
                f"returns one string per batch element ({total})",
                ErrorCode.INTERNAL,
            )
        bounds = np.cumsum([0, *sizes]).tolist()
        return [encoded(strings[bounds[i] : bounds[i + 1]]) for i in range(len(sizes))]


def _type_name(torch, value: Any) -> str:
    """c10's name for an IValue's type, as its "Expected Tensor but got ..." says it."""
    if isinstance(value, bool):
        return "Bool"
    if isinstance(value, int):
        return "Int"
    if isinstance(value, float):
        return "Double"
    if isinstance(value, str):
        return "String"
    if isinstance(value, dict):
        return "GenericDict"
    if isinstance(value, (list, tuple)):
        return "GenericList" if isinstance(value, list) else "Tuple"
    if value is None:
        return "None"
    return type(value).__name__


def _element_type(torch, items: list[Any]) -> str:
    for item in items:
        if isinstance(item, torch.Tensor):
            return "Tensor"
        if isinstance(item, bool):
            return "bool"
        if isinstance(item, int):
            return "int"
        if isinstance(item, float):
            return "float"
        if isinstance(item, list):
            return "List"
        return type(item).__name__
    return "Tensor"
