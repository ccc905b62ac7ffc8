import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = dict(args)
        self.model_dir = pb_utils.get_model_dir()
        self.pid = os.getpid()
        # Triton requires the MetricFamily objects to outlive their Metric objects.
        self.requests_family = pb_utils.MetricFamily(
            name="probe_requests", description="requests seen by the probe", kind=pb_utils.MetricFamily.COUNTER
        )
        self.requests_metric = self.requests_family.Metric(labels={"model": args["model_name"]})
        self.batch_family = pb_utils.MetricFamily(
            name="probe_batch_size", description="requests per execute", kind=pb_utils.MetricFamily.HISTOGRAM
        )
        self.batches = self.batch_family.Metric(buckets=[1.0, 2.0, 4.0, 8.0])
        pb_utils.Logger.log_info(f"probe initialized as {args['model_instance_name']}")

    def execute(self, requests):
        self.requests_metric.increment(len(requests))
        self.batches.observe(len(requests))
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            info = {
                "request_id": request.request_id(),
                "correlation_id": request.correlation_id(),
                "flags": request.flags(),
                "timeout": request.timeout(),
                "parameters": request.parameters(),
                "requested": sorted(request.requested_output_names()),
                "writeable": bool(x.flags.writeable),
                "args": self.args if int(x.reshape(-1)[0]) == -1 else None,
                "model_dir": self.model_dir,
                "pid": self.pid,
                "counted": self.requests_metric.value(),
            }
            batch = np.full(x.shape[:1] + (1,), len(requests), dtype=np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("BATCH", batch),
                        pb_utils.Tensor("ECHO", x * 2),
                        pb_utils.Tensor("INFO", np.array([[json.dumps(info).encode()]] * x.shape[0], dtype=object)),
                    ]
                )
            )
        return responses
