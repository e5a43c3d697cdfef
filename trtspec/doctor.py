"""`trtspec doctor`: what this machine can build and serve, and why not.

Probes run in subprocesses where an import can hang or crash (tensorrt_llm needs libcuda.so.1 and
fails on machines without a driver), so doctor always answers.
"""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
import subprocess
import sys
from typing import Any

from trtspec.modes import REGISTRY
from trtspec.serve.locate import find_tritonserver

# the least compute capability any speculative mode needs on TensorRT-LLM (the support rows say which)
MIN_SM_SPECULATIVE = min(
    row.min_sm for mode in REGISTRY.values() if mode.speculates() for row in mode.support if row.min_sm is not None
)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _probe_tensorrt_llm() -> dict[str, Any]:
    code = "import tensorrt_llm, sys; sys.stdout.write(tensorrt_llm.__version__)"
    try:
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return {"imports": False, "version": None, "error": "import timed out after 120 s"}
    if run.returncode == 0:
        return {"imports": True, "version": run.stdout.strip(), "error": None}
    lines = [ln for ln in run.stderr.strip().splitlines() if ln.strip()]
    return {"imports": False, "version": None, "error": lines[-1] if lines else f"exit {run.returncode}"}


def _gpus() -> list[dict[str, Any]]:
    import torch

    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        out.append(
            {
                "index": i,
                "name": props.name,
                "memory_gib": round(props.total_memory / 2**30, 1),
                "compute_capability": f"{props.major}.{props.minor}",
            }
        )
    return out


def diagnose() -> dict[str, Any]:
    import torch

    trtllm = _probe_tensorrt_llm()
    gpus = _gpus()
    triton = find_tritonserver()
    best_sm = max((float(g["compute_capability"]) for g in gpus), default=0.0)
    report: dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": {
            "version": torch.__version__,
            "cuda_available": torch.cuda.is_available(),
            "cuda_version": torch.version.cuda,
        },
        "transformers": _version("transformers"),
        "tritonclient": _version("tritonclient"),
        "tensorrt_llm": trtllm,
        "trtllm_build": shutil.which("trtllm-build"),
        "gpus": gpus,
        "tritonserver": None,
        "docker": shutil.which("docker"),
        "kubectl": shutil.which("kubectl"),
    }
    if triton is not None:
        report["tritonserver"] = {
            "binary": str(triton.binary),
            "source": triton.source,
            "python_stub": str(triton.python_stub) if triton.python_stub else None,
        }
    report["capabilities"] = _capabilities(
        report, best_sm, triton is not None and (triton.source != "nvidia-pytriton" or triton.python_stub is not None)
    )
    return report


def _capabilities(r: dict[str, Any], best_sm: float, can_serve_python: bool) -> dict[str, dict[str, Any]]:
    """Per backend: can it build here, can it serve here, and the reason when not."""
    has_trtllm = r["tensorrt_llm"]["imports"]
    no_trtllm = "tensorrt_llm does not import here: " + (r["tensorrt_llm"]["error"] or "not installed")
    no_server = "no tritonserver found (install the server extra: pip install 'trtspec[server]')"
    caps: dict[str, dict[str, Any]] = {}

    def entry(build: bool, serve: bool, why: list[str]) -> dict[str, Any]:
        return {"build": build, "serve": serve, "flavours": ["llmapi", "engine"] if serve else [], "why_not": why}

    torch_why = [] if can_serve_python else [no_server]
    caps["torch"] = entry(True, can_serve_python, torch_why)
    gpu_why = (
        []
        if best_sm >= MIN_SM_SPECULATIVE
        else [f"no GPU with compute capability >= {MIN_SM_SPECULATIVE} (the least any mode needs; see modes)"]
    )
    trt_why = (
        ([] if has_trtllm else [no_trtllm])
        + ([] if r["trtllm_build"] else ["trtllm-build not on PATH (compiled engines need TensorRT-LLM <= 1.2.x)"])
        + gpu_why
    )
    caps["tensorrt"] = entry(not trt_why, not trt_why, trt_why)
    caps["tensorrt"]["flavours"] = ["engine"] if not trt_why else []
    py_why = ([] if has_trtllm else [no_trtllm]) + gpu_why
    caps["pytorch"] = entry(not py_why, not py_why, py_why)
    caps["pytorch"]["flavours"] = ["llmapi"] if not py_why else []
    for backend in ("tensorrt", "pytorch"):  # each mode's own minimum, from its support row
        rows = [m.row(backend) for m in REGISTRY.values()]
        caps[backend]["modes"] = sorted(
            r.mode for r in rows if r.exists and not caps[backend]["why_not"] and best_sm >= (r.min_sm or 0)
        )
    return caps
