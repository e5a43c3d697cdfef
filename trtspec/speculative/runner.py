"""The speculative decoding loop: draft K, verify in one target pass, keep what the rule accepts.

One function-sized loop in the spirit of gpt-fast, over a batch whose rows have their own lengths,
acceptance and stop conditions. The target's KV cache holds every committed position but the last
token, which each step feeds together with the drafts; rejected positions are simply left beyond
the valid length. With no drafter the same loop is plain autoregressive decoding, so speedups are
measured against the same code.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from trtspec.speculative.drafters import BatchState, Drafter
from trtspec.speculative.model import Transformer
from trtspec.speculative.sampling import SamplingParams, probs_from_logits, sample
from trtspec.speculative.verification import verify, verify_greedy


@dataclass(frozen=True)
class GenerationParams:
    max_tokens: int = 64
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_token_ids: frozenset[int] = frozenset()
    seed: int | None = None
    num_draft_tokens: int | None = None  # default: the runner's


@dataclass(frozen=True)
class Step:
    """One target pass after the prefill as one row saw it; the server's histograms observe these."""

    drafted: int
    accepted: int
    draft_s: float
    verify_s: float


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
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.num_draft_tokens = num_draft_tokens if drafter is not None else 0
        self.max_len = min(max_len, target.max_positions)
        self.verify_fn = verify_fn

    @torch.inference_mode()
    def generate(
        self, prompts: list[list[int]], params: GenerationParams, on_tokens: TokenCallback | None = None
    ) -> list[Generation]:
        """Generate for every prompt; `on_tokens(row, tokens)` streams each accepted chunk."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if params.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {params.max_tokens}")
        k_max = self.num_draft_tokens if params.num_draft_tokens is None else params.num_draft_tokens
        k_max = k_max if self.drafter is not None else 0
        batch = len(prompts)
        prompt_lens = torch.tensor([len(p) for p in prompts])
        capacity = int(prompt_lens.max()) + params.max_tokens + k_max + 2
        if capacity > self.max_len:
            raise ValueError(
                f"prompt ({int(prompt_lens.max())}) + max_tokens ({params.max_tokens}) + drafts "
                f"({k_max}) exceed the runner's {self.max_len} positions"
            )
        generator = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        state = BatchState(
            tokens=torch.zeros(batch, capacity, dtype=torch.long),
            lengths=prompt_lens.clone(),
            params=params.sampling,
            generator=generator,
            active=torch.ones(batch, dtype=torch.bool),
        )
        if len(set(prompt_lens.tolist())) == 1:
            state.tokens[:, : len(prompts[0])] = torch.tensor(prompts)
        else:
            for b, p in enumerate(prompts):
                state.tokens[b, : len(p)] = torch.tensor(p)
        needs_hidden = self.drafter is not None and self.drafter.needs_target_hidden
        if needs_hidden:
            state.target_hidden = torch.zeros(
                batch, capacity, self.target.dims.hidden_size, dtype=self.target.embed_tokens.weight.dtype
            )
        cache = self.target.new_cache(batch, capacity)
        rows = torch.arange(batch)
        produced = torch.zeros(batch, dtype=torch.long)
        stopped = torch.zeros(batch, dtype=torch.bool)
        steps, drafted, accepted = (torch.zeros(batch, dtype=torch.long) for _ in range(3))
        drafted_pos = torch.zeros(batch, max(k_max, 1), dtype=torch.long)
        accepted_pos = torch.zeros_like(drafted_pos)
        stop_ids = torch.tensor(sorted(params.stop_token_ids), dtype=torch.long)
        step_logs: list[list[Step]] = [[] for _ in range(batch)]

        def commit(new: torch.Tensor, count: torch.Tensor) -> None:
            """Append the first `count` of each active row's `new` tokens, honouring stops and max_tokens."""
            width = new.shape[1]
            idx = torch.arange(width)[None, :]
            count = torch.minimum(count, params.max_tokens - produced) * state.active
            if len(stop_ids):
                hit = torch.isin(new, stop_ids) & (idx < count[:, None])
                first = torch.where(hit.any(1), hit.int().argmax(1) + 1, count)
                stopped.logical_or_(hit.any(1))
                count = torch.minimum(count, first)
            keep = idx < count[:, None]
            positions = state.lengths[:, None] + idx
            state.tokens.scatter_(1, positions, torch.where(keep, new, state.tokens.gather(1, positions)))
            if on_tokens is not None:
                for b in torch.nonzero(count).flatten().tolist():
                    if on_tokens(b, new[b, : int(count[b])].tolist()) is True:  # the caller saw a stop string
                        stopped[b] = True
            state.lengths += count
            produced.add_(count)
            state.active &= ~stopped & (produced < params.max_tokens)

        # prefill: the whole prompt, right-padded; the first token comes from its last position
        t0 = time.perf_counter()
        width = int(prompt_lens.max())
        positions = torch.arange(width)[None, :].expand(batch, width)
        out = self.target(state.tokens[:, :width], positions, cache)
        if needs_hidden:
            state.target_hidden[:, :width] = out.hidden
        last_logits = out.logits[rows, prompt_lens - 1]
        if params.sampling.greedy:
            first = last_logits.argmax(-1)
        else:
            first = sample(probs_from_logits(last_logits, params.sampling), generator)
        prefill_s = time.perf_counter() - t0
        commit(first[:, None], torch.ones(batch, dtype=torch.long))
        if self.drafter is not None:
            self.drafter.start(state, capacity)
        draft_s = verify_s = 0.0

        while bool(state.active.any()):
            old = state.lengths.clone()
            active = state.active.clone()
            remaining = params.max_tokens - produced
            k = min(k_max, int(remaining[active].max()) - 1)
            t0 = time.perf_counter()
            if k > 0:
                proposal = self.drafter.propose(state, k)
                drafts, q = proposal.tokens, proposal.probs
                num_drafts = torch.minimum(proposal.num_drafts, (remaining - 1).clamp_min(0))
            else:
                drafts, q = torch.zeros(batch, 0, dtype=torch.long), None
                num_drafts = torch.zeros(batch, dtype=torch.long)
            t1 = time.perf_counter()
            step_tokens = torch.cat([state.tokens[rows, old - 1][:, None], drafts], dim=1)
            positions = (old - 1)[:, None] + torch.arange(k + 1)[None, :]
            out = self.target(step_tokens, positions, cache)
            if params.sampling.greedy and self.verify_fn is verify:
                result = verify_greedy(drafts, out.logits, num_drafts)
            else:
                result = self.verify_fn(
                    drafts, q, probs_from_logits(out.logits, params.sampling), generator, num_drafts
                )
            if needs_hidden:
                state.target_hidden[rows[:, None], positions] = out.hidden
            t2 = time.perf_counter()
            draft_s, verify_s = draft_s + t1 - t0, verify_s + t2 - t1
            m = result.num_accepted * active
            steps += active
            drafted += num_drafts * active
            accepted += m
            pos = torch.arange(k)[None, :]
            drafted_pos[:, :k] += (pos < num_drafts[:, None]) & active[:, None]
            accepted_pos[:, :k] += (pos < m[:, None]) & active[:, None]
            for b in torch.nonzero(active).flatten().tolist():
                step_logs[b].append(Step(int(num_drafts[b]), int(m[b]), t1 - t0, t2 - t1))
            commit(result.tokens, result.num_accepted + 1)
            if k > 0:
                self.drafter.commit(state, old, k)

        generations = []
        for b in range(batch):
            tokens = state.tokens[b, int(prompt_lens[b]) : int(state.lengths[b])].tolist()
            stats = RequestStats(
                prompt_tokens=int(prompt_lens[b]),
                output_tokens=len(tokens),
                steps=int(steps[b]),
                draft_tokens=int(drafted[b]),
                accepted_tokens=int(accepted[b]),
                drafted_per_position=drafted_pos[b, :k_max].tolist(),
                accepted_per_position=accepted_pos[b, :k_max].tolist(),
                prefill_s=prefill_s,
                draft_s=draft_s,
                verify_s=verify_s,
                step_log=step_logs[b],
            )
            generations.append(Generation(tokens, "stop" if bool(stopped[b]) else "length", stats))
        return generations
