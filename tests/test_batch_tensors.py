"""Batch inputs and batch outputs (ragged batching) for the onnxruntime and pytorch backends.

The served part is Triton's own acceptance test, qa/L0_batch_input: its models as
qa/common/gen_qa_ragged_models.py and gen_qa_identity_models.py make them (the same ONNX graphs
and TorchScript modules), renamed and edited as its test.sh edits them, and its eight cases with
their expected values, sent as batch_input_test.py sends them (four requests on one gRPC stream,
batched by a 1 s queue delay). `toolkit serve` runs them; tritonclient reads the answers. Then the
rules of each kind with the numbers of Triton's backend library (BackendInputCollector,
BackendOutputResponder), what goes wrong with a clear error, and the TorchScript argument each
batch input fills."""

from __future__ import annotations

import queue
import textwrap
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from cli_runner import invoke
from onnx import TensorProto, helper
from serving import serve
from torch_models import save_script

import model_builders as mb
from handlers.batching.batch_tensors import BatchInput, BatchOutput, split_batch
from handlers.inference import InferRequest

BATCH_INPUT_CONFIG = """
name: "{name}"
backend: "{backend}"
max_batch_size: 4
version_policy: {{ latest {{ num_versions: 1 }} }}
input [ {{ name: "RAGGED_INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
output [ {{ name: "RAGGED_OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "BATCH_AND_SIZE_OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "BATCH_OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
batch_input [
  {{ kind: BATCH_ELEMENT_COUNT target_name: "BATCH_AND_SIZE_INPUT" data_type: TYPE_FP32 source_input: "RAGGED_INPUT" }},
  {{ kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "BATCH_INPUT" data_type: TYPE_FP32 source_input: "RAGGED_INPUT" }}
]
dynamic_batching {{ max_queue_delay_microseconds: 1000000 }}
"""
BATCH_ITEM_CONFIG = """
name: "batch_item"
backend: "{backend}"
max_batch_size: 4
version_policy: {{ latest {{ num_versions: 1 }} }}
input [ {{ name: "RAGGED_INPUT" data_type: TYPE_FP32 dims: [ -1, -1 ] allow_ragged_batch: true }} ]
output [ {{ name: "BATCH_OUTPUT" data_type: TYPE_FP32 dims: [ 2 ] }} ]
batch_input [ {{ kind: BATCH_ITEM_SHAPE target_name: "BATCH_INPUT" data_type: TYPE_FP32 source_input: "RAGGED_INPUT" }} ]
dynamic_batching {{ max_queue_delay_microseconds: 1000000 }}
"""
# gen_qa_identity_models' nobatch identity (INPUT0 -> OUTPUT0, dims [-1]) as test.sh turns it into ragged_io
RAGGED_IO_CONFIG = """
name: "ragged_io"
backend: "{backend}"
max_batch_size: 4
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
batch_output [{{target_name: "OUTPUT0" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "INPUT0" }}]
dynamic_batching {{ max_queue_delay_microseconds: 1000000 }}
"""


class BatchInputNet(torch.nn.Module):
    """gen_qa_ragged_models' libtorch_batch_input: every input broadcast over the batch."""

    def forward(self, BATCH_INPUT, BATCH_AND_SIZE_INPUT, RAGGED_INPUT):  # noqa: N803 (Triton's names)
        batch_entry = (BATCH_AND_SIZE_INPUT / BATCH_AND_SIZE_INPUT).view(-1, 1)
        batch_output = torch.matmul(batch_entry, BATCH_INPUT.view(1, -1))
        batch_and_size_output = torch.matmul(batch_entry, BATCH_AND_SIZE_INPUT.view(1, -1))
        ragged_output = torch.matmul(batch_entry, RAGGED_INPUT.view(1, -1))
        return ragged_output, batch_and_size_output, batch_output


class BatchItemNet(torch.nn.Module):
    def forward(self, RAGGED_INPUT, BATCH_INPUT):  # noqa: N803
        return BATCH_INPUT


class Identity(torch.nn.Module):
    def forward(self, INPUT0):  # noqa: N803
        return INPUT0 + 0


