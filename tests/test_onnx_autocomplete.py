"""ONNX auto-complete and config-vs-model checks, as Triton's onnxruntime backend does them.

Signatures come from real ONNX Runtime sessions over tiny models built with onnx.helper; the
checks run both directly and through the whole compiler. Expected messages are the backend's
(onnxruntime_backend src/onnxruntime.cc, src/onnxruntime_utils.cc; backend src/backend_common.cc),
see docs/onnx-autocomplete.md.
"""

from __future__ import annotations

import random
import shutil
import string
import subprocess
import sys

import model_builders as mb
import onnxruntime as ort
import pytest
from conftest import write_config
from onnx import TensorProto

from toolkit.repository.compile import compile_repository
from toolkit.repository.errors import ModelError
from toolkit.repository.model_config import parse_config_text, to_triton_json
from toolkit.repository.onnx_autocomplete import (
    TensorInfo,
    autocomplete,
    libstdcxx_string_hash,
    read_declared_signature,
    read_signature,
    unordered_map_order,
    validate_against_model,
)

FP32 = "FLOAT"


def config(text: str = ""):
    return parse_config_text('name: "m"\nbackend: "onnxruntime"\n' + text)


def tensor(name: str, dims, element: str = FP32, **kw) -> TensorInfo:
    return TensorInfo(name, element, tuple(dims), **kw)


def error_of(fn, *args, **kwargs) -> str:
    with pytest.raises(ModelError) as info:
        fn(*args, **kwargs)
    return info.value.message


# --- libstdc++ unordered_map order ----------------------------------------------------------------

# Orders printed by a C++ program (g++ 12.2, libstdc++) that emplaces the names into a
# std::unordered_map<std::string, int> in list order and iterates it, as OnnxTensorInfoMap is
# filled and read by the backend. The 16- and 40-name lists cross the 13- and 29-bucket rehashes.
LIBSTDCXX_ORDERS = [
    (["INPUT0", "INPUT1"], ["INPUT1", "INPUT0"]),
    (["OUTPUT0", "OUTPUT1"], ["OUTPUT1", "OUTPUT0"]),
    (["input_ids", "attention_mask", "token_type_ids"], ["token_type_ids", "attention_mask", "input_ids"]),
    (["a", "b", "c", "d", "e"], ["e", "c", "b", "d", "a"]),
    (["x"], ["x"]),
    (
        [f"input_{i}" for i in range(16)],
        [
            "input_0",
            "input_4",
            "input_13",
            "input_10",
            "input_2",
            "input_9",
            "input_15",
            "input_8",
            "input_5",
            "input_1",
            "input_3",
            "input_6",
            "input_14",
            "input_7",
            "input_11",
            "input_12",
        ],
    ),
    (
        [f"t{i}" for i in range(40)],
        [
            "t39",
            "t37",
            "t36",
            "t35",
            "t34",
            "t31",
            "t30",
            "t11",
            "t8",
            "t12",
            "t33",
            "t29",
            "t24",
            "t9",
            "t5",
            "t6",
            "t4",
            "t2",
            "t15",
            "t1",
            "t27",
            "t10",
            "t7",
            "t38",
            "t13",
            "t16",
            "t0",
            "t25",
            "t32",
            "t14",
            "t17",
            "t3",
            "t26",
            "t28",
            "t18",
            "t22",
            "t23",
            "t20",
            "t19",
            "t21",
        ],
    ),
]


@pytest.mark.parametrize(("names", "expected"), LIBSTDCXX_ORDERS)
def test_unordered_map_order_matches_recorded_libstdcxx(names, expected):
    assert unordered_map_order(names) == expected


def test_string_hash_is_libstdcxx_hash_bytes():
    # std::hash<std::string>{}(s), printed by g++ 12.2 / libstdc++ (x86-64): 0-, 6- and 14-byte keys
    assert libstdcxx_string_hash("") == 6142509188972423790
    assert libstdcxx_string_hash("INPUT0") == 2526639154658133543
    assert libstdcxx_string_hash("attention_mask") == 10602345453166258175


_CXX_PROGRAM = r"""
#include <functional>
#include <iostream>
#include <string>
#include <unordered_map>
// No argument: emplace each line into an unordered_map and print its iteration order.
// Any argument: print std::hash<std::string> of each line.
int main(int argc, char** argv) {
  std::string line;
  if (argc > 1) {
    while (std::getline(std::cin, line)) std::cout << std::hash<std::string>{}(line) << "\n";
    return 0;
  }
  std::unordered_map<std::string, int> m;
  int i = 0;
  while (std::getline(std::cin, line)) m.emplace(line, i++);
  for (const auto& kv : m) std::cout << kv.first << "\n";
}
"""


