"""The ecosystems' own validators for the manifests toolkit writes (tests/test_deploy_manifests.py).

- SAM `template.yaml`: `sam validate --lint` (AWS SAM CLI: SAM's translator and cfn-lint) from
  scripts/tools/sam, and plain `sam validate` (the translator alone, offline).
- Cloud Run `service.yaml` and Knative `knative-service.yaml` (both serving.knative.dev/v1 Service):
  1. scripts/tools/knative-validate: @kubernetes-models/knative, validators generated from
     Knative serving's API types: the Service, its RevisionSpec (containerConcurrency,
     timeoutSeconds, ...) and the embedded core PodSpec, types, formats and required fields;
  2. kubernetes-validate --strict (Kubernetes' own OpenAPI schemas with additionalProperties
     false): the metadata and the revision's pod spec, as a core v1 Pod, so an unknown or
     misspelt field fails as `kubectl apply` (strict field validation) would fail it.
  Neither checks Cloud Run's own extra rules (tests/test_deploy_manifests.py does, from Cloud
  Run's documentation). Knative's defaulting webhook names a nameless container
  "user-container" and gives probes the serving port before validating; both checks do the same.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import yaml
from tools import sam, tool

KUBERNETES_VERSION = "1.33"
# Knative's RevisionSpec is a core PodSpec plus these fields (knative.dev/serving/pkg/apis/serving/v1)
REVISION_ONLY_FIELDS = ("containerConcurrency", "timeoutSeconds", "idleTimeoutSeconds", "responseStartTimeoutSeconds")


def sam_validate(template: Path, lint: bool = True) -> subprocess.CompletedProcess:
    command = [sam(), "validate", "--template", str(template), "--region", "us-east-1"]
    if lint:
        command.append("--lint")
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=template.parent)


def knative_validate(*paths: Path) -> tuple[int, list[dict[str, Any]]]:
    """(exit status, one result per Service) of scripts/tools/knative-validate."""
    out = subprocess.run([tool("knative-validate"), *map(str, paths)], capture_output=True, text=True, timeout=300)
    results = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert results or out.returncode == 0, out.stdout + out.stderr
    return out.returncode, results


def _knative_defaults(spec: dict[str, Any]) -> dict[str, Any]:
    spec = copy.deepcopy(spec)
    for container in spec.get("containers", []):
        container.setdefault("name", "user-container")
        port = (container.get("ports") or [{}])[0].get("containerPort", 8080)
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            for action in ("httpGet", "tcpSocket"):
                if action in container.get(probe, {}):
                    container[probe][action].setdefault("port", port)
    return spec


def kubernetes_strict_errors(doc: dict[str, Any]) -> list[str]:
    """Errors of the Service's metadata and its revision's pod spec against Kubernetes' strict schemas."""
    import kubernetes_validate

    template = doc["spec"]["template"]
    pod_spec = {k: v for k, v in _knative_defaults(template["spec"]).items() if k not in REVISION_ONLY_FIELDS}
    checks = {
        "metadata": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": doc["metadata"]},
        "spec.template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "revision", **template.get("metadata", {})},
                          "spec": pod_spec},
    }
    errors = []
    for where, resource in checks.items():
        try:
            kubernetes_validate.validate(resource, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{where}: {'.'.join(map(str, exc.path))}: {exc.message}")
    return errors


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())
