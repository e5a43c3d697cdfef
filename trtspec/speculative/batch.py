"""In-flight batching: sequences join and leave the running batch between steps.

The target's and the drafter's KV caches have one row per slot (`slots` of them, `capacity`
positions each), so admission reserves a whole sequence's positions and a request that could never
finish is refused up front. Each `step()` first feeds waiting prompts beside the running rows (in
chunks when `max_num_tokens` leaves less room than a whole prompt, as TensorRT-LLM's chunked
context does), then runs one speculative step over every running row: each row drafts, is verified
and stops on its own, and K per step comes from the engine's policy. A finished slot keeps its
tokens, so a new prompt that shares a prefix with it skips that prefix (TensorRT-LLM's KV-cache
reuse, at the grain of a slot rather than a block). `SpeculativeRunner.generate` is this loop run
to completion on one batch, so in-process and served numbers come from the same code.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch

from trtspec.speculative.drafters import BatchState, Drafter, _positions, _window
from trtspec.speculative.model import ForwardOut, Slots, Transformer
from trtspec.speculative.requests import (
    Generation,
    GenerationParams,
    RequestStats,
    SamplingParams,
    Step,
    positions_needed,
)
from trtspec.speculative.sampling import probs_from_logits, sample
from trtspec.speculative.tree import TreeShape, TreeVerified, compact, verification_attention, verify_tree
from trtspec.speculative.verification import Verified, verify, verify_greedy

# on_tokens(tokens) streams each accepted chunk of one sequence; returning True stops it (a stop string)
ChunkCallback = Callable[[list[int]], bool | None]


class RowSampling:
    """How the rows of one step draw tokens: groups of rows sharing sampling params and a generator.

    One group (a whole `generate` call) keeps every draw a single batched call; requests with their
    own seeds each draw from their own generator, so a seeded request gives the same tokens whoever
    it shares the batch with.
    """

    def __init__(self, rows: list[tuple[SamplingParams, torch.Generator | None]], device) -> None:
        groups: dict[tuple, list[int]] = {}
        keys: dict[tuple, tuple[SamplingParams, torch.Generator | None]] = {}
        seen: dict[tuple[int, int], tuple] = {}  # a whole generate call shares one params object: hash it once
        for i, (params, generator) in enumerate(rows):
            key = seen.get((id(params), id(generator)))
            if key is None:
                key = ("greedy",) if params.greedy else (params, id(generator))
                seen[(id(params), id(generator))] = key
            groups.setdefault(key, []).append(i)
            keys.setdefault(key, (params, generator))
        self.groups = [(torch.tensor(idx, dtype=torch.long, device=device), *keys[key]) for key, idx in groups.items()]
        self.greedy = all(params.greedy for params, _ in rows)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        if len(self.groups) == 1:
            return probs_from_logits(logits, self.groups[0][1])
        out = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
        for rows, params, _ in self.groups:
            out[rows] = probs_from_logits(logits[rows], params)
        return out

    def draw(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A token per row and the distribution it was drawn from (None: all greedy, one-hot)."""
        if self.greedy:
            return logits.argmax(-1), None
        q = self.probs(logits)
        if len(self.groups) == 1:
            return sample(q, self.groups[0][2]), q
        tokens = torch.empty(logits.shape[:-1], dtype=torch.long, device=logits.device)
        for rows, _, generator in self.groups:
            tokens[rows] = sample(q[rows], generator)
        return tokens, q

    def verify(self, drafts, q, logits, num_drafts, verify_fn=verify) -> Verified:
        """The rejection rule per group, each with its own generator; greedy rows by argmax."""
        if self.greedy and verify_fn is verify:
            return verify_greedy(drafts, logits, num_drafts)
        if len(self.groups) == 1:
            return verify_fn(drafts, q, self.probs(logits), self.groups[0][2], num_drafts)
        p = self.probs(logits)
        tokens = torch.full((drafts.shape[0], drafts.shape[1] + 1), -1, dtype=torch.long, device=drafts.device)
        accepted = torch.zeros(drafts.shape[0], dtype=torch.long, device=drafts.device)
        for rows, _, generator in self.groups:
            r = verify_fn(drafts[rows], None if q is None else q[rows], p[rows], generator, num_drafts[rows])
            tokens[rows], accepted[rows] = r.tokens, r.num_accepted
        return Verified(tokens, accepted)


