"""The bundled OCR sample (samples/ocr) end to end: samples/ocr/prepare.py downloads the pinned
rapidocr wheel from the package index (once per cache directory: `$TOOLKIT_CACHE_DIR/samples`,
default ~/.cache/toolkit/samples) and extracts the real PP-OCRv6 weights; a real `toolkit serve`
process serves the repository; rendered images of known text go through the real
`tritonclient.http` and the exact strings must come back."""

from __future__ import annotations

import importlib.util
import io
import shutil
import subprocess
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from serving import ROOT, serve
from tritonclient.utils import InferenceServerException

SAMPLE = ROOT / "samples" / "ocr"
# prepare.py downloads the rapidocr wheel from the package index (once per cache directory)
network = pytest.mark.network
COMPOSING = ("ocr_preprocess", "text_detection", "ocr_crop", "text_recognition", "ocr_decode")


def _load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


prepare_script = _load_module(SAMPLE / "prepare.py", "ocr_sample_prepare")
client_script = _load_module(SAMPLE / "client.py", "ocr_sample_client")


def render(lines: list[str], fmt: str = "PNG", **layout) -> bytes:
    from PIL import Image

    png = client_script.render(lines, **layout)
    if fmt == "PNG":
        return png
    out = io.BytesIO()
    Image.open(io.BytesIO(png)).convert("RGB").save(out, format=fmt, quality=90)
    return out.getvalue()


