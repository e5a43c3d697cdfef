"""Token trees: several candidate continuations verified in one target pass (SpecInfer, Medusa, EAGLE-2).

A tree hangs below the last committed token (the root). Its nodes are numbered so that a parent comes
before its children and are written at consecutive cache slots after the committed sequence; each node
attends to the committed prefix, its ancestors and itself, at the rotary position its branch would give
it. One target pass then yields a distribution at every node.

Verification is SpecInfer's multi-candidate rejection sampling with deterministic candidates (a one-hot
q per candidate, as trtspec's drafters pick the top candidates rather than sampling them): at a node the
candidates are tried in turn, candidate c accepted with probability p(c) and otherwise removed from p
and p renormalised. Tried in turn, that is exactly one draw x from p followed by "descend into the
child whose token is x, else emit x and stop", which is how it is computed here. Every emitted token is
therefore a draw from the target's own distribution given the path so far: lossless at any temperature,
and at temperature 0 the path of argmaxes. Accepted nodes' keys and values are then moved to the slots
their positions occupy, so the cache is again one committed sequence.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from trtspec.speculative.model import KVCache, Slots, TreeAttention
from trtspec.speculative.requests import TreeShape

__all__ = ["TokenTree", "TreeShape", "TreeVerified", "ancestors", "compact", "verify_tree"]

if TYPE_CHECKING:
    from trtspec.speculative.batch import RowSampling


@dataclass
class TokenTree:
    """One tree per row, all with the same number of node slots."""

    tokens: torch.Tensor  # [B, T]
    parents: torch.Tensor  # [B, T] index of the parent node; -1: a child of the root
    depths: torch.Tensor  # [B, T] 1 for the root's children
    valid: torch.Tensor  # [B, T] bool; padding nodes are never accepted

    @property
    def max_depth(self) -> int:
        return int((self.depths * self.valid).max()) if self.valid.numel() else 0


def ancestors(parents: torch.Tensor) -> torch.Tensor:
    """[B, T, T] bool: node j is node i or one of its ancestors. Parents come before children."""
    b, t = parents.shape
    rows = torch.arange(b, device=parents.device)
    anc = torch.zeros(b, t, t, dtype=torch.bool, device=parents.device)
    for i in range(t):
        parent = parents[:, i]
        inherited = anc[rows, parent.clamp_min(0)] & (parent >= 0)[:, None]
        anc[:, i] = inherited
        anc[:, i, i] = True
    return anc


def tree_attention(prefix: torch.Tensor, start: torch.Tensor, anc: torch.Tensor, rope: torch.Tensor) -> TreeAttention:
    """Attention for queries whose ancestor rows are `anc` [B, Q, T], tree nodes at slots start..start+T-1.

    Every query sees slots < prefix (the committed sequence, root included) and the tree slots of its
    ancestors and itself."""
    b, q, t = anc.shape
    kv_len = int((start + t).max())
    keys = torch.arange(kv_len, device=anc.device)
    rel = keys[None, :] - start[:, None]  # [B, kv]
    in_tree = (rel >= 0) & (rel < t)
    seen = anc.gather(2, rel.clamp(0, t - 1)[:, None, :].expand(b, q, kv_len)) & in_tree[:, None, :]
    mask = (keys[None, None, :] < prefix[:, None, None]) | seen
    return TreeAttention(rope, mask.unsqueeze(1))


def verification_attention(tree: TokenTree, old: torch.Tensor) -> tuple[torch.Tensor, TreeAttention]:
    """Cache slots and attention for the target's pass over [root, nodes...]: root at old-1, node i at old+i."""
    b, t = tree.tokens.shape
    anc = ancestors(tree.parents)
    anc = torch.cat([torch.zeros(b, 1, t, dtype=torch.bool, device=anc.device), anc], 1)  # the root sees no node
    slots = (old - 1)[:, None] + torch.arange(t + 1, device=old.device)[None, :]
    rope = torch.cat([(old - 1)[:, None], (old - 1)[:, None] + tree.depths], 1)
    return slots, tree_attention(old, old, anc, rope)


@dataclass
class TreeVerified:
    tokens: torch.Tensor  # [B, D+1] accepted path's tokens then the next token; -1 after
    num_accepted: torch.Tensor  # [B]
    path: torch.Tensor  # [B, D] accepted node indices; -1 after


def verify_tree(tree: TokenTree, logits: torch.Tensor, sampling: RowSampling, depth: int | None = None) -> TreeVerified:
    """Walk down from the root: draw x from p at the current node; descend into the child whose token is
    x, else emit x and stop. `logits` [B, 1+T, V]: the root's, then each node's.

    Sampled rows draw `depth` + 1 times whatever happens (pass the shape's depth), so a seeded request's
    random stream does not depend on the trees of the rows beside it."""
    b = tree.tokens.shape[0]
    depth = tree.max_depth if depth is None else depth
    device = logits.device
    rows = torch.arange(b, device=device)
    current = torch.full((b,), -1, dtype=torch.long, device=device)
    alive = torch.ones(b, dtype=torch.bool, device=device)
    accepted = torch.zeros(b, dtype=torch.long, device=device)
    path = torch.full((b, max(depth, 1)), -1, dtype=torch.long, device=device)
    tokens = torch.full((b, depth + 1), -1, dtype=torch.long, device=device)
    nxt = torch.zeros(b, dtype=torch.long, device=device)
    for level in range(depth + 1):
        x, _ = sampling.draw(logits[rows, current + 1])
        match = tree.valid & (tree.parents == current[:, None]) & (tree.tokens == x[:, None])
        found = match.any(1) & alive if level < depth else torch.zeros_like(alive)
        nxt = torch.where(alive & ~found, x, nxt)
        alive_next = alive & found
        if level < depth:
            child = match.int().argmax(1)
            path[:, level] = torch.where(alive_next, child, path[:, level])
            tokens[:, level] = torch.where(alive_next, x, tokens[:, level])
            current = torch.where(alive_next, child, current)
            accepted += alive_next.long()
        alive = alive_next
        if sampling.greedy and not bool(alive.any()):
            break
    tokens[rows, accepted] = nxt
    return TreeVerified(tokens, accepted, path)


def compact(cache: KVCache, slots: Slots, start: torch.Tensor, path: torch.Tensor, accepted: torch.Tensor) -> None:
    """Move each row's accepted nodes (tree slots start + path[j]) to the slots start + j they now hold."""
    d = path.shape[1]
    if d == 0 or not bool((accepted > 0).any()):
        return
    j = torch.arange(d, device=path.device)[None, :]
    dst = start[:, None] + j
    src = torch.where(j < accepted[:, None], start[:, None] + path.clamp_min(0), dst)
    index = slots.index[:, None]
    for store in (cache.k, cache.v):
        store[:, index, :, dst] = store[:, index, :, src]
