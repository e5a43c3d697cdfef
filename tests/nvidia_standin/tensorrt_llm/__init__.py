"""Stand-in for TensorRT-LLM's LLM API (tests only; see tests/nvidia_standin/README.md)."""

from tensorrt_llm.llmapi import LLM, SamplingParams

__version__ = "0.0.0+trtspec.standin"
__all__ = ["LLM", "SamplingParams"]
