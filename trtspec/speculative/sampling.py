"""Turning logits into the distribution a token is actually drawn from.

The lossless guarantee needs p (target) and q (draft) to be the *processed* distributions that were
sampled from: the same temperature, top-k and top-p applied to both, in float32. Temperature 0 is
greedy and becomes a one-hot distribution, so greedy verification is the same rejection rule.
"""

from __future__ import annotations

import torch

from trtspec.speculative.requests import SamplingParams

__all__ = ["probs_from_logits", "sample"]


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """float32 probabilities over the last dimension after temperature, top-k and top-p."""
    logits = logits.float()
    if params.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / params.temperature
    vocab = logits.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(-1)
        # drop a token when the tokens before it already reach top_p; the first always stays
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of `probs` [..., V]."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])
