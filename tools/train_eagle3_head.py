"""Train an EAGLE-3 head for the embedded target on CPU: the target frozen, the head distilled from it.

The head (trtspec.speculative.eagle) reads the outputs of three target layers at position i and the
embedding of token i+1, and learns the target's own distribution for token i+2. EAGLE-3's training-time
test unrolls it: a second step feeds the head's own output back at position i+1 with token i+2 and learns
token i+3, its attention seeing the first step's keys up to i and its own, exactly as the runner's chain
sees its cache. Its draft vocabulary is the `--draft-vocab` target tokens most frequent in the training
split (`d2t` maps them back), as EAGLE-3 shrinks the head's output matrix; the targets are the target's
probabilities on those tokens, renormalised.

It starts as "the top captured layer, read by the target's head": fc picks that layer, the attention and
MLP outputs are zero, the output matrix is the target's rows for the draft vocabulary. `<out>/
training_log.json` records the held-out top-1 agreement of each unrolled step with the target.

    python tools/train_eagle3_head.py --out trtspec/assets/tiny-eagle3   # the shipped head (the defaults)

The corpus is `$TRTSPEC_DATA/tinyshakespeare.txt`, split where the pair's training split ended.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from head_training import common_arguments, corpus_split, train

from trtspec.checkpoints.inspect import read_hf_config
from trtspec.errors import run_script
from trtspec.fsutil import atomic_write_text
from trtspec.speculative.eagle import Eagle3Head, default_capture
from trtspec.speculative.model import KVCache, ModelDims, Transformer, load_transformer

SCRIPT = "tools/train_eagle3_head.py"


@torch.no_grad()
def teacher(target: Transformer, ids: torch.Tensor, capture: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    out = target(ids, positions, target.new_cache(ids.shape[0], ids.shape[1]), capture=capture)
    return out.features, out.logits


def unrolled(head: Eagle3Head, target: Transformer, features: torch.Tensor, ids: torch.Tensor, steps: int):
    """Logits over the draft vocabulary of each unrolled step: step s at query i (rope position i + s)
    reads token i + 1 + s and predicts token i + 2 + s; it attends to step 0's keys at positions <= i and
    to its own lineage's keys of steps 1..s, which is what the runner's cache holds for the s-th draft."""
    b, t = ids.shape
    span = t - 1  # step-0 queries 0..t-2
    w = head.fc.weight
    hidden, out, cache = head.fc(features[:, :span]), [], None
    for s in range(steps):
        earlier, cache = cache, KVCache(head.dims, 1, b, span * (s + 1), w.dtype, w.device)
        if earlier is not None:  # a fresh cache per step: autograd keeps the earlier steps' keys as they were
            cache.k[:, :, :, : span * s] = earlier.k
            cache.v[:, :, :, : span * s] = earlier.v
        n = span - s
        rope = torch.arange(n) + s
        cos, sin = target.rope_cos[rope][None, None], target.rope_sin[rope][None, None]
        slots = (s * span + torch.arange(n)).expand(b, n)
        keys = torch.arange(span * (s + 1))
        query = torch.arange(n)[:, None]
        mask = keys[None, :] <= query  # step 0's keys up to i
        for r in range(1, s + 1):
            mask = mask | (keys[None, :] == r * span + query)  # the lineage's own later steps
        tokens = ids[:, 1 + s : 1 + s + n]
        x_in = hidden[:, :n]
        x = head.step(target.embed_tokens(tokens), x_in, cos, sin, cache, slots, mask[None, None], span * (s + 1))
        out.append(head.lm_head(head.norm(x)).float())
        hidden = x
    return out


def losses(step_logits: list[torch.Tensor], teacher_logits: torch.Tensor, vocab: torch.Tensor) -> list[torch.Tensor]:
    """Cross-entropy against the target's probabilities for the same token, on the draft vocabulary."""
    result = []
    for s, logits in enumerate(step_logits):
        n = logits.shape[1]
        want = teacher_logits[:, 1 + s : 1 + s + n][..., vocab].softmax(-1)
        result.append(-(want * logits.log_softmax(-1)).sum(-1).mean())
    return result


