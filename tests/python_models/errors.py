import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        # Not at module level: tritonserver adds TritonError & co. to pb_utils only after
        # importing model.py.
        self.codes = {
            1: pb_utils.TritonError.INVALID_ARG,
            2: pb_utils.TritonError.NOT_FOUND,
            3: pb_utils.TritonError.UNAVAILABLE,
            4: pb_utils.TritonError.UNSUPPORTED,
            5: pb_utils.TritonError.INTERNAL,
        }

    def execute(self, requests):
        modes = [int(pb_utils.get_input_tensor_by_name(r, "MODE").as_numpy().reshape(-1)[0]) for r in requests]
        if 10 in modes:
            raise ValueError("mode 10 makes execute raise")
        if 11 in modes:
            raise pb_utils.TritonModelException("mode 11 raises TritonModelException")
        if 12 in modes:
            return []  # wrong number of responses
        if 13 in modes:
            import os

            os._exit(7)  # the model process dies
        responses = []
        for mode in modes:
            if mode in self.codes:
                code = self.codes[mode]
                error = pb_utils.TritonError(f"error with code {code.name}", code)
                responses.append(pb_utils.InferenceResponse(error=error))
            elif mode == 6:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("default code")))
            else:
                out = np.array([mode], dtype=np.int32)
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]))
        return responses
