"""What tritonclient's own `simple_http_*` examples check, against `toolkit serve` on the models
they expect (samples/triton-examples), with the real tritonclient.

The examples themselves are Triton's code and are not copied here:
`scripts/triton-client-examples.sh CLIENT_CHECKOUT` runs them unchanged from a checkout of
triton-inference-server/client (docs/triton-compatibility.md records the result). These tests
assert the same behaviours, one test per example, so CI (which cannot reach GitHub) keeps them:
health_metadata, infer_client, async_infer_client, aio_infer_client, string_infer_client; and the
answers model_control gets (model control is not offered: tritonserver's default mode). The
sequence examples are asserted in tests/test_sequence_batching.py.
"""

from __future__ import annotations

import asyncio
import importlib.util

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aioclient
from tritonclient.utils import InferenceServerException

from serving import ROOT, serve

EXAMPLES = ROOT / "samples" / "triton-examples"
QUERY = {"test_1": 1, "test_2": 2}


def test_the_committed_models_are_what_make_triton_examples_writes(tmp_path):
    spec = importlib.util.spec_from_file_location("make_triton_examples", ROOT / "samples" / "make_triton_examples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    written = module.write(tmp_path / "models")
    files = sorted(p.relative_to(written) for p in written.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(EXAMPLES) for p in EXAMPLES.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for name in files:
        assert (written / name).read_bytes() == (EXAMPLES / name).read_bytes(), name


@pytest.fixture(scope="module")
def server():
    with serve(EXAMPLES, "--device", "cpu") as running:
        yield running


@pytest.fixture
def client(server):
    c = httpclient.InferenceServerClient(server.url, concurrency=2)
    yield c
    c.close()


def _simple_inputs(module, input0, input1):
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(input0, binary_data=False)  # JSON
    inputs[1].set_data_from_numpy(input1, binary_data=True)
    return inputs


def _requested(module):
    return [module.InferRequestedOutput("OUTPUT0", binary_data=True),
            module.InferRequestedOutput("OUTPUT1", binary_data=False)]


def _check_sum_difference(result, input0, input1):
    assert (result.as_numpy("OUTPUT0") == input0 + input1).all()
    assert (result.as_numpy("OUTPUT1") == input0 - input1).all()


INPUT0 = np.arange(16, dtype=np.int32).reshape(1, 16)
MINUS_ONES = np.full((1, 16), -1, dtype=np.int32)


def test_health_metadata(client):
    assert client.is_server_live(query_params=QUERY)
    assert client.is_server_ready()
    assert client.is_model_ready("simple")


def test_model_control_reads_the_body_first(server):
    """As tritonserver: a body that is not JSON is the client's error (400), before the 503."""
    import httpx

    answer = httpx.post(f"{server.http}/v2/repository/models/simple/load", content=b'{"parameters": ')
    assert answer.status_code == 400 and answer.json()["error"].startswith("failed to parse the request JSON buffer")
    answer = httpx.post(f"{server.http}/v2/repository/models/simple/unload", content=b"")
    assert answer.status_code == 503
    metadata = client.get_server_metadata()
    assert metadata["name"] == "triton"  # the example fails on anything else
    assert client.get_model_metadata("simple", query_params=QUERY)["name"] == "simple"
    with pytest.raises(InferenceServerException) as error:
        client.get_model_metadata("wrong_model_name")
    assert "Request for unknown model" in error.value.message()


@pytest.mark.parametrize("compression", [None, "gzip", "deflate"])
def test_infer_client(client, compression):
    """The example's --request/--response-compression-algorithm flags included."""
    result = client.infer("simple", _simple_inputs(httpclient, INPUT0, MINUS_ONES), outputs=_requested(httpclient),
                          query_params=QUERY, request_compression_algorithm=compression,
                          response_compression_algorithm=compression)
    _check_sum_difference(result, INPUT0, MINUS_ONES)
    statistics = client.get_inference_statistics(model_name="simple")
    assert len(statistics["model_stats"]) == 1 and statistics["model_stats"][0]["name"] == "simple"
    # no requested outputs: all of them
    result = client.infer("simple", _simple_inputs(httpclient, INPUT0, MINUS_ONES), outputs=None, query_params=QUERY,
                          request_compression_algorithm=compression, response_compression_algorithm=compression)
    _check_sum_difference(result, INPUT0, MINUS_ONES)
    with pytest.raises(InferenceServerException) as error:
        client.infer("wrong_model_name", _simple_inputs(httpclient, INPUT0, MINUS_ONES), outputs=_requested(httpclient))
    assert error.value.message().startswith("Request for unknown model")


def test_async_infer_client(client):
    ones = np.ones((1, 16), dtype=np.int32)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(INPUT0, binary_data=True)
    inputs[1].set_data_from_numpy(ones, binary_data=True)
    outputs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in ("OUTPUT0", "OUTPUT1")]
    pending = [client.async_infer(model_name="simple", inputs=inputs, outputs=outputs) for _ in range(2)]
    for request in pending:
        _check_sum_difference(request.get_result(), INPUT0, ones)


def test_aio_infer_client(server):
    async def main():
        client = aioclient.InferenceServerClient(url=server.url)
        try:
            result = await client.infer("simple", _simple_inputs(aioclient, INPUT0, MINUS_ONES),
                                        outputs=_requested(aioclient), query_params=QUERY)
            _check_sum_difference(result, INPUT0, MINUS_ONES)
            statistics = await client.get_inference_statistics(model_name="simple")
            assert len(statistics["model_stats"]) == 1
            with pytest.raises(InferenceServerException) as error:
                await client.infer("wrong_model_name", _simple_inputs(aioclient, INPUT0, MINUS_ONES))
            assert error.value.message().startswith("Request for unknown model")
            both = await asyncio.gather(
                client.infer("simple", _simple_inputs(aioclient, INPUT0, MINUS_ONES), outputs=_requested(aioclient)),
                client.infer("simple", _simple_inputs(aioclient, INPUT0, MINUS_ONES)),
            )
            for result in both:
                _check_sum_difference(result, INPUT0, MINUS_ONES)
        finally:
            await client.close()

    asyncio.run(main())


def _identity(client, array, binary_data):
    inputs = [httpclient.InferInput("INPUT0", array.shape, "BYTES")]
    inputs[0].set_data_from_numpy(array, binary_data=binary_data)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_data)]
    return client.infer(model_name="simple_identity", inputs=inputs, outputs=outputs).as_numpy("OUTPUT0")


