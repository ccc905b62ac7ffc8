"""Repository validation rule by rule, on small fixture repositories.

Messages are tritonserver 2.51's (tests/test_validation_oracle.py checks the same rules, and
more, against the real server); these tests pin down the toolkit's side: which stage reports a
problem, the file and line it points at, the details it adds, and the rules where the toolkit
deliberately does better than tritonserver (docs/triton-compatibility.md).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import model_builders as mb
import pytest

from toolkit.repository.compile import compile_repository
from toolkit.repository.discover import is_version_directory_name, parse_version_directory
from toolkit.repository.errors import ModelError

MODEL_PY = textwrap.dedent(
    """
    class TritonPythonModel:
        def execute(self, requests):
            return []
    """
)
IO = """
input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""


def python_model(repo: Path, name: str, body: str = "", *, versions=("1",), io: str = IO, header: str | None = None) -> Path:
    """A python-backend model: config.pbtxt and <version>/model.py."""
    directory = repo / name
    directory.mkdir(parents=True, exist_ok=True)
    if header is None:
        header = f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
    (directory / "config.pbtxt").write_text(header + textwrap.dedent(io) + textwrap.dedent(body))
    for v in versions:
        (directory / v).mkdir(exist_ok=True)
        (directory / v / "model.py").write_text(MODEL_PY)
    return directory


def failure(repo: Path, name: str, **kw) -> ModelError:
    result = compile_repository(repo, **kw)
    assert name in result.failures, f"{name} compiled: {result.models.get(name)}"
    return result.failures[name]


def ready(repo: Path, name: str, **kw):
    result = compile_repository(repo, **kw)
    assert name in result.models, result.failures.get(name)
    return result.models[name]


# --- config stage ----------------------------------------------------------------------------------


def test_negative_max_batch_size_points_at_its_line(repo):
    python_model(repo, "m", header='name: "m"\nbackend: "python"\nmax_batch_size: -1\n')
    error = failure(repo, "m")
    assert error.message == "'max_batch_size' must be non-negative value for m"
    assert (error.stage, error.line) == ("config", 3)
    assert error.file == str(repo / "m" / "config.pbtxt")


def test_parse_error_names_file_line_and_column_with_tritons_message(repo):
    python_model(repo, "m", io='input [ { name: "IN" data_type: TYPE_FP32 dimz: [ 4 ] } ]\n')
    error = failure(repo, "m")
    config = (repo / "m" / "config.pbtxt").absolute()
    assert error.message == f"failed to read text proto from {config}"
    assert 'no field named "dimz"' in error.detail
    assert (error.line, error.column, error.stage) == (4, 43, "config")
    assert str(error).startswith(f"{repo / 'm' / 'config.pbtxt'}:4:43: failed to read text proto")


def test_missing_config_with_and_without_auto_complete(repo):
    mb.add_sub(repo / "onnx_no_config" / "1" / "model.onnx")
    (repo / "py_no_config" / "1").mkdir(parents=True)
    (repo / "py_no_config" / "1" / "model.py").write_text(MODEL_PY)

    strict = compile_repository(repo, auto_complete=False)
    for name in ("onnx_no_config", "py_no_config"):
        error = strict.failures[name]
        path = (repo / name / "config.pbtxt").absolute()
        assert error.message == f"failed to open text file for read {path}: No such file or directory"
        assert error.stage == "config" and "--disable-auto-complete-config" in error.detail

    auto = compile_repository(repo)
    assert auto.models["onnx_no_config"].config["backend"] == "onnxruntime"
    # As in tritonserver: a python model without auto_complete_config keeps its (empty) config.
    python = auto.models["py_no_config"].config
    assert (python["backend"], python["input"], python["output"]) == ("python", [], [])


