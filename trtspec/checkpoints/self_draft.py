"""A self-draft made deployable: the target cut to the layers that draft, as a checkpoint of its own.

TensorRT-LLM has no self-speculation mode; the same draft is a draft-target pair whose draft is a plain
checkpoint of the target's family with fewer `num_hidden_layers`: the embedding, the chosen layers
(renumbered from 0), the final norm and the head. That checkpoint goes through every backend's
draft-target path (convert_checkpoint.py, the LLM API's DraftTarget, trtspec's torch engine) unchanged.
The quantized self-draft is the target (or that cut) built weight-only int8 as the draft: over every layer, no
new checkpoint at all.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from trtspec.build.torch_engine import copy_side_files
from trtspec.checkpoints.inspect import read_hf_config
from trtspec.config import load_config, validate_config
from trtspec.errors import UsageError, shorten
from trtspec.fsutil import atomic_write_text, refuse_overwrite, replace_dir, staging_for, writing
from trtspec.init_config import serve_defaults
from trtspec.modes import get_mode
from trtspec.speculative.model import read_weights, save_weights
from trtspec.speculative.self_draft import resolve_layers

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
INT8_QUANTIZATION = "int8_weight_only"  # TensorRT-LLM's --use_weight_only --weight_only_precision int8


PER_LAYER_KEYS = ("layer_types",)  # config.json lists with one entry per decoder layer (Qwen3, Gemma)
MARKER = "trtspec-self-draft.json"  # says a folder is a cut this command wrote, so --force may replace it


def cut_config(hf: dict[str, Any], layers: list[int]) -> dict[str, Any]:
    """The target's config.json for a model of `layers` only: per-layer lists keep those layers' entries, and no
    multi-token-prediction layers follow."""
    out = {k: [v[i] for i in layers] if k in PER_LAYER_KEYS and isinstance(v, list) else v for k, v in hf.items()}
    out["num_hidden_layers"] = len(layers)
    out.pop("num_nextn_predict_layers", None)
    return out


def cut_checkpoint(target: Path, layers: list[int], out: Path) -> None:
    """Write `target` cut to `layers` into `out`, whole or not at all (an older `out` stays until the new is done)."""
    hf = read_hf_config(target)
    keep = {old: new for new, old in enumerate(layers)}
    weights, found = {}, set()
    for name, tensor in read_weights(target).items():
        if (m := _LAYER.match(name)) is None:
            weights[name] = tensor  # embedding, final norm, head
        elif int(m.group(1)) in keep:  # MTP layers sit past num_hidden_layers: never kept
            found.add(int(m.group(1)))
            weights[f"model.layers.{keep[int(m.group(1))]}.{m.group(2)}"] = tensor
    if missing := [old for old in layers if old not in found]:
        raise UsageError(f"{target}: no weights under model.layers.N for layers {missing}")
    with staging_for(out) as staging:
        save_weights(weights, staging / "model.safetensors")
        copy_side_files(target, staging)
        (staging / "config.json").write_text(json.dumps(cut_config(hf, layers), indent=2), encoding="utf-8")
        (staging / MARKER).write_text(json.dumps({"target": str(target), "layers": layers}), encoding="utf-8")
        replace_dir(staging, out)


def draft_target_data(data: dict[str, Any], draft: dict[str, Any], backend: str | None) -> dict[str, Any]:
    """The self-draft config's YAML as a draft-target config whose draft section is `draft`, for `backend` (None:
    the config's) served as `trtspec init` would serve draft-target there."""
    out: dict[str, Any] = {}
    for key, value in data.items():  # the draft section right after the target's, as `trtspec init` writes it
        if key not in ("self_draft", "draft"):
            out[key] = value
        if key == "target":
            out["draft"] = draft
    out["speculation"] = {**(out.get("speculation") or {}), "mode": "draft-target"}
    if backend is not None:
        flavour, streaming = serve_defaults("draft-target", backend)
        out["build"] = {**(out.get("build") or {}), "backend": backend}
        out["serve"] = {**(out.get("serve") or {}), "flavour": flavour, "streaming": streaming}
    return out


