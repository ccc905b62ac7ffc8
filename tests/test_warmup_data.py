"""model_warmup's synthetic data as tritonserver makes it (core's backend_model_instance.cc,
GenerateWarmupData): `random_data` is random bytes read as the input's datatype (BYTES: empty
strings), `zero_data` zeros; the requests of a sample share it, shaped [1] + dims when the model
batches. The bytes come from the standard library's generator (numpy.random's import is ~9 ms of
a cold start), seeded, so a sample's data is the same at every start."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from handlers.manifest import ModelSpec
from handlers.warmup import warmup_samples


def _spec(inputs: dict) -> ModelSpec:
    config = {"max_batch_size": 4, "model_warmup": [{"name": "s", "batch_size": 2, "count": 3, "inputs": inputs}]}
    return ModelSpec("m", Path("/nonexistent/m"), (1,), {}, config)


def test_random_data_is_random_bytes_of_each_datatype_the_same_at_every_start():
    inputs = {"F": {"data_type": "TYPE_FP32", "dims": [64], "random_data": True},
              "I": {"data_type": "TYPE_INT8", "dims": [2, 8], "random_data": True},
              "B": {"data_type": "TYPE_BOOL", "dims": [32], "random_data": True},
              "S": {"data_type": "TYPE_STRING", "dims": [3], "random_data": True},
              "Z": {"data_type": "TYPE_FP16", "dims": [5], "zero_data": True}}
    (sample,) = warmup_samples(_spec(inputs))
    assert (sample.name, sample.batch_size, sample.iterations) == ("s", 2, 3)
    data = sample.inputs
    assert (data["F"].dtype, data["F"].shape) == (np.float32, (1, 64))
    assert (data["I"].dtype, data["I"].shape) == (np.int8, (1, 2, 8))
    assert (data["B"].dtype, data["B"].shape) == (np.bool_, (1, 32))
    assert data["S"].tolist() == [[b"", b"", b""]]
    assert (data["Z"].dtype, data["Z"].tolist()) == (np.float16, [[0.0] * 5])
    raw = data["F"].tobytes() + data["I"].tobytes()
    assert len(set(raw)) > 64  # 272 random bytes take most of the 256 values
    assert data["B"].sum() >= 24  # a random byte is non-zero (True) 255 times in 256
    again = warmup_samples(_spec(inputs))[0].inputs
    assert all(np.array_equal(data[k], again[k], equal_nan=k in ("F", "Z")) for k in "FIBZ")
    other = warmup_samples(_spec(inputs), seed=1)[0].inputs
    assert other["F"].tobytes() != data["F"].tobytes()
    assert data["F"].flags.writeable and data["I"].flags.writeable  # copies, not views of the random bytes


def test_warmup_data_does_not_import_numpy_random():
    import subprocess

    script = ("import sys\nfrom pathlib import Path\nfrom handlers.manifest import ModelSpec\n"
              "from handlers.warmup import warmup_samples\n"
              "spec = ModelSpec('m', Path('/x'), (1,), {}, {'model_warmup': [{'batch_size': 1, 'inputs': "
              "{'X': {'data_type': 'TYPE_FP32', 'dims': [4], 'random_data': True}}}]})\n"
              "warmup_samples(spec)\nprint('numpy.random' in sys.modules)\n")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=root, timeout=60)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