def test_python_model_with_complete_config_passes_in_both_modes(repo):
    python_model(repo, "m", "dynamic_batching { }\n")
    for auto_complete in (True, False):
        model = ready(repo, "m", auto_complete=auto_complete)
        assert model.backend == "python" and model.model_files == {1: "1/model.py"}
        assert model.config["instance_group"] == [
            {"name": "m", "kind": "KIND_CPU", "count": 1, "gpus": [], "secondary_devices": [], "profile": [],
             "passive": False, "host_policy": ""}
        ]


AUTO_COMPLETE_PY = """
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.set_max_batch_size(4)
        config.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [3]})
        config.add_output({"name": "Y", "data_type": "TYPE_FP32", "dims": [3]})
        return config

    def execute(self, requests):
        return []
"""


def test_python_auto_complete_config_runs_when_auto_complete_is_enabled(repo):
    (repo / "m" / "1").mkdir(parents=True)
    (repo / "m" / "1" / "model.py").write_text(AUTO_COMPLETE_PY)
    config = ready(repo, "m").config
    assert config["max_batch_size"] == 4
    assert [(t["name"], t["dims"]) for t in config["input"]] == [("X", [3])]
    # With auto-complete disabled, tritonserver does not call auto_complete_config either.
    (repo / "m" / "config.pbtxt").write_text('name: "m"\nbackend: "python"\n')
    config = ready(repo, "m", auto_complete=False).config
    assert (config["max_batch_size"], config["input"]) == (0, [])


def test_dims_and_reshape_element_counts(repo):
    python_model(repo, "ok", io='input [ { name: "IN" data_type: TYPE_FP32 dims: [ 2, -1, 6 ] reshape { shape: [ 2, -1, 2, 3 ] } } ]\n')
    python_model(repo, "count", io='input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 3 ] } } ]\n')
    python_model(repo, "zero", io='input [ { name: "IN" data_type: TYPE_FP32 dims: [ 0 ] } ]\n')
    result = compile_repository(repo, auto_complete=False)
    assert "ok" in result.models
    assert result.failures["count"].message == "model input 'IN' has different size for dims and reshape for count"
    assert result.failures["zero"].message == (
        "model input 'IN' dimension must be integer >= 1, or -1 to indicate a variable-size dimension for zero"
    )
    # auto-complete enabled: the same checks run when the model loads (as in tritonserver)
    assert compile_repository(repo).failures["count"].stage == "load"


@pytest.mark.parametrize(
    "body, message",
    [
        ("dynamic_batching { preferred_batch_size: [ 0 ] }", "dynamic batching preferred size must be positive for m"),
        ("dynamic_batching { preferred_batch_size: [ 9 ] }", "dynamic batching preferred size must be <= max batch size for m"),
        ("dynamic_batching { priority_levels: 2 }", "default priority level must be in range [1, 2] for m"),
        (
            "dynamic_batching { priority_levels: 2 default_priority_level: 1 priority_queue_policy { key: 3 value { } } }",
            "priority queue policy must have priority level in range [1, 2] for m",
        ),
        (
            "dynamic_batching { preserve_ordering: true priority_levels: 2 default_priority_level: 2 }",
            "Only one priority level is allowed when 'preserve_ordering' is true for m",
        ),
        (
            "dynamic_batching { preserve_ordering: true default_queue_policy { timeout_action: DELAY default_timeout_microseconds: 1 } }",
            "Queue policy can not have DELAY as timeout action when 'preserve_ordering' is true for m",
        ),
    ],
)
def test_dynamic_batching_rules(repo, body, message):
    python_model(repo, "m", body)
    error = failure(repo, "m")
    assert (error.message, error.stage) == (message, "config")
    assert error.line is not None and error.line >= 6


def test_default_preferred_batch_size_and_queue_policy_pass(repo):
    python_model(repo, "m", "dynamic_batching { default_queue_policy { timeout_action: REJECT max_queue_size: 3 } }")
    config = ready(repo, "m").config
    assert config["dynamic_batching"]["preferred_batch_size"] == [8]
    assert config["dynamic_batching"]["default_queue_policy"]["max_queue_size"] == 3


