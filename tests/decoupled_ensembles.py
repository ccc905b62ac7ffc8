"""Ensembles with a decoupled step (tests/test_decoupled_ensembles.py): python models only, so the
same repository runs on tritonserver 2.51 (whose build has the python backend only) and on
`toolkit serve`.

- `tokenize`: TEXT (one string) -> IDS, its bytes as INT32;
- `tokens` (decoupled, tests/python_models/decoupled_tokens.py): one response per id, TOKEN and
  POS;
- `detokenize`: TOKEN and POS -> PIECE, "<pos>:<char>";
- `pipeline` (ensemble): TEXT -> tokenize -> tokens -> detokenize, outputs PIECE and POS;
- `direct` (ensemble): IDS -> tokens, the decoupled step last, outputs TOKEN and POS;
- `plain` (ensemble, not decoupled): TEXT -> tokenize, output IDS;
- `collect`: calls `pipeline` with BLS `exec(decoupled=True)` and joins what its responses carry.
"""

from __future__ import annotations

from pathlib import Path

from python_models.repository import python_model

TOKENIZE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)[0]
            ids = np.frombuffer(text, np.uint8).astype(np.int32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("IDS", ids)]))
        return responses
"""

DETOKENIZE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            token = int(pb_utils.get_input_tensor_by_name(request, "TOKEN").as_numpy().reshape(-1)[0])
            pos = pb_utils.get_input_tensor_by_name(request, "POS")
            where = "-" if pos is None else str(int(pos.as_numpy().reshape(-1)[0]))
            piece = np.array([f"{where}:{chr(token)}".encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("PIECE", piece)]))
        return responses
"""

COLLECT = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="pipeline", inputs=[pb_utils.get_input_tensor_by_name(request, "TEXT")],
                requested_output_names=["PIECE"],
            )
            pieces = []
            for response in call.exec(decoupled=True):
                if response.has_error():
                    pieces.append("error: " + response.error().message())
                    continue
                piece = pb_utils.get_output_tensor_by_name(response, "PIECE")
                pieces.append("final" if piece is None else piece.as_numpy().reshape(-1)[0].decode())
            joined = np.array([" ".join(pieces).encode()], dtype=np.object_)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("JOINED", joined)]))
        return responses
"""

CONFIGS = {
    "tokenize": """
        backend: "python"
        max_batch_size: 0
        input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "IDS" data_type: TYPE_INT32 dims: [ -1 ] } ]
        instance_group [ { kind: KIND_CPU count: 1 } ]
    """,
    "tokens": """
        backend: "python"
        max_batch_size: 0
        model_transaction_policy { decoupled: true }
        input [ { name: "IDS" data_type: TYPE_INT32 dims: [ -1 ] } ]
        output [ { name: "TOKEN" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "POS" data_type: TYPE_INT32 dims: [ 1 ] } ]
        instance_group [ { kind: KIND_CPU count: 1 } ]
    """,
    "detokenize": """
        backend: "python"
        max_batch_size: 0
        input [ { name: "TOKEN" data_type: TYPE_INT32 dims: [ 1 ] },
                { name: "POS" data_type: TYPE_INT32 dims: [ 1 ] optional: true } ]
        output [ { name: "PIECE" data_type: TYPE_STRING dims: [ 1 ] } ]
        instance_group [ { kind: KIND_CPU count: 1 } ]
    """,
    "pipeline": """
        platform: "ensemble"
        max_batch_size: 0
        input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "PIECE" data_type: TYPE_STRING dims: [ 1 ] }, { name: "POS" data_type: TYPE_INT32 dims: [ 1 ] } ]
        ensemble_scheduling { step [
          { model_name: "tokenize" model_version: -1 input_map { key: "TEXT" value: "TEXT" } output_map { key: "IDS" value: "ids" } },
          { model_name: "tokens" model_version: -1 input_map { key: "IDS" value: "ids" }
            output_map [ { key: "TOKEN" value: "token" }, { key: "POS" value: "POS" } ] },
          { model_name: "detokenize" model_version: -1
            input_map [ { key: "TOKEN" value: "token" }, { key: "POS" value: "POS" } ] output_map { key: "PIECE" value: "PIECE" } }
        ] }
    """,
    "plain": """
        platform: "ensemble"
        max_batch_size: 0
        input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "IDS" data_type: TYPE_INT32 dims: [ -1 ] } ]
        ensemble_scheduling { step [
          { model_name: "tokenize" model_version: -1 input_map { key: "TEXT" value: "TEXT" } output_map { key: "IDS" value: "IDS" } }
        ] }
    """,
    "collect": """
        backend: "python"
        max_batch_size: 0
        input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] } ]
        output [ { name: "JOINED" data_type: TYPE_STRING dims: [ 1 ] } ]
        instance_group [ { kind: KIND_CPU count: 1 } ]
    """,
    "direct": """
        platform: "ensemble"
        max_batch_size: 0
        input [ { name: "IDS" data_type: TYPE_INT32 dims: [ -1 ] } ]
        output [ { name: "TOKEN" data_type: TYPE_INT32 dims: [ 1 ] }, { name: "POS" data_type: TYPE_INT32 dims: [ 1 ] } ]
        ensemble_scheduling { step [
          { model_name: "tokens" model_version: -1 input_map { key: "IDS" value: "IDS" }
            output_map [ { key: "TOKEN" value: "TOKEN" }, { key: "POS" value: "POS" } ] }
        ] }
    """,
}

SOURCES = {"tokenize": TOKENIZE, "detokenize": DETOKENIZE, "collect": COLLECT}


def write_repository(repo: Path) -> Path:
    for name, config in CONFIGS.items():
        if "ensemble" in config:
            (repo / name / "1").mkdir(parents=True, exist_ok=True)
            (repo / name / "config.pbtxt").write_text(config.strip() + "\n")
        elif name in SOURCES:
            python_model(repo, name, None, config, source=SOURCES[name])
        else:
            python_model(repo, name, "decoupled_tokens.py", config)
    return repo
