"""`toolkit tune`: measure configurations with the real runtime, pick the best under a latency
budget, estimate its cost, and write it to config.tuned.pbtxt.

See space.py for what is swept per target, load.py for the load, frontier.py for the choice and
pricing.py for the prices.
"""

from __future__ import annotations

import datetime as dt
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf.message import Message

from handlers.backends.python import INSTANCE_MODE_ENV

from .. import __version__
from ..build.targets import TARGETS
from ..repository.model_config import ModelConfig, from_triton_json, parse_config_text
from . import frontier as frontier_module
from . import load, pricing, space
from .frontier import Measurement
from .runtime import Server, candidate_repository
from .tuned_config import write_tuned

DEFAULT_CONCURRENCY = [1, 2, 4, 8, 16, 32, 64]
PERCENTILES = (50, 95, 99)


class TuneError(Exception):
    """A problem with what was asked (the message says what to change)."""


@dataclass
class TuneOptions:
    repo: Path
    model: str
    target: str = space.CLOUD_RUN
    latency_budget_ms: float | None = None
    percentile: int = 99
    device: str = "cpu"
    batch_size: int = 1
    shapes: dict[str, list[int]] = field(default_factory=dict)
    max_batch_sizes: list[int] | None = None
    instance_counts: list[int] | None = None
    queue_delays_us: list[int] | None = None
    concurrency: list[int] | None = None
    max_concurrency: int = 64
    warmup_s: float = 1.0
    window_s: float = 3.0
    memory_gib: float | None = None
    write: bool = True


@dataclass
class TuneReport:
    options: TuneOptions
    cores: int
    measurements: list[Measurement]
    frontier: list[Measurement]
    best: Measurement | None
    baseline: list[Measurement]
    tuned_path: Path | None = None
    kept_comments: bool = True
    notes: list[str] = field(default_factory=list)


class Progress:
    """What tune reports while it runs (the CLI prints it)."""

    def step(self, message: str) -> None: ...

    def measured(self, measurement: Measurement) -> None: ...


def cores() -> int:
    """The CPUs the runtime may use here, as its CPU budget counts them (affinity, cgroup quota)."""
    from handlers.cpu_budget import available_cpus

    return available_cpus().cpus


def _compile(options: TuneOptions) -> tuple[dict, Path]:
    from ..repository.compile import compile_repository
    from ..repository.errors import RepositoryError

    root = options.repo
    if "://" in str(root) or not root.is_dir():
        raise TuneError(f"'{root}' is not a local repository directory: tune writes config.tuned.pbtxt beside the "
                        "model's config.pbtxt, so it needs a local copy")
    try:
        result = compile_repository(root, [options.model], options.device)
    except (RepositoryError, ValueError) as exc:
        raise TuneError(str(exc)) from None
    failure = result.failures.get(options.model)
    if failure is not None:
        raise TuneError(f"{options.model}: {failure.message}")
    compiled = result.models[options.model]
    if compiled.backend == "ensemble":
        raise TuneError(f"'{options.model}' is an ensemble: tune its composing models one by one")
    return compiled.config, compiled.path


def _cost(options: TuneOptions, candidate: space.Candidate, level: load.Level, vcpus: int) -> pricing.Cost:
    if options.target == space.LAMBDA:
        threads = candidate.cpus or candidate.intra_op_threads or vcpus
        return pricing.lambda_cost(level.mean_ms, options.batch_size, min(threads, vcpus))
    memory = options.memory_gib if options.memory_gib is not None else 2.0 * vcpus
    return pricing.cloud_run_cost(level.throughput, options.batch_size, vcpus, memory,
                                  gpu=options.device.startswith("gpu"))


def _levels(options: TuneOptions, candidate: space.Candidate) -> list[int]:
    if options.target == space.LAMBDA:
        return [1]  # one request at a time per execution environment
    levels = options.concurrency or DEFAULT_CONCURRENCY
    return [c for c in levels if c <= options.max_concurrency] or [min(levels)]