@pytest.fixture(scope="module")
def libstdcxx_oracle(tmp_path_factory):
    build = tmp_path_factory.mktemp("cxx") / "oracle"
    source = build.with_suffix(".cc")
    source.write_text(_CXX_PROGRAM)
    subprocess.run(["g++", "-O1", "-o", str(build), str(source)], check=True, timeout=300)

    def run(names: list[str], *args: str) -> list[str]:
        out = subprocess.run(
            [str(build), *args],
            input="\n".join(names) + "\n",
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        return out.stdout.splitlines()

    return run


@pytest.mark.skipif(
    shutil.which("g++") is None,
    reason="the live cross-check needs g++ (the recorded orders above always run)",
)
def test_unordered_map_order_matches_live_libstdcxx(libstdcxx_oracle):
    rng = random.Random(7)
    alphabet = string.ascii_letters + string.digits + "_:./-é"
    for size in (2, 3, 12, 13, 14, 29, 30, 59, 60, 200):
        names = list(
            dict.fromkeys(
                "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))) for _ in range(size)
            )
        )
        assert unordered_map_order(names) == libstdcxx_oracle(names), size
        assert [str(libstdcxx_string_hash(n)) for n in names] == libstdcxx_oracle(names, "hash")


# --- reading the signature ------------------------------------------------------------------------


def test_signature_of_add_sub(tmp_path):
    sig = read_signature(mb.add_sub(tmp_path / "m.onnx"), "m")
    assert sig.source == f"onnxruntime {ort.__version__}" and sig.notes == ()
    assert [(t.name, t.data_type, t.dims) for t in sig.inputs] == [
        ("INPUT0", "TYPE_FP32", (-1, 16)),
        ("INPUT1", "TYPE_FP32", (-1, 16)),
    ]
    assert [t.name for t in sig.outputs] == ["OUTPUT0", "OUTPUT1"]
    inputs, outputs = sig  # unpacks like a pair
    assert inputs == list(sig.inputs) and outputs == list(sig.outputs)


def test_initializer_backed_input_is_an_overridable_initializer_not_an_input(tmp_path):
    sig = read_signature(mb.initializer_input(tmp_path / "m.onnx", ir_version=8), "m")
    assert [(t.name, t.overridable) for t in sig.inputs] == [("X", False), ("W", True)]
    # what ORT itself says
    session = ort.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    assert [a.name for a in session.get_inputs()] == ["X"]
    assert [a.name for a in session.get_overridable_initializers()] == ["W"]


def test_before_ir4_initializers_are_constants(tmp_path):
    sig = read_signature(mb.initializer_input(tmp_path / "m.onnx", ir_version=3), "m")
    assert [t.name for t in sig.inputs] == ["X"]


def test_symbolic_unknown_dims_and_unknown_rank(tmp_path):
    sig = read_signature(mb.passthrough(tmp_path / "a.onnx", TensorProto.STRING, [None, "seq", 3]), "m")
    assert sig.inputs[0].dims == (-1, -1, 3) and sig.inputs[0].data_type == "TYPE_STRING"
    sig = read_signature(mb.passthrough(tmp_path / "b.onnx", TensorProto.FLOAT, None), "m")
    assert sig.inputs[0].dims == () and sig.outputs[0].dims == ()  # no rank: ORT reports 0 dimensions


def test_output_shapes_are_the_ones_ort_infers(tmp_path):
    # declared [q, r], but ORT's graph resolution knows [N, 16]: Triton sees [-1, 16]
    path = mb.refined_output(tmp_path / "m.onnx")
    assert read_signature(path, "m").outputs[0].dims == (-1, 16)
    assert read_declared_signature(path, "m").outputs[0].dims == (-1, 16)


def test_types_without_a_triton_equivalent(tmp_path):
    sig = read_signature(mb.passthrough(tmp_path / "m.onnx", TensorProto.BFLOAT16, ["N", 2]), "m")
    info = sig.inputs[0]
    assert (info.element_type, info.data_type, info.server_data_type) == (
        "BFLOAT16",
        "TYPE_INVALID",
        "TYPE_<invalid>",
    )
    sig = read_signature(mb.sequence_input(tmp_path / "s.onnx"), "m")
    assert sig.inputs[0].kind == "ONNX_TYPE_SEQUENCE"


def test_model_directory_with_external_data(tmp_path):
    directory = mb.external_data_directory(tmp_path / "1" / "model.onnx")
    sig = read_signature(directory, "m")
    assert [(t.name, t.dims) for t in sig.inputs] == [("INPUT0", (-1, 64))]
    (directory / "weights.bin").unlink()
    message = error_of(read_signature, directory, "m")
    assert message.startswith("onnx runtime error 1: ") and "weights.bin" in message


def test_directory_without_model_onnx(tmp_path):
    (tmp_path / "model.onnx").mkdir()
    message = error_of(read_signature, tmp_path / "model.onnx", "m")
    assert message == f"unable to find '{tmp_path / 'model.onnx' / 'model.onnx'}' for model instance 'm'"


def test_corrupt_and_empty_files_give_ort_errors(tmp_path):
    (tmp_path / "bad.onnx").write_bytes(b"this is not protobuf \x00\xff")
    assert error_of(read_signature, tmp_path / "bad.onnx", "m") == (
        f"onnx runtime error 7: Load model from {tmp_path / 'bad.onnx'} failed:Protobuf parsing failed."
    )
    (tmp_path / "empty.onnx").write_bytes(b"")
    assert error_of(read_signature, tmp_path / "empty.onnx", "m").startswith("onnx runtime error 2: ")
    assert "failed to load ONNX model" in error_of(read_declared_signature, tmp_path / "bad.onnx", "m")


def test_custom_op_model_falls_back_to_declared_signature_with_a_note(tmp_path):
    sig = read_signature(mb.custom_op(tmp_path / "m.onnx"), "m")
    assert sig.source.endswith("(declared)")
    assert [(t.name, t.dims) for t in sig.inputs] == [("IN", (-1, 8))]
    assert len(sig.notes) == 1 and "com.example:MyOp" in sig.notes[0] and "declares" in sig.notes[0]


def test_without_onnxruntime_the_declared_signature_is_used(tmp_path, monkeypatch):
    # onnxruntime is installed here; its absence (a build host without the cpu/gpu extra) can only
    # be simulated, by making `import onnxruntime` fail.
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    sig = read_signature(mb.refined_output(tmp_path / "m.onnx"), "m")
    assert sig.source.endswith("(declared)") and "onnxruntime is not installed" in sig.notes[0]
    assert sig.outputs[0].dims == (-1, 16)


@pytest.mark.parametrize(
    "build",
    [
        lambda p: mb.add_sub(p),
        lambda p: mb.initializer_input(p, 8),
        lambda p: mb.initializer_input(p, 3),
        lambda p: mb.passthrough(p, TensorProto.STRING, [None, "x", 3]),
        lambda p: mb.passthrough(p, TensorProto.FLOAT, None),
        lambda p: mb.refined_output(p),
        lambda p: mb.sequence_input(p),
        lambda p: mb.matmul_relu(p),
    ],
)
def test_declared_signature_agrees_with_ort_on_plain_models(tmp_path, build):
    path = build(tmp_path / "m.onnx")
    ort_sig, declared = read_signature(path, "m"), read_declared_signature(path, "m")
    assert (ort_sig.inputs, ort_sig.outputs) == (declared.inputs, declared.outputs)


# --- auto-complete --------------------------------------------------------------------------------


def completed(text: str, inputs, outputs, **kw) -> dict:
    cfg = config(text)
    autocomplete(cfg, inputs, outputs, **kw)
    return to_triton_json(cfg)


BATCHING = (
    [tensor("INPUT0", [-1, 16]), tensor("INPUT1", [-1, 16])],
    [tensor("OUTPUT0", [-1, 16]), tensor("OUTPUT1", [-1, 16])],
)


def test_batching_model_without_config_gets_default_max_batch_size_and_dynamic_batching():
    doc = completed("", *BATCHING)
    assert doc["max_batch_size"] == 4
    assert doc["dynamic_batching"]["preferred_batch_size"] == []  # filled by normalisation later
    assert [(i["name"], i["data_type"], i["dims"]) for i in doc["input"]] == [
        ("INPUT1", "TYPE_FP32", [16]),
        ("INPUT0", "TYPE_FP32", [16]),  # unordered_map order, as Triton
    ]
    assert [o["name"] for o in doc["output"]] == ["OUTPUT1", "OUTPUT0"]
    assert "reshape" not in doc["input"][0]


def test_non_batching_model_keeps_max_batch_size_0_and_full_dims():
    doc = completed("", [tensor("X", [1, 16])], [tensor("Y", [1, 16])])
    assert doc["max_batch_size"] == 0 and "dynamic_batching" not in doc
    assert doc["input"][0]["dims"] == [1, 16] and doc["output"][0]["dims"] == [1, 16]


def test_one_fixed_output_prevents_batching():
    doc = completed("", [tensor("X", [-1, 16])], [tensor("Y", [-1, 16]), tensor("Z", [3])])
    assert doc["max_batch_size"] == 0 and doc["input"][0]["dims"] == [-1, 16]


def test_configured_max_batch_size_is_kept_and_enables_dynamic_batching():
    doc = completed("max_batch_size: 8", *BATCHING)
    assert doc["max_batch_size"] == 8 and "dynamic_batching" in doc


def test_max_batch_size_1_adds_no_dynamic_batching():
    doc = completed("max_batch_size: 1", *BATCHING)
    assert doc["max_batch_size"] == 1 and "dynamic_batching" not in doc


def test_existing_scheduler_is_kept():
    doc = completed("dynamic_batching { max_queue_delay_microseconds: 100 }", *BATCHING)
    assert doc["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    doc = completed("sequence_batching { }", *BATCHING)
    assert "dynamic_batching" not in doc and doc["max_batch_size"] == 4


def test_default_max_batch_size_is_the_backend_config():
    doc = completed("", *BATCHING, default_max_batch_size=0)
    assert doc["max_batch_size"] == 0 and "dynamic_batching" not in doc
    assert doc["input"][0]["dims"] == [-1, 16]
    assert completed("", *BATCHING, default_max_batch_size=32)["max_batch_size"] == 32


def test_max_batch_size_for_a_model_that_cannot_batch():
    assert error_of(
        autocomplete, config("max_batch_size: 8"), [tensor("X", [1, 16])], [tensor("Y", [1, 16])]
    ) == (
        "autofill failed for model 'm': model does not support batching while non-zero max_batch_size is specified"
    )


def test_scalars():
    # batching with a tensor that is only the batch dimension: dims [1] + empty reshape
    doc = completed("", [tensor("X", [-1])], [tensor("Y", [-1, 2])])
    assert doc["input"][0]["dims"] == [1] and doc["input"][0]["reshape"] == {"shape": []}
    # a true scalar (or unknown rank) cannot batch: dims [1], no reshape
    doc = completed("", [tensor("X", [])], [tensor("Y", [])])
    assert doc["max_batch_size"] == 0 and doc["input"][0]["dims"] == [1] and "reshape" not in doc["input"][0]


def test_only_inputs_configured_completes_outputs_and_still_decides_batching():
    doc = completed('input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]', *BATCHING)
    assert [i["name"] for i in doc["input"]] == ["INPUT0"]  # left as written
    assert [o["name"] for o in doc["output"]] == ["OUTPUT1", "OUTPUT0"]
    assert doc["max_batch_size"] == 4 and "dynamic_batching" in doc


def test_only_outputs_configured_completes_inputs():
    doc = completed(
        'max_batch_size: 2 output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]', *BATCHING
    )
    assert [i["name"] for i in doc["input"]] == ["INPUT1", "INPUT0"] and len(doc["output"]) == 1


def test_batch_input_counts_as_configured_input():
    text = (
        'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "INPUT0" data_type: TYPE_FP32 source_input: "INPUT1" } ]'
        ' output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]'
    )
    doc = completed(text, *BATCHING)
    assert doc["input"] == [] and doc["max_batch_size"] == 0  # nothing auto-completed at all


def test_inputs_and_outputs_configured_means_no_auto_complete_at_all():
    text = (
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, 16 ] } ]'
        ' output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, 16 ] } ]'
    )
    doc = completed(text, *BATCHING)
    assert doc["max_batch_size"] == 0 and "dynamic_batching" not in doc and len(doc["input"]) == 1


