"""A decoupled model for the ensemble tests (tests/decoupled_ensembles.py): for IDS [n] (INT32) it
sends one response per id, TOKEN = [id] and POS = [i], from `execute` itself. An id of ord('!')
gets an error response instead (the stream goes on); an id of ord('?') gets a response with
TOKEN only (POS left out); an id of ord('~') is sent after 0.3 s (a slow token). When the last id is ord('.') the final flag comes with the last
response, else a flag-only final follows. IDS [] sends only the final flag."""

import time

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            ids = pb_utils.get_input_tensor_by_name(request, "IDS").as_numpy().reshape(-1)
            last_with_flag = ids.size > 0 and ids[-1] == ord(".")
            for pos, token in enumerate(ids):
                flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last_with_flag and pos == ids.size - 1 else 0
                if token == ord("~"):
                    time.sleep(0.3)
                if token == ord("!"):
                    response = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"bad token at {pos}"))
                elif token == ord("?"):
                    response = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("TOKEN", np.array([token], np.int32))])
                else:
                    response = pb_utils.InferenceResponse(output_tensors=[
                        pb_utils.Tensor("TOKEN", np.array([token], np.int32)),
                        pb_utils.Tensor("POS", np.array([pos], np.int32)),
                    ])
                sender.send(response, flags=flags)
            if not last_with_flag:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
