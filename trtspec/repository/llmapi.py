"""The llmapi flavour: one model, `tensorrt_llm`, configured by 1/model.yaml (LLM API arguments).

The tensor names, types and dims are those of TensorRT-LLM's `triton_backend/all_models/llmapi`
model (shared reference, triton-model-repository-and-k8s.md §2), so a client cannot tell whether
TensorRT-LLM or trtspec's torch runner answers. model.yaml carries `speculative_config` and
`triton_config` (decoupled, max_batch_size) exactly as NVIDIA's model reads them.
"""

from __future__ import annotations

from typing import Any

from trtspec.repository.pbtxt import PERF_OUTPUTS, Tensor, model_config

MODEL = "tensorrt_llm"

INPUTS = [
    Tensor("text_input", "STRING", (-1,)),
    Tensor("image_url", "STRING", (-1,), optional=True),
    Tensor("streaming", "BOOL", (1,), optional=True),
    Tensor("sampling_param_best_of", "INT32", (1,), optional=True),
    Tensor("sampling_param_temperature", "FP32", (1,), optional=True),
    Tensor("sampling_param_top_k", "INT32", (1,), optional=True),
    Tensor("sampling_param_top_p", "FP32", (1,), optional=True),
    Tensor("sampling_param_frequency_penalty", "FP32", (1,), optional=True),
    Tensor("sampling_param_presence_penalty", "FP32", (1,), optional=True),
    Tensor("sampling_param_max_tokens", "INT32", (1,), optional=True),
    Tensor("sampling_param_stop", "STRING", (-1,), optional=True),
    Tensor("sampling_param_seed", "UINT64", (1,), optional=True),
    Tensor("sampling_param_exclude_input_from_output", "BOOL", (1,), optional=True),
    Tensor("sampling_param_return_perf_metrics", "BOOL", (1,), optional=True),
    Tensor("return_finish_reason", "BOOL", (1,), optional=True),
    Tensor("return_stop_reason", "BOOL", (1,), optional=True),
    Tensor("return_cumulative_logprob", "BOOL", (1,), optional=True),
    Tensor("stop", "BOOL", (1,), optional=True),
    Tensor("lora_id", "UINT64", (1,), optional=True),
    Tensor("lora_name", "STRING", (-1,), optional=True),
    Tensor("lora_path", "STRING", (-1,), optional=True),
    Tensor("lora_ckpt_source", "STRING", (-1,), optional=True),
]

OUTPUTS = [
    Tensor("text_output", "STRING", (-1,)),
    Tensor("finish_reason", "STRING", (-1,)),
    Tensor("stop_reason", "STRING", (-1,)),
    Tensor("cumulative_logprob", "FP32", (-1,)),
    Tensor("kv_cache_reused_block", "INT32", (1,)),
    Tensor("kv_cache_missed_block", "INT32", (1,)),
    Tensor("kv_cache_alloc_new_blocks", "INT32", (1,)),
    Tensor("kv_cache_alloc_total_blocks", "INT32", (1,)),
    Tensor("kv_cache_hit_rate", "FP32", (1,)),
    *PERF_OUTPUTS,
]


def llmapi_config(instances: int, parameters: dict[str, str] | None = None):
    """config.pbtxt: python backend; decoupled and max_batch_size come from model.yaml's triton_config,
    which the model applies in auto_complete_config (as NVIDIA's llmapi model does)."""
    return model_config(MODEL, INPUTS, OUTPUTS, backend="python", instances=instances, parameters=parameters)


def model_yaml(llm_args: dict[str, Any], decoupled: bool) -> dict[str, Any]:
    """LLM() arguments plus triton_config; NVIDIA's model passes every key but triton_config to LLM()."""
    return {**llm_args, "triton_config": {"max_batch_size": 0, "decoupled": decoupled}}
