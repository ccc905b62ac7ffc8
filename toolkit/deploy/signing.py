"""Authenticating requests to a private deployment, with the platforms' own client libraries.

- AWS (`iam`): Signature Version 4 by botocore's `SigV4Auth`, credentials from botocore's chain
  (environment, profile, SSO, instance role...), refreshed as botocore refreshes them. Lambda
  Function URLs with AuthType AWS_IAM take service `lambda`; API Gateway `execute-api`.
- Google (`google`): an OIDC ID token whose audience is the service URL, from google-auth's
  `fetch_id_token` (a service-account key in GOOGLE_APPLICATION_CREDENTIALS, or the metadata
  server on Google Cloud); with only user credentials (gcloud auth login), `gcloud auth
  print-identity-token`, which Cloud Run accepts for the signed-in user. Tokens are cached and
  fetched again five minutes before they expire.
- `none`: nothing added.

`auto` picks from the URL: *.lambda-url.REGION.on.aws -> SigV4 (lambda, REGION),
*.execute-api.REGION.amazonaws.com -> SigV4 (execute-api), *.run.app -> Google ID token.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from typing import Mapping, Protocol
from urllib.parse import urlsplit

from .errors import DeployError, DeployOptionError

AUTH_CHOICES = ("auto", "iam", "google", "none")
_LAMBDA_URL = re.compile(r"\.lambda-url\.([a-z0-9-]+)\.on\.aws$")
_EXECUTE_API = re.compile(r"\.execute-api\.([a-z0-9-]+)\.amazonaws\.com$")
TOKEN_REFRESH_MARGIN_S = 300


class Signer(Protocol):
    description: str

    def sign(self, method: str, url: str, headers: Mapping[str, str], body: bytes) -> dict[str, str]:
        """The headers to send: `headers` plus authentication."""


class NoSigner:
    description = "no authentication"

    def sign(self, method: str, url: str, headers: Mapping[str, str], body: bytes) -> dict[str, str]:
        return dict(headers)


class SigV4Signer:
    """AWS Signature Version 4 with botocore (payload hashed, session token included)."""

    def __init__(self, region: str, service: str = "lambda", credentials: object | None = None) -> None:
        try:
            import botocore.session
        except ImportError:
            raise DeployError("SigV4 signing needs botocore: pip install 'triton-serverless-toolkit[lambda]'") from None
        if credentials is None:
            credentials = botocore.session.get_session().get_credentials()
        if credentials is None:
            raise DeployError(
                "no AWS credentials to sign requests with: set AWS_PROFILE or AWS_ACCESS_KEY_ID / "
                "AWS_SECRET_ACCESS_KEY (the URL's AuthType is AWS_IAM)"
            )
        self.region = region
        self.service = service
        self._credentials = credentials
        self.description = f"AWS SigV4 ({service}, {region})"

    def sign(self, method: str, url: str, headers: Mapping[str, str], body: bytes) -> dict[str, str]:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest

        request = AWSRequest(method=method, url=url, data=body, headers=dict(headers))
        frozen = getattr(self._credentials, "get_frozen_credentials", None)
        SigV4Auth(frozen() if frozen else self._credentials, self.service, self.region).add_auth(request)
        return dict(request.headers.items())


class GoogleIdTokenSigner:
    """`Authorization: Bearer <ID token>` with the service URL as audience."""

    def __init__(self, audience: str, fetch: object | None = None) -> None:
        self.audience = audience
        self.description = f"Google ID token (audience {audience})"
        self._fetch = fetch or self._fetch_token
        self._lock = threading.Lock()
        self._token: str | None = None
        self._expiry = 0.0

    @staticmethod
    def _expiry_of(token: str) -> float:
        try:
            from google.auth import jwt

            return float(jwt.decode(token, verify=False).get("exp", 0))
        except Exception:
            return time.time() + 600  # unknown: fetch again in ten minutes

    def _fetch_token(self) -> str:
        try:
            import google.auth.exceptions
            import google.auth.transport.requests
            import google.oauth2.id_token
        except ImportError:
            raise DeployError("Google ID tokens need google-auth: pip install 'triton-serverless-toolkit[cloudrun]'") from None
        try:
            return google.oauth2.id_token.fetch_id_token(google.auth.transport.requests.Request(), self.audience)
        except google.auth.exceptions.DefaultCredentialsError as exc:
            gcloud = shutil.which("gcloud")
            if gcloud is None:
                raise DeployError(
                    "no Google credentials that can mint an ID token: set GOOGLE_APPLICATION_CREDENTIALS to a "
                    f"service-account key, run on Google Cloud, or install gcloud and sign in ({exc})"
                ) from None
            result = subprocess.run([gcloud, "auth", "print-identity-token"], capture_output=True, text=True, timeout=60)
            if result.returncode != 0 or not result.stdout.strip():
                raise DeployError("gcloud auth print-identity-token failed", detail=result.stderr[-2000:]) from None
            return result.stdout.strip()
        except google.auth.exceptions.GoogleAuthError as exc:
            raise DeployError(f"could not get a Google ID token for {self.audience}: {exc}") from None

    def token(self) -> str:
        with self._lock:
            if self._token is None or time.time() > self._expiry - TOKEN_REFRESH_MARGIN_S:
                self._token = self._fetch()  # type: ignore[operator]
                self._expiry = self._expiry_of(self._token)
            return self._token

    def sign(self, method: str, url: str, headers: Mapping[str, str], body: bytes) -> dict[str, str]:
        return {**headers, "Authorization": f"Bearer {self.token()}"}


def origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def signer_for(url: str, auth: str = "auto", *, region: str | None = None, service: str | None = None,
               audience: str | None = None) -> Signer:
    """The signer for `url` (see the module docstring for `auto`)."""
    if auth not in AUTH_CHOICES:
        raise DeployOptionError(f"--auth {auth}: choose {', '.join(AUTH_CHOICES)}")
    host = urlsplit(url).hostname or ""
    if auth == "auto":
        if _LAMBDA_URL.search(host) or _EXECUTE_API.search(host):
            auth = "iam"
        elif host.endswith(".run.app"):
            auth = "google"
        else:
            auth = "none"
    if auth == "none":
        return NoSigner()
    if auth == "iam":
        match = _LAMBDA_URL.search(host) or _EXECUTE_API.search(host)
        detected_region = match.group(1) if match else None
        detected_service = "execute-api" if _EXECUTE_API.search(host) else "lambda"
        region = region or detected_region
        if region is None:
            import botocore.session

            region = botocore.session.get_session().get_config_variable("region")
        if not region:
            raise DeployOptionError(f"cannot tell the AWS region of {url}: pass --region")
        return SigV4Signer(region, service or detected_service)
    return GoogleIdTokenSigner(audience or origin(url))
