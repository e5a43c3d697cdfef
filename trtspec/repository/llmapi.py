"""The llmapi flavour: one model, `tensorrt_llm`, configured by 1/model.yaml (LLM API arguments).

The tensor names, types and dims are those of TensorRT-LLM's `triton_backend/all_models/llmapi`
model as `contract` records them, so a client cannot tell whether
TensorRT-LLM or trtspec's torch runner answers. model.yaml carries `speculative_config` and
`triton_config` (decoupled, max_batch_size) exactly as NVIDIA's model reads them.
"""

from __future__ import annotations

from typing import Any

from trtspec.repository import contract
from trtspec.repository.pbtxt import model_config

MODEL = "tensorrt_llm"

# NVIDIA's llmapi/tensorrt_llm template, over every tree in the contract.
INPUTS = list(contract.model("llmapi").inputs)
OUTPUTS = list(contract.model("llmapi").outputs)


def llmapi_config(instances: int, parameters: dict[str, str] | None = None):
    """config.pbtxt: python backend; decoupled and max_batch_size come from model.yaml's triton_config,
    which the model applies in auto_complete_config (as NVIDIA's llmapi model does)."""
    return model_config(MODEL, INPUTS, OUTPUTS, backend="python", instances=instances, parameters=parameters)


def model_yaml(llm_args: dict[str, Any], decoupled: bool) -> dict[str, Any]:
    """LLM() arguments plus triton_config; NVIDIA's model passes every key but triton_config to LLM()."""
    return {**llm_args, "triton_config": {"max_batch_size": 0, "decoupled": decoupled}}
