"""What a generation request asks for and what it gets back: shared by the runner, the engine and the servers.

No torch here: the BLS model, which only relays requests, imports these without loading torch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k
    top_p: float = 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int = 64
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_token_ids: frozenset[int] = frozenset()
    seed: int | None = None
    num_draft_tokens: int | None = None  # default: the runner's


MAX_TREE_NODES = 64  # as TensorRT-LLM's Medusa trees (max_medusa_token_len 63 by default)


@dataclass(frozen=True)
class TreeShape:
    """A tree `depth` levels deep keeping the `width` best nodes per level (EAGLE-2's pruning by draft score)."""

    depth: int
    width: int

    @property
    def nodes(self) -> int:
        return self.depth * self.width

    def __str__(self) -> str:
        return f"{self.depth}x{self.width}"

    @staticmethod
    def parse(text: str) -> TreeShape:
        """'4x3': 4 levels, 3 nodes kept per level."""
        match = re.fullmatch(r"\s*(\d+)\s*x\s*(\d+)\s*", text)
        if not match or int(match[1]) < 1 or int(match[2]) < 1:
            raise ValueError(f"tree shape must be DEPTHxWIDTH with both >= 1 (e.g. 4x3), got {text!r}")
        shape = TreeShape(int(match[1]), int(match[2]))
        if shape.nodes > MAX_TREE_NODES:
            raise ValueError(
                f"tree {text.strip()} has {shape.nodes} nodes; at most {MAX_TREE_NODES} are verified per pass"
            )
        return shape


def positions_needed(prompt_tokens: int, max_tokens: int, draft_slots: int) -> int:
    """KV-cache positions a request reserves: its prompt and output, the slots the widest step writes
    drafts into past them (K for a chain, every node of a tree), and two for the bonus token."""
    return prompt_tokens + max_tokens + draft_slots + 2


@dataclass(frozen=True)
class Step:
    """One target pass after the prefill as one row saw it; the server's histograms observe these."""

    drafted: int
    accepted: int
    draft_s: float  # proposing, and the drafter's bookkeeping after the pass (a cache rollback, a Jacobi update)
    verify_s: float  # the target pass and the acceptance rule


@dataclass
class RequestStats:
    prompt_tokens: int = 0
    output_tokens: int = 0
    steps: int = 0  # target passes after the prefill
    draft_tokens: int = 0
    accepted_tokens: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    reused_prompt_tokens: int = 0  # prompt positions another request left in the KV cache
    step_log: list[Step] = field(default_factory=list, repr=False)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @property
    def tokens_per_step(self) -> float:
        # the first output token comes from the prefill, every later one from a step
        return (self.output_tokens - 1) / self.steps if self.steps else 0.0

    def as_dict(self) -> dict:
        pos = [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position, strict=True)]
        return {
            **{k: v for k, v in self.__dict__.items() if k != "step_log"},
            "acceptance_rate": self.acceptance_rate,
            "tokens_per_step": self.tokens_per_step,
            "acceptance_per_position": pos,
        }


@dataclass
class Generation:
    tokens: list[int]
    finish_reason: str  # "stop" (EOS or a stop token) or "length"
    stats: RequestStats
