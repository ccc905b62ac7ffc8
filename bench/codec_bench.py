"""Microbenchmark of the v2 tensor codec (numbers are printed, never asserted).

    .venv/bin/python bench/codec_bench.py [--repeat N]

Request bodies are built by tritonclient (what users send); responses are checked by decoding
them with tritonclient's InferResult once before timing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import tritonclient.http as httpclient

from handlers.inference import InferRequest, InferResponse, RequestedOutput
from handlers.protocol import decode_request, encode_response, validate_request


def _body(inputs: list[httpclient.InferInput]) -> tuple[bytes, str | None]:
    body, header_length = httpclient.InferenceServerClient.generate_request_body(inputs)
    return body, (str(header_length) if header_length is not None else None)


def _time(label: str, fn: Callable[[], object], repeat: int) -> None:
    fn()
    rounds = []
    for _ in range(7):
        start = time.perf_counter()
        for _ in range(repeat):
            fn()
        rounds.append((time.perf_counter() - start) / repeat)
    best, median = min(rounds), statistics.median(rounds)
    print(f"{label:<58} best {best * 1e6:9.1f} us   median {median * 1e6:9.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    repeat = args.repeat

    tensor = np.random.default_rng(0).standard_normal((8, 1, 32, 100)).astype(np.float32)
    config = {
        "name": "bench",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1, 32, 100]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [1, 32, 100]}],
    }
    strings = np.array(
        [f"token-{i}-{'x' * (i % 17)}".encode() for i in range(1000)], dtype=np.object_
    ).reshape(1, 1000)
    bytes_config = {
        "name": "bench_bytes",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_STRING", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_STRING", "dims": [-1]}],
    }

    print(f"codec microbenchmark ({repeat} calls per round, best/median of 7 rounds)")
    for label, array, cfg, datatype in (
        ("FP32 [8,1,32,100]", tensor, config, "FP32"),
        ("BYTES [1,1000]", strings, bytes_config, "BYTES"),
    ):
        for binary in (True, False):
            _bench_case(label, array, cfg, datatype, binary, repeat)


def _bench_case(label: str, array: np.ndarray, cfg: dict, datatype: str, binary: bool, repeat: int) -> None:
    kind = "binary" if binary else "JSON"
    name = cfg["name"]
    item = httpclient.InferInput("INPUT0", list(array.shape), datatype)
    item.set_data_from_numpy(array, binary_data=binary)
    body, header_length = _body([item])

    def decode() -> InferRequest:
        return decode_request(body, header_length, model_name=name, model_version=1)

    _time(f"decode {label} {kind} ({len(body)} B)", decode, repeat)
    _time(f"decode+validate {label} {kind}", lambda: validate_request(cfg, decode()), repeat)

    request = decode()
    request.requested_outputs = [RequestedOutput("OUTPUT0", binary_data=binary)]
    response = InferResponse(name, 1, {"OUTPUT0": array})
    payload, headers = encode_response(response, request, cfg)
    length = headers.get("inference-header-content-length")
    result = httpclient.InferenceServerClient.parse_response_body(
        payload, header_length=int(length) if length else None
    )
    decoded = result.as_numpy("OUTPUT0")
    if datatype == "BYTES" and not binary:  # JSON BYTES come back as str
        decoded = np.vectorize(str.encode, otypes=[object])(decoded)
    assert decoded.shape == array.shape and (decoded == array).all(), "round trip failed"
    _time(
        f"encode {label} {kind} ({len(payload)} B)", lambda: encode_response(response, request, cfg), repeat
    )


if __name__ == "__main__":
    main()
