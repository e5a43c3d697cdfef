"""Sizes and time budgets of a cluster deployment, derived from the model and the config (issue #21).

Fixed numbers do not survive contact with a cluster: a 16Gi /dev/shm in a 4Gi pod, 64Gi of host memory
for eight DeepSeek ranks, a 30-minute startup probe for a 700 GB download, an H200-sized config free to
land on 80 GB GPUs. Here every size and every time budget comes from the bytes involved: the checkpoints
as published (what a download fetches and a build reads), the weights each GPU serves (check's memory
model, trtspec/checkpoints/memory.py) and the topology. The rates behind the budgets are assumptions,
named and labelled below, in one place: `Budgets` is what says how long each phase may take.

Hub ids are not inspected offline: KNOWN_CHECKPOINTS carries the architecture numbers of the public
checkpoints the shipped configs use; any other hub id has no size unless `deploy.weights_gb` gives one.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from trtspec.checkpoints.inspect import CheckpointInfo, pre_quantized, read_hf_config
from trtspec.checkpoints.memory import (
    DTYPE_BYTES,
    QUANT_BYTES,
    RUNTIME_RESERVE_GB,
    missing_size_keys,
    model_memory,
    parameter_count,
)
from trtspec.config import DeploymentConfig, ModelSection
from trtspec.deploy.topology import topology
from trtspec.errors import ConfigError, shorten
from trtspec.modes import get_mode

GiB = 2**30
GB = 1e9

# --- GPUs -------------------------------------------------------------------------------------------------
# nvidia.com/gpu.product (GPU Feature Discovery) -> memory per GPU in GB, as NVIDIA's data sheets state it
# (the figure plan.GPUS and check use; NVML reports a little more). The label is the NVML device name with
# spaces replaced by '-' (k8s-device-plugin internal/lm/resource.go, productLabel:
# https://github.com/NVIDIA/k8s-device-plugin/blob/main/internal/lm/resource.go), e.g. "NVIDIA H100 80GB HBM3"
# -> NVIDIA-H100-80GB-HBM3. H200 SXM nodes report NVIDIA-H200 on most clusters and NVIDIA-H200-SXM5-141GB on
# some (both seen as GFD labels in public manifests), so both are listed.
GPU_PRODUCTS: dict[str, float] = {
    "NVIDIA-A100-SXM4-40GB": 40,
    "NVIDIA-A100-PCIE-40GB": 40,
    "NVIDIA-A100-SXM4-80GB": 80,
    "NVIDIA-A100-80GB-PCIe": 80,
    "NVIDIA-H100-80GB-HBM3": 80,  # H100 SXM5
    "NVIDIA-H100-PCIe": 80,
    "NVIDIA-H100-NVL": 94,
    "NVIDIA-H200": 141,  # H200 SXM
    "NVIDIA-H200-SXM5-141GB": 141,
    "NVIDIA-H200-NVL": 141,
    "NVIDIA-B200": 180,
}
# The architecture each product is (TensorRT engines do not load on another one: "engines are not
# portable across different GPU architectures", TensorRT's support matrix, without hardware compatibility)
GPU_ARCHITECTURES = {
    "NVIDIA-A100": "ampere",
    "NVIDIA-H100": "hopper",
    "NVIDIA-H200": "hopper",
    "NVIDIA-B200": "blackwell",
}


# Quantizations that need a given architecture (FP8 tensor cores from Ada/Hopper on; NVFP4 on Blackwell)
QUANT_ARCHITECTURES = {"fp8": {"hopper", "blackwell"}, "nvfp4": {"blackwell"}}


def architecture(product: str) -> str:
    return next((arch for prefix, arch in GPU_ARCHITECTURES.items() if product.startswith(prefix)), product)


# plan.GPUS (the roofline's GPUs) -> the product each entry describes; tests assert the memory agrees.
PLAN_GPU_PRODUCTS = {
    "a100": "NVIDIA-A100-SXM4-80GB",
    "h100": "NVIDIA-H100-80GB-HBM3",
    "h200": "NVIDIA-H200",
    "b200": "NVIDIA-B200",
}

# --- Public checkpoints (hub ids the configs/ use) ---------------------------------------------------------
# The numbers parameter_count reads, from each checkpoint's config.json on Hugging Face; `published` is
# what its safetensors hold per parameter (a key of DTYPE_BYTES or QUANT_BYTES). Files beside the
# safetensors (Llama's original/ consolidated weights) are not counted: a download should skip them.
_LLAMA3 = {"architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "torch_dtype": "bfloat16", "head_dim": 128}
KNOWN_CHECKPOINTS: dict[str, dict[str, Any]] = {
    # https://huggingface.co/meta-llama/Llama-3.3-70B-Instruct/blob/main/config.json
    "meta-llama/Llama-3.3-70B-Instruct": {
        **_LLAMA3,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
        "published": "bfloat16",
    },
    # https://huggingface.co/nvidia/Llama-3.3-70B-Instruct-FP8: the same architecture, ModelOpt FP8 weights (it
    # carries its quantization, hf_quant_config.json, which is what backend pytorch serves)
    "nvidia/Llama-3.3-70B-Instruct-FP8": {
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "FP8"},
        **_LLAMA3,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
        "published": "fp8",
    },
    # https://huggingface.co/yuhuili/EAGLE3-LLaMA3.3-Instruct-70B: one decoder layer of the target's width.
    # Counted as a one-layer Llama with the full vocabulary in and out (about 3B); the head holds about 1B
    # (no embedding of its own, a 32000-token draft vocabulary): an over-estimate, on the safe side.
    "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B": {
        **_LLAMA3,
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 1,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
        "published": "bfloat16",
    },
    # https://huggingface.co/lmsys/vicuna-7b-v1.3/blob/main/config.json: Llama 7B, no grouped KV heads, FP16
    "lmsys/vicuna-7b-v1.3": {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32000,
        "torch_dtype": "float16",
        "tie_word_embeddings": False,
        "published": "float16",
    },
    # https://huggingface.co/FasterDecoding/medusa-vicuna-7b-v1.3: five heads, each a 4096 x 4096 residual block
    # and a 4096 x 32000 head, about 0.74B in FP16. Counted as a three-layer Llama of that width (0.87B), the
    # nearest shape the parameter count knows that is not smaller: on the safe side.
    "FasterDecoding/medusa-vicuna-7b-v1.3": {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 3,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32000,
        "torch_dtype": "float16",
        "tie_word_embeddings": False,
        "medusa_num_heads": 5,
        "published": "float16",
    },
    # https://huggingface.co/meta-llama/Llama-3.1-405B-Instruct/blob/main/config.json
    "meta-llama/Llama-3.1-405B-Instruct": {
        **_LLAMA3,
        "hidden_size": 16384,
        "intermediate_size": 53248,
        "num_hidden_layers": 126,
        "num_attention_heads": 128,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
        "published": "bfloat16",
    },
    # https://huggingface.co/meta-llama/Llama-3.1-8B-Instruct/blob/main/config.json
    "meta-llama/Llama-3.1-8B-Instruct": {
        **_LLAMA3,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "tie_word_embeddings": False,
        "published": "bfloat16",
    },
    # https://huggingface.co/meta-llama/Llama-3.2-1B-Instruct/blob/main/config.json
    "meta-llama/Llama-3.2-1B-Instruct": {
        **_LLAMA3,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "tie_word_embeddings": True,
        "published": "bfloat16",
    },
    # https://huggingface.co/meta-llama/Llama-3.2-3B-Instruct/blob/main/config.json
    "meta-llama/Llama-3.2-3B-Instruct": {
        **_LLAMA3,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 28,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "tie_word_embeddings": True,
        "published": "bfloat16",
    },
    # https://huggingface.co/deepseek-ai/DeepSeek-R1/blob/main/config.json: MLA + MoE + one MTP layer,
    # published in FP8 (block-scaled e4m3, its quantization_config), about 688 GB with the MTP layer.
    "deepseek-ai/DeepSeek-R1": {
        "architectures": ["DeepseekV3ForCausalLM"],
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "n_routed_experts": 256,
        "n_shared_experts": 1,
        "first_k_dense_replace": 3,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "vocab_size": 129280,
        "num_nextn_predict_layers": 1,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]},
        "published": "fp8",
    },
}

# --- Rates and overheads: ASSUMPTIONS, chosen conservative (a budget too short kills a healthy pod; one too
# long only finds a wedged pod later) ------------------------------------------------------------------------
HUB_DOWNLOAD_MBPS = 100  # assumption: Hugging Face hub download, sustained, per pod
VOLUME_READ_MBPS = 250  # assumption: a shared (network) volume read; TensorRT-LLM #538 logs 160 GB of a 70B
# HF checkpoint loaded in 9 min 13 s, about 290 MB/s (https://github.com/NVIDIA/TensorRT-LLM/issues/538)
ENGINE_BUILD_S_PER_GB = 30  # assumption: ModelOpt quantization/conversion plus trtllm-build per GB of checkpoint;
# NVIDIA publishes no build timings (none found), so ~70 min for a 70B BF16 checkpoint, ~7 h for 405B
DOWNLOAD_FIXED_S = 300  # listing, connection set-up, retries of a hub download
GPU_START_S = 600  # container start, imports, MPI/NCCL set-up, CUDA graph capture, Triton's model load
CPU_START_S = 180  # the CPU variant: importing torch and starting pytriton on a small CPU
ENGINE_BUILD_FIXED_S = 600  # TensorRT-LLM start-up, calibration data, the builder's own fixed costs
PACKAGE_S = 120  # writing the model repository (every backend does it)
CPU_BUILD_S = 300  # the CPU variant's whole build of a small checkpoint, before reading its bytes
# No size known (an unknown hub id, no deploy.weights_gb): the fixed budgets trtspec had before (30-min
# startup probe, TRTSPEC_WAIT_S of an hour).
UNKNOWN_LOAD_S, UNKNOWN_BUILD_S, UNKNOWN_DOWNLOAD_S = 1800, 3600, 3600

# --- Host memory -------------------------------------------------------------------------------------------
CHART_GIB_PER_CPU = 8  # NVIDIA's chart: 8Gi per CPU, CPU = max(4, GPUs) (see k8s._resources)
HOST_HEADROOM_GIB = 16  # assumption: Python, Triton, tokenizers, MPI/NCCL buffers beside the weights
SHM_MAX_GIB = 16  # /dev/shm of a GPU pod at most: NCCL and the python backend's shm regions
CPU_MEMORY_GIB = 4  # the CPU variant's pod, unless its checkpoint needs more
CPU_HEADROOM_GIB = 2  # assumption: torch, pytriton and the runner beside the CPU variant's weights
CPU_SHM_GIB = 1  # /dev/shm of a CPU pod: pytriton's shm regions only


@dataclass(frozen=True)
class Budgets:
    """Seconds each phase may take: the one place that says so (probes, waits and deadlines derive from it)."""

    download_s: int  # fetching checkpoints from the hub into the volume (0 when nothing to download)
    build_s: int  # trtspec build: conversion/quantization/engine compile, or packaging only
    load_s: int  # server start to ready: reading weights from the volume onto the GPUs


_BYTES = {**DTYPE_BYTES, **QUANT_BYTES}  # bytes per parameter by dtype or quantization


@dataclass(frozen=True)
class _Checkpoint:
    section: ModelSection
    config: dict[str, Any]  # config.json, or KNOWN_CHECKPOINTS' numbers
    disk_bytes: int  # the checkpoint as published (on disk for a local one)
    hub: bool  # fetched from the hub at deploy time
    pre_quantized: bool  # carries its own quantization (what backend pytorch serves)


def _roles(cfg: DeploymentConfig) -> list[ModelSection]:
    """The checkpoints a deployment serves: check's roles (the draft only in draft-target mode)."""
    return [cfg.target] + ([cfg.draft] if get_mode(cfg.mode).needs_draft and cfg.draft is not None else [])