def test_overridable_initializers_are_not_auto_completed():
    doc = completed("", [tensor("X", [-1, 4]), tensor("W", [4], overridable=True)], [tensor("Y", [-1, 4])])
    assert [i["name"] for i in doc["input"]] == ["X"] and doc["max_batch_size"] == 4


def test_string_and_unsupported_types():
    doc = completed(
        "", [tensor("T", [-1], "STRING"), tensor("B", [-1, 2], "BFLOAT16")], [tensor("Y", [-1], "INT64")]
    )
    assert {i["name"]: i["data_type"] for i in doc["input"]} == {"T": "TYPE_STRING", "B": "TYPE_INVALID"}


def test_non_tensor_input_or_output_fails_auto_complete():
    seq = TensorInfo("SEQ", "UNDEFINED", (), "ONNX_TYPE_SEQUENCE")
    assert error_of(autocomplete, config(), [seq], [tensor("LEN", [])]) == (
        "Unsupported ONNX Type 'ONNX_TYPE_SEQUENCE' for I/O 'SEQ', expected 'ONNX_TYPE_TENSOR'."
    )
    zipmap = TensorInfo("Z", "UNDEFINED", (), "ONNX_TYPE_SEQUENCE")
    assert "'Z'" in error_of(autocomplete, config(), [tensor("P", [-1, 2])], [zipmap])


