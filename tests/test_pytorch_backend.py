"""The pytorch backend (platform pytorch_libtorch) in-process: models made by torch.jit.script and
torch.jit.trace, compiled by the toolkit as `toolkit validate` compiles them, and run through
the backend's instances (handlers/backends/pytorch) and the real DynamicBatcher. Every output is
compared with what torch itself computes on the same inputs. Messages are tritonserver 2.51
pytorch_backend's (src/libtorch.cc) unless the test says otherwise.
"""

from __future__ import annotations

import logging
import queue
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch_models as tm

from handlers.backends import backend_module
from handlers.backends.pytorch import settings
from handlers.backends.pytorch.config import ConfigError, parse_parameters
from handlers.backends.pytorch.instance import ModelLoadError, PyTorchInstance, placement
from handlers.batching import DynamicBatcher
from handlers.errors import ErrorCode, InferenceError
from handlers.inference import InferRequest, InferResponse, RequestedOutput
from handlers.instance_group import InstanceSlot
from handlers.manifest import Manifest
from toolkit.repository.compile import compile_repository

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")

F32 = "TYPE_FP32"
WAIT = 30.0


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return tmp_path / "models"


def compiled(repo: Path, name: str):
    result = compile_repository(repo, [name])
    assert name in result.models, result.failure_lines()
    return result.models[name]


def failure(repo: Path, name: str):
    result = compile_repository(repo, [name])
    assert name in result.failures, f"{name} compiled: {result.models[name].config}"
    return result.failures[name]


def spec_of(repo: Path, name: str):
    result = compile_repository(repo, [name])
    assert result.ok, result.failure_lines()
    return Manifest.from_dict(result.manifest(), repo).models[name]


def instance(repo: Path, name: str, slot: InstanceSlot | None = None) -> PyTorchInstance:
    spec = spec_of(repo, name)
    return backend_module("pytorch").create_instance(spec, spec.versions[-1], slot or InstanceSlot(f"{name}_0", "KIND_CPU", 0))


def request(name: str, inputs: dict[str, np.ndarray], *, batch: int = 1, rid: str = "", outputs=None) -> InferRequest:
    requested = None if outputs is None else [RequestedOutput(o) for o in outputs]
    return InferRequest(name, 1, inputs, requested_outputs=requested, id=rid, batch_size=batch)


def ok(outcome) -> dict[str, np.ndarray]:
    assert isinstance(outcome, InferResponse), outcome
    return outcome.outputs


def strings(*items: bytes) -> np.ndarray:
    array = np.empty(len(items), dtype=object)
    array[:] = list(items)
    return array


def add_sub_model(repo: Path, name: str, inputs: list[str], outputs: list[str], *, batch: int = 8, extra: str = "") -> None:
    tm.write_model(
        repo, name,
        tm.config(name, [tm.tensor(i, F32, [4]) for i in inputs], [tm.tensor(o, F32, [4]) for o in outputs],
                  max_batch_size=batch, extra=extra),
        lambda p: tm.save_script(tm.AddSub(), p),
    )


# -- naming conventions ---------------------------------------------------------------------------


def test_index_convention_maps_inputs_and_outputs_by_their_index_not_their_order(repo):
    """INPUT__1 listed first is still the forward's second argument; OUTPUT__1 its second result."""
    add_sub_model(repo, "m", ["INPUT__1", "INPUT__0"], ["OUTPUT__1", "OUTPUT__0"])
    x, y = np.arange(8, dtype=np.float32).reshape(2, 4), np.full((2, 4), 10, np.float32)
    out = ok(instance(repo, "m").execute([request("m", {"INPUT__0": x, "INPUT__1": y}, batch=2)])[0])
    np.testing.assert_array_equal(out["OUTPUT__0"], x + y)
    np.testing.assert_array_equal(out["OUTPUT__1"], x - y)


def test_forward_argument_names_map_inputs_by_name(repo):
    """Config inputs named like the forward's arguments (x, y), listed in the other order."""
    add_sub_model(repo, "m", ["y", "x"], ["OUTPUT__0", "OUTPUT__1"])
    x, y = np.ones((1, 4), np.float32), np.full((1, 4), 3, np.float32)
    out = ok(instance(repo, "m").execute([request("m", {"x": x, "y": y})])[0])
    np.testing.assert_array_equal(out["OUTPUT__0"], x + y)
    np.testing.assert_array_equal(out["OUTPUT__1"], x - y)


