"""The cost model: Leviathan's closed form, its positional variant, and the integer search for K."""

from __future__ import annotations

import math

from trtspec.speculative.cost_model import (
    best_k,
    best_k_positional,
    expected_tokens_per_step,
    expected_tokens_per_step_positional,
    speedup,
)


def test_expected_tokens_matches_the_geometric_sum():
    for a in (0.0, 0.3, 0.8, 0.95):
        for k in range(0, 8):
            assert math.isclose(expected_tokens_per_step(a, k), sum(a**i for i in range(k + 1)))
    assert expected_tokens_per_step(1.0, 4) == 5


def test_positional_variant_reduces_to_the_iid_form():
    assert math.isclose(expected_tokens_per_step_positional([0.7] * 5), expected_tokens_per_step(0.7, 5))
    assert math.isclose(expected_tokens_per_step_positional([0.9, 0.5]), 1 + 0.9 + 0.45)


def test_speedup_and_best_k():
    # a = 0.8, c = 0.05: K=8 gives (1 - 0.8**9) / 0.2 / 1.4 = 3.0913, just above K=7 (3.0798) and K=9
    k, s = best_k(0.8, 0.05)
    assert k == 8 and math.isclose(s, (1 - 0.8**9) / 0.2 / 1.4)
    assert speedup(0.8, 7, 0.05) < s and speedup(0.8, 9, 0.05) < s
    assert math.isclose(speedup(0.8, k, 0.05), s)
    # a draft as slow as the target never pays
    assert best_k(0.9, 1.0) == (0, 1.0)
    # a verify cost growing with K lowers the best K
    k_v, _ = best_k(0.8, 0.05, v=lambda k: 1 + 0.1 * k)
    assert k_v < k


def test_positional_best_k_stops_where_acceptance_collapses():
    k, _ = best_k_positional([0.9, 0.8, 0.1, 0.1], c=0.1)
    assert k == 2


def test_conditional_rates_from_runner_counts():
    from trtspec.speculative.cost_model import conditional_rates

    # 100 steps: 80 accepted position 0, 60 of those also position 1, 30 also position 2
    assert conditional_rates([100, 100, 100], [80, 60, 30]) == [0.8, 0.75, 0.5]
    assert math.isclose(
        expected_tokens_per_step_positional(conditional_rates([100, 100, 100], [80, 60, 30])), 1 + 0.8 + 0.6 + 0.3
    )
    assert conditional_rates([10, 10], [0, 0]) == [0.0]