# --- config vs model ------------------------------------------------------------------------------

ADD_SUB_INPUTS, ADD_SUB_OUTPUTS = BATCHING
ADD_SUB_IO = """
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ %s ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""


def check(text: str, inputs=ADD_SUB_INPUTS, outputs=ADD_SUB_OUTPUTS) -> str | None:
    try:
        validate_against_model(config(text), inputs, outputs)
    except ModelError as exc:
        return exc.message
    return None


def test_matching_config_passes():
    assert check("max_batch_size: 8" + ADD_SUB_IO % "16") is None


def test_the_issue_example_verbatim():
    assert check("max_batch_size: 8" + ADD_SUB_IO % "1, 16") == (
        "model 'm', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) but the model configuration "
        "specifies 3 dimensions (an initial batch dimension because max_batch_size > 0 followed by the explicit "
        "tensor shape, making complete shape [-1,1,16])"
    )


def test_shape_mismatch_without_batching():
    assert check(ADD_SUB_IO % "16") == (
        "model 'm', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) but the model configuration "
        "specifies 1 dimensions (shape [16])"
    )
    assert check(ADD_SUB_IO.replace("[ 16 ]", "[ -1, 16 ]") % "-1, 16") is None


def test_batching_needs_a_variable_first_dimension():
    inputs = [tensor("INPUT0", [1, 16]), ADD_SUB_INPUTS[1]]
    assert check("max_batch_size: 8" + ADD_SUB_IO % "16", inputs) == (
        "model 'm', tensor 'INPUT0': for the model to support batching the shape should have at least 1 dimension "
        "and the first dimension must be -1; but shape expected by the model is [1,16]"
    )


def test_wildcards_inputs_are_lenient_outputs_exact():
    # a model -1 accepts any configured size for an input ...
    assert (
        check("max_batch_size: 8" + ADD_SUB_IO % "16", [tensor("INPUT0", [-1, -1]), ADD_SUB_INPUTS[1]])
        is None
    )
    # ... but must be configured as -1 for an output (compare_exact)
    outputs = [tensor("OUTPUT0", [-1, -1]), ADD_SUB_OUTPUTS[1]]
    assert check("max_batch_size: 8" + ADD_SUB_IO % "16", outputs=outputs) == (
        "model 'm', tensor 'OUTPUT0': the model expects 2 dimensions (shape [-1,-1]) but the model configuration "
        "specifies 2 dimensions (an initial batch dimension because max_batch_size > 0 followed by the explicit "
        "tensor shape, making complete shape [-1,16])"
    )
    # a configured -1 never matches a fixed model dimension
    assert "tensor 'INPUT0'" in check("max_batch_size: 8" + ADD_SUB_IO % "-1")


def test_reshape_is_what_is_compared():
    inputs = [tensor("INPUT0", [-1, 4, 4]), ADD_SUB_INPUTS[1]]
    text = "max_batch_size: 8" + ADD_SUB_IO % "16"
    assert "tensor 'INPUT0'" in check(text, inputs)
    assert (
        check(
            text.replace(
                'dims: [ 16 ] }, { name: "INPUT1"',
                'dims: [ 16 ] reshape { shape: [ 4, 4 ] } }, { name: "INPUT1"',
            ),
            inputs,
        )
        is None
    )


def test_input_count_mismatch():
    one_input = 'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1, 16 ] } ] output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1, 16 ] } ]'
    assert check(one_input) == "unable to load model 'm', configuration expects 1 inputs, model provides 2"
    three = ADD_SUB_IO % "16" + 'input [ { name: "INPUT2" data_type: TYPE_FP32 dims: [ 16 ] } ]'
    assert (
        check("max_batch_size: 2" + three)
        == "unable to load model 'm', configuration expects 3 inputs, model provides 2"
    )


def test_unexpected_input_lists_allowed_inputs_sorted():
    text = "max_batch_size: 2" + (ADD_SUB_IO % "16").replace('"INPUT1"', '"INPUT_1"')
    inputs = [*ADD_SUB_INPUTS, tensor("B", [4], overridable=True)]
    assert (
        check(text, inputs) == "unexpected inference input 'INPUT_1', allowed inputs are: B, INPUT0, INPUT1"
    )


def test_output_the_model_lacks():
    text = "max_batch_size: 2" + (ADD_SUB_IO % "16").replace('"OUTPUT1"', '"OUTPUT9"')
    assert check(text) == "unexpected inference output 'OUTPUT9', allowed outputs are: OUTPUT0, OUTPUT1"


def test_datatype_mismatch_messages():
    text = "max_batch_size: 2" + ADD_SUB_IO % "16"
    assert check(text.replace("TYPE_FP32", "TYPE_INT32", 1)) == (
        "unable to load model 'm', configuration expects datatype TYPE_INT32 for input 'INPUT0', model provides TYPE_FP32"
    )
    strings = [tensor("INPUT0", [-1, 16], "STRING"), ADD_SUB_INPUTS[1]]
    assert check(text, strings).endswith("for input 'INPUT0', model provides TYPE_BYTES")
    assert check(text.replace("TYPE_FP32", "TYPE_STRING", 1), strings) is None
    bf16 = [tensor("INPUT0", [-1, 16], "BFLOAT16"), ADD_SUB_INPUTS[1]]
    assert check(text, bf16).endswith("model provides TYPE_<invalid>")
    assert (
        check(text.replace("TYPE_FP32", "TYPE_BF16", 1), bf16)
        == "unsupported datatype TYPE_BF16 for input 'INPUT0' for model 'm'"
    )
    out = text.replace('name: "OUTPUT1" data_type: TYPE_FP32', 'name: "OUTPUT1" data_type: TYPE_FP16')
    assert check(out) == (
        "unable to load model 'm', configuration expects datatype TYPE_FP16 for output 'OUTPUT1', model provides TYPE_FP32"
    )


def test_scalar_model_tensors():
    io = 'input [ { name: "X" data_type: TYPE_FP32 dims: [ %s ] } ] output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]'
    scalar = ([tensor("X", [])], [tensor("Y", [])])
    assert check(io % "1", *scalar) is None
    assert check(io % "1, 1", *scalar) is None
    assert check(io % "2", *scalar) == (
        "unable to load model 'm', scalar tensor 'X', should only provide 1 in the model configuration when the "
        "model doesn't support batching. Model configuration provided: [2]."
    )
    # the backend skips the shape comparison for scalars even when batching
    assert check("max_batch_size: 4 " + io % "1", *scalar) is None


def test_overridable_initializer_as_optional_input():
    inputs = [tensor("X", [4]), tensor("W", [4], overridable=True)]
    outputs = [tensor("Y", [4])]
    x = '{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }'
    y = 'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]'
    assert (
        check(
            f'input [ {x}, {{ name: "W" data_type: TYPE_FP32 dims: [ 4 ] optional: true }} ] {y}',
            inputs,
            outputs,
        )
        is None
    )
    assert check(f'input [ {x}, {{ name: "W" data_type: TYPE_FP32 dims: [ 4 ] }} ] {y}', inputs, outputs) == (
        "unable to load model 'm', configuration expects 2 inputs, model provides 1"
    )
    assert check(
        f'input [ {x}, {{ name: "W" data_type: TYPE_FP32 dims: [ 3 ] optional: true }} ] {y}', inputs, outputs
    ) == (
        "model 'm', tensor 'W': the model expects 1 dimensions (shape [4]) but the model configuration specifies 1 "
        "dimensions (shape [3])"
    )


def test_optional_input_with_batching():
    inputs = [tensor("X", [-1, 4]), tensor("W", [4], overridable=True)]
    text = (
        'max_batch_size: 2 input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] },'
        ' { name: "W" data_type: TYPE_FP32 dims: [ 4 ] optional: true } ]'
        ' output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]'
    )
    assert check(text, inputs, [tensor("Y", [-1, 4])]) == (
        "unable to load model 'm', optional input 'W' is not supported for models that support batching"
    )
    # the input count is checked first: marking a required input optional miscounts
    text = ("max_batch_size: 2" + ADD_SUB_IO % "16").replace(
        'dims: [ 16 ] }, { name: "INPUT1"', 'dims: [ 16 ] optional: true }, { name: "INPUT1"'
    )
    assert check(text) == "unable to load model 'm', configuration expects 1 inputs, model provides 2"


def test_ragged_inputs():
    text = ("max_batch_size: 2" + ADD_SUB_IO % "16").replace(
        'dims: [ 16 ] }, { name: "INPUT1"', 'dims: [ 16 ] allow_ragged_batch: true }, { name: "INPUT1"'
    )
    assert check(text) == (
        "unable to load model 'm', configuration expects model provides input with shape [-1]  for ragged input "
        "'INPUT0', model provides [-1,16]"
    )
    assert check(text, [tensor("INPUT0", [-1]), ADD_SUB_INPUTS[1]]) is None


def test_batch_input_and_batch_output():
    text = "max_batch_size: 2" + ADD_SUB_IO % "16"
    extra = ' batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "COUNT" data_type: TYPE_FP32 source_input: "INPUT0" } ]'
    assert check(text + extra) == "unable to load model 'm', configuration expects 3 inputs, model provides 2"
    assert check(text + extra, [*ADD_SUB_INPUTS, tensor("COUNT", [-1, 1])]) is None
    # a batch output's shape is not compared with the model
    bad = text.replace(
        'name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ]',
        'name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 3 ]',
    )
    assert "tensor 'OUTPUT1'" in check(bad)
    assert (
        check(
            bad
            + ' batch_output [ { target_name: "OUTPUT1" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "INPUT0" } ]'
        )
        is None
    )


def test_non_tensor_values_fail_validation():
    seq = TensorInfo("SEQ", "UNDEFINED", (), "ONNX_TYPE_SEQUENCE")
    text = 'input [ { name: "SEQ" data_type: TYPE_FP32 dims: [ 1 ] } ] output [ { name: "LEN" data_type: TYPE_INT64 dims: [ 1 ] } ]'
    assert (
        check(text, [seq], [tensor("LEN", [])])
        == "Unsupported ONNX Type 'ONNX_TYPE_SEQUENCE' for I/O 'SEQ', expected 'ONNX_TYPE_TENSOR'."
    )
    opt = TensorInfo("Y", "UNDEFINED", (), "ONNX_TYPE_UNKNOWN")
    text = 'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ] output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]'
    assert (
        check(text, [tensor("X", [1])], [opt])
        == "Unsupported ONNX Type 'ONNX_TYPE_UNKNOWN' for I/O 'Y', expected 'ONNX_TYPE_TENSOR'."
    )


SEQUENCE = """
max_batch_size: 2
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
SEQ_INPUTS = [tensor("X", [-1, 4]), tensor("START", [-1, 1], "INT32"), tensor("CORRID", [-1, 1], "UINT64")]


