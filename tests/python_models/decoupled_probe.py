"""A decoupled model whose MODE input (INT32 [1]) picks what its response sender does, to check the
runtime against python_backend's rules and messages. COUNT (INT32 [1], optional, default 2) is a
count or a delay in ms. Outputs: OUT (STRING [-1]) and IDX (INT32 [1]).

Modes: 0 COUNT responses then a flag-only final; 1 COUNT responses, the last with the final flag;
2 one response, then `execute` raises; 3 `execute` returns a list; 4 a final response, then two
more sends (their exceptions are kept for mode 6); 5 sends with wrong arguments, then a final
response listing their exceptions; 6 a final response with what mode 4 and 10 recorded; 7 sends
nothing and keeps nothing (the sender is dropped); 8 an error response, a response, a flag-only
final; 9 an INVALID_ARG error response with the final flag; 10 one response, then waits (in a
thread) until the request is cancelled and records it; 11 a final response from a thread COUNT ms
after `execute` returned; 13 raises before sending; 14 a flag-only final; 15 sleeps COUNT ms in
`execute`, then a final response; 16 a final response with the request's parameters, id and
requested outputs as JSON; 17 returns [None]; 18 one response, then the model process exits; 19
sends one response, then blocks `execute` until the request is cancelled (at most 60 s), then
sends a flag-only final.
"""

import json
import os
import threading
import time

import numpy as np

import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def response(index, text):
    return pb_utils.InferenceResponse(output_tensors=[
        pb_utils.Tensor("OUT", np.array([text.encode()], dtype=np.object_)),
        pb_utils.Tensor("IDX", np.array([index], dtype=np.int32)),
    ])


class TritonPythonModel:
    def initialize(self, args):
        self.log = []
        self.threads = []

    def execute(self, requests):
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "MODE").as_numpy()[0])
            count_tensor = pb_utils.get_input_tensor_by_name(request, "COUNT")
            count = int(count_tensor.as_numpy()[0]) if count_tensor is not None else 2
            result = self.run(mode, count, request)
            if result is not None:
                return result
        return None

    def run(self, mode, count, request):
        sender = request.get_response_sender()
        if mode == 0:
            for index in range(count):
                sender.send(response(index, f"r{index}"))
            sender.send(flags=FINAL)
        elif mode == 1:
            for index in range(count):
                sender.send(response(index, f"r{index}"), flags=FINAL if index == count - 1 else 0)
        elif mode == 2:
            sender.send(response(0, "before raise"))
            raise ValueError("boom after one response")
        elif mode == 3:
            return [response(0, "returned")]
        elif mode == 4:
            sender.send(response(0, "final"), flags=FINAL)
            for args in ((response(1, "after final"), 0), (None, FINAL)):
                try:
                    sender.send(args[0], flags=args[1])
                except pb_utils.TritonModelException as exc:
                    self.log.append(f"{type(exc).__name__}: {exc}")
        elif mode == 5:
            messages = []
            for args in ((None, 0), (response(0, "x"), 2), ("not a response", 0)):
                try:
                    sender.send(args[0], flags=args[1])
                    messages.append("sent")
                except Exception as exc:  # noqa: BLE001 - the point is the exception's type and text
                    messages.append(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")
            sender.send(response(0, " | ".join(messages)), flags=FINAL)
        elif mode == 6:
            sender.send(response(0, json.dumps(self.log)), flags=FINAL)
        elif mode == 7:
            pass
        elif mode == 8:
            sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("first failed")))
            sender.send(response(1, "after error"))
            sender.send(flags=FINAL)
        elif mode == 9:
            error = pb_utils.TritonError("only error", pb_utils.TritonError.INVALID_ARG)
            sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
        elif mode == 10:
            sender.send(response(0, "waiting for cancellation"))
            worker = threading.Thread(target=self.until_cancelled, args=(request, sender), daemon=True)
            worker.start()
            self.threads.append(worker)
        elif mode == 11:
            def later():
                time.sleep(count / 1000)
                sender.send(response(0, "late"), flags=FINAL)

            worker = threading.Thread(target=later, daemon=True)
            worker.start()
            self.threads.append(worker)
        elif mode == 13:
            raise RuntimeError("raised before sending")
        elif mode == 14:
            sender.send(flags=FINAL)
        elif mode == 15:
            time.sleep(count / 1000)
            sender.send(response(0, "slept"), flags=FINAL)
        elif mode == 16:
            info = {"parameters": json.loads(request.parameters()), "id": request.request_id(),
                    "requested": sorted(request.requested_output_names())}
            sender.send(response(0, json.dumps(info, sort_keys=True)), flags=FINAL)
        elif mode == 17:
            return [None]
        elif mode == 18:
            sender.send(response(0, "before exit"))
            os._exit(3)
        elif mode == 19:
            sender.send(response(0, "holding the instance"))
            deadline = time.monotonic() + 60
            while not request.is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.01)
            sender.send(flags=FINAL)
        return None

    def until_cancelled(self, request, sender):
        deadline = time.monotonic() + 60
        while not sender.is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
        self.log.append(f"cancelled: request {request.is_cancelled()} sender {sender.is_cancelled()}")
        sender.send(flags=FINAL)

    def finalize(self):
        for worker in self.threads:
            worker.join(timeout=60)