def _onnx_batch_input(path: Path) -> None:
    """gen_qa_ragged_models' create_onnx_modelfile."""
    io = lambda name, dims: helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)  # noqa: E731
    shape = helper.make_node("Constant", [], ["shape"], value=helper.make_tensor("s", TensorProto.INT64, [2], [1, -1]))
    expander = helper.make_node(
        "Constant", [], ["expander_shape"], value=helper.make_tensor("e", TensorProto.INT64, [2], [-1, 1]))
    mb.save_graph(
        path,
        [io("RAGGED_INPUT", ["a"]), io("BATCH_AND_SIZE_INPUT", ["b"]), io("BATCH_INPUT", ["c"])],
        [io("RAGGED_OUTPUT", ["d", "e"]), io("BATCH_AND_SIZE_OUTPUT", ["f", "g"]), io("BATCH_OUTPUT", ["h", "i"])],
        [
            shape, expander,
            helper.make_node("Reshape", ["RAGGED_INPUT", "shape"], ["in_mat"]),
            helper.make_node("Reshape", ["BATCH_AND_SIZE_INPUT", "shape"], ["bs_mat"]),
            helper.make_node("Reshape", ["BATCH_INPUT", "shape"], ["batch_mat"]),
            helper.make_node("Div", ["BATCH_AND_SIZE_INPUT", "BATCH_AND_SIZE_INPUT"], ["output_expander_int"]),
            helper.make_node("Reshape", ["output_expander_int", "expander_shape"], ["output_expander"]),
            helper.make_node("MatMul", ["output_expander", "in_mat"], ["RAGGED_OUTPUT"]),
            helper.make_node("MatMul", ["output_expander", "bs_mat"], ["BATCH_AND_SIZE_OUTPUT"]),
            helper.make_node("MatMul", ["output_expander", "batch_mat"], ["BATCH_OUTPUT"]),
        ],
    )


def _onnx_batch_item(path: Path) -> None:
    mb.save_graph(
        path,
        [helper.make_tensor_value_info("RAGGED_INPUT", TensorProto.FLOAT, ["a"]),
         helper.make_tensor_value_info("BATCH_INPUT", TensorProto.FLOAT, ["b", 2])],
        [helper.make_tensor_value_info("BATCH_OUTPUT", TensorProto.FLOAT, ["c", "d"])],
        [helper.make_node("Identity", ["BATCH_INPUT"], ["BATCH_OUTPUT"])],
    )


def _onnx_identity(path: Path) -> None:
    mb.save_graph(
        path,
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["a"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["b"])],
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
    )


def _write(repo: Path, name: str, config: str, make_file) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(textwrap.dedent(config).lstrip())
    make_file(repo / name / "1")


