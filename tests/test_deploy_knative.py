"""`toolkit deploy --target knative`: the manifest, the kubectl commands, and kubectl's failures.

No Kubernetes cluster runs here. What is checked: the Service written, the commands printed when
kubectl is missing, the image rules (a registry the cluster can pull from), and that a real
kubectl run against an unreachable API server is reported with kubectl's own message.
"""

from __future__ import annotations

import shutil

import pytest
import yaml

import model_builders as mb
from conftest import write_config
from toolkit.deploy.errors import DeployError, DeployOptionError, ManualSteps
from toolkit.deploy.knative import KnativeDeployOptions, deploy_knative
from toolkit.deploy.service_settings import ServiceOverrides
from toolkit.repository.compile import compile_repository

IMAGE = "registry.example.com/team/add-sub:0a1b2c"


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    repo = tmp_path_factory.mktemp("knative-repo") / "models"
    mb.add_sub(repo / "add_sub" / "1" / "model.onnx")
    write_config(repo, "add_sub", """
        backend: "onnxruntime"
        max_batch_size: 4
        input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        dynamic_batching { }
        instance_group [ { count: 3 kind: KIND_CPU } ]
    """)
    result = compile_repository(repo, None, "cpu")
    assert result.ok
    return result


def test_without_kubectl_the_commands_are_printed(tmp_path, compiled, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    options = KnativeDeployOptions(name="add-sub", image=IMAGE, output_dir=tmp_path, context="staging",
                                   overrides=ServiceOverrides(namespace="models"))
    with pytest.raises(ManualSteps) as info:
        deploy_knative(options, compiled)
    manifest = tmp_path / "knative-service.yaml"
    assert info.value.commands[0] == f"kubectl --context staging --namespace models apply -f {manifest}"
    assert info.value.commands[1].startswith("kubectl --context staging --namespace models wait ksvc/add-sub --for=condition=Ready --timeout=")
    doc = yaml.safe_load(manifest.read_text())
    assert doc["metadata"] == {"name": "add-sub", "namespace": "models"}
    assert doc["spec"]["template"]["spec"]["containerConcurrency"] == 12  # 4 x 3 instances
    assert doc["spec"]["template"]["spec"]["containers"][0]["image"] == IMAGE


def test_dry_run_runs_nothing(tmp_path, compiled):
    options = KnativeDeployOptions(name="add-sub", image=IMAGE, output_dir=tmp_path, dry_run=True,
                                   kubectl=str(tmp_path / "no-such-kubectl"))
    record = deploy_knative(options, compiled)
    assert record.dry_run and record.manifest == str(tmp_path / "knative-service.yaml")
    assert record.settings["concurrency"] == 12 and record.url is None


@pytest.mark.parametrize(
    ("image", "message"),
    [
        (None, "pulls the image from a registry"),
        ("add-sub:local", "not a local image or an archive"),
    ],
)
def test_image_must_come_from_a_registry(tmp_path, compiled, image, message):
    with pytest.raises(DeployOptionError, match=message):
        deploy_knative(KnativeDeployOptions(name="add-sub", image=image, output_dir=tmp_path), compiled)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs the kubectl binary (a real client run)")
def test_kubectl_failure_is_reported(tmp_path, compiled, monkeypatch):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "nowhere",
        "clusters": [{"name": "nowhere", "cluster": {"server": "https://127.0.0.1:9", "insecure-skip-tls-verify": True}}],
        "contexts": [{"name": "nowhere", "context": {"cluster": "nowhere", "user": "nobody"}}],
        "users": [{"name": "nobody", "user": {"token": "x"}}],
    }))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    with pytest.raises(DeployError, match="kubectl apply failed") as info:
        deploy_knative(KnativeDeployOptions(name="add-sub", image=IMAGE, output_dir=tmp_path), compiled)
    assert "127.0.0.1:9" in info.value.detail
    assert (tmp_path / "knative-service.yaml").is_file()
