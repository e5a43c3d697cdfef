"""Verification rules that are wrong on purpose: the evidence that the lossless check can fail.

Each wraps the correct `verify` and breaks one thing a real implementation can get wrong. The
lossless check runs them in-process to state its power, and the tests serve them from a real
tritonserver (selected by TRTSPEC_PLANTED_BUG) to show the served check says FAIL. Never set that
variable on a deployment: the output is then not the target's distribution.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch

from trtspec.errors import UsageError
from trtspec.speculative.verification import Verified, verify

PLANTED_ENV = "TRTSPEC_PLANTED_BUG"


def _redraw(result: Verified, rows: torch.Tensor, probs: torch.Tensor, generator: torch.Generator | None) -> Verified:
    """Replace each chosen row's last emitted token with a fresh draw from `probs` (one row each)."""
    if not bool(rows.any()):
        return result
    tokens = result.tokens.clone()
    idx = torch.nonzero(rows).flatten()
    tokens[idx, result.num_accepted[idx]] = torch.multinomial(probs[idx], 1, generator=generator).squeeze(-1)
    return Verified(tokens, result.num_accepted)


def residual_from_p(draft_tokens, draft_probs, target_probs, generator=None, num_drafts=None) -> Verified:
    """After a rejection, draw from the target's p instead of the residual norm(max(0, p - q))."""
    result = verify(draft_tokens, draft_probs, target_probs, generator, num_drafts)
    b, k = draft_tokens.shape
    limit = num_drafts if num_drafts is not None else torch.full((b,), k, dtype=torch.long)
    rejected = result.num_accepted < limit
    return _redraw(result, rejected, target_probs[torch.arange(b), result.num_accepted], generator)


def bonus_position_skipped(draft_tokens, draft_probs, target_probs, generator=None, num_drafts=None) -> Verified:
    """When every draft is accepted, the bonus drawn from the last draft's position (p_{K-1}), not p_K."""
    result = verify(draft_tokens, draft_probs, target_probs, generator, num_drafts)
    b, k = draft_tokens.shape
    limit = num_drafts if num_drafts is not None else torch.full((b,), k, dtype=torch.long)
    all_accepted = (result.num_accepted == limit) & (limit > 0)
    previous = target_probs[torch.arange(b), (result.num_accepted - 1).clamp_min(0)]
    return _redraw(result, all_accepted, previous, generator)


PLANTED: dict[str, Callable[..., Verified]] = {
    "residual-from-p": residual_from_p,
    "bonus-position-skipped": bonus_position_skipped,
}


def planted_verify(name: str | None) -> Callable[..., Verified]:
    """The verification rule to run: the correct one unless a planted bug is named."""
    if not name:
        return verify
    if name not in PLANTED:
        raise UsageError(f"planted bug {name!r} is not one of {', '.join(PLANTED)}")
    return PLANTED[name]


def planted_from_env() -> Callable[..., Verified]:
    """What a served model runs: the correct rule, unless TRTSPEC_PLANTED_BUG plants one (said loudly)."""
    name = os.environ.get(PLANTED_ENV)
    if name:
        print(
            f"trtspec: PLANTED VERIFICATION BUG {name!r} ({PLANTED_ENV}): output is not the target's", file=sys.stderr
        )
    return planted_verify(name)
