"""Artifact Registry: the Docker repository the Cloud Run image lives in, and the push.

The repository (`--ar-repository`, default `toolkit`, in the service's region) is created through
the Artifact Registry API v1 when missing (a long-running operation, polled until done). The
push is the container engine's, logged in as `oauth2accesstoken` with an access token of the
application-default credentials (what `gcloud auth configure-docker` arranges with a helper).
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from ..engine import ContainerEngine
from ..errors import DeployError
from ..progress import DeployUI
from .admin_api import Endpoints, api_error


def registry_host(location: str) -> str:
    return f"{location}-docker.pkg.dev"


def is_google_registry(host: str | None) -> bool:
    return bool(host) and (host.endswith("-docker.pkg.dev") or host == "gcr.io" or host.endswith(".gcr.io"))  # type: ignore[union-attr]


def ensure_repository(
    session: Any, endpoints: Endpoints, project: str, location: str, repository: str, ui: DeployUI,
    poll_s: float = 2.0, timeout_s: float = 300.0, sleep: Callable[[float], None] = time.sleep,
) -> None:
    base = f"{endpoints.artifact_registry}/v1/projects/{project}/locations/{location}/repositories"
    response = session.get(f"{base}/{repository}")
    if response.status_code == 200:
        return
    if response.status_code != 404:
        raise DeployError(f"Artifact Registry: cannot read repository {repository}: {api_error(response)}")
    ui.step(f"creating Artifact Registry repository {repository} in {location}")
    response = session.post(
        base, params={"repositoryId": repository},
        data=json.dumps({"format": "DOCKER", "description": "Images deployed by toolkit"}),
        headers={"Content-Type": "application/json"},
    )
    if response.status_code >= 400:
        raise DeployError(f"Artifact Registry: cannot create repository {repository}: {api_error(response)}")
    operation = response.json()
    deadline = time.monotonic() + timeout_s
    while not operation.get("done"):
        if time.monotonic() > deadline:
            raise DeployError(f"Artifact Registry: creating {repository} did not finish in {int(timeout_s)} s")
        sleep(poll_s)
        response = session.get(f"{endpoints.artifact_registry}/v1/{operation['name']}")
        if response.status_code >= 400:
            raise DeployError(f"Artifact Registry: operation {operation['name']}: {api_error(response)}")
        operation = response.json()
    if "error" in operation:
        raise DeployError(f"Artifact Registry: creating {repository} failed: {operation['error'].get('message', operation['error'])}")


def push(source: str, target: str, access_token: str, engine: ContainerEngine, ui: DeployUI) -> str | None:
    """Push `source` (a local image) as `target`; the digest the registry reports."""
    host = target.split("/", 1)[0]
    ui.step(f"logging {engine.name} in to {host}")
    engine.login(f"https://{host}", "oauth2accesstoken", access_token)
    engine.tag(source, target)
    ui.step(f"pushing {source} to {target} with {engine.name}")
    return engine.push(target, ui.line)
