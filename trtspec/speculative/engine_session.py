"""One model as TensorRT-LLM's executor exposes it to Triton: requests carry the whole sequence.

The engine flavour's BLS sends the draft model the sequence so far and asks for K tokens (with their
logits), then sends the target the same sequence plus those K tokens as `draft_input_ids` and gets
back the accepted prefix and one more token. Every call repeats the full sequence, so, as
TensorRT-LLM does with `enable_kv_cache_reuse`, each model keeps a few KV caches and reuses the
longest cached prefix: a call then costs only its new tokens. The verification is the same rejection
rule as the in-process runner's (`verification.py`); drafts without logits are verified as one-hot.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from trtspec.speculative.model import KVCache, Transformer
from trtspec.speculative.sampling import SamplingParams, probs_from_logits, sample
from trtspec.speculative.verification import verify, verify_greedy


@dataclass(eq=False)
class Slot:
    cache: KVCache
    tokens: list[int]  # the tokens whose keys and values the cache holds, from position 0


@dataclass
class Decoded:
    tokens: list[int]  # new tokens, the end token not included
    logits: torch.Tensor | None  # [len(tokens), V] raw logits each token was drawn from, if asked
    ended: bool  # stopped at end_id
    draft_tokens: int = 0
    accepted_tokens: int = 0


def ends_with_any(tokens: list[int], sequences: tuple[tuple[int, ...], ...]) -> bool:
    return any(seq and len(tokens) >= len(seq) and tuple(tokens[-len(seq) :]) == seq for seq in sequences)


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # the usual case, compared in C: one sequence extends the other
        return n
    i = 0
    while a[i] == b[i]:
        i += 1
    return i


class CachedModel:
    """A Transformer with an LRU of KV caches keyed by the token prefix each one holds."""

    def __init__(self, model: Transformer, capacity: int, slots: int = 8) -> None:
        self.model = model
        self.capacity = min(capacity, model.max_positions)
        self.max_slots = slots
        self.slots: list[Slot] = []  # most recently used last
        self.reused_tokens = 0  # prefix positions served from a cache (for tests and metrics)

    def _slot_for(self, tokens: list[int], tail: int) -> tuple[Slot, int]:
        best, best_len = None, 0
        for slot in reversed(self.slots):
            n = _common_prefix(slot.tokens, tokens)
            if n > best_len:
                best, best_len = slot, n
        if best is not None and 2 * best_len < len(best.tokens) and len(self.slots) < self.max_slots:
            best = None  # a short shared prefix is not worth overwriting most of another sequence
        if best is None and len(self.slots) < self.max_slots:
            best, best_len = Slot(self.model.new_cache(1, self.capacity), []), 0
        elif best is None:
            best, best_len = self.slots[0], 0  # nothing shared: evict the least recently used
        if best in self.slots:
            self.slots.remove(best)
        self.slots.append(best)
        # the last `tail` tokens are always fed again: their logits are what the caller needs
        return best, min(best_len, len(tokens) - tail)

    @torch.inference_mode()
    def forward(self, tokens: list[int], tail: int) -> torch.Tensor:
        """Bring a cache up to `tokens` and return the raw logits [tail, V] at its last `tail` positions."""
        if len(tokens) > self.capacity:
            raise ValueError(f"sequence of {len(tokens)} tokens exceeds the engine's {self.capacity} positions")
        slot, start = self._slot_for(tokens, tail)
        self.reused_tokens += start
        device = self.model.embed_tokens.weight.device
        new = torch.tensor([tokens[start:]], device=device)
        positions = torch.arange(start, len(tokens), device=device)[None, :]
        logits = self.model(new, positions, slot.cache).logits[0]
        slot.tokens = list(tokens)
        return logits[-tail:]

    def decode(
        self,
        prompt: list[int],
        max_new: int,
        sampling: SamplingParams,
        generator: torch.Generator | None,
        end_id: int | None,
        keep_logits: bool = False,
        on_token: Callable[[int], None] | None = None,
        stop_sequences: tuple[tuple[int, ...], ...] = (),
        min_tokens: int = 0,
    ) -> Decoded:
        """Plain autoregressive decoding of up to `max_new` tokens (the draft model's job). As in
        TensorRT-LLM, a stop sequence ends it with the sequence included, and the end token cannot be
        drawn before `min_tokens` tokens (NVIDIA's BLS asks the draft for exactly K this way)."""
        seq, out, kept = list(prompt), [], []
        for _ in range(max_new):
            logits = self.forward(seq, 1)[0]
            if end_id is not None and len(out) < min_tokens:
                logits = logits.clone()
                logits[end_id] = float("-inf")
            probs = probs_from_logits(logits[None], sampling)
            token = int(probs.argmax(-1)) if sampling.greedy else int(sample(probs, generator)[0])
            if token == end_id:
                return Decoded(out, torch.stack(kept) if keep_logits and kept else None, True)
            out.append(token)
            seq.append(token)
            if keep_logits:
                kept.append(logits)
            if on_token is not None:
                on_token(token)
            if ends_with_any(seq, stop_sequences):  # seq ends with the new token: a word may span calls
                return Decoded(out, torch.stack(kept) if keep_logits and kept else None, True)
        return Decoded(out, torch.stack(kept) if keep_logits and kept else None, False)

    def verify_drafts(
        self,
        prompt: list[int],
        drafts: list[int],
        draft_logits: torch.Tensor | None,
        sampling: SamplingParams,
        generator: torch.Generator | None,
        end_id: int | None,
        max_new: int,
        stop_sequences: tuple[tuple[int, ...], ...] = (),
    ) -> Decoded:
        """One target pass over prompt + drafts: the accepted drafts, then the residual or bonus token."""
        k = len(drafts)
        logits = self.forward(prompt + drafts, k + 1)[None]  # [1, K+1, V]
        draft_tensor = torch.tensor([drafts], dtype=torch.long, device=logits.device)
        if sampling.greedy:
            result = verify_greedy(draft_tensor, logits, torch.tensor([k]))
        else:
            q = None if draft_logits is None else probs_from_logits(draft_logits[None].to(logits.device), sampling)
            result = verify(draft_tensor, q, probs_from_logits(logits, sampling), generator)
        m = int(result.num_accepted[0])
        new = result.tokens[0, : m + 1].tolist()[:max_new]
        ended = end_id in new
        if ended:
            new = new[: new.index(end_id)]
        for n in range(1, len(new) + 1):
            if ends_with_any(prompt + new[:n], stop_sequences):  # a word may begin in an earlier call
                new, ended = new[:n], True
                break
        # the cache now holds rejected drafts past prompt + m: mark only the committed prefix valid
        self.slots[-1].tokens = (prompt + drafts)[: len(prompt) + m]
        return Decoded(new, None, ended, draft_tokens=k, accepted_tokens=m)
