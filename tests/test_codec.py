"""The v2 tensor codec against the real client: request bodies are built by tritonclient's
`InferenceServerClient.generate_request_body` and responses read by `parse_response_body`.

Expected error messages marked "Triton 2.51" were recorded from tritonserver 2.51
(`scripts/tools/tritonserver serve`, docs/tools.md); where this runtime deliberately differs (400 instead of 500,
clearer wording where Triton's text is an internal accident) docs/protocol.md says so.
"""

from __future__ import annotations

import json
import math
import struct
import tracemalloc

import ml_dtypes
import numpy as np
import orjson
import pytest
import tritonclient.http as httpclient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from handlers.errors import ErrorCode, InferenceError
from handlers.inference import InferResponse, RequestedOutput
from handlers.protocol import (
    FRONTEND_PARAMETERS,
    decode_request,
    encode_error,
    encode_response,
    tensor_datatype,
)
from handlers.protocol.codec import (
    RAW_INPUT_NAME,
    SEQUENCE_END,
    SEQUENCE_START,
    array_from_buffer,
    bf16_from_float32,
    float32_from_bf16,
    is_raw_input,
)

Client = httpclient.InferenceServerClient
NUMERIC = [
    "BOOL",
    "UINT8",
    "UINT16",
    "UINT32",
    "UINT64",
    "INT8",
    "INT16",
    "INT32",
    "INT64",
    "FP16",
    "FP32",
    "FP64",
]


def sample(datatype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if datatype == "BOOL":
        return rng.integers(0, 2, shape).astype(np.bool_)
    if datatype == "BYTES":
        words = [b"", b"a", "\u00e9t\u00e9".encode(), b"x" * 70, b"\x00nul", "\U0001f600".encode()]
        return np.array([words[i % len(words)] for i in range(math.prod(shape))], dtype=np.object_).reshape(
            shape
        )
    if datatype == "BF16":
        return rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
    dtype = np.dtype(datatype.replace("FP", "float").replace("UINT", "uint").replace("INT", "int").lower())
    if dtype.kind == "f":
        return (rng.standard_normal(shape) * 100).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def client_request(inputs, outputs=None, **kwargs):
    body, header_length = Client.generate_request_body(inputs, outputs=outputs, **kwargs)
    return body, (str(header_length) if header_length is not None else None)


def client_input(name: str, array: np.ndarray, datatype: str, binary: bool) -> httpclient.InferInput:
    item = httpclient.InferInput(name, list(array.shape), datatype)
    item.set_data_from_numpy(array, binary_data=binary)
    return item


def decode(body, header_length=None, model="m", version=1):
    return decode_request(body, header_length, model_name=model, model_version=version)


def raw_body(document: dict, *blobs: bytes) -> tuple[bytes, str]:
    header = json.dumps(document).encode()
    return header + b"".join(blobs), str(len(header))


def parse(payload: bytes, headers: dict[str, str]) -> httpclient.InferResult:
    length = headers.get("inference-header-content-length")
    return Client.parse_response_body(payload, header_length=int(length) if length else None)


def config_for(outputs: dict[str, str], max_batch_size: int = 0) -> dict:
    return {
        "name": "m",
        "max_batch_size": max_batch_size,
        "input": [],
        "output": [
            {"name": n, "data_type": "TYPE_STRING" if t == "BYTES" else f"TYPE_{t}", "dims": [-1]}
            for n, t in outputs.items()
        ],
    }


def error_of(body, header_length=None) -> InferenceError:
    with pytest.raises(InferenceError) as caught:
        decode(body, header_length)
    return caught.value


# --- requests from tritonclient --------------------------------------------------------------------


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("datatype", NUMERIC + ["BYTES"])
def test_every_datatype_decodes_from_tritonclient(datatype: str, binary: bool) -> None:
    array = sample(datatype, (2, 3, 4))
    body, header_length = client_request([client_input("X", array, datatype, binary)], request_id="r1")
    request = decode(body, header_length)
    decoded = request.inputs["X"]
    assert request.id == "r1" and request.model_name == "m" and request.model_version == 1
    assert decoded.shape == (2, 3, 4)
    assert tensor_datatype(decoded) == datatype
    if datatype == "BYTES":
        assert decoded.dtype == np.object_ and all(type(v) is bytes for v in decoded.flat)
    np.testing.assert_array_equal(decoded, array)


def test_bf16_decodes_from_tritonclient_as_bit_patterns() -> None:
    array = sample("BF16", (3, 5))
    body, header_length = client_request([client_input("X", array, "BF16", True)])
    decoded = decode(body, header_length).inputs["X"]
    assert tensor_datatype(decoded) == "BF16" and decoded.dtype == np.uint16
    np.testing.assert_array_equal(decoded, array.view(np.uint16))


def test_several_binary_and_json_inputs_take_their_bytes_in_input_order() -> None:
    a, b, c = sample("FP32", (1, 7)), sample("BYTES", (1, 5)), sample("INT64", (1, 3))
    inputs = [
        client_input("A", a, "FP32", True),
        client_input("B", b, "BYTES", True),
        client_input("C", c, "INT64", False),
    ]
    body, header_length = client_request(inputs)
    request = decode(body, header_length)
    assert list(request.inputs) == ["A", "B", "C"]
    np.testing.assert_array_equal(request.inputs["A"], a)
    np.testing.assert_array_equal(request.inputs["B"], b)
    np.testing.assert_array_equal(request.inputs["C"], c)


def test_request_options_from_tritonclient() -> None:
    x = client_input("X", sample("FP32", (1, 2)), "FP32", True)
    outputs = [
        httpclient.InferRequestedOutput("B", binary_data=False, class_count=3),
        httpclient.InferRequestedOutput("A"),
    ]
    body, header_length = client_request(
        [x],
        outputs,
        request_id="id-7",
        sequence_id=42,
        sequence_start=True,
        sequence_end=True,
        priority=3,
        timeout=5000,
        parameters={"custom": "v", "n": 2, "flag": False, "ratio": 0.5},
    )
    request = decode(body, header_length)
    assert request.id == "id-7"
    assert (request.priority, request.timeout_us, request.correlation_id) == (3, 5000, 42)
    assert request.flags == SEQUENCE_START | SEQUENCE_END
    assert (
        request.parameters["custom"] == "v"
        and request.parameters["n"] == 2
        and request.parameters["ratio"] == 0.5
    )
    assert FRONTEND_PARAMETERS <= {
        "sequence_id",
        "sequence_start",
        "sequence_end",
        "priority",
        "timeout",
        "binary_data_output",
    }
    assert [(o.name, o.binary_data, o.classification) for o in request.requested_outputs] == [
        ("B", False, 3),
        ("A", True, 0),
    ]


def test_no_outputs_means_all_outputs_and_client_default_binary() -> None:
    body, header_length = client_request([client_input("X", sample("FP32", (1, 2)), "FP32", False)])
    request = decode(body, header_length)
    assert request.requested_outputs is None
    assert request.parameters == {"binary_data_output": True}  # what tritonclient sends without outputs


def test_string_sequence_id_is_the_correlation_id() -> None:
    body, header_length = client_request(
        [client_input("X", sample("FP32", (1, 2)), "FP32", True)], sequence_id="seq-a"
    )
    assert decode(body, header_length).correlation_id == "seq-a"


# --- JSON data forms -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        [1, 2, 3, 4, 5, 6],
        [[1, 2, 3], [4, 5, 6]],
        [[[1, 2, 3]], [[4, 5, 6]]],
        [[1, 2], [3, 4, 5, 6]],  # ragged nesting: Triton only counts the leaves
        [1, [2, [3, [4]]], 5, [[6]]],
    ],
    ids=["flat", "nested", "over-nested", "ragged", "mixed"],
)
def test_json_data_may_be_flat_or_nested_row_major(data) -> None:
    body, header_length = raw_body(
        {"inputs": [{"name": "X", "datatype": "INT32", "shape": [2, 3], "data": data}]}
    )
    np.testing.assert_array_equal(
        decode(body, header_length).inputs["X"], np.arange(1, 7, dtype=np.int32).reshape(2, 3)
    )


