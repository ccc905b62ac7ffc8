"""A decoupled text generator for the generate extension: `text_input` (STRING [1]) is split into
words; it sends `max_tokens` responses (INT32 [1] input, or parameter `max_tokens`, default 1),
each with `text_output` (the next word, cycling), `index` (INT32), `scores` (FP32 [-1], index+1
values), and `info`: a JSON object with the request's parameters, id and input shapes."""

import json

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            parameters = json.loads(request.parameters())
            text = pb_utils.get_input_tensor_by_name(request, "text_input").as_numpy().reshape(-1)[0]
            words = (text.decode() if isinstance(text, bytes) else str(text)).split() or [""]
            tokens = pb_utils.get_input_tensor_by_name(request, "max_tokens")
            count = int(tokens.as_numpy().reshape(-1)[0]) if tokens is not None else int(parameters.get("max_tokens", 1))
            info = json.dumps({
                "parameters": parameters,
                "id": request.request_id(),
                "inputs": {t.name(): list(t.as_numpy().shape) for t in sorted(request.inputs(), key=lambda t: t.name())},
            }, sort_keys=True)
            for index in range(count):
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("text_output", np.array([words[index % len(words)].encode()], dtype=np.object_)),
                    pb_utils.Tensor("index", np.array([index], dtype=np.int32)),
                    pb_utils.Tensor("scores", np.arange(index + 1, dtype=np.float32)),
                    pb_utils.Tensor("info", np.array([info.encode()], dtype=np.object_)),
                ]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
