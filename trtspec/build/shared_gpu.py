"""Target and draft engines on the same GPUs: which devices, and how many KV tokens each may hold.

Both `tensorrt_llm` models take `kv_cache_free_gpu_mem_fraction` of the memory free *when each
loads*, so with fractions alone the first model loaded can take the second's share, and load order
decides whether both fit. TensorRT-LLM sizes a KV cache as the smaller of that fraction and
`max_tokens_in_paged_kv_cache`, so a cap on tokens makes the split independent of load order. Each
model holds the same sequences, so each gets the same token cap: every token of max_batch_size x
max_seq_len where the memory plan says both caches fit, else as many as the plan's budget holds for
both. Without a readable checkpoint config or a known GPU size the cap is the engines' own limit
(max_batch_size x max_seq_len), which stops either model taking KV memory it can never use. NVIDIA's
draft-target README puts the models on separate GPUs; trtspec places both on the target's GPUs, as
its configs ask for tp x pp GPUs per replica, and writes the devices explicitly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from trtspec.checkpoints.inspect import read_hf_config
from trtspec.checkpoints.memory import MemoryPlan, model_memory
from trtspec.config import DeploymentConfig
from trtspec.modes import get_mode


@dataclass(frozen=True)
class SharedGPUPlan:
    gpu_device_ids: str  # both models: "0" or "0,1,..."
    max_tokens_in_paged_kv_cache: int  # each model's KV cap
    tokens_needed: int  # max_batch_size x max_seq_len
    kv_cache_free_gpu_mem_fraction: float  # the config's own, unchanged
    basis: str  # how the cap was found
    checked: bool  # against a memory plan (checkpoint configs and GPU size known), not only the engine limit

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def memory_plan(cfg: DeploymentConfig) -> MemoryPlan | None:
    """The per-GPU memory plan, where both checkpoints' configs and the GPU's size are known here."""
    b = cfg.build
    paths = [cfg.checkpoint_path(cfg.target), cfg.checkpoint_path(cfg.draft) if cfg.draft else None]
    if b.gpu_memory_gb is None or any(p is None for p in paths):
        return None
    try:
        target_config, draft_config = (read_hf_config(p) for p in paths)
        tm = model_memory(target_config, cfg.target.dtype, cfg.target.quantization, b.backend, b.tp, b.pp)
        dm = model_memory(draft_config, cfg.draft.dtype, cfg.draft.quantization, b.backend, b.tp, b.pp)
    except (OSError, ValueError, KeyError):
        return None
    return MemoryPlan(b.gpu_memory_gb, tm, dm, b.max_batch_size * b.max_seq_len, b.kv_cache_free_gpu_mem_fraction)


def shared_gpu_plan(cfg: DeploymentConfig) -> SharedGPUPlan | None:
    """None unless two compiled engines share GPUs (backend tensorrt, mode draft-target)."""
    b = cfg.build
    if b.backend != "tensorrt" or not get_mode(cfg.mode).draft_engine or cfg.draft is None:
        return None
    devices = ",".join(str(i) for i in range(b.tp * b.pp))
    needed = b.max_batch_size * b.max_seq_len
    plan = memory_plan(cfg)
    if plan is None:
        basis = "engine limit max_batch_size x max_seq_len (checkpoint configs or GPU size not known here)"
        return SharedGPUPlan(devices, needed, needed, b.kv_cache_free_gpu_mem_fraction, basis, checked=False)
    per_token = plan.target.kv_bytes_per_token_per_gpu + plan.draft.kv_bytes_per_token_per_gpu
    affordable = int(plan.kv_budget_gb * 1e9 // per_token) if per_token else needed
    tokens = max(0, min(needed, affordable))
    basis = (
        f"memory plan: {plan.kv_budget_gb:.1f} GB KV budget per GPU of {plan.gpu_gb:g} GB, "
        f"{per_token / 1e3:.1f} KB per token for both caches"
    )
    return SharedGPUPlan(devices, tokens, needed, b.kv_cache_free_gpu_mem_fraction, basis, checked=True)