def test_json_fp16_and_bf16_numbers_are_accepted_and_rounded_to_nearest_even() -> None:
    values = [1.0, 0.1, -3.14159, 65504.0, 1e-8, 3.0e38]
    body, header_length = raw_body(
        {
            "inputs": [
                {"name": "H", "datatype": "FP16", "shape": [6], "data": values},
                {"name": "B", "datatype": "BF16", "shape": [2, 3], "data": [values[:3], values[3:]]},
            ]
        }
    )
    request = decode(body, header_length)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(request.inputs["H"], np.array(values, dtype=np.float16))
    expected = np.array(values, dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint16).reshape(2, 3)
    np.testing.assert_array_equal(request.inputs["B"], expected)
    assert tensor_datatype(request.inputs["B"]) == "BF16"


def test_bf16_conversion_matches_ml_dtypes_including_specials() -> None:
    rng = np.random.default_rng(3)
    values = np.concatenate(
        [
            rng.standard_normal(5000).astype(np.float32)
            * np.float32(10.0) ** rng.integers(-30, 30, 5000).astype(np.float32),
            np.array(
                [
                    0.0,
                    -0.0,
                    np.inf,
                    -np.inf,
                    3.4028235e38,
                    -3.4028235e38,
                    1e-45,
                    1.0000001,
                    1.00390625,
                    1.01171875,
                ],
                dtype=np.float32,
            ),
            rng.integers(0, 2**32, 2000, dtype=np.uint64)
            .astype(np.uint32)
            .view(np.float32),  # every bit pattern kind
        ]
    )
    ours = bf16_from_float32(values)
    with np.errstate(invalid="ignore"):
        reference = values.astype(ml_dtypes.bfloat16).view(np.uint16)
    finite = ~np.isnan(values)
    np.testing.assert_array_equal(ours[finite], reference[finite])
    assert np.isnan(float32_from_bf16(ours[~finite])).all()
    np.testing.assert_array_equal(
        float32_from_bf16(reference), reference.view(ml_dtypes.bfloat16).astype(np.float32)
    )


def test_json_nan_and_infinity_literals_as_tritonclient_sends_them() -> None:
    array = np.array([[np.nan, np.inf, -np.inf, 1.5]], dtype=np.float32)
    body, header_length = client_request([client_input("X", array, "FP32", False)])
    assert b"NaN" in body and b"Infinity" in body
    np.testing.assert_array_equal(decode(body, header_length).inputs["X"], array)


def test_json_extreme_integers_are_exact() -> None:
    body, header_length = raw_body(
        {
            "inputs": [
                {"name": "U", "datatype": "UINT64", "shape": [3], "data": [0, 2**64 - 1, 2**63]},
                {"name": "I", "datatype": "INT64", "shape": [2], "data": [-(2**63), 2**63 - 1]},
            ]
        }
    )
    request = decode(body, header_length)
    assert request.inputs["U"].tolist() == [0, 2**64 - 1, 2**63]
    assert request.inputs["I"].tolist() == [-(2**63), 2**63 - 1]


def test_json_fp32_out_of_range_becomes_infinity_as_in_triton() -> None:
    body, header_length = raw_body(
        {"inputs": [{"name": "X", "datatype": "FP32", "shape": [2], "data": [1e300, -1e300]}]}
    )
    assert decode(body, header_length).inputs["X"].tolist() == [math.inf, -math.inf]


def test_json_bytes_are_utf8_encoded_and_zero_sized_tensors_work() -> None:
    body, header_length = raw_body(
        {
            "inputs": [
                {"name": "S", "datatype": "BYTES", "shape": [1, 2], "data": [["a\u0000b"], ["\u00e9"]]},
                {"name": "E", "datatype": "FP32", "shape": [1, 0], "data": []},
                {"name": "EB", "datatype": "BYTES", "shape": [0], "parameters": {"binary_data_size": 0}},
            ]
        }
    )
    request = decode(body, header_length)
    assert request.inputs["S"].tolist() == [[b"a\x00b", "\u00e9".encode()]]
    assert request.inputs["E"].shape == (1, 0) and request.inputs["EB"].shape == (0,)


# --- binary framing details ------------------------------------------------------------------------


