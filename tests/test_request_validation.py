"""Request validation against a model's config (Triton core's Normalize and input checks).

Configs are written as config.pbtxt text and rendered to Triton's config JSON by the toolkit's
compiler code, so the validator sees exactly what `GET /v2/models/M/config` returns. Expected
messages marked "Triton 2.51" were recorded from tritonserver 2.51 (`scripts/tools/tritonserver serve`) for the same
configs and requests; the others are this runtime's documented deviations (docs/protocol.md).
"""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest
import tritonclient.http as httpclient

from handlers.errors import ErrorCode, InferenceError
from handlers.inference import InferRequest, RequestedOutput
from handlers.protocol import decode_request, tensor_datatype, validate_request
from handlers.protocol.codec import bf16_from_float32
from toolkit.repository.model_config import parse_config_text, to_triton_json


def config(text: str) -> dict:
    return to_triton_json(parse_config_text(textwrap.dedent(text)))


ADD_SUB = config("""
    name: "add_sub"
    backend: "onnxruntime"
    max_batch_size: 8
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [16] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [16] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [16] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [16] } ]
""")
ADD_SUB_NB = config("""
    name: "add_sub_nb"
    backend: "onnxruntime"
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [-1, 4] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [-1, 4] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [-1, 4] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [-1, 4] } ]
""")
OPTIONAL = config("""
    name: "optional"
    backend: "onnxruntime"
    max_batch_size: 8
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [4] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [4] optional: true } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] } ]
""")
RESHAPE = config("""
    name: "reshape"
    backend: "onnxruntime"
    max_batch_size: 8
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [4] reshape: { shape: [2, 2] } } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [2, 2] } ]
""")
ID_FP32 = config("""
    name: "id_FP32"
    backend: "onnxruntime"
    max_batch_size: 4
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [3] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [3] } ]
""")
BYTES_ID = config("""
    name: "bytes_id"
    backend: "onnxruntime"
    max_batch_size: 8
    input [ { name: "INPUT0" data_type: TYPE_STRING dims: [-1] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_STRING dims: [-1] } ]
""")
MODELS = {c["name"]: c for c in (ADD_SUB, ADD_SUB_NB, OPTIONAL, RESHAPE, ID_FP32, BYTES_ID)}

NOTE = (
    " NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to be prepended to "
    "each input shape. If you want to specify the full shape including the batch dim in your input dims config, "
    "try setting max_batch_size to zero. See the model configuration docs for more info on max_batch_size."
)
P = "[request id: <id_unknown>] "


def request_for(
    model: str, document: dict | None = None, body: bytes | None = None, header_length=None
) -> InferRequest:
    if body is None:
        body = json.dumps(document).encode()
    return decode_request(body, header_length, model_name=model, model_version=1)


def fp32(name: str, shape: list[int]) -> dict:
    return {"name": name, "datatype": "FP32", "shape": shape, "data": list(range(int(np.prod(shape))))}


def validation_error(model: str, request: InferRequest) -> InferenceError:
    with pytest.raises(InferenceError) as caught:
        validate_request(MODELS[model], request)
    assert caught.value.code is ErrorCode.INVALID_ARG and caught.value.http_status == 400
    return caught.value