def weight_files_bytes(path: Path) -> int:
    return sum(f.stat().st_size for pattern in ("*.safetensors", "*.bin") for f in path.glob(pattern) if f.is_file())


def _checkpoint(cfg: DeploymentConfig, section: ModelSection) -> _Checkpoint | None:
    """A checkpoint's numbers from its config.json (local, embedded) or the known table (hub); None if unknown."""
    path = cfg.checkpoint_path(section)
    if path is None:
        known = KNOWN_CHECKPOINTS.get(section.checkpoint)
        if known is None:
            return None
        disk = parameter_count(known) * _BYTES[known["published"]]
        return _Checkpoint(section, known, int(disk), True, "quantization_config" in known)
    config = read_hf_config(path)
    if _is_heads(cfg, section):  # a head's config is not a model's: its files are its size
        return _Checkpoint(section, config, weight_files_bytes(path), False, False)
    disk = weight_files_bytes(path) or int(parameter_count(config) * _published_bytes(config))
    return _Checkpoint(section, config, disk, False, pre_quantized(CheckpointInfo(path, config, None)))


def _published_bytes(config: dict[str, Any]) -> float:
    """Bytes per parameter of a checkpoint whose weight files are absent: its quantization, else its dtype."""
    if (config.get("quantization_config") or {}).get("quant_method") == "fp8":
        return QUANT_BYTES["fp8"]
    return DTYPE_BYTES.get(str(config.get("torch_dtype") or config.get("dtype") or "bfloat16"), 2.0)


