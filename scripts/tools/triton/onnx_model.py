"""A Triton python-backend model.py that runs an ONNX file with ONNX Runtime on CPU.

`scripts/tools/tritonserver serve` puts this file, as model.py, into every version of an ONNX model
it rewrites (the tritonserver in nvidia-pytriton has no onnxruntime backend). It follows Triton's
onnxruntime backend where that matters for a comparison:

- one InferenceSession per model instance (each python-backend instance is a process of its own);
- session options from the config's `parameters`: intra_op_thread_count, inter_op_thread_count,
  execution_mode, enable_mem_arena, enable_mem_pattern, and `optimization.graph.level`; what is
  not set keeps ONNX Runtime's default, as in the onnxruntime backend, except the intra-op threads
  when `serve --ort-threads N` gave a default (TOOLKIT_TRITON_ORT_THREADS);
- when max_batch_size > 0, the requests of one execute() call (the batch Triton's dynamic batcher
  formed) are concatenated along dim 0, run once, and split back; requests whose shapes cannot be
  concatenated, or a batch that fails, run one by one so each request gets its own result or error;
- `reshape` of inputs and outputs, the requested outputs of each request, BYTES tensors.
"""

import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils

_GRAPH_LEVELS = {-1: "ORT_ENABLE_BASIC", 1: "ORT_ENABLE_EXTENDED", 2: "ORT_DISABLE_ALL"}


def _parameter(config, key):
    value = config.get("parameters", {}).get(key)
    return None if value is None else value.get("string_value", "")


def _flag(text):
    return text.strip().lower() in ("1", "true", "on", "yes")


def _session_options(config):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    intra = _parameter(config, "intra_op_thread_count") or os.environ.get("TOOLKIT_TRITON_ORT_THREADS")
    if intra is not None:
        options.intra_op_num_threads = int(intra)
    if _parameter(config, "inter_op_thread_count") is not None:
        options.inter_op_num_threads = int(_parameter(config, "inter_op_thread_count"))
    if _parameter(config, "execution_mode") is not None:
        parallel = int(_parameter(config, "execution_mode")) == 1
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL if parallel else ort.ExecutionMode.ORT_SEQUENTIAL
    if _parameter(config, "enable_mem_arena") is not None:
        options.enable_cpu_mem_arena = _flag(_parameter(config, "enable_mem_arena"))
    if _parameter(config, "enable_mem_pattern") is not None:
        options.enable_mem_pattern = _flag(_parameter(config, "enable_mem_pattern"))
    level = int(config.get("optimization", {}).get("graph", {}).get("level", 0))
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _GRAPH_LEVELS.get(level, "ORT_ENABLE_ALL"))
    return options


def _as_text(array):
    """Triton hands BYTES tensors over as arrays of bytes objects; ONNX Runtime wants str."""
    if array.dtype != np.object_:
        return array
    return np.vectorize(lambda v: v.decode("utf-8") if isinstance(v, bytes) else v, otypes=[object])(array)


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        filename = _parameter(config, "onnx_model_filename") or "model.onnx"
        path = os.path.join(args["model_repository"], args["model_version"], filename)
        if os.path.isdir(path):  # the onnxruntime backend accepts a directory holding model.onnx
            path = os.path.join(path, "model.onnx")
        self.session = ort.InferenceSession(path, _session_options(config), providers=["CPUExecutionProvider"])
        self.batched = config.get("max_batch_size", 0) > 0
        # A tensor with `reshape`: the model sees reshape.shape, clients see dims.
        self.input_shapes = {
            t["name"]: [int(d) for d in t["reshape"]["shape"]] if "reshape" in t else None for t in config["input"]
        }
        self.output_dims = {
            t["name"]: [int(d) for d in t["dims"]] if "reshape" in t else None for t in config["output"]
        }
        model_inputs = {t.name for t in self.session.get_inputs()}
        model_outputs = {t.name for t in self.session.get_outputs()}
        unknown = sorted((set(self.input_shapes) - model_inputs) | (set(self.output_dims) - model_outputs))
        if unknown:  # the onnxruntime backend refuses such a model too
            raise pb_utils.TritonModelException(f"tensors {unknown} of the configuration are not in {path}")

    def _shaped(self, array, shape):
        if shape is None:
            return array
        return array.reshape(([array.shape[0]] if self.batched else []) + shape)

    def execute(self, requests):
        feeds, wanted = [], []
        for request in requests:
            feed = {}
            for name, shape in self.input_shapes.items():
                tensor = pb_utils.get_input_tensor_by_name(request, name)
                if tensor is not None:
                    feed[name] = self._shaped(_as_text(tensor.as_numpy()), shape)
            feeds.append(feed)
            wanted.append(list(request.requested_output_names()) or list(self.output_dims))
        if self.batched and len(feeds) > 1 and self._concatenable(feeds):
            try:
                return self._run_together(feeds, wanted)
            except Exception:
                pass  # one by one below: each request gets its own result or error
        return [self._run_alone(feed, names) for feed, names in zip(feeds, wanted)]

    @staticmethod
    def _concatenable(feeds):
        first = feeds[0]
        for feed in feeds[1:]:
            if feed.keys() != first.keys():
                return False
            for name, array in feed.items():
                if array.shape[1:] != first[name].shape[1:] or array.dtype != first[name].dtype:
                    return False
        return True

    def _run_together(self, feeds, wanted):
        names = list(dict.fromkeys(n for w in wanted for n in w))
        batch = {name: np.concatenate([feed[name] for feed in feeds]) for name in feeds[0]}
        results = self.session.run(names, batch)
        sizes = [len(next(iter(feed.values()))) for feed in feeds]
        bounds = np.cumsum(sizes)[:-1]
        pieces = {name: np.split(result, bounds) for name, result in zip(names, results)}
        return [self._response({n: pieces[n][i] for n in w}) for i, w in enumerate(wanted)]

    def _run_alone(self, feed, names):
        try:
            return self._response(dict(zip(names, self.session.run(names, feed))))
        except Exception as error:
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(f"onnxruntime: {error}"))

    def _response(self, outputs):
        tensors = [pb_utils.Tensor(n, self._shaped(array, self.output_dims[n])) for n, array in outputs.items()]
        return pb_utils.InferenceResponse(output_tensors=tensors)
