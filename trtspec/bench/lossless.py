"""Is a live speculative deployment still the target's distribution? Checked against its baseline.

Temperature 0: every prompt must give the same text from both. Above 0: for each prompt, the
first few generated tokens are sampled many times from each side (different seeds per side) and
their distributions compared with a chi-square test of homogeneity; categories expected fewer
than 5 times are pooled. A broken acceptance rule shifts these distributions (the tests show the
check failing on one); a correct one leaves p-values uniform, so the verdict uses a Bonferroni bound.
"""

from __future__ import annotations

from collections import Counter

import torch

MIN_SAMPLES = 20


def chi_square_homogeneity(a: list[str], b: list[str], min_expected: float = 5.0) -> tuple[float, int, float | None]:
    """(statistic, degrees of freedom, p-value) for H0: the samples come from one distribution.

    p is None when the test cannot decide: too few samples, or no outcome frequent enough to compare
    (everything pooled), which would otherwise read as a perfect pass."""
    if min(len(a), len(b)) < MIN_SAMPLES:
        return 0.0, 0, None
    ca, cb = Counter(a), Counter(b)
    na, nb = len(a), len(b)
    total = na + nb
    kept, other_a, other_b = [], 0, 0
    for key in set(ca) | set(cb):
        pooled = ca[key] + cb[key]
        if min(na, nb) * pooled / total >= min_expected:
            kept.append((ca[key], cb[key]))
        else:
            other_a, other_b = other_a + ca[key], other_b + cb[key]
    if not kept:
        return 0.0, 0, None
    if other_a + other_b:
        kept.append((other_a, other_b))
    if len(kept) < 2:
        return 0.0, 0, 1.0  # one outcome on both sides: the same (degenerate) distribution
    stat = 0.0
    for oa, ob in kept:
        pooled = oa + ob
        for observed, n in ((oa, na), (ob, nb)):
            expected = n * pooled / total
            stat += (observed - expected) ** 2 / expected
    df = len(kept) - 1
    half = torch.tensor([df / 2, stat / 2], dtype=torch.float64)
    p = float(torch.special.gammaincc(half[0], half[1]))
    return stat, df, p


def verdict(
    greedy_pairs: list[tuple[str, str]], sampled: list[tuple[list[str], list[str]]], alpha: float = 0.01
) -> dict:
    mismatched = [i for i, (x, y) in enumerate(greedy_pairs) if x != y]
    tests = [chi_square_homogeneity(a, b) for a, b in sampled]
    p_values = [p for _, _, p in tests]
    bound = alpha / max(len(tests), 1)
    sampled_ok = all(p is not None and p >= bound for p in p_values)
    return {
        "greedy": {
            "prompts": len(greedy_pairs),
            "identical": len(greedy_pairs) - len(mismatched),
            "mismatched": mismatched,
        },
        "sampled": {
            "prompts": len(tests),
            "samples_per_side": len(sampled[0][0]) if sampled else 0,
            "p_values": p_values,
            "chi_square": [s for s, _, _ in tests],
            "df": [d for _, d, _ in tests],
            "alpha": alpha,
            "bonferroni_bound": bound,
        },
        "inconclusive": [i for i, p in enumerate(p_values) if p is None],
        "pass": not mismatched and sampled_ok,
    }