def test_sequence_controls_count_as_inputs_and_are_checked():
    outputs = [tensor("Y", [-1, 4])]
    assert check(SEQUENCE, SEQ_INPUTS, outputs) is None
    assert check(SEQUENCE, SEQ_INPUTS[:2], outputs) == (
        "configuration specified sequence control 'CORRID', but model does not provide that input"
    )
    wrong_type = [SEQ_INPUTS[0], tensor("START", [-1, 1], "FLOAT"), SEQ_INPUTS[2]]
    assert check(SEQUENCE, wrong_type, outputs) == (
        "unable to load model 'm', sequence control 'START', the model expects data-type FLOAT but the model "
        "configuration specifies data-type TYPE_INT32"
    )
    wrong_dims = [SEQ_INPUTS[0], tensor("START", [-1, 2], "INT32"), SEQ_INPUTS[2]]
    assert check(SEQUENCE, wrong_dims, outputs) == (
        "unable to load model 'm', sequence control 'START' in model has dims [2] but dims [1] is expected"
    )
    with_state = SEQUENCE.replace(
        "control_input [",
        'state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n  control_input [',
    )
    assert (
        check(with_state, SEQ_INPUTS, outputs)
        == "unable to load model 'm', configuration expects 4 inputs, model provides 3"
    )
    twice = SEQUENCE.replace(
        "kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64",
        "kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ]",
    )
    assert (
        check(twice, SEQ_INPUTS, outputs)
        == "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for m"
    )


