"""An output's `reshape` as Triton's core applies it to every backend's responses
(InferenceResponse::AddOutput -> Output::Reshape): the model produces `reshape.shape`, the
response carries the batch dimension and `dims`. Checked here for ONNX, TorchScript, Python and decoupled
Python models, for an ensemble whose next step reads the reshaped output, and for a model whose
output does not fit its reshape (a clear INTERNAL error, where Triton relabels the buffer
unchecked)."""

from __future__ import annotations

import asyncio
import textwrap

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from python_models.repository import close, load, python_model
from torch_models import save_script, write_model

import model_builders as mb

from handlers.errors import ErrorCode, InferenceError
from handlers.inference import InferRequest, InferResponse
from handlers.model_io import OutputReshape
from handlers.protocol.validation import validate_request

BATCHED_IO = """
max_batch_size: 4
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 2 ] } } ]
"""
PAIRS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", x.reshape(SHAPE) * 2)]))
        return out
"""
STREAM = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            for k in (1, 2):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", (x * k).reshape(2, 2))]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
DOUBLE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x + 1)]))
        return out
"""


class Pairs(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x * 2).reshape(-1, 2, 2)


@pytest.fixture(scope="module", params=["process", "inprocess"])
def repository(request, tmp_path_factory):
    repo = tmp_path_factory.mktemp(f"output-reshape-{request.param}") / "models"
    mode = f'parameters {{ key: "TOOLKIT_PYTHON_INSTANCE_MODE" value {{ string_value: "{request.param}" }} }}'
    for name, shape in (("pairs", "(-1, 2, 2)"), ("unfit", "(-1, 4)")):
        python_model(repo, name, None, f'name: "{name}"\nbackend: "python"\n{BATCHED_IO}\n{mode}\n',
                     source=PAIRS.replace("SHAPE", shape))
    python_model(repo, "stream", None, textwrap.dedent(f"""
        name: "stream"
        backend: "python"
        max_batch_size: 0
        model_transaction_policy {{ decoupled: true }}
        input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] reshape {{ shape: [ 2, 2 ] }} }} ]
        {mode}
        """), source=STREAM)
    python_model(repo, "plus_one", None, f"""
        name: "plus_one"
        backend: "python"
        max_batch_size: 4
        input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
        {mode}
        """, source=DOUBLE)
    (repo / "chain").mkdir()
    (repo / "chain" / "1").mkdir()
    (repo / "chain" / "config.pbtxt").write_text(textwrap.dedent("""
        name: "chain"
        platform: "ensemble"
        max_batch_size: 4
        input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
        output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] } ]
        ensemble_scheduling { step [
          { model_name: "pairs" model_version: -1 input_map { key: "IN" value: "IN" } output_map { key: "OUT" value: "mid" } },
          { model_name: "plus_one" model_version: -1 input_map { key: "X" value: "mid" } output_map { key: "Y" value: "Y" } }
        ] }
        """).lstrip())
    write_model(repo, "pairs_pt", 'name: "pairs_pt"\nplatform: "pytorch_libtorch"\n'
                + BATCHED_IO.replace('"IN"', '"INPUT__0"').replace('"OUT"', '"OUTPUT__0"'),
                lambda path: save_script(Pairs(), path))
    onnx_dir = repo / "pairs_onnx"
    (onnx_dir / "config.pbtxt").parent.mkdir(parents=True)
    (onnx_dir / "config.pbtxt").write_text(f'name: "pairs_onnx"\nbackend: "onnxruntime"\n{BATCHED_IO}')
    mb.save_graph(
        onnx_dir / "1" / "model.onnx",
        [helper.make_tensor_value_info("IN", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("OUT", TensorProto.FLOAT, ["N", 2, 2])],
        [helper.make_node("Mul", ["IN", "two"], ["doubled"]), helper.make_node("Reshape", ["doubled", "pairs"], ["OUT"])],
        [numpy_helper.from_array(np.array(2, np.float32), "two"), numpy_helper.from_array(np.array([-1, 2, 2]), "pairs")],
    )
    loaded = load(repo)
    assert all(m.ready for by_version in loaded.models.values() for m in by_version.values()), loaded.index()
    yield loaded
    close(loaded)


def infer(repository, model: str, **inputs: np.ndarray) -> InferResponse:
    loaded = repository.get(model)
    request = InferRequest(model, loaded.version, dict(inputs))
    validate_request(loaded.spec.config, request)
    return asyncio.run(loaded.infer(request))


ROWS = np.arange(12, dtype=np.float32).reshape(3, 4)


@pytest.mark.parametrize("model, name, input_name", [
    ("pairs", "OUT", "IN"), ("pairs_pt", "OUTPUT__0", "INPUT__0"), ("pairs_onnx", "OUT", "IN")])
def test_a_batching_model_produces_the_reshape_and_answers_with_its_dims(repository, model, name, input_name):
    out = infer(repository, model, **{input_name: ROWS}).outputs[name]
    assert out.shape == (3, 4)  # the batch dimension, then dims; the model produced (3, 2, 2)
    np.testing.assert_array_equal(out, ROWS * 2)


def test_an_ensembles_next_step_reads_the_output_with_its_dims(repository):
    """`plus_one` takes dims [4]: the (3, 2, 2) that `pairs` produced reaches it as (3, 4)."""
    np.testing.assert_array_equal(infer(repository, "chain", IN=ROWS).outputs["Y"], ROWS * 2 + 1)


def test_a_decoupled_models_every_response_is_reshaped(repository):
    loaded = repository.get("stream")
    request = InferRequest("stream", loaded.version, {"IN": np.arange(4, dtype=np.float32)})
    validate_request(loaded.spec.config, request)

    async def collect():
        return await asyncio.wait_for(loaded.stream(request).collect(), 60)

    events = asyncio.run(collect())
    shapes = [e.response.outputs["OUT"].shape for e in events if e.response is not None]
    assert shapes == [(4,), (4,)]
    assert events[-1].final


def test_an_output_that_does_not_fit_its_reshape_is_an_error_naming_model_and_output(repository):
    with pytest.raises(InferenceError) as caught:
        infer(repository, "unfit", IN=ROWS)
    assert caught.value.code is ErrorCode.INTERNAL
    assert caught.value.message == (
        "output 'OUT' of model 'unfit' has shape [3, 4], which its config's reshape cannot send as dims [4]: "
        "the model must produce the batch dimension, then reshape { shape: [2, 2] }")


def _reshape(outputs: dict[str, tuple], max_batch_size: int = 0) -> OutputReshape:
    """The runtime's config (compiled JSON) of outputs name -> (dims, reshape.shape or None)."""
    return OutputReshape({"name": "m", "max_batch_size": max_batch_size, "output": [
        {"name": name, "data_type": "TYPE_FP32", "dims": list(dims),
         **({"reshape": {"shape": list(shape)}} if shape is not None else {})}
        for name, (dims, shape) in outputs.items()]})


@pytest.mark.parametrize(
    "dims, shape, max_batch_size, produced, sent",
    [
        # the surveyed resnet18 config: no batching, [1, 1000] produced, [1, 1000, 1, 1] sent
        ((1, 1000, 1, 1), (1, 1000), 0, (1, 1000), (1, 1000, 1, 1)),
        ((1000,), (1, 1000), 8, (5, 1, 1000), (5, 1000)),
        # each -1 of dims takes the produced size at the next -1 of reshape.shape, in order
        ((-1, 4, -1), (-1, 2, 2, -1), 8, (2, 3, 2, 2, 7), (2, 3, 4, 7)),
        ((), (1,), 8, (6, 1), (6,)),
        # what does not fit: another rank, another element count
        ((4,), (2, 2), 8, (3, 4), None),
        ((-1,), (-1, 2), 8, (3, 5, 2), None),
    ],
)
def test_the_shape_sent_is_tritons(dims, shape, max_batch_size, produced, sent):
    assert _reshape({"o": (dims, shape)}, max_batch_size).shape("o", produced) == sent


def test_outputs_without_a_reshape_and_errors_pass_unchanged():
    reshape = _reshape({"o": ((4,), (2, 2)), "p": ((2, 2), None)}, 8)
    response = InferResponse("m", 1, {"o": np.zeros((1, 2, 2), np.float32), "p": np.zeros((1, 2, 2), np.float32)})
    assert reshape.apply(response) is response
    assert response.outputs["o"].shape == (1, 4) and response.outputs["p"].shape == (1, 2, 2)
    error = InferenceError("x", ErrorCode.INTERNAL)
    assert reshape.apply(error) is error
    assert not _reshape({"p": ((2, 2), None)})