def test_sequence_batching_controls_are_checked_before_refusing_the_model(repo):
    python_model(repo, "bad", 'sequence_batching { control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ] }')
    python_model(repo, "good", 'sequence_batching { control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ] }')
    python_model(repo, "stateful", 'sequence_batching { control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ] '
                 'state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ] }')
    result = compile_repository(repo)
    assert result.failures["bad"].message.startswith("unexpected data type for control CONTROL_SEQUENCE_CORRID for bad")
    assert not result.failures["bad"].unsupported
    assert "good" in result.models  # a python model's sequence batcher is served
    assert result.failures["stateful"].unsupported and "implicit state" in result.failures["stateful"].message


@pytest.mark.parametrize(
    "header, unsupported",
    [
        ('name: "m"\nbackend: "tensorrt"\n', "backend 'tensorrt' (platform 'tensorrt_plan')"),
        ('name: "m"\nplatform: "tensorrt_plan"\n', "export the source model to ONNX"),
        ('name: "m"\nbackend: "vllm"\n', "backend 'vllm'"),
        ('name: "m"\nbackend: "vllm"\n', "vllm serve"),
        ('name: "m"\nbackend: "tensorrtllm"\n', "deploy them with Triton on a GPU service"),
        ('name: "m"\nbackend: "dali"\n', "backend 'dali'"),
        ('name: "m"\nbackend: "dali"\n', "in front of the model, in an ensemble"),
        ('name: "m"\nplatform: "tensorflow_savedmodel"\n', "backend 'tensorflow'"),
        ('name: "m"\nplatform: "tensorflow_graphdef"\n', "convert the model to ONNX (tf2onnx)"),
    ],
)
def test_configs_this_product_cannot_serve(repo, header, unsupported):
    python_model(repo, "m", header=header)
    error = failure(repo, "m")
    assert error.unsupported and unsupported in error.message


def test_unsupported_still_reports_tritons_errors_first(repo):
    python_model(repo, "m", "instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]", header='name: "m"\nbackend: "tensorrt"\n')
    error = failure(repo, "m")
    assert not error.unsupported
    assert error.message == "instance group m_0 of model m has kind KIND_CPU but specifies one or more GPUs"


def test_config_name_must_equal_directory_name(repo):
    python_model(repo, "dir_name", header='name: "other"\nbackend: "python"\n')
    error = failure(repo, "dir_name")
    assert error.message == (
        "unexpected directory name 'dir_name' for model 'other', directory name must equal model name"
    )
    assert error.line == 1


def test_duplicate_tensor_names_pass_with_a_warning(repo):
    python_model(repo, "m", io='input [ { name: "X" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "X" data_type: TYPE_FP32 dims: [ 2 ] } ]\n')
    model = ready(repo, "m")
    assert any("declares input 'X' more than once" in w for w in model.warnings)


# --- labels ----------------------------------------------------------------------------------------


def test_label_files_are_relative_to_the_model_directory(repo):
    io = 'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]\noutput [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "labels.txt" } ]\n'
    d = python_model(repo, "m", io=io)
    (d / "1" / "labels.txt").write_text("a\n")
    error = failure(repo, "m")
    assert error.message == f"failed to open text file for read {d.absolute() / 'labels.txt'}: No such file or directory"
    assert (error.stage, error.code, error.line) == ("load", "Internal", 5)
    (d / "labels.txt").write_text("a\nb\nc\nd\n")
    ready(repo, "m")


# --- versions --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, version",
    [("1", 1), ("0", 0), ("10", 10), ("01", None), ("007", None), ("2a", 2), ("+3", 3), (" 4", 4), ("v2", None), ("abc", None), ("-1", -1)],
)
def test_version_directory_names_follow_stoll(name, version):
    assert parse_version_directory(name) == version
    assert is_version_directory_name(name) == (version is not None and str(version) == name)


