"""How many drafts a step gets at a given batch size: the load-aware part of speculation.

At batch 1 a decoding step is memory-bound, so verifying K drafts costs little more than one
token; as the batch grows the step turns compute-bound, the K extra positions per row cost real
time, and past some batch speculation loses. `AdaptiveK` picks, for the running batch, the K that
maximises expected tokens per second: E[tokens per step](K) from the acceptance it has measured
per position (cost_model.expected_tokens_per_step_positional) over the step time it predicts at
that batch and K: K = 0's, kept current by the steps that run, times what drafting K costs relative
to it (calibrated when the engine starts, re-timed by the steps that draft). K = 0
is plain decoding, so where verification stops riding free it turns speculation off. Leaving K = 0
is not free (a drafter that skipped steps catches up on them, for MTP a pass over every row's
skipped tokens), so it takes a clear predicted gain; and drafting must beat K = 0 by more than the
noise of the timings, since a wrong K > 0 costs throughput that K = 0 never does. Only a K that runs
has its cost refreshed, so the runner-up is tried now and then, as often as a fixed share of the
running K's time pays for: often when the two nearly tie, rarely when one is far ahead. `FixedK` is
the configured K. Both honour `max_concurrency`, TensorRT-LLM's cut-off: no speculation when more
rows than that are running.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from trtspec.speculative.batch import BatchEngine, KPolicy, Sequence
from trtspec.speculative.cost_model import expected_tokens_per_step_positional
from trtspec.speculative.requests import GenerationParams

POLICIES = ("fixed", "adaptive")
PRIOR_STEPS = 16  # steps with drafts before measured acceptance replaces the prior
PRIOR_RATE = 0.6  # conditional acceptance per position assumed until then
MIN_SAMPLES = 16  # rows that reached a position before its measured rate replaces the prior
EXPLORE_STEPS = 4  # the runner-up K (0, or the best K > 0) is tried again for this many steps (the first
# after a change of K is not timed, see observe) as often as costs EXPLORE_BUDGET of the running K's time ...
EXPLORE_BUDGET = 0.02
EXPLORE_MAX = 512  # ... but at least once in this many steps
# ... and at most once in this many, keyed by "the runner-up is K = 0": 16 for K = 0 (trying it never costs
# more than the drafting gain it forgoes), 64 for a K > 0 (a switch the estimates call a tie may well lose)
EXPLORE_MIN = {True: 16, False: 64}
UP_MARGIN = 0.05  # predicted gain a K > 0 needs to leave K = 0, beyond the timings' own noise
COST_WINDOW = 15  # a step cost is the mean of this many latest steps at that (batch, K), less the slowest
# and the fastest: a lone outlier (a GC pause, another process) is dropped, while costs that recur (a
# drafter catching up on a row that just joined) are counted, and calibration's figure soon leaves
SWITCH_EMA = 0.1  # weight of a new catch-up time in its running estimate


class FixedK(KPolicy):
    def __init__(self, k: int, max_concurrency: int | None = None) -> None:
        self.fixed, self.max_concurrency = k, max_concurrency

    def prepare(self, engine: BatchEngine) -> None:
        """Nothing to measure for a fixed K."""

    def k(self, batch: int, k_max: int) -> int:
        if self.max_concurrency is not None and batch > self.max_concurrency:
            return 0
        return min(self.fixed, k_max)


class TableK(KPolicy):
    """K from a table of running-batch ceilings, as a mode's documented heuristic prescribes (AUTO)."""

    def __init__(self, table: tuple[tuple[int, int], ...]) -> None:
        self.table = table  # (largest running batch, K), ascending; beyond the last: no speculation

    def prepare(self, engine: BatchEngine) -> None:
        """The table is fixed: nothing to measure."""

    def k(self, batch: int, k_max: int) -> int:
        return next((min(k, k_max) for ceiling, k in self.table if batch <= ceiling), 0)


