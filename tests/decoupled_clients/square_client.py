"""A client that does what python_backend's examples/decoupled/square_client.py does (written for
toolkit's tests): four streamed requests to square_int32 at localhost:8001 with IN = 4, 2, 0, 1;
request i must get IN[i] responses OUT = [IN[i]], matched by request id; prints PASS and exits 0."""

import collections
import queue
import sys

import numpy as np
import tritonclient.grpc as grpcclient

values = [4, 2, 0, 1]
received: queue.Queue = queue.Queue()
with grpcclient.InferenceServerClient(url="localhost:8001") as client:
    client.start_stream(callback=lambda result, error: received.put(error or result))
    for index, value in enumerate(values):
        tensor = grpcclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
        client.async_stream_infer(model_name="square_int32", inputs=[tensor], request_id=str(index),
                                  outputs=[grpcclient.InferRequestedOutput("OUT")])
    results = [received.get(timeout=60) for _ in range(sum(values))]
by_id = collections.defaultdict(list)
for result in results:
    if isinstance(result, Exception):
        print(result)
        sys.exit(1)
    by_id[result.get_response().id].append(result.as_numpy("OUT").tolist())
if dict(by_id) != {str(i): [[v]] * v for i, v in enumerate(values) if v}:
    print(f"unexpected responses: {dict(by_id)}")
    sys.exit(1)
print("PASS: square_int32")
sys.exit(0)
