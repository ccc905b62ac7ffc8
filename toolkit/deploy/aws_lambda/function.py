"""The Lambda function, its versions, alias `live`, Function URL and provisioned concurrency.

Traffic only ever reaches the alias `live` (the Function URL belongs to the alias), and versions are
immutable, so an update is safe by construction: $LATEST is updated and waited for, a version is
published and (optionally) smoke-tested by invoking it, and only then does `live` move. Any failure
before that leaves `live`, and therefore every caller, on the previous version.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any, Callable

from ... import __version__
from ..errors import DeployError
from ..function_url import http_response, request_event
from ..progress import DeployUI
from .settings import ALIAS, LambdaSettings

PUBLIC_URL_STATEMENT = "toolkit-public-url"
PUBLIC_INVOKE_STATEMENT = "toolkit-public-url-invoke"
ROLE_PROPAGATION_S = 60.0  # a new IAM role can take seconds before Lambda may assume it
PROVISIONED_TIMEOUT_S = 900.0


def error_code(exc: Exception) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Code", "")


def _error_message(exc: Exception) -> str:
    return getattr(exc, "response", {}).get("Error", {}).get("Message", str(exc))


@dataclass
class Waiting:
    """How long to wait and how often to look (tests make it fast)."""

    poll_s: float = 2.0
    timeout_s: float = 900.0
    sleep: Callable[[float], None] = time.sleep

    def waiter_config(self) -> dict[str, int]:
        return {"Delay": max(1, int(self.poll_s)), "MaxAttempts": max(1, int(self.timeout_s / max(1.0, self.poll_s)))}


def _wait(lam: Any, waiter: str, name: str, waiting: Waiting, **kwargs: Any) -> None:
    try:
        lam.get_waiter(waiter).wait(FunctionName=name, WaiterConfig=waiting.waiter_config(), **kwargs)
    except Exception as exc:  # botocore.exceptions.WaiterError
        config = _configuration(lam, name, kwargs.get("Qualifier"))
        reason = config.get("StateReason") or config.get("LastUpdateStatusReason") or str(exc)
        raise DeployError(f"Lambda function {name} did not become ready ({waiter}): {reason}") from None


def _configuration(lam: Any, name: str, qualifier: str | None = None) -> dict[str, Any]:
    try:
        if qualifier:
            return lam.get_function_configuration(FunctionName=name, Qualifier=qualifier)
        return lam.get_function_configuration(FunctionName=name)
    except Exception:
        return {}


def existing_function(lam: Any, name: str) -> dict[str, Any] | None:
    try:
        return lam.get_function(FunctionName=name)["Configuration"]
    except Exception as exc:
        if error_code(exc) == "ResourceNotFoundException":
            return None
        raise


def _common(settings: LambdaSettings, role_arn: str) -> dict[str, Any]:
    return {
        "Role": role_arn,
        "MemorySize": settings.memory_mb,
        "Timeout": settings.timeout_s,
        "EphemeralStorage": {"Size": settings.ephemeral_storage_mb},
        "Environment": {"Variables": dict(settings.environment)},
        "Description": f"Triton model repository served by toolkit {__version__} (v2 inference protocol)",
    }


def create_function(
    lam: Any, settings: LambdaSettings, image_uri: str, role_arn: str, role_created: bool, waiting: Waiting, ui: DeployUI
) -> dict[str, Any]:
    ui.step(f"creating Lambda function {settings.name}")
    deadline = time.monotonic() + (ROLE_PROPAGATION_S if role_created else 0)
    while True:
        try:
            lam.create_function(
                FunctionName=settings.name, PackageType="Image", Code={"ImageUri": image_uri},
                Architectures=[settings.architecture], Publish=False, **_common(settings, role_arn),
            )
            break
        except Exception as exc:
            # IAM is eventually consistent: a role created a moment ago may not be assumable yet.
            if error_code(exc) == "InvalidParameterValueException" and "role" in _error_message(exc).lower() \
                    and time.monotonic() < deadline:
                ui.line("waiting for the new execution role to propagate")
                waiting.sleep(min(5.0, max(0.1, waiting.poll_s)))
                continue
            raise DeployError(f"CreateFunction {settings.name} failed: {_error_message(exc)}") from None
    _wait(lam, "function_active_v2", settings.name, waiting)
    return _configuration(lam, settings.name)


def update_function(
    lam: Any, settings: LambdaSettings, image_uri: str, role_arn: str, current: dict[str, Any], waiting: Waiting, ui: DeployUI
) -> dict[str, Any]:
    if current.get("PackageType") != "Image":
        raise DeployError(
            f"Lambda function {settings.name} exists and is a {current.get('PackageType', 'Zip')} function, not a "
            "container image one: choose another --name"
        )
    name = settings.name
    ui.step(f"updating Lambda function {name} ($LATEST; alias '{ALIAS}' keeps serving its version)")
    _wait(lam, "function_updated_v2", name, waiting)  # a previous update may still be in progress
    try:
        lam.update_function_configuration(FunctionName=name, **_common(settings, role_arn))
    except Exception as exc:
        raise DeployError(f"UpdateFunctionConfiguration {name} failed: {_error_message(exc)}") from None
    _wait(lam, "function_updated_v2", name, waiting)
    try:
        lam.update_function_code(FunctionName=name, ImageUri=image_uri, Architectures=[settings.architecture])
    except Exception as exc:
        raise DeployError(f"UpdateFunctionCode {name} failed: {_error_message(exc)}") from None
    _wait(lam, "function_updated_v2", name, waiting)
    config = _configuration(lam, name)
    if config.get("LastUpdateStatus") not in (None, "Successful"):
        raise DeployError(f"the update of {name} failed: {config.get('LastUpdateStatusReason', config.get('LastUpdateStatus'))}")
    return config


def publish_version(lam: Any, name: str, code_sha256: str | None, waiting: Waiting, ui: DeployUI) -> str:
    ui.step(f"publishing a version of {name}")
    kwargs: dict[str, Any] = {"FunctionName": name, "Description": f"toolkit {__version__}"}
    if code_sha256:
        kwargs["CodeSha256"] = code_sha256  # refuse to publish if $LATEST changed under us
    try:
        version = lam.publish_version(**kwargs)["Version"]
    except Exception as exc:
        raise DeployError(f"PublishVersion {name} failed: {_error_message(exc)}") from None
    _wait(lam, "published_version_active", name, waiting, Qualifier=version)
    return version


def smoke_test(lam: Any, name: str, version: str, ui: DeployUI) -> None:
    """Invoke the new version with GET /v2/health/ready (its init loads and warms up every model)."""
    ui.step(f"smoke test: GET /v2/health/ready on version {version} (cold start: loads and warms up the models)")
    try:
        answer = lam.invoke(
            FunctionName=name, Qualifier=version, InvocationType="RequestResponse",
            Payload=json.dumps(request_event("GET", "/v2/health/ready")).encode(),
        )
    except Exception as exc:
        raise DeployError(f"smoke test of {name}:{version} could not invoke it: {_error_message(exc)}") from None
    payload = answer["Payload"].read()
    if answer.get("FunctionError"):
        raise DeployError(
            f"version {version} of {name} failed its smoke test ({answer['FunctionError']}); alias '{ALIAS}' was not moved",
            detail=payload.decode(errors="replace")[-2000:],
        )
    answer_http = http_response(payload)
    if answer_http.status != 200:
        raise DeployError(
            f"version {version} of {name} is not ready (GET /v2/health/ready answered {answer_http.status}); "
            f"alias '{ALIAS}' was not moved",
            detail=answer_http.body.decode(errors="replace")[-2000:],
        )


def point_alias(lam: Any, name: str, version: str, ui: DeployUI) -> str:
    ui.step(f"pointing alias '{ALIAS}' at version {version}")
    try:
        lam.get_alias(FunctionName=name, Name=ALIAS)
    except Exception as exc:
        if error_code(exc) != "ResourceNotFoundException":
            raise
        return lam.create_alias(FunctionName=name, Name=ALIAS, FunctionVersion=version)["AliasArn"]
    return lam.update_alias(FunctionName=name, Name=ALIAS, FunctionVersion=version)["AliasArn"]


def ensure_url(lam: Any, name: str, auth_type: str, ui: DeployUI) -> str:
    try:
        current = lam.get_function_url_config(FunctionName=name, Qualifier=ALIAS)
    except Exception as exc:
        if error_code(exc) != "ResourceNotFoundException":
            raise
        ui.step(f"creating the Function URL of '{ALIAS}' (AuthType {auth_type})")
        return lam.create_function_url_config(FunctionName=name, Qualifier=ALIAS, AuthType=auth_type, InvokeMode="BUFFERED")[
            "FunctionUrl"
        ]
    if current.get("AuthType") != auth_type:
        ui.step(f"changing the Function URL's AuthType from {current.get('AuthType')} to {auth_type}")
        return lam.update_function_url_config(FunctionName=name, Qualifier=ALIAS, AuthType=auth_type)["FunctionUrl"]
    return current["FunctionUrl"]


def _statement_ids(lam: Any, name: str) -> set[str]:
    try:
        policy = json.loads(lam.get_policy(FunctionName=name, Qualifier=ALIAS)["Policy"])
    except Exception as exc:
        if error_code(exc) == "ResourceNotFoundException":
            return set()
        raise
    return {s.get("Sid", "") for s in policy.get("Statement", [])}


def sync_public_access(lam: Any, name: str, public: bool, ui: DeployUI) -> None:
    """A public URL needs lambda:InvokeFunctionUrl and lambda:InvokeFunction (through the URL only)
    granted to everyone; an AWS_IAM URL must carry neither, so they are removed when switching back."""
    present = _statement_ids(lam, name)
    if public:
        if PUBLIC_URL_STATEMENT not in present:
            lam.add_permission(
                FunctionName=name, Qualifier=ALIAS, StatementId=PUBLIC_URL_STATEMENT, Action="lambda:InvokeFunctionUrl",
                Principal="*", FunctionUrlAuthType="NONE",
            )
        if PUBLIC_INVOKE_STATEMENT not in present:
            lam.add_permission(
                FunctionName=name, Qualifier=ALIAS, StatementId=PUBLIC_INVOKE_STATEMENT, Action="lambda:InvokeFunction",
                Principal="*", InvokedViaFunctionUrl=True,
            )
        return
    for statement in (PUBLIC_URL_STATEMENT, PUBLIC_INVOKE_STATEMENT):
        if statement in present:
            ui.line(f"removing public permission {statement}")
            lam.remove_permission(FunctionName=name, Qualifier=ALIAS, StatementId=statement)


def apply_provisioned_concurrency(lam: Any, name: str, executions: int | None, waiting: Waiting, ui: DeployUI) -> str | None:
    """Set (N > 0), remove (0) or leave (None) provisioned concurrency on the alias; its status."""
    if executions is None:
        return None
    if executions == 0:
        try:
            lam.delete_provisioned_concurrency_config(FunctionName=name, Qualifier=ALIAS)
            ui.step(f"removed provisioned concurrency from '{ALIAS}'")
        except Exception as exc:
            if error_code(exc) not in ("ProvisionedConcurrencyConfigNotFoundException", "ResourceNotFoundException"):
                raise DeployError(f"DeleteProvisionedConcurrencyConfig failed: {_error_message(exc)}") from None
        return "REMOVED"
    ui.step(f"provisioned concurrency {executions} on '{ALIAS}' (initialises {executions} environments: loads the models)")
    try:
        lam.put_provisioned_concurrency_config(FunctionName=name, Qualifier=ALIAS, ProvisionedConcurrentExecutions=executions)
    except Exception as exc:
        raise DeployError(f"PutProvisionedConcurrencyConfig failed: {_error_message(exc)}") from None
    deadline = time.monotonic() + min(waiting.timeout_s, PROVISIONED_TIMEOUT_S)
    while True:
        status = lam.get_provisioned_concurrency_config(FunctionName=name, Qualifier=ALIAS)
        state = status.get("Status")
        if state == "READY":
            return state
        if state == "FAILED":
            raise DeployError(
                f"provisioned concurrency on {name}:{ALIAS} failed: {status.get('StatusReason', 'no reason given')} "
                f"(alias '{ALIAS}' serves the new version on demand)"
            )
        if time.monotonic() > deadline:
            raise DeployError(
                f"provisioned concurrency on {name}:{ALIAS} still {state} after {int(waiting.timeout_s)} s "
                f"({status.get('AvailableProvisionedConcurrentExecutions', 0)} of {executions} ready)"
            )
        waiting.sleep(waiting.poll_s)