def test_version_policies(repo):
    python_model(repo, "latest", versions=("1", "2", "10"))
    python_model(repo, "latest2", "version_policy { latest { num_versions: 2 } }", versions=("1", "2", "10"))
    python_model(repo, "all", "version_policy { all { } }", versions=("1", "3"))
    python_model(repo, "specific", "version_policy { specific { versions: [ 1, 4 ] } }", versions=("1", "2"))
    python_model(repo, "none", "version_policy { latest { num_versions: 0 } }")
    python_model(repo, "empty", versions=())
    result = compile_repository(repo)
    assert result.models["latest"].versions == [10]
    assert result.models["latest2"].versions == [2, 10]
    assert result.models["all"].versions == [1, 3]
    assert result.models["specific"].versions == [1]
    assert result.models["specific"].warnings == [
        "version 4 is specified for model 'specific', but the version directory is not present"
    ]
    for name in ("none", "empty"):
        error = result.failures[name]
        assert error.message == f"at least one version must be available under the version policy of model '{name}'"
        assert error.stage == "load"


def test_ignored_version_directories_are_warnings(repo):
    d = python_model(repo, "m", "version_policy { all { } }", versions=("1", "0", "02", "v3"))
    (d / "warmup").mkdir()
    model = ready(repo, "m")
    assert model.versions == [0, 1]
    assert model.warnings == [
        "ignore version directory '02' which contains leading zeros in its directory name",
        "ignore version directory 'v3' which fails to convert to integral number",
    ]


def test_a_numeric_prefix_names_the_version_tritonserver_loads(repo):
    """'2a' is version 2 for tritonserver, which then loads it from the directory '2'."""
    d = python_model(repo, "m", versions=("1",))
    (d / "2a").mkdir()
    (d / "2a" / "model.py").write_text(MODEL_PY)
    error = failure(repo, "m")
    assert error.message == f"Python model file not found in '{d / '2' / 'model.py'}'"


@pytest.mark.parametrize("directory, message", [
    ("99999999999999999999", "out of the range of a 64-bit version number"),
    ("-1", "gives the negative version -1"),
])
def test_version_directories_that_break_tritonserver_are_refused(repo, directory, message):
    d = python_model(repo, "m", versions=(directory,))
    error = failure(repo, "m")
    assert message in error.message and error.file == str(d / directory)


def test_default_model_filename(repo):
    d = python_model(repo, "m", 'default_model_filename: "net.py"', versions=())
    (d / "1").mkdir()
    (d / "1" / "net.py").write_text(MODEL_PY)
    assert ready(repo, "m").model_files == {1: "1/net.py"}
    mb.add_sub(repo / "o" / "3" / "weights.onnx")
    (repo / "o" / "config.pbtxt").write_text('name: "o"\nbackend: "onnxruntime"\ndefault_model_filename: "weights.onnx"\n')
    assert ready(repo, "o").model_files == {3: "3/weights.onnx"}
    (repo / "o" / "config.pbtxt").write_text('name: "o"\nbackend: "onnxruntime"\n')
    assert failure(repo, "o").message == f"unable to find '{repo / 'o' / '3' / 'model.onnx'}' for model instance 'o'"


# --- instance groups -------------------------------------------------------------------------------


def test_instance_defaults_follow_the_backend_and_the_target_device(repo):
    mb.add_sub(repo / "onnx" / "1" / "model.onnx")
    python_model(repo, "py")
    cpu = compile_repository(repo, device="cpu")
    assert [(g["kind"], g["count"]) for g in cpu.models["onnx"].config["instance_group"]] == [("KIND_CPU", 2)]
    assert [(g["kind"], g["count"]) for g in cpu.models["py"].config["instance_group"]] == [("KIND_CPU", 1)]
    gpu = compile_repository(repo, device="gpu:2")
    # onnxruntime prefers GPU instances when the target has GPUs; python declares no preference.
    assert [(g["kind"], g["count"], g["gpus"]) for g in gpu.models["onnx"].config["instance_group"]] == [
        ("KIND_GPU", 1, [0, 1])
    ]
    assert [(g["kind"], g["count"]) for g in gpu.models["py"].config["instance_group"]] == [("KIND_GPU", 1)]


