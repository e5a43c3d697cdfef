"""The deployment's own pair, in-process: where the lossless check spends its samples, and its power.

Loaded from the trtspec config that built the deployment, with the runner the served torch models
run and the sampling defaults they apply. Three jobs: rank candidate contexts by where a bug in the
rule would show, sample the target itself as the check's B side (only where the served target is
this runner: the torch backend, unquantized; a TensorRT-LLM or quantized engine differs from it in
ways that are not speculation's), and run each planted verification bug against those samples at
the served sample size.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from trtspec.bench.lossless import conditional_homogeneity, planted_outcome
from trtspec.speculative.factory import runner_for
from trtspec.speculative.planted import PLANTED
from trtspec.speculative.requests import SamplingParams
from trtspec.speculative.runner import GenerationParams, SpeculativeRunner

RANKING_SAMPLES = 64
SHORTLIST = 4  # contexts the heuristic ranks highest, then tried against the planted bugs themselves
TRIAL_SAMPLES = 300  # per side and bug when trying a shortlisted context
BASELINE_FACTOR = 4  # target samples drawn in-process per served sample: cheap, and they buy power
EXTENSIONS = (0, 3, 6, 9)  # greedy tokens appended to a prompt to make a candidate context


def first_tokens(tokenizer: PreTrainedTokenizerBase, text: str, length: int) -> tuple[int, ...]:
    """The map both sides' text goes through before the test: the model's own tokenizer."""
    return tuple(tokenizer(text, add_special_tokens=False).input_ids[:length])


@dataclass
class Reference:
    tokenizer: PreTrainedTokenizerBase
    speculative: SpeculativeRunner
    plain: SpeculativeRunner
    planted: dict[str, SpeculativeRunner]
    sampling: SamplingParams  # the served defaults (top-k, top-p) the bench's requests leave in place
    exact: bool  # whether the served target is this very runner: torch backend, unquantized
    adaptive: bool = False  # the server picks K per running batch, so no fixed-K planted run is its sampler

    @property
    def unstated_power(self) -> str | None:
        """Why no planted run stands for the served sampler (None: they do, and the check states its power)."""
        if not self.planted:
            nodes = self.speculative.verify_width(1) - 1
            return (
                f"the server verifies the {nodes}-node token tree its mode's settings give, and the planted bugs are"
                " rules for chains: power against them is not stated"
            )
        if self.adaptive:
            return (
                "the server picks K per running batch (adaptive policy), so no fixed-K run in-process is its sampler:"
                " power against the planted bugs is not stated; serve with speculation.policy fixed to measure it"
            )
        return None

    @property
    def stops(self) -> frozenset[int]:
        eos = self.tokenizer.eos_token_id
        return frozenset({eos}) if eos is not None else frozenset()

    def sample(self, runner: SpeculativeRunner, prompt: str, n: int, length: int, temperature: float, seed: int):
        """n continuations of `length` tokens, decoded and re-tokenized as the served text is."""
        ids = self.tokenizer(prompt).input_ids
        sampling = replace(self.sampling, temperature=temperature)
        params = GenerationParams(max_tokens=length, sampling=sampling, stop_token_ids=self.stops, seed=seed)
        # each context's samples independent of the contexts sampled before it (an n-gram pool would carry them
        # over); drafts never change the distribution, only how often they are rejected
        runner.forget_history()
        gens = runner.generate([ids] * n, params)
        texts = [self.tokenizer.decode(g.tokens, skip_special_tokens=True) for g in gens]
        return [first_tokens(self.tokenizer, t, length) for t in texts], gens

    def contexts(self, prompts: list[str], extensions: tuple[int, ...] = EXTENSIONS) -> list[str]:
        """Each prompt, and each followed by the target's greedy continuation of a few lengths."""
        longest = max(extensions)
        prompts = [p for p in prompts if self.tokenizer(p).input_ids]
        params = GenerationParams(max_tokens=longest, stop_token_ids=self.stops, seed=0)
        gens = self.plain.generate([self.tokenizer(p).input_ids for p in prompts], params)
        out = []
        for prompt, g in zip(prompts, gens, strict=True):
            for m in extensions:
                out.append(prompt + self.tokenizer.decode(g.tokens[:m], skip_special_tokens=True))
        return list(dict.fromkeys(out))

    def score(self, context: str, length: int, temperature: float) -> float:
        """Where a bug shows most: the first draft often rejected, after a first token that rarely varies.

        A rule broken after a rejection shifts the second token; the test sees that shift in the
        prefix its first token starts, so a concentrated first token puts every sample in one prefix."""
        firsts, gens = self.sample(self.speculative, context, RANKING_SAMPLES, length, temperature, seed=7)
        drafted = sum(g.stats.drafted_per_position[0] for g in gens if g.stats.drafted_per_position)
        accepted = sum(g.stats.accepted_per_position[0] for g in gens if g.stats.accepted_per_position)
        rejection = 1.0 - accepted / drafted if drafted else 0.0
        modal = Counter(f[:1] for f in firsts).most_common(1)[0][1] / len(firsts)
        return rejection * modal

    def choose(self, prompts: list[str], count: int, length: int, temperature: float) -> list[str]:
        """The heuristic's shortlist, then the contexts where the planted bugs stand out most in a trial.

        The heuristic alone is noisy (which of two close contexts wins changes with the random
        stream, and the power between them can differ fivefold), so the shortlist is tried against
        the bugs themselves on samples the check's own power estimate never reuses (other seeds)."""
        scored = sorted(((self.score(c, length, temperature), c) for c in self.contexts(prompts)), reverse=True)
        shortlist = [c for _, c in scored[: max(count, SHORTLIST)]]
        if len(shortlist) <= count or not self.planted:
            return shortlist[:count]
        tried = sorted(((self.trial(c, length, temperature), c) for c in shortlist), reverse=True)
        return [c for _, c in tried[:count]]

    def trial(self, context: str, length: int, temperature: float) -> float:
        """How clearly the hardest-to-see planted bug shows at this context: its smallest chi-square z-score."""
        base, _ = self.sample(self.plain, context, TRIAL_SAMPLES, length, temperature, seed=303)
        scores = []
        for runner in self.planted.values():
            bugged, _ = self.sample(runner, context, TRIAL_SAMPLES, length, temperature, seed=404)
            h = conditional_homogeneity(bugged, base)
            scores.append((h.statistic - h.df) / max(1.0, (2 * h.df) ** 0.5))
        return min(scores)

    def baseline(self, contexts: list[str], n: int, length: int, temperature: float) -> list[list[tuple[int, ...]]]:
        """The target's own samples per context: the check's B side, drawn in-process and batched."""
        return [self.sample(self.plain, c, n, length, temperature, seed=202 + j)[0] for j, c in enumerate(contexts)]

    def planted_outcomes(
        self,
        contexts: list[str],
        baseline: list[list[tuple[int, ...]]],
        n: int,
        length: int,
        temperature: float,
        alpha: float,
    ) -> dict[str, list[dict]]:
        """Each planted bug against the target's samples, by the served check's test, per context."""
        out: dict[str, list[dict]] = {bug: [] for bug in self.planted}
        for j, (context, b) in enumerate(zip(contexts, baseline, strict=True)):
            for bug, runner in self.planted.items():
                a, _ = self.sample(runner, context, n, length, temperature, seed=101 + j)
                out[bug].append(planted_outcome(conditional_homogeneity(a, b), alpha))
        return out  # fmt: skip


def load_reference(config: Path) -> Reference:
    from trtspec.config import load_config

    cfg = load_config(config)
    speculative = runner_for(cfg)
    if speculative.drafter is None:
        from trtspec.errors import UsageError

        raise UsageError(f"{config}: speculation.mode is none; the lossless reference is the speculative config")
    plain = runner_for(cfg, mode="none", target=speculative.target)
    planted = {}  # a drafter that drafts only its own tree (lookahead, Medusa's choices) has no chain to plant in
    if speculative.drafter.fixed_tree is None:
        planted = {bug: runner_for(cfg, target=speculative.target, planted=bug) for bug in PLANTED}
    tokenizer = AutoTokenizer.from_pretrained(str(cfg.checkpoint_path(cfg.target)))
    s = cfg.speculation.sampling
    exact = cfg.build.backend == "torch" and cfg.target.quantization == "none"
    adaptive = cfg.policy == "adaptive"
    sampling = SamplingParams(s.temperature, s.top_k, s.top_p)
    return Reference(tokenizer, speculative, plain, planted, sampling, exact, adaptive)