def test_other_names_follow_the_config_order_with_tritons_warning(repo):
    add_sub_model(repo, "plain", ["b", "a"], ["sum", "difference"])
    add_sub_model(repo, "odd", ["in__x", "in__y"], ["out__a", "out__b"])
    assert compiled(repo, "plain").warnings == []  # no "__" at all: config order, no warning
    warnings = compiled(repo, "odd").warnings
    assert (
        "input 'in__x' or previous input(s) are neither an input argument to the model 'odd' nor do they follow the "
        "<name>__<index> naming convention. Falling back to enforcing strict ordering from model configuration."
    ) in warnings
    assert (
        "output 'out__a' or previous output(s) of the model 'odd' do not follow the <name>__<index> naming "
        "convention. Falling back to enforcing strict ordering from model configuration."
    ) in warnings
    b, a = np.full((1, 4), 5, np.float32), np.ones((1, 4), np.float32)
    out = ok(instance(repo, "plain").execute([request("plain", {"b": b, "a": a})])[0])
    np.testing.assert_array_equal(out["sum"], b + a)
    np.testing.assert_array_equal(out["difference"], b - a)  # b is the first config input: forward's x


def test_dict_input_gets_every_input_under_its_config_name(repo):
    tm.write_model(
        repo, "d", tm.config("d", [tm.tensor("b", F32, [3]), tm.tensor("a", F32, [3])], [tm.tensor("y", F32, [3])], max_batch_size=4),
        lambda p: tm.save_script(tm.DictInput(), p),
    )
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.ones((2, 3), np.float32)
    out = ok(instance(repo, "d").execute([request("d", {"a": a, "b": b}, batch=2)])[0])
    expected = torch.jit.load(str(repo / "d" / "1" / "model.pt"))({"a": torch.from_numpy(a), "b": torch.from_numpy(b)})
    np.testing.assert_array_equal(out["y"], expected.numpy())


def test_index_beyond_the_forward_and_two_inputs_for_one_argument_are_refused(repo):
    add_sub_model(repo, "beyond", ["INPUT__0", "INPUT__2"], ["OUTPUT__0"])
    add_sub_model(repo, "twice", ["INPUT__1", "INPUT__01"], ["OUTPUT__0"])
    error = failure(repo, "beyond")
    assert error.message.startswith("input 'INPUT__2' of model 'beyond' names forward argument 2 (<name>__<index> convention), but forward takes 2 input(s)")
    assert failure(repo, "twice").message == (
        "inputs 'INPUT__1' and 'INPUT__01' of model 'twice' both name forward argument 1 (named index convention)"
    )


# -- inputs the forward takes, and configs tritonserver refuses ---------------------------------


class _NoArgs(torch.nn.Module):
    def forward(self) -> torch.Tensor:
        return torch.zeros(4)


def test_input_count_and_missing_inputs_or_outputs_are_refused_with_tritons_messages(repo):
    add_sub_model(repo, "three", ["INPUT__0", "INPUT__1", "INPUT__2"], ["OUTPUT__0"])
    tm.write_model(repo, "no_outputs", tm.config("no_outputs", [tm.tensor("x", F32, [4])], []), lambda p: tm.save_script(tm.Raises(), p))
    tm.write_model(repo, "no_inputs", tm.config("no_inputs", [], [tm.tensor("y", F32, [4])]), lambda p: tm.save_script(_NoArgs(), p))
    error = failure(repo, "three")
    assert error.message == "unable to load model 'three', configuration expects 3 inputs, model provides 2"
    assert error.stage == "load" and error.line is not None
    assert failure(repo, "no_outputs").message == "model configuration must contain at least one output, none were specified."
    assert failure(repo, "no_inputs").message == "model configuration must contain at least one input, none were specified."


class _IntArgument(torch.nn.Module):
    def forward(self, x: torch.Tensor, k: int) -> torch.Tensor:
        return x * k


class _TwoDicts(torch.nn.Module):
    def forward(self, a: torch.Tensor, d: dict[str, torch.Tensor]) -> torch.Tensor:
        return a + d["x"]


def test_forward_arguments_other_than_tensors_and_lists_are_refused(repo):
    tm.write_model(repo, "int_arg", tm.config("int_arg", [tm.tensor("x", F32, [4]), tm.tensor("k", "TYPE_INT64", [1])], [tm.tensor("y", F32, [4])]),
                   lambda p: tm.save_script(_IntArgument(), p))
    tm.write_model(repo, "dicts", tm.config("dicts", [tm.tensor("a", F32, [4]), tm.tensor("x", F32, [4])], [tm.tensor("y", F32, [4])]),
                   lambda p: tm.save_script(_TwoDicts(), p))
    assert failure(repo, "int_arg").message == (
        "An input of type 'int' was detected in the model. Only a single input of type Dict(str, Tensor) or input(s) "
        "of type Tensor are supported."
    )
    assert failure(repo, "dicts").message == (
        "Multiple inputs of kind DictType were detected. Only a single input of type Dict(str, Tensor) is supported."
    )


