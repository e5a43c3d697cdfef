"""Drafters: a separate draft model, the target's own MTP layers, and prompt-lookup n-grams.

Every drafter works on a batch whose rows have different committed lengths, proposes up to K tokens
per row, and returns the distribution each token was actually drawn from (None for one-hot drafts),
because verification is only lossless against that distribution.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from trtspec.speculative.model import Transformer
from trtspec.speculative.sampling import SamplingParams, probs_from_logits, sample


@dataclass
class BatchState:
    """The committed sequences of a batch, shared by the runner and its drafter."""

    tokens: torch.Tensor  # [B, capacity] committed tokens, garbage past `lengths`
    lengths: torch.Tensor  # [B] committed length n_b; the target has cached positions < n_b - 1
    params: SamplingParams
    generator: torch.Generator | None
    target_hidden: torch.Tensor | None = None  # [B, capacity, d] target hidden per position (MTP only)
    active: torch.Tensor = field(default=None)  # [B] rows still generating

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]


@dataclass
class Proposal:
    """K drafts per row; `probs` None means one-hot (greedy or model-free drafts)."""

    tokens: torch.Tensor  # [B, K]
    probs: torch.Tensor | None  # [B, K, V] float32, or None: one-hot on `tokens`
    num_drafts: torch.Tensor  # [B] drafts that count per row (<= K)


def _positions(starts: torch.Tensor, width: int) -> torch.Tensor:
    return starts[:, None] + torch.arange(width)[None, :]


def _window(values: torch.Tensor, starts: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """values[b, starts[b] : starts[b] + counts[b]] for every row, right-padded to the longest.

    Padding repeats the last real element; callers write padded positions only where they are
    overwritten before anything reads them.
    """
    width = int(counts.max())
    idx = starts[:, None] + torch.minimum(torch.arange(width)[None, :], (counts - 1)[:, None])
    if values.dim() == 2:
        return values.gather(1, idx)
    return values.gather(1, idx[..., None].expand(-1, -1, values.shape[-1]))


def _proposal(drafts: list[torch.Tensor], probs: list[torch.Tensor | None], batch: int) -> Proposal:
    stacked = None if probs[0] is None else torch.stack(probs, 1)  # type: ignore[arg-type]
    return Proposal(torch.stack(drafts, 1), stacked, torch.full((batch,), len(drafts)))


class Drafter:
    """Interface: `start` after the target's prefill, `propose` before each verification, `commit` after."""

    needs_target_hidden = False

    def start(self, state: BatchState, capacity: int) -> None:
        raise NotImplementedError

    def propose(self, state: BatchState, k: int) -> Proposal:
        raise NotImplementedError

    def commit(self, state: BatchState, old_lengths: torch.Tensor, k: int) -> None:
        """Called after the runner appended the verified tokens (lengths already updated)."""

    def draw(self, logits: torch.Tensor, state: BatchState) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A token per row and the processed distribution it was drawn from (the q of verification).

        Greedy drafts return None: a one-hot q, which verification treats exactly as such.
        """
        if state.params.greedy:
            return logits.argmax(-1), None
        q = probs_from_logits(logits, state.params)
        return sample(q, state.generator), q


class DraftModelDrafter(Drafter):
    """A smaller model with the target's tokenizer, its own KV cache and rollback by valid length."""

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self.valid: torch.Tensor | None = None  # [B] positions cached that agree with the sequence

    def start(self, state: BatchState, capacity: int) -> None:
        self.cache = self.model.new_cache(state.batch, capacity)
        self.valid = torch.zeros(state.batch, dtype=torch.long)

    def propose(self, state: BatchState, k: int) -> Proposal:
        counts = state.lengths - self.valid
        tokens = _window(state.tokens, self.valid, counts)
        out = self.model(tokens, _positions(self.valid, tokens.shape[1]), self.cache)
        logits = out.logits[torch.arange(state.batch), counts - 1]
        drafts, probs = [], []
        for j in range(k):
            d, q = self.draw(logits, state)
            drafts.append(d)
            probs.append(q)
            if j + 1 < k:
                pos = (state.lengths + j)[:, None]
                logits = self.model(d[:, None], pos, self.cache).logits[:, -1]
        return _proposal(drafts, probs, state.batch)

    def commit(self, state: BatchState, old_lengths: torch.Tensor, k: int) -> None:
        # fed: everything committed before this step, then drafts 1..k-1 at old_len..old_len+k-2
        fed = old_lengths + k - 1 if k > 0 else self.valid
        self.valid = torch.minimum(torch.maximum(fed, self.valid), state.lengths - 1)