def _qa_repository(repo: Path, backend: str) -> None:
    """test.sh's models/ for one backend, with its edits (sed) made to the configs."""
    onnx = backend == "onnxruntime"
    batch_input = (lambda d: _onnx_batch_input(d / "model.onnx")) if onnx else (
        lambda d: save_script(BatchInputNet(), d / "model.pt"))
    def base(name: str) -> str:
        return BATCH_INPUT_CONFIG.format(name=name, backend=backend)

    _write(repo, "ragged_element_count_acc_zero", base("ragged_element_count_acc_zero"), batch_input)
    acc_shape = base("ragged_acc_shape").replace(
        "BATCH_ELEMENT_COUNT", "BATCH_ACCUMULATED_ELEMENT_COUNT").replace(
        "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE")
    _write(repo, "ragged_acc_shape", acc_shape, batch_input)
    flatten = base("batch_item_flatten").replace("-1", "-1, -1", 1).replace(
        "BATCH_ELEMENT_COUNT", "BATCH_ACCUMULATED_ELEMENT_COUNT").replace(
        "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "BATCH_ITEM_SHAPE_FLATTEN")
    _write(repo, "batch_item_flatten", flatten, batch_input)
    _write(repo, "batch_item", BATCH_ITEM_CONFIG.format(backend=backend),
           (lambda d: _onnx_batch_item(d / "model.onnx")) if onnx else (lambda d: save_script(BatchItemNet(), d / "model.pt")))
    _write(repo, "ragged_io", RAGGED_IO_CONFIG.format(backend=backend),
           (lambda d: _onnx_identity(d / "model.onnx")) if onnx else (lambda d: save_script(Identity(), d / "model.pt")))


@pytest.fixture(scope="module", params=["onnxruntime", "pytorch"])
def server(request, tmp_path_factory):
    repo = tmp_path_factory.mktemp(f"batch-input-{request.param}") / "models"
    _qa_repository(repo, request.param)
    with serve(repo, "--device", "cpu") as running:
        yield running


def _stream(server, model: str, shapes: list[list[int]], output: str) -> list[np.ndarray]:
    """batch_input_test.py: one request per shape, filled with its first dimension's size, all on
    one stream; the answers in the order they come."""
    client = grpcclient.InferenceServerClient(server.grpc)
    answers: queue.Queue = queue.Queue()
    client.start_stream(callback=partial(lambda q, result, error: q.put(error or result), answers))
    try:
        for shape in shapes:
            tensor = grpcclient.InferInput("RAGGED_INPUT" if model != "ragged_io" else "INPUT0", shape, "FP32")
            tensor.set_data_from_numpy(np.full(shape, shape[1] if len(shape) == 2 else shape[0], np.float32))
            client.async_stream_infer(model_name=model, inputs=[tensor],
                                      outputs=[grpcclient.InferRequestedOutput(output)])
        results = [answers.get(timeout=30) for _ in shapes]
    finally:
        client.stop_stream()
        client.close()
    for result in results:
        assert not isinstance(result, Exception), result
    return [result.as_numpy(output) for result in results]


RAGGED = [[1, 2], [1, 4], [1, 1], [1, 3]]  # set_inputs([[2], [4], [1], [3]]): shapes [1, n] holding n


def test_ragged_output(server):
    """ragged_io: the identity's flat output scattered back by each request's input shape."""
    got = _stream(server, "ragged_io", RAGGED, "OUTPUT0")
    for answer, n in zip(got, (2, 4, 1, 3)):
        np.testing.assert_array_equal(answer, np.full((1, n), n, np.float32))


def test_ragged_input(server):
    expected = np.asarray([[2, 2, 4, 4, 4, 4, 1, 3, 3, 3]], np.float32)
    for answer in _stream(server, "ragged_acc_shape", RAGGED, "RAGGED_OUTPUT"):
        np.testing.assert_array_equal(answer, expected)


def test_element_count(server):
    for answer in _stream(server, "ragged_element_count_acc_zero", RAGGED, "BATCH_AND_SIZE_OUTPUT"):
        np.testing.assert_array_equal(answer, np.asarray([[2, 4, 1, 3]], np.float32))


def test_accumulated_element_count(server):
    for answer in _stream(server, "ragged_acc_shape", RAGGED, "BATCH_AND_SIZE_OUTPUT"):
        np.testing.assert_array_equal(answer, np.asarray([[2, 6, 7, 10]], np.float32))


def test_accumulated_element_count_with_zero(server):
    for answer in _stream(server, "ragged_element_count_acc_zero", RAGGED, "BATCH_OUTPUT"):
        np.testing.assert_array_equal(answer, np.asarray([[0, 2, 6, 7, 10]], np.float32))


def test_max_element_count_as_shape(server):
    assert [a.shape for a in _stream(server, "ragged_acc_shape", RAGGED, "BATCH_OUTPUT")] == [(1, 4)] * 4


def test_batch_item_shape_flatten(server):
    shapes = [[1, 4, 1], [1, 1, 2], [1, 1, 2], [1, 2, 2]]
    for answer in _stream(server, "batch_item_flatten", shapes, "BATCH_OUTPUT"):
        np.testing.assert_array_equal(answer, np.asarray([[4, 1, 1, 2, 1, 2, 2, 2]], np.float32))


def test_batch_item_shape(server):
    got = _stream(server, "batch_item", [[2, 1, 2], [1, 1, 2], [1, 2, 2]], "BATCH_OUTPUT")
    expected = [[[1.0, 2.0], [1.0, 2.0]], [[1.0, 2.0]], [[2.0, 2.0]]]
    for answer, want in zip(got, expected):
        np.testing.assert_array_equal(answer, np.asarray(want, np.float32))


def test_ragged_output_over_http_from_concurrent_clients(server):
    """The same scatter over HTTP (JSON and binary answers), four clients' requests in one batch."""
    client = httpclient.InferenceServerClient(server.url, concurrency=4)
    try:
        pending = []
        for n, binary in ((3, True), (1, False), (5, True), (2, False)):
            tensor = httpclient.InferInput("INPUT0", [1, n], "FP32")
            tensor.set_data_from_numpy(np.arange(n, dtype=np.float32).reshape(1, n) + n, binary_data=binary)
            pending.append((n, client.async_infer(
                "ragged_io", [tensor], outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)])))
        for n, call in pending:
            np.testing.assert_array_equal(call.get_result(timeout=30).as_numpy("OUTPUT0"),
                                          np.arange(n, dtype=np.float32).reshape(1, n) + n)
        statistics = client.get_inference_statistics("ragged_io")["model_stats"][0]
        assert statistics["execution_count"] < statistics["inference_count"]  # batched, not one by one
    finally:
        client.close()