def _checkpoints(cfg: DeploymentConfig) -> list[_Checkpoint] | None:
    found = [_checkpoint(cfg, s) for s in _roles(cfg)]
    return None if any(c is None for c in found) else found  # type: ignore[return-value]


def _served_quantization(cfg: DeploymentConfig, ckpt: _Checkpoint) -> str:
    """As check: backend pytorch serves only the quantization a checkpoint carries itself."""
    if cfg.build.backend != "pytorch" or ckpt.pre_quantized:
        return ckpt.section.quantization
    return "none"


def _override_ratio(cfg: DeploymentConfig) -> float:
    """deploy.weights_gb is the checkpoints as published (taken as BF16): what the target's settings serve
    per published byte (backend pytorch serves what is published)."""
    if cfg.build.backend == "pytorch":
        return 1.0
    t = cfg.target
    served = QUANT_BYTES.get(t.quantization, DTYPE_BYTES.get(t.dtype, 2.0))
    return served / DTYPE_BYTES["bfloat16"]


def checkpoint_bytes(cfg: DeploymentConfig) -> int | None:
    """Bytes of the target (+ draft) checkpoints as published: what a download fetches and a build reads."""
    if cfg.deploy.weights_gb is not None:
        return int(cfg.deploy.weights_gb * GB)
    found = _checkpoints(cfg)
    return None if found is None else sum(c.disk_bytes for c in found)