def test_kind_auto_is_resolved_for_the_target(repo):
    python_model(repo, "m", "instance_group [ { count: 3 } ]")
    assert ready(repo, "m", device="cpu").config["instance_group"][0]["kind"] == "KIND_CPU"
    assert ready(repo, "m", device="gpu").config["instance_group"][0]["kind"] == "KIND_GPU"
    python_model(repo, "m", "instance_group [ { kind: KIND_AUTO gpus: [ 1 ] } ]")
    error = failure(repo, "m", device="gpu")  # GPU 1 does not exist on a 1-GPU target: KIND_CPU
    assert error.message == "instance group m_0 of model m has kind KIND_CPU but specifies one or more GPUs"


def test_kind_gpu_on_a_cpu_target_runs_on_the_cpu_with_a_warning(repo):
    python_model(repo, "m", 'instance_group [ { name: "g" count: 2 kind: KIND_GPU gpus: [ 0, 1 ] } ]')
    model = ready(repo, "m", device="cpu")
    assert [(g["kind"], g["count"], g["gpus"]) for g in model.config["instance_group"]] == [("KIND_CPU", 4, [])]
    assert model.warnings == [
        "instance group g of model m has kind KIND_GPU but the target device is cpu: mapped to KIND_CPU with count 4"
    ]
    error = failure(repo, "m", device="gpu")
    assert error.message == (
        "instance group g of model m specifies invalid or unsupported gpu id 1. GPUs with at least the minimum "
        "required CUDA compute compatibility of 6.000000 are: 0"
    )
    assert ready(repo, "m", device="gpu:2").config["instance_group"][0]["gpus"] == [0, 1]


@pytest.mark.parametrize(
    "group, message",
    [
        ("{ kind: KIND_CPU gpus: [ 0 ] }", "instance group m_0 of model m has kind KIND_CPU but specifies one or more GPUs"),
        ("{ kind: KIND_MODEL gpus: [ 0 ] }", "instance group m_0 of model m has kind KIND_MODEL but specifies one or more GPUs"),
        ('{ kind: KIND_CPU profile: [ "0" ] }', "instance group m_0 of model m and platform specifies profile field which is only supported for TensorRT models"),
    ],
)
def test_instance_group_rules(repo, group, message):
    d = python_model(repo, "m", f"instance_group [ {group} ]")
    error = failure(repo, "m")
    assert (error.message, error.stage) == (message, "load")
    lines = (d / "config.pbtxt").read_text().splitlines()
    assert "instance_group" in lines[error.line - 1]


def test_instance_group_errors_point_at_the_named_group(repo):
    d = python_model(repo, "m", 'instance_group [\n  { kind: KIND_CPU },\n  { name: "second" kind: KIND_GPU gpus: [ 3 ] }\n]\n')
    error = failure(repo, "m", device="gpu")
    assert error.message.startswith("instance group second of model m specifies invalid or unsupported gpu id 3.")
    assert 'name: "second"' in (d / "config.pbtxt").read_text().splitlines()[error.line - 1]


def test_instance_counts_below_one_take_the_default(repo):
    python_model(repo, "m", "instance_group [ { count: 0 }, { count: -2 kind: KIND_CPU } ]")
    groups = ready(repo, "m").config["instance_group"]
    assert [(g["name"], g["count"]) for g in groups] == [("m_0", 1), ("m_1", 1)]


# --- model_warmup ----------------------------------------------------------------------------------

