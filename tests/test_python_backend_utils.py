"""pb_utils (triton_python_backend_utils) as a model sees it, without a server: names,
signatures, values and messages as tritonserver 2.51's python backend has them (recorded from a
real tritonserver 2.51 stub; docs/python-backend.md lists the deliberate deviations)."""

from __future__ import annotations

import asyncio
import json
import logging

import numpy as np
import pytest

from handlers.backends.python import triton_python_backend_utils as pb_utils
from handlers.backends.python.model_runner import describe_exception

# --- module surface ---------------------------------------------------------------------------------


def test_module_has_tritons_names():
    # dir(pb_utils) inside a tritonserver 2.51 model, minus module internals
    triton_names = {
        "InferenceRequest", "InferenceResponse", "Logger", "MetricFamily", "ModelConfig", "PreferredMemory",
        "TRITONSERVER_MEMORY_CPU", "TRITONSERVER_MEMORY_GPU", "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
        "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START", "TRITONSERVER_REQUEST_RELEASE_ALL",
        "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE", "TRITONSERVER_RESPONSE_COMPLETE_FINAL", "TRITON_STRING_TO_NUMPY",
        "Tensor", "TritonError", "TritonModelException", "deserialize_bytes_tensor", "get_input_config_by_name",
        "get_input_tensor_by_name", "get_model_dir", "get_output_config_by_name", "get_output_tensor_by_name",
        "is_model_ready", "load_model", "numpy_to_triton_type", "serialize_byte_tensor", "triton_string_to_numpy",
        "triton_to_numpy_type", "unload_model", "using_decoupled_model_transaction_policy",
    }
    assert triton_names <= set(dir(pb_utils))
    assert pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START == 1 and pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END == 2
    assert pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL == 1 and pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE == 2


# --- Tensor -----------------------------------------------------------------------------------------------


def test_tensor_from_numpy():
    t = pb_utils.Tensor("x", np.ones((2, 3), np.float32))
    assert t.name() == "x" and t.shape() == [2, 3] and t.is_cpu()
    assert t.triton_dtype() == 11  # TYPE_FP32, numpy_to_triton_type numbering
    assert t.as_numpy().dtype == np.float32 and t.as_numpy().flags.writeable


def test_tensor_non_contiguous_input_is_made_contiguous():
    t = pb_utils.Tensor("x", np.arange(12, dtype=np.int32).reshape(3, 4)[:, ::2])
    assert t.shape() == [3, 2] and t.as_numpy().tolist() == [[0, 2], [4, 6], [8, 10]]
    assert t.as_numpy().flags.c_contiguous


def test_tensor_scalar_and_bytes():
    assert pb_utils.Tensor("x", np.array(5, np.int64)).shape() == []
    t = pb_utils.Tensor("s", np.array([[b"a"], [b"bc"]], dtype=object))
    assert t.triton_dtype() == 13 and t.shape() == [2, 1]
    assert pb_utils.Tensor("s", np.array([b"a", b"bc"])).triton_dtype() == 13  # np.bytes_ is BYTES too


@pytest.mark.parametrize(
    "array",
    [np.array(["a", "bc"]), np.array([1j]), np.array([1], dtype=">i4")],
    ids=["unicode", "complex", "big-endian"],
)
def test_tensor_refuses_numpy_types_triton_refuses(array):
    with pytest.raises(pb_utils.TritonModelException, match="^NumPy dtype is not supported.$"):
        pb_utils.Tensor("x", array)


@pytest.mark.parametrize(
    "args, kwargs",
    [(("x", [1, 2]), {}), ((5, np.array([1])), {}), ((), {"name": "x", "data": np.array([1])})],
    ids=["list", "int-name", "keywords"],
)
def test_tensor_signature_is_positional_name_and_ndarray(args, kwargs):
    with pytest.raises(TypeError, match="incompatible constructor arguments"):
        pb_utils.Tensor(*args, **kwargs)


def test_tensor_name_may_be_bytes_as_pybind_allows():
    assert pb_utils.Tensor(b"x", np.zeros(1)).name() == "x"


def test_bf16_input_cannot_be_read_as_numpy():
    from handlers.backends.python.tensor import Tensor

    t = Tensor._wrap("h", np.zeros(2, np.uint16), "BF16")
    assert t.triton_dtype() == 14
    with pytest.raises(pb_utils.TritonModelException, match="Tensor dtype is BF16 and cannot be converted to NumPy"):
        t.as_numpy()


