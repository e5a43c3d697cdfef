"""The embedded tiny pair: weights, tokenizer and model card shipped inside the package."""

from __future__ import annotations

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent

# Names usable in a config as `checkpoint: embedded:<name>`.
EMBEDDED_CHECKPOINTS = {
    "tiny-target": ASSETS_DIR / "tiny-target",
    "tiny-draft": ASSETS_DIR / "tiny-draft",
    "tiny-medusa": ASSETS_DIR / "tiny-medusa",  # Medusa heads for tiny-target (tools/train_medusa_heads.py)
}
