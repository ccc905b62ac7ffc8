"""ONNX models with custom operators: `model_operations { op_library_filename }` registers each
library in the model's ONNX Runtime sessions, as Triton's onnxruntime backend does
(RegisterCustomOpsLibrary). The library is a real one: onnxruntime-extensions' custom-op library
(its `StringUpper` operator, domain ai.onnx.contrib), kept beside the model or named by absolute
path. Served by `toolkit serve`, read by tritonclient over HTTP and gRPC; `toolkit validate` reads
the model's signature with the library and warns about one that is not on the machine; the build
copies a library kept in the model's directory."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import numpy as np
import onnx
import onnxruntime_extensions
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from cli_runner import invoke
from onnx import TensorProto, helper
from serving import serve

from handlers.manifest import Manifest
from toolkit.build.context import copy_models
from toolkit.repository.compile import compile_repository

LIBRARY = Path(onnxruntime_extensions.get_library_path())


def _upper(path: Path) -> None:
    """OUT = ai.onnx.contrib.StringUpper(IN): ONNX Runtime alone does not know the operator."""
    graph = helper.make_graph(
        [helper.make_node("StringUpper", ["IN"], ["OUT"], domain="ai.onnx.contrib")], "upper",
        [helper.make_tensor_value_info("IN", TensorProto.STRING, ["N"])],
        [helper.make_tensor_value_info("OUT", TensorProto.STRING, ["N"])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("ai.onnx.contrib", 1)])
    model.ir_version = 8
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))


def _model(repo: Path, name: str, library: str | None) -> Path:
    directory = repo / name
    _upper(directory / "1" / "model.onnx")
    operations = f'model_operations {{ op_library_filename: "{library}" }}' if library is not None else ""
    (directory / "config.pbtxt").write_text(textwrap.dedent(f"""
        name: "{name}"
        backend: "onnxruntime"
        max_batch_size: 0
        input [ {{ name: "IN" data_type: TYPE_STRING dims: [ -1 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_STRING dims: [ -1 ] }} ]
        {operations}
        """).lstrip())
    return directory


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("custom-ops") / "models"
    beside = _model(repo, "beside", "libortextensions.so")
    shutil.copyfile(LIBRARY, beside / "libortextensions.so")
    _model(repo, "absolute", str(LIBRARY))
    return repo


@pytest.fixture(scope="module")
def server(repository):
    with serve(repository, "--device", "cpu") as running:
        yield running


WORDS = np.array([b"triton", b"Serverless 2026"], dtype=object)


@pytest.mark.parametrize("model", ["beside", "absolute"])
def test_a_custom_operator_runs_from_its_library(server, model):
    client = httpclient.InferenceServerClient(server.url)
    try:
        tensor = httpclient.InferInput("IN", [2], "BYTES")
        tensor.set_data_from_numpy(WORDS)
        assert client.infer(model, [tensor]).as_numpy("OUT").tolist() == [b"TRITON", b"SERVERLESS 2026"]
    finally:
        client.close()
    grpc = grpcclient.InferenceServerClient(server.grpc)
    try:
        tensor = grpcclient.InferInput("IN", [2], "BYTES")
        tensor.set_data_from_numpy(WORDS)
        assert grpc.infer(model, [tensor]).as_numpy("OUT").tolist() == [b"TRITON", b"SERVERLESS 2026"]
    finally:
        grpc.close()


def test_validate_reads_the_signature_through_the_library(repository):
    """With the library registered, the session is built and read (no fallback to the declared
    signature), and no warning is printed."""
    result = invoke(["validate", str(repository)])
    assert result.exit_code == 0, result.output
    assert "declares" not in result.output and "custom-op library" not in result.output


def test_a_library_that_is_not_here_is_a_warning_at_validate_and_a_load_error_naming_it(tmp_path):
    repo = tmp_path / "models"
    _model(repo, "missing", "/opt/custom/libmissing.so")
    result = invoke(["validate", str(repo)])
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())
    assert ("custom-op library '/opt/custom/libmissing.so' of model 'missing' (model_operations) is not a file on this "
            "machine: the image must provide it there") in flat
    with serve(repo, "--device", "cpu", wait_ready=False) as running:  # exits, as tritonserver does
        assert running.process.wait(60) == 1
        assert "failed to load model 'missing' version 1" in running.output()
        assert "Failed to load library /opt/custom/libmissing.so" in running.output()


def test_the_build_copies_a_library_kept_beside_the_model(repository, tmp_path):
    compiled = compile_repository(repository, models=["beside"])
    assert compiled.ok, compiled
    copy_models(compiled, tmp_path / "repository")
    assert (tmp_path / "repository" / "beside" / "libortextensions.so").read_bytes() == LIBRARY.read_bytes()
    spec = Manifest.load(tmp_path / "repository" / "models.json").models["beside"]
    assert (spec.directory / "libortextensions.so").is_file()