def test_read_only_input_becomes_a_writable_copy():
    from handlers.backends.python.tensor import Tensor

    body = np.frombuffer(b"\x01\x00\x00\x00\x02\x00\x00\x00", dtype=np.int32)
    assert not body.flags.writeable
    t = Tensor._wrap("x", body, "INT32")
    view = t.as_numpy()
    view[0] = 9  # models may write into their inputs, as with Triton's shared-memory copies
    assert t.as_numpy()[0] == 9 and body[0] == 1


def test_dlpack_round_trip_through_numpy():
    t = pb_utils.Tensor("x", np.arange(6, dtype=np.float32).reshape(2, 3))
    capsule = t.to_dlpack()
    assert type(capsule).__name__ == "PyCapsule"
    back = pb_utils.Tensor.from_dlpack("y", capsule)  # a bare capsule (torch.utils.dlpack style)
    assert back.name() == "y" and back.as_numpy().tolist() == [[0, 1, 2], [3, 4, 5]]
    direct = pb_utils.Tensor.from_dlpack("z", np.arange(3, dtype=np.int64))  # an object with __dlpack__
    assert direct.triton_dtype() == 9 and direct.as_numpy().tolist() == [0, 1, 2]


def test_dlpack_refusals():
    with pytest.raises(pb_utils.TritonModelException, match="DLPack does not have support for string tensors."):
        pb_utils.Tensor("s", np.array([b"a"], dtype=object)).to_dlpack()
    with pytest.raises(pb_utils.TritonModelException, match="Tensor must be a DLPack capsule"):
        pb_utils.Tensor.from_dlpack("x", [1, 2, 3])


# --- helpers --------------------------------------------------------------------------------------------


def test_serialize_and_deserialize_bytes():
    assert pb_utils.serialize_byte_tensor(np.array([b"ab", "c"], dtype=object)) == b"\x02\x00\x00\x00ab\x01\x00\x00\x00c"
    assert pb_utils.serialize_byte_tensor(np.array([], dtype=object)) == ()
    assert pb_utils.serialize_byte_tensor(np.array([1.0])) is None
    out = pb_utils.deserialize_bytes_tensor(b"\x02\x00\x00\x00ab\x01\x00\x00\x00c")
    assert out.dtype == object and out.tolist() == [b"ab", b"c"]


def test_type_conversions():
    assert [pb_utils.numpy_to_triton_type(t) for t in (np.float32, np.dtype(np.float32), np.object_, np.bytes_, np.str_, bool)] == [
        11, 11, 13, 13, None, None,
    ]
    assert pb_utils.triton_to_numpy_type(8) is np.int32 and pb_utils.triton_to_numpy_type(13) is np.object_
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    with pytest.raises(KeyError):
        pb_utils.triton_string_to_numpy("TYPE_BF16")


def test_config_lookups():
    config = {"input": [{"name": "A", "data_type": "TYPE_FP32"}], "output": [{"name": "B"}],
              "model_transaction_policy": {"decoupled": True}}
    assert pb_utils.get_input_config_by_name(config, "A")["data_type"] == "TYPE_FP32"
    assert pb_utils.get_input_config_by_name(config, "B") is None
    assert pb_utils.get_output_config_by_name(config, "B") == {"name": "B"}
    assert pb_utils.get_output_config_by_name({}, "B") is None
    assert pb_utils.using_decoupled_model_transaction_policy(config) is True
    assert pb_utils.using_decoupled_model_transaction_policy({}) is False


# --- errors and responses ----------------------------------------------------------------------------------


def test_triton_error_codes_and_defaults():
    assert [(n, int(getattr(pb_utils.TritonError, n))) for n in (
        "UNKNOWN", "INTERNAL", "NOT_FOUND", "INVALID_ARG", "UNAVAILABLE", "UNSUPPORTED", "ALREADY_EXISTS", "CANCELLED")] == [
        ("UNKNOWN", 0), ("INTERNAL", 1), ("NOT_FOUND", 2), ("INVALID_ARG", 3), ("UNAVAILABLE", 4),
        ("UNSUPPORTED", 5), ("ALREADY_EXISTS", 6), ("CANCELLED", 7),
    ]
    error = pb_utils.TritonError("m")
    assert error.message() == "m" and error.code() == pb_utils.TritonError.INTERNAL
    assert repr(error.code()) == "<__ErrorCode.INTERNAL: 1>" and str(error.code()) == "__ErrorCode.INTERNAL"