def _download_bytes(cfg: DeploymentConfig) -> int | None:
    """Bytes fetched from the hub (embedded and local checkpoints are not downloaded)."""
    if all(cfg.checkpoint_path(s) is not None for s in _roles(cfg)):
        return 0
    if cfg.deploy.weights_gb is not None:
        return int(cfg.deploy.weights_gb * GB)
    found = _checkpoints(cfg)
    return None if found is None else sum(c.disk_bytes for c in found if c.hub)


def weights_gb_per_gpu(cfg: DeploymentConfig) -> float | None:
    """Weights each GPU serves (quantization, tp x pp), target + draft, as check's memory model computes."""
    b = cfg.build
    if cfg.deploy.weights_gb is not None:
        return cfg.deploy.weights_gb * _override_ratio(cfg) / (b.tp * b.pp)
    found = _checkpoints(cfg)
    if found is None:
        return None
    total = 0.0
    for c in found:
        # heads (EAGLE-3, Medusa), or what no decoder config describes (check says so), held whole by every GPU
        if _is_heads(cfg, c.section) or missing_size_keys(c.config):
            total += c.disk_bytes
            continue
        quantization = _served_quantization(cfg, c)
        total += model_memory(c.config, c.section.dtype, quantization, b.backend, b.tp, b.pp).weight_bytes_per_gpu
    return total / GB


def _is_heads(cfg: DeploymentConfig, section: ModelSection) -> bool:
    return section is cfg.draft and get_mode(cfg.mode).draft_head


def _cpu_only(cfg: DeploymentConfig) -> bool:
    return topology(cfg).cpu_only


def _required_gb(cfg: DeploymentConfig) -> float | None:
    """Memory a GPU needs: the weights per GPU plus the runtime reserve, and at least build.gpu_memory_gb,
    the memory the engines' KV caps and the shared-GPU plan were sized for."""
    weights = weights_gb_per_gpu(cfg)
    floor = cfg.build.gpu_memory_gb or 0.0
    if weights is None:
        return floor or None
    return max(weights + RUNTIME_RESERVE_GB, floor)


def gpu_products(cfg: DeploymentConfig) -> list[str]:
    """nvidia.com/gpu.product values the pods may land on (node affinity 'In'): the GPUs whose memory holds
    the weights per GPU plus the runtime reserve, and build.gpu_memory_gb when set; deploy.gpu_product when
    set; [] for the CPU variant or when nothing is known to choose by."""
    if _cpu_only(cfg):
        return []
    if cfg.deploy.gpu_product:
        return [cfg.deploy.gpu_product]
    need = _required_gb(cfg)
    if need is None:
        return []
    fitting = sorted((p for p, gb in GPU_PRODUCTS.items() if gb >= need), key=lambda p: (GPU_PRODUCTS[p], p))
    if cfg.build.backend == "tensorrt" and fitting:
        # engines built on one architecture load only there: the smallest that holds them and runs the
        # target's quantization
        allowed = QUANT_ARCHITECTURES.get(cfg.target.quantization)
        fitting = [p for p in fitting if allowed is None or architecture(p) in allowed]
        fitting = [p for p in fitting if architecture(p) == architecture(fitting[0])] if fitting else []
    return fitting


