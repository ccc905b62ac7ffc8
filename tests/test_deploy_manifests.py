"""Deployment manifests (templates/deploy/) and the sizes behind them.

- The SAM template is linted with the real cfn-lint (its console script, run as a process) and its
  structure is checked: image function, least-privilege role, alias `live`, Function URL with
  AWS_IAM by default, the public-URL permissions only with --auth none.
- Cloud Run's service.yaml is checked against Cloud Run's documented rules
  (cloud.google.com/run/docs/configuring/services/gpu: one nvidia-l4, at least 4 CPU and 16 GiB,
  CPU always allocated; .../services/cpu and .../memory-limits: the CPU / memory table;
  .../configuring/healthchecks: failureThreshold x periodSeconds <= 240 s, 1800 s in the GPU
  example; concurrency <= 1000).
- The Knative YAML carries no Cloud Run annotation.
- Every variant (CPU / GPU, public / IAM URL, provisioned concurrency, arm64, min / max scale,
  namespace, service account, environment) passes its ecosystem's own validators
  (tests/manifest_checks.py): `sam validate --lint` for SAM; for the Knative Services (Cloud Run's
  included) Knative's API-type validators and Kubernetes' strict schemas; a broken manifest fails
  each of them.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import manifest_checks
import model_builders as mb
from conftest import write_config
from toolkit.deploy.aws_lambda.settings import LambdaOverrides, lambda_settings, memory_for
from toolkit.deploy.errors import DeployOptionError
from toolkit.deploy.manifests import manifest_name, render_service, service_document, write_manifests
from toolkit.deploy.service_settings import (
    ServiceOverrides,
    check_cloud_run_resources,
    parse_memory_mib,
    service_settings,
)
from toolkit.deploy.sizing import (
    MIB,
    ModelFootprint,
    container_concurrency,
    footprints,
    memory_estimate_mib,
    startup_budget_s,
)
from toolkit.repository.compile import compile_repository

CFN_LINT = str(Path(sys.executable).with_name("cfn-lint"))
ECR_IMAGE = "123456789012.dkr.ecr.us-east-1.amazonaws.com/add-sub@sha256:" + "ab" * 32
AR_IMAGE = "us-central1-docker.pkg.dev/proj/toolkit/add-sub@sha256:" + "cd" * 32

ADD_SUB = """
    backend: "onnxruntime"
    max_batch_size: 8
    input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
    output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
    dynamic_batching { max_queue_delay_microseconds: 100 }
    instance_group [ { count: 2 kind: KIND_CPU } ]
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("manifests") / "models"
    mb.add_sub(repo / "add_sub" / "1" / "model.onnx")
    write_config(repo, "add_sub", ADD_SUB)
    return repo


@pytest.fixture(scope="module")
def compiled(repository):
    result = compile_repository(repository, None, "cpu")
    assert result.ok, result.failures
    return result


@pytest.fixture(scope="module")
def compiled_gpu(repository):
    result = compile_repository(repository, None, "gpu")
    assert result.ok, result.failures
    return result


def _fp(weight_mib: float = 1, instances: int = 1, batch: int = 0, dynamic: bool = False, kind: str = "onnx",
        warmups: int = 0, tensors: int = 0) -> ModelFootprint:
    return ModelFootprint("m", kind, int(weight_mib * MIB), instances, batch, dynamic, tensors, warmups, False)


# ------------------------------------------------------------------------------------------
# sizing


def test_footprint_reads_files_and_config(compiled, repository):
    (fp,) = footprints(compiled)
    assert fp.weight_bytes == (repository / "add_sub" / "1" / "model.onnx").stat().st_size
    assert (fp.instances, fp.max_batch_size, fp.dynamic_batching, fp.kind) == (2, 8, True, "onnx")
    # 4 fixed-shape FP32 tensors of 16 elements, a full batch of 8
    assert fp.batch_tensor_bytes == 4 * 16 * 4 * 8


def test_memory_grows_with_weights_and_instances():
    one = memory_estimate_mib([_fp(100, 1)])
    three = memory_estimate_mib([_fp(100, 3)])
    # each instance holds its own session: about 3x the file plus 10 MiB, with 1.5x headroom
    assert three - one == pytest.approx(2 * (300 + 10) * 1.5, abs=2)
    assert memory_estimate_mib([_fp(200, 1)]) > one