def test_unsupported_datatypes_and_multi_dimensional_strings_are_refused(repo):
    tm.write_model(repo, "u16", tm.config("u16", [tm.tensor("x", "TYPE_UINT16", [4])], [tm.tensor("y", F32, [4])]),
                   lambda p: tm.save_script(tm.Raises(), p))
    tm.write_model(repo, "bf16", tm.config("bf16", [tm.tensor("x", F32, [4])], [tm.tensor("y", "TYPE_BF16", [4])]),
                   lambda p: tm.save_script(tm.Raises(), p))
    tm.write_model(repo, "s2", tm.config("s2", [tm.tensor("words", "TYPE_STRING", [2])], [tm.tensor("OUTPUT__0", "TYPE_STRING", [-1]), tm.tensor("OUTPUT__1", "TYPE_INT64", [-1])], max_batch_size=4),
                   lambda p: tm.save_script(tm.Upper(), p))
    assert failure(repo, "u16").message == "unsupported datatype TYPE_UINT16 for input 'x' for model 'u16'"
    assert failure(repo, "bf16").message == "unsupported datatype TYPE_BF16 for output 'y' for model 'bf16'"
    assert failure(repo, "s2").message == "Triton only supports 1 dimensional List of String as input for 'words' for model 's2'"


def test_parameters_are_parsed_as_the_backend_parses_them(repo):
    def params(**values: str) -> dict:
        return {"name": "m", "parameters": {k: {"string_value": v} for k, v in values.items()}}

    defaults = parse_parameters({"name": "m"})
    assert (defaults.optimized_execution, defaults.inference_mode, defaults.cudnn, defaults.cache_cleaning,
            defaults.weight_sharing, defaults.jit_profiling, defaults.jit_executor, defaults.intra_op_threads) == (
        True, True, True, False, False, None, None, None)
    parsed = parse_parameters(params(DISABLE_OPTIMIZED_EXECUTION="On", INFERENCE_MODE="false", ENABLE_JIT_PROFILING="0",
                                     ENABLE_JIT_EXECUTOR="TRUE", INTRA_OP_THREAD_COUNT=" 3x", INTER_OP_THREAD_COUNT="0"))
    assert parsed.optimized_execution is False and parsed.inference_mode is False
    assert parsed.jit_profiling is False and parsed.jit_executor is True
    assert parsed.intra_op_threads == 3 and parsed.inter_op_threads is None  # std::stoi; <= 0 is ignored
    with pytest.raises(ConfigError, match=r"^failed to convert 'yes' to boolean$"):
        parse_parameters(params(ENABLE_CACHE_CLEANING="yes"))
    with pytest.raises(ConfigError, match=r"^failed to convert 'many' to integral number$"):
        parse_parameters(params(INTRA_OP_THREAD_COUNT="many"))
    with pytest.raises(ConfigError, match="out of range"):
        parse_parameters(params(INTER_OP_THREAD_COUNT="99999999999"))

    add_sub_model(repo, "m", ["INPUT__0", "INPUT__1"], ["OUTPUT__0"],
                  extra='parameters { key: "INFERENCE_MODE" value { string_value: "maybe" } }\n')
    error = failure(repo, "m")
    assert error.message == "failed to convert 'maybe' to boolean" and error.line == 6


def test_execution_switches_apply_per_thread_and_process_wide(repo):
    """DISABLE_OPTIMIZED_EXECUTION sets the graph executor of the executing thread; the JIT
    switches a model sets are set before each of its executions (process-wide, as in Triton)."""
    add_sub_model(repo, "m", ["INPUT__0", "INPUT__1"], ["OUTPUT__0"], extra=(
        'parameters [ { key: "DISABLE_OPTIMIZED_EXECUTION" value { string_value: "true" } },'
        ' { key: "ENABLE_JIT_PROFILING" value { string_value: "false" } },'
        ' { key: "INFERENCE_MODE" value { string_value: "false" } } ]\n'))
    before = torch._C._jit_set_profiling_mode(True)
    try:
        one = np.ones((1, 4), np.float32)
        ok(instance(repo, "m").execute([request("m", {"INPUT__0": one, "INPUT__1": one})])[0])
        assert torch._C._get_graph_executor_optimize() is False
        assert torch._C._jit_set_profiling_mode(True) is False  # the model switched profiling off
    finally:
        torch._C._set_graph_executor_optimize(True)
        torch._C._jit_set_profiling_mode(before)


@pytest.fixture
def fresh_thread_settings():
    threads = torch.get_num_threads()
    saved = dict(settings._chosen), dict(settings._budget)
    settings._chosen.clear()
    settings._budget.clear()
    yield
    settings._chosen.clear()
    settings._chosen.update(saved[0])
    settings._budget.clear()
    settings._budget.update(saved[1])
    torch.set_num_threads(threads)


def test_thread_counts_are_process_wide_and_the_first_model_decides(caplog, fresh_thread_settings):
    with caplog.at_level(logging.WARNING, logger="handlers.pytorch"):
        settings.apply_thread_counts(torch, "first", 1, None)
        settings.apply_thread_counts(torch, "second", 2, None)
    assert torch.get_num_threads() == 1 and settings.chosen_thread_counts() == {"intra": 1}
    assert "model 'second' asks for intra-op thread count 2, but model 'first' set it to 1" in caplog.text


