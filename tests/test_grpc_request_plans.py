"""gRPC request plans (handlers/protocol/grpc/plans.py): a repeated ModelInferRequest, less its
raw tensor data, is decoded and validated once per model, and later ones are made from its plan.

Every message here is built by tritonclient.grpc (what users send) for a real LoadedModel; what
the plan makes is compared with the full path (decode_infer_request, the limits, validation) on
the same message, field by field, and the full path's errors message by message. The last test
serves Triton's add_sub and checks that requests with one set of fields get their own answers.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2
from tritonclient.grpc._utils import _get_inference_request

from handlers import limits
from handlers.errors import InferenceError
from handlers.inference import InferRequest
from handlers.manifest import ModelSpec
from handlers.model_repository import LoadedModel
from handlers.protocol import plans as http_plans
from handlers.protocol.grpc import plans
from handlers.protocol.grpc.tensors import decode_infer_request
from handlers.protocol.validation import validate_request
from serving import ROOT, serve
from test_request_plans import CONFIG, error_of, sample_inputs  # the HTTP plans' model, error format, inputs
from test_request_plans import assert_same as assert_same_request

PARAMETERS = {"request_id": "req-1", "priority": 2, "timeout": 5000, "sequence_id": 7, "sequence_start": True,
              "parameters": {"custom": "yes"}, "empty_final": True}


@pytest.fixture
def model() -> LoadedModel:
    spec = ModelSpec("m", Path("/nonexistent/m"), (1,), {}, CONFIG)
    return LoadedModel(spec, 1)


def message(seed: int = 0, batch: int = 2, *, strings: bool = False, request_id: str = "",
            priority: int = 0, timeout: int | None = None, sequence_id: int = 0, sequence_start: bool = False,
            parameters: dict | None = None, output: str = "OUT2", empty_final: bool = False) -> bytes:
    """A ModelInferRequest to CONFIG's model as tritonclient.grpc makes it, serialized (as it
    arrives); `empty_final` as its stream client sets it (`enable_empty_final_response`)."""
    tensors = []
    for name, data, datatype in sample_inputs(seed, batch, strings=strings):
        tensor = grpcclient.InferInput(name, list(data.shape), datatype)
        tensor.set_data_from_numpy(data)
        tensors.append(tensor)
    outputs = [grpcclient.InferRequestedOutput("OUT"), grpcclient.InferRequestedOutput(output, class_count=1)]
    request = _get_inference_request("m", tensors, "", request_id, outputs, sequence_id, sequence_start, False,
                                     priority, timeout, parameters)
    if empty_final:
        request.parameters["triton_enable_empty_final_response"].bool_param = True
    return request.SerializeToString()


def parsed(data: bytes):
    return service_pb2.ModelInferRequest.FromString(data)


def full_path(model: LoadedModel, data: bytes) -> tuple[InferRequest, bool]:
    request, empty_final = decode_infer_request(parsed(data), model.spec.config, model_name=model.name,
                                                model_version=model.version)
    limits.LIMITS.check_request(request)
    validate_request(model.spec.config, request, model.io)
    return request, empty_final


def assert_same(made: tuple[InferRequest, bool], expected: tuple[InferRequest, bool]) -> None:
    assert made[1] == expected[1]  # empty_final
    assert_same_request(made[0], expected[0])


@pytest.mark.parametrize("fields", [{}, PARAMETERS])
def test_a_repeated_message_is_made_from_its_plan_as_the_full_path_makes_it(model, fields):
    first = message(0, **fields)
    assert_same(plans.infer_request(model, parsed(first)), full_path(model, first))
    assert len(model.grpc_request_plans) == 1
    assert model.request_plans == {}  # HTTP's are apart
    for seed in (1, 2):
        later = message(seed, **fields)
        made = plans.infer_request(model, parsed(later))
        assert_same(made, full_path(model, later))
        assert made[0].inputs["A"].shape == (2, 2, 2)  # the config's reshape
    assert len(model.grpc_request_plans) == 1


def test_a_planned_message_is_not_decoded_or_validated_again(model, monkeypatch):
    plans.infer_request(model, parsed(message(0)))

    def fail(*args, **kwargs):
        raise AssertionError("the full path ran")

    monkeypatch.setattr(plans, "decode_infer_request", fail)
    monkeypatch.setattr(plans, "validate_request", fail)
    later = message(3)
    made = plans.infer_request(model, parsed(later))
    monkeypatch.undo()
    assert_same(made, full_path(model, later))


def test_planned_requests_do_not_share_what_a_model_may_change(model):
    plans.infer_request(model, parsed(message(0, **PARAMETERS)))
    one, _ = plans.infer_request(model, parsed(message(1, **PARAMETERS)))
    two, _ = plans.infer_request(model, parsed(message(2, **PARAMETERS)))
    assert one.parameters == two.parameters and one.parameters is not two.parameters
    assert one.requested_outputs == two.requested_outputs and one.requested_outputs is not two.requested_outputs
    assert not np.shares_memory(one.inputs["A"], two.inputs["A"])
    one.parameters["custom"] = "changed"
    assert plans.infer_request(model, parsed(message(4, **PARAMETERS)))[0].parameters["custom"] == "yes"


def test_raw_contents_of_another_size_get_the_full_paths_error(model):
    plans.infer_request(model, parsed(message(0)))
    changed = parsed(message(1))
    changed.raw_input_contents[2] = changed.raw_input_contents[2][:-8]  # C: one INT64 short
    data = changed.SerializeToString()
    expected = error_of(lambda: full_path(model, data))
    assert "input byte size mismatch for input 'C'" in expected
    assert error_of(lambda: plans.infer_request(model, parsed(data))) == expected
    assert len(model.grpc_request_plans) == 1


def test_a_lower_element_limit_refuses_a_planned_message(model, monkeypatch):
    plans.infer_request(model, parsed(message(0)))
    monkeypatch.setattr(limits, "LIMITS", limits.Limits(max_tensor_elements=4))
    expected = error_of(lambda: full_path(model, message(1)))
    assert "more than the limit of 4" in expected
    assert error_of(lambda: plans.infer_request(model, parsed(message(1)))) == expected


def test_each_request_keeps_its_own_id(model):
    """The id is not part of the key: a client that numbers its requests has one plan, and each
    request (and error message) carries its own id."""
    for seed in range(3):
        data = message(seed, request_id=f"id-{seed}")
        made = plans.infer_request(model, parsed(data))
        assert_same(made, full_path(model, data))
        assert made[0].id == f"id-{seed}"
    assert len(model.grpc_request_plans) == 1
    refused = message(3, request_id="id-3", output="NOPE")
    assert error_of(lambda: plans.infer_request(model, parsed(refused))) == error_of(lambda: full_path(model, refused))


def test_parameters_in_another_order_share_a_plan(model):
    """Protobuf writes map entries in any order; the key is written with deterministic output
    (entries by key), so two clients' orders of the same parameters have one plan."""
    forward = parsed(message(0, parameters={"a": 1, "b": "two"}))
    backward = parsed(message(1))
    for key, value in reversed(list(forward.parameters.items())):
        backward.parameters[key].CopyFrom(value)
    assert backward.SerializeToString() != forward.SerializeToString()  # the entries' order differs
    plans.infer_request(model, forward)
    made = plans.infer_request(model, backward)
    assert len(model.grpc_request_plans) == 1
    assert made[0].parameters == {"a": 1, "b": "two"}


