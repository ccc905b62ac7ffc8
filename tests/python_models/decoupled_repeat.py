"""A decoupled model behaving as python_backend's examples/decoupled repeat model: for a request
with IN [n] (INT32), DELAY [n] (UINT32, ms) and WAIT [1] (UINT32, ms) it sends n responses from a
thread of its own, the i-th after DELAY[i] ms with OUT = [IN[i]] and IDX = [i], then the final
flag; `execute` returns after WAIT ms, possibly before the responses are all sent, so one instance
has several requests in flight. An empty IN sends no response, only the final flag."""

import json
import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        if not pb_utils.using_decoupled_model_transaction_policy(config):
            raise pb_utils.TritonModelException("repeat needs model_transaction_policy { decoupled: true }")
        self.out_dtype = pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(config, "OUT")["data_type"])
        self.idx_dtype = pb_utils.triton_string_to_numpy(pb_utils.get_output_config_by_name(config, "IDX")["data_type"])
        self.in_flight = 0
        self.lock = threading.Lock()

    def execute(self, requests):
        if len(requests) != 1:
            raise pb_utils.TritonModelException(f"repeat takes one request per execute, got {len(requests)}")
        request = requests[0]
        values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
        delays = pb_utils.get_input_tensor_by_name(request, "DELAY").as_numpy()
        if values.shape != delays.shape:
            raise pb_utils.TritonModelException(
                f"IN and DELAY must have the same shape, got {list(values.shape)} and {list(delays.shape)}"
            )
        with self.lock:
            self.in_flight += 1
        worker = threading.Thread(target=self.respond, args=(request.get_response_sender(), values, delays), daemon=True)
        worker.start()
        wait = pb_utils.get_input_tensor_by_name(request, "WAIT").as_numpy()
        time.sleep(float(wait[0]) / 1000)
        return None

    def respond(self, sender, values, delays):
        for index in range(values.size):
            time.sleep(float(delays[index]) / 1000)
            sender.send(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("IDX", np.array([index], self.idx_dtype)),
                pb_utils.Tensor("OUT", np.array([values[index]], self.out_dtype)),
            ]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        with self.lock:
            self.in_flight -= 1

    def finalize(self):
        while True:  # let the responses in flight finish, as the example does
            with self.lock:
                if self.in_flight == 0:
                    return
            time.sleep(0.01)
