"""Reads the text of an image with the `ocr` ensemble, through tritonclient.http.

    python samples/ocr/client.py [--url 127.0.0.1:8000] [--image FILE | --text LINE ...] [--save FILE]

Without --image it renders the --text lines (default: "HELLO TRITON", "serverless 2026") black on
white with Pillow's built-in font, sends that PNG, and prints each line read with its confidence
and box. Exits 1 when a rendered text does not come back exactly.
Works against `toolkit serve samples/ocr` and against tritonserver serving the same repository.
"""

from __future__ import annotations

import argparse
import io
import sys

import numpy as np
import tritonclient.http as httpclient

DEFAULT_LINES = ("HELLO TRITON", "serverless 2026")


def render(lines: list[str] | tuple[str, ...], size: int = 40, margin: int = 24, spacing: int = 24) -> bytes:
    """A PNG of `lines`, black on white, one under the other."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=size)
    boxes = [font.getbbox(line) for line in lines]
    line_height = max(bottom for _, _, _, bottom in boxes)
    width = max(right for _, _, right, _ in boxes) + 2 * margin
    height = len(lines) * line_height + (len(lines) - 1) * spacing + 2 * margin
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    for i, line in enumerate(lines):
        draw.text((margin, margin + i * (line_height + spacing)), line, fill="black", font=font)
    png = io.BytesIO()
    image.save(png, format="PNG")
    return png.getvalue()


def read_text(client: httpclient.InferenceServerClient, image: bytes, model: str = "ocr") -> list[tuple[str, float, list[int]]]:
    """(text, confidence, [x0, y0, x1, y1]) per line, in reading order."""
    data = httpclient.InferInput("IMAGE", [1], "BYTES")
    data.set_data_from_numpy(np.array([image], dtype=object), binary_data=True)
    outputs = [httpclient.InferRequestedOutput(name, binary_data=True) for name in ("TEXT", "SCORE", "BOX")]
    result = client.infer(model, [data], outputs=outputs)
    texts = [t.decode("utf-8") for t in result.as_numpy("TEXT").reshape(-1)]
    scores = result.as_numpy("SCORE").reshape(-1).tolist()
    boxes = result.as_numpy("BOX").reshape(-1, 4).tolist()
    return list(zip(texts, scores, boxes))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="127.0.0.1:8000", help="server host:port (default: %(default)s)")
    parser.add_argument("--model", default="ocr")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--image", help="an image file to read (PNG, JPEG, ...)")
    source.add_argument("--text", nargs="+", help="lines to render and read back")
    parser.add_argument("--save", help="also write the rendered PNG here")
    args = parser.parse_args()

    expected: list[str] | None = None
    if args.image:
        with open(args.image, "rb") as f:
            image = f.read()
    else:
        expected = list(args.text or DEFAULT_LINES)
        image = render(expected)
        if args.save:
            with open(args.save, "wb") as f:
                f.write(image)
        print(f"sent: a {len(image)}-byte PNG showing {expected}")

    with httpclient.InferenceServerClient(args.url) as client:
        lines = read_text(client, image, args.model)
    print(f"read {len(lines)} line(s):")
    for text, score, box in lines:
        print(f"  {text!r:40} confidence {score:.3f}  box {box}")
    if expected is not None and [text for text, _, _ in lines] != expected:
        print(f"MISMATCH: expected {expected}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