def test_triton_error_is_not_an_exception_but_model_exception_is():
    assert not issubclass(pb_utils.TritonError, BaseException)
    with pytest.raises(TypeError, match="exceptions must derive from BaseException"):
        raise pb_utils.TritonError("m")  # as in Triton
    assert issubclass(pb_utils.TritonModelException, Exception)


def test_inference_response():
    response = pb_utils.InferenceResponse()
    assert response.output_tensors() == [] and not response.has_error() and response.error() is None
    failed = pb_utils.InferenceResponse(error=pb_utils.TritonError("xx"))
    assert failed.has_error() and failed.error().message() == "xx" and failed.output_tensors() == []
    with pytest.raises(TypeError, match="incompatible constructor arguments"):
        pb_utils.InferenceResponse([1])
    with pytest.raises(TypeError, match="incompatible constructor arguments"):
        pb_utils.InferenceResponse(error="text")
    t = pb_utils.Tensor("OUT", np.zeros(1))
    assert pb_utils.get_output_tensor_by_name(pb_utils.InferenceResponse([t]), "OUT") is t


# --- InferenceRequest (BLS side) ----------------------------------------------------------------------------


def test_bls_request_defaults_and_parameters():
    request = pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=["b", "a", "b"])
    assert (request.request_id(), request.correlation_id(), request.flags(), request.timeout()) == ("", 0, 0, 0)
    assert request.parameters() == "{}" and request.requested_output_names() == {"a", "b"}
    assert request.inputs() == [] and not request.is_cancelled() and request.trace().get_context() is None
    with_parameters = pb_utils.InferenceRequest(
        model_name="m", inputs=[], requested_output_names=[], parameters={"a": 1, "b": "x", "c": True}
    )
    assert with_parameters.parameters() == '{"a": 1, "b": "x", "c": true}'
    assert pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], correlation_id="abc").correlation_id() == "abc"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"parameters": '{"a": 1}'}, "Expect N8pybind114dictE, got <class 'str'>"),
        ({"parameters": {"a": 1.5}}, "Expect parameters values to have type bool/int/str, found type <class 'float'>"),
        ({"parameters": {"a": {"b": 1}}}, "Expect parameters values to have type bool/int/str, found type <class 'dict'>"),
        ({"correlation_id": 1.5}, "Correlation ID must be integer or string"),
    ],
)
def test_bls_request_refusals(kwargs, message):
    with pytest.raises(pb_utils.TritonModelException) as info:
        pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], **kwargs)
    assert str(info.value) == message


def test_bls_request_requires_inputs_outputs_and_model_name():
    with pytest.raises(TypeError, match="incompatible constructor arguments"):
        pb_utils.InferenceRequest(model_name="m", inputs=[])


def test_bls_request_takes_bytes_model_name_as_tritons_bls_example_does():
    request = pb_utils.InferenceRequest(model_name=b"add_sub", inputs=[], requested_output_names=[b"OUTPUT0"])
    assert request.requested_output_names() == {"OUTPUT0"} and request._bls_call().model_name == "add_sub"


@pytest.fixture
def no_runtime():
    """pb_utils as a model's own unit test imports it: no runtime host installed (other tests in
    this process may have installed the serving process's)."""
    from handlers.backends.python import host

    previous = host.current_host()
    host.install_host(None)
    yield
    host.install_host(previous)


def test_bls_outside_a_served_model_is_refused_clearly(no_runtime):
    request = pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[])
    with pytest.raises(pb_utils.TritonModelException, match="BLS needs the serving runtime"):
        request.exec()
    with pytest.raises(pb_utils.TritonModelException, match="Failed to check model readiness"):
        pb_utils.is_model_ready("m")
    with pytest.raises(pb_utils.TritonModelException, match="only available to a model served"):
        pb_utils.get_model_dir()