@dataclass
class AdaptiveK(KPolicy):
    max_concurrency: int | None = None
    prior: list[float] = field(default_factory=list)  # conditional acceptance per position (plan.json's)
    costs: dict[int, dict[int, float]] = field(default_factory=dict)  # batch -> K -> seconds per step
    recent: dict[tuple[int, int], deque[float]] = field(default_factory=dict)  # (batch, K) -> latest step times
    # per position j, over every observed row-step: rows that drafted j with 0..j-1 accepted, and of those
    # the rows that accepted j too; steps run different K, so each position has its own denominator
    reached: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    steps_with_drafts: int = 0
    forced: int | None = None  # calibration runs a given K
    last_seconds: float = 0.0
    previous_k: int = -1
    exploring: int = 0  # exploration steps left
    since_explore: int = 0  # decisions since the last exploration
    explored: int = 0  # the K an exploration runs
    switch_seconds: float = 0.0  # measured extra time of the first step after leaving K = 0 (a catch-up)
    # calibration's batch sizes: a step is timed under the nearest (in log scale). Served, the running
    # batch wanders (12, 15, 13, ... at concurrency 16); per exact size, an exploration re-timed only the
    # size it ran at, and every other size kept calibration's idle figure for K > 0
    grid: list[int] = field(default_factory=list)

    def prepare(self, engine: BatchEngine) -> None:
        """Step costs at the batch sizes the engine can run, measured before the first request."""
        if engine.num_draft_tokens > 0:
            calibrate(engine, self, batch_sizes(len(engine.rows)))

    def rates(self, k_max: int) -> list[float]:
        """Conditional acceptance per position: measured where MIN_SAMPLES rows reached it, else the prior."""
        known: list[float] = []
        if self.steps_with_drafts >= PRIOR_STEPS:
            for reached, accepted in zip(self.reached, self.accepted, strict=True):
                if reached < MIN_SAMPLES:
                    break
                known.append(accepted / reached)
        known += self.prior[len(known) : k_max]
        fill = known[-1] if known else PRIOR_RATE
        return [*known[:k_max], *[fill] * (k_max - len(known))]

    def bucket(self, batch: int) -> int:
        """The batch size a step at `batch` is timed under: the nearest of `grid`, or itself without one."""
        if not self.grid:
            return batch
        return min(self.grid, key=lambda size: (abs(math.log2(size / batch)), size))

    def step_seconds(self, batch: int, k: int) -> float | None:
        """Predicted time of a step at (batch, K): K = 0's measured time times what drafting K costs
        relative to it.

        The ratio is taken where both were measured at one batch size and interpolated between them.
        K = 0's time at the running batch is current (the steps that run keep it so); K > 0's is often
        calibration's, timed on an idle engine. Under load every step slows (the server's threads and
        the client share the cores), so a calibrated K > 0 compared with a K = 0 timed under load looked
        cheap wherever drafting had not run lately; the ratio of the two holds under that slowdown.
        """
        batch = self.bucket(batch)
        plain = _interpolate(self.costs, batch, lambda row: row.get(0))
        if k == 0 or plain is None:
            return plain
        relative = lambda row: row[k] / row[0] if k in row and row.get(0) else None  # noqa: E731
        ratio = _interpolate(self.costs, batch, relative, grows=False)
        if ratio is None:
            return _interpolate(self.costs, batch, lambda row: row.get(k))
        return plain * ratio

    def throughput(self, batch: int, k: int, rates: list[float]) -> float | None:
        seconds = self.step_seconds(batch, k)
        if seconds is None or seconds <= 0:
            return None
        return batch * expected_tokens_per_step_positional(rates[:k]) / seconds

    def k(self, batch: int, k_max: int) -> int:
        if self.forced is not None:
            return min(self.forced, k_max)
        if k_max == 0 or (self.max_concurrency is not None and batch > self.max_concurrency):
            return 0
        rates = self.rates(k_max)  # PRIOR_RATE until acceptance is measured
        scored = {k: self.throughput(batch, k, rates) for k in range(k_max + 1)}
        if any(v is None for v in scored.values()):
            return k_max
        best_up = max(range(1, k_max + 1), key=lambda k: scored[k])
        # drafting must beat K = 0 by more than the timings' noise (served, a step's time swings 2x and
        # the K's were within 1-3% at concurrency 16: it drafted on noise, and lost); leaving K = 0, which
        # pays a switch, needs UP_MARGIN more
        margin = 1.0 + self.noise(batch, best_up) + (UP_MARGIN if self.previous_k == 0 else 0.0)
        best = best_up if scored[best_up] >= margin * scored[0] else 0
        if self.exploring:
            self.exploring -= 1
            return self.explored
        # counted from the last exploration or the last change between drafting and not
        self.since_explore = self.since_explore + 1 if (best > 0) == (self.previous_k > 0) else 1
        # the runner-up is tried now and then, since only running a K refreshes its cost at this batch
        runner_up = best_up if best == 0 else 0
        due = self.since_explore >= EXPLORE_MIN[runner_up == 0]  # never sooner, so not worked out sooner
        if due and self.since_explore >= self.explore_interval(batch, best, runner_up, scored):
            self.since_explore, self.exploring = 0, EXPLORE_STEPS - 1
            self.explored = runner_up
            return self.explored
        return best

    def noise(self, batch: int, k: int) -> float:
        """Relative standard error of K's predicted gain over K = 0, from the spread of their step times."""
        batch = self.bucket(batch)
        return math.hypot(*(_relative_error(self.recent.get((batch, j), ())) for j in (0, k)))

    def explore_interval(self, batch: int, k: int, runner_up: int, scored: dict[int, float | None]) -> int:
        """Decisions between explorations of `runner_up` while `k` runs, so that exploring costs at most
        EXPLORE_BUDGET of the running K's time: a runner-up that nearly ties is cheap to try, and tried
        often (at concurrency 16, K = 0 to drafting), one far behind is tried rarely."""
        now, other = self.step_seconds(batch, k), self.step_seconds(batch, runner_up)
        if not now or not other or not scored[k] or scored[runner_up] is None:
            return EXPLORE_MAX
        # EXPLORE_STEPS steps of the runner-up yield what the running K would in a fraction of their time
        lost = EXPLORE_STEPS * other * max(1.0 - scored[runner_up] / scored[k], 0.0)
        interval = math.ceil((self.switch_seconds + lost) / (EXPLORE_BUDGET * now))
        return min(max(interval, EXPLORE_MIN[runner_up == 0]), EXPLORE_MAX)

    def observe(self, batch: int, k: int, seconds: float, drafted: list[int], accepted: list[int]) -> None:
        self.last_seconds = seconds
        batch = self.bucket(batch)
        changed, left_plain = k != self.previous_k, self.previous_k == 0 and k > 0
        self.previous_k = k
        # the first step after a change of K also pays for it (a drafter catching up on what it skipped):
        # not that K's cost; leaving K = 0 is what a switch costs
        row = self.costs.setdefault(batch, {})
        if left_plain and k in row and self.forced is None:
            extra = max(seconds - (self.step_seconds(batch, k) or row[k]), 0.0)
            self.switch_seconds = (
                (1 - SWITCH_EMA) * self.switch_seconds + SWITCH_EMA * extra if self.switch_seconds else extra
            )
        if not changed or k not in row:
            window = self.recent.setdefault((batch, k), deque([row[k]] if k in row else [], maxlen=COST_WINDOW))
            window.append(seconds)
            row[k] = _trimmed_mean(window)
        if k == 0 or not drafted or drafted[0] == 0 or self.forced is not None:
            return  # calibration steps draft from random tokens: their acceptance means nothing
        # rows that drafted position j reached it with 0..j-1 accepted: accepted[j - 1] of them, as every
        # row of a step drafts the step's K (fewer only near max_tokens)
        reached = [drafted[0], *(accepted[j - 1] if drafted[j] else 0 for j in range(1, len(drafted)))]
        width = max(len(self.reached), len(reached))
        self.reached = [a + b for a, b in zip(_pad(self.reached, width), _pad(reached, width), strict=True)]
        self.accepted = [a + b for a, b in zip(_pad(self.accepted, width), _pad(accepted, width), strict=True)]
        self.steps_with_drafts += 1

    def table(self, k_max: int, batches: list[int]) -> dict[int, dict[str, float | int]]:
        """The K this policy would choose per batch size, and its expected speedup over K = 0."""
        rates = self.rates(k_max)
        out = {}
        for b in batches:
            scored = {k: self.throughput(b, k, rates) or 0.0 for k in range(k_max + 1)}
            best = max(scored, key=lambda k: scored[k])
            out[b] = {"k": best, "speedup": scored[best] / scored[0] if scored[0] else 0.0}
        return out