def two_columns() -> bytes:
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=32)
    image = Image.new("RGB", (900, 220), "white")
    draw = ImageDraw.Draw(image)
    # the right column sits a little lower than the left one, as in real layouts
    for (x, y), text in zip([(30, 30), (500, 36), (30, 120), (500, 126)],
                            ["Left column one", "Right side text", "second row 12345", "more words here"]):
        draw.text((x, y), text, fill="black", font=font)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def prepared():
    """Runs prepare.py as a user does (downloads the wheel into the cache directory when missing)."""
    done = subprocess.run([sys.executable, str(SAMPLE / "prepare.py")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "samples/ocr is prepared" in done.stdout
    return SAMPLE


@pytest.fixture(scope="module")
def server(prepared):
    with serve(prepared, "--device", "cpu") as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    c = httpclient.InferenceServerClient(server.url, concurrency=4, network_timeout=120.0, connection_timeout=120.0)
    yield c
    c.close()


def _read(client, image: bytes) -> list[tuple[str, float, list[int]]]:
    return client_script.read_text(client, image)


@network
def test_prepare_is_idempotent_and_fast(prepared):
    started = time.perf_counter()
    assert prepare_script.prepare(prepared) == []
    assert time.perf_counter() - started < 5
    for member in prepare_script.MEMBERS:
        assert prepare_script.sha256(prepared / member.target) == member.sha256
    characters = (prepared / prepare_script.CHARACTERS).read_text(encoding="utf-8").split("\n")[:-1]
    # PaddleOCR's dictionary layout: ASCII punctuation and digits first, CJK later
    assert len(characters) == prepare_script.CHARACTER_COUNT
    assert characters[:3] == ["!", '"', "#"] and "A" in characters and "z" in characters and "中" in characters
    raw = (prepared / prepare_script.WARMUP_IMAGE).read_bytes()
    assert int.from_bytes(raw[:4], "little") == len(raw) - 4 and raw[4:12] == b"\x89PNG\r\n\x1a\n"


@network
def test_prepare_fills_a_fresh_repository_and_repairs_a_damaged_file(prepared, tmp_path):
    # from the cached wheel (the fixture downloaded it): no second download
    repo = tmp_path / "ocr"
    written = prepare_script.prepare(repo)
    assert sorted(written) == sorted([m.target for m in prepare_script.MEMBERS]
                                     + [prepare_script.CHARACTERS, prepare_script.WARMUP_IMAGE])
    detection = repo / prepare_script.MEMBERS[0].target
    detection.write_bytes(b"truncated")
    assert prepare_script.prepare(repo) == [prepare_script.MEMBERS[0].target, prepare_script.CHARACTERS]
    assert prepare_script.sha256(detection) == prepare_script.MEMBERS[0].sha256


@network
def test_toolkit_validate_accepts_the_sample(prepared):
    done = subprocess.run([sys.executable, "-m", "toolkit.cli", "validate", str(prepared), "--device", "cpu"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "6 model(s) valid" in done.stdout + done.stderr


@network
def test_reads_rendered_lines_exactly(client):
    lines = _read(client, render(["HELLO TRITON", "serverless 2026"]))
    assert [text for text, _, _ in lines] == ["HELLO TRITON", "serverless 2026"]
    (_, s1, b1), (_, s2, b2) = lines
    assert s1 > 0.9 and s2 > 0.9
    # boxes in the image's pixels, the first line above the second
    assert 0 <= b1[0] < b1[2] and 0 <= b1[1] < b1[3] <= b2[1] < b2[3]


@network
def test_statistics_show_every_composing_model_executed(client):
    before = {m["name"]: m for m in client.get_inference_statistics()["model_stats"]}
    assert [t for t, _, _ in _read(client, render(["Inference 42"], fmt="JPEG"))] == ["Inference 42"]
    after = {m["name"]: m for m in client.get_inference_statistics()["model_stats"]}
    for name in ("ocr", *COMPOSING):
        executed = after[name]["execution_count"] - before[name]["execution_count"]
        succeeded = after[name]["inference_stats"]["success"]["count"] - before[name]["inference_stats"]["success"]["count"]
        assert (executed, succeeded) == (1, 1), name


@network
def test_reading_order_is_top_to_bottom_then_left_to_right(client):
    texts = [text for text, _, _ in _read(client, two_columns())]
    assert texts == ["Left column one", "Right side text", "second row 12345", "more words here"]


@network
def test_image_without_text_reads_nothing(client):
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (320, 200), "white").save(out, format="PNG")
    assert _read(client, out.getvalue()) == []


@network
def test_undecodable_images_are_refused_with_400(client):
    png = render(["cut short"])
    for data, reason in [(b"this is not an image", "not a format Pillow reads"), (png[: len(png) // 2], "truncated")]:
        with pytest.raises(InferenceServerException) as info:
            _read(client, data)
        assert info.value.status() == "400"
        assert "IMAGE is not a decodable image" in info.value.message() and reason in info.value.message()


@network
def test_concurrent_requests_all_read_correctly(server):
    texts = [["HELLO TRITON", "serverless 2026"], ["batch one"], ["batch two"], ["second line", "third line 3"]]

    def read(lines: list[str]) -> list[str]:
        # one client per thread: a tritonclient.http client is not thread-safe
        with httpclient.InferenceServerClient(server.url, network_timeout=120.0, connection_timeout=120.0) as c:
            return [text for text, _, _ in _read(c, render(lines))]

    with ThreadPoolExecutor(len(texts)) as pool:
        assert list(pool.map(read, texts)) == texts


@pytest.fixture(scope="module")
def strict_server(prepared, tmp_path_factory):
    """The sample with tight limits: one text line per image, 100 000 pixels per image."""
    repo = tmp_path_factory.mktemp("ocr_strict") / "ocr"
    shutil.copytree(prepared, repo, ignore=shutil.ignore_patterns("*.onnx", "__pycache__"))
    for member in prepare_script.MEMBERS:
        (repo / member.target).symlink_to(prepared / member.target)
    for model, key, value in [("ocr_crop", "max_text_lines", "1"), ("ocr_preprocess", "max_pixels", "100000")]:
        config = repo / model / "config.pbtxt"
        text = config.read_text()
        line = next(l for l in text.splitlines() if f'key: "{key}"' in l)
        config.write_text(text.replace(line, f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}'))
    with serve(repo, "--device", "cpu") as s:
        yield s


@network
def test_more_lines_than_the_limit_are_refused_not_truncated(strict_server):
    with httpclient.InferenceServerClient(strict_server.url, network_timeout=120.0) as c:
        assert [t for t, _, _ in _read(c, render(["just one line"]))] == ["just one line"]
        with pytest.raises(InferenceServerException) as info:
            _read(c, render(["HELLO TRITON", "serverless 2026"]))
    assert info.value.status() == "400"
    assert "the image holds 2 text lines; this pipeline reads at most 1 per image" in info.value.message()


@network
def test_an_image_over_max_pixels_is_refused_before_decoding(strict_server):
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (400, 300), "white").save(out, format="PNG")
    with httpclient.InferenceServerClient(strict_server.url, network_timeout=120.0) as c:
        with pytest.raises(InferenceServerException) as info:
            _read(c, out.getvalue())
    assert info.value.status() == "400"
    assert "image of 400x300 pixels is larger than this model accepts (100000 pixels)" in info.value.message()


# The DB post-processing's connected components, checked against a plain flood fill.


def _flood_fill_components(mask: np.ndarray) -> np.ndarray:
    labels = np.full(mask.shape, -1)
    count = 0
    for start in zip(*np.nonzero(mask)):
        if labels[start] >= 0:
            continue
        queue = deque([start])
        labels[start] = count
        while queue:
            y, x = queue.popleft()
            for dy in (-1, 0, 1):
                for dx in (-1, 0, 1):
                    ny, nx = y + dy, x + dx
                    if 0 <= ny < mask.shape[0] and 0 <= nx < mask.shape[1] and mask[ny, nx] and labels[ny, nx] < 0:
                        labels[ny, nx] = count
                        queue.append((ny, nx))
        count += 1
    return labels


@pytest.fixture(scope="module")
def crop_model():
    from handlers.backends.python.model_runner import install_pb_utils

    install_pb_utils()
    return _load_module(SAMPLE / "ocr_crop" / "1" / "model.py", "ocr_sample_crop")


def _zigzag(height: int, width: int) -> np.ndarray:
    """One long path: columns joined alternately at the top and the bottom."""
    mask = np.zeros((height, width), dtype=bool)
    mask[:, ::2] = True
    mask[0, 1::4] = True
    mask[-1, 3::4] = True
    return mask


def test_connected_components_match_a_flood_fill(crop_model):
    rng = np.random.default_rng(7)
    masks = [rng.random(rng.integers(1, 40, 2)) < rng.uniform(0.1, 0.7) for _ in range(60)]
    masks += [_zigzag(30, 61), _zigzag(1, 9), np.zeros((5, 7), dtype=bool), np.ones((6, 3), dtype=bool)]
    for mask in masks:
        rows, starts, ends, labels, count = crop_model.components(mask)
        ours = np.full(mask.shape, -1)
        for row, start, end, label in zip(rows, starts, ends, labels):
            ours[row, start : end + 1] = label
        reference = _flood_fill_components(mask)
        assert count == reference.max() + 1
        # the same partition: each of our labels maps to exactly one reference label
        assert len(set(zip(ours[mask].tolist(), reference[mask].tolist()))) == count
        assert ((ours >= 0) == mask).all()


def test_dilation_is_opencvs_2x2(crop_model):
    mask = np.zeros((5, 5), dtype=bool)
    mask[2, 2] = True
    dilated = crop_model.dilate(mask)
    assert np.argwhere(dilated).tolist() == [[2, 2], [2, 3], [3, 2], [3, 3]]
