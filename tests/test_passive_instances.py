"""`instance_group { passive: true }`: tritonserver 2.51 loads passive instances (their
`initialize` runs) but never gives them a request: no warmup, no scheduler (measured with the model
below: groups `active` count 1 and `idle` count 2 passive, every request answered by `active_0`).
Here they are not made at all, and a model whose every group is passive, which tritonserver 2.51
loads and then dies on (signal 11 at its first request, measured), is refused at validate."""

from __future__ import annotations

import textwrap

import numpy as np
import tritonclient.http as httpclient
from cli_runner import invoke
from python_models.repository import python_model
from serving import serve

WHO = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.name = args["model_instance_name"]

    def execute(self, requests):
        time.sleep(0.2)  # long enough that concurrent requests would meet every instance that takes them
        return [pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUT", np.array([self.name.encode()], dtype=np.object_))]) for _ in requests]
"""


def _who(repo, name: str, groups: str) -> None:
    python_model(repo, name, None, textwrap.dedent(f"""
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_STRING dims: [ 1 ] }} ]
        instance_group [ {groups} ]
        """), source=WHO)


def test_passive_instances_take_no_requests(tmp_path):
    repo = tmp_path / "models"
    _who(repo, "who", '{ name: "active" count: 1 kind: KIND_CPU }, { name: "idle" count: 2 kind: KIND_CPU passive: true }')
    with serve(repo, "--device", "cpu") as running:
        client = httpclient.InferenceServerClient(running.url, concurrency=6)
        try:
            tensor = httpclient.InferInput("IN", [1], "INT32")
            tensor.set_data_from_numpy(np.array([1], np.int32))
            pending = [client.async_infer("who", [tensor]) for _ in range(6)]
            answered = {r.get_result().as_numpy("OUT")[0].decode() for r in pending}
            groups = client.get_model_config("who")["instance_group"]
        finally:
            client.close()
        assert answered == {"active_0"}
        # the served config keeps the groups as written, as tritonserver's does
        assert [(g["name"], g["count"], g["passive"]) for g in groups] == [("active", 1, False), ("idle", 2, True)]


def test_a_model_with_only_passive_instances_is_refused(tmp_path):
    repo = tmp_path / "models"
    _who(repo, "idle", "{ count: 1 kind: KIND_CPU passive: true }")
    _who(repo, "busy", "{ count: 1 kind: KIND_CPU }")
    result = invoke(["validate", str(repo)])
    assert result.exit_code != 0
    text = " ".join(result.output.split())
    assert "every instance group of model 'idle' is passive (instance_group { passive: true })" in text
    assert "1 of 2 model(s) cannot be served" in text
