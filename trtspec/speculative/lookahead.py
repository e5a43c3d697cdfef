"""Lookahead decoding (Fu et al. 2024): the target drafts for itself by Jacobi iteration, no second model.

Each row keeps a window of W guesses for the positions after its last token. One target pass runs the
window as a chain beside up to G n-grams from the row's pool that start with its last token, all merged
into one token tree (`trtspec.speculative.tree`), so the pass verifies the n-grams and the window itself
and, at the same time, is one Jacobi step: the target's argmax after each window prefix is the next
guess for the position after it. The window then moves on by what was committed. Consecutive windows
form a trajectory; along its diagonals (a guess, then the guess made from it one step later, ...) lie
N-token sequences the target itself proposed one after another, and those go into the pool, keyed by
their first token.

TensorRT-LLM's lookahead engines carry N-1 levels of the window in every pass (its max_draft_len is
(N-2) + (W-1+G)(N-1) for that reason); this runner feeds one level and keeps the older ones on the host,
so a pass is 1 + W + G(N-1) tokens. The proposals are deterministic, so verification is the tree's
multi-candidate rule with one-hot candidates: lossless at any temperature.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from trtspec.modes.lookahead import runner_problem
from trtspec.speculative.drafters import BatchState, Drafter, Timer
from trtspec.speculative.model import Slots, Transformer
from trtspec.speculative.tree import TokenTree, TreeShape


def lookahead_tree(window: int, ngram: int, verification: int) -> TreeShape:
    """The tree the engine reserves room for: the window's W levels or the n-grams' N-1, a node per
    candidate and the window at each (the tree itself has at most W + G(N-1) nodes)."""
    return TreeShape(max(window, ngram - 1), verification + 1)


@dataclass
class _Row:
    """One slot's Jacobi state, in the frame of the committed length `length`: column j is position length + j.

    The window and the older windows (`levels`) move on to the row's current length when it next drafts,
    so steps that ran without drafting (the policy turned it off) shift them too."""

    length: int
    guesses: list[int]  # the latest guesses per column (W + 1 after a step; none before the first)
    window: list[int] = field(default_factory=list)
    guessed: list[bool] = field(default_factory=list)  # which window columns hold guesses (the rest are fillers)
    levels: list[list[int | None]] = field(default_factory=list)  # oldest first; None: a filler, not a guess
    pool: dict[int, list[tuple[int, ...]]] = field(default_factory=dict)  # first token -> continuations
    window_nodes: list[int] = field(default_factory=list)  # tree node of each window column in the latest tree


class LookaheadDrafter(Drafter):
    proposes_trees = True

    def __init__(self, window: int, ngram: int, verification: int) -> None:
        if why := runner_problem(window, ngram, verification):
            raise ValueError(why)
        self.w, self.n, self.g = window, ngram, verification

    @property
    def fixed_tree(self) -> TreeShape:
        return lookahead_tree(self.w, self.n, self.g)

    @property
    def nodes(self) -> int:
        return self.w + self.g * (self.n - 1)

    def tree_nodes(self, shape: TreeShape) -> int:
        return self.nodes  # whatever the shape: its own tree

    def batch_scale(self, batch: int, k: int, width: int, seconds: Timer, target: Transformer) -> float:
        return float(batch)  # the Jacobi step and the pool per row on the host

    def start(self, state: BatchState, capacity: int) -> None:
        self.rows: list[_Row | None] = [None] * state.batch

    def admit(self, slots: torch.Tensor, reused: torch.Tensor) -> None:
        for slot in slots.tolist():
            self.rows[slot] = None  # a fresh window and pool per request, as TensorRT-LLM keeps them

    def _moved_on(self, state: BatchState, slot: int, length: int) -> _Row:
        """The row's state in the frame of its current length: guesses past what was committed, fillers after."""
        row = self.rows[slot]
        if row is None:
            row = self.rows[slot] = _Row(length=length, guesses=[])
        s = length - row.length
        kept = row.guesses[s : s + self.w]
        missing = self.w - len(kept)
        row.window = kept + (_fill(state.tokens[slot, :length].tolist(), missing) if missing else [])
        row.guessed = [True] * len(kept) + [False] * missing
        row.levels = [level[s:] + [None] * min(s, self.w) for level in row.levels]
        row.guesses, row.length = row.guesses[s:], length
        return row

    def propose(self, state: BatchState, k: int, slots: Slots):
        raise NotImplementedError("lookahead drafts a token tree; the engine runs it with its shape")

    def propose_tree(self, state: BatchState, shape: TreeShape, slots: Slots) -> TokenTree:
        """The window as one branch and the pool's n-grams after the last token as others, as a trie."""
        idx = slots.index
        lengths = state.lengths[idx]
        lasts = state.tokens[idx, lengths - 1].tolist()
        t = self.nodes
        tokens, parents, depths = [[0] * t for _ in lasts], [[-1] * t for _ in lasts], [[1] * t for _ in lasts]
        valid = [[False] * t for _ in lasts]
        for b, (slot, length, last) in enumerate(zip(idx.tolist(), lengths.tolist(), lasts, strict=True)):
            row = self._moved_on(state, slot, length)
            branches = [row.window, *row.pool.get(last, [])[: self.g]]
            index: dict[tuple[int, ...], int] = {}
            for level in range(1, max(map(len, branches)) + 1):
                for branch in branches:
                    prefix = tuple(branch[:level])
                    if len(prefix) < level or prefix in index:
                        continue
                    i = index[prefix] = len(index)
                    tokens[b][i], depths[b][i], valid[b][i] = prefix[-1], level, True
                    parents[b][i] = index[prefix[:-1]] if level > 1 else -1
            row.window_nodes = [index[tuple(row.window[: j + 1])] for j in range(self.w)]
        device = state.tokens.device
        as_long = lambda rows: torch.tensor(rows, dtype=torch.long, device=device)  # noqa: E731
        return TokenTree(as_long(tokens), as_long(parents), as_long(depths), torch.tensor(valid, device=device))

    def commit_tree(self, state: BatchState, old_lengths: torch.Tensor, slots: Slots, logits: torch.Tensor) -> None:
        """One Jacobi step per row: the target's argmax after the root and after each window prefix are the
        next guesses, and the trajectory's diagonals go into the pool. The row moves on when it next drafts."""
        best = logits.argmax(-1).tolist()  # [B, 1 + T]
        for b, slot in enumerate(slots.index.tolist()):
            row = self.rows[slot]
            # guesses[j]: the target's next token for window column j, made after columns < j
            row.guesses = [best[b][0]] + [best[b][1 + node] for node in row.window_nodes]
            levels = [*row.levels, [t if g else None for t, g in zip(row.window, row.guessed, strict=True)]]
            if self.g:
                self._collect(row, levels, row.guesses)
            row.levels = levels[len(levels) - (self.n - 2) :] if self.n > 2 else []

    def _collect(self, row: _Row, levels: list[list[int | None]], guesses: list[int]) -> None:
        """Each diagonal of the last N-1 windows and the new guesses: an n-gram the target made token by token."""
        if len(levels) < self.n - 1:
            return
        levels = levels[-(self.n - 1) :]
        for c in range(self.w + 1 - (self.n - 1)):
            gram = [levels[i][c + i] for i in range(self.n - 1)] + [guesses[c + self.n - 1]]
            if any(t is None for t in gram):
                continue
            key, rest = gram[0], tuple(gram[1:])
            found = row.pool.setdefault(key, [])
            if rest in found:
                found.remove(rest)
            found.insert(0, rest)  # the most recent first; the oldest dropped past G
            del found[self.g :]


def _fill(seq: list[int], width: int) -> list[int]:
    """Guesses for columns nobody has guessed yet: the sequence's own recent tokens (as LADE seeds its window
    from the prompt); Jacobi replaces them within a step or two."""
    tail = seq[-width:]
    return [tail[i % len(tail)] for i in range(width)]