WARMUP_IO = """
input [
  { name: "A" data_type: TYPE_FP32 dims: [ -1, 3 ] },
  { name: "B" data_type: TYPE_INT32 dims: [ 2 ] }
]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
"""
A = 'inputs { key: "A" value: { data_type: TYPE_FP32 dims: [ 2, 3 ] random_data: true } }'
B = 'inputs { key: "B" value: { data_type: TYPE_INT32 dims: [ 2 ] zero_data: true } }'
PREFIX = "[request id: <id_unknown>] "


def warmup_failure(repo, sample: str, io: str = WARMUP_IO, **kw) -> ModelError:
    python_model(repo, "m", f"model_warmup [ {sample} ]\n", io=io, **kw)
    return failure(repo, "m")


def test_warmup_random_data_sample_passes(repo):
    python_model(repo, "m", f'model_warmup [ {{ name: "s" batch_size: 8 {A} {B} }} ]\n', io=WARMUP_IO)
    assert ready(repo, "m").config["model_warmup"][0]["inputs"]["A"]["random_data"] is True


@pytest.mark.parametrize(
    "sample, message",
    [
        (f'{{ name: "s" batch_size: 9 {A} {B} }}', "failed to run warmup sample 's': " + "batch size 9 for 'm_0', max allowed is 8; " * 9),
        ('{ name: "s" batch_size: 1 inputs { key: "A" value: { data_type: TYPE_FP32 dims: [ -1, 3 ] zero_data: true } } }',
         "warmup setting expects all variable-size dimensions are specified for input 'A'"),
        (f'{{ name: "s" batch_size: 1 {A} }}',
         PREFIX + "expected 2 inputs but got 1 inputs for model 'm'. Got input(s) ['A'], but missing required input(s) ['B']. "
         "Please provide all required input(s)."),
        (f'{{ name: "s" batch_size: 1 inputs {{ key: "A" value: {{ data_type: TYPE_FP16 dims: [ 2, 3 ] zero_data: true }} }} {B} }}',
         PREFIX + "inference input 'A' data-type is 'FP16', but model 'm' expects 'FP32'"),
        (f'{{ name: "s" batch_size: 1 inputs {{ key: "A" value: {{ data_type: TYPE_FP32 dims: [ 2, 4 ] zero_data: true }} }} {B} }}',
         PREFIX + "unexpected shape for input 'A' for model 'm'. Expected [-1,-1,3], got [1,2,4]. NOTE: Setting a non-zero "
         "max_batch_size in the model config requires a batch dimension to be prepended to each input shape."),
        (f'{{ name: "s" batch_size: 1 inputs {{ key: "A" value: {{ data_type: TYPE_FP32 dims: [ 2, 3 ] }} }} {B} }}',
         PREFIX + "warmup setting expects input 'A' to have input_data_type set"),
    ],
)
def test_warmup_rules(repo, sample, message):
    error = warmup_failure(repo, sample)
    assert error.message.startswith(message), error.message
    assert error.stage == "load"


def test_warmup_input_data_file(repo):
    sample = '{ name: "s" batch_size: 1 inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "%s" } } }'
    d = python_model(repo, "m", f"model_warmup [ {sample % 'in.bin'} ]\n")
    error = failure(repo, "m")
    assert error.message == f"failed to open text file for read {d.absolute()}/warmup/in.bin: No such file or directory"
    (d / "warmup").mkdir()
    (d / "warmup" / "in.bin").write_bytes(b"\0" * 8)
    assert failure(repo, "m").message == PREFIX + "warmup setting expects 16 bytes, but the data provided from in.binonly has 8 bytes"
    (d / "warmup" / "in.bin").write_bytes(b"\0" * 16)
    ready(repo, "m")
    # an absolute name is joined to warmup/ as tritonserver's JoinPath does
    python_model(repo, "m", f"model_warmup [ {sample % '/in.bin'} ]\n")
    ready(repo, "m")


