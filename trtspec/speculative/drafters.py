"""Drafters: a separate draft model, the target's own MTP layers, and prompt-lookup n-grams.

Every drafter works on a batch whose rows have different committed lengths, proposes up to K tokens
per row, and returns the distribution each token was actually drawn from (None for one-hot drafts),
because verification is only lossless against that distribution.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from trtspec.speculative.model import ForwardOut, KVCache, Slots, Transformer
from trtspec.speculative.ngram_pool import NgramPool

if TYPE_CHECKING:
    from trtspec.speculative.batch import RowSampling
    from trtspec.speculative.tree import TokenTree, TreeShape


@dataclass
class BatchState:
    """The engine's slots, shared with its drafter: every tensor has one row per slot.

    A step runs over a subset of the slots (`Slots`); drafters index these tensors with it.
    """

    tokens: torch.Tensor  # [S, capacity] committed tokens, garbage past `lengths`
    lengths: torch.Tensor  # [S] committed length n; the target has cached positions < n - 1
    sampling: RowSampling | None = None  # how this step's rows draw tokens
    target_hidden: torch.Tensor | None = None  # [S, capacity, d] per position (MTP, Medusa), C*d for EAGLE-3
    room: torch.Tensor | None = None  # [B] drafts each of this step's rows may use (0: its last token, or K = 0)

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]


Timer = Callable[[Any, int, int], float]  # seconds of one forward of a model over (batch, tokens)


@dataclass
class Proposal:
    """K drafts per row; `probs` None means one-hot (greedy or model-free drafts)."""

    tokens: torch.Tensor  # [B, K]
    probs: torch.Tensor | None  # [B, K, V] float32, or None: one-hot on `tokens`
    num_drafts: torch.Tensor  # [B] drafts that count per row (<= K)


def _positions(starts: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """starts[b] + j for j < counts[b], right-padded by repeating the last position.

    A padded column rewrites the row's last position with the same token, so it changes nothing
    and never reaches past what the row itself needs.
    """
    width = int(counts.max())
    return starts[:, None] + torch.minimum(torch.arange(width, device=starts.device)[None, :], (counts - 1)[:, None])


def _window(values: torch.Tensor, starts: torch.Tensor, counts: torch.Tensor, rows: torch.Tensor | None = None):
    """values[rows[b], starts[b] : starts[b] + counts[b]] for every row, right-padded by repeating the last."""
    idx = _positions(starts, counts)
    rows = torch.arange(len(starts), device=values.device) if rows is None else rows
    return values[rows[:, None], idx]


CATCH_UP_AT = 8  # a row more positions than this behind (just joined, or steps run without drafts) is
# caught up in a pass of its own, so the rest of the batch is not padded to its length


def _behind(counts: torch.Tensor) -> torch.Tensor | None:
    """Batch rows with more than CATCH_UP_AT positions to catch up, or None."""
    if int(counts.max()) <= CATCH_UP_AT:
        return None
    return (counts > CATCH_UP_AT).nonzero().squeeze(1)


def _proposal(drafts: list[torch.Tensor], probs: list[torch.Tensor | None], batch: int) -> Proposal:
    stacked = None if probs[0] is None else torch.stack(probs, 1)  # type: ignore[arg-type]
    return Proposal(torch.stack(drafts, 1), stacked, torch.full((batch,), len(drafts), device=drafts[0].device))


class Drafter:
    """Interface: `start` with the engine, `admit` when a sequence takes a slot, `propose` before each
    verification, `commit` after. `slots` are the rows of the step, in the order of its batch.

    Drafters that can offer several candidates per position also `propose_tree` (trtspec.speculative.tree),
    and `commit_tree` after the tree was verified."""

    needs_target_hidden = False
    feature_layers: tuple[int, ...] = ()  # target layers whose outputs it reads instead of the final state
    proposes_trees = False
    fixed_tree: TreeShape | None = None  # a drafter that only drafts trees of its own shape (lookahead)

    def start(self, state: BatchState, capacity: int) -> None:
        raise NotImplementedError

    def admit(self, slots: torch.Tensor, reused: torch.Tensor) -> None:
        """New sequences in `slots` whose first `reused` positions equal the slot's previous sequence."""

    def propose(self, state: BatchState, k: int, slots: Slots) -> Proposal:
        raise NotImplementedError

    def commit(self, state: BatchState, old_lengths: torch.Tensor, k: int, slots: Slots) -> None:
        """Called after the engine appended the verified tokens (lengths already updated)."""

    def propose_tree(self, state: BatchState, shape: TreeShape, slots: Slots) -> TokenTree:
        raise NotImplementedError(f"{type(self).__name__} drafts chains only")

    def tree_nodes(self, shape: TreeShape) -> int:
        """Nodes of the trees it drafts for `shape`: the tokens a step verifies besides the root."""
        return shape.nodes

    def commit_tree(self, state: BatchState, old_lengths: torch.Tensor, slots: Slots, logits: torch.Tensor) -> None:
        """Called after a verified tree's tokens were appended; `logits` [B, 1+T, V] are the target's at the
        root and every node (lookahead's next guesses)."""

    def forget_history(self) -> None:
        """Drop what earlier requests left behind (TensorRT-LLM's n-gram pool), as a freshly started server has."""

    def batch_scale(self, batch: int, k: int, width: int, seconds: Timer, target: Transformer) -> float:
        """How this drafter's part of a step grows from batch 1 to `batch` at K (a tree `width` wide), with
        `seconds(model, batch, tokens)` one forward's time: plan predicts larger batches by it. Heads and MTP
        layers grow as the target's single-token pass."""
        return seconds(target, batch, 1) / seconds(target, 1, 1)

    def draw(self, logits: torch.Tensor, state: BatchState) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A token per row and the processed distribution it was drawn from (the q of verification).

        All-greedy rows return None: a one-hot q, which verification treats exactly as such.
        """
        return state.sampling.draw(logits)


class DraftModelDrafter(Drafter):
    """A smaller model with the target's tokenizer, its own KV cache and rollback by valid length."""

    def __init__(self, model: Transformer) -> None:
        self.model = model
        self.valid: torch.Tensor | None = None  # [B] positions cached that agree with the sequence

    def start(self, state: BatchState, capacity: int) -> None:
        self.cache = self.model.new_cache(state.batch, capacity)
        self.valid = torch.zeros(state.batch, dtype=torch.long, device=state.tokens.device)

    def batch_scale(self, batch: int, k: int, width: int, seconds: Timer, target: Transformer) -> float:
        return seconds(self.model, batch, width) / seconds(self.model, 1, width)

    def admit(self, slots: torch.Tensor, reused: torch.Tensor) -> None:
        self.valid[slots] = torch.minimum(self.valid[slots], reused)

    def _catch_up(self, state: BatchState, slots: Slots) -> torch.Tensor:
        """Feed each row's committed tokens the cache lacks; the logits [B, V] after its last token."""
        idx = slots.index
        valid, lengths = self.valid[idx], state.lengths[idx]
        if (behind := _behind(lengths - valid)) is not None:  # cache all but their last position, alone
            rows, start = idx[behind], valid[behind]
            todo = lengths[behind] - 1 - start
            window = _window(state.tokens, start, todo, rows)
            self.model(window, _positions(start, todo), self.cache, last_only=True, slots=Slots.of(rows.tolist()))
            self.valid[rows] = lengths[behind] - 1
            valid = self.valid[idx]
        counts = lengths - valid
        tokens = _window(state.tokens, valid, counts, idx)
        # the padding repeats each row's last position, so the last column is every row's last token
        return self.model(tokens, _positions(valid, counts), self.cache, last_only=True, slots=slots).logits[:, -1]

    def propose(self, state: BatchState, k: int, slots: Slots) -> Proposal:
        lengths = state.lengths[slots.index]
        logits = self._catch_up(state, slots)
        drafts, probs = [], []
        for j in range(k):
            d, q = self.draw(logits, state)
            drafts.append(d)
            probs.append(q)
            if j + 1 < k:
                pos = (lengths + j)[:, None]
                logits = self.model(d[:, None], pos, self.cache, slots=slots).logits[:, -1]
        return _proposal(drafts, probs, len(lengths))

    def commit(self, state: BatchState, old_lengths: torch.Tensor, k: int, slots: Slots) -> None:
        # fed: everything committed before this step, then drafts 1..k-1 at old_len..old_len+k-2
        idx = slots.index
        valid = self.valid[idx]
        fed = old_lengths + k - 1 if k > 0 else valid
        self.valid[idx] = torch.minimum(torch.maximum(fed, valid), state.lengths[idx] - 1)

    proposes_trees = True

    def propose_tree(self, state: BatchState, shape: TreeShape, slots: Slots) -> TokenTree:
        """EAGLE-2's dynamic tree (`grow_tree`), one draft pass per level over its kept nodes, as a chain."""
        from trtspec.speculative.tree import tree_attention

        n = state.lengths[slots.index]

        def expand(level: int, last: torch.Tensor, frontier: torch.Tensor, seen: torch.Tensor, _) -> torch.Tensor:
            attention = tree_attention(n, n, seen, (n - 1 + level)[:, None].expand_as(last))
            out = self.model(last, n[:, None] + frontier, self.cache, slots=slots, tree=attention)
            return out.logits.log_softmax(-1)

        return grow_tree(self._catch_up(state, slots).log_softmax(-1), shape, expand)

    def commit_tree(self, state: BatchState, old_lengths: torch.Tensor, slots: Slots, logits: torch.Tensor) -> None:
        # the tree's slots hold branches, not the sequence: keep the committed part, re-feed the rest
        self.valid[slots.index] = torch.minimum(old_lengths, state.lengths[slots.index] - 1)