def test_the_cpu_budget_sizes_torchs_pool_unless_a_config_sets_it(fresh_thread_settings):
    """Without INTRA_OP_THREAD_COUNT the process's pool takes the smallest budget share of its
    torch instances; an explicit count wins, and is what the budget plans with."""
    from handlers.backends.pytorch import explicit_threads
    from handlers.cpu_budget import for_target, plan

    settings.apply_budget_threads(torch, "a", 2)
    assert torch.get_num_threads() == 2
    settings.apply_budget_threads(torch, "b", 1)
    settings.apply_budget_threads(torch, "c", 3)
    assert torch.get_num_threads() == 1
    settings.apply_thread_counts(torch, "d", 2, None)
    settings.apply_budget_threads(torch, "e", 1)
    assert torch.get_num_threads() == 2

    def config(name: str, count: int, intra: str | None = None) -> dict:
        data = {"name": name, "platform": "pytorch_libtorch", "backend": "pytorch",
                "instance_group": [{"name": name, "kind": "KIND_CPU", "count": count}]}
        if intra is not None:
            data["parameters"] = {"INTRA_OP_THREAD_COUNT": {"string_value": intra}}
        return data

    assert explicit_threads(config("x", 1, "3")) == 3
    assert explicit_threads(config("x", 1, "0")) is None and explicit_threads(config("x", 1, "many")) is None

    class Model:
        def __init__(self, config):
            self.name, self.config, self.versions = config["name"], config, 1

    shares = plan([Model(config("budgeted", 2)), Model(config("pinned", 1, "1"))], for_target(4, "4 CPUs")).shares
    assert sorted((s.model, s.threads, s.source) for s in shares) == [
        ("budgeted", 1, "budget"), ("budgeted", 2, "budget"), ("pinned", 1, "explicit"),
    ]


# -- outputs --------------------------------------------------------------------------------------


def test_strings_in_and_out_as_lists_of_str(repo):
    tm.write_model(
        repo, "upper",
        tm.config("upper", [tm.tensor("words", "TYPE_STRING", [-1])],
                  [tm.tensor("OUTPUT__0", "TYPE_STRING", [-1]), tm.tensor("OUTPUT__1", "TYPE_INT64", [-1])]),
        lambda p: tm.save_script(tm.Upper(), p),
    )
    run = instance(repo, "upper")
    words = strings("tritón".encode(), b"", b"serverless")
    out = ok(run.execute([request("upper", {"words": words})])[0])
    upper, lengths = torch.jit.load(str(repo / "upper" / "1" / "model.pt"))(["tritón", "", "serverless"])
    assert out["OUTPUT__0"].tolist() == [w.encode() for w in upper] == [b"TRIT\xc3\xb3N", b"", b"SERVERLESS"]
    assert out["OUTPUT__1"].tolist() == lengths.tolist() == [7, 0, 10]  # TorchScript counts UTF-8 bytes
    bad, good = run.execute([
        request("upper", {"words": strings(b"\xff\xfe")}, rid="bad"), request("upper", {"words": strings(b"ok")}, rid="good"),
    ])
    assert isinstance(bad, InferenceError) and bad.code == ErrorCode.INVALID_ARG and "not valid UTF-8" in bad.message
    assert ok(good)["OUTPUT__0"].tolist() == [b"OK"]


def test_batched_strings_are_split_per_request(repo):
    """Better than tritonserver, which gives every request of a batch the list's first strings."""
    scalar = 'dims: [ 1 ] reshape: { shape: [ ] } }'  # one string per batch element: a 1-D List[str] in all
    config = tm.config("upper", [tm.tensor("words", "TYPE_STRING", [1])],
                       [tm.tensor("OUTPUT__0", "TYPE_STRING", [1]), tm.tensor("OUTPUT__1", "TYPE_INT64", [1])], max_batch_size=8)
    tm.write_model(repo, "upper", config.replace("dims: [ 1 ] }", scalar), lambda p: tm.save_script(tm.Upper(), p))
    run = instance(repo, "upper")
    first, second = run.execute([
        request("upper", {"words": strings(b"a", b"bb")}, batch=2),
        request("upper", {"words": strings(b"ccc")}, batch=1),
    ])
    assert ok(first)["OUTPUT__0"].tolist() == [b"A", b"BB"] and ok(first)["OUTPUT__1"].tolist() == [1, 2]
    assert ok(second)["OUTPUT__0"].tolist() == [b"CCC"] and ok(second)["OUTPUT__1"].tolist() == [3]