class MTPDrafter(Drafter):
    """DeepSeek-V3 MTP layers chained across depths, reused cyclically when K exceeds the layers.

    Depth l (0-based) at position i consumes the previous depth's hidden state at i (the target's for
    l = 0) and the embedding of token i+l+1, and predicts token i+l+2. Each step first brings every
    layer's cache up to the committed sequence, ending at position n-2 where the chain drafts; past
    the last layer the chain continues with layer (j mod D) at the next free position, its own hidden
    state standing in for the target's (the EAGLE-style reuse vLLM applies to MTP).
    """

    needs_target_hidden = True

    def __init__(self, model: Transformer, num_layers: int | None = None) -> None:
        self.model = model
        self.depths = num_layers or model.dims.num_mtp_layers
        if self.depths < 1 or self.depths > model.dims.num_mtp_layers:
            raise ValueError(f"MTP drafting needs 1..{model.dims.num_mtp_layers} layers, got {self.depths}")

    def start(self, state: BatchState, capacity: int) -> None:
        b, d = state.batch, self.model.dims.hidden_size
        self.cache = self.model.new_mtp_cache(b, capacity)
        self.hidden = torch.zeros(self.depths, b, capacity, d, dtype=self.model.embed_tokens.weight.dtype)
        self.valid = torch.zeros(self.depths, b, dtype=torch.long)

    def propose(self, state: BatchState, k: int) -> Proposal:
        n = state.lengths
        rows = torch.arange(state.batch)
        drafts: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        last_hidden = None
        # the committed sequence with the drafts written after it, as the deeper layers read it
        seq = state.tokens.clone()
        for depth in range(min(self.depths, k)):
            source = state.target_hidden if depth == 0 else self.hidden[depth - 1]
            starts = self.valid[depth]
            counts = n - 1 - starts  # positions starts..n-2; the chain drafts at n-2
            hid = _window(source, starts, counts)
            toks = _window(seq, starts + depth + 1, counts)
            pos = _positions(starts, toks.shape[1])
            out = self.model.mtp_forward(depth, hid, toks, pos, self.cache)
            # padded slots land past n-2, where nothing reads before the next catch-up rewrites them
            self.hidden[depth].scatter_(1, pos[..., None].expand_as(out.hidden), out.hidden)
            last = counts - 1
            last_hidden = out.hidden[rows, last]
            d, q = self.draw(out.logits[rows, last], state)
            seq[rows, n + depth] = d
            drafts.append(d)
            probs.append(q)
        for j in range(self.depths, k):  # cyclic reuse beyond the last layer
            depth, round_ = j % self.depths, j // self.depths
            pos = (n - 2 + round_)[:, None]
            out = self.model.mtp_forward(depth, last_hidden[:, None], drafts[-1][:, None], pos, self.cache)
            last_hidden = out.hidden[:, -1]
            d, q = self.draw(out.logits[:, -1], state)
            drafts.append(d)
            probs.append(q)
        return _proposal(drafts, probs, state.batch)

    def commit(self, state: BatchState, old_lengths: torch.Tensor, k: int) -> None:
        # depth l is exact where its token index stays within the sequence committed when it ran
        for depth in range(self.depths):
            self.valid[depth] = (old_lengths - 1 - depth).clamp_min(0)


class NgramDrafter(Drafter):
    """Prompt lookup: continue the latest earlier occurrence of the sequence's last n-gram.

    Model-free and deterministic, so q is one-hot (None); rows without a match draft nothing.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def start(self, state: BatchState, capacity: int) -> None:
        pass

    def lookup(self, seq: list[int], k: int) -> list[int]:
        for size in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            tail = seq[-size:]
            for start in range(len(seq) - size - 1, -1, -1):
                if seq[start : start + size] == tail:
                    return seq[start + size : start + size + k]
        return []

    def propose(self, state: BatchState, k: int) -> Proposal:
        tokens = torch.zeros(state.batch, k, dtype=torch.long)
        counts = torch.zeros(state.batch, dtype=torch.long)
        for b in range(state.batch):
            found = self.lookup(state.tokens[b, : int(state.lengths[b])].tolist(), k)
            tokens[b, : len(found)] = torch.tensor(found, dtype=torch.long)
            counts[b] = len(found)
        return Proposal(tokens, None, counts)
