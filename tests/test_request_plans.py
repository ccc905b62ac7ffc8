"""Request plans (handlers/protocol/plans.py): a repeated JSON header is decoded and validated
once per model, and later requests with the same header are made from its plan.

Every request here is built by tritonclient (what users send) for a real LoadedModel; what the
plan makes is compared with the full path (codec.decode_request, the limits, validation) on the
same body, field by field, and the full path's errors are compared message by message.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import tritonclient.http as httpclient

from handlers import limits
from handlers.errors import InferenceError
from handlers.inference import InferRequest
from handlers.manifest import ModelSpec
from handlers.model_repository import LoadedModel
from handlers.protocol import codec, plans
from handlers.protocol.binary import split_body
from handlers.protocol.codec import decode_request, tensor_datatype
from handlers.protocol.validation import validate_request

CONFIG = {
    "name": "m",
    "max_batch_size": 8,
    "input": [
        {"name": "A", "data_type": "TYPE_FP32", "dims": [4], "reshape": {"shape": [2, 2]}},
        {"name": "B", "data_type": "TYPE_BF16", "dims": [-1]},
        {"name": "C", "data_type": "TYPE_INT64", "dims": [1]},
        {"name": "S", "data_type": "TYPE_STRING", "dims": [1], "optional": True},
    ],
    "output": [
        {"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]},
        {"name": "OUT2", "data_type": "TYPE_INT32", "dims": [1]},
    ],
}


@pytest.fixture
def model() -> LoadedModel:
    spec = ModelSpec("m", Path("/nonexistent/m"), (1,), {}, CONFIG)
    return LoadedModel(spec, 1)


def sample_inputs(seed: int, batch: int, *, strings: bool = False) -> list[tuple[str, np.ndarray, str]]:
    """(name, data, datatype) of CONFIG's inputs for `batch` rows drawn from `seed` (with `strings`,
    the BYTES input S too): what both protocols' plan tests send."""
    rng = np.random.default_rng(seed)
    inputs = [("A", rng.standard_normal((batch, 4)).astype(np.float32), "FP32"),
              ("B", rng.standard_normal((batch, 3)).astype(ml_dtypes.bfloat16), "BF16"),
              ("C", rng.integers(0, 1000, (batch, 1)), "INT64")]
    if strings:
        inputs.append(("S", np.array([[b"x%d" % (seed + i)] for i in range(batch)], dtype=np.object_), "BYTES"))
    return inputs


def body(seed: int = 0, batch: int = 2, *, strings: bool = False, json_data: bool = False,
         request_id: str = "", parameters: dict | None = None, output: str = "OUT2") -> tuple[bytes, str | None]:
    """A request to CONFIG's model as tritonclient makes it; `parameters`: generate_request_body's
    keyword arguments (sequence, priority, timeout, custom `parameters`)."""
    tensors = []
    for name, data, datatype in sample_inputs(seed, batch, strings=strings):
        tensor = httpclient.InferInput(name, list(data.shape), datatype)
        # BF16: binary only; S (BYTES) always binary, as before
        tensor.set_data_from_numpy(data, binary_data=datatype in ("BF16", "BYTES") or not json_data)
        tensors.append(tensor)
    outputs = [httpclient.InferRequestedOutput("OUT", binary_data=True),
               httpclient.InferRequestedOutput(output, binary_data=False, class_count=1)]
    raw, length = httpclient.InferenceServerClient.generate_request_body(
        tensors, outputs=outputs, request_id=request_id, **(parameters or {}))
    return bytes(raw), None if length is None else str(length)


def full_path(model: LoadedModel, raw: bytes, length: str | None) -> InferRequest:
    request = decode_request(raw, length, model_name=model.name, model_version=model.version)
    limits.LIMITS.check_request(request)
    validate_request(model.spec.config, request, model.io)
    return request


def error_of(call) -> str:
    with pytest.raises(InferenceError) as caught:
        call()
    return f"{type(caught.value).__name__}: {caught.value}"


def assert_same(made: InferRequest, expected: InferRequest) -> None:
    for field in ("model_name", "model_version", "id", "parameters", "requested_outputs", "batch_size",
                  "priority", "timeout_us", "correlation_id", "flags", "frontend_parameters", "responses"):
        assert getattr(made, field) == getattr(expected, field), field
    assert list(made.inputs) == list(expected.inputs)
    for name, array in expected.inputs.items():
        assert tensor_datatype(made.inputs[name]) == tensor_datatype(array), name
        assert made.inputs[name].shape == array.shape, name
        if array.dtype == np.object_:
            assert made.inputs[name].tolist() == array.tolist(), name
        else:
            assert made.inputs[name].tobytes() == array.tobytes(), name


PARAMETERS = {"priority": 2, "timeout": 5000, "sequence_id": 7, "sequence_start": True,
              "parameters": {"custom": "yes"}}


@pytest.mark.parametrize("request_id, parameters", [("", None), ("req-1", PARAMETERS)])
def test_a_repeated_header_is_made_from_its_plan_as_the_full_path_makes_it(model, request_id, parameters):
    first = body(0, request_id=request_id, parameters=parameters)
    made = plans.infer_request(model, *first)
    assert_same(made, full_path(model, *first))
    if parameters:  # what the header sets reaches the request
        assert (made.id, made.priority, made.timeout_us, made.correlation_id, made.flags) == ("req-1", 2, 5000, 7,
                                                                                             codec.SEQUENCE_START)
        assert made.parameters["custom"] == "yes"
    assert len(model.request_plans) == 1
    for seed in (1, 2):  # the same header, other tensor data
        later = body(seed, request_id=request_id, parameters=parameters)
        assert later[0][:int(later[1])] == first[0][:int(first[1])]
        made = plans.infer_request(model, *later)
        assert_same(made, full_path(model, *later))
        assert made.requested_outputs[1].classification == 1
        assert made.inputs["A"].shape == (2, 2, 2)  # the config's reshape, as validation gives it
        assert made.batch_size == 2
    assert len(model.request_plans) == 1


