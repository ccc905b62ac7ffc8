"""A repository of decoupled Python models (tests/python_models/decoupled_*.py) for the decoupled
tests: the configs python_backend's examples give their models, written by the tests."""

from __future__ import annotations

from pathlib import Path

from python_models.repository import python_model

MODE_PARAMETER = 'parameters { key: "TOOLKIT_PYTHON_INSTANCE_MODE" value: { string_value: "@" } }'
DECOUPLED = "model_transaction_policy { decoupled: true }"

CONFIGS = {
    "repeat": ("decoupled_repeat.py", """
        backend: "python"
        max_batch_size: 0
        @DECOUPLED@
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "DELAY" data_type: TYPE_UINT32 dims: [ -1 ] },
                { name: "WAIT" data_type: TYPE_UINT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "IDX" data_type: TYPE_UINT32 dims: [ 1 ] } ]
        instance_group [ { kind: KIND_CPU } ]
        @MODE@
    """),
    "square": ("decoupled_square.py", """
        backend: "python"
        max_batch_size: 0
        @DECOUPLED@
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        instance_group [ { kind: KIND_CPU } ]
        @MODE@
    """),
    "batched": ("decoupled_square.py", """
        backend: "python"
        max_batch_size: 8
        @DECOUPLED@
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 30000000 }
        @MODE@
    """),
    "probe": ("decoupled_probe.py", """
        backend: "python"
        max_batch_size: 0
        @DECOUPLED@
        input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] },
                { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] optional: true } ]
        output [ { name: "OUT" data_type: TYPE_STRING dims: [ -1 ] }, { name: "IDX" data_type: TYPE_INT32 dims: [ 1 ] } ]
        instance_group [ { kind: KIND_CPU count: 1 } ]
        @MODE@
    """),
    "generate": ("decoupled_generate.py", """
        backend: "python"
        max_batch_size: 0
        @DECOUPLED@
        input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
                { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] optional: true },
                { name: "vector" data_type: TYPE_FP32 dims: [ -1 ] optional: true },
                { name: "matrix" data_type: TYPE_INT32 dims: [ 2, -1 ] optional: true },
                { name: "flag" data_type: TYPE_BOOL dims: [ 1 ] optional: true } ]
        output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] }, { name: "index" data_type: TYPE_INT32 dims: [ 1 ] },
                 { name: "scores" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "info" data_type: TYPE_STRING dims: [ 1 ] } ]
        @MODE@
    """),
    "bls": ("decoupled_bls.py", """
        backend: "python"
        max_batch_size: 0
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "WHICH" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "SUM" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "LOG" data_type: TYPE_STRING dims: [ 1 ] } ]
        @MODE@
    """),
    "async": ("decoupled_async.py", """
        backend: "python"
        max_batch_size: 0
        @DECOUPLED@
        input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
        @MODE@
    """),
    "async_bls": ("decoupled_async.py", """
        backend: "python"
        max_batch_size: 0
        @DECOUPLED@
        input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
        parameters { key: "CALL_SQUARE" value: { string_value: "1" } }
        @MODE@
    """),
    "echo": (None, """
        backend: "python"
        max_batch_size: 4
        input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "text_output" data_type: TYPE_STRING dims: [ 1 ] } ]
        dynamic_batching { }
        @MODE@
    """),
}

ECHO = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("text_output", pb_utils.get_input_tensor_by_name(r, "text_input").as_numpy())
            ])
            for r in requests
        ]
"""


def write_repository(repo: Path, mode: str | None = None, models: tuple[str, ...] | None = None) -> Path:
    """The decoupled test models under `repo`; `mode`: TOOLKIT_PYTHON_INSTANCE_MODE of each."""
    extra = MODE_PARAMETER.replace("@", mode) if mode else ""
    for name, (fixture, config) in CONFIGS.items():
        if models is not None and name not in models:
            continue
        text = config.replace("@DECOUPLED@", DECOUPLED).replace("@MODE@", extra)
        python_model(repo, name, fixture, text, source=ECHO if fixture is None else None)
    return repo
