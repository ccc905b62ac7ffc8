"""Cloud Run Admin API v1, the API behind `gcloud run services replace`.

Services are Knative `serving.knative.dev/v1` objects under
`https://REGION-run.googleapis.com/apis/serving.knative.dev/v1/namespaces/PROJECT/services`
(v2 is a different schema). As gcloud does for `replace`:

- GET the service; if it exists, PUT (replaceService) the new document carrying the current
  `metadata.resourceVersion` (optimistic concurrency) and the existing `serving.knative.dev/*`
  annotations (Knative refuses edits of those); otherwise POST (create);
- poll GET until `status.observedGeneration` reaches `metadata.generation` and the `Ready`
  condition is True (or False: the revision failed, e.g. its startup probe);
- IAM (`--allow-unauthenticated`): getIamPolicy / setIamPolicy on
  `https://run.googleapis.com/v1/projects/PROJECT/locations/REGION/services/NAME`, adding
  `allUsers` to `roles/run.invoker`.

Requests go through google-auth's `AuthorizedSession` (application-default credentials).
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import DeployError

SERVING_GROUP = "serving.knative.dev"
INVOKER_ROLE = "roles/run.invoker"
PUBLIC_MEMBER = "allUsers"


@dataclass(frozen=True)
class Endpoints:
    run: str  # regional Cloud Run endpoint (Knative v1 API)
    run_global: str  # projects.locations.* methods (IAM policy)
    artifact_registry: str

    @classmethod
    def google(cls, region: str) -> "Endpoints":
        return cls(
            run=f"https://{region}-run.googleapis.com",
            run_global="https://run.googleapis.com",
            artifact_registry="https://artifactregistry.googleapis.com",
        )

    @classmethod
    def override(cls, base: str) -> "Endpoints":
        """Every API at one base URL (a private endpoint, or a local stand-in in tests)."""
        base = base.rstrip("/")
        return cls(run=base, run_global=base, artifact_registry=base)


def api_error(response: Any) -> str:
    try:
        error = response.json().get("error", {})
        return f"{error.get('code', response.status_code)} {error.get('status', '')}: {error.get('message', '')}".strip()
    except (ValueError, AttributeError):
        return f"{response.status_code}: {response.text[:500]}"


def ready_condition(service: dict[str, Any]) -> dict[str, Any] | None:
    for condition in service.get("status", {}).get("conditions", []):
        if condition.get("type") == "Ready":
            return condition
    return None


def failure_details(service: dict[str, Any]) -> str:
    lines = []
    for condition in service.get("status", {}).get("conditions", []):
        if condition.get("status") == "False" and condition.get("message"):
            lines.append(f"{condition.get('type')}: {condition.get('message')}")
    return "\n".join(lines)


class CloudRunV1:
    def __init__(self, session: Any, project: str, region: str, endpoints: Endpoints) -> None:
        self.session = session
        self.project = project
        self.region = region
        self.endpoints = endpoints

    @property
    def _services(self) -> str:
        return f"{self.endpoints.run}/apis/{SERVING_GROUP}/v1/namespaces/{self.project}/services"

    def _check(self, response: Any, what: str) -> dict[str, Any]:
        if response.status_code >= 400:
            raise DeployError(f"Cloud Run Admin API: {what} failed: {api_error(response)}")
        return response.json()

    def get_service(self, name: str) -> dict[str, Any] | None:
        response = self.session.get(f"{self._services}/{name}")
        if response.status_code == 404:
            return None
        return self._check(response, f"get service {name}")

    def apply(self, document: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Create or replace the service; (the service as stored, created)."""
        desired = copy.deepcopy(document)
        desired.pop("status", None)
        metadata = desired.setdefault("metadata", {})
        metadata["namespace"] = self.project
        name = metadata["name"]
        current = self.get_service(name)
        if current is None:
            response = self.session.post(self._services, data=json.dumps(desired), headers={"Content-Type": "application/json"})
            return self._check(response, f"create service {name}"), True
        current_meta = current.get("metadata", {})
        if current_meta.get("resourceVersion"):
            metadata["resourceVersion"] = current_meta["resourceVersion"]
        annotations = metadata.setdefault("annotations", {})
        for key, value in (current_meta.get("annotations") or {}).items():
            if key.startswith(SERVING_GROUP):
                annotations[key] = value
        response = self.session.put(
            f"{self._services}/{name}", data=json.dumps(desired), headers={"Content-Type": "application/json"}
        )
        return self._check(response, f"replace service {name}"), False

    def wait_ready(self, name: str, generation: int, timeout_s: float, poll_s: float = 2.0,
                   sleep: Callable[[float], None] = time.sleep, on_status: Callable[[str], None] | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        last = ""
        while True:
            service = self.get_service(name)
            if service is None:
                raise DeployError(f"service {name} disappeared while waiting for it")
            status = service.get("status", {})
            fresh = int(status.get("observedGeneration", 0)) >= generation
            condition = ready_condition(service) if fresh else None
            if condition is not None:
                message = condition.get("message") or condition.get("reason") or ""
                if on_status and message and message != last:
                    on_status(message)
                    last = message
                if condition.get("status") == "True":
                    return service
                if condition.get("status") == "False":
                    raise DeployError(
                        f"the new revision of {name} failed: {message or 'not ready'}", detail=failure_details(service) or None
                    )
            if time.monotonic() > deadline:
                raise DeployError(f"service {name} not ready after {int(timeout_s)} s (still deploying; check the Cloud Run console)")
            sleep(poll_s)

    @property
    def _resource(self) -> str:
        return f"{self.endpoints.run_global}/v1/projects/{self.project}/locations/{self.region}/services"

    def get_iam_policy(self, name: str) -> dict[str, Any]:
        return self._check(self.session.get(f"{self._resource}/{name}:getIamPolicy"), f"getIamPolicy {name}")

    def set_iam_policy(self, name: str, policy: dict[str, Any]) -> dict[str, Any]:
        response = self.session.post(
            f"{self._resource}/{name}:setIamPolicy", data=json.dumps({"policy": policy}),
            headers={"Content-Type": "application/json"},
        )
        return self._check(response, f"setIamPolicy {name}")

    def is_public(self, name: str) -> bool:
        policy = self.get_iam_policy(name)
        return any(b.get("role") == INVOKER_ROLE and PUBLIC_MEMBER in b.get("members", []) for b in policy.get("bindings", []))

    def allow_unauthenticated(self, name: str) -> None:
        policy = self.get_iam_policy(name)
        bindings = policy.setdefault("bindings", [])
        for binding in bindings:
            if binding.get("role") == INVOKER_ROLE:
                if PUBLIC_MEMBER in binding.setdefault("members", []):
                    return
                binding["members"].append(PUBLIC_MEMBER)
                break
        else:
            bindings.append({"role": INVOKER_ROLE, "members": [PUBLIC_MEMBER]})
        self.set_iam_policy(name, policy)