@dataclass(eq=False)
class Sequence:
    """One request in the engine: what it asked for, and (when done) what it got."""

    prompt: list[int]
    params: GenerationParams
    on_tokens: ChunkCallback | None = None
    generator: torch.Generator | None = None  # default: seeded from params.seed, else the global RNG
    cancelled: bool = False  # set from any thread; the engine drops the sequence before its next step
    # TensorRT-LLM's draft_input_ids: verify these drafts after `prompt` in one step, no first token of its own
    drafts: list[int] | None = None
    draft_logits: torch.Tensor | None = None  # [len(drafts), V] logits they were drawn from; None: one-hot
    min_tokens: int = 0  # stop tokens cannot be drawn before this many (speculating or not)
    keep_logits: bool = False  # keep each output token's logits in `logits` (plain decoding only)
    logits: list[torch.Tensor] = field(default_factory=list, repr=False)
    # the engine's bookkeeping
    slot: int = -1
    fed: int = 0  # prompt positions in the target's cache
    reused: int = 0  # of those, positions another sequence left in the slot
    num_draft_tokens: int = 0
    admitted_ns: int = 0  # wall clock at admission (TensorRT-LLM's first_scheduled_time_ns)
    prefill_s: float = 0.0
    step_log: list[Step] = field(default_factory=list, repr=False)
    result: Generation | None = None

    @property
    def prefill_target(self) -> int:
        """Prompt positions to cache before decoding: all, or all but the last when verifying given drafts."""
        return len(self.prompt) - (1 if self.drafts is not None else 0)

    @property
    def prefilled(self) -> bool:
        # prefill_target, inlined: asked per row per step
        return self.fed == len(self.prompt) - (self.drafts is not None)


def draft_slots(drafter: Drafter | None, tree: TreeShape | None, k: int) -> int:
    """Cache slots a step writes drafts into: K for a chain, every node of the drafter's tree (none when K is 0)."""
    return drafter.tree_nodes(tree) if tree is not None and drafter is not None and k > 0 else k


def draft_room(k: int, engine_k: int, drafting: bool) -> int:
    """Drafts a row makes room for: its own K, or the engine's when larger (the drafter drafts the batch's
    largest K for every row; the target's pass stops at each row's own)."""
    return max(k, engine_k) if drafting else k


def request_k(
    drafter: Drafter | None,
    tree: TreeShape | None,
    engine_k: int,
    params: GenerationParams,
    drafts: list[int] | None = None,
) -> int:
    """Drafts a request asks of a step: the drafts it brings (TensorRT-LLM's draft_input_ids), else none without
    a drafter, the tree's depth, its own K or the engine's."""
    if drafts is not None:
        return len(drafts)
    if drafter is None:
        return 0
    if tree is not None:
        return tree.depth
    return engine_k if params.num_draft_tokens is None else params.num_draft_tokens


def reserved_positions(
    prompt_tokens: int,
    params: GenerationParams,
    drafter: Drafter | None,
    tree: TreeShape | None,
    engine_k: int,
    drafts: list[int] | None = None,
) -> int:
    """Positions a sequence reserves: prompt, output, the widest step's drafts (`request_k`), and the bonus.
    The engine refuses a sequence by it; runners and servers size and refuse by it."""
    k = request_k(drafter, tree, engine_k, params, drafts)
    room = draft_slots(drafter, tree, draft_room(k, engine_k, drafter is not None))
    return positions_needed(prompt_tokens, params.max_tokens, room)


class KPolicy:
    """Drafts per step for a running batch of `batch` rows; the engine default is a fixed K."""

    def k(self, batch: int, k_max: int) -> int:
        return k_max

    def observe(self, batch: int, k: int, seconds: float, drafted: list[int], accepted: list[int]) -> None:
        """One step's cost and per-position counts, for policies that learn."""