def test_aligned_binary_data_is_a_zero_copy_view_and_misaligned_data_is_copied_aligned() -> None:
    payload = bytearray(np.arange(9, dtype=np.float32).tobytes())
    view = memoryview(payload)
    aligned = array_from_buffer(view[4:], "FP32", [2, 4])
    assert np.shares_memory(aligned, np.frombuffer(payload, dtype=np.uint8))
    misaligned_source = memoryview(b"\x00" + bytes(payload))[1:]
    copied = array_from_buffer(misaligned_source, "FP32", [9])
    assert copied.flags.aligned
    np.testing.assert_array_equal(copied, np.arange(9, dtype=np.float32))


def test_header_length_equal_to_body_and_bytearray_bodies() -> None:
    body, _ = raw_body({"inputs": [{"name": "X", "datatype": "INT8", "shape": [2], "data": [1, -1]}]})
    assert decode(bytearray(body), len(body)).inputs["X"].tolist() == [1, -1]
    assert decode(memoryview(body), str(len(body))).inputs["X"].tolist() == [1, -1]


def test_raw_binary_request_yields_one_undeduced_input() -> None:
    request = decode(np.arange(3, dtype=np.float32).tobytes(), "0")
    ((name, array),) = request.inputs.items()
    assert name == RAW_INPUT_NAME and is_raw_input(array) and array.nbytes == 12
    assert request.parameters == {"binary_data_output": True}  # Triton answers raw requests in binary
    empty = decode(b"", None)  # an empty body is a raw request too (Triton)
    assert is_raw_input(empty.inputs[RAW_INPUT_NAME]) and empty.inputs[RAW_INPUT_NAME].size == 0


# --- malformed requests: always 400 (or Triton's 404 for shared memory), never another exception -----

FP32_16 = list(range(16))
GOOD_INPUT = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": FP32_16}
CONTENT = (
    "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
    "'shared_memory_region' in 'parameters'. But"
)

