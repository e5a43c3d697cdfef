"""Rejection-sampling verification of drafted tokens (Leviathan et al. 2023, Chen et al. 2023).

Notation: p is the target's distribution, q the draft's (the reverse of gpt-fast's). For each row,
draft token d_j is accepted with probability min(1, p_j(d_j) / q_j(d_j)); at the first rejection the
token is drawn from norm(max(0, p_j - q_j)); when every draft is accepted a bonus token is drawn
from p_K. The output then follows p exactly. Drafters without a distribution (argmax MTP, n-gram)
pass q = None, meaning one-hot on the drafted token: accept with probability p(d), and on rejection
draw from p with d removed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Verified:
    tokens: torch.Tensor  # [B, K+1] accepted drafts then the residual or bonus token; -1 after
    num_accepted: torch.Tensor  # [B] accepted drafts; each row emits num_accepted + 1 tokens


def verify(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
    num_drafts: torch.Tensor | None = None,
) -> Verified:
    """Verify K drafts per row against K+1 target distributions; rows may carry fewer drafts.

    draft_tokens [B, K]; draft_probs [B, K, V] float32 or None (one-hot); target_probs [B, K+1, V]
    float32; num_drafts [B] (default K): drafts past a row's count are never accepted, and the
    row's next token is then drawn from p at that position, as if it had been a bonus.
    """
    b, k = draft_tokens.shape
    device = target_probs.device
    rows = torch.arange(b, device=device)
    if num_drafts is None:
        num_drafts = torch.full((b,), k, dtype=torch.long, device=device)
    if k > 0:
        p_d = target_probs[:, :k].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
        if draft_probs is None:
            q_d = torch.ones_like(p_d)
        else:
            q_d = draft_probs.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
        u = torch.rand(p_d.shape, generator=generator, device=device)
        # q_d > 0 whenever d was drawn from q; the guard keeps a zero from turning into NaN
        accept = (q_d > 0) & (u * q_d < p_d)
        accept &= torch.arange(k, device=device)[None, :] < num_drafts[:, None]
        num_accepted = (accept.cumprod(dim=1)).sum(dim=1)
    else:
        num_accepted = torch.zeros(b, dtype=torch.long, device=device)

    p_next = target_probs[rows, num_accepted]
    rejected = num_accepted < num_drafts
    if k > 0 and bool(rejected.any()):
        j = num_accepted.clamp(max=k - 1)
        if draft_probs is None:
            q_next = torch.zeros_like(p_next).scatter_(-1, draft_tokens[rows, j].unsqueeze(-1), 1.0)
        else:
            q_next = draft_probs[rows, j]
        residual = (p_next - q_next).clamp_min(0.0)
        mass = residual.sum(-1, keepdim=True)
        # mass is 0 only if p == q up to rounding, where rejection had probability ~0: fall back to p
        residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), p_next)
        p_next = torch.where(rejected[:, None], residual, p_next)
    extra = torch.multinomial(p_next, 1, generator=generator).squeeze(-1)

    tokens = torch.full((b, k + 1), -1, dtype=torch.long, device=device)
    if k > 0:
        keep = torch.arange(k, device=device)[None, :] < num_accepted[:, None]
        tokens[:, :k] = torch.where(keep, draft_tokens, tokens[:, :k])
    tokens[rows, num_accepted] = extra
    return Verified(tokens, num_accepted)


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor, num_drafts: torch.Tensor) -> Verified:
    """Temperature 0: the rejection rule with one-hot p, computed without building distributions.

    A draft is accepted iff it is the target's argmax; the next token is the argmax at the first
    mismatch (or after the last draft). Same result as `verify`, a fraction of the tensor ops.
    """
    b, k = draft_tokens.shape
    best = target_logits.argmax(-1)  # [B, K+1]
    match = (draft_tokens == best[:, :k]) & (torch.arange(k)[None, :] < num_drafts[:, None])
    num_accepted = match.cumprod(dim=1).sum(dim=1) if k else torch.zeros(b, dtype=torch.long)
    keep = torch.arange(k + 1)[None, :] <= num_accepted[:, None]
    return Verified(torch.where(keep, best, -1), num_accepted)