# --- through the compiler -------------------------------------------------------------------------


def test_compile_without_config_batching_model(repo):
    mb.add_sub(repo / "add_sub" / "1" / "model.onnx")
    result = compile_repository(repo, device="cpu")
    assert result.ok, result.failures
    doc = result.models["add_sub"].config
    assert (doc["platform"], doc["backend"]) == ("onnxruntime_onnx", "onnxruntime")
    assert doc["max_batch_size"] == 4
    assert doc["dynamic_batching"]["preferred_batch_size"] == [4]
    assert [(i["name"], i["data_type"], i["dims"]) for i in doc["input"]] == [
        ("INPUT1", "TYPE_FP32", [16]),
        ("INPUT0", "TYPE_FP32", [16]),
    ]
    assert [(o["name"], o["dims"]) for o in doc["output"]] == [("OUTPUT1", [16]), ("OUTPUT0", [16])]
    group = doc["instance_group"]
    assert [(g["name"], g["kind"], g["count"]) for g in group] == [("add_sub", "KIND_CPU", 2)]


def test_compile_without_config_fixed_batch_model(repo):
    mb.matmul_relu(repo / "fixed" / "1" / "model.onnx", batch=1)
    doc = compile_repository(repo, device="cpu").models["fixed"].config
    assert doc["max_batch_size"] == 0 and "dynamic_batching" not in doc
    assert doc["input"][0]["dims"] == [1, 16] and doc["output"][0]["dims"] == [1, 16]