JSON_ERRORS = [
    # (id, request document, expected message; Triton 2.51 text unless noted)
    (
        "inputs missing",
        {},
        "Unable to parse 'inputs': the request has no 'inputs'",
    ),  # ours (Triton: rapidjson text, 500)
    ("inputs not array", {"inputs": {}}, "Unable to parse 'inputs': expected an array, got object"),
    ("input not object", {"inputs": [5]}, "Unable to parse 'inputs': input 0 must be an object, got number"),
    (
        "no data",
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16]}]},
        CONTENT + " no field is set",
    ),
    (
        "data and binary",
        {"inputs": [dict(GOOD_INPUT, parameters={"binary_data_size": 64})]},
        CONTENT + " set 'data' 'binary_data_size'",
    ),
    (
        "data and shm",
        {"inputs": [dict(GOOD_INPUT, parameters={"shared_memory_region": "r"})]},
        CONTENT + " set 'data' 'shared_memory_region'",
    ),
    (
        "name missing",
        {"inputs": [{"datatype": "FP32", "shape": [1], "data": [1]}]},
        "Unable to parse 'name': input 0 needs a string 'name'",
    ),
    (
        "name not string",
        {"inputs": [{"name": 5, "datatype": "FP32", "shape": [1], "data": [1]}]},
        "Unable to parse 'name': input 0 needs a string 'name'",
    ),
    (
        "datatype missing",
        {"inputs": [{"name": "X", "shape": [1], "data": [1]}]},
        "Unable to parse 'datatype': input 'X' needs a string 'datatype'",
    ),
    (
        "unknown datatype",
        {"inputs": [{"name": "INPUT0", "datatype": "FP33", "shape": [1, 16], "data": FP32_16}]},
        "invalid datatype for input INPUT0",
    ),
    (
        "shape missing",
        {"inputs": [{"name": "X", "datatype": "FP32", "data": [1]}]},
        "Unable to parse 'shape': input 'X' needs a 'shape' array of non-negative integers, got None",
    ),
    (
        "negative dim",
        {"inputs": [{"name": "X", "datatype": "FP32", "shape": [-1, 16], "data": FP32_16}]},
        "Unable to parse 'shape': input 'X' needs a 'shape' array of non-negative integers, got [-1, 16]",
    ),
    (
        "float dim",
        {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1.5], "data": [1]}]},
        "Unable to parse 'shape': input 'X' needs a 'shape' array of non-negative integers, got [1.5]",
    ),
    (
        "bool dim",
        {"inputs": [{"name": "X", "datatype": "FP32", "shape": [True], "data": [1]}]},
        "Unable to parse 'shape': input 'X' needs a 'shape' array of non-negative integers, got [True]",
    ),
    (
        "string shape",
        {"inputs": [{"name": "X", "datatype": "FP32", "shape": "1,16", "data": [1]}]},
        "Unable to parse 'shape': input 'X' needs a 'shape' array of non-negative integers, got '1,16'",
    ),
    (
        "count short",
        {"inputs": [dict(GOOD_INPUT, data=FP32_16[:15])]},
        "Unable to parse 'data': Shape does not match true shape of 'data' field",
    ),
    (
        "count long",
        {"inputs": [dict(GOOD_INPUT, data=FP32_16 + [1])]},
        "Unable to parse 'data': Shape does not match true shape of 'data' field",
    ),
    (
        "huge shape json",
        {"inputs": [dict(GOOD_INPUT, shape=[1, 2**40])]},
        "Unable to parse 'data': Shape does not match true shape of 'data' field",
    ),
    (
        "data not array",
        {"inputs": [dict(GOOD_INPUT, data=5)]},
        "Unable to parse 'data': input 'INPUT0' needs a JSON array, got number",
    ),
    (
        "string in FP32",
        {"inputs": [dict(GOOD_INPUT, data=["a"] * 16)]},
        "Unable to parse 'data': FP32 input 'INPUT0' needs numbers, got string",
    ),
    (
        "bool in FP32",
        {"inputs": [dict(GOOD_INPUT, data=[True] * 16)]},
        "Unable to parse 'data': FP32 input 'INPUT0' needs numbers, got boolean",
    ),
    (
        "null in FP32",
        {"inputs": [dict(GOOD_INPUT, data=[None] * 16)]},
        "Unable to parse 'data': FP32 input 'INPUT0' needs numbers, got null",
    ),
    (
        "float in INT32",
        {"inputs": [{"name": "X", "datatype": "INT32", "shape": [2], "data": [1, 2.5]}]},
        "Unable to parse 'data': INT32 input 'X' needs integers, got number",
    ),
    (
        "int in BOOL",
        {"inputs": [{"name": "X", "datatype": "BOOL", "shape": [2], "data": [True, 1]}]},
        "Unable to parse 'data': BOOL input 'X' needs true/false values, got integer",
    ),
    (
        "UINT8 overflow",
        {"inputs": [{"name": "X", "datatype": "UINT8", "shape": [2], "data": [1, 300]}]},
        "Unable to parse 'data': UINT8 input 'X' has a value outside [0, 255]",
    ),
    (
        "UINT8 negative",
        {"inputs": [{"name": "X", "datatype": "UINT8", "shape": [1], "data": [-1]}]},
        "Unable to parse 'data': UINT8 input 'X' has a value outside [0, 255]",
    ),
    (
        "INT64 overflow",
        {"inputs": [{"name": "X", "datatype": "INT64", "shape": [1], "data": [2**63]}]},
        "Unable to parse 'data': INT64 input 'X' has a value outside [-9223372036854775808, 9223372036854775807]",
    ),
    # JSON integers beyond 64 bits are read as floats
    (
        "UINT64 overflow",
        {"inputs": [{"name": "X", "datatype": "UINT64", "shape": [1], "data": [2**64]}]},
        "Unable to parse 'data': UINT64 input 'X' needs integers, got number",
    ),
    (
        "int in BYTES",
        {"inputs": [{"name": "X", "datatype": "BYTES", "shape": [2], "data": ["a", 5]}]},
        "Unable to parse JSON bytes array: input 'X' needs strings, got integer",
    ),
    (
        "duplicate input",
        {"inputs": [GOOD_INPUT, GOOD_INPUT]},
        "[request id: <id_unknown>] input 'INPUT0' already exists in request",
    ),
    (
        "id not string",
        {"inputs": [GOOD_INPUT], "id": 5},
        "Unable to parse 'id': expected a string, got number",
    ),
    (
        "parameters not object",
        {"inputs": [GOOD_INPUT], "parameters": [1]},
        "Unable to parse 'parameters': expected an object, got array",
    ),
    (
        "priority negative",
        {"inputs": [GOOD_INPUT], "parameters": {"priority": -1}},
        "Unable to parse 'priority': expected an unsigned integer, got -1",
    ),
    (
        "priority too big",
        {"inputs": [GOOD_INPUT], "parameters": {"priority": 2**64}},
        "Unable to parse 'priority': expected an unsigned integer, got 1.8446744073709552e+19",
    ),
    (
        "timeout float",
        {"inputs": [GOOD_INPUT], "parameters": {"timeout": 1.5}},
        "Unable to parse 'timeout': expected an unsigned integer, got 1.5",
    ),
    (
        "bdo int",
        {"inputs": [GOOD_INPUT], "parameters": {"binary_data_output": 1}},
        "Unable to parse 'binary_data_output': expected a boolean, got number",
    ),
    (
        "sequence_start int",
        {"inputs": [GOOD_INPUT], "parameters": {"sequence_start": 1}},
        "Unable to parse 'sequence_start': expected a boolean, got number",
    ),
    (
        "sequence_id negative",
        {"inputs": [GOOD_INPUT], "parameters": {"sequence_id": -1}},
        "Unable to parse 'sequence_id': expected an unsigned integer or a string",
    ),
    (
        "triton_ reserved",
        {"inputs": [GOOD_INPUT], "parameters": {"triton_x": 1}},
        "parameter keys starting with 'triton_' are reserved for Triton usage and should not be specified.",
    ),
    (
        "list parameter",
        {"inputs": [GOOD_INPUT], "parameters": {"custom": [1]}},
        "parameter 'custom' has invalid type. It should be either 'int', 'bool', or 'string'.",
    ),
    (
        "null parameter",
        {"inputs": [GOOD_INPUT], "parameters": {"custom": None}},
        "parameter 'custom' has invalid type. It should be either 'int', 'bool', or 'string'.",
    ),
    (
        "outputs not array",
        {"inputs": [GOOD_INPUT], "outputs": {}},
        "Unable to parse 'outputs': expected an array, got object",
    ),
    (
        "output no name",
        {"inputs": [GOOD_INPUT], "outputs": [{}]},
        "Unable to parse 'name': output 0 needs a string 'name'",
    ),
    (
        "output not object",
        {"inputs": [GOOD_INPUT], "outputs": [5]},
        "Unable to parse 'outputs': output 0 must be an object, got number",
    ),
    (
        "binary_data int",
        {"inputs": [GOOD_INPUT], "outputs": [{"name": "O", "parameters": {"binary_data": 1}}]},
        "Unable to parse 'binary_data': output 'O' needs a boolean, got 1",
    ),
    (
        "classification negative",
        {"inputs": [GOOD_INPUT], "outputs": [{"name": "O", "parameters": {"classification": -1}}]},
        "Unable to set 'classification': output 'O' needs an unsigned integer, got -1",
    ),
    (
        "classification bool",
        {"inputs": [GOOD_INPUT], "outputs": [{"name": "O", "parameters": {"classification": True}}]},
        "Unable to set 'classification': output 'O' needs an unsigned integer, got True",
    ),
]


@pytest.mark.parametrize(
    "document, message", [case[1:] for case in JSON_ERRORS], ids=[case[0] for case in JSON_ERRORS]
)
def test_malformed_json_requests_are_400_with_a_clear_message(document, message) -> None:
    error = error_of(json.dumps(document).encode())
    assert (error.code, error.http_status, error.message) == (ErrorCode.INVALID_ARG, 400, message)


@pytest.mark.parametrize(
    "body",
    [
        b'{"inputs": [',
        b"[1, 2]",
        b'"x"',
        b"null",
        b"{} trailing",
        b'{"id": "\xff"}',
        b"\xef\xbb\xbf{",
        b"[" * 5000 + b"]" * 5000,
    ],
    ids=["truncated", "array", "string", "null", "trailing", "invalid utf-8", "bom", "deep nesting"],
)
def test_malformed_json_bodies_are_400(body: bytes) -> None:
    error = error_of(body)
    assert error.http_status == 400
    assert error.message.startswith(
        (
            "failed to parse the request JSON buffer: ",
            "Unable to parse 'inputs': the request JSON must be an object",
        )
    )


