"""The cost model: expected tokens per step from per-position acceptance, and those rates from runner counts."""

from __future__ import annotations

import math

import pytest

from trtspec.speculative.cost_model import conditional_rates, expected_tokens_per_step_positional, survival


def test_iid_acceptance_gives_leviathans_closed_form():
    for a in (0.0, 0.3, 0.8, 0.95):
        for k in range(0, 8):
            assert math.isclose(expected_tokens_per_step_positional([a] * k), (1 - a ** (k + 1)) / (1 - a))
    assert expected_tokens_per_step_positional([1.0] * 4) == 5


def test_positional_rates_multiply_down_the_draft():
    assert math.isclose(expected_tokens_per_step_positional([0.9, 0.5]), 1 + 0.9 + 0.45)
    assert survival([0.9, 0.5, 0.0, 1.0]) == pytest.approx([0.9, 0.45, 0.0, 0.0])
    assert expected_tokens_per_step_positional([]) == 1.0


def test_conditional_rates_from_runner_counts():
    # 100 steps: 80 accepted position 0, 60 of those also position 1, 30 also position 2
    assert conditional_rates([100, 100, 100], [80, 60, 30]) == [0.8, 0.75, 0.5]
    assert math.isclose(
        expected_tokens_per_step_positional(conditional_rates([100, 100, 100], [80, 60, 30])), 1 + 0.8 + 0.6 + 0.3
    )
    assert conditional_rates([10, 10], [0, 0]) == [0.0]