def test_warmup_input_data_file_must_stay_inside_warmup(repo, tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\0" * 16)
    sample = '{ name: "s" batch_size: 1 inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [ 4 ] input_data_file: "%s" } } }'
    d = python_model(repo, "m", f"model_warmup [ {sample % '../../../secret.bin'} ]\n")
    (d / "warmup").mkdir()
    error = failure(repo, "m")
    assert "outside the model's warmup directory" in error.message and "tritonserver reads any file" in error.detail
    (d / "warmup" / "link.bin").symlink_to(secret)
    python_model(repo, "m", f"model_warmup [ {sample % 'link.bin'} ]\n")
    assert "outside the model's warmup directory" in failure(repo, "m").message


def test_warmup_refuses_what_crashes_tritonserver(repo):
    io = 'input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]\n'
    huge = '{ name: "big" batch_size: 1 inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [ 1099511627776 ] zero_data: true } } }'
    error = warmup_failure(repo, huge, io=io)
    assert error.message.startswith("warmup sample 'big' of model 'm' needs 4398046511104 bytes")
    negative = '{ name: "neg" batch_size: 1 inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [ -4 ] zero_data: true } } }'
    assert "dimensions must be >= 0" in warmup_failure(repo, negative, io=io).message


def test_warmup_extra_inputs_are_a_warning_and_batch_zero_is_skipped(repo):
    extra = 'inputs { key: "EXTRA" value: { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } }'
    python_model(
        repo, "m",
        f'model_warmup [ {{ name: "s" batch_size: 1 {A} {B} {extra} }}, '
        '{ name: "skipped" batch_size: 0 inputs { key: "A" value: { dims: [ -1 ] } } } ]\n',
        io=WARMUP_IO,
    )
    model = ready(repo, "m")
    assert any("gives input 'EXTRA', which is not an input of model 'm'" in w for w in model.warnings)


def test_warmup_batch_error_names_the_first_instance(repo):
    python_model(repo, "m", f'instance_group [ {{ count: 2 kind: KIND_CPU }} ]\nmodel_warmup [ {{ name: "s" batch_size: 9 {A} {B} }} ]\n', io=WARMUP_IO)
    assert "batch size 9 for 'm_0_0', max allowed is 8; " in failure(repo, "m").message


@pytest.mark.parametrize(
    "source, message, line",
    [
        ("class TritonPythonModel:\n    def execute(self, requests)\n        return []\n",
         "SyntaxError: expected ':' (model.py, line 2)", 2),
        ("X = 1\n", "AttributeError: module '1.model' has no attribute 'TritonPythonModel'", None),
    ],
    ids=["syntax-error", "no-class"],
)
def test_python_model_that_cannot_be_imported_is_invalid(tmp_path, source, message, line):
    """tritonserver's python stub fails these at load; validate finds them without running model.py."""
    from toolkit.repository.compile import compile_repository

    repo = tmp_path / "models"
    (repo / "broken" / "1").mkdir(parents=True)
    (repo / "broken" / "1" / "model.py").write_text(source)
    (repo / "broken" / "config.pbtxt").write_text(
        'backend: "python"\ninput [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    result = compile_repository(repo)
    error = result.failures["broken"]
    assert error.message == message
    assert error.file.endswith("broken/1/model.py") and error.line == line


def test_label_file_must_stay_inside_the_model_directory(tmp_path):
    from toolkit.repository.compile import compile_repository
    import model_builders as mb

    repo = tmp_path / "models"
    mb.identity(repo / "m" / "1" / "model.onnx", {"IN": ("FP32", ["N", 4])}, ["OUT"])
    (tmp_path / "outside.txt").write_text("a\nb\nc\nd\n")
    (repo / "m" / "config.pbtxt").write_text(
        'backend: "onnxruntime"\nmax_batch_size: 4\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 4 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "../../outside.txt" } ]\n'
    )
    error = compile_repository(repo).failures["m"]
    assert "outside the model directory" in error.message and error.line == 4
