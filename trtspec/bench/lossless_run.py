"""The lossless check as the bench runs it: greedy equality on every prompt, then sampled first tokens
from both servers on the chosen contexts, tested within each prefix (trtspec.bench.lossless).

With a reference (the speculative deployment's trtspec config, loadable in-process) the contexts are
where a verification bug shows most, the sampled B side is the target itself in-process (the served
baseline still answers the greedy half), and the planted bugs are run there at the served sample
size so the verdict can state its power against them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from trtspec.bench.datasets import BenchPrompt, load_tokenizer
from trtspec.bench.load import Item, run_workers
from trtspec.bench.lossless import MIN_SAMPLES, conditional_homogeneity, verdict
from trtspec.bench.lossless_reference import BASELINE_FACTOR, first_tokens, load_reference
from trtspec.bench.records import RequestRecord
from trtspec.bench.schedule import Load
from trtspec.errors import UsageError

if TYPE_CHECKING:
    from trtspec.bench.run import BenchOptions, Progress

ALPHA = 0.01


def run_lossless(opts: BenchOptions, progress: Progress, sink: Callable[[RequestRecord], None]) -> dict:
    from trtspec.bench.run import _plan

    reference = load_reference(opts.lossless_reference) if opts.lossless_reference else None
    if reference is None and not opts.tokenizer:
        raise UsageError("--verify-lossless needs --tokenizer (or --lossless-reference CONFIG)")
    tokenizer = reference.tokenizer if reference else load_tokenizer(opts.tokenizer)
    length, temperature = opts.lossless_tokens, opts.lossless_temperature
    texts = [p.text for p in opts.prompts]
    if reference:
        contexts = reference.choose(texts, opts.lossless_prompts, length, temperature)
    else:
        contexts = texts[: opts.lossless_prompts]
    chosen = [BenchPrompt(c, "lossless", len(tokenizer(c).input_ids), None) for c in contexts]
    bound = ALPHA / max(len(contexts), 1)
    baseline = None
    if reference and reference.exact:
        baseline = reference.baseline(contexts, opts.lossless_samples * BASELINE_FACTOR, length, temperature)

    greedy: dict[str, dict[int, str]] = {}
    sampled: dict[str, dict[int, list[tuple[int, ...]]]] = {}
    for side, label in enumerate(("A", "B")):
        collected: list[RequestRecord] = []

        def keep(r: RequestRecord, out=collected) -> None:
            out.append(r)
            sink(r)
            progress("lossless", r)

        items = [Item(i, i, p, 0.0) for i, p in enumerate(opts.prompts)]
        plan = _plan(opts, label, Load(concurrency=2), "lossless-greedy", items, temperature=0.0, duration_s=None)
        run_workers(plan, 1, keep)
        greedy[label] = {r.prompt_index: r.text if r.ok else None for r in collected}
        collected.clear()
        if label == "B" and baseline is not None:
            sampled["B"] = dict(enumerate(baseline))  # the target itself, in-process
            continue
        items = [  # the check's own contexts and length, not the dataset's
            Item(j * opts.lossless_samples + s, j, prompt, 0.0)
            for j, prompt in enumerate(chosen)
            for s in range(opts.lossless_samples)
        ]
        plan = _plan(
            opts, label, Load(concurrency=4), "lossless-sampled", items, temperature=temperature,
            max_tokens=length, fixed_length=False, duration_s=None, seed=1_000_003 * (side + 1),
        )  # fmt: skip
        run_workers(plan, 1, keep)
        sampled[label] = {
            j: [first_tokens(tokenizer, r.text, length) for r in collected if r.prompt_index == j and r.ok]
            for j in range(len(contexts))
        }
    pairs = [(greedy["A"].get(i), greedy["B"].get(i)) for i in range(len(opts.prompts))]
    tests = [conditional_homogeneity(sampled["A"][j], sampled["B"][j]) for j in range(len(contexts))]
    planted = None
    if reference and reference.unstated_power is None:  # at the sample size the served side actually delivered
        base = baseline or [sampled["B"][j] for j in range(len(contexts))]
        served = min((len(sampled["A"][j]) for j in range(len(contexts))), default=0)
        if served >= MIN_SAMPLES:
            planted = reference.planted_outcomes(contexts, base, served, length, temperature, bound)
    result = verdict(pairs, tests, ALPHA, planted)
    result["temperature"] = temperature
    result["first_tokens"] = length
    result["contexts"] = contexts
    result["reference"] = str(opts.lossless_reference) if opts.lossless_reference else None
    result["baseline"] = "target in-process" if baseline is not None else "served baseline"
    if reference and reference.unstated_power:
        result["note"] = reference.unstated_power
    return result
