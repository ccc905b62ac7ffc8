# A helper module next to model.py, imported by name (the version folder is on sys.path) and
# relatively (model.py is imported as a module of package "<version>").
import helpers
import numpy as np
import triton_python_backend_utils as pb_utils

from . import helpers as relative_helpers


class TritonPythonModel:
    def execute(self, requests):
        who = np.array([helpers.WHO.encode(), relative_helpers.WHO.encode(), __name__.encode()], dtype=object)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("WHO", who)]) for _ in requests]