def fits(cfg: DeploymentConfig) -> str | None:
    """One line when the weights cannot fit the GPUs the config may land on; None when they fit (or no
    size is known to say otherwise)."""
    if _cpu_only(cfg):
        return None
    weights, gpu_gb, product = weights_gb_per_gpu(cfg), cfg.build.gpu_memory_gb, cfg.deploy.gpu_product
    need = None if weights is None else weights + RUNTIME_RESERVE_GB
    what = "" if weights is None else f"{weights:.1f} GB of weights per GPU + {RUNTIME_RESERVE_GB:g} GB runtime reserve"
    if product is not None and product in GPU_PRODUCTS:
        has = GPU_PRODUCTS[product]
        if need is not None and need > has:
            return f"deploy.gpu_product {product} has {has:g} GB per GPU: the deployment needs {what}"
        if gpu_gb is not None and gpu_gb > has:
            return (
                f"deploy.gpu_product {product} has {has:g} GB per GPU, less than build.gpu_memory_gb {gpu_gb:g}"
                " that the engines and KV caches are sized for"
            )
        return None
    if need is not None and gpu_gb is not None and need > gpu_gb:
        return f"build.gpu_memory_gb {gpu_gb:g} cannot hold {what}"
    if product is None and need is not None and not gpu_products(cfg):
        largest = max(GPU_PRODUCTS, key=GPU_PRODUCTS.__getitem__)
        return f"no known GPU holds {what}: the largest, {largest}, has {GPU_PRODUCTS[largest]:g} GB"
    return None


def _seconds(fixed: float, nbytes: float = 0.0, mbps: float = 1.0) -> int:
    """A fixed overhead plus bytes at a rate, rounded up to the minute."""
    return int(math.ceil((fixed + nbytes / (mbps * 1e6)) / 60) * 60)


def _load_bytes(cfg: DeploymentConfig) -> float | None:
    """What a replica reads from the volume to start: compiled engines (or trtspec's torch engine) hold the
    served weights; the LLM API reads the checkpoint itself."""
    if cfg.build.backend == "pytorch":
        return checkpoint_bytes(cfg)
    weights = weights_gb_per_gpu(cfg)
    return None if weights is None else weights * GB * cfg.build.tp * cfg.build.pp


def budgets(cfg: DeploymentConfig) -> Budgets:
    """Seconds for each phase from the bytes it moves at the assumed rates (constants above)."""
    download = _download_bytes(cfg)
    if download is None:
        download_s = UNKNOWN_DOWNLOAD_S
    else:
        download_s = _seconds(DOWNLOAD_FIXED_S, download, HUB_DOWNLOAD_MBPS) if download else 0
    ckpt, loaded = checkpoint_bytes(cfg), _load_bytes(cfg)
    if ckpt is None or loaded is None:
        return Budgets(download_s, UNKNOWN_BUILD_S, UNKNOWN_LOAD_S)
    cpu_only, backend = _cpu_only(cfg), cfg.build.backend
    load_s = _seconds(CPU_START_S if cpu_only else GPU_START_S, loaded, VOLUME_READ_MBPS)
    if cpu_only:
        build_s = _seconds(CPU_BUILD_S, ckpt, VOLUME_READ_MBPS)
    elif backend == "tensorrt":
        build_s = _seconds(ENGINE_BUILD_FIXED_S + ENGINE_BUILD_S_PER_GB * ckpt / GB)
    elif backend == "pytorch":  # packaging, plus the warm-up load where one pod can hold the model
        build_s = PACKAGE_S + (load_s if not topology(cfg).multi_node else 0)
    else:  # trtspec's torch engine on a GPU: read the checkpoint, write the engine
        build_s = _seconds(PACKAGE_S, 2 * ckpt, VOLUME_READ_MBPS)
    return Budgets(download_s, build_s, load_s)


