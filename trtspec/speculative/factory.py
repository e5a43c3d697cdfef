"""Assemble a runner from checkpoint paths: the one place that knows which drafter each mode uses."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trtspec.errors import UsageError
from trtspec.modes import REGISTRY, RUNNER_MODES, SpecMode
from trtspec.speculative.model import Transformer, load_transformer
from trtspec.speculative.planted import planted_from_env, planted_verify
from trtspec.speculative.runner import SpeculativeRunner
from trtspec.speculative.tree import TreeShape

if TYPE_CHECKING:
    from trtspec.config import DeploymentConfig


def mode_settings(cfg: DeploymentConfig, mode: str | None = None) -> dict[str, Any] | None:
    """The config's section for the mode the runner runs (None: it has none, or the config does not set it)."""
    spec = REGISTRY[mode or cfg.mode]
    value = getattr(cfg, spec.section, None) if spec.section else None
    return value.model_dump() if value is not None else None


def runner_mode(mode: str) -> SpecMode:
    if mode in REGISTRY and mode not in RUNNER_MODES:
        where = REGISTRY[mode].where()
        raise UsageError(f"the torch runner has no {mode} drafter yet; {mode} runs on {where}")
    if mode not in RUNNER_MODES:
        raise UsageError(f"mode must be one of {', '.join(RUNNER_MODES)}, got {mode!r}")
    return REGISTRY[mode]


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("build.device is cuda but torch sees no CUDA device (set device: cpu or auto)")
    return device


def resolve_dtype(dtype: str, device: str) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device == "cuda" else torch.float32
    return getattr(torch, dtype)


def load_runner(
    target_path: Path,
    mode: str,
    draft_path: Path | None = None,
    num_draft_tokens: int = 4,
    mtp_layers: int | None = None,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    max_len: int = 2048,
    target: Transformer | None = None,
    planted: str | None = None,
    settings: dict[str, Any] | None = None,
    tree: TreeShape | None = None,
) -> SpeculativeRunner:
    """A runner for `mode`; pass `target` to share one loaded target between several runners, and
    `settings` for the mode's own (its config section's fields), `tree` for token trees.

    `planted` names a wrong verification rule (trtspec.speculative.planted) for checking the
    lossless check; without it the environment's TRTSPEC_PLANTED_BUG decides, normally unset."""
    spec = runner_mode(mode)
    target = target or load_transformer(target_path, dtype=dtype, device=device, max_len=max_len, mtp_layers=mtp_layers)
    draft = None
    if spec.needs_draft:
        if draft_path is None:
            raise UsageError(f"mode {mode} needs a draft checkpoint")
        draft = spec.load_draft(draft_path, dtype, device, max_len)
    try:
        drafter = spec.drafter(target, draft, {"num_nextn_predict_layers": mtp_layers, **(settings or {})})
    except UsageError as exc:
        raise UsageError(f"{target_path}: {exc}") from None
    if tree is not None and drafter is not None and drafter.fixed_tree is not None:
        raise UsageError(f"mode {mode} drafts the tree its own settings give ({drafter.fixed_tree}): no tree option")
    if tree is not None and not spec.runner_trees:
        raise UsageError(f"mode {mode} drafts chains only in the torch runner: no speculation.tree")
    verify_fn = planted_verify(planted) if planted else planted_from_env()
    return SpeculativeRunner(
        target, drafter, num_draft_tokens=num_draft_tokens, max_len=max_len, verify_fn=verify_fn, tree=tree
    )


def _tree(given: str | None, cfg: DeploymentConfig, spec: SpecMode, planted: str | None) -> TreeShape | None:
    """The tree asked for, else the config's where the mode makes trees; none for a planted bug, which
    is a rule for chains (the lossless check shows its power on chains)."""
    if given:
        try:
            return TreeShape.parse(given)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if planted or not cfg.speculation.tree or not spec.runner_trees:
        return None
    return TreeShape.parse(cfg.speculation.tree)


def runner_for(
    cfg: DeploymentConfig,
    mode: str | None = None,
    num_draft_tokens: int | None = None,
    target: Transformer | None = None,
    planted: str | None = None,
    tree: str | None = None,
) -> SpeculativeRunner:
    """The runner a deployment config describes, as `generate` and the served torch models run it;
    `tree` (DEPTHxWIDTH) overrides speculation.tree."""
    mode = mode or cfg.mode
    spec = runner_mode(mode)
    k = num_draft_tokens or cfg.speculation.num_draft_tokens
    if k == "auto":
        raise UsageError("speculation.num_draft_tokens is auto: pass --num-draft-tokens (or run trtspec plan)")
    target_path = cfg.checkpoint_path(cfg.target)
    if target_path is None:
        raise UsageError(
            f"target.checkpoint {cfg.target.checkpoint} is a hub id; the torch runner needs a local "
            "directory (download it first)"
        )
    draft_path = cfg.checkpoint_path(cfg.draft) if cfg.draft else None
    if spec.needs_draft and cfg.draft is not None and draft_path is None:
        raise UsageError(f"draft.checkpoint {cfg.draft.checkpoint} is a hub id; download it first")
    device = resolve_device(cfg.build.device)
    return load_runner(
        target_path,
        mode,
        draft_path,
        num_draft_tokens=int(k),
        mtp_layers=cfg.mtp.num_nextn_predict_layers if cfg.mtp else None,
        device=device,
        dtype=resolve_dtype(cfg.target.dtype, device),
        max_len=cfg.build.max_seq_len,
        target=target,
        planted=planted,
        settings=mode_settings(cfg, mode),
        tree=_tree(tree, cfg, spec, planted),
    )