def _interpolate(costs: dict[int, dict[int, float]], batch: int, value, grows: bool = True) -> float | None:
    """value(row) at `batch`, linear between the nearest batch sizes where it is known; past the largest,
    growing linearly with the batch where `grows` (a step time: at best compute-bound there)."""
    known = {b: v for b, row in costs.items() if (v := value(row)) is not None}
    if not known:
        return None
    sizes = sorted(known)
    lo = max((b for b in sizes if b <= batch), default=sizes[0])
    hi = min((b for b in sizes if b >= batch), default=sizes[-1])
    if lo == hi:
        return known[lo] * batch / lo if grows and batch > lo else known[lo]
    w = (batch - lo) / (hi - lo)
    return (1 - w) * known[lo] + w * known[hi]


def _trimmed(values) -> list[float]:
    """The slowest and the fastest dropped, once there are enough to spare them."""
    return sorted(values)[1:-1] if len(values) >= 5 else list(values)


def _trimmed_mean(values: deque[float]) -> float:
    return statistics.fmean(_trimmed(values))


def _relative_error(window) -> float:
    """Standard error of a window's mean relative to it (0 with too few steps to tell)."""
    if len(window) < 3:
        return 0.0
    kept = _trimmed(window)  # what _trimmed_mean averages
    mean = statistics.fmean(kept)
    return statistics.stdev(kept) / math.sqrt(len(kept)) / mean if mean > 0 else 0.0


