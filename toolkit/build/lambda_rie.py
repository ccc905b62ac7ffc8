"""AWS's Lambda Runtime Interface Emulator (RIE), pinned, cached and verified.

The RIE is the program AWS's Lambda base images carry as /usr/local/bin/aws-lambda-rie: it runs
the function's runtime as Lambda's sandbox does (init phase, then one invocation at a time over
the Lambda Runtime API) and accepts invocations on `POST /2015-03-31/functions/function/
invocations`. AWS publishes the same static binaries inside the `aws-sam-cli` wheel on PyPI
(`samcli/local/rapid/aws-lambda-rie-x86_64` and `-arm64`); that wheel is where it comes from here:

1. `pip download --no-deps --require-hashes aws-sam-cli==RIE_SAM_CLI_VERSION` (the wheel's sha256
   is pinned; pip's own index settings apply),
2. only the binary for the image's architecture is extracted and its sha256 checked,
3. it is kept in `$TOOLKIT_LAMBDA_RIE_CACHE` (default `~/.cache/toolkit/aws-lambda-rie`) and
   verified again on every use.

`TOOLKIT_LAMBDA_RIE=/path/to/aws-lambda-rie` uses that binary instead (not verified: your choice).
Stdlib only, so `python3 toolkit/build/lambda_rie.py` (prints the path) works without the toolkit
installed (scripts/tools/aws-lambda-rie runs it that way).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

RIE_SAM_CLI_VERSION = "1.170.0"
RIE_WHEEL = f"aws_sam_cli-{RIE_SAM_CLI_VERSION}-py3-none-any.whl"
RIE_WHEEL_SHA256 = "24ebaf5ecba38dc1758089968cb89ab61e124b84e92a344fc7a2771a47f4d0bf"
# architecture (as in the image's platform, linux/ARCH) -> (path in the wheel, sha256)
RIE_BINARIES = {
    "amd64": ("samcli/local/rapid/aws-lambda-rie-x86_64", "6b1e686e62ab2baf5759c412c4864276ef2a88b094fca53ec070637ccba9b9a5"),
    "arm64": ("samcli/local/rapid/aws-lambda-rie-arm64", "ec2e5d09633d853834c008b1ef264bf834b258a94d551d2b2074966494b39a21"),
}
RIE_DESCRIPTION = f"AWS Lambda RIE from aws-sam-cli {RIE_SAM_CLI_VERSION}"


class RIEError(Exception):
    """The emulator could not be fetched or verified; the message says what to do."""


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def default_cache_dir() -> Path:
    return Path(os.environ.get("TOOLKIT_LAMBDA_RIE_CACHE", "~/.cache/toolkit/aws-lambda-rie")).expanduser()


def _arch(arch: str) -> str:
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(arch, arch)
    if arch not in RIE_BINARIES:
        raise RIEError(f"AWS Lambda runs x86_64 and arm64 only; there is no emulator for '{arch}'")
    return arch


def _download_wheel(folder: Path) -> Path:
    requirements = folder / "requirements.txt"
    requirements.write_text(f"aws-sam-cli=={RIE_SAM_CLI_VERSION} --hash=sha256:{RIE_WHEEL_SHA256}\n")
    command = [
        sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--progress-bar", "off",
        "--no-deps", "--only-binary=:all:", "--require-hashes", "-r", str(requirements), "-d", str(folder),
    ]
    process = subprocess.run(command, check=False, capture_output=True, text=True)
    wheel = folder / RIE_WHEEL
    if process.returncode != 0 or not wheel.is_file():
        tail = "\n".join((process.stdout + process.stderr).strip().splitlines()[-8:])
        raise RIEError(
            f"could not download aws-sam-cli {RIE_SAM_CLI_VERSION} (it carries AWS's Lambda Runtime Interface "
            f"Emulator) with pip: {tail or 'no output'}\nor point TOOLKIT_LAMBDA_RIE at an aws-lambda-rie binary"
        )
    return wheel


def ensure_rie(arch: str = "amd64", cache_dir: Path | None = None) -> Path:
    """The path of a verified aws-lambda-rie binary for `arch` (amd64 / arm64), fetched once."""
    explicit = os.environ.get("TOOLKIT_LAMBDA_RIE")
    if explicit:
        path = Path(explicit).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise RIEError(f"TOOLKIT_LAMBDA_RIE={explicit} is not an executable file")
        return path
    arch = _arch(arch)
    member, digest = RIE_BINARIES[arch]
    folder = (cache_dir or default_cache_dir()) / RIE_SAM_CLI_VERSION
    target = folder / Path(member).name
    if target.is_file():
        if _sha256(target) == digest:
            return target
        target.unlink()  # damaged or replaced: fetch it again
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as scratch:
        wheel = _download_wheel(Path(scratch))
        with zipfile.ZipFile(wheel) as archive:
            try:
                data = archive.read(member)
            except KeyError:
                raise RIEError(f"{RIE_WHEEL} has no {member}") from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise RIEError(f"{member} in {RIE_WHEEL} does not have the pinned sha256 {digest}")
        partial = Path(scratch) / target.name
        partial.write_bytes(data)
        partial.chmod(0o755)
        os.replace(partial, target)  # atomic: parallel callers see the whole file or none
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Fetch AWS's Lambda Runtime Interface Emulator (pinned, verified)")
    parser.add_argument("--arch", default="amd64", help="amd64 (x86_64) or arm64")
    parser.add_argument("--cache-dir", type=Path, default=None, help="default: $TOOLKIT_LAMBDA_RIE_CACHE or ~/.cache/toolkit/aws-lambda-rie")
    args = parser.parse_args(argv)
    try:
        print(ensure_rie(args.arch, args.cache_dir))
    except RIEError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
