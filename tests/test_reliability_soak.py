"""Soak: many tagged requests at concurrency 64 over an ONNX model, a Python model and an ensemble.

Every request carries values only it sends (tests/test_reliability_harness.py `tagged_inputs`) and
its own request id, and its answer is checked against both: a response delivered to the wrong
request, or lost, would show. Memory (RSS of the runtime and its model processes, from /proc) is
measured after a warm-up and at the end. CI runs 10,000 requests; `bench/reliability.py soak`
runs 100,000 (docs/reliability.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from test_reliability_harness import (
    LoadReport,
    build_mixed_repository,
    compile_manifest,
    run_tagged_load,
    runtime,
)

CONCURRENCY = 64
RSS_GROWTH_LIMIT = 50 * 1024 * 1024


@dataclass
class SoakResult:
    warmup: LoadReport
    load: LoadReport
    rss_after_warmup: int
    rss_at_end: int

    @property
    def rss_growth(self) -> int:
        return self.rss_at_end - self.rss_after_warmup

    def summary(self) -> dict:
        return {
            **self.load.summary(),
            "warmup_requests": self.warmup.sent,
            "concurrency": CONCURRENCY,
            "rss_after_warmup_mb": round(self.rss_after_warmup / 2**20, 1),
            "rss_at_end_mb": round(self.rss_at_end / 2**20, 1),
            "rss_growth_mb": round(self.rss_growth / 2**20, 1),
        }


def soak(workdir: Path, requests: int, warmup: int, concurrency: int = CONCURRENCY) -> SoakResult:
    manifest = compile_manifest(build_mixed_repository(workdir / "models"))
    with runtime(manifest) as server:
        warm = run_tagged_load(server.url, range(warmup), concurrency)
        before = server.rss()
        load = run_tagged_load(server.url, range(warmup, warmup + requests), concurrency)
        after = server.rss()
        assert server.alive(), server.output()
    return SoakResult(warm, load, before, after)


def check(result: SoakResult, requests: int) -> None:
    load = result.load
    assert load.sent == requests and load.answered == requests, result.summary()
    assert load.lost == 0, (result.summary(), load.errors.most_common(5))
    assert load.mismatched == 0, load.mismatches
    assert load.ok == requests, (result.summary(), load.errors.most_common(5))
    assert result.warmup.ok == result.warmup.sent, result.warmup.summary()
    assert result.rss_growth < RSS_GROWTH_LIMIT, result.summary()


def test_soak_mixed_models_tagged_requests(tmp_path: Path) -> None:
    result = soak(tmp_path, requests=10_000, warmup=1_000)
    check(result, 10_000)