class CascadeDrafter(DraftModelDrafter):
    """A draft model whose own chain is sped up by n-gram lookup (a vertical cascade, Chen et al. 2023).

    After its first draft, the model runs once over the n-gram guesses for the rest of its chain; while
    its own draws equal the guesses, that pass already holds its next distributions, and a row falls back
    to one pass per draft from its first miss. Every draft is still drawn from the draft model's q at its
    position, once per position and row, so the target's verification is unchanged and lossless, and a
    seeded row draws as often whatever shares its batch (its logits may come from a one-token or a wider
    pass, equal up to floating-point rounding). Trees are drafted as the draft model's.
    """

    def __init__(self, model: Transformer, max_ngram: int = 3) -> None:
        super().__init__(model)
        self.max_ngram = max_ngram
        self.passes = [0, 0]  # draft passes and steps, for the cost model
        self.rows = [0, 0]  # rows drafted, and of those the ones with guesses
        self.usable: list[int] = []  # [j]: rows whose draft j came from the pass over guesses

    def batch_scale(self, batch: int, k: int, width: int, seconds: Timer, target: Transformer) -> float:
        scale = super().batch_scale(batch, k, width, seconds, target)
        # in a batch a pass runs while any row needs one: count a plain chain's K passes, not batch 1's
        return scale * k / (self.passes[0] / self.passes[1]) if self.passes[1] else scale

    def _guesses(self, state: BatchState, slots: Slots, first: torch.Tensor, k: int) -> tuple[torch.Tensor, list[int]]:
        """Up to k-2 n-gram guesses per row for the drafts after the first (they feed the draft's pass)."""
        rows = slots.index.tolist()
        guesses = torch.zeros(len(rows), max(k - 2, 0), dtype=torch.long)
        counts = []
        for b, slot in enumerate(rows):
            seq = [*state.tokens[slot, : int(state.lengths[slot])].tolist(), int(first[b])]
            found = latest_match(seq, k - 2, self.max_ngram) if k > 2 else []
            guesses[b, : len(found)] = torch.tensor(found, dtype=torch.long)
            counts.append(len(found))
        return guesses.to(first.device), counts

    def propose(self, state: BatchState, k: int, slots: Slots) -> Proposal:
        lengths = state.lengths[slots.index]
        d, q = self.draw(self._catch_up(state, slots), state)
        drafts, probs, passes = [d], [q], 1
        guesses, counts = self._guesses(state, slots, d, k)
        width = max(counts, default=0)
        ahead = None
        if k > 1 and width:  # one pass over the first draft and the guesses after it
            tokens = torch.cat([d[:, None], guesses[:, :width]], 1)
            pos = lengths[:, None] + torch.arange(width + 1, device=lengths.device)[None]
            ahead = self.model(tokens, pos, self.cache, slots=slots).logits  # [B, width + 1, V]
            passes += 1
        # ok: the row's drafts so far are the guesses, so the pass's column j-1 is its distribution for draft j
        ok = torch.full((len(lengths),), ahead is not None, dtype=torch.bool, device=lengths.device)
        offered_upto = torch.tensor(counts, device=lengths.device)
        for j in range(1, k):  # draft j (0-based) from the distribution after draft j-1
            usable = ok
            self.usable += [0] * (j + 1 - len(self.usable))
            self.usable[j] += int((usable & (offered_upto > 0)).sum())
            logits = torch.empty(len(lengths), self.model.dims.vocab_size, device=lengths.device)
            if bool(usable.any()):
                logits[usable] = ahead[usable, j - 1]
            if bool((~usable).any()):
                miss = (~usable).nonzero().squeeze(1)
                sub = Slots.of(slots.index[miss].tolist(), device=lengths.device)
                pos = (lengths[miss] + j - 1)[:, None]
                logits[miss] = self.model(drafts[-1][miss, None], pos, self.cache, slots=sub).logits[:, -1]
                passes += 1
            d, q = self.draw(logits, state)
            offered = ok & (offered_upto > j - 1)  # guesses[:, j - 1] is this row's guess for draft j
            ok = offered & (d == guesses[:, min(j - 1, guesses.shape[1] - 1)]) if guesses.shape[1] else offered
            drafts.append(d)
            probs.append(q)
        self.passes[0] += passes
        self.passes[1] += 1
        self.rows[0] += len(lengths)
        self.rows[1] += sum(c > 0 for c in counts)
        return _proposal(drafts, probs, len(lengths))


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
        weight = self.model.embed_tokens.weight
        self.cache = self._new_cache(b, capacity)
        self.hidden = torch.zeros(self.depths, b, capacity, d, dtype=weight.dtype, device=weight.device)
        self.valid = torch.zeros(self.depths, b, dtype=torch.long, device=weight.device)

    def admit(self, slots: torch.Tensor, reused: torch.Tensor) -> None:
        # depth l at position i read token i+l+1: exact while that token is in the shared prefix
        for depth in range(self.depths):
            self.valid[depth, slots] = torch.minimum(self.valid[depth, slots], (reused - depth - 1).clamp_min(0))

    def propose(self, state: BatchState, k: int, slots: Slots) -> Proposal:
        idx = slots.index
        n = state.lengths[idx]
        rows = torch.arange(len(idx), device=idx.device)
        drafts: list[torch.Tensor] = []
        probs: list[torch.Tensor] = []
        last_hidden = None
        # the committed sequences with the drafts written after them, as the deeper layers read them
        seq = state.tokens[idx]
        for depth in range(min(self.depths, k)):
            logits, last_hidden = self._catch_up(state, depth, seq, slots)
            d, q = self.draw(logits, state)
            seq[rows, n + depth] = d
            drafts.append(d)
            probs.append(q)
        for j in range(self.depths, k):  # cyclic reuse beyond the last layer
            depth, round_ = j % self.depths, j // self.depths
            pos = (n - 2 + round_)[:, None]
            out = self._layer(depth, last_hidden[:, None], drafts[-1][:, None], pos, self.cache, slots)
            last_hidden = out.hidden[:, -1]
            d, q = self.draw(out.logits[:, -1], state)
            drafts.append(d)
            probs.append(q)
        return _proposal(drafts, probs, len(idx))

    def _catch_up(self, state: BatchState, depth: int, seq: torch.Tensor, slots: Slots):
        """Bring layer `depth` up to position n-2, where it drafts: its logits [B, V] and output [B, d] there."""
        idx = slots.index
        n = state.lengths[idx]
        source = state.target_hidden if depth == 0 else self.hidden[depth - 1]
        starts = self.valid[depth, idx]
        if (behind := _behind(n - 1 - starts)) is not None:  # all but position n-2, alone
            lag = idx[behind]
            self._run(depth, source, seq[behind], lag, starts[behind], n[behind] - 2, Slots.of(lag.tolist()), True)
            starts = starts.clone()
            starts[behind] = n[behind] - 2
        out = self._run(depth, source, seq, idx, starts, n - 1, slots)  # positions starts..n-2
        rows, last = torch.arange(len(idx), device=idx.device), n - 2 - starts
        return out.logits[rows, last], out.hidden[rows, last]

    def _run(self, depth, source, seq, idx, starts, ends, slots: Slots, last_only: bool = False):
        """Layer `depth` over positions starts..ends-1 of rows `idx` (`seq` holds their tokens)."""
        counts = ends - starts
        pos = _positions(starts, counts)
        hid = _window(source, starts, counts, idx)
        toks = _window(seq, starts + depth + 1, counts)
        out = self._layer(depth, hid, toks, pos, self.cache, slots, last_only)
        self.hidden[depth][idx[:, None], pos] = out.hidden
        return out

    def _new_cache(self, batch: int, capacity: int) -> KVCache:
        return self.model.new_mtp_cache(batch, capacity)

    def _layer(self, depth, hidden, tokens, positions, cache, slots, last_only: bool = False) -> ForwardOut:
        return self.model.mtp_forward(depth, hidden, tokens, positions, cache, slots, last_only)

    def commit(self, state: BatchState, old_lengths: torch.Tensor, k: int, slots: Slots) -> None:
        # depth l is exact where its token index stays within the sequence committed when it ran
        for depth in range(self.depths):
            self.valid[depth, slots.index] = (old_lengths - 1 - depth).clamp_min(0)


