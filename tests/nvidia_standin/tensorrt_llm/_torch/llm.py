"""Older NVIDIA models import the PyTorch-backend LLM from here."""

from tensorrt_llm.llmapi.llm import LLM

__all__ = ["LLM"]
