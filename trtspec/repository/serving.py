"""From a repository's model.yaml or config.pbtxt parameters to a runner: what trtspec's python models load
inside Triton."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trtspec.errors import UsageError
from trtspec.modes import get_mode, mode_for_decoding_type
from trtspec.speculative.batch import BatchEngine
from trtspec.speculative.factory import load_runner, resolve_device, resolve_dtype
from trtspec.speculative.runner import SpeculativeRunner
from trtspec.speculative.tree import TreeShape


def decoding_mode(options: dict[str, Any]) -> str:
    """trtspec's name for the LLM API options' speculative mode (the registry's, or none)."""
    spec = options.get("speculative_config") or {}
    if not spec:
        return "none"
    mode = mode_for_decoding_type(str(spec.get("decoding_type", "")))
    if mode is None:
        raise UsageError(f"speculative_config.decoding_type {spec.get('decoding_type')!r} is not one trtspec runs")
    return mode.name


def runner_from_model_yaml(options: dict[str, Any]) -> tuple[SpeculativeRunner, dict[str, Any]]:
    """The runner the LLM API options describe, and the sampling defaults for requests that say nothing."""
    spec = options.get("speculative_config") or {}
    mode = decoding_mode(options)
    k = get_mode(mode).served_draft_len(spec)
    draft = spec.get("speculative_model") or spec.get("speculative_model_dir")
    local = options.get("trtspec", {})
    # the section's fields TensorRT-LLM has no key for (draft-target's cascade), from trtspec's own section
    own = {k: v for k, v in (local.get("settings") or {}).items() if k in get_mode(mode).runner_only_settings}
    device = resolve_device(local.get("device", "auto"))
    runner = load_runner(
        Path(options["model"]),
        mode,
        Path(draft) if draft else None,
        num_draft_tokens=max(k, 1),
        device=device,
        dtype=resolve_dtype(local.get("dtype", "auto"), device),
        max_len=int(options.get("max_seq_len", 2048)),
        settings={**get_mode(mode).runner_settings(spec), **own},
        tree=TreeShape.parse(local["tree"]) if local.get("tree") else None,
    )
    defaults = {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "max_tokens": 64, "seed": None}
    defaults.update(local.get("sampling", {}))
    return runner, defaults


def engine_from_model_yaml(
    options: dict[str, Any], engines_dir: Path | None = None
) -> tuple[BatchEngine, dict[str, Any]]:
    """The in-flight batching engine the LLM API options describe: max_batch_size slots of max_seq_len
    positions, max_num_tokens per step, and the K policy (trtspec.policy, speculative_config.max_concurrency)."""
    from trtspec.speculative.policy import policy_for

    runner, defaults = runner_from_model_yaml(options)
    spec = options.get("speculative_config") or {}
    policy = get_mode(decoding_mode(options)).k_policy() or policy_for(
        options.get("trtspec", {}).get("policy", "fixed"),
        runner.num_draft_tokens,
        spec.get("max_concurrency"),
        plan=Path(options["model"]).parent / "plan.json",
    )
    engine = runner.engine(
        slots=int(options.get("max_batch_size") or 8),
        capacity=int(options.get("max_seq_len") or runner.max_len),
        max_num_tokens=options.get("max_num_tokens"),
        policy=policy,
    )
    policy.prepare(engine)
    return engine, defaults


def engine_from_parameters(p: dict[str, str], slots: int) -> BatchEngine:
    """The engine trtspec's tensorrt_llm stand-in runs from its config.pbtxt parameters: the torch engine at
    gpt_model_path, a mode that drafts inside the target (trtspec_mode) with its settings under NVIDIA's
    parameter names (lookahead_*, medusa_choices) and its heads (trtspec_draft_dir, which a compiled engine
    holds inside), max_batch_size slots, and enable_kv_cache_reuse."""
    from trtspec.build.torch_engine import read_engine_config
    from trtspec.speculative.model import load_transformer
    from trtspec.speculative.policy import policy_for

    engine_dir = Path(p["gpt_model_path"])
    device = resolve_device(p.get("trtspec_device", "auto"))
    max_len = int(p.get("trtspec_max_seq_len", "2048"))
    spec = get_mode(p.get("trtspec_mode", "none"))
    k = int(p.get("trtspec_num_draft_tokens", "1")) if spec.speculates() else 0
    dtype = resolve_dtype(p.get("trtspec_dtype", "auto"), device)
    settings = spec.triton_settings(p)
    if why := spec.engine_room_problem(settings, read_engine_config(engine_dir)):
        raise UsageError(
            f"{engine_dir}: {why} (this model's parameters): rebuild it (trtspec build) or serve settings that fit"
        )
    heads = p.get("trtspec_draft_dir")
    runner = load_runner(
        engine_dir, spec.name, Path(heads) if heads else None, num_draft_tokens=max(k, 1), device=device,
        dtype=dtype, max_len=max_len, target=load_transformer(engine_dir, dtype, device, max_len),
        settings=settings,
    )  # fmt: skip
    concurrency = p.get("trtspec_max_concurrency")
    policy = spec.k_policy() or policy_for(
        p.get("trtspec_policy", "fixed"), runner.num_draft_tokens, int(concurrency) if concurrency else None
    )
    engine = runner.engine(slots=slots, capacity=max_len, policy=policy)
    engine.reuse = p.get("enable_kv_cache_reuse", "False").lower() == "true"
    policy.prepare(engine)
    return engine