TRITON_CASES = [
    # (id, model, request document, Triton 2.51 message)
    (
        "unknown output",
        "add_sub",
        {"inputs": [fp32("INPUT0", [1, 16]), fp32("INPUT1", [1, 16])], "outputs": [{"name": "NOPE"}]},
        "unexpected inference output 'NOPE' for model 'add_sub'",
    ),
    (
        "no inputs",
        "add_sub",
        {"inputs": []},
        P
        + "expected 2 inputs but got 0 inputs for model 'add_sub'. Got input(s) [], but missing required input(s) "
        "['INPUT0','INPUT1']. Please provide all required input(s).",
    ),
    (
        "missing input",
        "add_sub",
        {"inputs": [fp32("INPUT0", [1, 16])]},
        P
        + "expected 2 inputs but got 1 inputs for model 'add_sub'. Got input(s) ['INPUT0'], but missing required input(s) "
        "['INPUT1']. Please provide all required input(s).",
    ),
    (
        "optional model without inputs",
        "optional",
        {"inputs": []},
        P
        + "expected number of inputs between 1 and 2 but got 0 inputs for model 'optional'. Got input(s) [], but missing "
        "required input(s) ['INPUT0']. Please provide all required input(s).",
    ),
    (
        "unknown input",
        "add_sub",
        {"inputs": [fp32("INPUT0", [1, 16]), fp32("INPUTX", [1, 16])]},
        "unexpected inference input 'INPUTX' for model 'add_sub'",
    ),
    (
        "unknown input with other dtype",
        "add_sub",
        {
            "inputs": [
                fp32("INPUT0", [1, 16]),
                {"name": "INPUTX", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]},
            ]
        },
        "unexpected inference input 'INPUTX' for model 'add_sub'",
    ),
    (
        "empty input name",
        "id_FP32",
        {"inputs": [fp32("", [1, 3])]},
        "unexpected inference input '' for model 'id_FP32'",
    ),
    (
        "batch too big",
        "add_sub",
        {"inputs": [fp32("INPUT0", [9, 16]), fp32("INPUT1", [9, 16])]},
        P + "inference request batch-size must be <= 8 for 'add_sub'",
    ),
    (
        "no batch dim",
        "add_sub",
        {"inputs": [fp32("INPUT0", [16]), fp32("INPUT1", [16])]},
        P + "inference request batch-size must be <= 8 for 'add_sub'",
    ),
    (
        "scalar on batching model",
        "add_sub",
        {"inputs": [fp32("INPUT0", []), fp32("INPUT1", [])]},
        P + "input 'INPUT0' has no shape but model requires batch dimension for 'add_sub'",
    ),
    (
        "wrong dim",
        "add_sub",
        {"inputs": [fp32("INPUT0", [1, 16]), fp32("INPUT1", [1, 8])]},
        P + "unexpected shape for input 'INPUT1' for model 'add_sub'. Expected [-1,16], got [1,8]." + NOTE,
    ),
    (
        "wrong dtype",
        "add_sub",
        {
            "inputs": [
                fp32("INPUT0", [1, 16]),
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
            ]
        },
        P + "inference input 'INPUT1' data-type is 'INT32', but model 'add_sub' expects 'FP32'",
    ),
    (
        "non-batching extra dim",
        "add_sub_nb",
        {"inputs": [fp32("INPUT0", [3, 4]), fp32("INPUT1", [1, 3, 4])]},
        P + "unexpected shape for input 'INPUT1' for model 'add_sub_nb'. Expected [-1,4], got [1,3,4]. ",
    ),
    (
        "non-batching wrong dim",
        "add_sub_nb",
        {"inputs": [fp32("INPUT0", [3, 4]), fp32("INPUT1", [3, 5])]},
        P + "unexpected shape for input 'INPUT1' for model 'add_sub_nb'. Expected [-1,4], got [3,5]. ",
    ),
    (
        "reshape given the reshaped dims",
        "reshape",
        {"inputs": [fp32("INPUT0", [2, 2, 2])]},
        P + "unexpected shape for input 'INPUT0' for model 'reshape'. Expected [-1,4], got [2,2,2]." + NOTE,
    ),
    (
        "request id in prefix",
        "id_FP32",
        {"inputs": [fp32("INPUT0", [2, 4])], "id": "myid"},
        "[request id: myid] unexpected shape for input 'INPUT0' for model 'id_FP32'. Expected [-1,3], got [2,4]."
        + NOTE,
    ),
    (
        "zero-sized dim",
        "id_FP32",
        {"inputs": [fp32("INPUT0", [1, 0])]},
        P + "unexpected shape for input 'INPUT0' for model 'id_FP32'. Expected [-1,3], got [1,0]." + NOTE,
    ),
]


@pytest.mark.parametrize(
    "model, document, message", [c[1:] for c in TRITON_CASES], ids=[c[0] for c in TRITON_CASES]
)
def test_triton_messages(model: str, document: dict, message: str) -> None:
    assert validation_error(model, request_for(model, document)).message == message


def test_inputs_are_checked_in_request_order() -> None:
    # Triton reports these in the order of a hash map; this runtime in request order.
    mismatch = request_for("add_sub", {"inputs": [fp32("INPUT0", [1, 16]), fp32("INPUT1", [2, 16])]})
    assert validation_error("add_sub", mismatch).message == (
        P + "input 'INPUT1' batch size does not match other inputs for 'add_sub'"
    )
    extra = request_for(
        "add_sub", {"inputs": [fp32("INPUT0", [1, 16]), fp32("INPUT1", [1, 16]), fp32("INPUTX", [1, 16])]}
    )
    assert validation_error("add_sub", extra).message == (
        P
        + "expected 2 inputs but got 3 inputs for model 'add_sub'. Got input(s) ['INPUT0','INPUT1','INPUTX'], "
        "but missing required input(s) []. Please provide all required input(s)."  # Triton prints "]" here
    )


