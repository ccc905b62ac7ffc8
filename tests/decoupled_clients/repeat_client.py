"""A client that does what python_backend's examples/decoupled/repeat_client.py does (written for
toolkit's tests): one streamed request to repeat_int32 at localhost:8001, four responses expected,
OUT equal to IN element by element; prints PASS and exits 0, else exits 1."""

import queue
import sys

import numpy as np
import tritonclient.grpc as grpcclient

values, delays, wait = [4, 2, 0, 1], [1, 2, 3, 4], 5
received: queue.Queue = queue.Queue()
inputs = [grpcclient.InferInput("IN", [4], "INT32"), grpcclient.InferInput("DELAY", [4], "UINT32"),
          grpcclient.InferInput("WAIT", [1], "UINT32")]
inputs[0].set_data_from_numpy(np.array(values, dtype=np.int32))
inputs[1].set_data_from_numpy(np.array(delays, dtype=np.uint32))
inputs[2].set_data_from_numpy(np.array([wait], dtype=np.uint32))
with grpcclient.InferenceServerClient(url="localhost:8001") as client:
    client.start_stream(callback=lambda result, error: received.put(error or result))
    client.async_stream_infer(model_name="repeat_int32", inputs=inputs, request_id="0",
                              outputs=[grpcclient.InferRequestedOutput("OUT"), grpcclient.InferRequestedOutput("IDX")])
    results = [received.get(timeout=60) for _ in values]
for index, result in enumerate(results):
    if isinstance(result, Exception):
        print(result)
        sys.exit(1)
    if result.get_response().id != "0" or result.as_numpy("OUT").tolist() != [values[index]]:
        print(f"unexpected response {index}: {result.get_response()}")
        sys.exit(1)
print("PASS: repeat_int32")
sys.exit(0)
