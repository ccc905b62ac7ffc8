import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Adds 1 to X and passes it on to the model named by the NEXT parameter (BLS), if any."""

    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.next = config["parameters"].get("NEXT", {}).get("string_value", "")

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy() + 1
            if self.next:
                response = pb_utils.InferenceRequest(
                    model_name=self.next, requested_output_names=["Y"], inputs=[pb_utils.Tensor("X", x)]
                ).exec()
                if response.has_error():
                    responses.append(pb_utils.InferenceResponse(error=response.error()))
                    continue
                x = pb_utils.get_output_tensor_by_name(response, "Y").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return responses