def test_a_planned_header_is_not_parsed_again(model, monkeypatch):
    plans.infer_request(model, *body(0))

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoded although the header is planned")

    monkeypatch.setattr(plans, "decode_framing", no_decoding)
    monkeypatch.setattr(plans, "validate_request", no_decoding)
    made = plans.infer_request(model, *body(3))
    monkeypatch.undo()
    assert_same(made, full_path(model, *body(3)))


def test_planned_requests_do_not_share_what_a_model_may_change(model):
    plans.infer_request(model, *body(0, parameters=PARAMETERS))
    one = plans.infer_request(model, *body(1, parameters=PARAMETERS))
    two = plans.infer_request(model, *body(2, parameters=PARAMETERS))
    one.parameters["custom"] = "changed"
    one.requested_outputs.clear()
    one.inputs.clear()
    assert two.parameters["custom"] == "yes"
    assert [output.name for output in two.requested_outputs] == ["OUT", "OUT2"]
    assert list(two.inputs) == ["A", "B", "C"]
    assert plans.infer_request(model, *body(4, parameters=PARAMETERS)).parameters["custom"] == "yes"


@pytest.mark.parametrize("change", ["trailing bytes", "missing bytes"])
def test_a_payload_of_another_size_takes_the_full_path_and_its_error(model, change):
    raw, length = body(0)
    plans.infer_request(model, raw, length)
    changed = raw + b"\0" * 8 if change == "trailing bytes" else raw[:-8]
    fresh = LoadedModel(model.spec, 1)
    expected = error_of(lambda: full_path(fresh, changed, length))
    assert error_of(lambda: plans.infer_request(model, changed, length)) == expected
    assert ("unexpected additional input data" in expected) == (change == "trailing bytes")
    assert len(model.request_plans) == 1


def test_a_lower_element_limit_refuses_a_planned_header(model, monkeypatch):
    raw, length = body(0)
    plans.infer_request(model, raw, length)
    monkeypatch.setattr(limits, "LIMITS", limits.Limits(max_tensor_elements=6))  # A has 2 x 4 elements
    expected = error_of(lambda: full_path(model, raw, length))
    assert "more than the limit of 6" in expected
    assert error_of(lambda: plans.infer_request(model, raw, length)) == expected


@pytest.mark.parametrize("kind", ["BYTES input", "JSON data", "raw request", "long header"])
def test_headers_whose_request_depends_on_more_than_their_bytes_are_not_planned(model, kind):
    if kind == "raw request":
        config = {"name": "r", "max_batch_size": 0,
                  "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [4]}],
                  "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [4]}]}
        model = LoadedModel(ModelSpec("r", Path("/nonexistent/r"), (1,), {}, config), 1)
        requests = [(np.arange(4, dtype=np.float32) + i).tobytes() for i in range(2)]
        for raw in requests:
            made = plans.infer_request(model, raw, "0")
            assert made.inputs["X"].tobytes() == raw
    else:
        for seed in (0, 1):
            if kind == "long header":
                raw, length = body(seed, request_id="x" * plans.MAX_HEADER)
            else:
                raw, length = body(seed, strings=kind == "BYTES input", json_data=kind == "JSON data")
            assert_same(plans.infer_request(model, raw, length), full_path(model, raw, length))
    assert model.request_plans == {}


def test_a_refused_request_is_never_planned(model):
    raw, length = body(0, output="NOPE")
    expected = error_of(lambda: full_path(model, raw, length))
    assert "unexpected inference output 'NOPE'" in expected
    for _ in range(2):
        assert error_of(lambda: plans.infer_request(model, raw, length)) == expected
    assert model.request_plans == {}


def test_a_model_keeps_at_most_max_plans(model):
    for index in range(plans.MAX_PLANS + 5):
        plans.infer_request(model, *body(index, request_id=f"id-{index}"))
    assert len(model.request_plans) == plans.MAX_PLANS
    kept = [json.loads(key)["id"] for key in model.request_plans]
    assert kept == [f"id-{index}" for index in range(5, plans.MAX_PLANS + 5)]  # the oldest went first
    raw, length = body(99, request_id=f"id-{plans.MAX_PLANS + 4}")
    assert_same(plans.infer_request(model, raw, length), full_path(model, raw, length))


def test_a_reloaded_model_starts_without_plans(model):
    plans.infer_request(model, *body(0))
    assert len(model.request_plans) == 1
    assert LoadedModel(model.spec, 1).request_plans == {}


def test_the_codec_reports_binary_spans_only_for_fixed_size_binary_inputs():
    raw, length = body(0)
    framing = split_body(raw, int(length))
    request, spans = codec.decode_framing(framing, model_name="m")
    assert [(s.name, s.datatype, s.shape) for s in spans] == [("A", "FP32", (2, 4)), ("B", "BF16", (2, 3)),
                                                              ("C", "INT64", (2, 1))]
    assert [s.end - s.start for s in spans] == [32, 12, 16]
    assert spans[0].start == 0 and spans[1].start == spans[0].end and spans[2].start == spans[1].end
    for span in spans:
        assert framing.payload[span.start:span.end].tobytes() == request.inputs[span.name].tobytes()
    raw, length = body(0, strings=True)
    assert codec.decode_framing(split_body(raw, int(length)), model_name="m")[1] is None