# expand(level, the frontier's tokens [B, W], their node indices [W], the nodes each sees (its ancestors and
# itself) [B, W, nodes so far], their parents [B, W]) -> the frontier's children's log-probabilities [B, W, V]
Expand = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def grow_tree(root_logp: torch.Tensor, shape: TreeShape, expand: Expand, depth: int | None = None) -> TokenTree:
    """EAGLE-2's dynamic tree: the root's top `width` tokens, then per level each kept node's top `width`
    children, of which the `width` with the highest cumulative draft log-probability are kept. The drafters
    differ only in `expand`, what scores a level's children. `depth` levels are grown (fewer than the shape's
    where the drafter cannot guess that far; the rest is padding)."""
    from trtspec.speculative.tree import ancestors

    b, w = root_logp.shape[0], shape.width
    score, first = root_logp.topk(w, -1)
    tokens, scores = [first], [score]
    parents = [torch.full((b, w), -1, dtype=torch.long, device=root_logp.device)]
    for level in range(1, shape.depth if depth is None else depth):
        so_far = torch.cat(parents, 1)
        frontier = torch.arange(so_far.shape[1] - w, so_far.shape[1], device=root_logp.device)
        logp = expand(level, tokens[-1], frontier, ancestors(so_far)[:, frontier], parents[-1])
        _prune(scores, tokens, parents, logp, w)
    return _tree(tokens, parents, shape)


