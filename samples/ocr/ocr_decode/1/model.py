"""ocr_decode: CTC greedy decoding of the recognition scores -> the text of each line.

Inputs: REC_OUTPUT (FP32 [N, T, C], the recognition model's per-step class probabilities) and
BOXES (INT32 [L, 4] from ocr_crop; L <= N: the lines that are real, the rest is padding).
Outputs, one entry per line that was read, in reading order:
- TEXT (BYTES [K]): the line's text, UTF-8;
- SCORE (FP32 [K]): the mean probability of its characters;
- BOX (INT32 [K, 4]): its x0, y0, x1, y1 in the image's pixels.

Decoding as PaddleOCR's CTCLabelDecode: the best class per time step, repeats collapsed, blanks
dropped. Classes: 0 is the CTC blank, 1..C-2 the characters of `characters.txt` (the model's own
list, written by samples/ocr/prepare.py from its ONNX metadata), C-1 a space. As rapidocr, lines
that read as nothing but whitespace, or score under `text_score` (a config parameter, default 0.5),
are left out.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

CHARACTERS_FILE = "characters.txt"


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        params = {key: value.get("string_value", "") for key, value in config.get("parameters", {}).items()}
        self.text_score = float(params.get("text_score", "0.5"))
        path = Path(args["model_repository"]) / args["model_version"] / CHARACTERS_FILE
        if not path.is_file():
            raise pb_utils.TritonModelException(f"{path} is missing: run samples/ocr/prepare.py")
        characters = path.read_text(encoding="utf-8").split("\n")
        if characters and characters[-1] == "":
            characters.pop()
        # class index -> text: blank, the dictionary, a space
        self.classes = np.array(["", *characters, " "], dtype=object)

    def decode(self, scores: np.ndarray, lines: int) -> tuple[list[str], list[float]]:
        if scores.shape[-1] != len(self.classes):
            raise ValueError(
                f"REC_OUTPUT scores {scores.shape[-1]} classes, but {CHARACTERS_FILE} gives {len(self.classes)} "
                "(blank + characters + space): the dictionary does not belong to this recognition model"
            )
        best = scores[:lines].argmax(axis=2)
        probability = np.take_along_axis(scores[:lines], best[:, :, None], axis=2)[:, :, 0]
        keep = best != 0
        keep[:, 1:] &= best[:, 1:] != best[:, :-1]
        texts, confidences = [], []
        for i in range(lines):
            chosen = best[i][keep[i]]
            texts.append("".join(self.classes[chosen]))
            confidences.append(float(probability[i][keep[i]].mean()) if chosen.size else 0.0)
        return texts, confidences

    def execute(self, requests: list) -> list:
        responses = []
        for request in requests:
            scores = pb_utils.get_input_tensor_by_name(request, "REC_OUTPUT").as_numpy()
            boxes = pb_utils.get_input_tensor_by_name(request, "BOXES").as_numpy().reshape(-1, 4)
            texts, confidences = self.decode(scores, min(len(boxes), scores.shape[0]))
            kept = [i for i, (t, s) in enumerate(zip(texts, confidences)) if t.strip() and s >= self.text_score]
            text = np.array([texts[i].encode("utf-8") for i in kept], dtype=object)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("TEXT", text.reshape(len(kept))),
                        pb_utils.Tensor("SCORE", np.array([confidences[i] for i in kept], dtype=np.float32)),
                        pb_utils.Tensor("BOX", boxes[kept].astype(np.int32).reshape(len(kept), 4)),
                    ]
                )
            )
        return responses