def test_shared_memory_references_are_404_as_in_triton() -> None:
    shm_input = {
        "name": "X",
        "datatype": "FP32",
        "shape": [1],
        "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 4},
    }
    error = error_of(json.dumps({"inputs": [shm_input]}).encode())
    assert (error.http_status, error.message) == (404, "Unable to find shared memory region: 'r'")
    shm_output = {"name": "O", "parameters": {"shared_memory_region": "o", "shared_memory_byte_size": 4}}
    error = error_of(json.dumps({"inputs": [GOOD_INPUT], "outputs": [shm_output]}).encode())
    assert (error.http_status, error.message) == (404, "Unable to find shared memory region: 'o'")


def binary_input(name: str, array: np.ndarray, size: int | None = None, shape=None) -> tuple[dict, bytes]:
    raw = array.tobytes()
    return {
        "name": name,
        "datatype": "FP32",
        "shape": list(array.shape) if shape is None else shape,
        "parameters": {"binary_data_size": len(raw) if size is None else size},
    }, raw


ROW = np.arange(16, dtype=np.float32).reshape(1, 16)


@pytest.mark.parametrize(
    "build, header_length, message",
    [
        # Triton 2.51 texts
        (
            lambda i0, r0, i1, r1: ([i0, i1], [r0, r1, b"xx"]),
            None,
            "unexpected additional input data for model 'm'",
        ),
        (
            lambda i0, r0, i1, r1: ([i0, i1], [r0, r1[:-4]]),
            None,
            "unexpected size for input 'INPUT1', expecting 4 additional bytes for model 'm'",
        ),
        (
            lambda i0, r0, i1, r1: ([i0, dict(i1, parameters={"binary_data_size": 2**40})], [r0, r1]),
            None,
            "unexpected size for input 'INPUT1', expecting 1099511627712 additional bytes for model 'm'",
        ),
        (
            lambda i0, r0, i1, r1: ([i0, dict(i1, parameters={"binary_data_size": 60})], [r0, r1[:60]]),
            None,
            "[request id: <id_unknown>] input byte size mismatch for input 'INPUT1' for model 'm'. Expected 64, got 60",
        ),
        (
            lambda i0, r0, i1, r1: ([i0, dict(i1, parameters={"binary_data_size": 68})], [r0, r1 + b"abcd"]),
            None,
            "[request id: <id_unknown>] input byte size mismatch for input 'INPUT1' for model 'm'. Expected 64, got 68",
        ),
        (
            lambda i0, r0, i1, r1: ([i0, dict(i1, parameters={"binary_data_size": 0})], [r0]),
            None,
            "[request id: <id_unknown>] input byte size mismatch for input 'INPUT1' for model 'm'. Expected 64, got 0",
        ),
        (
            lambda i0, r0, i1, r1: ([i0, i1], [r0, r1]),
            10**6,
            "inference header size should be in range (0, {size}), got: 1000000",
        ),
        (
            lambda i0, r0, i1, r1: ([i0, i1], [r0, r1]),
            "-5",
            "inference header size should be in range (0, {size}), got: -5",
        ),
        # ours (Triton reads a garbled header with atoi, i.e. as a raw request)
        (
            lambda i0, r0, i1, r1: ([i0, i1], [r0, r1]),
            "abc",
            "Unable to parse Inference-Header-Content-Length, got: abc",
        ),
        (
            lambda i0, r0, i1, r1: ([i0, dict(i1, parameters={"binary_data_size": -4})], [r0, r1]),
            None,
            "Unable to parse 'binary_data_size': input 'INPUT1' needs a non-negative integer, got -4",
        ),
    ],
    ids=[
        "trailing garbage",
        "truncated",
        "size beyond body",
        "size short",
        "size long",
        "size zero",
        "header beyond body",
        "header negative",
        "header garbled",
        "size negative",
    ],
)
def test_binary_framing_errors(build, header_length, message) -> None:
    i0, r0 = binary_input("INPUT0", ROW)
    i1, r1 = binary_input("INPUT1", ROW)
    inputs, blobs = build(i0, r0, i1, r1)
    body, own_length = raw_body({"inputs": inputs}, *blobs)
    error = error_of(body, own_length if header_length is None else header_length)
    assert error.http_status == 400
    assert error.message == message.format(size=len(body))


def test_binary_params_without_header_length_expect_more_bytes_as_in_triton() -> None:
    i0, _ = binary_input("INPUT0", ROW)
    error = error_of(json.dumps({"inputs": [i0]}).encode())
    assert error.message == "unexpected size for input 'INPUT0', expecting 64 additional bytes for model 'm'"


def test_numbers_beyond_double_range_are_rejected() -> None:
    error = error_of(b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [1e400]}]}')
    assert error.http_status == 400 and error.message.startswith("failed to parse the request JSON buffer: ")
    # the NaN-tolerant fallback parser keeps big integers exact; they are still refused cleanly
    error = error_of(
        b'{"inputs": [{"name": "X", "datatype": "FP32", "shape": [2], "data": [NaN, '
        + str(10**400).encode()
        + b"]}]}"
    )
    assert (
        error.message
        == "Unable to parse 'data': FP32 input 'X' has a value too large for a floating-point number"
    )
    error = error_of(
        b'{"inputs": [{"name": "X", "datatype": "INT8", "shape": [1], "data": [300]}], "id": "NaN"}'
    )
    assert error.message == "Unable to parse 'data': INT8 input 'X' has a value outside [-128, 127]"


@pytest.mark.parametrize("shape", [[0, 2**63], [0, 2**62, 4], [1, 2**61, 8]])
def test_shapes_numpy_cannot_represent_are_400(shape) -> None:
    for tensor in (
        {"name": "X", "datatype": "FP32", "shape": shape, "data": []},
        {"name": "X", "datatype": "BYTES", "shape": shape, "parameters": {"binary_data_size": 0}},
    ):
        error = error_of(*raw_body({"inputs": [tensor]}))
        assert error.message == f"Unable to parse 'shape': input 'X' has shape {shape}, which is too large"


