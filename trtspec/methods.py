"""Which speculative method pays on this pair and this traffic: every method the pair supports, measured.

A method is a torch-runner drafter (the configured mode; n-gram lookup and the target drafting for
itself, which need nothing; MTP where the target carries MTP layers) drafting a chain of K or a tree.
The self-draft's layers are chosen first, by the acceptance each prefix of the target's layers gets on
the prompts and what it costs (trtspec.speculative.self_draft); its int8 copy runs as chains.

Each is run at batch 1 on the user's prompts: tokens per target pass and seconds per step (draft and
verify apart) are measured together, so the batch-1 prediction is tokens/step x t_plain / t_step. Larger
batches scale the verify part by the target's forward time at that batch and width and the draft part
by the drafter's (a draft model's forward, one lookup per row for n-gram, heads and MTP layers as the
target's single-token pass).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtspec.config import DeploymentConfig
from trtspec.errors import UsageError
from trtspec.modes import REGISTRY, get_mode
from trtspec.speculative.factory import load_runner, mode_settings
from trtspec.speculative.model import Transformer
from trtspec.speculative.requests import RequestStats, SamplingParams, TreeShape
from trtspec.speculative.runner import GenerationParams, SpeculativeRunner

CHAIN_KS = (1, 2, 3, 4)
INT8_KS = (2, 4, 6, 8)  # the target's int8 copy agrees with it nearly always: longer chains, each costing a copy's pass
TREES = ("2x2", "3x2", "3x3", "4x3")
# lookahead's (W, N, G) tried: small windows, as every token of its pass costs on a CPU; NVIDIA's default is 7, 7, 7
LOOKAHEADS = ((3, 2, 1), (4, 3, 2), (5, 4, 3))
LOOKAHEAD_KEYS = {"window_size": "W", "ngram_size": "N", "verification_set_size": "G"}
CONFIRM = 3  # the best this many are measured again and judged on the second run alone; the one chosen then runs
# a third time and plan predicts from that run: the best of many noisy runs is the luckiest as much as the fastest,
# so any figure that took part in choosing it overstates it. Where the best third run so far falls below the next
# leader's second, the next runs a third time too, and the best third run is recommended (a best of two or three
# third runs flatters the winner again, by less).
# a third run is this many plain/method pairs and the median pair predicts: odd, so that the median is one pair's run
ESTIMATE_PAIRS = 3


@dataclass(frozen=True)
class Method:
    mode: str
    k: int  # drafts per step for a chain; the tree's depth for a tree
    tree: TreeShape | None = None
    settings: tuple[tuple[str, Any], ...] = ()  # the mode's section, where the method sets it

    @property
    def label(self) -> str:
        name = self.mode + "".join(f" {_setting(k, v)}" for k, v in self.settings if _setting(k, v))
        if REGISTRY[self.mode].runner_tree(dict(self.settings)) is not None:
            return name  # its tree follows from its settings
        return f"{name} tree {self.tree}" if self.tree else f"{name} K={self.k}"


def _setting(key: str, value: Any) -> str:
    if key == "layers":
        return f"layers {value[0]}-{value[-1]}" if len(value) > 1 else f"layer {value[0]}"
    if key == "cascade":
        return f"cascade {value}" if value != "none" else ""
    if key in LOOKAHEAD_KEYS:
        return f"{LOOKAHEAD_KEYS[key]}={value}"
    return str(value)


def method_modes(cfg: DeploymentConfig, target: Transformer, only: list[str] | None = None) -> list[str]:
    """The configured mode, then what needs nothing more than the pair: n-gram, lookahead, the target drafting
    for itself (when it has layers to skip), and MTP if the target has it; of those, the ones in `only`."""
    extra = ["ngram", "lookahead"]
    extra += ["self-draft"] if target.dims.num_layers > 1 else []
    extra += ["mtp"] if target.dims.num_mtp_layers else []
    modes = [cfg.mode, *(m for m in extra if m != cfg.mode)]
    if only is None:
        return modes
    unknown = [m for m in only if m not in modes]
    if unknown or not only:
        raise UsageError(f"--methods {', '.join(unknown) or '(none)'}: this pair's methods are {', '.join(modes)}")
    return [m for m in modes if m in only]


def candidates(mode: str, settings: list[tuple[tuple[str, Any], ...]]) -> list[Method]:
    """Every chain length and tree shape of `mode` under each of its settings; an int8 self-draft pays by
    its acceptance, so longer chains only, and a cascade speeds up chains of three drafts or more only."""
    out = []
    own = [REGISTRY[mode].runner_tree(dict(s)) for s in settings]
    if all(tree is not None for tree in own):  # one method per setting: K is its tree's depth
        return [Method(mode, tree.depth, settings=s) for tree, s in zip(own, settings, strict=True)]
    for s in settings:
        cascade, int8 = dict(s).get("cascade", "none") != "none", dict(s).get("weights") == "int8"
        # a cascade's K <= 2 leaves no draft to guess
        ks = [k for k in CHAIN_KS if k > 2] if cascade else INT8_KS if int8 else CHAIN_KS
        out += [Method(mode, k, settings=s) for k in ks]
        if REGISTRY[mode].runner_trees and not cascade and not int8:
            out += [Method(mode, shape.depth, shape, s) for shape in map(TreeShape.parse, TREES)]
    return out


def runner_settings(cfg: DeploymentConfig, mode: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The section a method runs with: the config's where it is the configured mode, its own settings over it
    (a recommendation names only what it sets: measuring it without them measures another method)."""
    return {**((mode == cfg.mode and mode_settings(cfg, mode)) or {}), **settings}