class BatchEngine:
    def __init__(
        self,
        target: Transformer,
        drafter: Drafter | None,
        num_draft_tokens: int,
        slots: int,
        capacity: int,
        max_num_tokens: int | None = None,
        verify_fn=verify,
        policy: KPolicy | None = None,
        reuse: bool = False,
        tree: TreeShape | None = None,
    ) -> None:
        self.target, self.drafter = target, drafter
        own = drafter.fixed_tree if drafter is not None else None  # lookahead's follows from (W, N, G)
        if own is not None and tree not in (None, own):
            raise ValueError(f"{type(drafter).__name__} drafts its own tree ({own}), not {tree}")
        tree = tree or own
        if tree is not None and (drafter is None or not drafter.proposes_trees):
            raise ValueError(f"{type(drafter).__name__} drafts chains only: no token tree")
        if tree is not None and verify_fn is not verify:
            raise ValueError("the planted verification bugs are rules for chains: no token tree")
        self.tree = tree
        # with a tree, K is its depth: the most drafts a step can accept
        num_draft_tokens = tree.depth if tree is not None else num_draft_tokens
        self.num_draft_tokens = num_draft_tokens if drafter is not None else 0
        self.capacity = min(capacity, target.max_positions)
        self.max_num_tokens = max_num_tokens
        self.verify_fn = verify_fn
        self.policy = policy or KPolicy()
        self.reuse = reuse
        self.device = target.embed_tokens.weight.device
        self.rows: list[Sequence | None] = [None] * slots
        self.free = set(range(slots))
        self.waiting: deque[Sequence] = deque()
        self.cached = torch.zeros(slots, dtype=torch.long, device=self.device)  # positions valid for tokens[slot]
        self.produced = torch.zeros(slots, dtype=torch.long, device=self.device)
        self.stopped = torch.zeros(slots, dtype=torch.bool, device=self.device)
        self.state = BatchState(
            tokens=torch.zeros(slots, self.capacity, dtype=torch.long, device=self.device),
            lengths=torch.zeros(slots, dtype=torch.long, device=self.device),
        )
        self.needs_hidden = drafter is not None and drafter.needs_target_hidden
        # an EAGLE-3 head reads several layers' outputs instead of the final hidden state
        self.capture: tuple[int, ...] = drafter.feature_layers if drafter is not None else ()
        if self.needs_hidden:
            d, dtype = target.dims.hidden_size * max(1, len(self.capture)), target.embed_tokens.weight.dtype
            self.state.target_hidden = torch.zeros(slots, self.capacity, d, dtype=dtype, device=self.device)
        self.cache = target.new_cache(slots, self.capacity)
        width = max(self.num_draft_tokens, 1)
        self.drafted_pos = torch.zeros(slots, width, dtype=torch.long, device=self.device)
        self.accepted_pos = torch.zeros_like(self.drafted_pos)
        if drafter is not None:
            drafter.start(self.state, self.capacity)
        self.last_k = 0  # K of the latest step, and the rows it ran (for metrics)
        self.last_batch = 0

    # -- admission ------------------------------------------------------------------------------

    def positions_needed(self, prompt_tokens: int, params: GenerationParams, drafts: list[int] | None = None) -> int:
        """What `add` refuses a sequence by (`reserved_positions`), for servers to refuse it first."""
        return reserved_positions(prompt_tokens, params, self.drafter, self.tree, self.num_draft_tokens, drafts)

    def _draft_slots(self, k: int) -> int:
        return draft_slots(self.drafter, self.tree, k)

    def add(self, seq: Sequence) -> None:
        """Queue a sequence; raises ValueError for one that could not finish in a slot."""
        if not seq.prompt:
            raise ValueError("every prompt needs at least one token")
        if seq.params.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {seq.params.max_tokens}")
        if seq.drafts is not None and self.drafter is not None:  # its caches would not follow the given drafts
            raise ValueError("this model drafts its own tokens: draft_input_ids are for a model without a drafter")
        seq.num_draft_tokens = request_k(self.drafter, self.tree, self.num_draft_tokens, seq.params, seq.drafts)
        if self.positions_needed(len(seq.prompt), seq.params, seq.drafts) > self.capacity:
            raise ValueError(
                f"prompt ({len(seq.prompt)}) + max_tokens ({seq.params.max_tokens}) + drafts "
                f"({seq.num_draft_tokens}) exceed the runner's {self.capacity} positions"
            )
        if seq.generator is None and seq.params.seed is not None:
            seq.generator = torch.Generator(device=self.device).manual_seed(seq.params.seed)
        self.waiting.append(seq)

    def reset(self) -> list[Sequence]:
        """Drop every sequence (after a failed step, whose state cannot be trusted); returns them."""
        dropped = [s for s in self.rows if s is not None] + list(self.waiting)
        self.waiting.clear()
        self.rows = [None] * len(self.rows)
        self.free = set(range(len(self.rows)))
        self.cached.zero_()
        self.stopped.zero_()
        if self.drafter is not None:
            self.drafter.admit(torch.arange(len(self.rows), device=self.device), self.cached)
        return dropped

    @property
    def running(self) -> int:
        return len(self.rows) - len(self.free)

    def has_work(self) -> bool:
        return bool(self.waiting) or self.running > 0

    def _reused_prefix(self, prompt: list[int], free: list[int]) -> tuple[int, int]:
        """The free slot whose cached tokens share the longest prefix with `prompt`, and that length."""
        limit = min(len(prompt) - 1, self.capacity)  # the last prompt token is always fed: its logits start decoding
        if not self.reuse or limit <= 0:
            return free[-1], 0
        index = torch.tensor(free, device=self.device)
        head = torch.tensor(prompt[:limit], dtype=torch.long, device=self.device)
        same = self.state.tokens[index, :limit] == head[None, :]
        same &= torch.arange(limit, device=self.device)[None, :] < self.cached[index, None]
        shared = same.long().cumprod(1).sum(1)
        best = len(free) - 1 - int(shared.flip(0).argmax())  # `free` runs high to low: the lowest slot of the best
        return free[best], int(shared[best])

    def _admit(self, finished: list[Sequence]) -> None:
        admitted, slots, reused = [], [], []
        # lowest first (popped from the end): running rows stay contiguous, so steps use cache views
        free = sorted(self.free, reverse=True)
        while self.waiting and free:
            seq = self.waiting.popleft()
            if seq.cancelled:
                finished += self._finish([seq], "cancelled")
                continue
            slot, shared = self._reused_prefix(seq.prompt, free)
            if slot == free[-1]:
                free.pop()
            else:
                free.remove(slot)
            self.free.discard(slot)
            self.rows[slot] = seq
            seq.slot, seq.fed, seq.reused, seq.admitted_ns = slot, shared, shared, time.time_ns()
            admitted.append(seq)
            slots.append(slot)
            reused.append(shared)
        if not admitted:
            return
        # the admitted rows' state in a few batched writes (a burst of thousands admits at once)
        index = torch.tensor(slots, device=self.device)
        lengths = torch.tensor([len(s.prompt) for s in admitted], device=self.device)
        cols = torch.arange(int(lengths.max()), device=self.device)[None, :]
        prompts = torch.tensor([s.prompt + [0] * (cols.shape[1] - len(s.prompt)) for s in admitted], device=self.device)
        current = self.state.tokens[index[:, None], cols]
        self.state.tokens[index[:, None], cols] = torch.where(cols < lengths[:, None], prompts, current)
        self.state.lengths[index] = lengths
        shared = torch.tensor(reused, device=self.device)
        self.cached[index] = shared
        self.produced[index] = 0
        self.stopped[index] = False
        self.drafted_pos[index] = 0
        self.accepted_pos[index] = 0
        if self.drafter is not None:
            self.drafter.admit(index, shared)
        width = max((s.num_draft_tokens for s in admitted), default=0)
        if width > self.drafted_pos.shape[1]:
            pad = torch.zeros(len(self.rows), width - self.drafted_pos.shape[1], dtype=torch.long, device=self.device)
            self.drafted_pos = torch.cat([self.drafted_pos, pad], 1)
            self.accepted_pos = torch.cat([self.accepted_pos, pad.clone()], 1)

    # -- one iteration --------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[Sequence]:
        """Admit, feed prompts, run one speculative step; returns the sequences that finished."""
        gone = [s for s in self.waiting if s.cancelled]  # while every slot is busy, too
        for seq in gone:
            self.waiting.remove(seq)
        finished = self._finish([s for s in self.rows if s is not None and s.cancelled] + gone, "cancelled")
        self._admit(finished)
        decoding = [s for s in self.rows if s is not None and s.prefilled]
        k = self.policy.k(len(decoding), self.num_draft_tokens) if decoding else 0
        budget = (
            None if self.max_num_tokens is None else self.max_num_tokens - len(decoding) * (self._draft_slots(k) + 1)
        )
        prefilling = [s for s in self.rows if s is not None and not s.prefilled]
        if prefilling:
            self._prefill(sorted(prefilling, key=lambda s: s.admitted_ns), budget)
        if decoding and self.tree is not None and k > 0:  # the policy may turn drafting off (max_concurrency)
            self._decode_tree(decoding)
        elif decoding:
            self._decode(decoding, k)
        running = [s for s in self.rows if s is not None and s.prefilled]
        if running:
            index = torch.tensor([s.slot for s in running], device=self.device)
            limits = torch.tensor([s.params.max_tokens for s in running], device=self.device)
            verified = torch.tensor([s.drafts is not None and bool(s.step_log) for s in running], device=self.device)
            done = (self.stopped[index] | (self.produced[index] >= limits) | verified).tolist()
            finished += self._finish([s for s, d in zip(running, done, strict=True) if d], None)
        return finished

    def _prefill(self, seqs: list[Sequence], budget: int | None) -> None:
        left = float("inf") if budget is None else max(budget, 0)
        chunks = []
        for seq in seqs:
            n = min(seq.prefill_target - seq.fed, left)
            if n <= 0:
                break
            chunks.append((seq, int(n)))
            left -= n
        if not chunks:
            return
        t0 = time.perf_counter()
        slots = Slots.of([s.slot for s, _ in chunks], self.device)
        starts = torch.tensor([s.fed for s, _ in chunks], device=self.device)
        counts = torch.tensor([n for _, n in chunks], device=self.device)
        tokens = _window(self.state.tokens, starts, counts, slots.index)
        positions = _positions(starts, counts)
        # logits only at each row's last column (the padding repeats the last real position); the
        # states a drafter reads (MTP's, Medusa's, EAGLE-3's captured layers) come back for every position
        same = _same_rows(self.state.tokens, slots.index, starts, counts)
        if same is None:
            out = self.target(tokens, positions, self.cache, last_only=True, slots=slots, capture=self.capture)
        else:  # rows feeding what another row feeds are computed once and their keys and values copied
            first, copy_of = same
            run = Slots.of(slots.index[first].tolist(), self.device)
            out = self.target(
                tokens[first], positions[first], self.cache, last_only=True, slots=run, capture=self.capture
            )
            copies = (first[copy_of] != torch.arange(len(copy_of), device=self.device)).nonzero()[:, 0]
            src, dst = slots.index[first[copy_of[copies]]][:, None], slots.index[copies][:, None]
            at = positions[copies]
            for layer in range(self.cache.k.shape[0]):  # a layer at a time: no gather of the whole prompt cache
                self.cache.k[layer][dst, :, at] = self.cache.k[layer][src, :, at]
                self.cache.v[layer][dst, :, at] = self.cache.v[layer][src, :, at]
            features = None if out.features is None else out.features[copy_of]
            out = ForwardOut(out.logits[copy_of], out.hidden[copy_of], features)
        if self.needs_hidden:
            self.state.target_hidden[slots.index[:, None], positions] = self._states(out)
        for seq, n in chunks:
            seq.fed += n
        self.cached[slots.index] = starts + counts
        # rows whose prompt is now cached draw their first token, except those verifying given drafts
        done = [i for i, (seq, _) in enumerate(chunks) if seq.prefilled and seq.drafts is None]
        if done:
            rows = torch.tensor(done, device=self.device)
            last = out.logits[rows, -1]
            seqs = [chunks[i][0] for i in done]
            last = self._plain_logits(seqs, last)
            first, _ = RowSampling([(s.params.sampling, s.generator) for s in seqs], self.device).draw(last)
            ones = torch.ones(len(seqs), dtype=torch.long, device=self.device)
            self._commit(seqs, first[:, None], ones)
        elapsed = time.perf_counter() - t0
        for seq, _ in chunks:
            seq.prefill_s += elapsed

    def _decode(self, seqs: list[Sequence], k_policy: int) -> None:
        slots = Slots.of([s.slot for s in seqs], self.device)
        idx = slots.index
        sampling = RowSampling([(s.params.sampling, s.generator) for s in seqs], self.device)
        self.state.sampling = sampling
        old = self.state.lengths[idx].clone()
        remaining = torch.tensor([s.params.max_tokens for s in seqs], device=self.device) - self.produced[idx]
        k_rows = torch.tensor(
            [s.num_draft_tokens if s.drafts is not None else min(s.num_draft_tokens, k_policy) for s in seqs],
            device=self.device,
        )
        # a step drafts the rows' K even where a row's end leaves room for fewer (those drafts are not counted):
        # each row then draws as often alone as beside others, so a seeded request's tokens do not depend on
        # who shares its batch
        k = int(k_rows.max())
        plain = k_rows == 0  # rows decoding plainly this step (keep_logits, or K = 0)
        k_rows = torch.minimum(k_rows, remaining - 1).clamp_min(0)
        self.state.room = k_rows
        n = len(seqs)
        t0 = time.perf_counter()
        drafting = self.drafter is not None and any(s.drafts is None for s in seqs)
        if k > 0 and drafting:
            proposal = self.drafter.propose(self.state, k, slots)
            drafts, q = proposal.tokens, proposal.probs
            num_drafts = torch.minimum(proposal.num_drafts, k_rows)
        else:
            drafts, q = torch.zeros(n, k, dtype=torch.long, device=self.device), None
            num_drafts = torch.zeros(n, dtype=torch.long, device=self.device)
        if any(s.drafts is not None for s in seqs):
            drafts, q, num_drafts = self._given_drafts(seqs, drafts, q, num_drafts, k_rows)
        t1 = time.perf_counter()
        # each row's columns past its own drafts repeat its last one (token and position): a row never
        # writes past the room it reserved, whatever K the rows beside it draft
        width = k_rows + 1
        step_tokens = torch.cat([self.state.tokens[idx, old - 1][:, None], drafts], dim=1)
        columns = _positions(torch.zeros_like(width), width)
        if columns.shape[1] < k + 1:
            columns = torch.cat([columns, columns[:, -1:].expand(n, k + 1 - columns.shape[1])], 1)
        step_tokens = step_tokens.gather(1, columns)
        positions = (old - 1)[:, None] + columns
        out = self.target(step_tokens, positions, self.cache, slots=slots, capture=self.capture)
        logits = self._ban_early_stops(seqs, out.logits, torch.arange(k + 1, device=self.device).expand(n, -1))
        self._keep_plain_logits(seqs, plain, logits)
        result = sampling.verify(drafts, q, logits, num_drafts, self.verify_fn)
        if self.needs_hidden:
            self.state.target_hidden[idx[:, None], positions] = self._states(out)
        t2 = time.perf_counter()
        drafted = torch.arange(k, device=self.device)[None, :] < num_drafts[:, None]
        commit = partial(self.drafter.commit, self.state, old, k, slots) if k > 0 and drafting else None
        self._end_step(seqs, slots, result, drafted, commit, (t0, t1, t2))

    def _states(self, out: ForwardOut) -> torch.Tensor:
        """What the drafter reads per position: the captured layers' outputs, else the final hidden state."""
        return out.features if self.capture else out.hidden

    def _decode_tree(self, seqs: list[Sequence]) -> None:
        """One step with a token tree: draft it, verify every node in one target pass, keep the accepted path."""
        slots = Slots.of([s.slot for s in seqs], self.device)
        idx = slots.index
        sampling = RowSampling([(s.params.sampling, s.generator) for s in seqs], self.device)
        self.state.sampling, self.state.room = sampling, None
        old = self.state.lengths[idx].clone()
        t0 = time.perf_counter()
        tree = self.drafter.propose_tree(self.state, self.tree, slots)
        t1 = time.perf_counter()
        root = self.state.tokens[idx, old - 1][:, None]
        positions, attention = verification_attention(tree, old)
        tokens = torch.cat([root, tree.tokens], 1)
        out = self.target(tokens, positions, self.cache, slots=slots, tree=attention, capture=self.capture)
        ahead = torch.cat([torch.zeros_like(tree.depths[:, :1]), tree.depths], 1)  # the root's column draws depth 1
        result = verify_tree(tree, self._ban_early_stops(seqs, out.logits, ahead), sampling, self.tree.depth)
        compact(self.cache, slots, old, result.path, result.num_accepted)
        if self.needs_hidden:  # the root's and the accepted path's states, at the positions they now hold
            m, rows, states = result.num_accepted, torch.arange(len(seqs), device=self.device), self._states(out)
            self.state.target_hidden[idx, old - 1] = states[:, 0]
            for j in range(result.path.shape[1]):
                take = (m > j).nonzero().squeeze(1)
                self.state.target_hidden[idx[take], old[take] + j] = states[rows[take], 1 + result.path[take, j]]
        t2 = time.perf_counter()
        # per depth: rows whose tree reached it
        depths = torch.arange(self.tree.depth, device=self.device)[None, :, None]
        reached = ((tree.depths[:, None, :] > depths) & tree.valid[:, None]).any(-1)
        commit = partial(self.drafter.commit_tree, self.state, old, slots, out.logits)  # lookahead's Jacobi step
        self._end_step(seqs, slots, result, reached, commit, (t0, t1, t2))

    def _end_step(
        self,
        seqs: list[Sequence],
        slots: Slots,
        result: Verified | TreeVerified,
        drafted: torch.Tensor,
        commit: Callable[[], None] | None,
        times: tuple[float, float, float],
    ) -> None:
        """What a chain's step and a tree's end alike: per-position counts, the accepted tokens, the drafter's
        own commit (timed as drafting: a draft cache's rollback, lookahead's pool), each row's Step and the
        K policy's observation. `drafted` [rows, K] marks the positions each row drafted (a tree: reached)."""
        t0, t1, t2 = times
        idx, m, k = slots.index, result.num_accepted, drafted.shape[1]
        accepted = torch.arange(k, device=self.device)[None, :] < m[:, None]
        self.drafted_pos[idx, :k] += drafted
        self.accepted_pos[idx, :k] += accepted
        self._commit(seqs, result.tokens, m + 1)
        self.cached[idx] = self.state.lengths[idx] - 1
        t3 = time.perf_counter()
        if commit is not None:
            commit()
        drafting_s = (t1 - t0) + (time.perf_counter() - t3)
        for seq, d, a in zip(seqs, drafted.sum(1).tolist(), m.tolist(), strict=True):
            seq.step_log.append(Step(d, a, drafting_s, t2 - t1))
        self.last_k, self.last_batch = k, len(seqs)
        # the whole step, streaming callbacks included: a cost paid per step is what drafting saves
        self.policy.observe(len(seqs), k, time.perf_counter() - t0, drafted.sum(0).tolist(), accepted.sum(0).tolist())

    def _given_drafts(self, seqs, drafts, q, num_drafts, k_rows):
        """Put the drafts a request brought (and the distribution each was drawn from) into the step's batch."""
        k, vocab = drafts.shape[1], self.target.dims.vocab_size
        drafts, num_drafts = drafts.clone(), num_drafts.clone()
        with_q = q is not None or any(s.draft_logits is not None for s in seqs if s.drafts is not None)
        if with_q and q is None:  # rows without a distribution are one-hot on their drafts
            q = torch.zeros(len(seqs), k, vocab, device=self.device).scatter_(-1, drafts[..., None], 1.0)
        for i, seq in enumerate(seqs):
            if seq.drafts is None:
                continue
            n = int(k_rows[i])
            drafts[i, :n] = torch.tensor(seq.drafts[:n], dtype=torch.long, device=self.device)
            num_drafts[i] = n
            if q is not None:
                q[i] = 0.0
                if seq.draft_logits is not None:
                    q[i, :n] = probs_from_logits(seq.draft_logits[:n].to(self.device), seq.params.sampling)
                else:
                    q[i].scatter_(-1, drafts[i, :, None], 1.0)
        return drafts, q, num_drafts

    def _ban_early_stops(self, seqs: list[Sequence], logits: torch.Tensor, ahead: torch.Tensor) -> torch.Tensor:
        """The target's logits [B, W, V] with stop tokens banned in every column that draws a token before its row's
        min_tokens; `ahead` [B, W] counts how far past the row's output so far each column draws. Masking the
        target alone keeps speculation exact for the masked distribution: a drafted stop token then has p = 0, so
        verification rejects it and the residual never draws it."""
        if not any(s.min_tokens for s in seqs):  # the usual step: no device work at all
            return logits
        slots = torch.tensor([s.slot for s in seqs], device=self.device)
        short = torch.tensor([s.min_tokens for s in seqs], device=self.device) - self.produced[slots]
        vocab = logits.shape[-1]
        stops = _stop_table(seqs, self.device)  # [B, S], -1 where a row has fewer
        # an id outside the vocabulary can never be drawn: it goes to a spare column, dropped below
        ban = torch.zeros(len(seqs), vocab + 1, dtype=torch.bool, device=self.device)
        ban.scatter_(1, torch.where((stops >= 0) & (stops < vocab), stops, vocab), True)
        early = (ahead < short[:, None])[..., None] & ban[:, None, :vocab]  # [B, W, V]
        return logits.masked_fill(early, float("-inf"))

    def _keep_plain_logits(self, seqs: list[Sequence], plain: torch.Tensor, logits: torch.Tensor) -> None:
        """Rows decoding plainly that asked for their logits keep column 0's of the step's [B, K+1, V]."""
        if not any(s.keep_logits for s in seqs):  # the usual step: no device read
            return
        for i in plain.nonzero().squeeze(1).tolist():
            if seqs[i].keep_logits:
                seqs[i].logits.append(logits[i, 0].float().clone())

    def _plain_logits(self, seqs: list[Sequence], logits: torch.Tensor) -> torch.Tensor:
        """Logits [B, V] a first token is drawn from: stop tokens banned before min_tokens; kept if asked."""
        zeros = torch.zeros(len(seqs), 1, dtype=torch.long, device=self.device)
        logits = self._ban_early_stops(seqs, logits[:, None], zeros)
        self._keep_plain_logits(seqs, torch.ones(len(seqs), dtype=torch.bool, device=self.device), logits)
        return logits[:, 0]

    def _commit(self, seqs: list[Sequence], new: torch.Tensor, count: torch.Tensor) -> None:
        """Append the first `count` of each row's `new` tokens, honouring stops and max_tokens."""
        idx = torch.tensor([s.slot for s in seqs], device=self.device)
        width = new.shape[1]
        cols = torch.arange(width, device=self.device)[None, :]
        limits = torch.tensor([s.params.max_tokens for s in seqs], device=self.device)
        count = torch.minimum(count, limits - self.produced[idx])
        stops = _stop_table(seqs, self.device)
        hit = torch.zeros_like(new, dtype=torch.bool)
        if stops.shape[1]:
            hit = (new[:, :, None] == stops[:, None, :]).any(-1) & (cols < count[:, None])
            first = torch.where(hit.any(1), hit.int().argmax(1) + 1, count)
            count = torch.minimum(count, first)
        stopped = hit.any(1)
        keep = cols < count[:, None]
        lengths = self.state.lengths[idx]
        positions = (lengths[:, None] + cols).clamp_max(self.capacity - 1)
        current = self.state.tokens[idx[:, None], positions]
        self.state.tokens[idx[:, None], positions] = torch.where(keep, new, current)
        self.state.lengths[idx] = lengths + count
        self.produced[idx] += count
        counts = count.tolist()
        for i, seq in enumerate(seqs):
            if seq.on_tokens is not None and counts[i]:
                try:
                    if seq.on_tokens(new[i, : counts[i]].tolist()) is True:
                        stopped[i] = True  # the caller saw a stop string
                except Exception:  # streaming to a client that went away: that sequence ends, no other
                    seq.cancelled = True
        self.stopped[idx] = stopped

    def _finish(self, seqs: list[Sequence], reason: str | None) -> list[Sequence]:
        """Build each sequence's result and free its slot (the slot's tokens stay for prefix reuse).

        `reason` None: "stop" where a stop token or string ended it, else "length"."""
        if not seqs:
            return []
        placed = [s for s in seqs if s.slot >= 0]
        index = torch.tensor([s.slot for s in placed], dtype=torch.long, device=self.device)
        rows = self.state.tokens[index].tolist()
        lengths = self.state.lengths[index].tolist()
        stopped = self.stopped[index].tolist()
        drafted, accepted = self.drafted_pos[index].tolist(), self.accepted_pos[index].tolist()
        found = {id(s): i for i, s in enumerate(placed)}
        for seq in seqs:
            i = found.get(id(seq))
            width = seq.num_draft_tokens
            if i is None:  # cancelled while waiting
                tokens, stop, per_drafted, per_accepted = [], False, [0] * width, [0] * width
            else:
                tokens = rows[i][len(seq.prompt) : lengths[i]] if seq.prefilled else []
                stop, per_drafted, per_accepted = stopped[i], drafted[i][:width], accepted[i][:width]
                self.rows[seq.slot] = None
                self.free.add(seq.slot)
            steps = seq.step_log
            stats = RequestStats(
                prompt_tokens=len(seq.prompt),
                output_tokens=len(tokens),
                steps=len(steps),
                draft_tokens=sum(s.drafted for s in steps),
                accepted_tokens=sum(s.accepted for s in steps),
                drafted_per_position=per_drafted,
                accepted_per_position=per_accepted,
                prefill_s=seq.prefill_s,
                draft_s=sum(s.draft_s for s in steps),
                verify_s=sum(s.verify_s for s in steps),
                reused_prompt_tokens=seq.reused,
                step_log=steps,
            )
            final = reason or ("stop" if stop else "length")
            seq.result = Generation(tokens, final, stats)
        if placed:
            self.stopped[index] = False
        return seqs


