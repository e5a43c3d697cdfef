"""How many tokens a speculative step emits, from measured per-position acceptance.

With K drafts, a step emits the accepted drafts plus one token of the target's own (the residual
or bonus token). Acceptance falls with depth for MTP and draft models alike, so it is carried per
position: a_1..a_K, the probability that position j is accepted given 1..j-1 were. With i.i.d.
acceptance a this is Leviathan et al.'s (1 - a^(K+1)) / (1 - a). What a step costs is measured, not
modelled here: `trtspec plan` divides by its timed step, the benchmarks by K draft steps of relative
cost c plus a verify pass of measured relative cost v(K) (on a CPU 1.3-1.5x one plain step, not the 1
Leviathan's form assumes).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence


def survival(rates: Sequence[float]) -> list[float]:
    """P(positions 1..j all accepted) for j = 1..K, from conditional rates a_1..a_K."""
    return list(itertools.accumulate(rates, operator.mul))


def expected_tokens_per_step_positional(rates: Sequence[float]) -> float:
    """1 + sum over j of P(positions 1..j all accepted), with conditional rates a_1..a_K."""
    return 1.0 + sum(survival(rates))


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


def cascade_draft_passes(k: int, with_guesses: float, from_guesses: Sequence[float]) -> float:
    """Draft passes per step of a cascaded chain of K (trtspec.speculative.drafters.CascadeDrafter).

    Without guesses a chain takes K passes. With them: the pass that draws the first draft, one pass over
    the guesses, and one more for each later draft whose guesses before it were not all drawn;
    `from_guesses[j]` is the share of rows with guesses whose draft j+1 came from that pass (1 for
    j = 0), `with_guesses` the share of rows that had any guess. Exact at batch 1; in a batch a pass
    runs while any row needs one, so this is the least it takes."""
    cascaded = 2 + sum(1 - share for share in from_guesses[1 : k - 1])
    return with_guesses * cascaded + (1 - with_guesses) * k