def test_missing_required_input_with_only_optional_given_is_caught() -> None:
    # Triton 2.51 lets this through to the backend (which then fails); it is refused here.
    request = request_for("optional", {"inputs": [fp32("INPUT1", [1, 4])]})
    assert validation_error("optional", request).message == (
        P
        + "expected number of inputs between 1 and 2 but got 1 inputs for model 'optional'. Got input(s) ['INPUT1'], "
        "but missing required input(s) ['INPUT0']. Please provide all required input(s)."
    )


def test_batch_size_zero_is_refused() -> None:
    # Triton 2.51 fails such requests later with a byte size mismatch (or passes them on for
    # all-variable dims); here they are refused up front.
    request = request_for("id_FP32", {"inputs": [fp32("INPUT0", [0, 3])]})
    assert validation_error("id_FP32", request).message == (
        P + "inference request batch-size must be >= 1 for 'id_FP32', got a batch dimension of 0"
    )


def test_valid_requests_set_the_batch_size() -> None:
    request = request_for("add_sub", {"inputs": [fp32("INPUT0", [3, 16]), fp32("INPUT1", [3, 16])]})
    validate_request(ADD_SUB, request)
    assert request.batch_size == 3
    request = request_for("add_sub_nb", {"inputs": [fp32("INPUT0", [5, 4]), fp32("INPUT1", [5, 4])]})
    validate_request(ADD_SUB_NB, request)
    assert request.batch_size == 1
    request = request_for("optional", {"inputs": [fp32("INPUT0", [2, 4])], "outputs": [{"name": "OUTPUT0"}]})
    validate_request(OPTIONAL, request)  # an optional input may be absent
    assert request.batch_size == 2


def test_reshape_changes_what_the_backend_sees() -> None:
    request = request_for("reshape", {"inputs": [fp32("INPUT0", [2, 4])]})
    original = request.inputs["INPUT0"]
    validate_request(RESHAPE, request)
    reshaped = request.inputs["INPUT0"]
    assert reshaped.shape == (2, 2, 2) and request.batch_size == 2
    assert np.shares_memory(reshaped, original)
    np.testing.assert_array_equal(reshaped.reshape(2, 4), original)


def test_reshape_with_variable_dims_takes_the_request_values_in_order() -> None:
    model = config("""
        name: "varreshape"
        max_batch_size: 2
        input [ { name: "X" data_type: TYPE_INT8 dims: [-1, 3, -1] reshape: { shape: [-1, -1, 3] } } ]
        output [ { name: "Y" data_type: TYPE_INT8 dims: [-1] } ]
    """)
    request = InferRequest("varreshape", 1, {"X": np.zeros((2, 4, 3, 5), dtype=np.int8)})
    validate_request(model, request)
    assert request.inputs["X"].shape == (2, 4, 5, 3)
    scalar = config("""
        name: "toscalar"
        input [ { name: "X" data_type: TYPE_FP32 dims: [1] reshape: { shape: [] } } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [1] } ]
    """)
    request = InferRequest("toscalar", 1, {"X": np.ones((1,), dtype=np.float32)})
    validate_request(scalar, request)
    assert request.inputs["X"].shape == () and request.batch_size == 1


def test_shape_tensors_keep_their_shape_and_have_no_batch_dim() -> None:
    model = config("""
        name: "shapes"
        max_batch_size: 4
        input [ { name: "DATA" data_type: TYPE_FP32 dims: [-1] }, { name: "SHAPE" data_type: TYPE_INT32 dims: [2] is_shape_tensor: true } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [-1] } ]
    """)
    request = InferRequest(
        "shapes", 1, {"DATA": np.zeros((3, 7), np.float32), "SHAPE": np.array([3, 7], np.int32)}
    )
    validate_request(model, request)
    assert request.batch_size == 3 and request.inputs["SHAPE"].shape == (2,)


def test_bf16_and_uint16_are_told_apart() -> None:
    model = config("""
        name: "bf"
        input [ { name: "X" data_type: TYPE_BF16 dims: [2] } ]
        output [ { name: "Y" data_type: TYPE_BF16 dims: [2] } ]
    """)
    good = request_for(
        "bf", {"inputs": [{"name": "X", "datatype": "BF16", "shape": [2], "data": [1.0, 2.0]}]}
    )
    validate_request(model, good)
    assert tensor_datatype(good.inputs["X"]) == "BF16"
    bad = InferRequest("bf", 1, {"X": np.zeros(2, dtype=np.uint16)})
    with pytest.raises(InferenceError) as caught:
        validate_request(model, bad)
    assert (
        caught.value.message == P + "inference input 'X' data-type is 'UINT16', but model 'bf' expects 'BF16'"
    )
    assert tensor_datatype(bf16_from_float32(np.ones(2, np.float32))) == "BF16"