def _pad(values: list[int], width: int) -> list[int]:
    return values + [0] * (width - len(values))


def calibrate(engine: BatchEngine, policy: AdaptiveK, batches: list[int], prompt_tokens: int = 16, reps: int = 3):
    """Time steps at each batch size and K on dummy sequences, so the first real decisions are measured.

    The sequences are cancelled afterwards; their slots stay free (and hold nothing a real prompt shares).
    """
    rng = random.Random(0)
    vocab = engine.target.dims.vocab_size
    k_max = engine.num_draft_tokens
    previous, engine.policy = engine.policy, policy
    policy.grid = list(batches)
    try:
        for batch in batches:
            seqs = [
                Sequence([rng.randrange(vocab) for _ in range(prompt_tokens)], GenerationParams(max_tokens=10_000))
                for _ in range(batch)
            ]
            limit = engine.capacity - prompt_tokens - k_max - 2
            for seq in seqs:
                seq.params = GenerationParams(max_tokens=max(1, min(limit, (k_max + 1) * (reps + 2) * (k_max + 1))))
                engine.add(seq)
            while any(not s.prefilled for s in seqs):
                engine.step()
            for k in range(k_max + 1):
                policy.forced = k
                times = []
                for rep in range(reps + 1):
                    engine.step()
                    if rep:  # the first step at a new K catches the drafter up: not the steady cost
                        times.append(policy.last_seconds)
                policy.costs[batch][k] = statistics.median(times)
            for seq in seqs:
                seq.cancelled = True
            engine.step()
    finally:
        policy.forced = None
        engine.policy = previous
        engine.cached.zero_()  # dummy prompts: nothing there to reuse
        if engine.drafter is not None:  # nor anything to draft from (a public n-gram pool keeps every request's)
            engine.drafter.forget_history()


def batch_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to and including max_batch: where costs are measured and curves are drawn."""
    sizes, b = [], 1
    while b < max_batch:
        sizes.append(b)
        b *= 2
    return [*sizes, max_batch]


def policy_for(kind: str, k: int, max_concurrency: int | None = None, plan: Path | None = None) -> FixedK | AdaptiveK:
    """The policy a served model runs; an adaptive one starts from plan.json's acceptance when there is one."""
    if kind not in POLICIES:
        raise ValueError(f"speculation policy must be one of {', '.join(POLICIES)}, got {kind!r}")
    if kind == "fixed":
        return FixedK(k, max_concurrency)
    prior: list[float] = []
    if plan is not None and plan.is_file():
        try:
            prior = [float(r) for r in json.loads(plan.read_text(encoding="utf-8")).get("acceptance_per_position", [])]
        except (ValueError, TypeError, AttributeError):
            prior = []  # an unreadable plan only loses the head start
    return AdaptiveK(max_concurrency=max_concurrency, prior=prior)
