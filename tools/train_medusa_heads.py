"""Train Medusa heads for the embedded target on CPU: the target frozen, each head distilled from it.

Head j reads the target's final hidden state at position i and learns the target's own distribution for
token i + 2 + j (the target's logits at position i + 1 + j): Medusa-2's self-distillation, so the heads
learn what the target would say rather than what the corpus says. Each head starts as the identity
residual (zero-initialised layer) followed by a copy of the target's output matrix, as Medusa initialises
them, so it begins as "the next token again" and only learns the shift.

By default the output matrices stay the target's (frozen, tied) and only the residual layers train, and
the folder stores no copies of them (trtspec.speculative.heads): that is what fits the assets' size
budget. `--untied` trains each head's own output matrix too and writes the full layout TensorRT-LLM's
examples/medusa/convert_checkpoint.py reads. `<out>/training_log.json` records the held-out top-1
agreement of each head with the target.

    python tools/train_medusa_heads.py --out trtspec/assets/tiny-medusa --heads 2   # the shipped heads

The corpus is `$TRTSPEC_DATA/tinyshakespeare.txt`, split where the pair's training split ended.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from head_training import common_arguments, corpus_split, train

from trtspec.errors import run_script
from trtspec.fsutil import atomic_write_text
from trtspec.speculative.heads import MedusaHeads
from trtspec.speculative.model import Transformer, load_transformer

SCRIPT = "tools/train_medusa_heads.py"


@torch.no_grad()
def target_outputs(target: Transformer, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    out = target(ids, positions, target.new_cache(ids.shape[0], ids.shape[1]))
    return out.hidden, out.logits


def head_losses(heads: MedusaHeads, hidden: torch.Tensor, teacher: torch.Tensor) -> list[torch.Tensor]:
    """KL(target || head j) for every head, over the positions where token i + 2 + j is in the window."""
    t = hidden.shape[1]
    losses = []
    for j, head in enumerate(heads.heads):
        span = t - 1 - j  # positions i with i + 1 + j inside the window
        student = head(hidden[:, :span]).float().log_softmax(-1)
        target = teacher[:, 1 + j :].log_softmax(-1)
        losses.append(F.kl_div(student, target, log_target=True, reduction="batchmean") / span)
    return losses


@torch.no_grad()
def agreement(heads: MedusaHeads, target: Transformer, ids: torch.Tensor, length: int) -> list[float]:
    """Held-out top-1 agreement of head j with the target's argmax for the same token."""
    hits = [0] * heads.num_heads
    total = [0] * heads.num_heads
    for start in range(0, len(ids) - length, length):
        window = ids[start : start + length][None]
        hidden, logits = target_outputs(target, window)
        for j, head in enumerate(heads.heads):
            guess = head(hidden[:, : length - 1 - j]).argmax(-1)
            hits[j] += int((guess == logits[:, 1 + j :].argmax(-1)).sum())
            total[j] += guess.numel()
    return [h / n for h, n in zip(hits, total, strict=True)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    common_arguments(ap)
    ap.add_argument("--heads", type=int, default=4)  # TensorRT-LLM's --num_medusa_heads default
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--untied", action="store_true", help="train and store each head's own output matrix")
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=2e-3)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    started = time.time()

    train_ids, val_ids = corpus_split(args.target, args.eval_tokens)
    target = load_transformer(args.target, max_len=args.seq_len)
    d, vocab = target.dims.hidden_size, target.dims.vocab_size

    heads = MedusaHeads(args.heads, args.layers, d, vocab)
    with torch.no_grad():
        for head in heads.heads:
            for block in head[:-1]:
                block.linear.weight.zero_()
                block.linear.bias.zero_()
            head[-1].weight.copy_(target.lm_head.weight)
    if not args.untied:
        heads.tie(target.lm_head.weight)
    before = agreement(heads, target, val_ids, args.seq_len)

    def batch_losses(ids: torch.Tensor) -> list[torch.Tensor]:
        return head_losses(heads, *target_outputs(target, ids))

    trained = [p for p in heads.parameters() if p.requires_grad]
    history = train(trained, train_ids, args, batch_losses, "per_head")
    after = agreement(heads, target, val_ids, args.seq_len)
    extra = {"base_model_name_or_path": "embedded:tiny-target", "trtspec_trained_by": SCRIPT}
    heads.save(args.out, extra, tied=not args.untied)
    record = {
        "script": SCRIPT,
        "target": "embedded:tiny-target",
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "loss": "KL(target's distribution for token i+2+j || head j at position i), summed over heads",
        "held_out_top1_agreement_with_target": {"before": before, "after": after},
        "history": history,
        "wall_s": round(time.time() - started, 1),
        "torch": torch.__version__,
    }
    atomic_write_text(args.out / "training_log.json", json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}: held-out top-1 agreement per head {[round(a, 3) for a in after]}")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
