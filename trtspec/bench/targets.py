"""What `trtspec bench` is pointed at: a PROTOCOL://HOST:PORT/MODEL, or a deployment config, which
names its served endpoint, the model its flavour answers on, and the tokenizer to count with."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from trtspec.bench.protocols import Target
from trtspec.errors import UsageError
from trtspec.modes import get_mode


@dataclass
class ResolvedTarget:
    url: str
    tokenizer: str | None = None
    extra: dict = field(default_factory=dict)
    metrics_url: str | None = None  # Triton's /metrics, for the server-side acceptance
    plan: Path | None = None  # the config's plan.json (`trtspec plan`), whose crossover the bench checks


def served_model(cfg) -> tuple[str, dict]:
    """The model a client calls for this config's flavour and mode, and the inputs it needs."""
    if cfg.serve.flavour == "llmapi":
        return "tensorrt_llm", {}
    if get_mode(cfg.mode).draft_engine:  # the BLS runs the draft engine, then the target
        from trtspec.build.builder import engine_dir_for, resolve_num_draft_tokens

        return "tensorrt_llm_bls", {"num_draft_tokens": resolve_num_draft_tokens(cfg, engine_dir_for(cfg))}
    return "ensemble", {}


def resolve(text: str, protocol: str = "triton-grpc", host: str = "localhost") -> ResolvedTarget:
    if "://" in text:
        return ResolvedTarget(str(Target.parse(text)))
    path = Path(text)
    if path.suffix not in (".yaml", ".yml") or not path.exists():
        raise UsageError(f"{text}: not PROTOCOL://HOST:PORT/MODEL and not a config file")
    from trtspec.config import load_config

    cfg = load_config(path)
    model, extra = served_model(cfg)
    if protocol.startswith("openai"):
        raise UsageError(f"{text}: a config is served by tritonserver; give an openai target as a URL")
    port = cfg.serve.grpc_port if protocol == "triton-grpc" else cfg.serve.http_port
    tokenizer = cfg.checkpoint_path(cfg.target)
    metrics = f"http://{host}:{cfg.serve.metrics_port}/metrics"
    from trtspec.build.builder import engine_dir_for

    plan = engine_dir_for(cfg) / "plan.json"
    return ResolvedTarget(
        f"{protocol}://{host}:{port}/{model}",
        str(tokenizer) if tokenizer else None,
        extra,
        metrics,
        plan if plan.is_file() else None,
    )