def test_compile_reports_the_issue_example_with_file_and_line(repo):
    mb.add_sub(repo / "m" / "1" / "model.onnx")
    path = write_config(
        repo,
        "m",
        """
        name: "m"
        backend: "onnxruntime"
        max_batch_size: 8
        input [
          { name: "INPUT0", data_type: TYPE_FP32, dims: [ 1, 16 ] },
          { name: "INPUT1", data_type: TYPE_FP32, dims: [ 16 ] }
        ]
        output [
          { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ] },
          { name: "OUTPUT1", data_type: TYPE_FP32, dims: [ 16 ] }
        ]
    """,
    )
    result = compile_repository(repo, device="cpu")
    error = result.failures["m"]
    assert error.message.startswith(
        "model 'm', tensor 'INPUT0': the model expects 2 dimensions (shape [-1,16]) but the model configuration "
        "specifies 3 dimensions (an initial batch dimension"
    )
    assert (error.file, error.line) == (str(path), 5)


def test_compile_partial_config_and_initializer_input(repo):
    mb.initializer_input(repo / "m" / "1" / "model.onnx")
    write_config(
        repo,
        "m",
        """
        name: "m"
        backend: "onnxruntime"
        output [ { name: "Y", data_type: TYPE_FP32, dims: [ 4 ] } ]
    """,
    )
    doc = compile_repository(repo, device="cpu").models["m"].config
    assert [i["name"] for i in doc["input"]] == ["X"]
    assert doc["max_batch_size"] == 4 and doc["dynamic_batching"]["preferred_batch_size"] == [4]


