"""ocr_preprocess: an encoded image -> the input of the text-detection model (DBNet).

IMAGE (BYTES [1]): one image file as the client sent it (PNG, JPEG, anything Pillow decodes).
Outputs:
- DET_INPUT (FP32 [1, 3, H, W]): the image in BGR channel order (the PP-OCR models were trained
  on OpenCV's BGR), scaled to [-1, 1], H and W multiples of 32;
- ORIGINAL (UINT8 [h, w, 3]): the decoded image, BGR, at its own resolution; text lines are cropped
  from it;
- IMAGE_WINDOW (FP32 [4]): top, left, bottom, right of ORIGINAL inside DET_INPUT (in DET_INPUT
  pixels): very wide or very short images are padded above and below.

Geometry as rapidocr 3.10 (config.yaml, main.py) prepares an image for PP-OCRv6 detection, in one
resampling instead of three: (1) if a side exceeds `max_side_len` the image is scaled down, (2) if
a side is under `min_side_len` it is scaled up (each to multiples of 32); (3) an image wider than
`width_height_ratio` times its height, or not taller than `min_height`, gets black bands above and
below; (4) DetResizeForTest: with `limit_type` "min" the shorter side is scaled up to
`limit_side_len` when shorter (with "max" the longer side down to it), to multiples of 32; (5) a
side above `max_side_limit` is scaled down to it. Every number is a config `parameters` entry
(string values). Defaults are rapidocr's, except (4) and (5), which are PaddleOCR 3's OCR
pipeline defaults (64, "min", 4000): rapidocr scales the shorter side up to 736, which on small
images (a rendered line of text) splits words apart and makes detection 3-5x slower, for no
gain measured on documents (samples/ocr/README.md).
"""

from __future__ import annotations

import io
import json
import math
import warnings

import numpy as np
import triton_python_backend_utils as pb_utils
from PIL import Image, ImageOps, UnidentifiedImageError

DEFAULTS = {
    "min_side_len": "30",
    "max_side_len": "2000",
    "width_height_ratio": "8",
    "min_height": "30",
    "limit_side_len": "64",
    "limit_type": "min",
    "max_side_limit": "4000",
    # refuse larger images before decoding them (a 10 000 x 10 000 image is 100 M pixels)
    "max_pixels": "50000000",
}


class ImageRejected(Exception):
    """The request's image cannot be used (INVALID_ARG)."""


def _round32(value: float) -> int:
    return max(32, int(round(value / 32) * 32))


def _parameters(config: dict) -> dict[str, str]:
    given = {key: value.get("string_value", "") for key, value in config.get("parameters", {}).items()}
    return {key: given.get(key, default) for key, default in DEFAULTS.items()}