# -- the rules, with the numbers of Triton's backend library ------------------------------------------


def _requests(*shapes, name: str = "X", dtype=np.float32) -> list[InferRequest]:
    return [InferRequest("m", 1, {name: np.zeros(shape, dtype)}) for shape in shapes]


@pytest.mark.parametrize("kind, data_type, expected", [
    ("BATCH_ELEMENT_COUNT", "TYPE_INT32", np.array([6, 3, 8], np.int32)),
    ("BATCH_ACCUMULATED_ELEMENT_COUNT", "TYPE_INT32", np.array([6, 9, 17], np.int32)),
    ("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "TYPE_FP32", np.array([0, 6, 9, 17], np.float32)),
    ("BATCH_ITEM_SHAPE", "TYPE_INT32", np.array([[3], [3], [3], [8]], np.int32)),
    ("BATCH_ITEM_SHAPE_FLATTEN", "TYPE_FP32", np.array([3, 3, 3, 8], np.float32)),
])
def test_each_kind_counts_the_source_with_its_batch_dimension(kind, data_type, expected):
    """Requests of shapes [2, 3], [1, 3], [1, 8]: element counts 6, 3, 8 (the batch dimension
    counts, GetElementCount of the request's shape); batch items 2 + 1 + 1."""
    batch_input = BatchInput({"kind": kind, "target_name": ["T"], "data_type": data_type, "source_input": ["X"]})
    got = batch_input.tensor(_requests((2, 3), (1, 3), (1, 8)))
    assert got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


def test_the_max_element_count_is_a_shape():
    batch_input = BatchInput({"kind": "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", "target_name": ["T"],
                              "data_type": "TYPE_FP32", "source_input": ["X"]})
    assert batch_input.tensor(_requests((2, 3), (1, 3), (1, 8))).shape == (8,)


def _scatter(config_output: dict, max_batch_size: int = 4) -> BatchOutput:
    config = {"name": "m", "max_batch_size": max_batch_size, "output": [{"name": "Y", "data_type": "TYPE_FP32", **config_output}]}
    return BatchOutput({"target_name": ["Y"], "kind": "BATCH_SCATTER_WITH_INPUT_SHAPE", "source_input": ["X"]}, config)


def test_a_batch_output_takes_the_source_inputs_sizes_and_the_reshape():
    """Shape [-1] + reshape.shape (else dims), each -1 from the source input's request shape at
    the same position; consecutive elements of the flat output, whatever shape the model gave it."""
    requests = _requests((1, 2, 3), (1, 4, 3))
    produced = np.arange(18, dtype=np.float32).reshape(3, 6)
    parts = _scatter({"dims": [-1, 3]}).scatter(produced, requests)
    assert [p.shape for p in parts] == [(1, 2, 3), (1, 4, 3)]
    np.testing.assert_array_equal(np.concatenate([p.reshape(-1) for p in parts]), produced.reshape(-1))
    reshaped = _scatter({"dims": [6], "reshape": {"shape": [-1, 3]}}).scatter(produced, requests)
    assert [p.shape for p in reshaped] == [(1, 2, 3), (1, 4, 3)]
    unbatched = _scatter({"dims": [-1]}, max_batch_size=0).scatter(produced, _requests((5,), (7,)))
    assert [p.shape for p in unbatched] == [(5,), (7,)]


def test_split_batch_scatters_batch_outputs_and_cuts_the_rest_by_the_batch_dimension():
    requests = _requests((1, 2), (1, 3))
    parts = split_batch({"Y": np.arange(5, dtype=np.float32), "Z": np.array([[7], [8]], np.float32)},
                        requests, [1, 1], {"Y": _scatter({"dims": [-1]})})
    np.testing.assert_array_equal(parts[0]["Y"], [[0, 1]])
    np.testing.assert_array_equal(parts[1]["Y"], [[2, 3, 4]])
    assert [p["Z"].tolist() for p in parts] == [[[7]], [[8]]]


@pytest.mark.parametrize("produced, message", [
    (np.arange(4, dtype=np.float32), "batch output 'Y' holds 4 elements, fewer than the shapes of the requests' 'X' inputs take"),
    (np.arange(5, dtype=np.int64), "batch output 'Y' is int64, its config's data type is float32"),
])
def test_a_batch_output_that_does_not_fit_is_an_error_naming_it(produced, message):
    """Where tritonserver reads past the model's buffer (it does not check), an error."""
    with pytest.raises(ValueError) as caught:
        _scatter({"dims": [-1]}).scatter(produced, _requests((1, 2), (1, 3)))
    assert str(caught.value) == message


def test_an_onnx_model_whose_batch_output_is_short_answers_internal_naming_it(tmp_path):
    """A model that produces fewer elements than its requests' shapes take: every request of the
    batch gets the INTERNAL error, the server goes on."""
    repo = tmp_path / "models"
    _write(repo, "short", RAGGED_IO_CONFIG.format(backend="onnxruntime").replace("ragged_io", "short"),
           lambda d: mb.save_graph(
               d / "model.onnx", [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["a"])],
               [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["b"])],
               [helper.make_node("Slice", ["INPUT0", "zero", "one"], ["OUTPUT0"])],
               [helper.make_tensor("zero", TensorProto.INT64, [1], [0]), helper.make_tensor("one", TensorProto.INT64, [1], [1])]))
    with serve(repo, "--device", "cpu") as running:
        client = httpclient.InferenceServerClient(running.url)
        try:
            tensor = httpclient.InferInput("INPUT0", [1, 3], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 3), np.float32))
            with pytest.raises(Exception) as caught:
                client.infer("short", [tensor])
            assert "model 'short': batch output 'OUTPUT0' holds 1 elements, fewer than the shapes of the requests' " \
                   "'INPUT0' inputs take" in str(caught.value)
            assert client.is_server_live()
        finally:
            client.close()