def test_huge_declared_shape_is_rejected_without_allocating() -> None:
    i0, r0 = binary_input("INPUT0", ROW, shape=[1, 2**40])
    body, header_length = raw_body({"inputs": [i0]}, r0)
    json_body, _ = raw_body({"inputs": [dict(GOOD_INPUT, shape=[1, 2**40])]})
    bytes_input = {
        "name": "S",
        "datatype": "BYTES",
        "shape": [1, 2**40],
        "parameters": {"binary_data_size": 12},
    }
    bytes_body, bytes_length = raw_body({"inputs": [bytes_input]}, struct.pack("<I", 8) + b"12345678")
    tracemalloc.start()
    try:
        assert error_of(body, header_length).message == (
            "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'm'. "
            "Expected 4398046511104, got 64"
        )
        assert (
            error_of(json_body).message
            == "Unable to parse 'data': Shape does not match true shape of 'data' field"
        )
        assert error_of(bytes_body, bytes_length).message == (  # Triton 2.51 text
            "[request id: <id_unknown>] expected 1099511627776 string elements for inference input 'S' "
            "for model 'm', got 1"
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def serialized(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


@pytest.mark.parametrize(
    "shape, payload, message",
    [  # Triton 2.51 texts (the last two are its onnxruntime backend's, checked later there)
        (
            [1, 3],
            serialized(b"abc", b""),
            "[request id: <id_unknown>] expected 3 string elements for inference input 'S' for model 'm', got 2",
        ),
        (
            [1, 1],
            serialized(b"abc", b""),
            "[request id: <id_unknown>] unexpected number of string elements 2 for inference input 'S' for model 'm', expecting 1",
        ),
        (
            [1, 3],
            serialized(b"abc", b"", b"\xff\xfe") + b"\x01\x00",
            (
                "[request id: <id_unknown>] incomplete string length indicator for inference input 'S' for model 'm', "
                "expecting 4 bytes but only 2 bytes available. Please make sure the string length indicator is in one buffer."
            ),
        ),
        (
            [1, 2],
            serialized(b"abc") + b"\x01",
            (
                "[request id: <id_unknown>] incomplete string length indicator for inference input 'S' for model 'm', "
                "expecting 4 bytes but only 1 bytes available. Please make sure the string length indicator is in one buffer."
            ),
        ),
        (
            [1, 3],
            serialized(b"abc", b"", b"\xff\xfe")[:-1],
            "incomplete string data for inference input 'S', expecting string of length 2 but only 1 bytes available",
        ),
        (
            [1, 1],
            struct.pack("<I", 1000) + b"abc",
            "incomplete string data for inference input 'S', expecting string of length 1000 but only 3 bytes available",
        ),
        (
            [1, 1],
            serialized(b"abc") + struct.pack("<I", 9) + b"x",
            "incomplete string data for inference input 'S', expecting string of length 9 but only 1 bytes available",
        ),
    ],
    ids=[
        "fewer",
        "more",
        "partial indicator",
        "partial indicator early",
        "truncated data",
        "length beyond",
        "extra truncated",
    ],
)
def test_bytes_framing_errors(shape, payload, message) -> None:
    header = {
        "inputs": [
            {
                "name": "S",
                "datatype": "BYTES",
                "shape": shape,
                "parameters": {"binary_data_size": len(payload)},
            }
        ]
    }
    body, header_length = raw_body(header, payload)
    assert error_of(body, header_length).message == message


def test_bytes_json_count_errors_use_triton_core_wording() -> None:
    cases = (  # Triton 2.51 texts
        ([1, 3], "expected 3 string elements for inference input 'S' for model 'm', got 2"),
        ([1, 1], "unexpected number of string elements 2 for inference input 'S' for model 'm', expecting 1"),
    )
    for shape, message in cases:
        body, _ = raw_body(
            {"inputs": [{"name": "S", "datatype": "BYTES", "shape": shape, "data": ["a", "b"]}]}
        )
        assert error_of(body).message == "[request id: <id_unknown>] " + message


# --- fuzzing the binary framing ---------------------------------------------------------------------


def _valid_request() -> tuple[bytes, int]:
    inputs = [
        client_input("F", sample("FP32", (2, 3)), "FP32", True),
        client_input("S", sample("BYTES", (1, 4)), "BYTES", True),
        client_input("J", sample("INT16", (3,)), "INT16", False),
        client_input("B", sample("BOOL", (2, 2)), "BOOL", True),
    ]
    body, header_length = Client.generate_request_body(inputs)
    return body, header_length


VALID_BODY, VALID_HEADER_LENGTH = _valid_request()


def _decode_or_400(body: bytes, header_length) -> None:
    try:
        request = decode(body, header_length)
    except InferenceError as error:
        assert error.code in (ErrorCode.INVALID_ARG, ErrorCode.NOT_FOUND)
        assert error.http_status in (400, 404) and error.message
        return
    for array in request.inputs.values():  # a successful decode is self-consistent
        assert isinstance(array, np.ndarray)
        if not is_raw_input(array):
            assert array.size == math.prod(array.shape)


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cut=st.integers(0, len(VALID_BODY)),
    header_length=st.one_of(st.none(), st.integers(-5, len(VALID_BODY) + 5)),
)
def test_fuzz_truncations_and_header_lengths(cut: int, header_length) -> None:
    _decode_or_400(VALID_BODY[:cut], None if header_length is None else str(header_length))


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzz_declared_sizes_and_shapes(data: st.DataObject) -> None:
    header = json.loads(VALID_BODY[:VALID_HEADER_LENGTH])
    payload = VALID_BODY[VALID_HEADER_LENGTH:]
    numbers = st.one_of(
        st.integers(-3, 80), st.sampled_from([2**31, 2**32 + 1, 2**40, 2**63, 2**64 - 1, 2**64])
    )
    for tensor in header["inputs"]:
        if data.draw(st.booleans()):
            tensor["shape"] = data.draw(st.lists(numbers, max_size=4))
        if "parameters" in tensor and data.draw(st.booleans()):
            tensor["parameters"]["binary_data_size"] = data.draw(numbers)
    extra = data.draw(st.binary(max_size=12))
    header_bytes = json.dumps(header).encode()
    _decode_or_400(header_bytes + payload + extra, str(len(header_bytes)))


@settings(max_examples=300, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=st.binary(max_size=64), count=st.one_of(st.integers(0, 20), st.just(2**40)))
def test_fuzz_bytes_payloads(payload: bytes, count: int) -> None:
    header = {
        "inputs": [
            {
                "name": "S",
                "datatype": "BYTES",
                "shape": [count],
                "parameters": {"binary_data_size": len(payload)},
            }
        ]
    }
    header_bytes = json.dumps(header).encode()
    _decode_or_400(header_bytes + payload, str(len(header_bytes)))


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=st.binary(max_size=200),
    header_length=st.one_of(st.none(), st.integers(0, 200).map(str), st.text(max_size=5)),
)
def test_fuzz_arbitrary_bodies(body: bytes, header_length) -> None:
    _decode_or_400(body, header_length)


