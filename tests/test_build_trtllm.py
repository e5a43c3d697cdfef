"""Real TensorRT-LLM builds of the embedded pair; they run wherever tensorrt_llm is installed.

Inside NVIDIA's container (nvcr.io/nvidia/tritonserver:<tag>-trtllm-python-py3, with a GPU and
TRTLLM_EXAMPLES pointing at the matching TensorRT-LLM checkout's examples/), these build compiled
engines and an LLM API warm-up and verify them; here they are skipped with the reason.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from conftest import CONFIGS

pytestmark = [
    pytest.mark.trtllm,
    pytest.mark.skipif(
        importlib.util.find_spec("tensorrt_llm") is None,
        reason="tensorrt_llm is not installed: TensorRT-LLM runs only in NVIDIA's container with a GPU",
    ),
]


def build(tmp_path, backend: str, flavour: str) -> dict:
    text = (CONFIGS / "tiny-draft-target.yaml").read_text()
    text = text.replace("backend: torch", f"backend: {backend}").replace("device: cpu", "device: auto")
    text = text.replace("flavour: llmapi", f"flavour: {flavour}").replace("streaming: true", "streaming: false")
    text = text.replace("dtype: float32", "dtype: float16")
    config = tmp_path / "pair.yaml"
    config.write_text(text.replace("embedded:", f"{os.path.dirname(__file__)}/../trtspec/assets/"))
    res = subprocess.run(
        [sys.executable, "-m", "trtspec", "build", str(config), "--json"], cwd=tmp_path, capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_compiled_draft_target_engines_build_and_verify(tmp_path):
    if not os.environ.get("TRTLLM_EXAMPLES"):
        pytest.skip("TRTLLM_EXAMPLES is not set (the examples/ folder of the matching TensorRT-LLM checkout)")
    out = build(tmp_path, "tensorrt", "engine")
    assert out["built"] == ["target", "draft"]
    engine = json.loads((tmp_path / "engines/tiny-draft-target/target/config.json").read_text())
    assert engine["build_config"]["max_draft_len"] == 2


def test_llm_api_options_load(tmp_path):
    out = build(tmp_path, "pytorch", "llmapi")
    assert out["built"] == ["llm-api"]
