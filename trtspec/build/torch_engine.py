"""The `torch` backend's engine: a checkpoint cast to the runtime dtype, with the limits it was built for.

The directory stays a Hugging Face checkpoint (config.json, safetensors, tokenizer), so trtspec's
runner and transformers both load it; `engine.json` beside it mirrors the keys of a compiled
engine's config.json (pretrained_config, build_config) so one check verifies either kind.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trtspec import __version__
from trtspec.checkpoints.inspect import read_hf_config
from trtspec.errors import UsageError
from trtspec.speculative.model import load_transformer, read_weights, save_weights

ENGINE_JSON = "engine.json"
COPIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
COPIED_GLOBS = ("tokenizer.model", "vocab.json", "merges.txt")


def write_torch_engine(
    checkpoint: Path,
    out: Path,
    dtype: torch.dtype,
    role: str,
    build: dict[str, Any],
    load_head: Callable[[Path], Any] | None = None,
) -> dict[str, Any]:
    """Cast `checkpoint` into `out`, write engine.json, then load it and run one token to prove it starts
    (a head, which runs only on its target's states, is loaded by `load_head` instead)."""
    hf = read_hf_config(checkpoint)
    out.mkdir(parents=True, exist_ok=True)
    source = read_weights(checkpoint)
    weights = {n: (t.to(dtype) if t.is_floating_point() else t).contiguous() for n, t in source.items()}
    # one file keeps its name: a head's loader reads its layout by name (Medusa's medusa_lm_head.safetensors)
    files = sorted(checkpoint.glob("*.safetensors"))
    save_weights(weights, out / (files[0].name if len(files) == 1 else "model.safetensors"))
    copy_side_files(checkpoint, out)
    engine = {
        "version": f"trtspec-{__version__}",
        "backend": "torch",
        "role": role,
        "pretrained_config": {
            "architecture": (hf.get("architectures") or ["?"])[0],
            "dtype": str(dtype).removeprefix("torch."),
            "vocab_size": hf.get("vocab_size"),
            "num_nextn_predict_layers": int(hf.get("num_nextn_predict_layers") or 0),
        },
        "build_config": build,
    }
    (out / ENGINE_JSON).write_text(json.dumps(engine, indent=2), encoding="utf-8")
    if load_head is not None:
        load_head(out)
    else:
        warm_up(out, dtype, build["max_seq_len"])
    return engine


def copy_side_files(checkpoint: Path, out: Path) -> None:
    """The checkpoint's config, generation settings and tokenizer files, beside weights written elsewhere
    (their contents: each takes the mode the umask gives, as every output, not the source's)."""
    for name in (*COPIED, *COPIED_GLOBS):
        if (checkpoint / name).is_file():
            shutil.copyfile(checkpoint / name, out / name)


def warm_up(engine_dir: Path, dtype: torch.dtype, max_seq_len: int) -> None:
    model = load_transformer(engine_dir, dtype=dtype, max_len=max_seq_len)
    cache = model.new_cache(1, 8)
    with torch.inference_mode():
        logits = model(torch.tensor([[0, 1]]), torch.arange(2)[None], cache).logits
    if not torch.isfinite(logits).all():
        raise UsageError(f"{engine_dir}: the built engine produces non-finite logits")


def read_engine_config(engine_dir: Path) -> dict[str, Any]:
    """A compiled engine's config.json, or a torch engine's engine.json."""
    path = engine_dir / ENGINE_JSON
    if not path.is_file():
        path = engine_dir / "config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: cannot read the engine's config: {exc}") from None
