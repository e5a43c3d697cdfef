"""The speculative decoding loop, run to completion on one batch: draft K, verify in one target pass.

The loop itself is `batch.BatchEngine.step`, the same code the served torch models run with
requests joining and leaving between steps; here every prompt joins at once and the call returns
when the last one finishes. The target's KV cache holds every committed position but the last
token, which each step feeds together with the drafts; rejected positions are simply left beyond
the valid length. With no drafter the same loop is plain autoregressive decoding, so speedups are
measured against the same code.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from trtspec.speculative.batch import BatchEngine, KPolicy, Sequence, draft_slots, reserved_positions
from trtspec.speculative.drafters import Drafter
from trtspec.speculative.model import Transformer
from trtspec.speculative.requests import Generation, GenerationParams, RequestStats, Step
from trtspec.speculative.tree import TreeShape
from trtspec.speculative.verification import verify

__all__ = ["Generation", "GenerationParams", "RequestStats", "SpeculativeRunner", "Step"]

# on_tokens(row, tokens) streams each accepted chunk; returning True stops that row (a stop string seen)
TokenCallback = Callable[[int, list[int]], bool | None]


class SpeculativeRunner:
    def __init__(
        self,
        target: Transformer,
        drafter: Drafter | None = None,
        num_draft_tokens: int = 4,
        max_len: int = 1024,
        verify_fn=verify,
        tree: TreeShape | None = None,
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.tree = tree or (drafter.fixed_tree if drafter is not None else None)
        self.num_draft_tokens = num_draft_tokens if drafter is not None else 0
        self.max_len = min(max_len, target.max_positions)
        self.verify_fn = verify_fn

    def engine(
        self, slots: int, capacity: int | None = None, max_num_tokens: int | None = None, policy: KPolicy | None = None
    ) -> BatchEngine:
        """An in-flight batching engine over this runner's models (the served torch models run one)."""
        return BatchEngine(
            self.target,
            self.drafter,
            self.num_draft_tokens,
            slots,
            capacity or self.max_len,
            max_num_tokens=max_num_tokens,
            verify_fn=self.verify_fn,
            policy=policy,
            reuse=True,
            tree=self.tree,
        )

    def forget_history(self) -> None:
        """Start as a freshly started server: measurements call it so that repeated prompts do not find their
        earlier outputs in a drafter's memory (TensorRT-LLM's public n-gram pool keeps every request's)."""
        if self.drafter is not None:
            self.drafter.forget_history()

    def verify_width(self, k: int) -> int:
        """Tokens one target pass verifies at K drafts: the last committed token and every draft (or tree node)."""
        return 1 + draft_slots(self.drafter, self.tree, k)

    @torch.inference_mode()
    def generate(
        self, prompts: list[list[int]], params: GenerationParams, on_tokens: TokenCallback | None = None
    ) -> list[Generation]:
        """Generate for every prompt; `on_tokens(row, tokens)` streams each accepted chunk."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if params.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {params.max_tokens}")
        # the caches hold what the longest request needs, not max_len
        longest = max(len(p) for p in prompts)
        capacity = reserved_positions(longest, params, self.drafter, self.tree, self.num_draft_tokens)
        if capacity > self.max_len:
            raise ValueError(
                f"prompt ({longest}) + max_tokens ({params.max_tokens}) with its drafts need {capacity} positions: "
                f"they exceed the runner's {self.max_len}"
            )
        engine = BatchEngine(
            self.target,
            self.drafter,
            self.num_draft_tokens,
            len(prompts),
            capacity,
            verify_fn=self.verify_fn,
            tree=self.tree,
        )
        device = engine.device
        generator = torch.Generator(device=device).manual_seed(params.seed) if params.seed is not None else None
        seqs = [
            Sequence(
                prompt,
                params,
                None if on_tokens is None else (lambda toks, row=row: on_tokens(row, toks)),
                generator=generator,
            )
            for row, prompt in enumerate(prompts)
        ]
        for seq in seqs:
            engine.add(seq)
        while engine.has_work():
            engine.step()
        return [seq.result for seq in seqs]
