"""Which speculative method pays on this pair and this traffic: every method the pair supports, measured.

A method is a torch-runner drafter (the configured mode, n-gram lookup, which needs nothing, and MTP where
the target carries MTP layers) drafting a chain of K or a token tree. Each is run at batch 1 on the user's
prompts: tokens per target pass and seconds per step (draft and verify apart) are measured together, so
the batch-1 prediction is tokens/step x t_plain / t_step. Larger batches scale the verify part by the
target's forward time at that batch and width and the draft part by the drafter's (a draft model's
forward, one lookup per row for n-gram, heads and MTP layers as the target's single-token pass).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.config import DeploymentConfig
from trtspec.errors import UsageError
from trtspec.modes import REGISTRY, get_mode
from trtspec.speculative.drafters import DraftModelDrafter, NgramDrafter
from trtspec.speculative.factory import load_runner, mode_settings
from trtspec.speculative.model import Transformer
from trtspec.speculative.requests import SamplingParams, TreeShape, draft_slots
from trtspec.speculative.runner import GenerationParams, SpeculativeRunner

CHAIN_KS = (1, 2, 3, 4)
TREES = ("2x2", "3x2", "3x3", "4x3")
CONFIRM = 3  # the best this many are measured again and judged on the second run alone: the best of many noisy
# runs is the luckiest as much as the fastest, and its own figure would overstate it


@dataclass(frozen=True)
class Method:
    mode: str
    k: int  # drafts per step for a chain; the tree's depth for a tree
    tree: TreeShape | None = None

    @property
    def label(self) -> str:
        return f"{self.mode} tree {self.tree}" if self.tree else f"{self.mode} K={self.k}"

    @property
    def verify_width(self) -> int:
        """Tokens the target verifies per step: the last committed token and every draft slot."""
        return 1 + draft_slots(self.k, self.tree)


def candidates(cfg: DeploymentConfig, target: Transformer) -> list[Method]:
    """The configured mode, then what needs nothing more than the pair: n-gram, and MTP if the target has it."""
    modes = [cfg.mode]
    modes += [m for m in ("ngram", "mtp") if m != cfg.mode and (m != "mtp" or target.dims.num_mtp_layers)]
    out = []
    for mode in modes:
        out += [Method(mode, k) for k in CHAIN_KS]
        if REGISTRY[mode].runner_trees:
            out += [Method(mode, shape.depth, shape) for shape in map(TreeShape.parse, TREES)]
    return out


def run_prompts(runner: SpeculativeRunner, prompts: list[list[int]], params: GenerationParams) -> dict[str, float]:
    """Batch 1 over every prompt: output tokens, target passes, and the decoding loop's seconds apart."""
    runner.generate([prompts[0]], GenerationParams(max_tokens=4, sampling=params.sampling))  # warm-up
    totals = {"tokens": 0, "steps": 0, "loop_s": 0.0, "draft_s": 0.0}
    for ids in prompts:
        t0 = time.perf_counter()
        g = runner.generate([ids], params)[0]
        totals["loop_s"] += time.perf_counter() - t0 - g.stats.prefill_s
        totals["tokens"] += len(g.tokens) - 1  # the first comes from the prefill
        totals["steps"] += g.stats.steps
        totals["draft_s"] += g.stats.draft_s
    return totals


def compare_methods(
    cfg: DeploymentConfig,
    target_path: Path,
    draft_path: Path | None,
    target: Transformer,
    prompts: list[list[int]],
    max_tokens: int,
    sampling: SamplingParams,
    batches: list[int],
) -> dict[str, Any]:
    """Every candidate measured on `prompts`, with predicted speedups per batch size and the best at batch 1."""
    from trtspec.plan import forward_seconds

    params = GenerationParams(max_tokens=max_tokens, sampling=sampling, seed=0)
    weight = target.embed_tokens.weight  # drafts load beside the shared target: its device and dtype
    where = {"device": str(weight.device), "dtype": weight.dtype, "max_len": target.max_positions, "target": target}
    plain_runner = load_runner(target_path, "none", **where)

    def plain_seconds() -> float:
        plain = run_prompts(plain_runner, prompts, params)
        if plain["steps"] == 0:
            raise UsageError("the prompts produced no decoding steps to compare methods on: raise --max-tokens")
        return plain["loop_s"] / plain["steps"]

    plain_s = plain_seconds()
    widths: dict[int, dict[int, float]] = {}

    def target_scale(batch: int, width: int) -> float:
        row = widths.setdefault(width, {1: forward_seconds(target, 1, width)})
        if batch not in row:
            row[batch] = forward_seconds(target, batch, width)
        return row[batch] / row[1]

    draft_scales: dict[tuple, float] = {}

    def draft_scale(runner: SpeculativeRunner, batch: int, method: Method) -> float:
        key = (type(runner.drafter).__name__, method.tree.width if method.tree else 1, batch)
        if key not in draft_scales:
            draft_scales[key] = _draft_scale(runner, batch, method, forward_seconds)
        return draft_scales[key]

    def measure(method: Method) -> dict[str, Any]:
        spec = get_mode(method.mode)
        runner = load_runner(
            target_path,
            method.mode,
            draft_path if spec.needs_draft else None,
            num_draft_tokens=method.k,
            **where,
            settings=mode_settings(cfg, method.mode) if method.mode == cfg.mode else None,
            tree=method.tree,
        )
        m = run_prompts(runner, prompts, params)
        tokens_per_step = m["tokens"] / m["steps"]
        step_s, draft_s = m["loop_s"] / m["steps"], m["draft_s"] / m["steps"]
        by_batch = {}
        for b in batches:
            step_b = draft_s * draft_scale(runner, b, method) + (step_s - draft_s) * target_scale(
                b, method.verify_width
            )
            by_batch[str(b)] = tokens_per_step * plain_s * target_scale(b, 1) / step_b
        return {
            "method": method.label,
            "mode": method.mode,
            "k": method.k,
            "tree": str(method.tree) if method.tree else None,
            "tokens_per_step": tokens_per_step,
            "step_ms": 1000 * step_s,
            "draft_ms": 1000 * draft_s,
            "predicted_speedup": by_batch,
        }

    methods = candidates(cfg, target)
    rows = [measure(method) for method in methods]
    leaders = sorted(range(len(rows)), key=lambda i: -rows[i]["predicted_speedup"]["1"])[:CONFIRM]
    plain_s = plain_seconds()  # the confirming round's own baseline
    for i in leaders:
        rows[i] = {**measure(methods[i]), "confirmed": True}
    best = max((rows[i] for i in leaders), key=lambda r: r["predicted_speedup"]["1"])
    return {"plain_ms_per_token": 1000 * plain_s, "rows": rows, "recommended": best}


def _draft_scale(runner: SpeculativeRunner, batch: int, method: Method, forward_seconds) -> float:
    """How the drafting part of a step grows from batch 1 to `batch`."""
    if batch == 1:
        return 1.0
    drafter = runner.drafter
    if isinstance(drafter, NgramDrafter):
        return float(batch)  # one lookup per row on the host
    if isinstance(drafter, DraftModelDrafter):
        width = method.tree.width if method.tree else 1
        return forward_seconds(drafter.model, batch, width) / forward_seconds(drafter.model, 1, width)
    return forward_seconds(runner.target, batch, 1) / forward_seconds(runner.target, 1, 1)
