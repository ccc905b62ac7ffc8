import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")

            # The model to call comes in as a BYTES input; its element is bytes.
            model_name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME")
            model_name_string = model_name.as_numpy()[0]

            infer_request = pb_utils.InferenceRequest(
                model_name=model_name_string,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[in_0, in_1],
            )

            # Synchronous, blocking call
            infer_response = infer_request.exec()

            # Errors come back in the response, they are not raised.
            if infer_response.has_error():
                raise pb_utils.TritonModelException(infer_response.error().message())

            responses.append(pb_utils.InferenceResponse(output_tensors=infer_response.output_tensors()))
        return responses

    def finalize(self):
        print("Cleaning up...")
