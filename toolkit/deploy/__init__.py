"""`toolkit deploy`, `toolkit invoke`, `toolkit proxy` and the deployment manifests.

Modules, named after what they hold:

- command: `toolkit deploy` as a request (options checked per target), dispatched to a target
- sizing: memory, concurrency and startup budget derived from a compiled repository
- aws_lambda/settings, service_settings: the function / Knative Service, checked against the
  platform's documented limits
- manifests: SAM template, Cloud Run service.yaml, Knative YAML (templates/deploy/), and
  `write_manifests()` for `toolkit build`
- from_repository: compile (and build) the repository a deploy is given
- image_source, image_archive, engine: where the image comes from and how it is pushed
- aws_lambda/, cloudrun/, knative: the deployments
- records: what was deployed where, printed and written as JSON
- signing: SigV4 (botocore) and Google ID tokens (google-auth) for private endpoints
- client_codec, invoke, proxy: v2 requests from files, and a local signing proxy
- progress, errors: how deploy code reports progress and failures

Cloud SDKs (boto3, google-auth) are imported lazily, inside the code paths that use them.
"""

from .errors import DeployError, DeployOptionError
from .manifests import write_manifests

__all__ = ["DeployError", "DeployOptionError", "write_manifests"]