def test_model_management_is_refused_with_a_reason():
    with pytest.raises(pb_utils.TritonModelException, match="^Failed to load model: loading models at runtime"):
        pb_utils.load_model("m")
    with pytest.raises(pb_utils.TritonModelException, match="^Failed to unload model"):
        pb_utils.unload_model("m")


def test_response_sender_rules():
    from handlers.backends.python.request import InferenceResponseSender

    final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
    sender = InferenceResponseSender()
    with pytest.raises(pb_utils.TritonModelException, match="^Unable to send response. Unsupported flag provided.$"):
        sender.send(pb_utils.InferenceResponse(), flags=4)
    with pytest.raises(pb_utils.TritonModelException, match="Inference Response object must be provided"):
        sender.send()
    with pytest.raises(pb_utils.TritonModelException, match="cannot send complete final before sending a response"):
        sender.send(flags=final)
    sender.send(pb_utils.InferenceResponse())
    with pytest.raises(pb_utils.TritonModelException, match="cannot send more than one response"):
        sender.send(pb_utils.InferenceResponse())
    sender.send(flags=final)
    # response_sender.cc: a model that is not decoupled is told it sent one already, before closed
    with pytest.raises(pb_utils.TritonModelException, match="cannot send more than one response"):
        sender.send(pb_utils.InferenceResponse(), flags=final)
    with pytest.raises(pb_utils.TritonModelException, match="^Unable to send response. Response sender has been closed.$"):
        sender.send(flags=final)
    with pytest.raises(TypeError, match=r"^send\(\): incompatible function arguments"):
        sender.send("not a response")
    assert not sender.is_cancelled()


# --- ModelConfig (auto_complete_config) ---------------------------------------------------------------------------


def _config(**fields):
    base = {"name": "m", "max_batch_size": 0, "input": [], "output": []}
    base.update(fields)
    return pb_utils.ModelConfig(json.dumps(base))


def test_model_config_adds_and_merges():
    config = _config(input=[{"name": "IN", "data_type": "TYPE_INVALID", "dims": []}])
    config.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [4], "optional": True})
    config.add_input({"name": "IN2", "data_type": "TYPE_INT32", "dims": [-1]})
    config.add_output({"name": "OUT", "data_type": "TYPE_FP32", "dims": [4]})
    config.set_max_batch_size(8)
    config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": False})
    d = config.as_dict()
    assert d["input"] == [
        {"name": "IN", "data_type": "TYPE_FP32", "dims": [4], "optional": True},
        {"name": "IN2", "data_type": "TYPE_INT32", "dims": [-1]},
    ]
    assert d["max_batch_size"] == 8 and d["dynamic_batching"] == {} and d["model_transaction_policy"] == {"decoupled": False}


@pytest.mark.parametrize(
    "action, message",
    [
        (lambda c: c.add_input({"name": "IN", "data_type": "TYPE_FP32", "dims": [1], "format": "x"}),
         "input 'IN' in auto-complete-config function for model 'm' contains property other than 'name', 'data_type', 'dims' and 'optional'."),
        (lambda c: c.add_output({"name": "O", "data_type": "TYPE_FP32", "dims": [1], "optional": True}),
         "output 'O' in auto-complete-config function for model 'm' contains property other than 'name', 'data_type' and 'dims'."),
        (lambda c: c.add_input({"data_type": "TYPE_FP32", "dims": [1]}),
         "input in auto-complete-config function for model 'm' is missing 'name' property."),
        (lambda c: c.add_output({"name": "O", "dims": [1]}),
         "output 'O' in auto-complete-config function for model 'm' is missing 'data_type' property."),
        (lambda c: c.add_input({"name": "IN", "data_type": "TYPE_FP32"}),
         "input 'IN' in auto-complete-config function for model 'm' is missing 'dims' property."),
        (lambda c: c.add_input({"name": "A", "data_type": "TYPE_FP32", "dims": [1]}),
         "unable to load model 'm', configuration expects datatype TYPE_INT32 for input 'A', model provides TYPE_FP32"),
        (lambda c: c.add_input({"name": "A", "data_type": "TYPE_INT32", "dims": [3]}),
         "model 'm', tensor 'A': the model expects dims [3] but the model configuration specifies dims [2]"),
        (lambda c: c.add_input({"name": "A", "data_type": "TYPE_INT32", "dims": [2], "optional": True}),
         "model 'm', tensor 'A': the model expects optional True but the model configuration specifies optional False"),
        (lambda c: c.set_max_batch_size(2),
         "configuration specified max_batch_size 4, but in auto-complete-config function for model 'm' specified max_batch_size 2"),
        (lambda c: c.set_model_transaction_policy({"decoupled": True, "x": 1}),
         "model transaction property in auto-complete-config function for model 'm' contains property other than 'decoupled'."),
    ],
)
def test_model_config_errors(action, message):
    config = _config(max_batch_size=4, input=[{"name": "A", "data_type": "TYPE_INT32", "dims": [2], "optional": False}])
    with pytest.raises(ValueError) as info:
        action(config)
    assert str(info.value) == message


