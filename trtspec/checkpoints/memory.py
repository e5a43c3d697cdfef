"""GPU memory of a deployment from config.json alone: weights and both KV caches, per GPU.

Parameter counts follow the architectures' published layouts (Llama-family GQA; DeepSeek-V3 MLA
with MoE and MTP layers). Bytes per parameter follow the quantization; the KV cache is kept in the
model dtype, except FP8 for compiled engines quantized to FP8 (NVIDIA's recipe passes
`--kv_cache_dtype fp8`) and where the LLM API options ask for it (NVIDIA's DeepSeek recipe).
DeepSeek's MLA caches one compressed latent per layer
(kv_lora_rank + qk_rope_head_dim), which tensor parallelism replicates rather than splits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trtspec.errors import UsageError

DTYPE_BYTES = {"float32": 4.0, "float16": 2.0, "bfloat16": 2.0}
QUANT_BYTES = {"fp8": 1.0, "int8_weight_only": 1.0, "int4_weight_only": 0.5, "int4_awq": 0.5, "nvfp4": 0.5625}
RUNTIME_RESERVE_GB = 3.0  # CUDA context, activations and workspaces outside the KV pool (an estimate)


def _dtype_bytes(dtype: str, hf_config: dict[str, Any]) -> float:
    if dtype == "auto":
        dtype = str(hf_config.get("torch_dtype") or hf_config.get("dtype") or "bfloat16")
    return DTYPE_BYTES.get(dtype, 2.0)


def is_mla(cfg: dict[str, Any]) -> bool:
    return "kv_lora_rank" in cfg and cfg.get("kv_lora_rank") is not None


def _attention_params(cfg: dict[str, Any]) -> int:
    d, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    if is_mla(cfg):
        qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
        q = d * heads * qk if not cfg.get("q_lora_rank") else d * cfg["q_lora_rank"] + cfg["q_lora_rank"] * heads * qk
        kv_a = d * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"])
        kv_b = cfg["kv_lora_rank"] * heads * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"])
        return q + kv_a + kv_b + heads * cfg["v_head_dim"] * d
    head_dim = cfg.get("head_dim") or d // heads
    kv = cfg.get("num_key_value_heads") or heads
    return 2 * d * heads * head_dim + 2 * d * kv * head_dim


def _mlp_params(cfg: dict[str, Any], layer: int) -> int:
    d = cfg["hidden_size"]
    experts = cfg.get("n_routed_experts") or cfg.get("num_local_experts")
    dense_layers = cfg.get("first_k_dense_replace", 0)
    if experts and layer >= dense_layers:
        inter = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
        shared = cfg.get("n_shared_experts") or 0
        return (experts + shared) * 3 * d * inter + experts * d
    return 3 * d * cfg["intermediate_size"]


SIZE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")  # what sizing reads


def missing_size_keys(cfg: dict[str, Any]) -> list[str]:
    """The keys of a decoder's config.json that sizing needs and this one lacks (a GPT-2-style config, a head)."""
    return [key for key in SIZE_KEYS if not cfg.get(key)]


def parameter_count(cfg: dict[str, Any], include_mtp: bool = True) -> int:
    """Parameters of the model (and of its MTP layers, which share embedding and head)."""
    if missing := missing_size_keys(cfg):
        raise UsageError(f"config.json has no {', '.join(missing)}: trtspec sizes decoders described as Llama's are")
    d, vocab, layers = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    total = vocab * d * (1 if cfg.get("tie_word_embeddings") else 2)
    for layer in range(layers):
        total += _attention_params(cfg) + _mlp_params(cfg, layer)
    if include_mtp:
        for k in range(int(cfg.get("num_nextn_predict_layers") or 0)):
            total += _attention_params(cfg) + _mlp_params(cfg, layers + k) + 2 * d * d
    return total


def kv_bytes_per_token(cfg: dict[str, Any], kv_dtype_bytes: float, tp: int = 1, pp: int = 1) -> float:
    """KV cache bytes one token occupies on one GPU."""
    layers = cfg["num_hidden_layers"] + int(cfg.get("num_nextn_predict_layers") or 0)
    layers_per_gpu = layers / pp
    if is_mla(cfg):
        return layers_per_gpu * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * kv_dtype_bytes
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    kv_heads = cfg.get("num_key_value_heads") or heads
    return 2 * layers_per_gpu * max(1.0, kv_heads / tp) * head_dim * kv_dtype_bytes


@dataclass
class ModelMemory:
    params: int
    weight_bytes_per_gpu: float
    kv_bytes_per_token_per_gpu: float


def model_memory(
    cfg: dict[str, Any], dtype: str, quantization: str, backend: str, tp: int, pp: int, fp8_kv: bool = False
) -> ModelMemory:
    params = parameter_count(cfg)
    dtype_bytes = _dtype_bytes(dtype, cfg)
    weight = params * QUANT_BYTES.get(quantization, dtype_bytes)
    kv_dtype = 1.0 if fp8_kv or (quantization == "fp8" and backend == "tensorrt") else dtype_bytes
    return ModelMemory(params, weight / (tp * pp), kv_bytes_per_token(cfg, kv_dtype, tp, pp))


@dataclass
class MemoryPlan:
    gpu_gb: float
    target: ModelMemory
    draft: ModelMemory | None
    kv_tokens_needed: int  # max_batch_size x max_seq_len
    kv_fraction: float

    @property
    def weights_gb(self) -> float:
        return (self.target.weight_bytes_per_gpu + (self.draft.weight_bytes_per_gpu if self.draft else 0)) / 1e9

    @property
    def kv_needed_gb(self) -> float:
        per_token = self.target.kv_bytes_per_token_per_gpu + (
            self.draft.kv_bytes_per_token_per_gpu if self.draft else 0
        )
        return per_token * self.kv_tokens_needed / 1e9

    @property
    def kv_budget_gb(self) -> float:
        return max(0.0, self.gpu_gb - self.weights_gb - RUNTIME_RESERVE_GB) * self.kv_fraction

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpu_memory_gb": self.gpu_gb,
            "target_params": self.target.params,
            "draft_params": self.draft.params if self.draft else None,
            "weights_gb_per_gpu": round(self.weights_gb, 2),
            "target_weights_gb_per_gpu": round(self.target.weight_bytes_per_gpu / 1e9, 2),
            "draft_weights_gb_per_gpu": round(self.draft.weight_bytes_per_gpu / 1e9, 2) if self.draft else None,
            "kv_bytes_per_token_per_gpu": {
                "target": self.target.kv_bytes_per_token_per_gpu,
                "draft": self.draft.kv_bytes_per_token_per_gpu if self.draft else None,
            },
            "kv_needed_gb_per_gpu": round(self.kv_needed_gb, 2),
            "kv_budget_gb_per_gpu": round(self.kv_budget_gb, 2),
            "runtime_reserve_gb": RUNTIME_RESERVE_GB,
        }