def configured_settings(cfg: DeploymentConfig, mode: str) -> tuple[tuple[str, Any], ...]:
    """What the config's section for `mode` sets (defaults left out), as a method's hashable settings: the
    configured int8 self-draft is then compared at its own chain lengths and labelled as what it is."""
    value = REGISTRY[mode].settings(cfg)
    if value is None:
        return ()
    fields = value.model_dump(exclude_defaults=True)
    return tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in fields.items())


def self_draft_settings(
    target: Transformer, prompts: list[list[int]], sampling: SamplingParams, forward_seconds
) -> tuple[list[tuple[tuple[str, Any], ...]], dict[str, Any]]:
    """The self-draft variants worth running: the prefix of layers the cost model rates best from its
    measured acceptance and cost, and the int8 copy of every layer; and what chose them."""
    from trtspec.speculative.self_draft import best_prefix, prefix_acceptance, self_draft_model

    acceptance = prefix_acceptance(target, prompts, sampling)
    whole = forward_seconds(target, 1, 1)
    cost = [forward_seconds(self_draft_model(target, range(n)), 1, 1) / whole for n in range(1, target.dims.num_layers)]
    layers = list(range(best_prefix(acceptance, cost, max_k=max(CHAIN_KS))))
    chosen = [(("layers", tuple(layers)),), (("weights", "int8"),)]  # hashable: methods are keys
    return chosen, {"acceptance_by_layers": acceptance, "cost_by_layers": cost, "layers": layers}


@dataclass
class PromptsRun:
    """Batch 1 over a prompt set, summed: plan, plan's accuracy check and the methods benchmark read this."""

    tokens: int = 0  # output tokens after each prompt's first (which its prefill gives)
    steps: int = 0  # target passes after the prefill
    seconds: float = 0.0  # wall time, prefills included
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    draft_tokens: int = 0  # drafts the target checked (every node of a tree)
    accepted_tokens: int = 0
    drafted: list[int] = field(default_factory=list)  # per draft position
    accepted: list[int] = field(default_factory=list)
    outputs: list[list[int]] = field(default_factory=list)
    prompt_steps: list[int] = field(default_factory=list)  # each prompt's steps, beside its output in `outputs`

    @property
    def tokens_per_step_se(self) -> float | None:
        """The standard error of tokens per step over the prompts, relative to it (None under two prompts): a
        prediction from these prompts is that uncertain from their own spread, before any timing noise.
        Tokens/step is a ratio of sums, so the ratio estimator's: sum((t - r s)^2) n / (n - 1) / S^2."""
        n = len(self.prompt_steps)
        if n < 2 or self.steps == 0 or self.tokens == 0:
            return None
        r = self.tokens / self.steps
        spread = sum((len(out) - 1 - r * s) ** 2 for out, s in zip(self.outputs, self.prompt_steps, strict=True))
        spread *= n / (n - 1)
        return spread**0.5 / self.steps / r

    @property
    def loop_s(self) -> float:
        """The decoding loop's seconds: what speculation changes (the prefill is the same for every method)."""
        return self.seconds - self.prefill_s

    def add(self, tokens: list[int], seconds: float, stats: RequestStats) -> None:
        self.outputs.append(tokens)
        self.prompt_steps.append(stats.steps)
        self.tokens += len(tokens) - 1
        self.seconds += seconds
        self.steps += stats.steps
        self.prefill_s += stats.prefill_s
        self.draft_s += stats.draft_s
        self.verify_s += stats.verify_s
        self.draft_tokens += stats.draft_tokens
        self.accepted_tokens += stats.accepted_tokens
        for name, counts in (("drafted", stats.drafted_per_position), ("accepted", stats.accepted_per_position)):
            mine = getattr(self, name)
            mine += [0] * (len(counts) - len(mine))
            for j, n in enumerate(counts):
                mine[j] += n


