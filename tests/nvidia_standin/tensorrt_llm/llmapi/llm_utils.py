"""update_llm_args_with_extra_dict: the YAML's keys become LLM() arguments; unknown keys fail as in pydantic."""

from __future__ import annotations

from typing import Any

# LLM() arguments trtspec's model.yaml may carry (a subset of TorchLlmArgs, enough to refuse a misspelt key).
KNOWN = {
    "model", "backend", "tokenizer", "tensor_parallel_size", "pipeline_parallel_size", "moe_expert_parallel_size",
    "max_batch_size", "max_input_len", "max_seq_len", "max_num_tokens", "kv_cache_config", "enable_iter_perf_stats",
    "disable_overlap_scheduler", "speculative_config", "cuda_graph_config", "stream_interval", "trust_remote_code",
    "pytorch_backend_config", "enable_attention_dp", "moe_config", "gpus_per_node", "_mpi_session",
}  # fmt: skip
# the decoding types TensorRT-LLM's LLM API accepts through 1.2 (llm_args.py DecodingBaseConfig.from_dict)
DECODING_TYPES = {"DraftTarget", "Draft_Target", "MTP", "NGram", "AUTO", "Eagle", "Eagle3", "Medusa", "Lookahead"}


def update_llm_args_with_extra_dict(llm_args: dict[str, Any], extra: dict[str, Any], *_: Any) -> dict[str, Any]:
    unknown = set(extra) - KNOWN
    if unknown:
        raise ValueError(f"unknown LLM arguments: {sorted(unknown)}")
    spec = extra.get("speculative_config")
    if spec is not None and spec.get("decoding_type") not in DECODING_TYPES:
        raise ValueError(f"Invalid decoding type: {spec.get('decoding_type')}")
    return {**llm_args, **extra}