def test_concurrency_lets_batches_form():
    assert container_concurrency([_fp(batch=8, instances=2, dynamic=True)]) == 16
    # without dynamic batching an instance takes one request at a time
    assert container_concurrency([_fp(batch=8, instances=2, dynamic=False)]) == 2
    assert container_concurrency([_fp(batch=8, instances=2, dynamic=True), _fp(instances=3)]) == 19
    assert container_concurrency([_fp(kind="ensemble", instances=0)]) == 1


def test_startup_budget_bounds():
    assert startup_budget_s([_fp(1)], gpu=False, cap=240) == 60  # at least a minute
    huge = [_fp(50_000, 2, warmups=10)]
    assert startup_budget_s(huge, gpu=False, cap=240) == 240
    assert startup_budget_s(huge, gpu=True, cap=1800) == 1800
    medium = [_fp(2000, 2, warmups=5)]  # 2 x 20 s reads + setup + warmup, x3
    assert 120 < startup_budget_s(medium, gpu=False, cap=240) <= 240


def test_lambda_memory_default():
    assert memory_for([_fp(1)])[0] == 1769  # one full vCPU at least
    mb_, note = memory_for([_fp(1500, 1)])
    assert mb_ > 1769 and mb_ % 64 == 0 and "models need about" in note
    with pytest.raises(DeployOptionError, match="over AWS Lambda's 10240 MB maximum: deploy them to Cloud Run"):
        memory_for([_fp(3000, 2)])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (LambdaOverrides(memory_mb=64), "AWS Lambda allows 128 to 10240 MB"),
        (LambdaOverrides(timeout_s=901), "AWS Lambda allows 1 to 900 seconds"),
        (LambdaOverrides(ephemeral_storage_mb=100), "512 to 10240 MB of /tmp"),
        (LambdaOverrides(architecture="arm"), "choose x86_64 or arm64"),
        (LambdaOverrides(auth="public"), "choose iam"),
        (LambdaOverrides(environment={"AWS_REGION": "x"}), "AWS_REGION is reserved by AWS Lambda"),
        (LambdaOverrides(environment={"A": "x"}), "invalid environment variable name 'A'"),
        (LambdaOverrides(environment={"BIG": "x" * 5000}), "over AWS Lambda's 4096 byte limit"),
        (LambdaOverrides(provisioned_concurrency=-1), "0 \\(remove\\) or more"),
    ],
)
def test_lambda_settings_refuse_what_lambda_refuses(compiled, overrides, message):
    with pytest.raises(DeployOptionError, match=message):
        lambda_settings("add-sub", compiled, overrides)


def test_lambda_function_name_rules(compiled):
    with pytest.raises(DeployOptionError, match="1 to 64 letters"):
        lambda_settings("add sub", compiled)
    assert manifest_name("registry.io/team/my.model", "lambda") == "my-model"
    assert manifest_name("My_Model", "cloudrun") == "my-model"


# ------------------------------------------------------------------------------------------
# SAM template


