import os
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Holds each batch until the test releases it: writes `started-<n>` into the folder named by
    the HOLD_SIGNALS environment variable when execute begins, then waits (up to 120 s) for a file
    `release` there. Returns its input X as Y."""

    def initialize(self, args):
        self.signals = Path(os.environ["HOLD_SIGNALS"])
        self.batches = 0

    def execute(self, requests):
        self.batches += 1
        (self.signals / f"started-{os.getpid()}-{self.batches}").write_text(str(len(requests)))
        deadline = time.monotonic() + 120
        while not (self.signals / "release").exists() and time.monotonic() < deadline:
            time.sleep(0.01)  # a file written by another process: there is nothing to wait on
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", np.array(x, dtype=np.int32))]))
        return responses