def test_model_config_scheduler_and_policy_conflicts():
    with pytest.raises(ValueError, match="Configuration specified scheduling_choice as 'sequence_batching'"):
        _config(sequence_batching={}).set_dynamic_batching()
    config = _config(model_transaction_policy={"decoupled": False})
    with pytest.raises(ValueError, match="trying to change decoupled property in auto-complete-config for model 'm', which is already set to 'False'."):
        config.set_model_transaction_policy({"decoupled": True})


# --- logging and metrics without a runtime ---------------------------------------------------------------------


def test_logger_lines_carry_the_callers_file_and_line(caplog, no_runtime):
    caplog.set_level(logging.DEBUG, logger="handlers.python_model")
    pb_utils.Logger.log_info("hello info"); line = test_logger_lines_carry_the_callers_file_and_line.__code__.co_firstlineno + 2
    pb_utils.Logger.log("warned", pb_utils.Logger.WARNING)
    pb_utils.Logger.log_error("bad")
    pb_utils.Logger.log_verbose("chatty")
    records = [(r.levelname, r.getMessage(), r.filename) for r in caplog.records]
    assert records == [
        ("INFO", "hello info", "test_python_backend_utils.py"),
        ("WARNING", "warned", "test_python_backend_utils.py"),
        ("ERROR", "bad", "test_python_backend_utils.py"),
        ("DEBUG", "chatty", "test_python_backend_utils.py"),
    ]
    assert caplog.records[0].lineno == line


def test_metric_family_semantics_and_messages(no_runtime):
    mf = pb_utils.MetricFamily
    family = mf(name="utils_test_counter", description="a counter", kind=mf.COUNTER)
    metric = family.Metric(labels={"k": "v"})
    metric.increment(2)
    assert metric.value() == 2.0 and family.Metric(labels={"k": "v"}).value() == 2.0  # same labels, same metric
    assert mf(name="utils_test_counter", description="other text", kind=mf.COUNTER).Metric(labels={"k": "v"}).value() == 2.0
    messages = []
    for action in (
        lambda: metric.increment(-1),
        lambda: metric.set(5),
        lambda: metric.observe(5),
        lambda: mf(name="utils_test_counter", description="x", kind=mf.GAUGE),
        lambda: mf(name="bad name", description="x", kind=mf.GAUGE),
        lambda: family.Metric(labels=[1]),
        lambda: family.Metric(buckets=[1.0]),
        lambda: family.Metric(labels={"a": 1}),
    ):
        with pytest.raises(pb_utils.TritonModelException) as info:
            action()
        messages.append(str(info.value))
    assert messages == [
        ("Failed to increment metric value: Failed to process the request for model '', message: "
        "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative values."),
        ("Failed to set metric value: Failed to process the request for model '', message: "
        "TRITONSERVER_METRIC_KIND_COUNTER does not support Set"),
        ("Failed to observe metric value: Failed to process the request for model '', message: "
        "TRITONSERVER_METRIC_KIND_COUNTER does not support Observe"),
        ("Error when creating MetricFamily: Failed to process the request for model '', message: "
        "Family name already exists with different type"),
        "Error when creating MetricFamily: Failed to process the request for model '', message: Invalid metric name",
        "Failed to create metric. Labels must be a dictionary.",
        "Failed to create metric. Unexpected buckets found.",
        ("Error when creating Metric: Failed to process the request for model '', message: "
        "attempt to access JSON non-string as string"),
    ]