# --- responses read by tritonclient -----------------------------------------------------------------


def respond(
    outputs: dict[str, np.ndarray],
    datatypes: dict[str, str],
    request_outputs=None,
    parameters=None,
    request_id: str = "",
    max_batch_size: int = 0,
    labels=None,
):
    request = decode(*raw_body({"inputs": [], "parameters": parameters or {}, "id": request_id}))
    request.requested_outputs = request_outputs
    response = InferResponse("m", 3, outputs, id=request_id)
    return encode_response(response, request, config_for(datatypes, max_batch_size), labels=labels)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("datatype", NUMERIC + ["BYTES", "BF16"])
def test_every_datatype_encodes_for_tritonclient(datatype: str, binary: bool) -> None:
    array = sample(datatype, (2, 3))
    stored = array.view(np.uint16) if datatype == "BF16" else array  # BF16 outputs travel as bit patterns
    payload, headers = respond(
        {"OUT": stored}, {"OUT": datatype}, [RequestedOutput("OUT", binary_data=binary)]
    )
    result = parse(payload, headers)
    output = result.get_output("OUT")
    assert output["datatype"] == datatype and output["shape"] == [2, 3]
    decoded = result.as_numpy("OUT")
    if datatype == "BYTES" and not binary:  # JSON strings come back as str, as from Triton
        decoded = np.vectorize(lambda s: s.encode(), otypes=[object])(decoded)
    np.testing.assert_array_equal(decoded, array)
    assert ("inference-header-content-length" in headers) == binary
    assert headers["content-type"] == ("application/octet-stream" if binary else "application/json")


def test_response_document_layout_matches_triton() -> None:
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    payload, headers = respond({"B": x, "A": x}, {"A": "FP32", "B": "FP32"}, request_id="abc", parameters={})
    assert headers == {"content-type": "application/json"}
    assert payload == (
        b'{"id":"abc","model_name":"m","model_version":"3","outputs":['
        b'{"name":"A","datatype":"FP32","shape":[1,4],"data":[0.0,1.0,2.0,3.0]},'
        b'{"name":"B","datatype":"FP32","shape":[1,4],"data":[0.0,1.0,2.0,3.0]}]}'
    )
    payload, _ = respond({"A": x}, {"A": "FP32"})
    assert orjson.loads(payload).keys() == {"model_name", "model_version", "outputs"}  # no empty id


def test_binary_outputs_follow_the_json_in_output_order() -> None:
    a, b, c = sample("FP32", (2, 2)), sample("INT8", (3,)), sample("BYTES", (2,))
    requested = [
        RequestedOutput("C", binary_data=True),
        RequestedOutput("A", binary_data=True),
        RequestedOutput("B"),
    ]
    payload, headers = respond({"A": a, "B": b, "C": c}, {"A": "FP32", "B": "INT8", "C": "BYTES"}, requested)
    header_length = int(headers["inference-header-content-length"])
    document = orjson.loads(payload[:header_length])
    assert [o["name"] for o in document["outputs"]] == ["A", "B", "C"]
    assert (
        document["outputs"][0]["parameters"] == {"binary_data_size": 16}
        and "data" not in document["outputs"][0]
    )
    assert document["outputs"][1]["data"] == b.tolist()
    assert (
        payload[header_length:]
        == a.tobytes() + struct.pack("<I", len(c[0])) + c[0] + struct.pack("<I", len(c[1])) + c[1]
    )
    result = parse(payload, headers)
    np.testing.assert_array_equal(result.as_numpy("A"), a)
    np.testing.assert_array_equal(result.as_numpy("C"), c)


def test_binary_data_output_applies_only_to_outputs_not_named() -> None:
    x = np.ones((1, 2), dtype=np.float32)
    payload, headers = respond(
        {"A": x, "B": x}, {"A": "FP32", "B": "FP32"}, parameters={"binary_data_output": True}
    )
    assert all(
        "parameters" in o
        for o in orjson.loads(payload[: int(headers["inference-header-content-length"])])["outputs"]
    )
    payload, headers = respond(
        {"A": x}, {"A": "FP32"}, [RequestedOutput("A")], parameters={"binary_data_output": True}
    )
    assert headers == {
        "content-type": "application/json"
    }  # Triton 2.51: explicit outputs keep their own setting


def test_only_requested_outputs_are_returned_and_duplicates_collapse() -> None:
    x = np.ones((2,), dtype=np.int32)
    requested = [RequestedOutput("B"), RequestedOutput("B", binary_data=True)]
    payload, headers = respond({"A": x, "B": x}, {"A": "INT32", "B": "INT32"}, requested)
    assert headers == {"content-type": "application/json"}
    assert [o["name"] for o in orjson.loads(payload)["outputs"]] == ["B"]


def test_empty_binary_outputs_add_no_header_as_in_triton() -> None:
    payload, headers = respond(
        {"A": np.zeros((0, 3), dtype=np.float32)}, {"A": "FP32"}, [RequestedOutput("A", binary_data=True)]
    )
    assert headers == {"content-type": "application/json"}
    assert orjson.loads(payload)["outputs"][0]["parameters"] == {"binary_data_size": 0}
    assert parse(payload, headers).as_numpy("A").shape == (0, 3)


def test_non_utf8_bytes_requested_as_json_are_sent_binary() -> None:
    array = np.array([b"ok", b"\xff\xfe", "\u00e9".encode()], dtype=np.object_)
    payload, headers = respond({"S": array}, {"S": "BYTES"}, [RequestedOutput("S")])
    assert "inference-header-content-length" in headers
    np.testing.assert_array_equal(parse(payload, headers).as_numpy("S"), array)


