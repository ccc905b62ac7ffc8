import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """initialize/finalize/is_ready, BLS refused during initialize, is_model_ready, the
    non-decoupled response sender, and BYTES outputs given as str."""

    def initialize(self, args):
        self.config = json.loads(args["model_config"])
        self.marker = self.config["parameters"]["MARKER"]["string_value"]
        try:
            pb_utils.InferenceRequest(model_name="add_sub", inputs=[], requested_output_names=[]).exec()
            self.bls_in_initialize = "allowed"
        except pb_utils.TritonModelException as exc:
            self.bls_in_initialize = str(exc)
        with open(self.marker, "a") as f:
            f.write(f"initialize {args['model_instance_name']} {os.getpid()}\n")

    def is_ready(self):
        return os.path.exists(self.marker + ".ready")

    def execute(self, requests):
        ready = {
            "add_sub": pb_utils.is_model_ready("add_sub"),
            "add_sub/1": pb_utils.is_model_ready("add_sub", "1"),
            "add_sub/7": pb_utils.is_model_ready("add_sub", "7"),
            "nope": pb_utils.is_model_ready("nope"),
        }
        for request in requests:
            info = {"bls_in_initialize": self.bls_in_initialize, "ready": ready, "pid": os.getpid()}
            response = pb_utils.InferenceResponse(
                [
                    pb_utils.Tensor("INFO", np.array([json.dumps(info)], dtype=object)),  # str element
                    pb_utils.Tensor("TEXT", np.array(["héllo", 7], dtype=object)),
                ]
            )
            # through the response sender instead of the return value (allowed since Triton 23.x)
            request.get_response_sender().send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def finalize(self):
        with open(self.marker, "a") as f:
            f.write("finalize\n")