@pytest.mark.parametrize(
    "module, message",
    [
        (tm.ReturnsList(), "PyTorch execute failure: output must be of type Tensor or List[str], received List[Tensor]"),
        (tm.ReturnsDict(), "PyTorch execute failure: output must be of type Tensor, List[str] or Tuple containing one of "
                           "these two types. It should not be a List / Dictionary of Tensors or a Scalar"),
    ],
)
def test_list_and_dict_outputs_fail_every_request_as_in_triton(repo, module, message):
    tm.write_model(repo, "m", tm.config("m", [tm.tensor("x", F32, [4])], [tm.tensor("y", F32, [4])]), lambda p: tm.save_script(module, p))
    warnings = compiled(repo, "m").warnings
    assert any("every request will fail" in w for w in warnings), warnings
    outcome = instance(repo, "m").execute([request("m", {"x": np.ones(4, np.float32)})])[0]
    assert isinstance(outcome, InferenceError) and outcome.code == ErrorCode.INTERNAL
    assert outcome.message == message


def test_output_index_datatype_and_scalar_errors(repo):
    add_sub_model(repo, "index", ["INPUT__0", "INPUT__1"], ["OUTPUT__0", "OUTPUT__2"], batch=0)
    tm.write_model(repo, "dtype", tm.config("dtype", [tm.tensor("x", F32, [4])], [tm.tensor("y", "TYPE_FP64", [4])]),
                   lambda p: tm.save_script(tm.Raises(), p))
    tm.write_model(repo, "scalar", tm.config("scalar", [tm.tensor("x", F32, [4])], [tm.tensor("y", F32, [1])]),
                   lambda p: tm.save_script(_Scalar(), p))
    one = np.ones(4, np.float32)
    error = instance(repo, "index").execute([request("index", {"INPUT__0": one, "INPUT__1": one})])[0]
    assert error.code == ErrorCode.INVALID_ARG and error.message == (
        "The output OUTPUT__2 in the model configuration refers to an output index which doesn't exist. This model "
        "has 2 outputs"
    )
    error = instance(repo, "dtype").execute([request("dtype", {"x": one})])[0]
    assert error.code == ErrorCode.INVALID_ARG
    assert error.message == "configuration expects datatype TYPE_FP64 for output 'y', model provides TYPE_FP32"
    error = instance(repo, "scalar").execute([request("scalar", {"x": one})])[0]
    assert error.message == "output 'y' is a scalar which is not supported."


