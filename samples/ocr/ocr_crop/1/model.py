"""ocr_crop: the detection probability map + the image -> one recognition batch of text lines.

Inputs: PROB_MAP (FP32 [1, 1, H, W], DBNet's text probability per DET_INPUT pixel), ORIGINAL
(UINT8 [h, w, 3], BGR) and IMAGE_WINDOW (FP32 [4]: top, left, bottom, right of ORIGINAL in the map).
Outputs:
- REC_INPUT (FP32 [N, 3, 48, W]): the text lines, each cropped from ORIGINAL, resized to height
  48 keeping its aspect ratio, BGR scaled to [-1, 1], right-padded with zeros to the common width
  W (at least 320, a multiple of 32); in reading order (top to bottom, left to right);
- BOXES (INT32 [N, 4]): each line's x0, y0, x1, y1 in ORIGINAL pixels (x1, y1 exclusive).
With no text, BOXES is [0, 4] and REC_INPUT holds one blank line, because an ensemble always runs
every step (the decoder drops it).

DB post-processing as PaddleOCR / rapidocr 3.10 (DBPostProcess; numbers from rapidocr's
config.yaml, each a config `parameters` entry): binarise at `thresh`, dilate with a 2x2 kernel,
take the 8-connected components (at most `max_candidates`), keep those whose mean probability over
their box reaches `box_thresh` and whose box is at least 3 pixels on its short side, expand each
box by area * `unclip_ratio` / perimeter on every side, map it to ORIGINAL. Boxes are axis-aligned
(this sample reads horizontal text; rapidocr fits rotated rectangles with OpenCV): what is
recognised is the same for horizontal lines. A line at least 1.5 times taller than wide is
rotated 90 degrees counter-clockwise, as rapidocr does for vertical text.

Pure numpy + Pillow (no OpenCV, no SciPy): components are labelled over the horizontal runs of
the mask, so the work grows with the number of runs, not pixels.
"""

from __future__ import annotations

import json
import math

import numpy as np
import triton_python_backend_utils as pb_utils
from PIL import Image

REC_HEIGHT = 48
MIN_REC_WIDTH = 320  # rapidocr's rec_img_shape [3, 48, 320]
DEFAULTS = {
    "thresh": "0.3",
    "box_thresh": "0.5",
    "unclip_ratio": "1.6",
    "use_dilation": "true",
    "max_candidates": "1000",
    # text_recognition's max_batch_size: an image with more lines is refused, never truncated
    "max_text_lines": "64",
}
MIN_SIZE = 3


class TooManyLines(Exception):
    pass


def _parameters(config: dict) -> dict[str, str]:
    given = {key: value.get("string_value", "") for key, value in config.get("parameters", {}).items()}
    return {key: given.get(key, default) for key, default in DEFAULTS.items()}


def dilate(mask: np.ndarray) -> np.ndarray:
    """cv2.dilate with a 2x2 kernel (anchor at its centre): out[y, x] = max(mask[y-1:y+1, x-1:x+1])."""
    out = mask.copy()
    out[1:, :] |= mask[:-1, :]
    wide = out.copy()
    wide[:, 1:] |= out[:, :-1]
    return wide


