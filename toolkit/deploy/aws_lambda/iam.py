"""The function's execution role: assumable by Lambda, allowed to write its own logs, nothing else.

AWS's managed AWSLambdaBasicExecutionRole grants the three CloudWatch Logs actions on every log
group (`Resource: "*"`); this role scopes them to /aws/lambda/FUNCTION. The function needs no
other permission: the image carries the models, and ECR image pulls are authorised by the
repository, not by the execution role.
"""

from __future__ import annotations

import json
from typing import Any

from ..progress import DeployUI

POLICY_NAME = "cloudwatch-logs"

TRUST_POLICY = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}
    ],
}


def role_name(function: str) -> str:
    return f"{function}-toolkit-exec"[:64]


def logs_policy(function: str, region: str, account: str, partition: str = "aws") -> dict[str, Any]:
    group = f"arn:{partition}:logs:{region}:{account}:log-group:/aws/lambda/{function}"
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Effect": "Allow", "Action": "logs:CreateLogGroup", "Resource": group},
            {"Effect": "Allow", "Action": ["logs:CreateLogStream", "logs:PutLogEvents"], "Resource": f"{group}:*"},
        ],
    }


def ensure_execution_role(iam: Any, function: str, region: str, account: str, partition: str, ui: DeployUI) -> tuple[str, bool]:
    """(role ARN, created now). The inline policy is (re)written every time, so it stays minimal."""
    name = role_name(function)
    created = False
    try:
        arn = iam.get_role(RoleName=name)["Role"]["Arn"]
    except Exception as exc:  # botocore.exceptions.ClientError
        if getattr(exc, "response", {}).get("Error", {}).get("Code") != "NoSuchEntity":
            raise
        ui.step(f"creating execution role {name}")
        arn = iam.create_role(
            RoleName=name,
            AssumeRolePolicyDocument=json.dumps(TRUST_POLICY),
            Description=f"Execution role of Lambda function {function} (toolkit): CloudWatch Logs only",
        )["Role"]["Arn"]
        created = True
    iam.put_role_policy(
        RoleName=name, PolicyName=POLICY_NAME, PolicyDocument=json.dumps(logs_policy(function, region, account, partition))
    )
    return arn, created
