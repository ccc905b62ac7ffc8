"""toolkit: ship a Triton model repository to serverless platforms (build-time side)."""

__version__ = "0.1.0"
