"""`trtspec plan`: measured acceptance on the user's prompts -> the K to build and the speedup to expect,
and on the torch backend which method pays most (trtspec.methods: every chain and tree the pair supports).

Acceptance per position and per category comes from running the drafter against the target with
the torch runner. Costs come from this machine (torch backend: the runner's whole decoding step
timed at each K and plain decoding timed per token, scaled to larger batches by model calls timed
per batch size), or, for a GPU deployment, from a memory-bandwidth roofline over parameter and KV
bytes (a step is K draft calls plus one verify call). The speedup at batch B and K drafts is
E[tokens/step](K) x t_plain(B) / t_step(B, K); where it falls below 1,
speculation stops paying (TensorRT-LLM 1.2's `max_concurrency` turns it off above that batch).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trtspec.checkpoints.inspect import read_checkpoint
from trtspec.checkpoints.memory import model_memory
from trtspec.config import DeploymentConfig
from trtspec.errors import UsageError
from trtspec.methods import compare_methods, method_modes
from trtspec.modes import get_mode
from trtspec.prompts import Prompt
from trtspec.speculative.cost_model import conditional_rates, expected_tokens_per_step_positional
from trtspec.speculative.factory import load_runner, mode_settings, runner_mode
from trtspec.speculative.policy import batch_sizes
from trtspec.speculative.requests import SamplingParams
from trtspec.speculative.runner import GenerationParams, SpeculativeRunner

# Dense BF16 tensor throughput and HBM bandwidth, from NVIDIA's data sheets.
GPUS = {
    "a100": {"memory_gb": 80, "bandwidth_gbs": 2039, "tflops": 312},
    "h100": {"memory_gb": 80, "bandwidth_gbs": 3350, "tflops": 989},
    "h200": {"memory_gb": 141, "bandwidth_gbs": 4800, "tflops": 989},
    "b200": {"memory_gb": 180, "bandwidth_gbs": 8000, "tflops": 2250},
}
PROBE_K = 8
CALIBRATION_PROMPTS = 3  # prompts timed at each K on this machine


@dataclass
class Acceptance:
    rates: list[float]  # conditional acceptance per position, up to PROBE_K
    by_category: dict[str, dict[str, Any]]
    rate: float  # accepted / drafted over every position
    draft_s_per_token: float
    probe_k: int


def measure_acceptance(
    runner: SpeculativeRunner,
    tokenizer,
    prompts: list[Prompt],
    max_tokens: int,
    sampling: SamplingParams,
    max_prompt_tokens: int,
) -> Acceptance:
    """Run every prompt at batch 1 with K = PROBE_K, as a freshly started server, and aggregate the runner's
    per-position counts."""
    runner.forget_history()
    k = runner.num_draft_tokens
    totals = {"drafted": [0] * k, "accepted": [0] * k, "steps": 0, "draft_s": 0.0, "verify_s": 0.0, "drafts": 0}
    per_cat: dict[str, dict[str, Any]] = {}
    for p in prompts:
        ids = tokenizer(p.text).input_ids[-max_prompt_tokens:]
        g = runner.generate([ids], GenerationParams(max_tokens=max_tokens, sampling=sampling, seed=0))[0]
        s = g.stats
        for bucket in (
            totals,
            per_cat.setdefault(
                p.category,
                {"drafted": [0] * k, "accepted": [0] * k, "steps": 0, "draft_s": 0.0, "verify_s": 0.0, "drafts": 0},
            ),
        ):
            bucket["drafted"] = [a + b for a, b in zip(bucket["drafted"], s.drafted_per_position, strict=True)]
            bucket["accepted"] = [a + b for a, b in zip(bucket["accepted"], s.accepted_per_position, strict=True)]
            bucket["steps"] += s.steps
            bucket["draft_s"] += s.draft_s
            bucket["verify_s"] += s.verify_s
            bucket["drafts"] += s.draft_tokens
    if totals["steps"] == 0 or totals["drafts"] == 0:
        raise UsageError("the prompts produced no speculative steps: raise --max-tokens")
    categories = {}
    for name, b in per_cat.items():
        rates = conditional_rates(b["drafted"], b["accepted"])
        categories[name] = {
            "acceptance_rate": sum(b["accepted"]) / max(1, b["drafts"]),
            "acceptance_per_position": rates,
            "tokens_per_step": expected_tokens_per_step_positional(rates),
        }
    return Acceptance(
        rates=conditional_rates(totals["drafted"], totals["accepted"]),
        by_category=categories,
        rate=sum(totals["accepted"]) / totals["drafts"],
        draft_s_per_token=totals["draft_s"] / totals["drafts"],
        probe_k=k,
    )


def median_seconds(fn, reps: int = 15) -> float:
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


@torch.inference_mode()
def forward_seconds(model, batch: int, tokens: int, context: int = 128) -> float:
    cache = model.new_cache(batch, context + tokens + 1)
    model(torch.randint(0, model.dims.vocab_size, (batch, context)), torch.arange(context).expand(batch, -1), cache)
    toks = torch.randint(0, model.dims.vocab_size, (batch, tokens))
    pos = (context + torch.arange(tokens)).expand(batch, -1)
    return median_seconds(lambda: model(toks, pos, cache))


def step_seconds(runner: SpeculativeRunner, prompts: list[list[int]], k: int, max_tokens: int, sampling) -> float:
    """Wall seconds per decoding step (prefill excluded) of the real runner at K drafts.

    Timing the whole loop, not the model calls alone, keeps what the cost formula would miss: the
    draft's catch-up forward over the tokens accepted last step (amortised over K, so it weighs most
    at small K), sampling, verification and bookkeeping.
    """
    params = GenerationParams(max_tokens=max_tokens, sampling=sampling, seed=0, num_draft_tokens=k)
    runner.generate([prompts[0]], GenerationParams(max_tokens=4, sampling=sampling, num_draft_tokens=k))
    runner.forget_history()
    loop_s, steps = 0.0, 0
    for ids in prompts:
        t0 = time.perf_counter()
        g = runner.generate([ids], params)[0]
        loop_s += time.perf_counter() - t0 - g.stats.prefill_s
        steps += g.stats.steps
    return loop_s / steps


def local_costs(
    runner: SpeculativeRunner,
    plain: SpeculativeRunner,
    acc: Acceptance,
    calibration: list[list[int]],
    batches: list[int],
    max_tokens: int,
    sampling: SamplingParams,
) -> dict[str, Any]:
    """Seconds per plain token and per speculative step at each batch size and K, on this machine.

    Batch 1 is timed on the runner itself; larger batches scale the verify part by the target's
    forward time at that batch and width, and the draft part as the drafter says it grows (`batch_scale`).
    """
    target = runner.target
    plain_1 = step_seconds(plain, calibration, 0, max_tokens, sampling)
    steps_1 = {k: step_seconds(runner, calibration, k, max_tokens, sampling) for k in range(1, acc.probe_k + 1)}
    out: dict[str, Any] = {"by_batch": {}}
    fwd_1 = {w: forward_seconds(target, 1, w) for w in range(1, acc.probe_k + 2)}
    for b in batches:
        if b == 1:
            plain_b, draft_scale, verify_scale = plain_1, 1.0, {w: 1.0 for w in fwd_1}
        else:
            verify_scale = {w: forward_seconds(target, b, w) / fwd_1[w] for w in fwd_1}
            draft_scale = runner.drafter.batch_scale(b, acc.probe_k, 1, forward_seconds, target)
            plain_b = plain_1 * verify_scale[1]
        step_b = {}
        for k, s in steps_1.items():
            draft_part = min(s, k * acc.draft_s_per_token)
            step_b[k] = draft_part * draft_scale + (s - draft_part) * verify_scale[k + 1]
        out["by_batch"][b] = {"plain_s": plain_b, "draft_s": acc.draft_s_per_token * draft_scale, "step_s": step_b}
    out["c"] = acc.draft_s_per_token / plain_1
    return out


def gpu_costs(cfg: DeploymentConfig, gpu: str, probe_k: int, batches: list[int], context: int) -> dict[str, Any]:
    """Roofline estimate: a step reads the weights and the batch's KV once, or is bound by FLOPs."""
    spec = GPUS[gpu]
    b = cfg.build
    target = read_checkpoint(_local(cfg, "target"))
    tm = model_memory(target.config, cfg.target.dtype, cfg.target.quantization, b.backend, b.tp, b.pp)
    mode = get_mode(cfg.mode)
    if mode.draft_engine:
        draft = read_checkpoint(_local(cfg, "draft"))
        dm = model_memory(draft.config, cfg.draft.dtype, cfg.draft.quantization, b.backend, b.tp, b.pp)
        d_bytes, d_kv, d_params = dm.weight_bytes_per_gpu, dm.kv_bytes_per_token_per_gpu, dm.params
    elif mode.in_target or mode.draft_head:
        # one MTP layer or draft head: roughly a trunk layer plus the projection, sharing embedding and head
        layers = target.config["num_hidden_layers"]
        d_bytes = tm.weight_bytes_per_gpu / layers
        d_kv = tm.kv_bytes_per_token_per_gpu / (layers + 1)
        d_params = tm.params / layers
    else:  # drafting without a model (n-gram lookup) reads no weights: its time is the host's, not the GPU's
        d_bytes, d_kv, d_params = 0.0, 0.0, 0
    bw, flops = spec["bandwidth_gbs"] * 1e9, spec["tflops"] * 1e12 * b.tp * b.pp

    def step(weights: float, kv: float, params: int, batch: int, tokens: int) -> float:
        memory = (weights + batch * context * kv) / bw
        compute = 2 * params * batch * tokens / flops
        return max(memory, compute)

    out: dict[str, Any] = {"gpu": gpu, "by_batch": {}}
    for batch in batches:
        plain = step(tm.weight_bytes_per_gpu, tm.kv_bytes_per_token_per_gpu, tm.params, batch, 1)
        out["by_batch"][batch] = {
            "plain_s": plain,
            "draft_s": step(d_bytes, d_kv, d_params, batch, 1),
            "verify_s": {
                k: step(tm.weight_bytes_per_gpu, tm.kv_bytes_per_token_per_gpu, tm.params, batch, k + 1)
                for k in range(1, probe_k + 1)
            },
        }
        out["by_batch"][batch]["step_s"] = {
            k: k * out["by_batch"][batch]["draft_s"] + v for k, v in out["by_batch"][batch]["verify_s"].items()
        }
    out["c"] = out["by_batch"][1]["draft_s"] / out["by_batch"][1]["plain_s"]
    return out


