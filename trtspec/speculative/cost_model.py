"""How much speculation can pay: Leviathan et al.'s expected speedup, with a measured verify cost.

With acceptance a (i.i.d. per position) and K drafts, a step emits (1 - a^(K+1)) / (1 - a) tokens
(the accepted drafts plus the residual or bonus token). A step costs K draft steps of relative cost
c and one target pass over K+1 tokens of relative cost v(K) (Leviathan's form assumes v = 1; on a
CPU verifying K+1 tokens costs 1.3-1.5x one step, so trtspec carries v measured). The per-position
variant uses a_1..a_K, the probability that position j is accepted given 1..j-1 were, since MTP
and draft acceptance fall with depth.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def expected_tokens_per_step(a: float, k: int) -> float:
    if k == 0:
        return 1.0
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def expected_tokens_per_step_positional(rates: Sequence[float]) -> float:
    """1 + sum over j of P(positions 1..j all accepted), with conditional rates a_1..a_K."""
    total, alive = 1.0, 1.0
    for rate in rates:
        alive *= rate
        total += alive
    return total


def speedup(a: float, k: int, c: float, v: Callable[[int], float] | float = 1.0) -> float:
    """Expected tokens per unit time relative to plain decoding (one target step = 1)."""
    verify = v(k) if callable(v) else (v if k > 0 else 1.0)
    return expected_tokens_per_step(a, k) / (k * c + verify)


def speedup_positional(rates: Sequence[float], c: float, v: Callable[[int], float] | float = 1.0) -> float:
    k = len(rates)
    verify = v(k) if callable(v) else (v if k > 0 else 1.0)
    return expected_tokens_per_step_positional(rates) / (k * c + verify)


def best_k(a: float, c: float, v: Callable[[int], float] | float = 1.0, k_max: int = 16) -> tuple[int, float]:
    """The integer K in 0..k_max with the highest expected speedup (no closed form exists)."""
    return max(((k, speedup(a, k, c, v)) for k in range(k_max + 1)), key=lambda kv: kv[1])


def best_k_positional(rates: Sequence[float], c: float, v: Callable[[int], float] | float = 1.0) -> tuple[int, float]:
    """Best K <= len(rates) when acceptance is given per position."""
    return max(((k, speedup_positional(rates[:k], c, v)) for k in range(len(rates) + 1)), key=lambda kv: kv[1])


def conditional_rates(drafted: Sequence[int], accepted: Sequence[int]) -> list[float]:
    """Per-position acceptance given the previous positions were accepted, from runner counts.

    accepted[j] counts steps where positions 0..j were all accepted; drafted[0] counts steps.
    """
    rates = []
    previous = drafted[0] if drafted else 0
    for a in accepted:
        if previous == 0:
            break
        rates.append(a / previous)
        previous = a
    return rates
