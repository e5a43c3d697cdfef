"""Is a live speculative deployment still the target's distribution? Checked against its baseline.

Temperature 0: every prompt must give the same text from both. Above 0: for each chosen prompt the
first few tokens are sampled many times from each side (different seeds per side). Both sides' text
goes through one deterministic map, the tokenizer, so the test stays exact whatever the servers'
own token boundaries. At each position the samples are split by the tokens before it (the prefix)
and the next-token distributions of A and B compared within each prefix (chi-square homogeneity,
rare tokens pooled); statistics and degrees of freedom add up over prefixes and positions into one
test per prompt, judged at a Bonferroni bound. Conditioning on the prefix is what makes a
verification bug visible: it shifts the token right after a rejection or after a fully accepted
step, a shift the joint distribution of whole continuations dilutes to nothing.

Power, because a PASS that could not have failed is not evidence: each test states the smallest
shift it detects with 80% probability (Cohen's w: the root of the summed (pA - pB)^2 / p over its
cells). When the deployment's checkpoints load in-process, the B side is the target itself, sampled
there several times over (cheap, and more power per served sample), and the same test is run
between each planted verification bug and those samples at the served sample size: the power
against each bug comes from a 95% lower bound of the noncentrality it showed. PASS needs no
rejection and that power: 80% against every planted bug when they were run, else a detectable w of
at most 0.3 (Cohen's "medium"). Short of it, or with a failed request, the verdict is "inconclusive".
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import optimize, stats

MIN_SAMPLES = 20
MIN_EXPECTED = 5.0
POWER = 0.8
MAX_DETECTABLE_W = 0.3
END = -1  # the position after an end of sequence: one more outcome, never a prefix worth testing


@dataclass(frozen=True)
class Homogeneity:
    statistic: float
    df: int
    p_value: float | None  # None: too little data to decide either way
    samples: tuple[int, int]  # A's and B's
    strata: int  # prefixes that contributed

    @property
    def effective_samples(self) -> float:
        """n_A n_B / (n_A + n_B): the noncentrality of a shift w between the sides is this times w^2."""
        a, b = self.samples
        return a * b / (a + b) if a + b else 0.0


def _contingency(a: Counter, b: Counter) -> tuple[float, int] | None:
    """Pearson's statistic and df for two samples' counts; outcomes expected < 5 are pooled."""
    na, nb = sum(a.values()), sum(b.values())
    total = na + nb
    if not na or not nb:
        return None
    kept, other_a, other_b = [], 0, 0
    for key in set(a) | set(b):
        pooled = a[key] + b[key]
        if min(na, nb) * pooled / total >= MIN_EXPECTED:
            kept.append((a[key], b[key]))
        else:
            other_a, other_b = other_a + a[key], other_b + b[key]
    if other_a + other_b:
        if min(na, nb) * (other_a + other_b) / total >= MIN_EXPECTED or not kept:
            kept.append((other_a, other_b))
        else:  # too rare even pooled: into the smallest kept cell, so no sample leaves the test
            i = min(range(len(kept)), key=lambda j: sum(kept[j]))
            kept[i] = (kept[i][0] + other_a, kept[i][1] + other_b)
    if len(kept) < 2:
        return None
    stat = 0.0
    for oa, ob in kept:
        for observed, n in ((oa, na), (ob, nb)):
            expected = n * (oa + ob) / total
            stat += (observed - expected) ** 2 / expected
    return stat, len(kept) - 1


def chi_square_homogeneity(a: list[str], b: list[str]) -> tuple[float, int, float | None]:
    """(statistic, df, p) for H0: both samples come from one distribution; p None when undecidable."""
    if min(len(a), len(b)) < MIN_SAMPLES:
        return 0.0, 0, None
    result = _contingency(Counter(a), Counter(b))
    if result is None:
        return 0.0, 0, 1.0 if set(a) == set(b) and len(set(a)) == 1 else None
    stat, df = result
    return stat, df, float(stats.chi2.sf(stat, df))


def conditional_homogeneity(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]) -> Homogeneity:
    """One test of A's and B's first tokens, position by position, within each prefix."""
    n = (len(a), len(b))
    if min(n) < MIN_SAMPLES:
        return Homogeneity(0.0, 0, None, n, 0)
    length = max(len(s) for s in (*a, *b))
    stat, df, strata = 0.0, 0, 0
    for i in range(length):
        nexts: dict[tuple, tuple[Counter, Counter]] = defaultdict(lambda: (Counter(), Counter()))
        for side, samples in enumerate((a, b)):
            for s in samples:
                prefix = tuple(s[:i])
                if END not in prefix:
                    nexts[prefix][side][s[i] if i < len(s) else END] += 1
        for ca, cb in nexts.values():
            part = _contingency(ca, cb)
            if part is not None:
                stat, df, strata = stat + part[0], df + part[1], strata + 1
    p = float(stats.chi2.sf(stat, df)) if df else None
    return Homogeneity(stat, df, p, n, strata)


def critical_value(df: int, alpha: float) -> float:
    return float(stats.chi2.isf(alpha, df))


def power_at(noncentrality: float, df: int, alpha: float) -> float:
    """Probability the test rejects at `alpha` when the truth sits at this noncentrality."""
    if df == 0:
        return 0.0
    if noncentrality <= 0:
        return alpha
    return float(stats.ncx2.sf(critical_value(df, alpha), df, noncentrality))


def detectable_w(test: Homogeneity, alpha: float, power: float = POWER) -> float | None:
    """Smallest effect (Cohen's w) rejected with probability `power`; None when untestable."""
    if not test.df or not test.effective_samples:
        return None
    crit = critical_value(test.df, alpha)
    lam = optimize.brentq(lambda x: stats.ncx2.sf(crit, test.df, x) - power, 1e-9, 1e7)
    return (lam / test.effective_samples) ** 0.5


def noncentrality_lower_bound(test: Homogeneity, confidence: float = 0.95) -> float:
    """The smallest noncentrality that makes this statistic unsurprising (one-sided, at `confidence`).

    One run's statistic - df is an unbiased but noisy estimate; fed through the power curve it
    overstates power (a bug caught half the time reads as >= 80% about one run in five). The
    lower bound errs the other way: the power claimed is at most what the run supports."""
    if not test.df or test.statistic <= 0:
        return 0.0
    tail = 1.0 - confidence
    if stats.chi2.sf(test.statistic, test.df) >= tail:
        return 0.0
    return optimize.brentq(lambda x: stats.ncx2.sf(test.statistic, test.df, x) - tail, 1e-9, 10 * test.statistic)


def planted_outcome(test: Homogeneity, alpha: float) -> dict:
    """What one in-process run of a planted bug showed at this sample size, and the power it supports."""
    return {
        "statistic": test.statistic,
        "df": test.df,
        "p_value": test.p_value,
        "caught": test.p_value is not None and test.p_value < alpha,
        "power": power_at(noncentrality_lower_bound(test), test.df, alpha),
    }


def verdict(
    greedy_pairs: list[tuple[str | None, str | None]],
    tests: list[Homogeneity],
    alpha: float = 0.01,
    planted: dict[str, list[dict]] | None = None,
) -> dict:
    """PASS, FAIL or inconclusive, with what each part showed and the power behind it.

    A greedy pair with None on a side (the request failed) is no evidence either way. `planted` maps a
    planted bug to its in-process outcome per context (planted_outcome)."""
    failed = [i for i, pair in enumerate(greedy_pairs) if None in pair]
    mismatched = [i for i, (x, y) in enumerate(greedy_pairs) if None not in (x, y) and x != y]
    bound = alpha / max(len(tests), 1)
    p_values = [t.p_value for t in tests]
    rejected = [i for i, p in enumerate(p_values) if p is not None and p < bound]
    undecided = [i for i, p in enumerate(p_values) if p is None]
    widths = [detectable_w(t, bound) for t in tests]
    power: dict[str, float] = {}
    if planted:
        # the prompts' tests are independent: a bug escapes only if every one of them misses it
        for bug, outcomes in planted.items():
            missed = 1.0
            for o in outcomes:
                missed *= 1.0 - o["power"]
            power[bug] = 1.0 - missed
    powered = min(power.values()) >= POWER if power else all(w is not None and w <= MAX_DETECTABLE_W for w in widths)
    if mismatched or rejected:
        result = "FAIL"
    elif undecided or failed or not tests or not powered:
        result = "inconclusive"
    else:
        result = "PASS"
    return {
        "verdict": result,
        "pass": result == "PASS",
        "greedy": {
            "prompts": len(greedy_pairs),
            "identical": len(greedy_pairs) - len(mismatched) - len(failed),
            "mismatched": mismatched,
            "failed": failed,
        },
        "sampled": {
            "prompts": len(tests),
            "samples_per_side": min((t.samples[0] for t in tests), default=0),
            "baseline_samples": min((t.samples[1] for t in tests), default=0),
            "p_values": p_values,
            "chi_square": [t.statistic for t in tests],
            "df": [t.df for t in tests],
            "strata": [t.strata for t in tests],
            "alpha": alpha,
            "bonferroni_bound": bound,
            "rejected": rejected,
        },
        "power": {
            "target": POWER,
            "detectable_w": widths,
            "max_detectable_w": None if planted else MAX_DETECTABLE_W,
            "against_planted": power,
            "planted": planted or {},
        },
        "inconclusive": undecided,
    }