@pytest.mark.parametrize("kind", ["bytes", "long key"])
def test_messages_whose_request_depends_on_more_than_their_fields_are_not_planned(model, kind):
    for seed in range(3):
        data = (message(seed, strings=True) if kind == "bytes"
                else message(seed, parameters={"note": "x" * http_plans.MAX_HEADER}))
        assert_same(plans.infer_request(model, parsed(data)), full_path(model, data))
    assert model.grpc_request_plans == {}


def test_data_in_typed_contents_is_not_planned():
    """Typed `contents` travel inside the key's fields: such a message is decoded in full."""
    config = {"name": "m", "max_batch_size": 8, "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [4]}],
              "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]}]}
    model = LoadedModel(ModelSpec("m", Path("/nonexistent/m"), (1,), {}, config), 1)
    for seed in range(3):
        request = service_pb2.ModelInferRequest(model_name="m")
        tensor = request.inputs.add(name="A", datatype="FP32", shape=[2, 4])
        tensor.contents.fp32_contents.extend(np.random.default_rng(seed).standard_normal(8).astype(np.float32).tolist())
        data = request.SerializeToString()
        assert_same(plans.infer_request(model, parsed(data)), full_path(model, data))
    assert model.grpc_request_plans == {}


def test_a_refused_request_is_never_planned(model):
    data = message(0, output="NOPE")
    for _ in range(2):
        assert error_of(lambda: plans.infer_request(model, parsed(data))) == error_of(lambda: full_path(model, data))
    assert model.grpc_request_plans == {}


def test_a_model_keeps_at_most_max_plans(model):
    for seed in range(http_plans.MAX_PLANS + 4):
        plans.infer_request(model, parsed(message(seed, parameters={"n": seed})))
    assert len(model.grpc_request_plans) == http_plans.MAX_PLANS
    kept = [parsed(key).parameters["n"].int64_param for key in model.grpc_request_plans]
    assert kept == list(range(4, http_plans.MAX_PLANS + 4))


def test_requests_with_one_set_of_fields_each_get_their_own_data():
    """tritonclient.grpc sends the same fields with new raw contents when only the data changes:
    after the first, the server makes such requests from their plan. Each answer is its own
    request's, one by one and 32 in parallel."""
    with serve(ROOT / "samples" / "quickstart") as server:
        client = grpcclient.InferenceServerClient(server.grpc)

        def send(seed: int, done):
            a = np.random.default_rng(seed).standard_normal((2, 16)).astype(np.float32)
            b = np.random.default_rng(seed + 1000).standard_normal((2, 16)).astype(np.float32)
            inputs = []
            for name, data in (("INPUT0", a), ("INPUT1", b)):
                tensor = grpcclient.InferInput(name, [2, 16], "FP32")
                tensor.set_data_from_numpy(data)
                inputs.append(tensor)
            client.async_infer("add_sub", inputs, lambda result, error: done(a, b, result, error))

        answers: list = []
        finished = threading.Condition()

        def done(a, b, result, error):
            with finished:
                answers.append((a, b, result, error))
                finished.notify_all()

        try:
            for seed in range(3):
                send(seed, done)
                with finished:
                    assert finished.wait_for(lambda: len(answers) == seed + 1, timeout=30)
            for seed in range(10, 42):
                send(seed, done)
            with finished:
                assert finished.wait_for(lambda: len(answers) == 35, timeout=60)
            for a, b, result, error in answers:
                assert error is None
                assert np.array_equal(result.as_numpy("OUTPUT0"), a + b)
                assert np.array_equal(result.as_numpy("OUTPUT1"), a - b)
        finally:
            client.close()