def export_self_draft(
    config: Path, out: Path | None, force: bool, backend: str | None = None
) -> tuple[Path | None, Path]:
    """Write the cut checkpoint (none for weights int8) and a draft-target config for `backend` (None: the config's)
    beside `config`, where its relative paths still resolve; returns both."""
    cfg = load_config(config)
    if cfg.mode != "self-draft":
        raise UsageError(f"{shorten(config)}: speculation.mode is {cfg.mode}; export-self-draft takes mode self-draft")
    target = cfg.checkpoint_path(cfg.target)
    if target is None:
        raise UsageError(f"target.checkpoint {cfg.target.checkpoint} is a hub id: export needs a local checkpoint")
    settings = get_mode("self-draft").settings(cfg)
    weights = settings.weights
    config_out = config.with_name(f"{config.stem}-draft-target.yaml")
    refuse_overwrite(config_out, force)
    draft: dict[str, Any] = {"checkpoint": cfg.target.checkpoint, "dtype": cfg.target.dtype}
    if weights == "int8":
        if (backend or cfg.build.backend) != "tensorrt":
            raise UsageError(
                f"self_draft.weights int8 deploys as its layers built weight-only int8 (draft.quantization "
                f"{INT8_QUANTIZATION}), which only backend tensorrt builds: pass --backend tensorrt"
            )
        draft["quantization"] = INT8_QUANTIZATION
    num_layers = read_hf_config(target).get("num_hidden_layers")
    if not isinstance(num_layers, int):
        raise UsageError(f"{target}/config.json: no integer num_hidden_layers")
    layers = resolve_layers(settings.layers, weights, num_layers)
    checkpoint = None  # every layer (int8): the draft is the target itself, nothing to cut
    if len(layers) < num_layers:
        checkpoint = out or config.parent / "self-draft" / cfg.name
        refuse_replacing(checkpoint, force, [target, config])
        draft["checkpoint"] = _reference(checkpoint, cfg.base_dir)
    data = draft_target_data(yaml.safe_load(config.read_text(encoding="utf-8")), draft, backend)
    # refused here, before anything is written (the target stands in for the draft checkpoint not yet there)
    validate_config({**data, "draft": {**draft, "checkpoint": cfg.target.checkpoint}}, source=config_out)
    if checkpoint is not None:
        with writing(checkpoint):
            cut_checkpoint(target, layers, checkpoint)
    with writing(config_out):
        header = f"# written by trtspec export-self-draft from {config.name}: its self-draft as a draft-target pair\n"
        atomic_write_text(config_out, header + yaml.safe_dump(data, sort_keys=False))
    return checkpoint, config_out


def refuse_replacing(folder: Path, force: bool, keep: list[Path]) -> None:
    """The checkpoint folder may replace only a cut this command wrote (its marker file), and only with --force:
    never a file, another folder or checkpoint (`--out .`), the target or a folder holding it or the config."""
    resolved = folder.resolve()
    if any(resolved == p.resolve() or resolved in p.resolve().parents for p in keep):
        raise UsageError(f"{shorten(folder)}: holds the target or the config; name a folder of its own (--out)")
    if not folder.exists() and not folder.is_symlink():
        return
    if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
        return  # an empty folder: nothing to lose
    if not folder.is_dir() or not (folder / MARKER).is_file():
        raise UsageError(
            f"{shorten(folder)}: exists and is not a cut export-self-draft wrote; remove it or name another (--out)"
        )
    if not force:
        raise UsageError(f"{shorten(folder)}: already exists (use --force to replace it)")


def _reference(path: Path, base: Path) -> str:
    """How the new config names the checkpoint: relative to its own folder when inside it (the pair moves together)."""
    path = path.resolve()
    try:
        return "./" + path.relative_to(base.resolve()).as_posix()
    except ValueError:
        return str(path)