def _measure(options: TuneOptions, candidate: space.Candidate, compiled: Message, model_dir: Path,
             body: bytes, headers: dict[str, str], work: Path, vcpus: int, progress: Progress) -> list[Measurement]:
    kind = "KIND_GPU" if options.device.startswith("gpu") else "KIND_CPU"
    config = space.apply(candidate, compiled, device_kind=kind)
    index = sum(1 for entry in work.iterdir() if entry.is_dir())
    repo = candidate_repository(model_dir, config, work / f"candidate-{index}")
    found: list[Measurement] = []
    progress.step(f"measuring {candidate.label()}")
    # python models run where the target's image runs them (unless the environment says otherwise)
    mode = {INSTANCE_MODE_ENV: os.environ.get(INSTANCE_MODE_ENV) or TARGETS[options.target].python_instance_mode}
    with Server(repo, options.device, work / f"candidate-{index}.log", cpus=candidate.cpus, env=mode) as server:
        best_throughput = 0.0
        flat = 0
        for concurrency in _levels(options, candidate):
            level = load.measure(server.url, options.model, body, headers, options.batch_size, concurrency,
                                 warmup_s=options.warmup_s, window_s=options.window_s)
            measurement = Measurement(candidate, level, _cost(options, candidate, level, vcpus))
            found.append(measurement)
            progress.measured(measurement)
            budget = options.latency_budget_ms
            if budget is not None and level.latency(options.percentile) > budget:
                break  # closed-loop latency only grows with concurrency
            if level.throughput < 1.03 * best_throughput:
                flat += 1
                if flat >= 2:
                    break  # saturated
            else:
                flat = 0
            best_throughput = max(best_throughput, level.throughput)
    return found


def _header(options: TuneOptions, report: TuneReport, chosen: Measurement) -> str:
    today = dt.date.today().isoformat()
    budget = (f"p{options.percentile} <= {options.latency_budget_ms:g} ms" if options.latency_budget_ms is not None
              else "none")
    target = "AWS Lambda" if options.target == space.LAMBDA else "Cloud Run"
    level = chosen.level
    lines = [
        f"config.tuned.pbtxt: written by `toolkit tune` (toolkit {__version__}) on {today}; config.pbtxt is unchanged.",
        f"Target {target}, latency budget {budget}, requests of batch {options.batch_size}, measured with the "
        f"real runtime on this machine ({report.cores} CPU(s), --device {options.device}).",
        f"Chosen: {chosen.candidate.label()}, at concurrency {level.concurrency}: {level.throughput:.1f} infer/s, "
        f"p50 {level.p50_ms:.1f} ms, p95 {level.p95_ms:.1f} ms, p99 {level.p99_ms:.1f} ms.",
        f"Estimated ${chosen.cost.usd_per_million:.2f} per million inferences: {chosen.cost.basis}.",
    ]
    if options.target == space.LAMBDA and chosen.candidate.cpus:
        vcpus = chosen.candidate.cpus
        lines.append(f"Give the function {pricing.lambda_memory_mb(vcpus)} MB of memory ({vcpus} vCPU(s)); the runtime's "
                     "CPU budget gives its instance that many threads.")
    if report.baseline:
        base = max(report.baseline, key=lambda m: m.level.throughput)
        lines.append(f"config.pbtxt as it is: {base.level.throughput:.1f} infer/s at concurrency "
                     f"{base.level.concurrency} (p{options.percentile} {base.latency(options.percentile):.1f} ms).")
    lines.append("Review it, then rename it to config.pbtxt to use it.")
    return "".join(f"# {line}\n" for line in lines) + "\n"


def _write(options: TuneOptions, report: TuneReport, chosen: Measurement, compiled: Message, model_dir: Path) -> None:
    original_path = model_dir / "config.pbtxt"
    original = parse_config_text(original_path.read_text(encoding="utf-8"), original_path) \
        if original_path.is_file() else ModelConfig()
    batching = compiled.max_batch_size > 0
    kind = "KIND_GPU" if options.device.startswith("gpu") else "KIND_CPU"
    tuned = space.apply(chosen.candidate, original, batching=batching, device_kind=kind)
    fields = (["max_batch_size", "dynamic_batching"] if batching else []) + ["instance_group"]
    keys = [space.INTRA_OP] if (chosen.candidate.intra_op_threads is not None or chosen.candidate.budget) \
        and not chosen.candidate.baseline else []
    if chosen.candidate.baseline:
        fields = []
    report.tuned_path, report.kept_comments = write_tuned(model_dir, tuned, fields, keys,
                                                          _header(options, report, chosen))


