"""simple_string_dyna_sequence: each sequence (a decimal string correlation ID) accumulates its
INPUTs; OUTPUT is the sum so far, and on the sequence's last request the sum plus the ID."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = lambda name: pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0]
            corrid = value("CORRID")
            corrid = corrid.decode() if isinstance(corrid, bytes) else str(corrid)
            if value("START"):
                self.sums[corrid] = 0
            self.sums[corrid] = self.sums.get(corrid, 0) + int(value("INPUT"))
            output = self.sums[corrid]
            if value("END"):
                output += int(corrid)
                del self.sums[corrid]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.array([[output]], np.int32))]))
        return responses