def _prune(scores: list[torch.Tensor], tokens: list[torch.Tensor], parents: list[torch.Tensor], logp, width: int):
    """Append the next level: each kept node of the last level times its top children, best `width` kept."""
    b = logp.shape[0]
    top, top_tokens = logp.topk(width, -1)  # [B, w, w]: per frontier node
    cand = scores[-1][:, :, None] + top
    score, best = cand.reshape(b, -1).topk(width, -1)
    start = sum(t.shape[1] for t in tokens) - width
    tokens.append(top_tokens.reshape(b, -1).gather(1, best))
    parents.append(start + best // width)
    scores.append(score)


class MedusaDrafter(Drafter):
    """Medusa heads (trtspec.speculative.heads) on the target's hidden state at the last verified position.

    With n tokens committed, the target last verified position n-2 (it produced token n-1), so head j
    drafts token n + j: every draft of a step from one small matmul per head, no model pass. Chains take
    each head's argmax (one-hot q); trees each head's top candidates, pruned by cumulative score, or the
    static tree of medusa_choices that TensorRT-LLM's engines verify.
    """

    needs_target_hidden = True
    proposes_trees = True

    def __init__(self, heads, choices: list[list[int]] | None = None) -> None:
        """`choices`: a static tree as Medusa and TensorRT-LLM's medusa_choices give it, each path [i0, i1, ...]
        the node whose token is head 0's i0-th best, then head 1's i1-th best under it, ..."""
        if heads.needs_target_head:
            raise ValueError("the Medusa heads are stored tied to their target's lm_head: tie() them first")
        self.heads = heads
        self.choices = sorted((tuple(c) for c in choices), key=lambda c: (len(c), c)) if choices else None
        if self.choices:  # parents first; the tree's layout is fixed, so it is laid out once, not per step
            self.fixed_tree = self.static_shape(choices)
            node = {c: n for n, c in enumerate(self.choices)}
            self._head = torch.tensor([len(c) - 1 for c in self.choices])  # the head that guesses each node
            self._rank = torch.tensor([c[-1] for c in self.choices])  # and which of its best guesses it is
            self._parents = torch.tensor([node[c[:-1]] if len(c) > 1 else -1 for c in self.choices])
            self._best = max(c[-1] for c in self.choices) + 1  # how many of each head's best guesses the tree reads

    @staticmethod
    def static_shape(choices: list[list[int]]) -> TreeShape:
        """The envelope a static tree's levels fit in: its depth, and its widest level."""
        from trtspec.speculative.requests import TreeShape

        levels = [sum(len(c) == d for c in choices) for d in range(1, max(map(len, choices)) + 1)]
        return TreeShape(len(levels), max(levels))

    def start(self, state: BatchState, capacity: int) -> None:
        pass

    def _logp(self, state: BatchState, slots: Slots) -> torch.Tensor:
        idx = slots.index
        hidden = state.target_hidden[idx, state.lengths[idx] - 2]
        return self.heads(hidden).log_softmax(-1)  # [B, H, V]

    def propose(self, state: BatchState, k: int, slots: Slots) -> Proposal:
        logp = self._logp(state, slots)
        b, heads = logp.shape[0], logp.shape[1]
        tokens = torch.zeros(b, k, dtype=torch.long, device=logp.device)
        used = min(k, heads)
        tokens[:, :used] = logp[:, :used].argmax(-1)
        return Proposal(tokens, None, torch.full((b,), used, device=logp.device))

    def propose_tree(self, state: BatchState, shape: TreeShape, slots: Slots) -> TokenTree:
        """Head `level` scores every node of that level alike: its guess does not depend on the branch."""
        logp = self._logp(state, slots)
        if self.choices:
            return self._static_tree(logp)
        depth = min(shape.depth, logp.shape[1])
        return grow_tree(logp[:, 0], shape, lambda level, last, *_: logp[:, level, None].expand(*last.shape, -1), depth)

    def tree_nodes(self, shape: TreeShape) -> int:
        return len(self.choices) if self.choices else shape.nodes

    def _static_tree(self, logp: torch.Tensor) -> TokenTree:
        from trtspec.speculative.tree import TokenTree

        b, device = logp.shape[0], logp.device
        head, rank, parents = (t.to(device) for t in (self._head, self._rank, self._parents))
        ranked = logp.topk(self._best, -1).indices  # [B, H, best]
        tokens = ranked[:, head, rank]  # [B, nodes]
        valid = torch.ones_like(tokens, dtype=torch.bool)
        return TokenTree(tokens, parents.expand(b, -1), (head + 1).expand(b, -1), valid)


def _tree(tokens: list[torch.Tensor], parents: list[torch.Tensor], shape: TreeShape) -> TokenTree:
    """Levels of `shape.width` nodes as one tree, padded with invalid nodes to the shape's node count."""
    from trtspec.speculative.tree import TokenTree

    b, w = tokens[0].shape
    levels = len(tokens)
    depths = torch.arange(1, levels + 1, device=tokens[0].device).repeat_interleave(w)[None, :].expand(b, -1)
    pad = shape.nodes - levels * w
    valid = torch.ones(b, levels * w, dtype=torch.bool, device=tokens[0].device)
    parts = [torch.cat(tokens, 1), torch.cat(parents, 1), depths, valid]
    if pad:
        fill = [0, -1, 1, False]
        parts = [
            torch.cat([p, torch.full((b, pad), f, dtype=p.dtype, device=p.device)], 1)
            for p, f in zip(parts, fill, strict=True)
        ]
    return TokenTree(*parts)


def latest_match(seq: list[int], k: int, max_ngram: int = 3) -> list[int]:
    """Up to k tokens after the latest earlier occurrence of the sequence's longest suffix (up to max_ngram):
    the cascade's guesses, which read drafts not yet committed and so stay out of a request's n-gram pool."""
    for size in range(min(max_ngram, len(seq) - 1), 0, -1):
        tail = seq[-size:]
        for start in range(len(seq) - size - 1, -1, -1):
            if seq[start : start + size] == tail:
                return seq[start + size : start + size + k]
    return []


class NgramDrafter(Drafter):
    """TensorRT-LLM's NGram drafter: drafts from its pool of earlier patterns and what followed them
    (trtspec.speculative.ngram_pool, with NGramDecodingConfig's pool flags).

    The pool lives as long as the drafter, as TensorRT-LLM's lives as long as its executor: a public one
    keeps every request's tokens, across engines and `generate` calls, until `forget_history` (which
    measurements call so that a repeated prompt does not replay its earlier output). Model-free and
    deterministic, so q is one-hot (None); rows without a match draft nothing.
    """

    def __init__(self, max_ngram: int = 3, keep_all: bool = True, use_oldest: bool = True, public: bool = True) -> None:
        self.max_ngram = max_ngram
        self.pool = NgramPool(keep_all, use_oldest, public)
        self.requests: list[int] = []  # the request each slot holds, as the pool knows it
        self.issued = 0

    def start(self, state: BatchState, capacity: int) -> None:
        for request in self.requests:  # the previous engine's requests ended with it
            self.pool.forget(request)
        self.requests = list(range(self.issued, self.issued + state.batch))
        self.issued += state.batch

    def admit(self, slots: torch.Tensor, reused: torch.Tensor) -> None:
        for slot in slots.tolist():  # the slot's previous request has finished
            self.pool.forget(self.requests[slot])
            self.requests[slot], self.issued = self.issued, self.issued + 1

    def forget_history(self) -> None:
        self.pool.clear()

    def batch_scale(self, batch: int, k: int, width: int, seconds: Timer, target: Transformer) -> float:
        return float(batch)  # a lookup per row on the host

    def ngram_size(self, batch: int) -> int:
        """The longest suffix looked up when `batch` rows draft together."""
        return self.max_ngram

    def _prefix(self, state: BatchState, slot: int) -> list[int]:
        return state.tokens[slot, : int(state.lengths[slot])].tolist()

    proposes_trees = True

    def propose_tree(self, state: BatchState, shape: TreeShape, slots: Slots) -> TokenTree:
        """The pool's matches for the sequence's suffixes merged into a trie (parents before children)."""
        from trtspec.speculative.tree import TokenTree

        rows = slots.index.tolist()
        t = shape.nodes
        tokens = torch.zeros(len(rows), t, dtype=torch.long)
        parents = torch.full((len(rows), t), -1, dtype=torch.long)
        depths = torch.ones(len(rows), t, dtype=torch.long)
        valid = torch.zeros(len(rows), t, dtype=torch.bool)
        size = self.ngram_size(len(rows))
        for b, slot in enumerate(rows):
            index: dict[tuple[int, ...], int] = {}
            found = self.pool.candidates(self._prefix(state, slot), self.requests[slot], shape.depth, shape.width, size)
            for level in range(1, shape.depth + 1):
                for follow in found:
                    prefix = tuple(follow[:level])
                    if len(prefix) < level or prefix in index:
                        continue
                    i = index[prefix] = len(index)
                    tokens[b, i], depths[b, i], valid[b, i] = prefix[-1], level, True
                    parents[b, i] = index[prefix[:-1]] if level > 1 else -1
        device = state.tokens.device
        return TokenTree(tokens.to(device), parents.to(device), depths.to(device), valid.to(device))

    def propose(self, state: BatchState, k: int, slots: Slots) -> Proposal:
        rows = slots.index.tolist()
        tokens = torch.zeros(len(rows), k, dtype=torch.long)
        counts = torch.zeros(len(rows), dtype=torch.long)
        size = self.ngram_size(len(rows))
        room = state.room.tolist() if state.room is not None else [k] * len(rows)
        for b, slot in enumerate(rows):
            if room[b] <= 0:  # as NVIDIA's pool, which a request with no room left does not touch
                continue
            found = self.pool.drafts(self._prefix(state, slot), self.requests[slot], k, size)
            tokens[b, : len(found)] = torch.tensor(found, dtype=torch.long)
            counts[b] = len(found)
        device = state.tokens.device
        return Proposal(tokens.to(device), None, counts.to(device))