def run(options: TuneOptions, progress: Progress | None = None) -> TuneReport:
    progress = progress or Progress()
    if options.target not in (space.CLOUD_RUN, space.LAMBDA):
        raise TuneError(f"unknown target '{options.target}': use {space.CLOUD_RUN} or {space.LAMBDA}")
    if options.percentile not in PERCENTILES:
        raise TuneError(f"--percentile must be one of {', '.join(map(str, PERCENTILES))}")
    progress.step(f"compiling {options.model}")
    config_json, model_dir = _compile(options)
    compiled = from_triton_json(config_json)
    batch_limit = compiled.max_batch_size
    if options.batch_size < 1 or (batch_limit > 0 and options.batch_size > batch_limit):
        raise TuneError(f"--batch-size must be between 1 and the model's max_batch_size ({batch_limit})")
    if batch_limit == 0 and options.batch_size != 1:
        raise TuneError("the model does not batch (max_batch_size 0): --batch-size must be 1")
    try:
        body, headers = load.request_body(config_json, options.batch_size, options.shapes)
    except load.LoadError as exc:
        raise TuneError(str(exc)) from None
    vcpus = cores()
    report = TuneReport(options, vcpus, [], [], None, [])
    measure = lambda candidate: _measure(options, candidate, compiled, model_dir, body, headers, work,  # noqa: E731
                                         vcpus, progress)
    with tempfile.TemporaryDirectory(prefix="toolkit-tune-") as temp:
        work = Path(temp)
        report.baseline = measure(space.baseline(compiled))
        report.measurements.extend(report.baseline)
        if options.target == space.LAMBDA:
            report.notes.append(
                "AWS Lambda runs one request at a time per execution environment: the dynamic batcher never "
                "sees two requests together and a second instance never runs, so tune measures concurrency 1 "
                "and sweeps what Lambda's memory setting buys, vCPUs (the runtime runs on 1..N of this "
                "machine's CPUs, which stand in for Lambda vCPUs; its CPU budget sets the threads).")
            for candidate in space.lambda_candidates(compiled, vcpus):
                report.measurements.extend(measure(candidate))
        else:
            sizes = options.max_batch_sizes or space.default_max_batch_sizes(compiled)
            counts = options.instance_counts or space.default_instance_counts(vcpus)
            stage_one: list[Measurement] = []
            for candidate in space.stage_one(compiled, sizes, counts, vcpus):
                stage_one.extend(measure(candidate))
            report.measurements.extend(stage_one)
            leader = frontier_module.best(stage_one, options.percentile, options.latency_budget_ms, cheapest=False) \
                or frontier_module.best(stage_one, options.percentile, None, cheapest=False)
            delays = options.queue_delays_us
            if delays is None:
                budget_us = (options.latency_budget_ms or 100.0) * 1000
                delays = [d for d in (100, 1000, 5000) if d <= budget_us / 4]
            if leader is not None:
                for candidate in space.stage_two(leader.candidate, delays):
                    report.measurements.extend(measure(candidate))
            if not options.device.startswith("gpu"):
                report.notes.append(
                    f"Costs are for this machine's {vcpus} CPU(s) standing in for a Cloud Run instance's vCPUs; no "
                    "GPU was measured, so no GPU cost is given.")
        report.notes.append(f"Prices are list prices as of {pricing.PRICES_AS_OF} (toolkit/tune/pricing.py), "
                            "without free tiers or discounts.")
        report.frontier = frontier_module.frontier(report.measurements, options.percentile)
        report.best = frontier_module.best(report.measurements, options.percentile, options.latency_budget_ms,
                                           cheapest=options.target == space.LAMBDA)
        if report.best is not None and options.write:
            _write(options, report, report.best, compiled, model_dir)
    return report