# --- Kubernetes quantities ---------------------------------------------------------------------------------
_UNITS = {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_UNITS.update({f"{p}i": 2 ** (10 * (n + 1)) for n, p in enumerate("KMGTPE")})


def quantity_bytes(quantity: str) -> float:
    """A Kubernetes quantity (the config validated its form) in bytes."""
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([a-zA-Z]*)", quantity)
    if match is None or match.group(2) not in _UNITS:
        raise ValueError(f"not a Kubernetes quantity: {quantity!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _gib(nbytes: float) -> int:
    return math.ceil(nbytes / GiB)


def _format(nbytes: float) -> str:
    """Whole Gi where exact, else whole Mi rounded down (a size that must stay within a limit)."""
    if nbytes % GiB == 0:
        return f"{int(nbytes // GiB)}Gi"
    return f"{int(nbytes // 2**20)}Mi"


def _chart_gib(cfg: DeploymentConfig) -> int:
    return CHART_GIB_PER_CPU * max(4, topology(cfg).gpus_per_pod)


def memory_limit(cfg: DeploymentConfig, stage: Literal["serve", "build"]) -> str:
    """Memory of a serving pod or of the build, as a Kubernetes quantity; deploy.memory wins.

    Serving holds the node's share of the weights in host memory while they load; quantizing or converting
    holds the node's shard of the checkpoint; both beside a headroom and /dev/shm (a memory emptyDir counts
    against the limit). Never below NVIDIA's chart (8Gi per CPU); the CPU variant keeps 4Gi unless its
    checkpoint needs more.
    """
    if cfg.deploy.memory:
        return cfg.deploy.memory
    topo = topology(cfg)
    ckpt, weights = checkpoint_bytes(cfg), weights_gb_per_gpu(cfg)
    if topo.cpu_only:
        held = ckpt if stage == "build" else (None if weights is None else weights * GB)
        need = 0 if held is None else _gib(held) + CPU_HEADROOM_GIB + CPU_SHM_GIB
        return f"{max(CPU_MEMORY_GIB, need)}Gi"
    node_weights = None if weights is None else weights * GB * topo.gpus_per_pod
    if stage == "build" and cfg.build.backend != "pytorch":
        held = None if ckpt is None else ckpt * min(1.0, topo.gpus_per_pod / topo.world_size)
    elif stage == "build" and topo.multi_node:
        held = 0  # packaging only: one pod cannot load a model that spans nodes
    else:
        held = node_weights
    need = 0 if not held else _gib(held) + HOST_HEADROOM_GIB + SHM_MAX_GIB
    return f"{max(_chart_gib(cfg), need)}Gi"


def _smallest_limit(cfg: DeploymentConfig) -> float:
    """Every pod mounts the same /dev/shm: it must fit the smaller of the serving and build limits."""
    return min(quantity_bytes(memory_limit(cfg, "serve")), quantity_bytes(memory_limit(cfg, "build")))


def shm_problem(cfg: DeploymentConfig) -> str | None:
    """One line when an explicit deploy.shm_size exceeds the memory limit it counts against."""
    if cfg.deploy.shm_size is None:
        return None
    limit = _smallest_limit(cfg)
    if quantity_bytes(cfg.deploy.shm_size) <= limit:
        return None
    return (
        f"deploy.shm_size: {cfg.deploy.shm_size} exceeds the pod memory limit {_format(limit)} (/dev/shm is a memory"
        " emptyDir: it counts against the limit); lower it, or raise deploy.memory"
    )


def shm_size(cfg: DeploymentConfig) -> str:
    """/dev/shm within the memory limit: deploy.shm_size, else a quarter of the limit up to 16Gi on GPU pods
    (NCCL, the python backend's shm regions) and up to 1Gi on CPU pods. Raises ConfigError when an explicit
    size exceeds the limit."""
    if (problem := shm_problem(cfg)) is not None:
        where = shorten(cfg.source) if cfg.source else "<config>"
        raise ConfigError(f"{where}: {problem}")
    if cfg.deploy.shm_size is not None:
        return cfg.deploy.shm_size
    cap = (CPU_SHM_GIB if _cpu_only(cfg) else SHM_MAX_GIB) * GiB
    return _format(min(cap, _smallest_limit(cfg) // 4 // 2**20 * 2**20))


def read_write_many(cfg: DeploymentConfig) -> bool:
    """Pods of a group, or replicas the HPA adds, land on different nodes: the volume must be ReadWriteMany."""
    return topology(cfg).multi_node or cfg.deploy.replicas > 1 or cfg.deploy.autoscaling.enabled


def needs_storage_class(cfg: DeploymentConfig) -> bool:
    """ReadWriteMany without deploy.storage.storage_class: common default classes are ReadWriteOnce only,
    so the claim would stay Pending."""
    return read_write_many(cfg) and cfg.deploy.storage.storage_class is None
