"""The throughput-latency frontier of the measured points, and the choice under a budget."""

from __future__ import annotations

from dataclasses import dataclass

from .load import Level
from .pricing import Cost
from .space import Candidate


@dataclass(frozen=True)
class Measurement:
    candidate: Candidate
    level: Level
    cost: Cost

    def latency(self, percentile: int) -> float:
        return self.level.latency(percentile)


def frontier(points: list[Measurement], percentile: int) -> list[Measurement]:
    """The Pareto-optimal points: no other point has both more throughput and less latency.
    Ordered by latency."""
    ordered = sorted(points, key=lambda m: (m.latency(percentile), -m.level.throughput))
    found: list[Measurement] = []
    for point in ordered:
        if not found or point.level.throughput > found[-1].level.throughput:
            found.append(point)
    return found


def best(points: list[Measurement], percentile: int, budget_ms: float | None, *, cheapest: bool) -> Measurement | None:
    """Within the latency budget (all points without one): the cheapest point per inference
    (`cheapest`, Lambda) or the one with the most throughput (Cloud Run), ties to the lower
    latency. None when no point is within the budget."""
    within = [p for p in points if budget_ms is None or p.latency(percentile) <= budget_ms]
    if not within:
        return None
    if cheapest:
        return min(within, key=lambda p: (p.cost.usd_per_million, p.latency(percentile)))
    return max(within, key=lambda p: (p.level.throughput, -p.latency(percentile)))
