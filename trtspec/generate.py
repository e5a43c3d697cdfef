"""`trtspec generate`: in-process generation from a deployment config, for quick looks and stats."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trtspec.config import DeploymentConfig
from trtspec.errors import UsageError
from trtspec.speculative.factory import runner_for
from trtspec.speculative.requests import SamplingParams
from trtspec.speculative.runner import GenerationParams


@dataclass
class GenerateRequest:
    prompt: str
    mode: str | None = None  # default: the config's speculation.mode
    max_tokens: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    num_draft_tokens: int | None = None
    tree: str | None = None  # DEPTHxWIDTH: verify a token tree (default: the config's speculation.tree)
    ignore_eos: bool = False


def generate_text(
    cfg: DeploymentConfig, req: GenerateRequest, on_text: Callable[[str], None] | None = None
) -> dict[str, Any]:
    from trtspec.bench.datasets import load_tokenizer

    mode = req.mode or cfg.mode
    runner = runner_for(cfg, mode, req.num_draft_tokens, tree=req.tree)
    target_path = cfg.checkpoint_path(cfg.target)
    tokenizer = load_tokenizer(str(target_path))  # one line for a broken tokenizer.json
    s = cfg.speculation.sampling
    sampling = SamplingParams(
        temperature=s.temperature if req.temperature is None else req.temperature,
        top_k=s.top_k if req.top_k is None else req.top_k,
        top_p=s.top_p if req.top_p is None else req.top_p,
    )
    ids = tokenizer(req.prompt).input_ids
    if len(ids) > cfg.build.max_input_len:
        raise UsageError(f"prompt is {len(ids)} tokens; build.max_input_len is {cfg.build.max_input_len}")
    stops = frozenset() if req.ignore_eos or tokenizer.eos_token_id is None else frozenset({tokenizer.eos_token_id})
    params = GenerationParams(
        max_tokens=req.max_tokens or s.max_tokens,
        sampling=sampling,
        stop_token_ids=stops,
        seed=req.seed if req.seed is not None else s.seed,
    )
    emitted: list[int] = []
    shown = ""

    def stream(_row: int, tokens: list[int]) -> None:
        nonlocal shown
        emitted.extend(tokens)
        text = tokenizer.decode(emitted, skip_special_tokens=True)
        if on_text is not None and text.startswith(shown):
            on_text(text[len(shown) :])
            shown = text

    try:
        out = runner.generate([ids], params, on_tokens=stream)[0]
    except ValueError as exc:  # the runner's checks of a request: bad input, not a crash
        raise UsageError(str(exc)) from None
    text = tokenizer.decode(out.tokens, skip_special_tokens=True)
    if on_text is not None and text.startswith(shown) and len(text) > len(shown):
        on_text(text[len(shown) :])
    stats = out.stats.as_dict()
    total = stats["prefill_s"] + stats["draft_s"] + stats["verify_s"]
    stats["tokens_per_s"] = out.stats.output_tokens / total if total else 0.0
    return {
        "mode": mode,
        "num_draft_tokens": runner.num_draft_tokens,
        "tree": str(runner.tree) if runner.tree else None,
        "prompt": req.prompt,
        "text": text,
        "tokens": out.tokens,
        "finish_reason": out.finish_reason,
        "stats": stats,
    }