class _Scalar(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum()


def test_every_datatype_round_trips(repo):
    names = ["TYPE_BOOL", "TYPE_UINT8", "TYPE_INT8", "TYPE_INT16", "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32", "TYPE_FP64"]
    inputs = [tm.tensor(f"INPUT__{i}", t, [3]) for i, t in enumerate(names)]
    outputs = [tm.tensor(f"OUTPUT__{i}", t, [3]) for i, t in enumerate(names)]
    tm.write_model(repo, "casts", tm.config("casts", inputs, outputs, max_batch_size=2), lambda p: tm.save_script(tm.Casts(), p))
    dtypes = [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64]
    feeds = {f"INPUT__{i}": (np.array([[1, 0, 1]]) if d is np.bool_ else np.array([[1, 2, 3]])).astype(d) for i, d in enumerate(dtypes)}
    out = ok(instance(repo, "casts").execute([request("casts", feeds)])[0])
    reference = torch.jit.load(str(repo / "casts" / "1" / "model.pt"))(*(torch.from_numpy(feeds[f"INPUT__{i}"]) for i in range(9)))
    for i, expected in enumerate(reference):
        assert out[f"OUTPUT__{i}"].dtype == dtypes[i]
        np.testing.assert_array_equal(out[f"OUTPUT__{i}"], expected.numpy())


def test_requested_outputs_only(repo):
    add_sub_model(repo, "m", ["INPUT__0", "INPUT__1"], ["OUTPUT__0", "OUTPUT__1"])
    one = np.ones((1, 4), np.float32)
    out = ok(instance(repo, "m").execute([request("m", {"INPUT__0": one, "INPUT__1": one}, outputs=["OUTPUT__1"])])[0])
    assert list(out) == ["OUTPUT__1"]


# -- failures: the model's forward, its file ----------------------------------------------------


def test_a_forward_that_raises_fails_its_batch_and_the_instance_keeps_serving(repo):
    tm.write_model(repo, "r", tm.config("r", [tm.tensor("x", F32, [4])], [tm.tensor("y", F32, [4])], max_batch_size=4),
                   lambda p: tm.save_script(tm.Raises(), p))
    run = instance(repo, "r")
    big, small = np.full((1, 4), 1000, np.float32), np.ones((1, 4), np.float32)
    errors = run.execute([request("r", {"x": big}), request("r", {"x": small})])
    for error in errors:
        assert isinstance(error, InferenceError) and error.code == ErrorCode.INTERNAL
        assert error.message.startswith("PyTorch execute failure: The following operation failed in the TorchScript interpreter.")
        assert "input too large for this model" in error.message
    np.testing.assert_array_equal(ok(run.execute([request("r", {"x": small})])[0])["y"], small * 3)


def test_files_that_are_not_torchscript_are_refused_at_compile_time_and_load_time(repo):
    config = tm.config("m", [tm.tensor("x", F32, [4])], [tm.tensor("y", F32, [4])])
    directory = tm.write_model(repo, "m", config)
    (directory / "1" / "model.pt").write_bytes(b"definitely not a zip archive")
    error = failure(repo, "m")
    assert error.message.startswith("failed to load model 'm': model.pt is not a TorchScript archive")
    assert "torch.jit.script(model).save(path)" in error.detail and error.file.endswith("model.pt")

    torch.save({"weight": torch.zeros(2)}, directory / "1" / "model.pt")  # a state_dict, not TorchScript
    assert failure(repo, "m").message == (
        "failed to load model 'm': model.pt is a zip file without the TorchScript records (constants.pkl missing)"
    )
    spec = spec_of_unchecked(repo, "m")
    with pytest.raises(ModelLoadError, match="^failed to load model 'm': PytorchStreamReader failed locating file constants.pkl"):
        backend_module("pytorch").create_instance(spec, 1, InstanceSlot("m_0", "KIND_CPU", 0))


def spec_of_unchecked(repo: Path, name: str):
    """A runtime spec for `name` as the manifest would carry it, without the compile checks."""
    from handlers.manifest import ModelSpec

    return ModelSpec(name, repo / name, (1,), {1: repo / name / "1" / "model.pt"},
                     {"name": name, "platform": "pytorch_libtorch", "backend": "pytorch", "max_batch_size": 0,
                      "input": [{"name": "x", "data_type": F32, "dims": [4]}],
                      "output": [{"name": "y", "data_type": F32, "dims": [4]}]})


def test_missing_file_and_default_model_filename(repo):
    config = tm.config("m", [tm.tensor("x", F32, [4])], [tm.tensor("y", F32, [4])])
    tm.write_model(repo, "m", config)
    assert failure(repo, "m").message == f"unable to find '{repo / 'm' / '1' / 'model.pt'}' for model instance 'm'"
    tm.write_model(repo, "named", config.replace('name: "m"', 'name: "named"') + 'default_model_filename: "traced.pt"\n',
                   lambda p: tm.save_script(tm.Raises(), p), filename="traced.pt")
    assert compiled(repo, "named").model_files == {1: "1/traced.pt"}
    out = ok(instance(repo, "named").execute([request("named", {"x": np.ones(4, np.float32)})])[0])
    np.testing.assert_array_equal(out["y"], np.full(4, 3, np.float32))


def test_without_torch_the_config_and_archive_are_checked_and_the_forward_is_left_to_the_image(repo, monkeypatch):
    add_sub_model(repo, "m", ["INPUT__0", "INPUT__1"], ["OUTPUT__0"])
    add_sub_model(repo, "u16", ["INPUT__0", "INPUT__1"], ["OUTPUT__0"])
    (repo / "u16" / "config.pbtxt").write_text((repo / "u16" / "config.pbtxt").read_text().replace("TYPE_FP32", "TYPE_UINT32", 1))
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    result = compile_repository(repo)
    assert any("torch is not installed here" in w for w in result.models["m"].warnings)
    assert result.failures["u16"].message == "unsupported datatype TYPE_UINT32 for input 'INPUT__0' for model 'u16'"


# -- instances: devices, weight sharing -----------------------------------------------------------


def test_kind_gpu_instances_need_cuda_and_kind_model_loads_where_the_model_says(repo, monkeypatch):
    add_sub_model(repo, "m", ["INPUT__0", "INPUT__1"], ["OUTPUT__0"])
    if not torch.cuda.is_available():
        with pytest.raises(ModelLoadError, match=r"has a KIND_GPU instance group but torch .* sees no CUDA device"):
            instance(repo, "m", InstanceSlot("m_0", "KIND_GPU", 0))
        # As far as a CPU build goes: a KIND_GPU instance on device 1 loads with map_location cuda:1
        # (which a CPU build of torch cannot do), and a device beyond the GPUs is refused.
        with monkeypatch.context() as patched:
            patched.setattr(torch.cuda, "is_available", lambda: True)
            patched.setattr(torch.cuda, "device_count", lambda: 2)
            assert placement(torch, "KIND_GPU", 1, "m") == torch.device("cuda", 1)
            with pytest.raises(ModelLoadError, match="asks for GPU 2, but torch sees 2 CUDA device"):
                placement(torch, "KIND_GPU", 2, "m")
            tm.write_model(repo, "weights", tm.config("weights", [tm.tensor("x", F32, [16])], [tm.tensor("y", F32, [4])]),
                           lambda p: tm.save_trace(tm.Linear(), torch.zeros(1, 16), p))
            with pytest.raises(ModelLoadError, match="^failed to load model 'weights': .*CUDA"):
                instance(repo, "weights", InstanceSlot("weights_0", "KIND_GPU", 1))
            gpu = instance(repo, "m", InstanceSlot("m_0", "KIND_GPU", 1))  # no weights: nothing to move at load
            assert gpu.device == torch.device("cuda", 1)
            one = np.ones((1, 4), np.float32)
            error = gpu.execute([request("m", {"INPUT__0": one, "INPUT__1": one})])[0]
            assert error.code == ErrorCode.INTERNAL and "CUDA" in error.message  # the inputs went to cuda:1
    else:
        assert placement(torch, "KIND_GPU", 0, "m") == torch.device("cuda", 0)
    assert placement(torch, "KIND_CPU", 0, "m") == torch.device("cpu")
    run = instance(repo, "m", InstanceSlot("m_0", "KIND_MODEL", 0))
    assert run.device is None
    one = np.ones((1, 4), np.float32)
    np.testing.assert_array_equal(ok(run.execute([request("m", {"INPUT__0": one, "INPUT__1": one})])[0])["OUTPUT__0"], one * 2)


def test_weight_sharing_shares_one_module_among_a_versions_instances(repo):
    add_sub_model(repo, "shared", ["INPUT__0", "INPUT__1"], ["OUTPUT__0"],
                  extra='parameters { key: "ENABLE_WEIGHT_SHARING" value { string_value: "true" } }\n')
    add_sub_model(repo, "own", ["INPUT__0", "INPUT__1"], ["OUTPUT__0"])
    a, b = instance(repo, "shared", InstanceSlot("shared_0", "KIND_CPU", 0)), instance(repo, "shared", InstanceSlot("shared_1", "KIND_CPU", 0))
    assert a.module is b.module
    c, d = instance(repo, "own", InstanceSlot("own_0", "KIND_CPU", 0)), instance(repo, "own", InstanceSlot("own_1", "KIND_CPU", 0))
    assert c.module is not d.module


class _Flagged(torch.nn.Module):
    """Sets flags[0] when forward starts, computes on x for a while, uses x for the last time,
    then sets flags[1]."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("flags", torch.zeros(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.flags[0] = 1.0
        y = torch.ones(128, 128)
        for _ in range(400):
            y = torch.tanh(y @ y) + x.sum()
        z = y.sum() + x  # x's last use: the interpreter drops its reference to it here
        self.flags[1] = 1.0
        return z


def test_forward_does_not_wait_for_the_gil_when_it_drops_its_input(repo):
    """The interpreter drops its reference to an input at the input's last use, mid-forward. For a
    tensor Python made (torch.from_numpy) that would be the last C++ reference but the PyObject's,
    and c10 would take the GIL there to decref the PyObject (TensorImpl::decref_pyobject): forward
    would stall whenever Python code (the event loop, another instance) holds the GIL. The instance
    holds a C++ reference to its inputs until forward returns, so forward runs to its end while
    this thread holds the GIL: flags[1] turns 1 while it spins without letting the GIL go."""
    tm.write_model(repo, "flagged", tm.config("flagged", [tm.tensor("INPUT__0", F32, [4])], [tm.tensor("OUTPUT__0", F32, [4])]),
                   lambda p: tm.save_script(_Flagged(), p))
    model = instance(repo, "flagged")
    flags = model.module.flags.numpy()  # the buffer's memory, read without the GIL ever being released
    x = np.zeros(4, np.float32)
    outcomes: list = []
    worker = threading.Thread(target=lambda: outcomes.extend(model.execute([request("flagged", {"INPUT__0": x})])))
    switch = sys.getswitchinterval()
    done = False
    worker.start()
    try:
        while flags[0] == 0:  # forward has not started: let the worker have the GIL
            threading.Event().wait(0.001)
        sys.setswitchinterval(60.0)  # this thread keeps the GIL while it spins, for up to 20 s
        deadline = time.perf_counter() + 20.0
        while not done and time.perf_counter() < deadline:
            done = flags[1] == 1.0
    finally:
        sys.setswitchinterval(switch)
        worker.join(WAIT)
    assert done, "forward stopped for the GIL after its input's last use"
    assert ok(outcomes[0])["OUTPUT__0"].shape == (4,)


# -- batching: the real DynamicBatcher with real instances, gated ---------------------------------


class Gated:
    """A real PyTorchInstance behind a gate: reports each batch it starts, runs it when released."""

    def __init__(self, inner: PyTorchInstance, events: queue.Queue) -> None:
        self.inner, self.name, self.events = inner, inner.name, events
        self.gate = threading.Semaphore(0)

    def execute(self, requests):
        self.events.put((self.name, [r.id for r in requests]))
        assert self.gate.acquire(timeout=WAIT), "the test never released this batch"
        return self.inner.execute(requests)


def test_dynamic_batching_over_two_instances_with_a_gate(repo):
    """Traced model, max_batch_size 8, two instances. While both instances hold a gated batch,
    five more requests queue; released, they run as one batch of their summed sizes, and every
    output equals torch's own output for that request."""
    tm.write_model(repo, "linear", tm.config("linear", [tm.tensor("x", F32, [16])], [tm.tensor("y", F32, [4])], max_batch_size=8,
                                              extra="dynamic_batching { }\ninstance_group [ { count: 2 kind: KIND_CPU } ]\n"),
                   lambda p: tm.save_trace(tm.Linear(), torch.zeros(1, 16), p))
    spec = spec_of(repo, "linear")
    events: queue.Queue = queue.Queue()
    instances = [Gated(backend_module("pytorch").create_instance(spec, 1, InstanceSlot(f"linear_0_{i}", "KIND_CPU", 0)), events)
                 for i in range(2)]
    batcher = DynamicBatcher("linear", spec.config, instances)
    batcher.start()
    reference = torch.jit.load(str(repo / "linear" / "1" / "model.pt"))
    rng = np.random.default_rng(0)
    sizes = {"a": 2, "b": 1, "c": 1, "d": 3, "e": 2, "f": 1, "g": 1}
    feeds = {n: rng.standard_normal((s, 16)).astype(np.float32) for n, s in sizes.items()}
    results: dict[str, object] = {}
    done = threading.Event()

    def callback(name):
        def record(outcome):
            results[name] = outcome
            if len(results) == len(sizes):
                done.set()
        return record

    try:
        for name in ("a", "b"):
            batcher.submit(request("linear", {"x": feeds[name]}, batch=sizes[name], rid=name), callback(name))
            events.get(timeout=WAIT)  # each instance took one alone
        for name in ("c", "d", "e", "f", "g"):
            batcher.submit(request("linear", {"x": feeds[name]}, batch=sizes[name], rid=name), callback(name))
        for gated in instances:
            gated.gate.release()
        instance_name, batch = events.get(timeout=WAIT)
        assert batch == ["c", "d", "e", "f", "g"]  # 1 + 3 + 2 + 1 + 1 = 8: one batch
        for gated in instances:
            gated.gate.release(5)
        assert done.wait(WAIT)
        for name, outcome in results.items():
            expected = reference(torch.from_numpy(feeds[name])).detach().numpy()
            np.testing.assert_allclose(ok(outcome)["y"], expected, rtol=1e-5, atol=1e-6)
    finally:
        for gated in instances:
            gated.gate.release(100)
        batcher.stop(drain=False, timeout=WAIT)


def test_an_optional_input_missing_from_a_request_is_refused(repo):
    """The forward needs every argument: tritonserver would call it with fewer; refused here."""
    add_sub_model(repo, "m", ["INPUT__0", "INPUT__1"], ["OUTPUT__0"])
    config = repo / "m" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "INPUT__1" data_type: TYPE_FP32 dims: [ 4 ]', 'name: "INPUT__1" data_type: TYPE_FP32 dims: [ 4 ] optional: true'))
    error = instance(repo, "m").execute([request("m", {"INPUT__0": np.ones((1, 4), np.float32)})])[0]
    assert isinstance(error, InferenceError) and error.code == ErrorCode.INVALID_ARG
    assert error.message == "model 'm': input 'INPUT__1' is optional in the config, but the TorchScript forward needs every argument"


# -- the C allocator ------------------------------------------------------------------------------

_FAULTS = """
import resource, sys, threading, torch
from handlers.backends.pytorch import settings
print(settings.keep_freed_memory() if sys.argv[1] == "keep" else None)
torch.set_num_threads(1)
net = torch.nn.Sequential(torch.nn.Conv2d(1, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 32, 3, padding=1))
x = torch.randn(8, 1, 32, 100)
faults = []
def work():  # a batcher worker: a thread of its own, so glibc gives it its own heap
    with torch.inference_mode():
        for _ in range(5):
            net(x)
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        for _ in range(20):
            net(x)
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
thread = threading.Thread(target=work)
thread.start()
thread.join()
print(faults[0])
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc: Linux only")
@pytest.mark.parametrize("environ", [{}, {"MALLOC_TRIM_THRESHOLD_": "131072"}])
def test_cpu_forwards_stop_faulting_their_buffers_back_in(environ):
    """A forward of a few MB of activations, in a worker thread: with glibc's defaults the heap's
    freed top goes back to the kernel and every forward page-faults it in again; once an instance
    has set the allocator (settings.keep_freed_memory), the buffers are reused without a fault.
    A user's own MALLOC_* choice is left alone."""
    import os
    import platform
    import subprocess

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc's malloc only")
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", "LD_PRELOAD")}

    def faults(mode: str) -> tuple[str, int]:
        out = subprocess.run([sys.executable, "-c", _FAULTS, mode], cwd=root, env={**env, **environ},
                             capture_output=True, text=True, timeout=120, check=True).stdout.split()
        return out[0], int(out[1])

    applied, kept = faults("keep")
    _, default = faults("default")
    if environ:
        assert applied == "False" and kept > 1000  # left as the user set it
    else:
        assert applied == "True" and kept < 100 and default > 10 * max(kept, 100)
