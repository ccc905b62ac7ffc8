"""The results file of bench/serve_vs_triton.py: medians, ratios, targets, tables and plots.

Everything is computed from the saved raw results (`<name>.json`), so a report can be rendered
again without measuring (`serve_vs_triton.py --render FILE.json`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ort_ceiling import at_batch
from servers import LABELS, TOOLKIT, TRITON

METRICS = ("throughput", "p50_us", "p90_us", "p95_us", "p99_us", "queue_us", "compute_input_us",
           "compute_infer_us", "compute_output_us", "overhead_us", "server_request_us")


@dataclass
class Point:
    """The medians over repeats of one (config, server, concurrency)."""

    concurrency: int
    repeats: int
    throughput: float
    throughput_min: float
    throughput_max: float
    p95_min: float
    p95_max: float
    p50_us: float
    p90_us: float
    p95_us: float
    p99_us: float
    queue_us: float
    compute_input_us: float
    compute_infer_us: float
    compute_output_us: float
    overhead_us: float
    server_request_us: float
    batch_size: float


def medians(runs: list[list[dict[str, Any]]]) -> dict[int, Point]:
    by_level: dict[int, list[dict[str, Any]]] = {}
    for run in runs:
        for level in run:
            by_level.setdefault(level["concurrency"], []).append(level)
    points = {}
    for concurrency, levels in sorted(by_level.items()):
        values = {m: statistics.median(level[m] for level in levels) for m in METRICS}
        batches = [l["inference_count"] / l["execution_count"] for l in levels if l.get("execution_count")]
        points[concurrency] = Point(
            concurrency=concurrency,
            repeats=len(levels),
            throughput_min=min(l["throughput"] for l in levels),
            throughput_max=max(l["throughput"] for l in levels),
            p95_min=min(l["p95_us"] for l in levels),
            p95_max=max(l["p95_us"] for l in levels),
            batch_size=statistics.median(batches) if batches else 0.0,
            **values,
        )
    return points


def _ms(us: float) -> str:
    return f"{us / 1000:.1f}" if us >= 1000 else f"{us / 1000:.2f}"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b else "n/a"


# --- targets --------------------------------------------------------------------------------------


@dataclass
class Target:
    name: str
    measured: str
    met: bool | None  # None: reported, no threshold
    reason: str = ""  # for a target not met: what the measurements say about why


# The seeds' numbers for the guide's text_recognition (001: Triton tutorial part 2, A100, c16 infer/s):
# (1) no batching 1 instance, (2) dynamic batching, (T) dynamic batching + 2 instances.
SEEDS_C16 = {"1": 975.048, "2": 3187.76, "T": 4134.09}


def _server_targets(name: str, model: dict[str, Any], keys: tuple[str, ...], at: int) -> list[Target]:
    """Throughput >= Triton's, p95 <= Triton's and >= 90 % of the raw ceiling, per config."""
    found: list[Target] = []
    for key in keys:
        runs = model["runs"].get(key)
        if not runs or TOOLKIT not in runs or TRITON not in runs:
            continue
        ours = medians(runs[TOOLKIT]).get(at)
        theirs = medians(runs[TRITON]).get(at)
        if ours is None or theirs is None:
            continue
        ratio = ours.throughput / theirs.throughput
        why = _model_bound(model, key, ours, theirs)
        found.append(Target(
            f"{name} config ({key}) c{at}: throughput >= 1.0x Triton's",
            f"{ours.throughput:.1f} vs {theirs.throughput:.1f} infer/s = {ratio:.3f}x", ratio >= 1.0,
            "" if ratio >= 1.0 else why))
        found.append(Target(
            f"{name} config ({key}) c{at}: p95 <= Triton's",
            f"{_ms(ours.p95_us)} vs {_ms(theirs.p95_us)} ms = {ours.p95_us / theirs.p95_us:.3f}x",
            ours.p95_us <= theirs.p95_us, "" if ours.p95_us <= theirs.p95_us else why))
        ceiling = ceiling_for(model, key, ours.batch_size) if model.get("ceiling") else None
        if ceiling:
            share = ours.throughput / ceiling
            found.append(Target(
                f"{name} config ({key}) c{at}: >= 90 % of the raw ORT ceiling",
                f"{ours.throughput:.1f} / {ceiling:.1f} infer/s (ORT alone at batch {ours.batch_size:.1f}, "
                f"{config(model, key)['instances']} instance(s)) = {100 * share:.1f} %", share >= 0.9))
    return found


def _throughput(model: dict[str, Any], key: str, server: str, at: int) -> float | None:
    runs = model["runs"].get(key, {})
    point = medians(runs[server]).get(at) if server in runs else None
    return point.throughput if point else None


def _ratio_target(name: str, model: dict[str, Any], what: str, high: str, low: str, at: int, extra: str = "",
                  seeds: bool = False) -> Target | None:
    """A reported ratio of two configs' throughput at `at`, for both servers (and the seeds')."""
    values = {server: (_throughput(model, high, server, at), _throughput(model, low, server, at))
              for server in (TOOLKIT, TRITON)}
    if None in values[TOOLKIT]:
        return None
    ours = values[TOOLKIT][0] / values[TOOLKIT][1]
    parts = [f"toolkit {ours:.2f}x"]
    if None not in values[TRITON]:
        parts.append(f"Triton {values[TRITON][0] / values[TRITON][1]:.2f}x")
    if seeds:
        parts.append(f"the seeds' Triton on an A100 {SEEDS_C16[high] / SEEDS_C16[low]:.2f}x")
    return Target(f"{name} {what} throughput ratio c{at} (config {high} / config {low})",
                  ", ".join(parts) + (f"; {extra}" if extra else ""), None)


def targets(data: dict[str, Any]) -> list[Target]:
    found: list[Target] = []
    text = data["models"].get("text_recognition")
    at = data["meta"]["target_concurrency"]
    if text:
        found.extend(_server_targets("text_recognition", text, ("2", "3"), at))
        ratio = _ratio_target("text_recognition", text, "batching on/off", "2", "1", at,
                              f"the model's own batch-scaling limit: {batch_scaling(text)}")
        if ratio:
            found.append(ratio)
    full = data["models"].get("text_recognition_full")
    if full:
        found.extend(_server_targets("text_recognition_full (the guide's config)", full, ("T",), at))
        for what, high, low, extra in (
                ("batching on/off", "2", "1", f"the model's own batch-scaling limit: {batch_scaling(full)}"),
                ("2 vs 1 instance(s)", "T", "2", "")):
            ratio = _ratio_target("text_recognition_full", full, what, high, low, at, extra, seeds=True)
            if ratio:
                found.append(ratio)
    tiny = data["models"].get("tiny")
    grpc = data["meta"].get("protocol") == "grpc"
    floor = 0.8 if grpc else 0.5  # issue 14 asks 0.8x over gRPC
    stack = ("grpcio's server (its C-core poller's wake-ups and socket writes on the event loop thread)" if grpc
             else "the Python HTTP stack and event loop")
    if tiny:
        for key, runs in tiny["runs"].items():
            if TOOLKIT not in runs or TRITON not in runs:
                continue
            ours, theirs = medians(runs[TOOLKIT]).get(at), medians(runs[TRITON]).get(at)
            if ours is None or theirs is None:
                continue
            ratio = ours.throughput / theirs.throughput
            found.append(Target(
                f"tiny config ({key}) c{at}: throughput >= {floor}x Triton's",
                f"{ours.throughput:.0f} vs {theirs.throughput:.0f} infer/s = {ratio:.2f}x", ratio >= floor,
                "" if ratio >= floor else f"per-request overhead of {stack} (see the profile of tiny below) against "
                "Triton's C++ frontend"))
    return found


def _overlap(low_a: float, high_a: float, low_b: float, high_b: float) -> bool:
    return low_a <= high_b and low_b <= high_a


def _model_bound(model: dict[str, Any], key: str, ours: Point, theirs: Point) -> str:
    """Why toolkit trails Triton at one point, from the measurements: how close both are to the
    raw ORT ceiling, and whether the repeats' ranges overlap (a difference within the noise)."""
    parts = []
    ours_ceiling = ceiling_for(model, key, ours.batch_size) if model.get("ceiling") else None
    theirs_ceiling = ceiling_for(model, key, theirs.batch_size) if model.get("ceiling") else None
    if ours_ceiling and theirs_ceiling:
        parts.append(f"both servers run at the model's own limit: toolkit at {100 * ours.throughput / ours_ceiling:.1f} %, "
                     f"Triton at {100 * theirs.throughput / theirs_ceiling:.1f} % of ONNX Runtime alone at their batch "
                     f"sizes ({ours.batch_size:.2f}, {theirs.batch_size:.2f}), on 2 cores shared with perf_analyzer")
    same_throughput = _overlap(ours.throughput_min, ours.throughput_max, theirs.throughput_min, theirs.throughput_max)
    same_p95 = _overlap(ours.p95_min, ours.p95_max, theirs.p95_min, theirs.p95_max)
    parts.append(
        f"the repeats' ranges {'overlap' if same_throughput else 'do not overlap'} for throughput (toolkit "
        f"{ours.throughput_min:.1f}-{ours.throughput_max:.1f}, Triton {theirs.throughput_min:.1f}-{theirs.throughput_max:.1f} "
        f"infer/s) and {'overlap' if same_p95 else 'do not overlap'} for p95 (toolkit {_ms(ours.p95_min)}-{_ms(ours.p95_max)}, "
        f"Triton {_ms(theirs.p95_min)}-{_ms(theirs.p95_max)} ms)")
    return "; ".join(parts)