def runs(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The horizontal runs of True: (row, first column, last column), sorted by row then column."""
    height, width = mask.shape
    padded = np.zeros((height, width + 2), dtype=np.int8)
    padded[:, 1:-1] = mask
    edges = np.diff(padded, axis=1)
    start_rows, starts = np.nonzero(edges == 1)
    _, ends = np.nonzero(edges == -1)
    return start_rows, starts, ends - 1


def components(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """8-connected components of `mask`: per run (row, start, end) its component label 0..n-1."""
    rows, starts, ends = runs(mask)
    count = rows.size
    if count == 0:
        return rows, starts, ends, np.zeros(0, dtype=np.int64), 0
    width = mask.shape[1] + 2
    # Runs of row r touch runs of row r-1 whose span overlaps [start - 1, end + 1]. Runs are sorted
    # by (row, column), so the candidates of each run form one contiguous index range, found by
    # binary search on the key row * width + column.
    end_keys = rows * width + ends
    start_keys = rows * width + starts
    lo = np.searchsorted(end_keys, (rows - 1) * width + starts - 1, side="left")
    hi = np.searchsorted(start_keys, (rows - 1) * width + ends + 1, side="right")
    lo = np.maximum(lo, np.searchsorted(rows, rows - 1, side="left"))
    hi = np.minimum(hi, np.searchsorted(rows, rows - 1, side="right"))
    spans = np.maximum(hi - lo, 0)
    a = np.repeat(np.arange(count), spans)
    b = np.repeat(lo, spans) + (np.arange(spans.sum()) - np.repeat(np.cumsum(spans) - spans, spans))
    # Union-find, vectorised: hook the larger root of every edge whose ends have different roots
    # onto the smaller one, then point every run at its root; a few rounds even for spirals.
    labels = np.arange(count)
    while True:
        root_a, root_b = labels[a], labels[b]
        differ = root_a != root_b
        if not differ.any():
            break
        root_a, root_b = root_a[differ], root_b[differ]
        np.minimum.at(labels, np.maximum(root_a, root_b), np.minimum(root_a, root_b))
        while True:
            jumped = labels[labels]
            if np.array_equal(jumped, labels):
                break
            labels = jumped
    _, labels = np.unique(labels, return_inverse=True)
    return rows, starts, ends, labels, int(labels.max()) + 1


def boxes_from_map(prob: np.ndarray, params: dict[str, str]) -> list[tuple[float, float, float, float, float]]:
    """DBPostProcess.boxes_from_bitmap, axis-aligned: (x0, y0, x1, y1, score) in map pixels."""
    thresh = float(params["thresh"])
    box_thresh = float(params["box_thresh"])
    unclip_ratio = float(params["unclip_ratio"])
    mask = prob > thresh
    if params["use_dilation"].strip().lower() in ("1", "true", "yes", "on"):
        mask = dilate(mask)
    rows, starts, ends, labels, n = components(mask)
    if n == 0:
        return []
    x0 = np.full(n, np.iinfo(np.int64).max)
    y0 = np.full(n, np.iinfo(np.int64).max)
    x1 = np.full(n, -1)
    y1 = np.full(n, -1)
    np.minimum.at(x0, labels, starts)
    np.minimum.at(y0, labels, rows)
    np.maximum.at(x1, labels, ends)
    np.maximum.at(y1, labels, rows)
    # cv2.findContours lists contours from the bottom of the image up; keep the same candidates
    order = np.argsort(-y0, kind="stable")[: int(params["max_candidates"])]
    found = []
    for i in order:
        bx0, by0, bx1, by1 = int(x0[i]), int(y0[i]), int(x1[i]), int(y1[i])
        if min(bx1 - bx0, by1 - by0) < MIN_SIZE:
            continue
        score = float(prob[by0 : by1 + 1, bx0 : bx1 + 1].mean(dtype=np.float64))  # box_score_fast
        if score < box_thresh:
            continue
        w, h = bx1 - bx0, by1 - by0
        distance = w * h * unclip_ratio / (2.0 * (w + h))
        if min(w, h) + 2 * distance < MIN_SIZE + 2:
            continue
        found.append((bx0 - distance, by0 - distance, bx1 + distance, by1 + distance, score))
    return found


def to_original(found, window: np.ndarray, map_shape: tuple[int, int], image_shape: tuple[int, int]) -> np.ndarray:
    """Boxes in ORIGINAL pixels, [x0, y0, x1, y1) clipped to the image, tiny ones dropped."""
    height, width = image_shape
    top, left, bottom, right = (float(v) for v in window)
    if not (bottom > top and right > left):  # no window: the map covers the image
        top, left, bottom, right = 0.0, 0.0, float(map_shape[0]), float(map_shape[1])
    sx, sy = width / (right - left), height / (bottom - top)
    out = []
    for bx0, by0, bx1, by1, _ in found:
        x0 = int(np.clip(round((bx0 - left) * sx), 0, width - 1))
        x1 = int(np.clip(round((bx1 - left) * sx), 0, width - 1))
        y0 = int(np.clip(round((by0 - top) * sy), 0, height - 1))
        y1 = int(np.clip(round((by1 - top) * sy), 0, height - 1))
        if x1 - x0 <= 3 or y1 - y0 <= 3:
            continue
        out.append((x0, y0, x1, y1))
    return np.array(out, dtype=np.int32).reshape(-1, 4)


def reading_order(boxes: np.ndarray) -> np.ndarray:
    """Top to bottom, then left to right within a line: a box belongs to the line of the box that
    opened it when its vertical centre lies within that box's height."""
    if len(boxes) == 0:
        return boxes
    by_top = boxes[np.argsort(boxes[:, 1], kind="stable")]
    lines: list[list[np.ndarray]] = []
    for box in by_top:
        centre = (box[1] + box[3]) / 2
        if lines and lines[-1][0][1] <= centre < lines[-1][0][3]:
            lines[-1].append(box)
        else:
            lines.append([box])
    return np.array([box for line in lines for box in sorted(line, key=lambda b: int(b[0]))], dtype=np.int32)


def recognition_batch(image: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """Crops of the lines, height 48, BGR in [-1, 1], zero-padded to one width."""
    crops = []
    for x0, y0, x1, y1 in boxes:
        crop = image[y0:y1, x0:x1]
        if crop.shape[0] >= 1.5 * crop.shape[1]:
            crop = np.rot90(crop)
        crops.append(crop)
    widths = [min(math.ceil(REC_HEIGHT * c.shape[1] / c.shape[0]), 1 << 15) for c in crops]
    batch_width = max([MIN_REC_WIDTH, *widths])
    batch_width = (batch_width + 31) // 32 * 32
    batch = np.zeros((max(1, len(crops)), 3, REC_HEIGHT, batch_width), dtype=np.float32)
    for i, (crop, width) in enumerate(zip(crops, widths)):
        resized = np.asarray(Image.fromarray(np.ascontiguousarray(crop)).resize((width, REC_HEIGHT), Image.BILINEAR))
        planes = resized.transpose(2, 0, 1)  # already BGR
        np.multiply(planes, np.float32(2.0 / 255.0), out=batch[i, :, :, :width], casting="unsafe")
        batch[i, :, :, :width] -= np.float32(1.0)
    return batch


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        self.params = _parameters(json.loads(args["model_config"]))
        self.max_lines = int(self.params["max_text_lines"])

    def _one(self, request) -> list:
        prob = pb_utils.get_input_tensor_by_name(request, "PROB_MAP").as_numpy()
        image = pb_utils.get_input_tensor_by_name(request, "ORIGINAL").as_numpy()
        window = pb_utils.get_input_tensor_by_name(request, "IMAGE_WINDOW").as_numpy().reshape(-1)
        prob = prob.reshape(prob.shape[-2:])
        found = boxes_from_map(prob, self.params)
        boxes = reading_order(to_original(found, window, prob.shape, image.shape[:2]))
        if len(boxes) > self.max_lines:
            raise TooManyLines(
                f"the image holds {len(boxes)} text lines; this pipeline reads at most {self.max_lines} per "
                "image (parameter max_text_lines of ocr_crop, at most text_recognition's max_batch_size)"
            )
        return [
            pb_utils.Tensor("REC_INPUT", recognition_batch(image, boxes)),
            pb_utils.Tensor("BOXES", boxes),
        ]

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            try:
                responses.append(pb_utils.InferenceResponse(output_tensors=self._one(request)))
            except TooManyLines as exc:
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
        return responses