def predict(rates: list[float], costs: dict[str, Any]) -> dict[str, Any]:
    """Speedup per batch size and K, the best K per batch, and where speculation stops paying."""
    table: dict[int, dict[int, float]] = {}
    for batch, c in costs["by_batch"].items():
        table[batch] = {}
        for k in range(1, len(rates) + 1):
            tokens = expected_tokens_per_step_positional(rates[:k])
            table[batch][k] = tokens * c["plain_s"] / c["step_s"][k]
    best = {b: max(row.items(), key=lambda kv: kv[1]) for b, row in table.items()}
    stops = next((b for b, (_, s) in sorted(best.items()) if s < 1.0), None)
    return {
        "speedup": table,
        "best": {b: {"k": k, "speedup": s} for b, (k, s) in best.items()},
        "stops_paying_at_batch": stops,
    }


def _local(cfg: DeploymentConfig, field: str) -> Path:
    path = cfg.checkpoint_path(getattr(cfg, field))
    if path is None:
        raise UsageError(
            f"{field}.checkpoint {getattr(cfg, field).checkpoint} is a hub id: plan needs a local copy "
            "to measure acceptance"
        )
    return path


def run_plan(
    cfg: DeploymentConfig,
    prompts: list[Prompt],
    max_tokens: int,
    gpu: str | None = None,
    max_prompt_tokens: int = 256,
    methods: list[str] | None = None,
) -> dict[str, Any]:
    from trtspec.bench.datasets import load_tokenizer

    if not get_mode(cfg.mode).speculates():
        raise UsageError("speculation.mode is none: there is nothing to plan")
    runner_mode(cfg.mode)  # acceptance is measured with the torch runner: refuse a mode it lacks first
    spec = get_mode(cfg.mode)
    if (tree := spec.own_tree(cfg)) is not None:
        hint = (  # lookahead's defaults fix a tree; Medusa's choices are a setting to leave out
            f"plan a config of another mode, which compares {cfg.mode} among its methods"
            if spec.runner_tree({}) is not None
            else f"plan a copy without the {spec.section} settings that fix it to compare its chains and trees"
        )
        raise UsageError(
            f"plan chooses K for a mode's drafts; {cfg.mode}'s follow from its own settings (the tree {tree}): {hint}"
        )
    if methods is not None and cfg.build.backend != "torch":
        raise UsageError(f"--methods compares the torch runner's methods; backend {cfg.build.backend} plans its mode")
    target_path = _local(cfg, "target")
    draft_path = _local(cfg, "draft") if get_mode(cfg.mode).needs_draft else None
    max_len = max_prompt_tokens + max_tokens + PROBE_K + 8
    runner = load_runner(
        target_path,
        cfg.mode,
        draft_path,
        num_draft_tokens=PROBE_K,
        mtp_layers=cfg.mtp.num_nextn_predict_layers if cfg.mtp else None,
        max_len=max_len,
        settings=mode_settings(cfg),
    )
    modes = method_modes(cfg, runner.target, methods)  # an unknown --methods is refused before measuring
    tokenizer = load_tokenizer(str(target_path))
    s = cfg.speculation.sampling
    sampling = SamplingParams(s.temperature, s.top_k, s.top_p)
    acc = measure_acceptance(runner, tokenizer, prompts, max_tokens, sampling, max_prompt_tokens)
    batches = batch_sizes(cfg.build.max_batch_size)
    if cfg.build.backend == "torch":
        plain = load_runner(target_path, "none", max_len=max_len, target=runner.target)
        calibration = [tokenizer(p.text).input_ids[-max_prompt_tokens:] for p in prompts[:CALIBRATION_PROMPTS]]
        costs = local_costs(runner, plain, acc, calibration, batches, min(max_tokens, 64), sampling)
        where = "measured on this machine (torch runner)"
        ids = [tokenizer(p.text).input_ids[-max_prompt_tokens:] for p in prompts]
        compared = compare_methods(
            cfg, target_path, draft_path, runner.target, ids, min(max_tokens, 64), sampling, batches, modes
        )
    else:
        compared = None  # measured methods are the torch runner's: a GPU deployment plans its configured mode
        gpu = gpu or next((n for n, g in GPUS.items() if g["memory_gb"] == cfg.build.gpu_memory_gb), "h100")
        costs = gpu_costs(cfg, gpu, acc.probe_k, batches, context=cfg.build.max_input_len)
        where = f"estimated for {gpu} from parameter and KV bytes (memory-bandwidth roofline)"
    prediction = predict(acc.rates, costs)
    recommended = prediction["best"][1]["k"]
    return {
        "config": str(cfg.source) if cfg.source else cfg.name,
        "mode": cfg.mode,
        "prompts": len(prompts),
        "max_tokens": max_tokens,
        "acceptance_per_position": acc.rates,
        "acceptance_rate_at_probe_k": acc.rate,
        "probe_k": acc.probe_k,
        "by_category": acc.by_category,
        "costs": {
            "where": where,
            "c": costs["c"],
            "by_batch": {str(b): v for b, v in costs["by_batch"].items()},
        },
        "recommended_num_draft_tokens": recommended,
        "predicted_speedup_batch1": prediction["best"][1]["speedup"],
        "predicted_speedup": {str(b): {str(k): v for k, v in row.items()} for b, row in prediction["speedup"].items()},
        "best_by_batch": {str(b): v for b, v in prediction["best"].items()},
        "stops_paying_at_batch": prediction["stops_paying_at_batch"],
        "max_concurrency_hint": (
            prediction["stops_paying_at_batch"] // 2 if prediction["stops_paying_at_batch"] else None
        ),
        "methods": compared,
        "recommended_method": compared["recommended"] if compared else None,
    }


def write_plot(plan: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    batch1 = plan["predicted_speedup"]["1"]
    ks = [int(k) for k in batch1]
    left.plot(ks, [batch1[str(k)] for k in ks], marker="o")
    left.axhline(1.0, color="grey", lw=0.8, ls="--")
    left.set(xlabel="num_draft_tokens (K)", ylabel="predicted speedup", title="batch 1")
    batches = [int(b) for b in plan["best_by_batch"]]
    k = str(plan["recommended_num_draft_tokens"])
    right.plot(batches, [plan["predicted_speedup"][str(b)][k] for b in batches], marker="o", label=f"K={k}")
    right.plot(
        batches,
        [plan["best_by_batch"][str(b)]["speedup"] for b in batches],
        marker="x",
        ls=":",
        label="best K per batch",
    )
    right.axhline(1.0, color="grey", lw=0.8, ls="--")
    right.set_xscale("log", base=2)
    right.set(xlabel="batch size", ylabel="predicted speedup", title="speedup against batch size")
    right.legend()
    fig.suptitle(f"trtspec plan: {plan['mode']}, {plan['costs']['where']}", fontsize=9)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    tmp.replace(path)
