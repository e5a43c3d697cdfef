"""Speculative decoding on the embedded tiny pair, batch 1: trtspec's runner against plain decoding
and against Hugging Face assisted generation, on Spec-Bench prompts and held-out corpus text.

For each mode and K it reports tokens/s, acceptance, the measured cost ratios c (draft step /
target step) and v(K) (verify pass over K+1 tokens / target step), the cost-model bound
E[tokens/step] / (K c + v(K)) computed from the measured per-position acceptance, and efficiency =
measured speedup / bound. Every ratio compares runs made in this one process.

    python benchmarks/speculative.py [--prompts 8] [--max-tokens 128] [--out results/speculative.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaForCausalLM

from trtspec.assets import EMBEDDED_CHECKPOINTS
from trtspec.data import data_file
from trtspec.errors import run_script
from trtspec.fsutil import atomic_write_text
from trtspec.plan import forward_seconds, median_seconds
from trtspec.speculative.cost_model import conditional_rates, expected_tokens_per_step_positional
from trtspec.speculative.factory import load_runner
from trtspec.speculative.model import Transformer, load_transformer
from trtspec.speculative.runner import GenerationParams

TARGET, DRAFT = EMBEDDED_CHECKPOINTS["tiny-target"], EMBEDDED_CHECKPOINTS["tiny-draft"]


def load_prompts(tokenizer, count: int, max_prompt_tokens: int) -> list[tuple[str, list[int]]]:
    """Half Spec-Bench first turns (one per category, in order), half held-out Shakespeare."""
    card = json.loads((TARGET.parent / "training_log.json").read_text())  # written by tools/train_embedded_pair.py
    offset = int(card["corpus"]["val_offset"])
    rows = [json.loads(line) for line in data_file("spec_bench_questions.jsonl").read_text().splitlines()]
    by_category: dict[str, str] = {}
    for row in rows:
        by_category.setdefault(row["category"], row["turns"][0])
    bench = [(f"spec-bench/{c}", t) for c, t in sorted(by_category.items())][: count // 2]
    held_out = data_file("tinyshakespeare.txt").read_text()[offset:]
    chunks = [c.strip() for c in held_out.split("\n\n") if len(c.strip()) > 200]
    step = max(1, len(chunks) // (count - len(bench)))
    corpus = [(f"held-out/{i}", chunks[i * step][:600]) for i in range(count - len(bench))]
    out = []
    for name, text in bench + corpus:
        ids = tokenizer(text).input_ids[-max_prompt_tokens:]
        out.append((name, ids))
    return out


@torch.inference_mode()
def step_costs(target: Transformer, draft: Transformer, k_max: int, context: int = 128) -> dict:
    """Per-call costs at a realistic cache length: target 1 token, verify K+1 tokens, draft and MTP steps."""
    t1 = forward_seconds(target, 1, 1, context)
    verify = {k: forward_seconds(target, 1, k + 1, context) / t1 for k in range(1, k_max + 1)}
    mtp_cache = target.new_mtp_cache(1, context + 32)
    hid = torch.randn(1, 1, target.dims.hidden_size)
    tok, pos = torch.tensor([[5]]), torch.tensor([[context]])
    mtp = median_seconds(lambda: target.mtp_forward(0, hid, tok, pos, mtp_cache))
    return {
        "target_ms": t1 * 1000,
        "v": verify,
        "c_draft": forward_seconds(draft, 1, 1, context) / t1,
        "c_mtp": mtp / t1,
    }


def run_trtspec(runner, prompts, max_tokens: int) -> dict:
    params = GenerationParams(max_tokens=max_tokens)
    runner.generate([prompts[0][1]], GenerationParams(max_tokens=8))  # warm-up
    tokens, seconds, drafted, accepted, steps = 0, 0.0, 0, 0, 0
    per_pos_d = [0] * 16
    per_pos_a = [0] * 16
    outputs = []
    for _, ids in prompts:
        t0 = time.perf_counter()
        g = runner.generate([ids], params)[0]
        seconds += time.perf_counter() - t0
        tokens += len(g.tokens)
        outputs.append(g.tokens)
        drafted += g.stats.draft_tokens
        accepted += g.stats.accepted_tokens
        steps += g.stats.steps
        for j, (d, a) in enumerate(zip(g.stats.drafted_per_position, g.stats.accepted_per_position, strict=True)):
            per_pos_d[j] += d
            per_pos_a[j] += a
    rates = conditional_rates(per_pos_d, per_pos_a)
    return {
        "tokens_per_s": tokens / seconds,
        "tokens": tokens,
        "seconds": seconds,
        "steps": steps,
        "acceptance": accepted / drafted if drafted else None,
        "acceptance_per_position": rates,
        "outputs": outputs,
    }


@torch.inference_mode()
def run_hf(target, prompts, max_tokens: int, **kwargs) -> dict:
    tokens, seconds, outputs = 0, 0.0, []
    warm = torch.tensor([prompts[0][1]])
    target.generate(warm, max_new_tokens=8, min_new_tokens=8, do_sample=False, **kwargs)
    for _, ids in prompts:
        x = torch.tensor([ids])
        t0 = time.perf_counter()
        out = target.generate(x, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False, **kwargs)
        seconds += time.perf_counter() - t0
        new = out[0, x.shape[1] :].tolist()
        tokens += len(new)
        outputs.append(new)
    return {"tokens_per_s": tokens / seconds, "tokens": tokens, "seconds": seconds, "outputs": outputs}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--max-prompt-tokens", type=int, default=192)
    ap.add_argument("--draft-k", default="1,2,3,4,5,6")
    ap.add_argument("--mtp-k", default="1,2,3,4")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("results/speculative.json"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(str(TARGET))
    prompts = load_prompts(tokenizer, args.prompts, args.max_prompt_tokens)
    max_len = args.max_prompt_tokens + args.max_tokens + 32
    target = load_transformer(TARGET, max_len=max_len)
    draft = load_transformer(DRAFT, max_len=max_len)
    draft_ks = [int(k) for k in args.draft_k.split(",")]
    mtp_ks = [int(k) for k in args.mtp_k.split(",")]
    costs = step_costs(target, draft, max(draft_ks + mtp_ks))
    rows: list[dict] = []

    def record(mode: str, k: int, res: dict, c: float | None) -> None:
        row = {"engine": "trtspec", "mode": mode, "k": k, **{x: y for x, y in res.items() if x != "outputs"}}
        if k and c is not None:
            bound = expected_tokens_per_step_positional(res["acceptance_per_position"]) / (k * c + costs["v"][k])
            row.update(c=c, v=costs["v"][k], bound=bound)
        rows.append(row)
        print(f"  {mode:13s} K={k}  {res['tokens_per_s']:7.1f} tok/s", file=sys.stderr, flush=True)

    plain = run_trtspec(load_runner(TARGET, "none", target=target, max_len=max_len), prompts, args.max_tokens)
    record("none", 0, plain, None)
    exact = {}
    for mode, ks, c in (
        ("draft-target", draft_ks, costs["c_draft"]),
        ("mtp", mtp_ks, costs["c_mtp"]),
        ("ngram", [2, 4], 0.0),
    ):
        for k in ks:
            runner = load_runner(TARGET, mode, DRAFT, num_draft_tokens=k, target=target, max_len=max_len)
            res = run_trtspec(runner, prompts, args.max_tokens)
            exact[f"{mode}/{k}"] = res["outputs"] == plain["outputs"]
            record(mode, k, res, c)

    hf_target = LlamaForCausalLM.from_pretrained(TARGET, dtype=torch.float32).eval()
    hf_draft = LlamaForCausalLM.from_pretrained(DRAFT, dtype=torch.float32).eval()
    hf_rows = [("hf-plain", 0, {})]
    hf_rows += [
        (
            "hf-assisted",
            k,
            {
                "assistant_model": hf_draft,
                "num_assistant_tokens": k,
                "num_assistant_tokens_schedule": "constant",
                "assistant_confidence_threshold": 0.0,
            },
        )
        for k in draft_ks
    ]
    hf_rows += [("hf-prompt-lookup", k, {"prompt_lookup_num_tokens": k}) for k in (2, 4)]
    for name, k, kw in hf_rows:
        res = run_hf(hf_target, prompts, args.max_tokens, **kw)
        rows.append(
            {"engine": "transformers", "mode": name, "k": k, **{x: y for x, y in res.items() if x != "outputs"}}
        )
        print(f"  {name:16s} K={k}  {res['tokens_per_s']:7.1f} tok/s", file=sys.stderr, flush=True)

    base = plain["tokens_per_s"]
    for row in rows:
        row["speedup"] = row["tokens_per_s"] / base
        if "bound" in row:
            row["efficiency"] = row["speedup"] / row["bound"]
    best = {}
    for mode in ("draft-target", "mtp", "ngram"):
        best[mode] = max(
            (r for r in rows if r["engine"] == "trtspec" and r["mode"] == mode), key=lambda r: r["tokens_per_s"]
        )
    hf_assisted = max((r for r in rows if r["mode"] == "hf-assisted"), key=lambda r: r["tokens_per_s"])
    summary = {
        "plain_tokens_per_s": base,
        "best": {m: {"k": r["k"], "speedup": r["speedup"], "efficiency": r.get("efficiency")} for m, r in best.items()},
        "vs_hf_assisted": best["draft-target"]["tokens_per_s"] / hf_assisted["tokens_per_s"],
        "hf_assisted_best_k": hf_assisted["k"],
        "greedy_outputs_identical_to_plain": exact,
        "targets": {
            "draft_target_2x": best["draft-target"]["speedup"] >= 2.0,
            "mtp_2x": best["mtp"]["speedup"] >= 2.0,
            "efficiency_0.9": all((best[m].get("efficiency") or 0) >= 0.9 for m in ("draft-target", "mtp")),
            "vs_hf_1.3x": best["draft-target"]["tokens_per_s"] / hf_assisted["tokens_per_s"] >= 1.3,
        },
    }
    report = {
        "benchmark": "speculative",
        "threads": args.threads,
        "prompts": [n for n, _ in prompts],
        "max_tokens": args.max_tokens,
        "costs": costs,
        "rows": rows,
        "summary": summary,
        "torch": torch.__version__,
    }
    atomic_write_text(args.out, json.dumps(report, indent=2))

    header = ("engine", "mode", "K", "tok/s", "speedup", "accept", "bound", "eff")
    print("{:13s} {:17s} {:>2s} {:>7s} {:>7s} {:>6s} {:>6s} {:>5s}".format(*header))
    for r in rows:
        acc = f"{r['acceptance']:.2f}" if r.get("acceptance") is not None else "-"
        bound = f"{r['bound']:.2f}" if "bound" in r else "-"
        eff = f"{r['efficiency']:.2f}" if "efficiency" in r else "-"
        print(
            f"{r['engine']:13s} {r['mode']:17s} {r['k']:>2d} {r['tokens_per_s']:7.1f} {r['speedup']:7.2f} "
            f"{acc:>6s} {bound:>6s} {eff:>5s}"
        )
    print(
        f"c(draft)={costs['c_draft']:.3f} c(mtp)={costs['c_mtp']:.3f} target step {costs['target_ms']:.2f} ms; "
        f"vs HF assisted: {summary['vs_hf_assisted']:.2f}x; targets: {summary['targets']}"
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