def _lint(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([CFN_LINT, str(path)], capture_output=True, text=True, timeout=300)


def _sam(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_sam_template_defaults(tmp_path, compiled):
    (path,) = write_manifests("lambda", tmp_path, image=ECR_IMAGE, name="add_sub", compiled_repository=compiled)
    assert path.name == "template.yaml"
    lint = _lint(path)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    doc = _sam(path)
    assert doc["Transform"] == "AWS::Serverless-2016-10-31"
    assert doc["Parameters"]["ImageUri"]["Default"] == ECR_IMAGE
    function = doc["Resources"]["Function"]
    assert function["Type"] == "AWS::Serverless::Function"
    props = function["Properties"]
    assert props["PackageType"] == "Image" and props["ImageUri"] == {"Ref": "ImageUri"}
    assert props["FunctionName"] == "add_sub"
    assert props["MemorySize"] == 1769 and props["Timeout"] == 60 and props["EphemeralStorage"] == {"Size": 512}
    assert props["Architectures"] == ["x86_64"]
    assert props["AutoPublishAlias"] == "live"
    assert props["FunctionUrlConfig"] == {"AuthType": "AWS_IAM"}
    assert props["Role"] == {"Fn::GetAtt": ["ExecutionRole", "Arn"]}
    assert "ProvisionedConcurrencyConfig" not in props and "Environment" not in props
    assert "PublicUrlInvokePermission" not in doc["Resources"]
    # least privilege: the role may write its own log group and nothing else
    role = doc["Resources"]["ExecutionRole"]["Properties"]
    assert role["AssumeRolePolicyDocument"]["Statement"] == [
        {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}
    ]
    (policy,) = role["Policies"]
    statements = policy["PolicyDocument"]["Statement"]
    actions = sorted(a for s in statements for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"]))
    assert actions == ["logs:CreateLogGroup", "logs:CreateLogStream", "logs:PutLogEvents"]
    assert all("log-group:/aws/lambda/add_sub" in s["Resource"]["Fn::Sub"] for s in statements)
    assert "ManagedPolicyArns" not in role
    assert doc["Outputs"]["FunctionUrl"]["Value"] == {"Fn::GetAtt": ["FunctionUrl", "FunctionUrl"]}
    assert doc["Outputs"]["AliasArn"]["Value"] == {"Ref": "FunctionAliaslive"}


def test_sam_template_public_url_and_provisioned_concurrency(tmp_path, compiled):
    options = LambdaOverrides(
        auth="none", provisioned_concurrency=3, memory_mb=3008, architecture="arm64",
        environment={"TOOLKIT_LOG_LEVEL": "debug", "QUOTED": 'a: "b" # c'},
    )
    (path,) = write_manifests("lambda", tmp_path, image="add-sub:local", name="add-sub", compiled_repository=compiled, options=options)
    lint = _lint(path)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    doc = _sam(path)
    props = doc["Resources"]["Function"]["Properties"]
    assert props["FunctionUrlConfig"] == {"AuthType": "NONE"}
    assert props["ProvisionedConcurrencyConfig"] == {"ProvisionedConcurrentExecutions": 3}
    assert props["MemorySize"] == 3008 and props["Architectures"] == ["arm64"]
    assert props["Environment"]["Variables"] == {"TOOLKIT_LOG_LEVEL": "debug", "QUOTED": 'a: "b" # c'}
    permission = doc["Resources"]["PublicUrlInvokePermission"]
    assert permission["Type"] == "AWS::Lambda::Permission"
    assert permission["Properties"] == {
        "Action": "lambda:InvokeFunction", "FunctionName": {"Ref": "FunctionAliaslive"}, "Principal": "*",
        "InvokedViaFunctionUrl": True,
    }
    # a local image is not deployable by CloudFormation: no default, the user passes ImageUri
    assert "Default" not in doc["Parameters"]["ImageUri"]


def test_cfn_lint_catches_a_broken_template(tmp_path, compiled):
    """The lint above is not a rubber stamp: the same template with an impossible value fails."""
    (path,) = write_manifests("lambda", tmp_path, image=ECR_IMAGE, name="add-sub", compiled_repository=compiled)
    path.write_text(path.read_text().replace("MemorySize: 1769", "MemorySize: 99999").replace("PackageType: Image", "PackageType: Image\n      Bogus: 1"))
    lint = _lint(path)
    assert lint.returncode != 0
    assert "99999" in lint.stdout and "Bogus" in lint.stdout


# ------------------------------------------------------------------------------------------
# Cloud Run service.yaml


def _template(doc: dict) -> tuple[dict, dict, dict]:
    template = doc["spec"]["template"]
    return template["metadata"]["annotations"], template["spec"], template["spec"]["containers"][0]


def _gib(quantity: str) -> float:
    return parse_memory_mib(quantity) / 1024


def test_cloudrun_gpu_service_follows_cloud_run_gpu_rules(tmp_path, compiled_gpu):
    (path,) = write_manifests("cloudrun", tmp_path, image=AR_IMAGE, name="add_sub", compiled_repository=compiled_gpu)
    doc = yaml.safe_load(path.read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("serving.knative.dev/v1", "Service")
    assert doc["metadata"]["name"] == "add-sub"
    annotations, spec, container = _template(doc)
    assert spec["nodeSelector"] == {"run.googleapis.com/accelerator": "nvidia-l4"}
    limits = container["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"
    assert float(limits["cpu"]) >= 4 and _gib(limits["memory"]) >= 16
    assert annotations["run.googleapis.com/cpu-throttling"] == "false"  # CPU always allocated
    assert annotations["run.googleapis.com/gpu-zonal-redundancy-disabled"] == "false"  # Cloud Run's default
    assert annotations["run.googleapis.com/startup-cpu-boost"] == "true"
    assert annotations["autoscaling.knative.dev/minScale"] == "0" and annotations["autoscaling.knative.dev/maxScale"] == "3"
    assert all(isinstance(v, str) for v in annotations.values())  # Kubernetes annotations are strings
    # the batcher: max_batch_size 8 x 2 instances
    assert spec["containerConcurrency"] == 16
    probe = container["startupProbe"]
    assert probe["httpGet"] == {"path": "/v2/health/ready", "port": 8080}
    assert probe["timeoutSeconds"] <= probe["periodSeconds"]
    budget = probe["failureThreshold"] * probe["periodSeconds"]
    assert 60 <= budget <= 1800
    assert container["ports"] == [{"name": "http1", "containerPort": 8080}]
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["image"] == AR_IMAGE


def test_cloudrun_cpu_service(tmp_path, compiled):
    options = ServiceOverrides(region="europe-west1", min_instances=1, max_instances=5, environment={"TOOLKIT_LOG_LEVEL": "warning"})
    (path,) = write_manifests("cloudrun", tmp_path, image=AR_IMAGE, name="add-sub", compiled_repository=compiled, options=options)
    doc = yaml.safe_load(path.read_text())
    assert doc["metadata"]["labels"] == {"cloud.googleapis.com/location": "europe-west1"}
    annotations, spec, container = _template(doc)
    assert "nodeSelector" not in spec and "nvidia.com/gpu" not in container["resources"]["limits"]
    assert annotations["run.googleapis.com/cpu-throttling"] == "true"
    assert "run.googleapis.com/gpu-zonal-redundancy-disabled" not in annotations
    assert (annotations["autoscaling.knative.dev/minScale"], annotations["autoscaling.knative.dev/maxScale"]) == ("1", "5")
    probe = container["startupProbe"]
    assert probe["failureThreshold"] * probe["periodSeconds"] <= 240
    assert container["env"] == [{"name": "TOOLKIT_LOG_LEVEL", "value": "warning"}]
    cpu, memory = float(container["resources"]["limits"]["cpu"]), parse_memory_mib(container["resources"]["limits"]["memory"])
    check_cloud_run_resources(cpu, memory, None, spec["containerConcurrency"], True)  # the documented table holds


def test_service_document_is_the_rendered_yaml(compiled):
    settings = service_settings("cloudrun", "add-sub", compiled)
    assert service_document(settings, AR_IMAGE) == yaml.safe_load(render_service(settings, AR_IMAGE))


@pytest.mark.parametrize(
    ("cpu", "memory_mib", "gpu", "concurrency", "throttled", "message"),
    [
        (2, 16384, "nvidia-l4", 10, False, "GPU services need at least 4 CPU and 16 GiB"),
        (4, 8192, "nvidia-l4", 10, False, "GPU services need at least 4 CPU and 16 GiB"),
        (4, 16384, "nvidia-l4", 10, True, "need CPU always allocated"),
        (4, 16384, "nvidia-t4", 10, False, "unknown Cloud Run GPU type"),
        (2, 10 * 1024, None, 10, True, "at least 4 vCPU for more than 8 GiB"),
        (1, 5 * 1024, None, 10, True, "at least 2 vCPU for more than 4 GiB"),
        (6, 2048, None, 10, True, "at least 4 GiB of memory with 6 vCPU"),
        (3, 4096, None, 10, True, "allows 2, 4, 6 or 8"),
        (0.5, 512, None, 10, True, "concurrency of 1"),
        (8, 40 * 1024, None, 10, True, "512 MiB to 32 GiB"),
        (2, 2048, None, 1001, True, "1 to 1000"),
    ],
)
def test_cloud_run_rules(cpu, memory_mib, gpu, concurrency, throttled, message):
    with pytest.raises(DeployOptionError, match=message):
        check_cloud_run_resources(cpu, memory_mib, gpu, concurrency, throttled)


def test_cloud_run_defaults_follow_the_table(compiled):
    # 10 GiB asked, CPU left to us: raised to 4 vCPU ("more than 8 GiB needs 4")
    settings = service_settings("cloudrun", "add-sub", compiled, ServiceOverrides(memory="10Gi"))
    assert (settings.cpu, settings.memory) == ("4", "10Gi")
    # 8 vCPU asked, memory left to us: raised to the 4 GiB floor of 8 vCPU
    settings = service_settings("cloudrun", "add-sub", compiled, ServiceOverrides(cpu="8"))
    assert settings.memory_mib >= 4096
    with pytest.raises(DeployOptionError, match="at most 240 s"):
        service_settings("cloudrun", "add-sub", compiled, ServiceOverrides(startup_budget_s=600))
    gpu = service_settings("cloudrun", "add-sub", compiled, ServiceOverrides(gpu="nvidia-l4", startup_budget_s=1800))
    assert gpu.startup_budget_s == 1800 and gpu.probe_failure_threshold * gpu.probe_period_s == 1800
    with pytest.raises(DeployOptionError, match="drop --cpu-throttling"):
        service_settings("cloudrun", "add-sub", compiled, ServiceOverrides(gpu="nvidia-l4", cpu_throttling=True))
    with pytest.raises(DeployOptionError, match="cannot be longer than 63 characters"):
        service_settings("cloudrun", "Add_Sub", compiled)
    with pytest.raises(DeployOptionError, match="PORT is set by Cloud Run"):
        service_settings("cloudrun", "add-sub", compiled, ServiceOverrides(environment={"PORT": "1"}))


def test_zonal_redundancy_off(tmp_path, compiled_gpu):
    (path,) = write_manifests(
        "cloudrun", tmp_path, image=AR_IMAGE, name="add-sub", compiled_repository=compiled_gpu,
        options=ServiceOverrides(gpu_zonal_redundancy=False),
    )
    annotations, _, _ = _template(yaml.safe_load(path.read_text()))
    assert annotations["run.googleapis.com/gpu-zonal-redundancy-disabled"] == "true"


# ------------------------------------------------------------------------------------------
# Knative


def test_knative_service_has_no_cloud_run_annotations(tmp_path, compiled_gpu):
    (path,) = write_manifests(
        "knative", tmp_path, image="registry.example.com/add-sub:1", name="add-sub", compiled_repository=compiled_gpu,
        options=ServiceOverrides(namespace="models", max_instances=4),
    )
    assert path.name == "knative-service.yaml"
    text = path.read_text()
    assert "run.googleapis.com" not in text and "cloud.googleapis.com" not in text
    doc = yaml.safe_load(text)
    assert doc["metadata"] == {"name": "add-sub", "namespace": "models"}
    annotations, spec, container = _template(doc)
    assert annotations["autoscaling.knative.dev/min-scale"] == "0" and annotations["autoscaling.knative.dev/max-scale"] == "4"
    deadline = int(annotations["serving.knative.dev/progress-deadline"].rstrip("s"))
    assert deadline >= 600
    assert spec["containerConcurrency"] == 16
    assert container["readinessProbe"] == {"httpGet": {"path": "/v2/health/ready"}}  # Knative forbids another port
    assert "port" not in container["livenessProbe"]["httpGet"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert "nodeSelector" not in spec


def test_write_manifests_checks_option_types(tmp_path, compiled):
    with pytest.raises(DeployOptionError, match="ServiceOverrides"):
        write_manifests("cloudrun", tmp_path, image=AR_IMAGE, name="x", compiled_repository=compiled, options=LambdaOverrides())
    with pytest.raises(DeployOptionError, match="unknown target"):
        write_manifests("ecs", tmp_path, image=AR_IMAGE, name="x", compiled_repository=compiled)


# ------------------------------------------------------------------------------------------
# every variant through its ecosystem's validators

SAM_VARIANTS = {
    "defaults": (ECR_IMAGE, None),
    "public-provisioned-arm64-env": ("add-sub:local", LambdaOverrides(
        auth="none", provisioned_concurrency=3, memory_mb=3008, architecture="arm64", timeout_s=900,
        ephemeral_storage_mb=10240, environment={"TOOLKIT_LOG_LEVEL": "debug", "QUOTED": 'a: "b" # c'},
    )),
}
SERVICE_VARIANTS = {
    "cloudrun-cpu": ("cloudrun", False, ServiceOverrides()),
    "cloudrun-cpu-scale-env-region": ("cloudrun", False, ServiceOverrides(
        region="europe-west1", min_instances=1, max_instances=5, environment={"TOOLKIT_LOG_LEVEL": "warning", "Q": 'x: "y"'},
        service_account="runner@proj.iam.gserviceaccount.com",
    )),
    "cloudrun-gpu": ("cloudrun", True, ServiceOverrides()),
    "cloudrun-gpu-no-zonal-redundancy": ("cloudrun", True, ServiceOverrides(gpu_zonal_redundancy=False, max_instances=1)),
    "knative-cpu": ("knative", False, ServiceOverrides()),
    "knative-gpu-namespace-scale": ("knative", True, ServiceOverrides(namespace="models", min_instances=2, max_instances=4)),
    "knative-env-service-account": ("knative", False, ServiceOverrides(
        environment={"TOOLKIT_LOG_LEVEL": "info"}, service_account="toolkit-runner",
    )),
}


@pytest.fixture(scope="module")
def service_manifests(tmp_path_factory, compiled, compiled_gpu) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("services")
    written = {}
    for variant, (target, gpu, options) in SERVICE_VARIANTS.items():
        image = AR_IMAGE if target == "cloudrun" else "registry.example.com/add-sub:1"
        (path,) = write_manifests(target, folder / variant, image=image, name="add_sub",
                                  compiled_repository=compiled_gpu if gpu else compiled, options=options)
        written[variant] = path
    return written


@pytest.mark.parametrize("variant", sorted(SAM_VARIANTS))
def test_sam_validate_lint_accepts_every_variant(tmp_path, compiled, variant):
    image, options = SAM_VARIANTS[variant]
    (path,) = write_manifests("lambda", tmp_path, image=image, name="add-sub", compiled_repository=compiled, options=options)
    for lint in (True, False):  # cfn-lint through sam, and SAM's translator alone
        result = manifest_checks.sam_validate(path, lint=lint)
        assert result.returncode == 0 and "is a valid SAM Template" in result.stdout + result.stderr, result.stdout + result.stderr


def test_sam_validate_rejects_a_broken_template(tmp_path, compiled):
    (path,) = write_manifests("lambda", tmp_path, image=ECR_IMAGE, name="add-sub", compiled_repository=compiled)
    path.write_text(path.read_text().replace("MemorySize: 1769", "MemorySize: 99999"))
    result = manifest_checks.sam_validate(path)
    assert result.returncode != 0 and "99999" in result.stdout + result.stderr, result.stdout + result.stderr
    path.write_text(path.read_text().replace("MemorySize: 99999", "MemorySize: 1769").replace("AutoPublishAlias: live", "AutoPublishAlias: [1]"))
    result = manifest_checks.sam_validate(path, lint=False)  # the translator refuses what SAM cannot transform
    assert result.returncode != 0, result.stdout + result.stderr


def test_knative_api_types_accept_every_service_variant(service_manifests):
    status, results = manifest_checks.knative_validate(*service_manifests.values())
    assert status == 0, results
    assert sorted(r["file"] for r in results) == sorted(map(str, service_manifests.values()))
    assert all(r["errors"] == [] and r["name"] == "add-sub" for r in results)


@pytest.mark.parametrize("variant", sorted(SERVICE_VARIANTS))
def test_kubernetes_strict_schemas_accept_every_service_variant(service_manifests, variant):
    assert manifest_checks.kubernetes_strict_errors(manifest_checks.load(service_manifests[variant])) == []


def test_the_service_validators_are_not_rubber_stamps(service_manifests, tmp_path):
    doc = manifest_checks.load(service_manifests["knative-gpu-namespace-scale"])
    spec = doc["spec"]["template"]["spec"]
    spec["timeoutSeconds"] = "300"  # a Knative field with the wrong type
    spec["containers"][0]["resources"]["limits"]["memory"] = {"Gi": 1}  # a quantity that is not one
    spec["containers"][0]["imagePullPolicy"] = 7  # a core field with the wrong type
    spec["containers"][0]["readinessprobe"] = {"httpGet": {"path": "/v2/health/ready"}}  # misspelt: unknown
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(doc))
    status, (result,) = manifest_checks.knative_validate(broken)
    assert status == 1
    paths = {e["path"] for e in result["errors"]}
    assert {"/spec/template/spec/timeoutSeconds", "/spec/template/spec/containers/0/imagePullPolicy"} <= paths, result
    assert any(p.startswith("/spec/template/spec/containers/0/resources/limits/memory") for p in paths), result
    assert any("imagePullPolicy" in e for e in manifest_checks.kubernetes_strict_errors(doc))
    only_unknown = manifest_checks.load(service_manifests["cloudrun-cpu"])
    only_unknown["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {"httpGet": {"path": "/"}}  # misspelt
    only_unknown["metadata"]["lables"] = {"a": "b"}
    errors = manifest_checks.kubernetes_strict_errors(only_unknown)  # unknown fields: only the strict schemas see them
    assert len(errors) == 2 and "lables" in errors[0] and "readinessprobe" in errors[1], errors
    empty = tmp_path / "empty.yaml"
    empty.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n")
    assert manifest_checks.knative_validate(empty)[0] == 1  # no Service in it: not a pass