def test_compile_model_directory_with_external_data(repo):
    mb.external_data_directory(repo / "big" / "1" / "model.onnx")
    result = compile_repository(repo, device="cpu")
    assert result.ok, result.failures
    assert result.models["big"].config["input"][0]["dims"] == [64]


def test_compile_corrupt_model_and_sequence_input(repo):
    (repo / "bad" / "1").mkdir(parents=True)
    (repo / "bad" / "1" / "model.onnx").write_bytes(b"\x08\x07garbage")
    mb.sequence_input(repo / "seq" / "1" / "model.onnx")
    result = compile_repository(repo, device="cpu")
    assert result.failures["bad"].message.startswith("onnx runtime error ")
    assert result.failures["seq"].message == (
        "Unsupported ONNX Type 'ONNX_TYPE_SEQUENCE' for I/O 'SEQ', expected 'ONNX_TYPE_TENSOR'."
    )


def test_compile_string_model(repo):
    mb.identity(repo / "text" / "1" / "model.onnx", {"TEXT": ("BYTES", ["N"])}, ["OUT"])
    doc = compile_repository(repo, device="cpu").models["text"].config
    assert doc["max_batch_size"] == 4
    assert doc["input"][0] == {
        **doc["input"][0],
        "name": "TEXT",
        "data_type": "TYPE_STRING",
        "dims": [1],
        "reshape": {"shape": []},
    }