def test_str_and_fixed_width_string_outputs_are_bytes_tensors() -> None:
    for array in (
        np.array(["a", "\u00e9"], dtype=np.object_),
        np.array([b"a", b"bc"]),
        np.array(["a", "bc"]),
    ):
        for binary in (True, False):
            payload, headers = respond(
                {"S": array}, {"S": "BYTES"}, [RequestedOutput("S", binary_data=binary)]
            )
            decoded = parse(payload, headers).as_numpy("S").tolist()
            expected = [v.decode() if isinstance(v, bytes) else v for v in array.tolist()]
            assert [v.decode() if isinstance(v, bytes) else v for v in decoded] == expected


def test_non_finite_floats_in_json_are_nan_and_infinity() -> None:
    array = np.array([np.nan, np.inf, -np.inf, 0.5], dtype=np.float32)
    for datatype, stored in (
        ("FP32", array),
        ("FP16", array.astype(np.float16)),
        ("FP64", array.astype(np.float64)),
        ("BF16", bf16_from_float32(array)),
    ):
        payload, headers = respond({"X": stored}, {"X": datatype}, [RequestedOutput("X")])
        assert b"NaN" in payload and b"-Infinity" in payload
        decoded = parse(payload, headers).as_numpy("X").astype(np.float32)
        np.testing.assert_array_equal(decoded, array)


def test_outputs_are_converted_to_the_configured_datatype() -> None:
    payload, headers = respond(
        {"X": np.array([1.5, 2.5], dtype=np.float64)}, {"X": "FP32"}, [RequestedOutput("X", binary_data=True)]
    )
    assert parse(payload, headers).as_numpy("X").dtype == np.float32
    bf16 = np.array([1.5, -2.0], dtype=ml_dtypes.bfloat16)
    for given_as in (bf16, bf16.astype(np.float32)):
        payload, headers = respond({"X": given_as}, {"X": "BF16"}, [RequestedOutput("X", binary_data=True)])
        np.testing.assert_array_equal(parse(payload, headers).as_numpy("X"), bf16)


def test_response_parameters_are_passed_through() -> None:
    request = decode(*raw_body({"inputs": []}))
    response = InferResponse("m", 1, {}, parameters={"sequence_end": True, "count": np.int64(3)})
    payload, _ = encode_response(response, request, config_for({}))
    assert orjson.loads(payload)["parameters"] == {"sequence_end": True, "count": 3}


# --- classification extension (expected strings recorded from Triton 2.51) ---------------------------


@pytest.mark.parametrize(
    "datatype, values, count, batched, shape, strings",
    [
        (
            "FP32",
            [[1, 5, 3], [9, 9, 1]],
            5,
            True,
            [2, 3],
            ["5.000000:1", "3.000000:2", "1.000000:0", "9.000000:0", "9.000000:1", "1.000000:2"],
        ),
        (
            "FP32",
            [[1, 5, 3], [9, 9, 1]],
            2,
            True,
            [2, 2],
            ["5.000000:1", "3.000000:2", "9.000000:0", "9.000000:1"],
        ),
        ("INT32", [[1, -5, 3]], 3, True, [1, 3], ["3:2", "1:0", "-5:1"]),
        ("UINT8", [[1, 5, 3]], 3, True, [1, 3], ["5:1", "3:2", "1:0"]),
        (
            "FP64",
            [[0.1, 1e10, -1e-7]],
            3,
            True,
            [1, 3],
            ["10000000000.000000:1", "0.100000:0", "-0.000000:2"],
        ),
        ("FP32", [[1, 5], [3, 0]], 2, False, [2], ["5.000000:1", "3.000000:2"]),  # no batch dim: one list
    ],
)
def test_classification_matches_triton(datatype, values, count, batched, shape, strings) -> None:
    array = np.array(values, dtype=np.dtype(datatype.replace("FP", "float").lower()))
    for binary in (False, True):
        payload, headers = respond(
            {"OUT": array},
            {"OUT": datatype},
            [RequestedOutput("OUT", binary_data=binary, classification=count)],
            max_batch_size=4 if batched else 0,
        )
        result = parse(payload, headers)
        output = result.get_output("OUT")
        assert output["datatype"] == "BYTES" and output["shape"] == shape
        decoded = result.as_numpy("OUT").reshape(-1).tolist()
        assert [v.decode() if isinstance(v, bytes) else v for v in decoded] == strings


def test_classification_labels_and_unsupported_types() -> None:
    payload, headers = respond(
        {"OUT": np.array([[0.2, 0.7, 0.1]], dtype=np.float32)},
        {"OUT": "FP32"},
        [RequestedOutput("OUT", classification=2)],
        max_batch_size=1,
        labels={"OUT": ["cat", "dog"]},
    )
    assert parse(payload, headers).as_numpy("OUT").tolist() == [["0.700000:1:dog", "0.200000:0:cat"]]
    with pytest.raises(InferenceError) as caught:
        respond(
            {"OUT": np.ones(3, dtype=np.float16)}, {"OUT": "FP16"}, [RequestedOutput("OUT", classification=1)]
        )
    assert caught.value.message == "class result not available for output due to unsupported type 'FP16'"


def test_encode_error() -> None:
    assert orjson.loads(encode_error(InferenceError('bad "x"'))) == {"error": 'bad "x"'}
    assert orjson.loads(encode_error("plain")) == {"error": "plain"}


def test_output_that_does_not_fit_its_configured_datatype_is_a_clear_internal_error():
    """A Python model returning text for an FP32 output: a 500 naming the output and both types."""
    from handlers.errors import ErrorCode
    from handlers.inference import InferRequest, InferResponse
    from handlers.protocol.codec import encode_response

    config = {"max_batch_size": 0, "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [2]}]}
    response = InferResponse("m", 1, {"OUT": np.array(["a", "b"], dtype=object)})
    with pytest.raises(InferenceError) as raised:
        encode_response(response, InferRequest("m", 1, {}), config)
    assert raised.value.code is ErrorCode.INTERNAL
    assert "output 'OUT' of model 'm' holds object data" in raised.value.message and "FP32" in raised.value.message