def run_prompts(
    runner: SpeculativeRunner, prompts: list[list[int]], params: GenerationParams, warm_up: int = 4
) -> PromptsRun:
    """Each prompt alone (batch 1), after one short warm-up generation, as a freshly started server sees them."""
    runner.generate([prompts[0]], GenerationParams(max_tokens=warm_up, sampling=params.sampling))
    runner.forget_history()
    run = PromptsRun()
    for ids in prompts:
        t0 = time.perf_counter()
        g = runner.generate([ids], params)[0]
        run.add(g.tokens, time.perf_counter() - t0, g.stats)
    return run


def paired_speedups(plain_rate: Callable[[], float], spec_rate: Callable[[], float], pairs: int) -> list[float]:
    """The speedup of `pairs` plain/speculative pairs run back to back, one ratio per pair (its median is the figure).

    On a host whose speed drifts 10-30% over minutes, a ratio taken within a pair, seconds apart, holds where one
    of separate best-of-rounds figures does not, and a one-off slow spell in any run is outvoted by the median.
    The order alternates, so a steady drift favours each side in turn: with an even count the median averages
    one pair of each order and the drift cancels; with an odd count (plan's three) the median is a pair of the
    majority order and keeps one run's drift, as a single pair would."""
    if pairs < 1:
        raise ValueError(f"pairs must be at least 1, got {pairs}")
    ratios = []
    for i in range(pairs):
        if i % 2 == 0:
            plain = plain_rate()
            spec = spec_rate()
        else:
            spec = spec_rate()
            plain = plain_rate()
        ratios.append(spec / plain)
    return ratios


