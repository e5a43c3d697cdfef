"""The bench's measured crossover against the plan's prediction: confirmed, refuted, or untested."""

from __future__ import annotations

import json

import pytest

from trtspec.bench.crossover import measured_crossover, plan_check
from trtspec.bench.results import BenchSummary, Comparison, LevelSummary
from trtspec.bench.schedule import Load


def curve(ratios: dict[int, float]) -> BenchSummary:
    levels = [LevelSummary(f"concurrency={c}", Load(concurrency=c)) for c in ratios]
    rows = [
        Comparison(f"concurrency={c}", r, None, r, pays=r >= 1.0, stops_paying_here=False) for c, r in ratios.items()
    ]
    return BenchSummary("now", {"A": "a", "B": "b"}, {}, levels, True, rows)


def plan(tmp_path, batch):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"stops_paying_at_batch": batch}))
    return path


def test_the_first_level_below_one_is_the_measured_crossover():
    assert measured_crossover(curve({1: 1.6, 2: 1.3, 4: 1.05, 8: 0.9, 16: 0.7})) == (8, 16)
    assert measured_crossover(curve({1: 1.6, 4: 1.2})) == (None, 4)


@pytest.mark.parametrize(
    "predicted,ratios,verdict",
    [
        (8, {1: 1.5, 4: 1.1, 8: 0.9, 16: 0.8}, "stops paying at concurrency 8 (confirmed)"),
        (4, {1: 1.5, 4: 1.1, 8: 1.02, 16: 0.8}, "stops paying at concurrency 16 (refuted)"),
        (8, {1: 1.5, 2: 1.2, 4: 1.1, 8: 1.05, 16: 1.01}, "paid at every level up to concurrency 16 (refuted)"),
        (None, {1: 1.5, 16: 1.01}, "paid at every level up to concurrency 16 (confirmed)"),
        (32, {1: 1.5, 16: 1.01}, "without crossing: not tested that far"),
    ],
)
def test_plan_check_says_whether_the_curve_confirms_the_plan(tmp_path, predicted, ratios, verdict):
    line = plan_check(curve(ratios), plan(tmp_path, predicted))
    assert line is not None and line.endswith(verdict), line


def test_no_curve_or_no_plan_says_nothing(tmp_path):
    assert plan_check(BenchSummary("now", {}, {}), plan(tmp_path, 8)) is None
    assert plan_check(curve({1: 1.2}), tmp_path / "missing.json") is None