# -- which TorchScript argument a batch input fills ---------------------------------------------------


class ByIndex(torch.nn.Module):
    def forward(self, x, index):
        return x * 0 + index.sum()


@pytest.mark.parametrize("target, outcome", [
    ("INDEX__1", None),  # <name>__<index>, as the inputs
    ("INDEX", "batch input 'INDEX' of model 'm' does not follow the <name>__<index> convention of the model's inputs"),
])
def test_a_torchscript_batch_input_follows_the_inputs_naming_convention(tmp_path, target, outcome):
    repo = tmp_path / "models"
    _write(repo, "m", f"""
        name: "m"
        platform: "pytorch_libtorch"
        max_batch_size: 4
        input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ 2 ] }} ]
        output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] }} ]
        batch_input [ {{ kind: BATCH_ELEMENT_COUNT target_name: "{target}" data_type: TYPE_FP32 source_input: "INPUT__0" }} ]
        """, lambda d: save_script(ByIndex(), d / "model.pt"))
    result = invoke(["validate", str(repo)])
    if outcome is None:
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code != 0
        assert outcome in result.output


def test_a_torchscript_batch_input_named_after_no_argument_is_refused(tmp_path):
    repo = tmp_path / "models"
    _write(repo, "m", """
        name: "m"
        platform: "pytorch_libtorch"
        max_batch_size: 4
        input [ { name: "x" data_type: TYPE_FP32 dims: [ 2 ] } ]
        output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 2 ] } ]
        batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "counts" data_type: TYPE_FP32 source_input: "x" } ]
        """, lambda d: save_script(ByIndex(), d / "model.pt"))
    result = invoke(["validate", str(repo)])
    assert result.exit_code != 0
    assert "batch input 'counts' of model 'm' is not an argument of forward (x, index)" in result.output