def test_histogram_and_gauge(no_runtime):
    mf = pb_utils.MetricFamily
    histogram = mf(name="utils_test_hist", description="h", kind=mf.HISTOGRAM)
    with pytest.raises(pb_utils.TritonModelException, match="^Failed to create metric. Missing required buckets.$"):
        histogram.Metric()
    with pytest.raises(pb_utils.TritonModelException, match="Bucket Boundaries must be strictly sorted"):
        histogram.Metric(labels={"a": "c"}, buckets=[2.0, 1.0])
    h = histogram.Metric(labels={"a": "b"}, buckets=[1.0, 2.0])
    h.observe(1.5)
    with pytest.raises(pb_utils.TritonModelException, match="TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value"):
        h.value()
    with pytest.raises(pb_utils.TritonModelException, match="TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment"):
        h.increment(1)
    gauge = mf(name="utils_test_gauge", description="g", kind=mf.GAUGE).Metric()
    gauge.set(3.5)
    gauge.increment(-1)
    assert gauge.value() == 2.5


def test_metric_store_exposition_matches_tritons_format():
    from prometheus_client import CollectorRegistry

    from handlers.backends.python.metric_store import COUNTER, HISTOGRAM, MetricStore
    from handlers import exposition
    from handlers.exposition import CounterMetric

    store = MetricStore()
    counter = store.metric(store.family("expo_counter", "a counter", COUNTER), {"k": "v"}, None)
    store.update(counter, "increment", 2)
    hist = store.metric(store.family("expo_hist", "h", HISTOGRAM), {"a": "b"}, [1.0, 2.0])
    for value in (1.5, 0.5, 1.0):
        store.update(hist, "observe", value)
    families = {m.name: m for m in store.collect()}
    # Triton's names: a counter without `_total`, a histogram's _count/_sum/_bucket samples
    assert isinstance(families["expo_counter"], CounterMetric)
    assert [(s.name, s.labels, s.value) for s in families["expo_counter"].samples] == [("expo_counter", {"k": "v"}, 2)]
    assert [(s.name, s.labels, s.value) for s in families["expo_hist"].samples] == [
        ("expo_hist_count", {"a": "b"}, 3),
        ("expo_hist_sum", {"a": "b"}, 3.0),
        ("expo_hist_bucket", {"a": "b", "le": "1"}, 2),
        ("expo_hist_bucket", {"a": "b", "le": "2"}, 3),
        ("expo_hist_bucket", {"a": "b", "le": "+Inf"}, 3),
    ]
    registry = CollectorRegistry(auto_describe=False)
    registry.register(store)
    text = exposition.text(registry).decode()
    assert 'expo_counter{k="v"} 2.0' in text and 'expo_hist_bucket{a="b",le="+Inf"} 3.0' in text
    assert "# HELP expo_counter a counter\n# TYPE expo_counter counter\n" in text
    assert "# HELP expo_hist h\n# TYPE expo_hist histogram\n" in text
    assert "_total" not in text


# --- the runner's error formatting ----------------------------------------------------------------------------


def test_exceptions_are_described_as_pybind_prints_them():
    def execute():
        raise ValueError("boom value")

    try:
        execute()
    except ValueError as exc:
        text = describe_exception(exc)
    line = execute.__code__.co_firstlineno + 1
    # "Type: message", then the frames innermost first (pybind11's error_already_set::what())
    assert text.startswith("ValueError: boom value\n\nAt:\n" f"  {__file__}({line}): execute\n")
    assert text.endswith(": test_exceptions_are_described_as_pybind_prints_them\n")


def test_async_exec_needs_a_running_loop_and_a_runtime(no_runtime):
    request = pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[])

    async def call():
        return request.async_exec()

    with pytest.raises(pb_utils.TritonModelException, match="BLS needs the serving runtime"):
        asyncio.run(call())


def test_a_name_the_module_lacks_fails_under_tritons_module_name():
    """A model calling something python_backend does not have (a public model.py called
    `pb_utils.get_model_config()`) reads Triton's wording, not this runtime's package path."""
    with pytest.raises(AttributeError) as caught:
        pb_utils.get_model_config()
    assert str(caught.value) == "module 'triton_python_backend_utils' has no attribute 'get_model_config'"
    assert not hasattr(pb_utils, "get_model_config") and hasattr(pb_utils, "get_output_config_by_name")
