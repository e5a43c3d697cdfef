"""TensorRT-LLM's n-gram pool: the rules its NGram drafter proposes by, so the torch runner drafts what it drafts.

Read from NGramPoolManager (tensorrt_llm/_torch/speculative/ngram.py at NVIDIA/TensorRT-LLM 0249976, 2026):
- Each call first adds the request's new tokens to the pool: every pattern of 1 to `max_ngram` tokens in
  the part of the sequence not yet scanned maps to the (up to K) tokens that follow it. A pattern not in
  the pool, or (keep_all off) a match longer than the pool's first, replaces what the pattern had; a match
  not yet held drops the held matches shorter than it and is appended.
- Then the longest suffix of the sequence found as a pattern drafts its oldest match (`use_oldest`) or its
  newest, cut to what the request may still produce.
- The next scan starts K + max_ngram - 1 tokens before the sequence's end, so matches cut short by the end
  are extended once their tokens exist.
- A public pool is shared by every request and never pruned; a private one is dropped with its request.

Matches are kept as NVIDIA keeps them, in insertion order, including one quirk: the shorter matches are
dropped while iterating the same list, so a short match right after a dropped one survives. Earlier copies of
the file (before `max_total_draft_tokens`) share these rules but draft the end token where nothing matches and
pad every draft to K with it; that padding (always rejected, always verified) is not modeled.
"""

from __future__ import annotations

Pattern = tuple[int, ...]
Pool = dict[Pattern, list[Pattern]]


class NgramPool:
    def __init__(self, keep_all: bool = True, use_oldest: bool = True, public: bool = True) -> None:
        self.keep_all, self.use_oldest, self.public = keep_all, use_oldest, public
        self.clear()

    def clear(self) -> None:
        """Every request's patterns and scan positions gone, the flags kept."""
        self.shared: Pool = {}
        self.private: dict[int, Pool] = {}
        self.start: dict[int, int] = {}  # request -> where its next scan begins

    def forget(self, request: int) -> None:
        """A finished request: its scan position, and its pool where pools are private."""
        self.start.pop(request, None)
        self.private.pop(request, None)

    def _update(self, prefix: list[int], request: int, k: int, max_ngram: int) -> Pool:
        if request not in self.start:
            self.start[request] = 0
            if not self.public:
                self.private[request] = {}
        pool = self.shared if self.public else self.private[request]
        sequence = prefix[self.start[request] :]
        for size in range(min(max_ngram, len(prefix) - 1), 0, -1):
            for left in range(len(sequence) - size):
                pattern = tuple(sequence[left : left + size])
                match = tuple(sequence[left + size : min(left + size + k, len(sequence))])
                held = pool.get(pattern)
                if held is None or (not self.keep_all and len(match) > len(held[0])):
                    pool[pattern] = [match]
                elif match not in held:
                    i = 0
                    while i < len(held):  # NVIDIA removes while iterating: the element after a removal is skipped
                        if len(held[i]) < len(match):
                            del held[i]
                        i += 1
                    held.append(match)
        self.start[request] = max(0, len(prefix) - (k + max_ngram - 1))
        return pool

    def drafts(self, prefix: list[int], request: int, k: int, max_ngram: int) -> list[int]:
        """Up to k drafts for `request` whose committed tokens are `prefix` (k <= 0: none, the pool untouched)."""
        if k <= 0:
            return []
        pool = self._update(prefix, request, k, max_ngram)
        for size in range(min(max_ngram, len(prefix) - 1), 0, -1):
            held = pool.get(tuple(prefix[-size:]))
            if held is not None:
                return list(held[0 if self.use_oldest else -1])[:k]
        return []

    def candidates(self, prefix: list[int], request: int, depth: int, width: int, max_ngram: int) -> list[list[int]]:
        """Up to `width` matches that each add a node to a tree, longest suffix first and preferred match first
        (a tree's branches: TensorRT-LLM's NGram drafts only the first)."""
        if depth <= 0:
            return []
        pool = self._update(prefix, request, depth, max_ngram)
        found: list[list[int]] = []
        for size in range(min(max_ngram, len(prefix) - 1), 0, -1):
            held = pool.get(tuple(prefix[-size:]), [])
            for match in held if self.use_oldest else reversed(held):
                if not any(f[: len(match)] == list(match) for f in found):  # else a branch already holds it
                    found.append(list(match))
                    if len(found) == width:
                        return found
        return found
