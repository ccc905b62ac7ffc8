"""What Triton's onnxruntime backend does with a model's config: auto-complete and IO checks.

Mirrors triton-inference-server/onnxruntime_backend (r24.10, Triton 2.51):

* `read_signature` is the backend's `InputInfos` / `OutputInfos` / `OverridableInitializerInfos`
  (src/onnxruntime_utils.cc): the signature is read from a real ONNX Runtime session, as the
  backend reads it, so inputs backed by an initializer are not inputs, and output shapes are the
  ones ORT's shape inference refines.
* `autocomplete` is `ModelState::AutoCompleteConfig`, `AutoCompleteMaxBatch` and `AutoCompleteIO`
  (src/onnxruntime.cc), including the order in which the backend writes the tensors (it iterates
  a `std::unordered_map`, see `unordered_map_order`).
* `validate_against_model` is the `ModelInstanceState` constructor's checks: sequence controls,
  `ValidateInputs`, `ValidateOutputs` and `CompareDimsSupported`, with the backend's messages.

docs/onnx-autocomplete.md records the findings, with citations, and the few deliberate deviations.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from google.protobuf.message import Message

from .errors import ModelError
from .model_config import DataType, pb2

# The backend's `default-max-batch-size` backend config; Triton's default is 4
# (onnxruntime_backend README, "Default Max Batch Size").
DEFAULT_MAX_BATCH_SIZE = 4

WILDCARD_DIM = -1

# ONNXType names as the backend's OnnxTypeName() prints them (ONNX_TYPE_OPTIONAL has no case
# there, so it prints as ONNX_TYPE_UNKNOWN).
ONNX_TYPE_TENSOR = "ONNX_TYPE_TENSOR"
_ORT_KIND_NAMES = {
    "tensor": ONNX_TYPE_TENSOR,
    "seq": "ONNX_TYPE_SEQUENCE",
    "map": "ONNX_TYPE_MAP",
    "opaque": "ONNX_TYPE_OPAQUE",
    "sparse_tensor": "ONNX_TYPE_SPARSETENSOR",
}
_ONNX_VALUE_KIND_NAMES = {
    "tensor_type": ONNX_TYPE_TENSOR,
    "sequence_type": "ONNX_TYPE_SEQUENCE",
    "map_type": "ONNX_TYPE_MAP",
    "opaque_type": "ONNX_TYPE_OPAQUE",
    "sparse_tensor_type": "ONNX_TYPE_SPARSETENSOR",
}

# ONNX element type (TensorProto.DataType name) -> OnnxDataTypeToModelConfigDataType().
# Everything else (BFLOAT16, COMPLEX*, FLOAT8*, INT4, ...) is TYPE_INVALID.
_ELEMENT_TO_CONFIG = {
    "BOOL": "TYPE_BOOL",
    "UINT8": "TYPE_UINT8",
    "UINT16": "TYPE_UINT16",
    "UINT32": "TYPE_UINT32",
    "UINT64": "TYPE_UINT64",
    "INT8": "TYPE_INT8",
    "INT16": "TYPE_INT16",
    "INT32": "TYPE_INT32",
    "INT64": "TYPE_INT64",
    "FLOAT16": "TYPE_FP16",
    "FLOAT": "TYPE_FP32",
    "DOUBLE": "TYPE_FP64",
    "STRING": "TYPE_STRING",
}
# ModelConfigDataTypeToOnnxDataType(): the inverse; TYPE_BF16 (and anything else) is UNDEFINED.
_CONFIG_TO_ELEMENT = {v: k for k, v in _ELEMENT_TO_CONFIG.items()}
# TRITONSERVER_DataTypeString(ConvertFromOnnxDataType()): what "model provides TYPE_..." prints.
_ELEMENT_TO_SERVER = {**{k: v[len("TYPE_") :] for k, v in _ELEMENT_TO_CONFIG.items()}, "STRING": "BYTES"}
# OnnxDataTypeName() (used by the sequence-control messages); COMPLEX128 really prints COMPLEX64.
_ELEMENT_NAMES = {
    **{k: k for k in _ELEMENT_TO_CONFIG},
    "COMPLEX64": "COMPLEX64",
    "COMPLEX128": "COMPLEX64",
    "BFLOAT16": "BFLOAT16",
}


@dataclass(frozen=True)
class TensorInfo:
    """One input or output as ONNX Runtime reports it (the backend's OnnxTensorInfo)."""

    name: str
    element_type: str  # ONNX TensorProto.DataType name: FLOAT, STRING, BFLOAT16, ...
    dims: tuple[int, ...]  # -1 for symbolic or unknown dimensions; () for scalars and unknown rank
    kind: str = ONNX_TYPE_TENSOR  # ONNX_TYPE_SEQUENCE, ONNX_TYPE_MAP, ... for non-tensor values
    overridable: bool = False  # an initializer that is also a graph input (a default value)

    @property
    def data_type(self) -> str:
        """The config data type auto-complete writes (TYPE_INVALID when Triton has none)."""
        return _ELEMENT_TO_CONFIG.get(self.element_type, "TYPE_INVALID")

    @property
    def server_data_type(self) -> str:
        """How the backend's messages name the model's type ("TYPE_BYTES", "TYPE_<invalid>")."""
        return "TYPE_" + _ELEMENT_TO_SERVER.get(self.element_type, "<invalid>")

    @property
    def onnx_type_name(self) -> str:
        return _ELEMENT_NAMES.get(self.element_type, "UNDEFINED")


@dataclass(frozen=True)
class Signature:
    """A model file's inputs and outputs.

    `inputs` holds ORT's session inputs in index order followed by the overridable initializers
    (`overridable=True`). Iterating yields `(inputs, outputs)` so that `inputs, outputs = sig`
    works. `notes` explains a signature that could not be read the way Triton reads it.
    """

    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    source: str
    notes: tuple[str, ...] = ()

    def __iter__(self) -> Iterator[list[TensorInfo]]:
        return iter((list(self.inputs), list(self.outputs)))


# --- reading the signature ------------------------------------------------------------------------


def resolve_model_file(path: Path, model_name: str) -> Path:
    """ModelState::LoadModel: a directory named like the model file holds `model.onnx`."""
    path = Path(path)
    if path.is_dir():
        path = path / "model.onnx"
    if not path.exists():
        raise ModelError(
            f"unable to find '{path}' for model instance '{model_name}'", model=model_name, file=str(path)
        )
    return path


_ORT_ERROR = re.compile(r"\[ONNXRuntimeError\] : (\d+) : (\w+) : (.*)", re.DOTALL)


def _ort_error_parts(exc: BaseException) -> tuple[int | None, str | None, str]:
    match = _ORT_ERROR.match(str(exc))
    if match is None:
        return None, None, str(exc)
    return int(match.group(1)), match.group(2), match.group(3)


def read_signature(path: Path, model_name: str, op_libraries: Sequence[Path] = ()) -> Signature:
    """The signature the onnxruntime backend sees for `path` (model.onnx or its directory).

    An ONNX Runtime session is created exactly as the backend does it (from the path, so external
    data next to the model is found), on the CPU, with graph optimisations off: they do not change
    a session's inputs and outputs and cost time on large models. `op_libraries` are custom-op
    libraries (config `model_operations`) registered when they exist on this machine.

    Falls back to `read_declared_signature` (with a note) only where this machine cannot build the
    session but the target might: onnxruntime not installed, an operator without a CPU kernel, or
    an operator from a custom-op library that is not available here. Every other load failure is
    the backend's own error ("onnx runtime error <code>: <message>").
    """
    file = resolve_model_file(path, model_name)
    try:
        import onnxruntime as ort
    except ImportError:
        return _declared_with_note(
            file, model_name, "onnxruntime is not installed: the signature is the one the ONNX file declares"
        )

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.enable_cpu_mem_arena = False
    options.enable_mem_pattern = False
    options.log_severity_level = 3  # errors only: ORT warns about initializers listed as inputs
    try:
        for library in op_libraries:
            if Path(library).is_file():
                options.register_custom_ops_library(str(library))
        session = ort.InferenceSession(str(file), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - ORT's pybind error classes derive from Exception only
        code, code_name, message = _ort_error_parts(exc)
        if code_name == "NOT_IMPLEMENTED" or "is not a registered function/op" in message:
            return _declared_with_note(
                file,
                model_name,
                f"ONNX Runtime {ort.__version__} on this machine cannot create a CPU session for "
                f"'{file}' ({message.strip()}); the signature is the one the ONNX file declares",
            )
        prefix = f"onnx runtime error {code}: " if code is not None else "onnx runtime error: "
        raise ModelError(prefix + message, model=model_name, file=str(file)) from None

    def infos(args, overridable: bool) -> tuple[TensorInfo, ...]:
        return tuple(_from_ort_node_arg(a, overridable) for a in args)

    inputs = infos(session.get_inputs(), False) + infos(session.get_overridable_initializers(), True)
    outputs = infos(session.get_outputs(), False)
    return Signature(inputs, outputs, source=f"onnxruntime {ort.__version__}")


def _ort_dims(shape) -> tuple[int, ...]:
    # ORT reports symbolic dimensions by name and unknown ones as None; its C API (which the
    # backend uses) gives -1 for both.
    return tuple(d if isinstance(d, int) else WILDCARD_DIM for d in (shape or ()))


def _from_ort_node_arg(arg, overridable: bool) -> TensorInfo:
    type_str: str = arg.type  # "tensor(float)", "seq(tensor(float))", "optional(...)", ...
    head, _, rest = type_str.partition("(")
    kind = _ORT_KIND_NAMES.get(head, "ONNX_TYPE_UNKNOWN")
    element = rest[:-1].upper() if kind == ONNX_TYPE_TENSOR else "UNDEFINED"
    dims = _ort_dims(arg.shape) if kind == ONNX_TYPE_TENSOR else ()
    return TensorInfo(arg.name, element, dims, kind, overridable)


def _declared_with_note(file: Path, model_name: str, note: str) -> Signature:
    signature = read_declared_signature(file, model_name)
    return Signature(signature.inputs, signature.outputs, signature.source, (*signature.notes, note))


def read_declared_signature(path: Path, model_name: str) -> Signature:
    """The signature without ONNX Runtime, following ORT's rules with the `onnx` package.

    Inputs are the graph inputs that are not initializers; initializers that are also graph
    inputs are overridable when the IR version is 4 or more. Output dimensions the file leaves
    symbolic or unknown are filled from ONNX shape inference, as ORT's graph resolution fills them
    (ORT's own inference also covers its contrib operators, which this cannot).
    """
    import onnx  # build-time only: never imported by the runtime

    file = resolve_model_file(path, model_name)
    try:
        model = onnx.load(str(file), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - DecodeError, OSError, onnx's own errors: all mean unreadable
        raise ModelError(
            f"failed to load ONNX model '{file}' for model '{model_name}': {exc}",
            model=model_name,
            file=str(file),
        ) from None
    graph = model.graph
    initializers = {init.name for init in graph.initializer}

    inferred: dict[str, object] = {}
    try:
        inferred_graph = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
        inferred = {v.name: v.type for v in inferred_graph.output}
    except Exception:  # noqa: BLE001, S110 - best effort, as ORT's inference is for unknown ops
        pass

    inputs = [_from_onnx_type(v.name, v.type, False) for v in graph.input if v.name not in initializers]
    if model.ir_version >= 4:
        inputs += [_from_onnx_type(v.name, v.type, True) for v in graph.input if v.name in initializers]
    outputs = [
        _from_onnx_type(v.name, _merge_shapes(v.type, inferred.get(v.name)), False) for v in graph.output
    ]
    return Signature(tuple(inputs), tuple(outputs), source=f"onnx {onnx.__version__} (declared)")


def _merge_shapes(declared, inferred):
    """onnx's mergeInShapeInfo as ORT applies it to graph outputs: a known value wins."""
    if (
        inferred is None
        or declared.WhichOneof("value") != "tensor_type"
        or inferred.WhichOneof("value") != "tensor_type"
    ):
        return declared
    source = inferred.tensor_type
    if not source.HasField("shape"):
        return declared
    merged = type(declared)()
    merged.CopyFrom(declared)
    target = merged.tensor_type
    if not target.HasField("shape"):
        target.shape.CopyFrom(source.shape)
        return merged
    if len(target.shape.dim) != len(source.shape.dim):
        return declared
    for t, s in zip(target.shape.dim, source.shape.dim):
        if s.HasField("dim_value") and not t.HasField("dim_value"):
            t.dim_value = s.dim_value
    return merged


def _from_onnx_type(name: str, type_proto, overridable: bool) -> TensorInfo:
    import onnx

    which = type_proto.WhichOneof("value")
    kind = _ONNX_VALUE_KIND_NAMES.get(which, "ONNX_TYPE_UNKNOWN")
    if kind != ONNX_TYPE_TENSOR:
        return TensorInfo(name, "UNDEFINED", (), kind, overridable)
    tensor = type_proto.tensor_type
    element = onnx.TensorProto.DataType.Name(tensor.elem_type)
    dims: tuple[int, ...] = ()
    if tensor.HasField("shape"):
        dims = tuple(d.dim_value if d.HasField("dim_value") else WILDCARD_DIM for d in tensor.shape.dim)
    return TensorInfo(name, element, dims, kind, overridable)


# --- std::unordered_map iteration order -----------------------------------------------------------
#
# The backend keeps tensor infos in `OnnxTensorInfoMap = std::unordered_map<std::string, ...>`
# (src/onnxruntime_utils.h), fills it in ORT index order and AutoCompleteIO writes the config's
# inputs/outputs by iterating it. Triton is built with GCC's libstdc++, so the order Triton writes
# is libstdc++'s: std::hash<std::string> (_Hash_bytes, seed 0xc70f6907), prime bucket counts from
# _Prime_rehash_policy, and new nodes placed at the front of their bucket, or at the front of the
# whole list when the bucket is empty. tests/test_onnx_autocomplete.py checks this against g++.

_MASK64 = (1 << 64) - 1
_MURMUR_MUL = (0xC6A4A793 << 32) + 0x5BD1E995
_STRING_HASH_SEED = 0xC70F6907

# Bucket counts an unordered_map with max_load_factor 1 goes through while elements are
# inserted one at a time: the first insert allocates 13 buckets, then an insert that would make
# size > bucket_count rehashes to the next entry. Recorded from libstdc++'s _Prime_rehash_policy
# (GCC >= 10; the same code in the GCC 11 that builds Triton 24.10).
_BUCKET_COUNTS = (
    13,
    29,
    59,
    127,
    257,
    541,
    1109,
    2357,
    5087,
    10273,
    20753,
    42043,
    85229,
    172933,
    351061,
    712697,
    1447153,
    2938679,
    5967347,
    12117689,
    24607243,
    49969847,
    101473717,
)


def _shift_mix(v: int) -> int:
    return v ^ (v >> 47)


def libstdcxx_string_hash(text: str) -> int:
    """std::hash<std::string> of libstdc++ on 64-bit Linux (_Hash_bytes, MurmurHash64A-like)."""
    data = text.encode("utf-8")
    length = len(data)
    aligned = length & ~7
    h = (_STRING_HASH_SEED ^ ((length * _MURMUR_MUL) & _MASK64)) & _MASK64
    for i in range(0, aligned, 8):
        word = int.from_bytes(data[i : i + 8], "little")
        mixed = (_shift_mix((word * _MURMUR_MUL) & _MASK64) * _MURMUR_MUL) & _MASK64
        h = ((h ^ mixed) * _MURMUR_MUL) & _MASK64
    if length & 7:
        h = ((h ^ int.from_bytes(data[aligned:], "little")) * _MURMUR_MUL) & _MASK64
    h = (_shift_mix(h) * _MURMUR_MUL) & _MASK64
    return _shift_mix(h)


def unordered_map_order(names: Sequence[str]) -> list[str]:
    """The iteration order of a libstdc++ `std::unordered_map<std::string, T>` after `emplace`
    of `names` (distinct) in the given order."""
    if len(names) > _BUCKET_COUNTS[-1]:
        raise ValueError("too many names")
    codes = {n: libstdcxx_string_hash(n) for n in names}
    nxt: dict[str | None, str | None] = {None: None}  # None is the list head (_M_before_begin)
    buckets: list[str | None | bool] = []  # bucket -> node before its first node; False = empty

    def rehash(size: int) -> None:
        nonlocal buckets
        node = nxt[None]
        nxt[None] = None
        new: list[str | None | bool] = [False] * size
        begin_bucket = 0
        while node is not None:
            following = nxt[node]
            bucket = codes[node] % size
            if new[bucket] is False:
                nxt[node] = nxt[None]
                nxt[None] = node
                new[bucket] = None
                if nxt[node] is not None:
                    new[begin_bucket] = node
                begin_bucket = bucket
            else:
                before = new[bucket]
                nxt[node] = nxt[before]
                nxt[before] = node
            node = following
        buckets = new

    for size_after, name in enumerate(names, 1):
        if size_after > len(buckets):
            rehash(_BUCKET_COUNTS[bisect.bisect_left(_BUCKET_COUNTS, size_after)])
        bucket = codes[name] % len(buckets)
        before = buckets[bucket]
        if before is not False:
            nxt[name] = nxt[before]
            nxt[before] = name
        else:
            nxt[name] = nxt[None]
            nxt[None] = name
            if nxt[name] is not None:
                buckets[codes[nxt[name]] % len(buckets)] = name
            buckets[bucket] = None

    order = []
    node = nxt[None]
    while node is not None:
        order.append(node)
        node = nxt[node]
    return order


# --- auto-complete --------------------------------------------------------------------------------


def _require_tensors(infos: Sequence[TensorInfo]) -> None:
    """InputOutputInitializerInfos() refuses non-tensor values while it reads them."""
    for info in infos:
        if info.kind != ONNX_TYPE_TENSOR:
            raise ModelError(
                f"Unsupported ONNX Type '{info.kind}' for I/O '{info.name}', expected '{ONNX_TYPE_TENSOR}'."
            )


def _session_inputs(inputs: Sequence[TensorInfo]) -> list[TensorInfo]:
    return [t for t in inputs if not t.overridable]


def autocomplete(
    config: Message,
    inputs: Sequence[TensorInfo],
    outputs: Sequence[TensorInfo],
    default_max_batch_size: int = DEFAULT_MAX_BATCH_SIZE,
) -> None:
    """ModelState::AutoCompleteConfig: fill max_batch_size, dynamic_batching, inputs, outputs."""
    input_count = len(config.input) + len(config.batch_input)
    output_count = len(config.output)
    if input_count > 0 and output_count > 0:
        return  # "skipping model configuration auto-complete ...: inputs and outputs already specified"

    session_inputs = _session_inputs(inputs)
    _require_tensors(session_inputs)
    _require_tensors(outputs)

    # AutoCompleteMaxBatch: every input and output needs a variable first dimension.
    can_batch = all(len(t.dims) > 0 and t.dims[0] == WILDCARD_DIM for t in [*session_inputs, *outputs])
    if can_batch:
        if config.max_batch_size == 0:
            config.max_batch_size = max(default_max_batch_size, 0)
        has_scheduler = config.HasField("sequence_batching") or config.HasField("dynamic_batching")
        if config.max_batch_size > 1 and not has_scheduler:
            config.dynamic_batching.SetInParent()
    elif config.max_batch_size != 0:
        raise ModelError(
            f"autofill failed for model '{config.name}': model does not support batching while non-zero "
            "max_batch_size is specified",
            hint="max_batch_size",
        )

    if input_count == 0:
        _autocomplete_io(config, config.input, session_inputs)
    if output_count == 0:
        _autocomplete_io(config, config.output, list(outputs))


def _autocomplete_io(config: Message, target, infos: list[TensorInfo]) -> None:
    """AutoCompleteIO: one entry per tensor, in the backend's unordered_map order."""
    by_name = {t.name: t for t in infos}
    del target[:]
    for name in unordered_map_order([t.name for t in infos]):
        info = by_name[name]
        io = target.add()
        io.name = info.name
        io.data_type = DataType.Value(info.data_type)
        dims = list(info.dims[1:] if config.max_batch_size > 0 else info.dims)
        if not dims:
            # A scalar: dims [1], and an empty reshape when batching (a batched scalar).
            dims = [1]
            if config.max_batch_size > 0:
                io.reshape.SetInParent()
        io.dims.extend(dims)


# --- config vs model ------------------------------------------------------------------------------


def _shape(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def compare_dims(
    model_name: str,
    tensor: str,
    model_shape: Sequence[int],
    dims: Sequence[int],
    max_batch_size: int,
    compare_exact: bool,
) -> None:
    """CompareDimsSupported (src/onnxruntime_utils.cc). A model dimension of -1 matches any
    configured dimension unless `compare_exact` (outputs); a configured -1 only matches -1."""
    model_shape = list(model_shape)
    dims = list(dims)
    hint = f'"{tensor}"'
    if max_batch_size > 0:
        if not model_shape or model_shape[0] != WILDCARD_DIM:
            raise ModelError(
                f"model '{model_name}', tensor '{tensor}': for the model to support batching the shape "
                "should have at least 1 dimension and the first dimension must be -1; but shape expected "
                f"by the model is {_shape(model_shape)}",
                hint=hint,
            )
        full = [WILDCARD_DIM, *dims]
        if not _dims_match(model_shape, full, compare_exact):
            raise ModelError(
                f"model '{model_name}', tensor '{tensor}': the model expects {len(model_shape)} dimensions "
                f"(shape {_shape(model_shape)}) but the model configuration specifies {len(full)} dimensions "
                "(an initial batch dimension because max_batch_size > 0 followed by the explicit tensor "
                f"shape, making complete shape {_shape(full)})",
                hint=hint,
            )
    elif not _dims_match(model_shape, dims, compare_exact):
        raise ModelError(
            f"model '{model_name}', tensor '{tensor}': the model expects {len(model_shape)} dimensions "
            f"(shape {_shape(model_shape)}) but the model configuration specifies {len(dims)} dimensions "
            f"(shape {_shape(dims)})",
            hint=hint,
        )


def _dims_match(model_shape: list[int], dims: list[int], compare_exact: bool) -> bool:
    if len(model_shape) != len(dims):
        return False
    return all(m == d for m, d in zip(model_shape, dims) if compare_exact or m != WILDCARD_DIM)


def _check_scalar(model_name: str, name: str, dims: Sequence[int]) -> None:
    if any(d != 1 for d in dims):
        raise ModelError(
            f"unable to load model '{model_name}', scalar tensor '{name}', should only provide 1 in the model "
            f"configuration when the model doesn't support batching. Model configuration provided: "
            f"{_shape(dims)}.",
            hint=f'"{name}"',
        )


def _configured_dims(io: Message) -> list[int]:
    """A reshape, when given, is what the model sees."""
    return list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)


@dataclass
class _Control:
    name: str
    data_type: str


_BOOLEAN_CONTROLS = ("CONTROL_SEQUENCE_START", "CONTROL_SEQUENCE_END", "CONTROL_SEQUENCE_READY")
_TYPED_CONTROLS = ("CONTROL_SEQUENCE_CORRID",)


def _sequence_control(config: Message, kind: str, typed: bool) -> _Control | None:
    """backend_common's GetBooleanSequenceControlProperties / GetTypedSequenceControlProperties."""
    name = config.name
    kinds = pb2.ModelSequenceBatching.Control.Kind
    seen_tensors: set[str] = set()
    found: _Control | None = None
    for control_input in config.sequence_batching.control_input:
        tensor = control_input.name
        if not tensor:
            raise ModelError(f"sequence batching control tensor must have a name for {name}")
        if tensor in seen_tensors:
            raise ModelError(
                f"sequence batching control tensor '{tensor}' is specified for multiple control kinds for {name}"
            )
        seen_tensors.add(tensor)
        for control in control_input.control:
            if kinds.Name(control.kind) != kind:
                continue
            if found is not None:
                raise ModelError(f"sequence batching specifies multiple {kind} tensors for {name}")
            given = [
                label
                for label, values in (
                    ("int32", control.int32_false_true),
                    ("fp32", control.fp32_false_true),
                    ("bool", control.bool_false_true),
                )
                if len(values) > 0
            ]
            if typed:
                if given:
                    raise ModelError(
                        "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or "
                        f"'bool_false_true' for {kind} for {name}"
                    )
                found = _Control(tensor, DataType.Name(control.data_type))
                continue
            if not given:
                raise ModelError(
                    "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
                    f"'bool_false_true' for {kind} for {name}"
                )
            if len(given) > 1:
                raise ModelError(
                    "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' "
                    f"and 'bool_false_true' for {kind} for {name}"
                )
            values = {
                "int32": control.int32_false_true,
                "fp32": control.fp32_false_true,
                "bool": control.bool_false_true,
            }
            if len(values[given[0]]) != 2:
                raise ModelError(
                    f"sequence batching control '{given[0]}_false_true' must have exactly 2 entries for {kind} "
                    f"for {name}"
                )
            found = _Control(
                tensor, {"int32": "TYPE_INT32", "fp32": "TYPE_FP32", "bool": "TYPE_BOOL"}[given[0]]
            )
    return found


def _validate_sequence_control(config: Message, control: _Control, session_inputs: list[TensorInfo]) -> None:
    """ValidateBooleanSequenceControl / ValidateTypedSequenceControl."""
    name = config.name
    _require_tensors(session_inputs)
    info = {t.name: t for t in session_inputs}.get(control.name)
    if info is None:
        raise ModelError(
            f"configuration specified sequence control '{control.name}', but model does not provide that input"
        )
    debatched = list(info.dims[1:] if config.max_batch_size > 0 else info.dims)
    if debatched != [1]:
        raise ModelError(
            f"unable to load model '{name}', sequence control '{control.name}' in model has dims "
            f"{_shape(debatched)} but dims [1] is expected"
        )
    if _CONFIG_TO_ELEMENT.get(control.data_type) != info.element_type:
        raise ModelError(
            f"unable to load model '{name}', sequence control '{control.name}', the model expects data-type "
            f"{info.onnx_type_name} but the model configuration specifies data-type {control.data_type}"
        )


def validate_against_model(
    config: Message, inputs: Sequence[TensorInfo], outputs: Sequence[TensorInfo]
) -> None:
    """The checks of the backend's ModelInstanceState constructor, in its order."""
    session_inputs = _session_inputs(inputs)

    expected_inputs = (
        len(config.input) - sum(1 for io in config.input if io.optional) + len(config.batch_input)
    )
    if config.HasField("sequence_batching"):
        for kind in (*_BOOLEAN_CONTROLS, *_TYPED_CONTROLS):
            control = _sequence_control(config, kind, typed=kind in _TYPED_CONTROLS)
            if control is not None:
                _validate_sequence_control(config, control, session_inputs)
                expected_inputs += 1
        expected_inputs += len(config.sequence_batching.state)

    _validate_inputs(config, session_inputs, [t for t in inputs if t.overridable], expected_inputs)
    _validate_outputs(config, list(outputs))


def _validate_inputs(
    config: Message, session_inputs: list[TensorInfo], overridable: list[TensorInfo], expected: int
) -> None:
    """ValidateInputs."""
    name = config.name
    _require_tensors(session_inputs)
    _require_tensors(overridable)
    if len(session_inputs) != expected:
        raise ModelError(
            f"unable to load model '{name}', configuration expects {expected} inputs, model provides "
            f"{len(session_inputs)}",
            hint="input",
        )
    # Overridable initializers may be requested as inputs too.
    infos = {t.name: t for t in [*session_inputs, *overridable]}

    for io in config.input:
        hint = f'"{io.name}"'
        if io.optional and config.max_batch_size != 0:
            raise ModelError(
                f"unable to load model '{name}', optional input '{io.name}' is not supported for models that "
                "support batching",
                hint=hint,
            )
        info = infos.get(io.name)
        if info is None:
            raise ModelError(
                f"unexpected inference input '{io.name}', allowed inputs are: {', '.join(sorted(infos))}",
                hint=hint,
            )
        _check_data_type(config, io, info, "input")
        dims = _configured_dims(io)
        if io.optional and io.allow_ragged_batch:
            raise ModelError(
                f"unable to load model '{name}', configuration expects model provides input with shape [-1] for "
                f"ragged input '{io.name}', which is not supported for optional input",
                hint=hint,
            )
        if io.allow_ragged_batch:
            if list(info.dims) != [WILDCARD_DIM]:
                raise ModelError(
                    f"unable to load model '{name}', configuration expects model provides input with shape [-1]  "
                    f"for ragged input '{io.name}', model provides {_shape(info.dims)}",
                    hint=hint,
                )
        elif info.dims:
            compare_dims(name, io.name, info.dims, dims, config.max_batch_size, compare_exact=False)
        else:
            _check_scalar(name, io.name, dims)


def _validate_outputs(config: Message, outputs: list[TensorInfo]) -> None:
    """ValidateOutputs. (Its check of sequence_batching.state outputs never runs in Triton: it is
    guarded by `if (sequence_batching.MemberAsArray("state", ...))`, true only on error.)"""
    name = config.name
    _require_tensors(outputs)
    infos = {t.name: t for t in outputs}
    batch_outputs = {target for bo in config.batch_output for target in bo.target_name}
    for io in config.output:
        info = infos.get(io.name)
        if info is None:
            raise ModelError(
                f"unexpected inference output '{io.name}', allowed outputs are: {', '.join(sorted(infos))}",
                hint=f'"{io.name}"',
            )
        _check_data_type(config, io, info, "output")
        if io.name in batch_outputs:
            continue  # a batch output's shape need not match the model
        dims = _configured_dims(io)
        if info.dims:
            compare_dims(name, io.name, info.dims, dims, config.max_batch_size, compare_exact=True)
        else:
            _check_scalar(name, io.name, dims)


def _check_data_type(config: Message, io: Message, info: TensorInfo, kind: str) -> None:
    configured = DataType.Name(io.data_type)
    element = _CONFIG_TO_ELEMENT.get(configured)
    if element is None:
        raise ModelError(
            f"unsupported datatype {configured} for {kind} '{io.name}' for model '{config.name}'",
            hint=f'"{io.name}"',
        )
    if element != info.element_type:
        raise ModelError(
            f"unable to load model '{config.name}', configuration expects datatype {configured} for {kind} "
            f"'{io.name}', model provides {info.server_data_type}",
            hint=f'"{io.name}"',
        )


__all__ = [
    "DEFAULT_MAX_BATCH_SIZE",
    "Signature",
    "TensorInfo",
    "autocomplete",
    "compare_dims",
    "libstdcxx_string_hash",
    "read_declared_signature",
    "read_signature",
    "resolve_model_file",
    "unordered_map_order",
    "validate_against_model",
]