def decode(data: bytes, max_pixels: int) -> Image.Image:
    """The image as RGB, EXIF orientation applied, transparency composited onto white."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > max_pixels:
                raise ImageRejected(
                    f"image of {width}x{height} pixels is larger than this model accepts ({max_pixels} pixels)"
                )
            image.load()
            image = ImageOps.exif_transpose(image)
    except ImageRejected:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ImageRejected(f"image rejected: {exc}") from None
    except UnidentifiedImageError:
        raise ImageRejected("IMAGE is not a decodable image (not a format Pillow reads)") from None
    except Exception as exc:  # Pillow raises many types for broken files
        raise ImageRejected(f"IMAGE is not a decodable image ({type(exc).__name__}: {exc})") from None
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        image = Image.alpha_composite(background, rgba)
    return image.convert("RGB")


class Geometry:
    """Where the image goes in the detection input (see the module docstring)."""

    def __init__(self, params: dict[str, str]) -> None:
        self.min_side_len = float(params["min_side_len"])
        self.max_side_len = float(params["max_side_len"])
        self.width_height_ratio = float(params["width_height_ratio"])
        self.min_height = float(params["min_height"])
        self.limit_side_len = float(params["limit_side_len"])
        self.limit_type = params["limit_type"]
        if self.limit_type not in ("min", "max"):
            raise ValueError(f"limit_type must be 'min' or 'max', not '{self.limit_type}'")
        self.max_side_limit = float(params["max_side_limit"])

    def layout(self, width: int, height: int) -> tuple[int, int, int, int]:
        """(det width, det height, top, height) in detection pixels: the detection input's size,
        and the rows the image fills (it spans the whole width; black bands above and below)."""
        w, h = float(width), float(height)
        # (1) and (2): resize_image_within_bounds
        if max(w, h) > self.max_side_len:
            ratio = self.max_side_len / max(w, h)
            w, h = _round32(int(w * ratio)), _round32(int(h * ratio))
        if min(w, h) < self.min_side_len:
            ratio = self.min_side_len / min(w, h)
            w, h = _round32(int(w * ratio)), _round32(int(h * ratio))
        # (3): apply_vertical_padding
        pad = 0.0
        if h <= self.min_height or w / h > self.width_height_ratio:
            padded = max(int(w / self.width_height_ratio), self.min_height) * 2
            pad = float(int(abs(padded - h) / 2))
        total_h = h + 2 * pad
        # (4): DetResizeForTest
        if self.limit_type == "min":
            ratio = self.limit_side_len / min(w, total_h) if min(w, total_h) < self.limit_side_len else 1.0
        else:
            ratio = self.limit_side_len / max(w, total_h) if max(w, total_h) > self.limit_side_len else 1.0
        det_w, det_h = _round32(int(w * ratio)), _round32(int(total_h * ratio))
        # (5): max_side_limit
        if max(det_w, det_h) > self.max_side_limit:
            ratio = self.max_side_limit / max(det_w, det_h)
            det_w, det_h = _round32(int(det_w * ratio)), _round32(int(det_h * ratio))
        scale_y = det_h / total_h
        top = int(round(pad * scale_y))
        content_h = max(1, min(det_h - top, int(round(h * scale_y))))
        return det_w, det_h, top, content_h


def detection_input(image: Image.Image, geometry: Geometry) -> tuple[np.ndarray, np.ndarray]:
    """(DET_INPUT, IMAGE_WINDOW) for an RGB image."""
    det_w, det_h, top, content_h = geometry.layout(*image.size)
    resized = np.asarray(image.resize((det_w, content_h), Image.BILINEAR))
    det = np.full((1, 3, det_h, det_w), -1.0, dtype=np.float32)  # black: (0 / 255 - 0.5) / 0.5
    # BGR planes, (x / 255 - 0.5) / 0.5
    chw = resized[:, :, ::-1].transpose(2, 0, 1)
    content = det[0, :, top : top + content_h, :]
    np.multiply(chw, np.float32(2.0 / 255.0), out=content, casting="unsafe")
    content -= np.float32(1.0)
    window = np.array([top, 0, top + content_h, det_w], dtype=np.float32)
    return det, window


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        params = _parameters(json.loads(args["model_config"]))
        self.geometry = Geometry(params)
        self.max_pixels = int(params["max_pixels"])

    def _one(self, request) -> list:
        images = pb_utils.get_input_tensor_by_name(request, "IMAGE").as_numpy().reshape(-1)
        if images.size != 1:
            raise ImageRejected(f"IMAGE must hold exactly one encoded image, got {images.size}")
        data = images[0]
        if isinstance(data, str):
            data = data.encode("utf-8")
        image = decode(bytes(data), self.max_pixels)
        det, window = detection_input(image, self.geometry)
        original = np.ascontiguousarray(np.asarray(image)[:, :, ::-1])
        return [
            pb_utils.Tensor("DET_INPUT", det),
            pb_utils.Tensor("ORIGINAL", original),
            pb_utils.Tensor("IMAGE_WINDOW", window),
        ]

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._one(request)))
            except ImageRejected as exc:
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
        return responses