def _same_rows(
    tokens: torch.Tensor, index: torch.Tensor, starts: torch.Tensor, counts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Prefill rows that feed the same tokens at the same positions after the same prefix (n samples of one
    prompt: a lossless check draws thousands), as (the first row of each distinct feed, each row's distinct
    feed), or None when every row is distinct. Their keys and values are equal, so one forward serves all."""
    if len(index) < 2:
        return None
    ends = starts + counts
    width = int(ends.max())
    fed = tokens[index, :width].masked_fill(torch.arange(width, device=tokens.device)[None, :] >= ends[:, None], -1)
    keys = torch.cat([starts[:, None], counts[:, None], fed], 1)
    distinct, copy_of = torch.unique(keys, dim=0, return_inverse=True)
    if len(distinct) == len(index):
        return None
    rows = torch.arange(len(index), device=tokens.device)
    first = torch.full((len(distinct),), len(index), device=tokens.device).scatter_reduce(0, copy_of, rows, "amin")
    return first, copy_of


def _stop_table(seqs: list[Sequence], device) -> torch.Tensor:
    """Each row's stop token ids, padded with -1 (no token), as one [B, S] tensor."""
    sorted_ids: dict[int, list[int]] = {}  # one sort per distinct set (a generate call shares one)
    for s in seqs:
        ids = s.params.stop_token_ids
        if id(ids) not in sorted_ids:
            sorted_ids[id(ids)] = sorted(ids)
    sets = [sorted_ids[id(s.params.stop_token_ids)] for s in seqs]
    width = max((len(x) for x in sets), default=0)
    if width == 0:
        return torch.zeros(len(seqs), 0, dtype=torch.long, device=device)
    if all(x == sets[0] for x in sets):
        return torch.tensor(sets[0], dtype=torch.long, device=device).expand(len(seqs), -1)
    return torch.tensor([x + [-1] * (width - len(x)) for x in sets], dtype=torch.long, device=device)
