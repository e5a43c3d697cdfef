"""Where speculation stops paying: the bench's measured curve against `trtspec plan`'s prediction.

The plan predicts, from acceptance and step costs, the first batch size at which speculation is
slower than plain decoding (`stops_paying_at_batch`). A closed-loop bench at concurrency c keeps at
most c requests in the running batch, so the first level where speculation does not pay (the A/B table's
`pays`: the baseline's mean request latency over its own at most 1, bench.run.PAYS_MARGIN) is the measured
crossover. In a closed loop throughput is c over the mean latency, so the throughput ratio says the same
but for the ramp at each level's ends, which can move a ratio near 1 across it either way; latency is what a
request sees, so it decides. The plan's batch grid is powers of two, so a crossover within a factor of
two of the prediction confirms it; one further away refutes it; a curve that never crosses within
the levels measured confirms a plan that said "never" there, and cannot test one that crosses beyond.
"""

from __future__ import annotations

import json
from pathlib import Path

from trtspec.bench.results import BenchSummary


def measured_crossover(summary: BenchSummary) -> tuple[int | None, int | None]:
    """(first concurrency where A did not pay: its mean latency no better than B's, highest concurrency measured)."""
    levels = {lv.level: lv.load.concurrency for lv in summary.levels}  # None for a rate level
    crossed = [levels[row.level] for row in summary.comparison or [] if not row.pays and levels[row.level]]
    measured = [c for c in levels.values() if c]
    return (min(crossed) if crossed else None), (max(measured) if measured else None)


def plan_check(summary: BenchSummary, plan: Path) -> str | None:
    """One line saying whether the measured curve confirms the plan's crossover; None without a curve."""
    try:
        predicted = json.loads(plan.read_text(encoding="utf-8")).get("stops_paying_at_batch")
    except (OSError, ValueError, AttributeError):
        return None
    crossed, highest = measured_crossover(summary)
    if highest is None:
        return None
    said = (
        f"plan predicted speculation stops paying at batch {predicted}"
        if predicted
        else ("plan predicted speculation pays at every batch it costed")
    )
    if crossed is None and predicted is not None and predicted > highest:
        return f"{said}; measured up to concurrency {highest} without crossing: not tested that far"
    if crossed is None:
        verdict = "refuted" if predicted is not None else "confirmed"
        return f"{said}; measured: it paid at every level up to concurrency {highest} ({verdict})"
    ok = predicted is not None and predicted / 2 <= crossed <= predicted * 2
    return f"{said}; measured: it stops paying at concurrency {crossed} ({'confirmed' if ok else 'refuted'})"
