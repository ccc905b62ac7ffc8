"""Triton's rules for a model configuration, on Triton's config JSON: the one implementation.

The compiler (toolkit/repository) renders its protobuf `ModelConfig` with Triton's JSON printer
and calls these; the image build's completion step (handlers/backends/python/complete.py), which
has no protobuf, calls them on the config a python model's `auto_complete_config` completed. Both
therefore give tritonserver's messages from the same code:

- `errors.py`: `ConfigError` (Triton's message and status code, plus what we add);
- `validate.py`: ValidateModelConfig, ValidateModelIOConfig, ValidateInstanceGroup, Model::Init's
  label files (core model_config_utils.cc, model.cc);
- `ensemble.py`: ValidateEnsembleSchedulingConfig (one ensemble's data flow) and
  ValidateEnsembleConfig (its steps against the composing models' configs, ensemble_utils.cc);
- `support.py`: what this product refuses in a valid config.
"""
