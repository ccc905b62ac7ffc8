"""The CPU thread budget (handlers/cpu_budget.py): the container's CPUs from cgroups, affinity and
Lambda's memory, divided among every instance; explicit counts win; a real `toolkit serve` run
logs the plan and its ONNX Runtime sessions and Python model processes get those counts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from handlers import cpu_budget
from handlers.backends.onnxruntime import explicit_threads, session_options, thread_counts
from handlers.cpu_budget import CpuCount, PlannedModel, available_cpus, cgroup_quota, plan, thread_environment
from handlers.instance_group import InstanceSlot

from model_builders import matmul_relu
from serving import serve

ROOT = Path(__file__).resolve().parents[1]


def _files(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


V2_MOUNT = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
V1_MOUNTS = (
    "31 23 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec - tmpfs tmpfs ro,mode=755\n"
    "32 31 0:29 {root} /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,cpu,cpuacct\n"
    "33 31 0:30 {root} /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,memory\n"
)


# -- how many CPUs ---------------------------------------------------------------------------------


def test_cgroup_v2_quota_is_the_smallest_along_the_ancestors(tmp_path):
    """Kubernetes: the pod's cpu.max limits, the container's own says max."""
    root = _files(tmp_path, {
        "proc/self/cgroup": "0::/kubepods/pod1/ctr\n",
        "proc/self/mountinfo": V2_MOUNT,
        "sys/fs/cgroup/kubepods/pod1/ctr/cpu.max": "max 100000\n",
        "sys/fs/cgroup/kubepods/pod1/cpu.max": "150000 100000\n",
        "sys/fs/cgroup/kubepods/cpu.max": "800000 100000\n",
    })
    quota, source = cgroup_quota(root)
    assert quota == 1.5 and source == "cgroup v2 cpu.max 150000 100000"
    count = available_cpus(root, environ={}, affinity=4)
    assert count.cpus == 1  # 1.5 CPUs round down: a second thread would wait for quota
    assert "affinity 4" in count.basis and "cpu.max 150000 100000 = 1.5 CPU" in count.basis


def test_cgroup_v2_in_a_cgroup_namespace_reads_the_mount_root(tmp_path):
    """Docker / Cloud Run (cgroupns private): /proc/self/cgroup says `0::/`, the limit is at the root."""
    root = _files(tmp_path, {
        "proc/self/cgroup": "0::/\n",
        "proc/self/mountinfo": V2_MOUNT,
        "sys/fs/cgroup/cpu.max": "200000 100000\n",
    })
    assert available_cpus(root, environ={}, affinity=8).cpus == 2


def test_cgroup_v2_max_means_no_quota(tmp_path):
    root = _files(tmp_path, {
        "proc/self/cgroup": "0::/user.slice\n",
        "proc/self/mountinfo": V2_MOUNT,
        "sys/fs/cgroup/user.slice/cpu.max": "max 100000\n",
        "sys/fs/cgroup/cpu.max": "max\n",
    })
    assert cgroup_quota(root) is None
    count = available_cpus(root, environ={}, affinity=3)
    assert count.cpus == 3 and count.quota is None and count.basis == "affinity 3"


@pytest.mark.parametrize("mount_root, path", [("/", "/docker/abc"), ("/docker/abc", "/docker/abc")])
def test_cgroup_v1_cfs_quota_over_period(tmp_path, mount_root, path):
    """cgroup v1 (the host's view, and a container's, whose mount root is its own cgroup)."""
    folder = "sys/fs/cgroup/cpu,cpuacct" + ("/docker/abc" if mount_root == "/" else "")
    root = _files(tmp_path, {
        "proc/self/cgroup": f"5:memory:{path}\n4:cpu,cpuacct:{path}\n0::/\n",
        "proc/self/mountinfo": V1_MOUNTS.format(root=mount_root),
        f"{folder}/cpu.cfs_quota_us": "300000\n",
        f"{folder}/cpu.cfs_period_us": "100000\n",
    })
    quota, source = cgroup_quota(root)
    assert quota == 3.0 and "cpu.cfs_quota_us 300000 / cpu.cfs_period_us 100000" in source
    assert available_cpus(root, environ={}, affinity=16).cpus == 3
    assert available_cpus(root, environ={}, affinity=2).cpus == 2  # affinity is smaller


def test_cgroup_v1_without_quota(tmp_path):
    root = _files(tmp_path, {
        "proc/self/cgroup": "4:cpu,cpuacct:/\n",
        "proc/self/mountinfo": V1_MOUNTS.format(root="/"),
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    })
    assert cgroup_quota(root) is None


def test_a_fraction_of_a_cpu_is_one_thread(tmp_path):
    """Cloud Run --cpu 0.5."""
    root = _files(tmp_path, {"proc/self/cgroup": "0::/\n", "proc/self/mountinfo": V2_MOUNT,
                             "sys/fs/cgroup/cpu.max": "50000 100000\n"})
    assert available_cpus(root, environ={}, affinity=2).cpus == 1


def test_this_machines_own_cgroup_files_parse():
    count = available_cpus()
    assert 1 <= count.cpus <= len(os.sched_getaffinity(0))


def test_affinity_limits_the_cpus_of_a_real_process():
    """A process pinned to one CPU (as `taskset -c 0` or a cpuset does) sees one CPU."""
    cpu = min(os.sched_getaffinity(0))
    code = (f"import os; os.sched_setaffinity(0, {{{cpu}}}); from handlers.cpu_budget import available_cpus; "
            "c = available_cpus(environ={}); print(c.cpus, c.affinity)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "1"]


@pytest.mark.parametrize("memory, cpus", [("128", 1), ("1769", 1), ("3008", 1), ("3538", 2), ("10240", 5)])
def test_aws_lambda_vcpus_scale_with_memory(tmp_path, memory, cpus):
    """Lambda shows more CPUs than its memory pays for: 1,769 MB is one vCPU."""
    count = available_cpus(tmp_path, environ={"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": memory}, affinity=6)
    assert count.cpus == cpus
    assert f"AWS Lambda memory = {int(memory) / 1769:.2f} vCPU" in count.basis


def test_toolkit_cpus_overrides_and_is_checked(tmp_path):
    assert available_cpus(tmp_path, environ={"TOOLKIT_CPUS": "6"}, affinity=2).cpus == 6
    with pytest.raises(ValueError, match="TOOLKIT_CPUS must be a whole number of CPUs, got 'two'"):
        available_cpus(tmp_path, environ={"TOOLKIT_CPUS": "two"})
    with pytest.raises(ValueError, match="at least 1"):
        available_cpus(tmp_path, environ={"TOOLKIT_CPUS": "0"})


# -- the division ----------------------------------------------------------------------------------


def _onnx(name: str, count: int, kind: str = "KIND_CPU", **parameters: str) -> PlannedModel:
    config = {"backend": "onnxruntime", "instance_group": [{"name": name, "kind": kind, "count": count,
                                                            **({"gpus": [0]} if kind == "KIND_GPU" else {})}],
              "parameters": {k: {"string_value": v} for k, v in parameters.items()}}
    return PlannedModel(name, config)


def _python(name: str, count: int) -> PlannedModel:
    return PlannedModel(name, {"backend": "python", "instance_group": [{"name": name, "kind": "KIND_CPU",
                                                                         "count": count}]})


def _threads(cpu_plan) -> dict[str, int]:
    return {share.instance: share.threads for share in cpu_plan.shares}


def test_cpus_are_divided_evenly_among_every_instance_of_every_model():
    cpu_plan = plan([_onnx("a", 2), _python("p", 2)], CpuCount(8, 8))
    assert _threads(cpu_plan) == {"a_0": 2, "a_1": 2, "p_0": 2, "p_1": 2}
    assert cpu_plan.planned_threads == 8
    assert cpu_plan.lines() == [
        "CPU budget: 8 CPUs (affinity 8); 4 instances, 8 threads in all",
        "  a: 2 instances x 2 threads (budget)",
        "  p: 2 instances x 2 threads (budget)",
    ]


def test_the_remainder_goes_one_cpu_each_to_the_first_instances():
    cpu_plan = plan([_onnx("b", 2), _onnx("a", 1)], CpuCount(5, 5))
    assert _threads(cpu_plan) == {"a_0": 2, "b_0": 2, "b_1": 1}
    assert cpu_plan.planned_threads == 5


def test_more_instances_than_cpus_get_one_thread_each():
    cpu_plan = plan([_onnx("a", 3), _python("p", 2)], CpuCount(2, 2))
    assert set(_threads(cpu_plan).values()) == {1}
    assert "more instances than CPUs or explicit counts: at least 1 thread each" in cpu_plan.summary()


def test_explicit_thread_counts_win_and_leave_the_rest_to_the_others():
    cpu_plan = plan([_onnx("fixed", 1, intra_op_thread_count="3"), _onnx("free", 2)], CpuCount(8, 8))
    assert _threads(cpu_plan) == {"fixed_0": 3, "free_0": 3, "free_1": 2}
    assert cpu_plan.model_lines()["fixed"] == "1 instance x 3 threads (explicit)"


def test_ort_parallel_mode_counts_intra_times_inter_as_explicit():
    config = {"parameters": {"intra_op_thread_count": {"string_value": "2"},
                             "inter_op_thread_count": {"string_value": "2"},
                             "execution_mode": {"string_value": "1"}}}
    assert explicit_threads(config) == 4
    assert explicit_threads({"parameters": {"intra_op_thread_count": {"string_value": "0"}}}) is None


def test_a_gpu_instance_takes_one_cpu_thread():
    cpu_plan = plan([_onnx("gpu", 2, kind="KIND_GPU"), _python("pre", 1)], CpuCount(4, 4))
    assert _threads(cpu_plan) == {"gpu_0": 1, "gpu_1": 1, "pre_0": 2}
    assert {s.source for s in cpu_plan.shares if s.model == "gpu"} == {"gpu"}


def test_every_loaded_version_counts():
    model = PlannedModel("v", _onnx("v", 1).config, versions=2)
    cpu_plan = plan([model, _onnx("w", 1)], CpuCount(6, 6))
    assert _threads(cpu_plan) == {"v_0": 2, "w_0": 2}
    assert cpu_plan.planned_threads == 6
    assert "for each of 2 versions" in cpu_plan.model_lines()["v"]


def test_ensembles_have_no_instances_and_lambda_gives_each_instance_every_cpu():
    ensemble = PlannedModel("pipeline", {"platform": "ensemble", "ensemble_scheduling": {"step": []}})
    serial = plan([ensemble, _onnx("a", 2), _python("p", 1)], CpuCount(3, 3), serial=True)
    assert _threads(serial) == {"a_0": 3, "a_1": 3, "p_0": 3}
    assert "one request at a time (AWS Lambda)" in serial.summary()
    assert serial.threads_for("a", InstanceSlot("a_1", "KIND_CPU", 0)) == 3
    assert serial.threads_for("nothing", InstanceSlot("a_1", "KIND_CPU", 0)) is None


# -- what a backend does with its share ---------------------------------------------------------------


def _params(**values: str) -> dict:
    return {"parameters": {k: {"string_value": v} for k, v in values.items()}}


def test_onnxruntime_thread_counts_take_the_budget_only_where_the_config_is_silent():
    assert thread_counts({}, 3) == (3, None)  # sequential: no inter-op pool
    assert thread_counts(_params(intra_op_thread_count="1"), 3) == (1, None)
    assert thread_counts(_params(intra_op_thread_count="0"), 3) == (0, None)  # ORT's default, as Triton
    assert thread_counts({}, None) == (None, None)  # no plan: ORT's defaults
    assert thread_counts(_params(execution_mode="1"), 4) == (1, 4)
    assert thread_counts(_params(execution_mode="1", intra_op_thread_count="2"), 4) == (2, 2)
    assert thread_counts(_params(execution_mode="1", inter_op_thread_count="4"), 8) == (2, 4)
    options = session_options(_params(inter_op_thread_count="2"), threads=2)
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (2, 2)


def test_a_model_process_gets_its_share_unless_the_environment_sets_it():
    env = thread_environment(2, environ={"MKL_NUM_THREADS": "8"})
    assert env["OMP_NUM_THREADS"] == "2" and env["OPENBLAS_NUM_THREADS"] == "2"
    assert env["TOOLKIT_CPU_THREADS"] == "2" and "MKL_NUM_THREADS" not in env
    assert thread_environment(None) == {}


# -- a real server --------------------------------------------------------------------------------------

THREADS_MODEL = textwrap.dedent('''
    import json
    import os
    import time

    import numpy as np
    import triton_python_backend_utils as pb_utils


    class TritonPythonModel:
        def execute(self, requests):
            time.sleep(0.05)  # long enough for the batcher to use the other instance too
            names = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TOOLKIT_CPU_THREADS")
            info = json.dumps({name: os.environ.get(name) for name in names} | {"pid": os.getpid()})
            return [pb_utils.InferenceResponse([pb_utils.Tensor("INFO", np.array([info.encode()], dtype=object))])
                    for _ in requests]
''')

ONNX_CONFIG = """
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
instance_group [ {{ count: {count} kind: KIND_CPU }} ]
{extra}
"""


def test_toolkit_serve_logs_the_plan_and_its_sessions_and_processes_get_it(tmp_path):
    """6 CPUs (TOOLKIT_CPUS, so the plan does not depend on this machine): `fixed` keeps its
    explicit 1 thread; the 5 left go to 2 ORT instances of `shared` and 2 Python model processes
    (2 + 1 + 1 + 1). The startup log shows the plan, ORT reports the sessions' own options, and
    each model process sees its share in its environment."""
    import tritonclient.http as httpclient

    repo = tmp_path / "repo"
    for name, count, extra in (("shared", 2, ""),
                               ("fixed", 1, 'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }')):
        matmul_relu(repo / name / "1" / "model.onnx")
        (repo / name / "config.pbtxt").write_text(ONNX_CONFIG.format(count=count, extra=extra))
    (repo / "threads" / "1").mkdir(parents=True)
    (repo / "threads" / "1" / "model.py").write_text(THREADS_MODEL)
    (repo / "threads" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'output [ { name: "INFO" data_type: TYPE_STRING dims: [ 1 ] } ]\n'
        'instance_group [ { count: 2 kind: KIND_CPU } ]\n')
    env = {"TOOLKIT_CPUS": "6", "OMP_NUM_THREADS": "", "OPENBLAS_NUM_THREADS": ""}
    with serve(repo, "--device", "cpu", "--log-level", "info", env=env) as server:
        client = httpclient.InferenceServerClient(server.url, concurrency=8)
        seen = {}
        for _ in range(5):  # concurrent requests: the batcher uses both model processes
            pending = [client.async_infer("threads", []) for _ in range(8)]
            for request in pending:
                info = json.loads(request.get_result().as_numpy("INFO")[0])
                seen[info.pop("pid")] = info
            if len(seen) == 2:
                break
        x = np.ones((1, 16), np.float32)
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "FP32")]
        inputs[0].set_data_from_numpy(x)
        assert client.infer("shared", inputs).as_numpy("OUTPUT0").shape == (1, 16)
        log = server.output()
    assert "CPU budget: 6 CPUs (TOOLKIT_CPUS=6); 5 instances, 6 threads in all" in log
    assert "fixed: 1 instance x 1 thread (explicit)" in log
    assert "shared: 1 instance x 2 threads (budget), 1 instance x 1 thread (budget)" in log
    assert "threads: 2 instances x 1 thread (budget)" in log
    sessions = {instance: int(n) for instance, n in
                re.findall(r"model '\w+' version 1 instance (\w+): ONNX Runtime intra-op threads (\d+)", log)}
    assert sessions == {"shared_0_0": 2, "shared_0_1": 1, "fixed_0_0": 1}  # Triton names: <group>_<i>
    assert list(seen.values()) == [{"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
                                    "TOOLKIT_CPU_THREADS": "1"}] * 2


# -- what toolkit shows -------------------------------------------------------------------------------


def _quickstart_like(root: Path, count: int) -> Path:
    matmul_relu(root / "m" / "1" / "model.onnx")
    (root / "m" / "config.pbtxt").write_text(ONNX_CONFIG.format(count=count, extra=""))
    return root


def test_toolkit_validate_shows_the_plan_for_the_cpus_asked(tmp_path):
    from typer.testing import CliRunner

    from toolkit.cli import app

    repo = _quickstart_like(tmp_path / "repo", 3)
    result = CliRunner().invoke(app, ["validate", str(repo), "--cpus", "4", "--json"])
    assert result.exit_code == 0, result.output
    budget = json.loads(result.stdout)["cpu_budget"]
    assert budget["cpus"] == 4 and budget["basis"] == "--cpus 4"
    assert [i["threads"] for i in budget["instances"]] == [2, 1, 1]
    table = CliRunner().invoke(app, ["validate", str(repo), "--cpus", "1.5"], env={"COLUMNS": "200"})
    assert "2 (budget)" not in table.stdout and "1 (budget)" in table.stdout
    assert "CPU budget: 1 CPU (--cpus 1.5); 3 instances, 3 threads in all (more instances than CPUs" in table.stdout


def test_the_build_report_plans_for_the_targets_cpus(tmp_path):
    """Lambda: the vCPUs its memory buys, one request at a time; Cloud Run: --cpu."""
    from toolkit.deploy.aws_lambda.settings import LambdaOverrides
    from toolkit.deploy.manifests import target_cpu_plan
    from toolkit.deploy.service_settings import ServiceOverrides
    from toolkit.repository.compile import compile_repository

    compiled = compile_repository(_quickstart_like(tmp_path / "repo", 2), None, "cpu")
    lam = target_cpu_plan("lambda", "m", compiled, LambdaOverrides(memory_mb=3538))
    assert lam.serial and lam.cpus.cpus == 2 and lam.cpus.basis == "AWS Lambda 3538 MB = 2.00 vCPU"
    assert [s.threads for s in lam.shares] == [2, 2]
    run = target_cpu_plan("cloudrun", "m", compiled, ServiceOverrides(cpu="4", memory="4Gi"))
    assert run.cpus.basis == "cloudrun --cpu 4" and [s.threads for s in run.shares] == [2, 2]


def test_toolkit_serve_refuses_a_bad_cpu_count(tmp_path):
    repo = _quickstart_like(tmp_path / "repo", 1)
    done = subprocess.run([sys.executable, "-m", "toolkit.cli", "serve", str(repo), "--device", "cpu", "--port", "1"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, "TOOLKIT_CPUS": "x"})
    assert done.returncode == 2
    assert "TOOLKIT_CPUS must be a whole number of CPUs, got 'x'" in done.stderr


def test_omp_num_threads_in_the_serving_environment_is_an_explicit_count_for_python_models(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    cpu_plan = plan([_python("p", 2), _onnx("a", 1)], CpuCount(8, 8))
    assert _threads(cpu_plan) == {"p_0": 3, "p_1": 3, "a_0": 2}
    assert "OMP_NUM_THREADS" not in thread_environment(3)  # the environment's own value stays as it is
