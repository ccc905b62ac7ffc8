"""The floor of a Lambda inference handler: ONNX Runtime called directly, nothing else.

bench/lambda_overhead.py runs it under AWS's Lambda RIE beside the toolkit's own Lambda entry
point, on the same model and the same Function URL events: what the toolkit adds per invocation is
the difference. It does the least any v2 handler must: read the event's body (base64 when the
Function URL says so), decode the v2 request (JSON tensors, or the binary tensor extension),
run the session, encode the outputs as the request asked (JSON or binary) and return the Function
URL response. No validation, limits, batching, statistics or error answers.

BENCH_ONNX_MODEL names the .onnx file (its inputs and outputs are read from the session).
"""

from __future__ import annotations

import base64
import json
import os

import numpy as np
import onnxruntime as ort

_options = ort.SessionOptions()
_options.intra_op_num_threads = 1
_SESSION = ort.InferenceSession(os.environ["BENCH_ONNX_MODEL"], _options, providers=["CPUExecutionProvider"])
_OUTPUTS = [o.name for o in _SESSION.get_outputs()]
_DTYPES = {"FP32": np.float32, "FP16": np.float16, "INT32": np.int32, "INT64": np.int64}


def handler(event: dict, context: object) -> dict:
    raw = event.get("body") or ""
    body = base64.b64decode(raw) if event.get("isBase64Encoded") else raw.encode()
    headers = event.get("headers") or {}
    length = headers.get("inference-header-content-length")
    header = json.loads(body[: int(length)] if length else body)
    offset = int(length) if length else 0
    feeds = {}
    for tensor in header["inputs"]:
        dtype = _DTYPES[tensor["datatype"]]
        size = (tensor.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            data = np.frombuffer(body, dtype=dtype, count=size // np.dtype(dtype).itemsize, offset=offset)
            offset += size
        else:
            data = np.asarray(tensor["data"], dtype=dtype)
        feeds[tensor["name"]] = data.reshape(tensor["shape"])
    results = _SESSION.run(_OUTPUTS, feeds)
    binary = bool(length)
    outputs, blobs = [], []
    for name, value in zip(_OUTPUTS, results):
        entry = {"name": name, "datatype": "FP32", "shape": list(value.shape)}
        if binary:
            blob = value.tobytes()
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = value.ravel().tolist()
        outputs.append(entry)
    text = json.dumps({"model_name": header.get("model_name", ""), "outputs": outputs}).encode()
    if not binary:
        return {"statusCode": 200, "headers": {"content-type": "application/json"}, "body": text.decode(),
                "isBase64Encoded": False}
    return {"statusCode": 200, "isBase64Encoded": True,
            "headers": {"content-type": "application/octet-stream", "inference-header-content-length": str(len(text))},
            "body": base64.b64encode(text + b"".join(blobs)).decode()}
