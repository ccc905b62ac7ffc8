"""A decoupled model behaving as python_backend's examples/decoupled square model: a request with
IN = [n] gets n responses OUT = [n], sent from a thread per request after `execute` returned,
then the final flag (n = 0: only the final flag). Several requests of a batch, or of consecutive
batches, are answered concurrently and their responses interleave."""

import threading

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            worker = threading.Thread(target=self.respond, args=(request.get_response_sender(), value), daemon=True)
            worker.start()
            self.threads.append(worker)
        return None

    def respond(self, sender, value):
        for _ in range(int(value.reshape(-1)[0])):
            sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("OUT", value.astype(np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        for worker in self.threads:
            worker.join()
