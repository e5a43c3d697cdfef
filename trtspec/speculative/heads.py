"""Medusa heads: K small heads on the target's last hidden state, head j guessing the token j + 1 places
past the next one, with no model run per draft.

The checkpoint is the layout TensorRT-LLM's examples/medusa/convert_checkpoint.py reads (its
`load_medusa_hf`, after FasterDecoding/Medusa): a folder with `config.json` (`medusa_num_heads`,
`medusa_num_layers`, plus the target's `hidden_size` and `vocab_size`) and `medusa_lm_head.safetensors`
holding, per head h, residual layers `h.l.linear.weight` / `h.l.linear.bias` (x + SiLU(W x + b)) for
l < medusa_num_layers and the head's own output matrix `h.{medusa_num_layers}.weight`.

Heads whose output matrix is the target's own `lm_head` (Medusa's initialisation, kept frozen) may be stored
without those copies: `config.json` then says `"trtspec_output_is_target_lm_head": true`, and the torch
runner ties them to the target it runs with. That is how the embedded heads fit the assets' size budget;
`MedusaHeads.save(..., tied=False)` writes the copies back for the converter.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from trtspec.errors import UsageError
from trtspec.fsutil import atomic_write_text
from trtspec.modes.medusa import HEADS_KEY, counted_heads
from trtspec.speculative.model import Linear, save_weights

WEIGHTS = "medusa_lm_head.safetensors"
TIED = "trtspec_output_is_target_lm_head"


class ResBlock(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.silu(self.linear(x))


class MedusaHeads(nn.Module):
    def __init__(self, num_heads: int, num_layers: int, hidden: int, vocab: int) -> None:
        super().__init__()
        self.num_heads, self.num_layers = num_heads, num_layers
        # index h.l as in the checkpoint: residual layers, then the output matrix (no bias)
        self.heads = nn.ModuleList(
            nn.Sequential(*[ResBlock(hidden) for _ in range(num_layers)], Linear(hidden, vocab, bias=False))
            for _ in range(num_heads)
        )

    tied = False  # the output matrices are the target's lm_head (shared, so not stored)
    needs_target_head = False  # loaded from a tied folder: tie() before use, the output matrices are unset

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., d] -> logits [..., H, V] float32."""
        return torch.stack([head(hidden) for head in self.heads], -2).float()

    def tie(self, lm_head: torch.Tensor) -> None:
        """Every head's output matrix becomes (shares) the target's."""
        for head in self.heads:
            head[-1].weight = nn.Parameter(lm_head, requires_grad=False)
        self.tied, self.needs_target_head = True, False

    def config(self) -> dict:
        out = self.heads[0][-1]
        return {
            HEADS_KEY: self.num_heads,
            "medusa_num_layers": self.num_layers,
            "hidden_size": out.in_features,
            "vocab_size": out.out_features,
        }

    def save(self, folder: Path, extra_config: dict | None = None, tied: bool = False) -> None:
        """The converter's layout; `tied` leaves out the output matrices (they are the target's lm_head)."""
        if tied and not self.tied:
            raise ValueError("these heads have output matrices of their own: saving them tied would drop them")
        if self.needs_target_head:
            raise ValueError("these heads' output matrices are unset: tie() them to the target first")
        folder.mkdir(parents=True, exist_ok=True)
        last = f"{self.num_layers}.weight"
        state = {
            f"{h}.{k}": v.detach().to(torch.bfloat16).contiguous()
            for h, k, v in self._named()
            if not (tied and k == last)
        }
        extra_config = {**(extra_config or {}), **({TIED: True} if tied else {})}
        tmp = folder / (WEIGHTS + ".tmp")
        save_weights(state, tmp)
        tmp.replace(folder / WEIGHTS)
        atomic_write_text(folder / "config.json", json.dumps({**self.config(), **(extra_config or {})}, indent=2))

    def _named(self):
        for h, head in enumerate(self.heads):
            for k, v in head.state_dict().items():
                yield h, k, v


def load_heads(folder: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> MedusaHeads:
    """Medusa heads from a checkpoint folder, with one-line errors for what a user can get wrong."""
    folder = Path(folder)
    try:
        cfg = json.loads((folder / "config.json").read_text())
        heads = counted_heads(cfg) if isinstance(cfg, dict) else None
        if heads is None:  # check says the same: a model, or a count of 0, null or true
            raise UsageError(f"{folder}/config.json: counts no heads ({HEADS_KEY}): no Medusa heads folder")
        layers, hidden, vocab = int(cfg.get("medusa_num_layers", 1)), int(cfg["hidden_size"]), int(cfg["vocab_size"])
    except FileNotFoundError:
        raise UsageError(f"{folder}: no config.json (a Medusa heads folder has one with {HEADS_KEY})") from None
    except (KeyError, ValueError, TypeError) as exc:
        raise UsageError(f"{folder}/config.json: not a Medusa heads config ({exc})") from None
    if not (folder / WEIGHTS).exists():
        raise UsageError(f"{folder}: no {WEIGHTS}")
    try:
        weights = load_file(str(folder / WEIGHTS))
    except Exception as exc:  # safetensors raises its own error types for truncated files
        raise UsageError(f"{folder / WEIGHTS}: corrupt safetensors file: {exc}") from None
    model = MedusaHeads(heads, layers, hidden, vocab)
    tied = bool(cfg.get(TIED))
    expected = {f"{h}.{k}": v.shape for h, k, v in model._named() if not (tied and k == f"{layers}.weight")}
    missing = sorted(set(expected) - set(weights))
    if missing:
        raise UsageError(f"{folder / WEIGHTS}: missing {', '.join(missing[:3])} for {heads} heads of {layers} layers")
    for name, shape in expected.items():
        if weights[name].shape != shape:
            raise UsageError(
                f"{folder / WEIGHTS}: {name} has shape {list(weights[name].shape)}, config implies {list(shape)}"
            )
    state = {f"heads.{name}": weights[name] for name in expected}
    model.load_state_dict(state, strict=not tied)
    model = model.to(device=device, dtype=dtype).eval().requires_grad_(False)
    model.needs_target_head = tied
    return model
