"""What the scripts that train heads on the frozen embedded target share: the pair's corpus split and its
training windows (tools/train_medusa_heads.py, tools/train_eagle3_head.py)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoTokenizer

from trtspec.assets import ASSETS_DIR, EMBEDDED_CHECKPOINTS
from trtspec.data import data_file


def common_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--target", type=Path, default=EMBEDDED_CHECKPOINTS["tiny-target"])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--eval-tokens", type=int, default=20000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)


def corpus_split(target: Path, eval_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`$TRTSPEC_DATA/tinyshakespeare.txt` as token ids, split where the pair's training split ended (so a
    head is judged on text neither it nor the target saw), the held-out part cut to `eval_tokens`."""
    card = json.loads((ASSETS_DIR / "training_log.json").read_text())
    offset = int(card["corpus"]["val_offset"])
    text = data_file("tinyshakespeare.txt").read_text()
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    train_ids = torch.tensor(tokenizer(text[:offset]).input_ids)
    val_ids = torch.tensor(tokenizer(text[offset:]).input_ids)[:eval_tokens]
    return train_ids, val_ids


def windows(ids: torch.Tensor, batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(ids) - length, (batch,), generator=gen)
    return torch.stack([ids[s : s + length] for s in starts])


def train(
    params: list[torch.nn.Parameter],
    train_ids: torch.Tensor,
    args: argparse.Namespace,
    batch_losses: Callable[[torch.Tensor], list[torch.Tensor]],
    label: str,
) -> list[dict]:
    """AdamW on a cosine schedule over windows of the training split, the losses summed; every 100 steps a
    row of the history (`label`: what each loss is of) is kept and printed."""
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    history = []
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = args.lr * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        parts = batch_losses(windows(train_ids, args.batch, args.seq_len, gen))
        loss = sum(parts)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == args.steps - 1:
            row = {"step": step, "loss": float(loss.detach()), label: [round(float(x.detach()), 4) for x in parts]}
            history.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return history
