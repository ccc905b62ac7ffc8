"""Model backends: onnxruntime (ONNX Runtime sessions), python (Triton python-backend model.py)."""
