"""The embedded tiny pair: weights, tokenizer and model card shipped inside the package."""

from __future__ import annotations

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent

# Names usable in a config as `checkpoint: embedded:<name>`.
EMBEDDED_CHECKPOINTS = {
    "tiny-target": ASSETS_DIR / "tiny-target",
    "tiny-draft": ASSETS_DIR / "tiny-draft",
    "tiny-medusa": ASSETS_DIR / "tiny-medusa",  # Medusa heads for tiny-target (tools/train_medusa_heads.py)
    "tiny-eagle3": ASSETS_DIR / "tiny-eagle3",  # an EAGLE-3 head for tiny-target (tools/train_eagle3_head.py)
}

# Everything under assets/ ships in the package: the pair, its heads, the card and logs. 38 MB held the
# pair and the Medusa heads; the EAGLE-3 head (one layer over three captured layers, 4.2 MB in bf16) raised it.
ASSETS_BUDGET_BYTES = 43_000_000