def test_string_infer_client(client):
    numbers = np.arange(16, dtype=np.int32).reshape(1, 16)
    ones = np.ones((1, 16), dtype=np.int32)
    as_text = lambda a: np.array([str(x).encode("utf-8") for x in a.reshape(-1)], dtype=np.object_).reshape(a.shape)
    inputs = [httpclient.InferInput("INPUT0", [1, 16], "BYTES"), httpclient.InferInput("INPUT1", [1, 16], "BYTES")]
    inputs[0].set_data_from_numpy(as_text(numbers), binary_data=True)
    inputs[1].set_data_from_numpy(as_text(ones), binary_data=False)
    result = client.infer(model_name="simple_string", inputs=inputs, outputs=_requested(httpclient))
    assert [int(x) for x in result.as_numpy("OUTPUT0")[0]] == list((numbers + ones)[0])
    assert [int(x) for x in result.as_numpy("OUTPUT1")[0]] == list((numbers - ones)[0])

    # an embedded NUL character survives both encodings
    nul = np.array(["he\x00llo".encode("utf-8")] * 16, dtype=np.object_).reshape(1, 16)
    assert np.array_equal(_identity(client, nul, True), nul)
    as_json = _identity(client, nul, False)
    assert np.array_equal(np.array([bytes(str(x), encoding="utf-8") for x in as_json.flatten()],
                                   dtype=np.object_).reshape(1, 16), nul)
    # 4-byte binary blobs as np.bytes_
    blobs = np.array([b"\x00\x01\x02\x03"] * 16, dtype=np.bytes_).reshape(1, 16)
    for binary in (True, False):
        assert np.array_equal(np.char.encode(_identity(client, blobs, binary).astype(str)), blobs)


def test_model_control_is_refused_as_by_tritonserver_in_its_default_mode(client):
    """simple_http_model_control.py needs tritonserver --model-control-mode=explicit (load with a
    config override, unload); the toolkit serves the repository it was given, and answers load and
    unload as tritonserver does in its default mode."""
    index = client.get_model_repository_index()
    assert sorted(m["name"] for m in index) == [
        "simple", "simple_dyna_sequence", "simple_identity", "simple_int8", "simple_sequence", "simple_string",
        "simple_string_dyna_sequence",
    ]
    assert all(m["state"] == "READY" for m in index)
    for call in (lambda: client.load_model("simple"), lambda: client.load_model("simple", config='{"max_batch_size":"16"}'),
                 lambda: client.unload_model("simple")):
        with pytest.raises(InferenceServerException) as error:
            call()
        assert error.value.status() == "503"
        assert error.value.message() == "explicit model load / unload is not allowed if polling is enabled"
    assert client.is_model_ready("simple")


def test_model_control_reads_the_body_first(server):
    """As tritonserver: a body that is not JSON is the client's error (400), before the 503."""
    import httpx

    answer = httpx.post(f"{server.http}/v2/repository/models/simple/load", content=b'{"parameters": ')
    assert answer.status_code == 400 and answer.json()["error"].startswith("failed to parse the request JSON buffer")
    answer = httpx.post(f"{server.http}/v2/repository/models/simple/unload", content=b"")
    assert answer.status_code == 503