def config(model: dict[str, Any], key: str) -> dict[str, Any]:
    return next(c for c in model["configs"] if c["key"] == key)


def _ceilings(model: dict[str, Any]) -> dict[tuple[int, int], float]:
    return {(int(i), int(b)): v for i, b, v in model.get("ceiling", [])}


def ceiling_for(model: dict[str, Any], key: str, batch: float) -> float | None:
    return at_batch(_ceilings(model), config(model, key)["instances"], batch)


def batch_scaling(model: dict[str, Any]) -> str:
    """ORT alone, 1 instance: inferences/s at the largest batch over the request's batch (2)."""
    ceilings = _ceilings(model)
    sizes = sorted(b for i, b in ceilings if i == 1 and ceilings[(i, b)] > 0)
    if len(sizes) < 2:
        return "n/a"
    low, high = sizes[0], sizes[-1]
    return f"{ceilings[(1, high)] / ceilings[(1, low)]:.2f}x (ORT alone, batch {high} vs batch {low})"


# --- plots ----------------------------------------------------------------------------------------


def plot(model_name: str, model: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, cfg in enumerate(model["configs"]):
        runs = model["runs"].get(cfg["key"], {})
        for server, style in ((TOOLKIT, "-o"), (TRITON, "--s")):
            if server not in runs:
                continue
            points = medians(runs[server])
            xs = sorted(points)
            label = f"({cfg['key']}) {cfg['title']} - {LABELS[server]}"
            colour = colours[index % len(colours)]
            left.plot(xs, [points[x].throughput for x in xs], style, color=colour, label=label, markersize=4)
            right.plot(xs, [points[x].p95_us / 1000 for x in xs], style, color=colour, label=label, markersize=4)
    left.set_title(f"{model_name}: throughput vs concurrency")
    left.set_xlabel("concurrency (requests in flight, -b 2)")
    left.set_ylabel("infer/s (median of repeats)")
    right.set_title(f"{model_name}: p95 latency vs concurrency")
    right.set_xlabel("concurrency (requests in flight, -b 2)")
    right.set_ylabel("p95 latency, ms (median of repeats)")
    for axis in (left, right):
        axis.grid(True, alpha=0.3)
        axis.set_ylim(bottom=0)
    handles, labels = left.get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    figure.tight_layout(rect=(0, 0.08 + 0.025 * ((len(labels) + 1) // 2), 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


# --- markdown -------------------------------------------------------------------------------------


def _summary_table(model: dict[str, Any], at: int) -> list[str]:
    lines = [
        f"| config | server | infer/s (min-max) | p50 ms | p95 ms | p99 ms | server queue ms | compute input ms "
        f"| compute infer ms | compute output ms | avg batch | % of ORT ceiling |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for cfg in model["configs"]:
        runs = model["runs"].get(cfg["key"], {})
        for server in (TOOLKIT, TRITON):
            if server not in runs:
                continue
            point = medians(runs[server]).get(at)
            if point is None:
                continue
            ceiling = ceiling_for(model, cfg["key"], point.batch_size) if model.get("ceiling") else None
            share = f"{100 * point.throughput / ceiling:.1f} %" if ceiling else "n/a"
            lines.append(
                f"| ({cfg['key']}) {cfg['title']} | {LABELS[server]} | {point.throughput:.1f} "
                f"({point.throughput_min:.1f}-{point.throughput_max:.1f}) | {_ms(point.p50_us)} | {_ms(point.p95_us)} "
                f"| {_ms(point.p99_us)} | {_ms(point.queue_us)} | {_ms(point.compute_input_us)} "
                f"| {_ms(point.compute_infer_us)} | {_ms(point.compute_output_us)} | {point.batch_size:.2f} | {share} |"
            )
    return lines


def _ratio_table(model: dict[str, Any]) -> list[str]:
    lines = ["| config | concurrency | toolkit infer/s | Triton infer/s | throughput ratio | toolkit p95 ms "
             "| Triton p95 ms | p95 ratio | toolkit avg batch | Triton avg batch |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for cfg in model["configs"]:
        runs = model["runs"].get(cfg["key"], {})
        if TOOLKIT not in runs or TRITON not in runs:
            continue
        ours, theirs = medians(runs[TOOLKIT]), medians(runs[TRITON])
        for c in sorted(set(ours) & set(theirs)):
            a, b = ours[c], theirs[c]
            lines.append(
                f"| ({cfg['key']}) | {c} | {a.throughput:.1f} | {b.throughput:.1f} | {_ratio(a.throughput, b.throughput)} "
                f"| {_ms(a.p95_us)} | {_ms(b.p95_us)} | {_ratio(a.p95_us, b.p95_us)} | {a.batch_size:.2f} "
                f"| {b.batch_size:.2f} |"
            )
    return lines


def _ceiling_table(model: dict[str, Any]) -> list[str]:
    ceilings = _ceilings(model)
    if not ceilings:
        return []
    sizes = sorted({b for _, b in ceilings})
    counts = sorted({i for i, _ in ceilings})
    lines = ["| instances | " + " | ".join(f"batch {b}" for b in sizes) + " |",
             "|---|" + "---|" * len(sizes)]
    for count in counts:
        cells = [f"{ceilings[(count, b)]:.1f}" if (count, b) in ceilings else "" for b in sizes]
        lines.append(f"| {count} | " + " | ".join(cells) + " |")
    return lines


def _bullets(out: list[str], heading: str, items: list[str]) -> None:
    """A heading line and a bulleted list, when there is anything to list."""
    if items:
        out.extend([heading, "", *(f"- {item}" for item in items), ""])


def _loosened(data: dict[str, Any]) -> list[str]:
    """The levels measured with more than the smallest stability percentage used."""
    found = []
    levels = [(name, key, server, level) for name, model in data["models"].items()
              for key, runs in model["runs"].items() for server, repeats in runs.items()
              for run in repeats for level in run]
    asked = min((level.get("stability", 0) for *_, level in levels), default=0)
    for name, key, server, level in levels:
        if level.get("stability", 0) > asked:
            found.append(f"{name} ({key}) {LABELS[server]} c{level['concurrency']}: {level['stability']} %")
    return found


def render(data: dict[str, Any], markdown_path: Path) -> Path:
    meta = data["meta"]
    at = meta["target_concurrency"]
    stem = markdown_path.with_suffix("")
    out: list[str] = []
    protocol = " over gRPC" if meta.get("protocol") == "grpc" else ""
    out.append(f"# toolkit serve vs Triton{protocol}: dynamic batching and instance groups ({meta['date']}, {meta['host']})")
    out.append("")
    out.append(f"Produced by `{meta['command']}` in {meta['duration_min']:.0f} min.")
    out.append("")
    out.append("## Setup")
    out.append("")
    for key, value in meta["setup"].items():
        out.append(f"- **{key}**: {value}")
    out.append("")
    out.append("## Targets")
    out.append("")
    out.append("| target | measured (medians) | met |")
    out.append("|---|---|---|")
    found = targets(data)
    for target in found:
        verdict = "n/a (reported)" if target.met is None else ("**yes**" if target.met else "**NO**")
        out.append(f"| {target.name} | {target.measured} | {verdict} |")
    out.append("")
    _bullets(out, "Targets not met, and what the measurements say about why (the profile is at the end):",
             [f"{t.name}: {t.reason}." for t in found if t.met is False and t.reason])
    for name, model in data["models"].items():
        out.append(f"## {name}")
        out.append("")
        out.append(model["description"])
        out.append("")
        image = plot(name, model, Path(f"{stem}-{name}.png"))
        out.append(f"![{name}: throughput and p95 latency vs concurrency]({image.name})")
        out.append("")
        out.append(f"### At concurrency {at}")
        out.append("")
        out.append("Medians of the repeats (throughput range in brackets); the server columns are the server-side "
                   "averages perf_analyzer reads from each server's statistics extension.")
        out.append("")
        out.extend(_summary_table(model, at))
        out.append("")
        out.append("### Every concurrency level, side by side")
        out.append("")
        out.extend(_ratio_table(model))
        out.append("")
        if model.get("ceiling"):
            out.append("### Raw ONNX Runtime ceiling (in-process, no server, no client; inferences/s)")
            out.append("")
            out.append(model.get("ceiling_note", ""))
            out.append("")
            out.extend(_ceiling_table(model))
            out.append("")
            out.append(f"Batch-scaling limit of the model: {batch_scaling(model)}.")
            out.append("")
        if model.get("plans"):
            out.append("### toolkit serve's CPU budget (handlers/cpu_budget.py, as it plans at startup)")
            out.append("")
            for key, lines in model["plans"].items():
                out.append(f"({key}):")
                out.append("")
                out.extend(f"    {line}" for line in lines)
                out.append("")
    if data.get("profiles"):
        out.append("## Profile of toolkit serve under load")
        out.append("")
        for title, text in data["profiles"].items():
            out.append(f"### {title}")
            out.append("")
            out.append(text)
            out.append("")
    loosened = _loosened(data)
    notes = list(data.get("notes", [])) + ([
        "perf_analyzer could not stabilise these levels within its trials at the asked stability and they were "
        "measured again alone with a looser one (`stability` in the raw .json): " + "; ".join(loosened)
    ] if loosened else [])
    _bullets(out, "## Notes", notes)
    markdown_path.write_text("\n".join(out))
    return markdown_path