def compare_methods(
    cfg: DeploymentConfig,
    target_path: Path,
    draft_path: Path | None,
    target: Transformer,
    prompts: list[list[int]],
    max_tokens: int,
    sampling: SamplingParams,
    batches: list[int],
    modes: list[str],
) -> dict[str, Any]:
    """Every candidate of `modes` (method_modes) measured on `prompts`, with predicted speedups per batch
    size and the best at batch 1."""
    from trtspec.plan import forward_seconds

    params = GenerationParams(max_tokens=max_tokens, sampling=sampling, seed=0)
    weight = target.embed_tokens.weight  # drafts load beside the shared target: its device and dtype
    where = {"device": str(weight.device), "dtype": weight.dtype, "max_len": target.max_positions, "target": target}
    plain_runner = load_runner(target_path, "none", **where)

    def plain_seconds() -> float:
        plain = run_prompts(plain_runner, prompts, params)
        if plain.steps == 0:
            raise UsageError("the prompts produced no decoding steps to compare methods on: raise --max-tokens")
        return plain.loop_s / plain.steps

    plain_s = plain_seconds()
    widths: dict[int, dict[int, float]] = {}

    def target_scale(batch: int, width: int) -> float:
        row = widths.setdefault(width, {1: forward_seconds(target, 1, width)})
        if batch not in row:
            row[batch] = forward_seconds(target, batch, width)
        return row[batch] / row[1]

    draft_scales: dict[tuple, float] = {}

    def draft_scale(runner: SpeculativeRunner, batch: int, method: Method) -> float:
        """How the drafting part of a step grows from batch 1 to `batch` (timed once per drafter, K and width)."""
        if batch == 1:
            return 1.0
        width = method.tree.width if method.tree else 1
        key = (method.mode, method.settings, method.k, width, batch)  # K: a cascade's scale depends on it
        if key not in draft_scales:
            draft_scales[key] = runner.drafter.batch_scale(batch, method.k, width, forward_seconds, runner.target)
        return draft_scales[key]

    def load(method: Method) -> SpeculativeRunner:
        return load_runner(
            target_path,
            method.mode,
            draft_path if get_mode(method.mode).needs_draft else None,
            num_draft_tokens=method.k,
            **where,
            settings=runner_settings(cfg, method.mode, dict(method.settings)),
            tree=method.tree,
        )

    def as_row(method: Method, runner: SpeculativeRunner, m: PromptsRun, plain_s: float) -> dict[str, Any]:
        """A method's run against the plain baseline it is compared with, as plan.json holds it."""
        width = runner.verify_width(method.k)
        tokens_per_step = m.tokens / m.steps
        step_s, draft_s = m.loop_s / m.steps, m.draft_s / m.steps
        by_batch = {}
        for b in batches:
            step_b = draft_s * draft_scale(runner, b, method) + (step_s - draft_s) * target_scale(b, width)
            by_batch[str(b)] = tokens_per_step * plain_s * target_scale(b, 1) / step_b
        return {
            "method": method.label,
            "mode": method.mode,
            "k": method.k,
            "tree": str(method.tree) if method.tree else None,
            "settings": dict(method.settings),
            "tokens_per_step": tokens_per_step,
            "relative_se": m.tokens_per_step_se,  # of tokens/step over the prompts: every batch's prediction shares it
            "step_ms": 1000 * step_s,
            "plain_ms": 1000 * plain_s,  # the baseline it was compared with (each round has its own)
            "draft_ms": 1000 * draft_s,
            "predicted_speedup": by_batch,
        }

    def measure(method: Method) -> dict[str, Any]:
        runner = load(method)
        return as_row(method, runner, run_prompts(runner, prompts, params), plain_s)

    def estimate(method: Method, chosen_at: float) -> dict[str, Any]:
        """The chosen method's third run: ESTIMATE_PAIRS plain/method pairs back to back (paired_speedups), and
        the pair whose batch-1 ratio is the median predicts, against its own baseline."""
        runner = load(method)
        baselines: list[float] = []
        runs: list[PromptsRun] = []

        def plain_rate() -> float:
            baselines.append(plain_seconds())
            return 1 / baselines[-1]

        def method_rate() -> float:
            runs.append(run_prompts(runner, prompts, params))
            return runs[-1].tokens / runs[-1].loop_s  # tokens/step / step seconds: plain's rate is 1 / plain_s

        ratios = paired_speedups(plain_rate, method_rate, ESTIMATE_PAIRS)
        j = ratios.index(statistics.median(ratios))  # an odd count: the median is one of the pairs
        return {
            **as_row(method, runner, runs[j], baselines[j]),
            "confirmed": True,
            "chosen_at": chosen_at,
            "pairs": ratios,
        }

    methods, chose = [], {}
    for mode in modes:
        settings: list[tuple[tuple[str, Any], ...]] = [()]
        if mode == "self-draft" and mode != cfg.mode:
            settings, chose["self-draft"] = self_draft_settings(target, prompts, sampling, forward_seconds)
        if mode == "self-draft" and mode == cfg.mode:
            settings = [configured_settings(cfg, mode)]
        if mode == "draft-target":  # the draft model alone, and sped up by n-gram guesses (a cascade)
            settings = [(("cascade", "none"),), (("cascade", "ngram"),)]
        if mode == "lookahead":
            settings = [tuple(zip(LOOKAHEAD_KEYS, wng, strict=True)) for wng in LOOKAHEADS]
        methods += candidates(mode, settings)
    rows = [measure(method) for method in methods]
    leaders = sorted(range(len(rows)), key=lambda i: -rows[i]["predicted_speedup"]["1"])[:CONFIRM]
    plain_s = plain_seconds()  # the confirming round's own baseline
    for i in leaders:
        rows[i] = {**measure(methods[i]), "confirmed": True}
    fresh: dict[int, dict[str, Any]] = {}
    for i in sorted(leaders, key=lambda i: -rows[i]["predicted_speedup"]["1"]):
        chosen_at = rows[i]["predicted_speedup"]["1"]
        if fresh and max(r["predicted_speedup"]["1"] for r in fresh.values()) >= chosen_at:
            break  # a third run in hand beats what the rest were chosen at
        fresh[i] = estimate(methods[i], chosen_at)
    rows = [fresh.get(i, row) for i, row in enumerate(rows)]
    best = max(fresh.values(), key=lambda r: r["predicted_speedup"]["1"])
    return {"plain_ms_per_token": best["plain_ms"], "rows": rows, "recommended": best, "chosen": chose}
