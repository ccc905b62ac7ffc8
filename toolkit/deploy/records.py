"""Deploy records: what was deployed where, for people (a table) and for CI (a JSON file).

A record names the target, the endpoint (Function URL / service URL), the resource (function
ARN and version, Cloud Run revision, Knative service), the image by digest and the settings
applied. `toolkit deploy` writes it to `--record` (default `deploy-NAME-TARGET.json`) and prints
it; `--json` prints the same document on stdout, so scripts can do

    url=$(toolkit deploy ... --json | jq -r .url)
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .. import __version__

RECORD_FORMAT = 1


@dataclass
class DeployRecord:
    target: str  # lambda, cloudrun, knative
    name: str  # function / service name
    url: str | None  # the v2 endpoint's base URL
    auth: str  # how to call it: "AWS_IAM" (SigV4), "NONE", "google-id-token", "cluster"
    image: str  # the reference deployed, pinned by digest where the registry gave one
    image_digest: str | None
    region: str | None = None
    account: str | None = None  # AWS account id or Google Cloud project
    resource: str | None = None  # function ARN, Cloud Run service name, Knative namespace/name
    version: str | None = None  # Lambda version behind the alias, Cloud Run / Knative revision
    alias: str | None = None  # Lambda alias ARN
    settings: dict[str, Any] = field(default_factory=dict)
    manifest: str | None = None  # the rendered manifest applied (path)
    dry_run: bool = False
    deployed_at: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    toolkit_version: str = __version__
    format: int = RECORD_FORMAT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False) + "\n"

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json())
        return path

    @classmethod
    def read(cls, path: Path) -> "DeployRecord":
        return cls(**json.loads(path.read_text()))

    def rows(self) -> list[tuple[str, str]]:
        """(field, value) pairs for a table."""
        rows = [("target", self.target), ("name", self.name)]
        for label, value in (
            ("url", self.url), ("auth", self.auth), ("resource", self.resource), ("version", self.version),
            ("alias", self.alias), ("image", self.image), ("region", self.region), ("account", self.account),
        ):
            if value:
                rows.append((label, str(value)))
        return rows


def default_record_path(name: str, target: str) -> Path:
    return Path(f"deploy-{name}-{target}.json")
