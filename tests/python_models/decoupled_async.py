"""Decoupled models with `async def execute`. This one sends X (INT32 [1]) responses Y = 0..X-1,
awaiting between them (the instance takes its next request meanwhile), then the final flag; X < 0
raises after the first response, which must end the request's stream with the error. With model
parameter CALL_SQUARE it instead awaits `async_exec(decoupled=True)` on `square` and streams its
responses back (BLS from async code)."""

import asyncio
import json

import numpy as np

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.call_square = "CALL_SQUARE" in parameters

    async def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            x = int(pb_utils.get_input_tensor_by_name(request, "X").as_numpy()[0])
            if self.call_square:
                call = pb_utils.InferenceRequest(
                    model_name="square", inputs=[pb_utils.Tensor("IN", np.array([x], np.int32))],
                    requested_output_names=["OUT"],
                )
                iterator = await call.async_exec(decoupled=True)
                for item in iterator:
                    if item.output_tensors():
                        out = pb_utils.get_output_tensor_by_name(item, "OUT").as_numpy()
                        sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", out)]))
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                continue
            for k in range(max(x, 1)):
                await asyncio.sleep(0.01)
                sender.send(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", np.array([k], np.int32))]))
                if x < 0:
                    raise ValueError("async execute failed mid-stream")
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
