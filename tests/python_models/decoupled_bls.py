"""BLS against decoupled models: with WHICH (INT32 [1]) 0 it sums the OUT of every response of
`exec(decoupled=True)` on `square` (IN forwarded); 1 calls `square` with plain `exec()` (refused:
it is decoupled); 2 `exec(decoupled=True)` on the model that is not decoupled (`echo`); 3 on an
unknown model; 4 on `probe` with modes 8, 2 and 9 (error responses); 5 iterates one iterator twice.
Outputs SUM (INT32 [1]) and LOG (STRING [1]): one JSON entry per response seen."""

import json

import numpy as np

import triton_python_backend_utils as pb_utils


def describe(response):
    error = response.error()
    return [error.message() if error is not None else None, [t.name() for t in response.output_tensors()]]


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN")
            which = int(pb_utils.get_input_tensor_by_name(request, "WHICH").as_numpy()[0])
            log, total = [], 0
            square = pb_utils.InferenceRequest(model_name="square", inputs=[value], requested_output_names=["OUT"])
            if which == 0:
                for item in square.exec(decoupled=True):
                    log.append(describe(item))
                    if item.output_tensors():
                        total += int(pb_utils.get_output_tensor_by_name(item, "OUT").as_numpy()[0])
            elif which == 1:
                log.append(describe(square.exec()))
            elif which == 2:
                text = pb_utils.Tensor("text_input", np.array([[b"hi"]], dtype=np.object_))
                echo = pb_utils.InferenceRequest(model_name="echo", inputs=[text], requested_output_names=["text_output"])
                log.extend(describe(item) for item in echo.exec(decoupled=True))
            elif which == 3:
                unknown = pb_utils.InferenceRequest(model_name="nope", inputs=[value], requested_output_names=["OUT"])
                log.extend(describe(item) for item in unknown.exec(decoupled=True))
            elif which == 4:
                for mode in (8, 2, 9):
                    probe = pb_utils.InferenceRequest(
                        model_name="probe", inputs=[pb_utils.Tensor("MODE", np.array([mode], np.int32))],
                        requested_output_names=["OUT"],
                    )
                    log.extend([mode, *describe(item)] for item in probe.exec(decoupled=True))
            elif which == 5:
                iterator = square.exec(decoupled=True)
                log.append([len(item.output_tensors()) for item in iterator])
                log.append([len(item.output_tensors()) for item in iterator])
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("SUM", np.array([total], np.int32)),
                pb_utils.Tensor("LOG", np.array([json.dumps(log).encode()], dtype=np.object_)),
            ]))
        return responses