def test_classification_of_unsupported_output_types_is_refused_before_inference() -> None:
    model = config("""
        name: "cls"
        input [ { name: "X" data_type: TYPE_FP16 dims: [3] } ]
        output [ { name: "Y" data_type: TYPE_FP16 dims: [3] } ]
    """)
    request = InferRequest(
        "cls", 1, {"X": np.zeros(3, np.float16)}, requested_outputs=[RequestedOutput("Y", classification=2)]
    )
    with pytest.raises(InferenceError) as caught:
        validate_request(model, request)
    assert (
        caught.value.message == "class result not available for output due to unsupported type 'FP16'"
    )  # Triton 2.51


# --- raw binary requests (Inference-Header-Content-Length: 0) -------------------------------------


def test_raw_request_is_resolved_to_the_single_input() -> None:
    data = np.arange(6, dtype=np.float32)
    request = request_for("id_FP32", body=data[:3].tobytes(), header_length="0")
    validate_request(ID_FP32, request)
    assert list(request.inputs) == ["INPUT0"] and request.batch_size == 1
    np.testing.assert_array_equal(request.inputs["INPUT0"], data[:3].reshape(1, 3))
    assert request.parameters["binary_data_output"] is True
    variable = request_for("add_sub_nb_one", body=data.tobytes(), header_length="0")
    one_input = config("""
        name: "one"
        input [ { name: "X" data_type: TYPE_FP32 dims: [-1, 2] } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [-1, 2] } ]
    """)
    validate_request(one_input, variable)
    assert variable.inputs["X"].shape == (3, 2)


@pytest.mark.parametrize(
    "model, body, message",
    [  # Triton 2.51 texts, except the input name in the byte size message (Triton says 'raw_input')
        (
            "id_FP32",
            np.arange(3, dtype=np.float32).tobytes()[:10],
            P + "input byte size mismatch for input 'INPUT0' for model 'id_FP32'. Expected 12, got 10",
        ),
        (
            "id_FP32",
            b"",
            P + "input byte size mismatch for input 'INPUT0' for model 'id_FP32'. Expected 12, got 0",
        ),
        (
            "add_sub_nb",
            b"x" * 32,
            P
            + "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'add_sub_nb' model configuration",
        ),
        (
            "bytes_id",
            b"hello",
            P + "For BYTE datatype raw input 'INPUT0', the model must have input shape [1]",
        ),
    ],
    ids=["short", "empty", "two inputs", "bytes needs [1]"],
)
def test_raw_request_errors(model: str, body: bytes, message: str) -> None:
    assert validation_error(model, request_for(model, body=body, header_length="0")).message == message


def test_raw_bytes_request_is_one_element() -> None:
    model = config("""
        name: "text"
        max_batch_size: 2
        input [ { name: "T" data_type: TYPE_STRING dims: [1] } ]
        output [ { name: "Y" data_type: TYPE_STRING dims: [1] } ]
    """)
    request = request_for("text", body=b"\x00raw text\xff", header_length="0")
    validate_request(model, request)
    assert request.inputs["T"].shape == (1, 1) and request.inputs["T"][0, 0] == b"\x00raw text\xff"


def test_raw_request_with_two_variable_dims_cannot_be_deduced() -> None:
    model = config("""
        name: "two"
        input [ { name: "X" data_type: TYPE_UINT8 dims: [-1, -1] } ]
        output [ { name: "Y" data_type: TYPE_UINT8 dims: [-1, -1] } ]
    """)
    with pytest.raises(InferenceError) as caught:
        validate_request(model, request_for("two", body=b"abcd", header_length="0"))
    assert caught.value.message == (
        P
        + "The shape of the raw input 'X' can not be deduced because there are more than one variable-sized dimension"
    )


# --- end to end with tritonclient-built requests ----------------------------------------------------


def test_tritonclient_requests_validate() -> None:
    a = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    inputs = [httpclient.InferInput(n, [2, 16], "FP32") for n in ("INPUT0", "INPUT1")]
    inputs[0].set_data_from_numpy(a, binary_data=True)
    inputs[1].set_data_from_numpy(a, binary_data=False)
    body, header_length = httpclient.InferenceServerClient.generate_request_body(
        inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT1")]
    )
    request = decode_request(body, str(header_length), model_name="add_sub", model_version=1)
    validate_request(ADD_SUB, request)
    assert request.batch_size == 2 and [o.name for o in request.requested_outputs] == ["OUTPUT1"]
