"""The KServe/Triton v2 REST protocol: tensor codec (JSON + binary tensor data extension) and
request validation against a model's config. See `codec` and `validation` for the contracts."""

from .codec import (
    FRONTEND_PARAMETERS,
    decode_request,
    encode_error,
    encode_response,
    tensor_datatype,
)
from .validation import validate_request

__all__ = [
    "FRONTEND_PARAMETERS",
    "decode_request",
    "encode_error",
    "encode_response",
    "tensor_datatype",
    "validate_request",
]