@torch.no_grad()
def agreement(head: Eagle3Head, target: Transformer, ids: torch.Tensor, length: int, steps: int) -> list[float]:
    """Held-out top-1 agreement of each unrolled step with the target's argmax for the same token."""
    hits, total = [0] * steps, [0] * steps
    to_target = head.draft_to_target()
    for start in range(0, len(ids) - length, length):
        window = ids[start : start + length][None]
        features, logits = teacher(target, window, head.capture)
        for s, step in enumerate(unrolled(head, target, features, window, steps)):
            n = step.shape[1]
            guess = to_target[step.argmax(-1)]
            hits[s] += int((guess == logits[:, 1 + s : 1 + s + n].argmax(-1)).sum())
            total[s] += guess.numel()
    return [h / n for h, n in zip(hits, total, strict=True)]


def draft_vocabulary(train_ids: torch.Tensor, vocab: int, size: int) -> torch.Tensor:
    """The `size` most frequent target ids, ascending (so d2t = id - index is never negative)."""
    counts = torch.bincount(train_ids, minlength=vocab)
    return counts.topk(size).indices.sort().values


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_arguments(ap)
    ap.add_argument("--intermediate", type=int, default=384)
    ap.add_argument("--draft-vocab", type=int, default=1536)
    ap.add_argument("--ttt-steps", type=int, default=2, help="unrolled steps of the training-time test")
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    started = time.time()

    train_ids, val_ids = corpus_split(args.target, args.eval_tokens)
    target_config = read_hf_config(args.target)
    target = load_transformer(args.target, max_len=args.seq_len + args.ttt_steps)
    d = target.dims
    vocab = draft_vocabulary(train_ids, d.vocab_size, args.draft_vocab)
    coverage = float(torch.isin(val_ids, vocab).float().mean())

    dims = ModelDims(**{**d.__dict__, "num_layers": 1, "num_mtp_layers": 0, "intermediate_size": args.intermediate})
    capture = default_capture(d.num_layers)
    head = Eagle3Head(dims, capture, d.hidden_size, args.draft_vocab)
    with torch.no_grad():
        head.fc.weight.zero_()
        head.fc.weight[:, -d.hidden_size :].copy_(torch.eye(d.hidden_size))  # the top captured layer
        head.block.o_proj.weight.zero_()
        head.block.down_proj.weight.zero_()
        head.lm_head.weight.copy_(target.lm_head.weight[vocab])
        head.d2t.copy_(vocab - torch.arange(args.draft_vocab))
    before = agreement(head, target, val_ids, args.seq_len, args.ttt_steps)

    def batch_losses(ids: torch.Tensor) -> list[torch.Tensor]:
        features, teacher_logits = teacher(target, ids, capture)
        return losses(unrolled(head, target, features, ids, args.ttt_steps), teacher_logits, vocab)

    history = train(list(head.parameters()), train_ids, args, batch_losses, "per_step")
    head.eval()
    after = agreement(head, target, val_ids, args.seq_len, args.ttt_steps)
    extra = {"base_model_name_or_path": "embedded:tiny-target", "trtspec_trained_by": SCRIPT}
    head.save(args.out, target_config, extra)
    record = {
        "script": SCRIPT,
        "target": "embedded:tiny-target",
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "captured_layers": list(capture),
        "loss": "cross-entropy against the target's renormalised probabilities on the draft vocabulary, "
        "summed over the unrolled steps",
        "held_out_draft_vocabulary_coverage": round(coverage, 4),
        "held_out_top1_agreement_with_target": {"before": before, "after": after},
        "parameters": sum(p.numel() for p in head.parameters()),
        "history": history,
        "wall_s": round(time.time() - started, 1),
        "torch": torch.__version__,
    }
    atomic_write_text(args.out / "training_log.json", json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}: held-out top-1 agreement per step {[round(a, 3) for a in after]}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
