"""`trtspec init`: a commented deployment config for a pair or an MTP checkpoint.

Values come from the checkpoints' config.json where they are local (context length, MTP layers), so
the first config a user sees already fits their model. The text is produced from a plain dict and
validated by loading it back before it is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from trtspec.checkpoints.inspect import read_hf_config
from trtspec.config import Backend, DeploySection, Mode, resolve_checkpoint, validate_config
from trtspec.fsutil import atomic_write_text, refuse_overwrite, writing
from trtspec.modes import MODE_NAMES, SpecMode, get_mode, mode_for_draft

COMMENTS: dict[str, str] = {
    "name": "deployment name: Triton model names, engine and Kubernetes object names derive from it",
    "target": "the model whose outputs you serve; checkpoint: a local HF directory, embedded:<name>, or a hub id",
    "target.dtype": "auto | float32 | float16 | bfloat16",
    "target.quantization": "none | fp8 | int8_weight_only | int4_weight_only | int4_awq | nvfp4 (memory estimates)",
    "draft": "the drafter; must share the target's tokenizer (trtspec check verifies it)",
    "mtp": "MTP drafting uses the target's own multi-token-prediction layers (DeepSeek-V3 layout)",
    "mtp.num_nextn_predict_layers": "layers to use; the checkpoint's config.json says how many it has",
    "mtp.relaxed_acceptance": "TensorRT-LLM's relaxed acceptance for thinking phases: faster, NOT lossless",
    "speculation.mode": " | ".join(MODE_NAMES) + " (none: the baseline without speculation)",
    "speculation.num_draft_tokens": "tokens drafted per step, 1..16, or auto (trtspec plan measures and picks)",
    "speculation.use_draft_logits": "engine flavour: send draft logits to the target (needs gathered logits)",
    "speculation.policy": "auto | fixed | adaptive (torch: K per running batch, 0 where speculation stops paying)",
    "speculation.max_concurrency": "no speculation above this many running requests (pytorch 1.2+, torch)",
    "speculation.sampling": "defaults for requests that do not set them; temperature 0 is greedy",
    "build.backend": "tensorrt (compiled engines, TRT-LLM <= 1.2.x) | pytorch (LLM API) | torch (trtspec runner)",
    "build.tensorrt_llm_version": "the TensorRT-LLM in the serving container; engines only run on the same one",
    "build.tp": "tensor parallelism (GPUs per pipeline stage)",
    "build.pp": "pipeline parallelism",
    "build.max_seq_len": "prompt + output + draft tokens must fit",
    "build.kv_cache_free_gpu_mem_fraction": "share of free GPU memory for KV caches (split when two models share one)",
    "build.gpu_memory_gb": "memory per GPU; leave null to detect on the build host",
    "build.device": "torch backend only: auto | cpu | cuda",
    "serve.flavour": "llmapi (one tensorrt_llm model, streams) | engine (ensemble + BLS for draft-target)",
    "serve.streaming": "decoupled streaming; the engine flavour's BLS speculation does not stream",
    "deploy.image": "null: the Triton TRT-LLM container matching build.tensorrt_llm_version",
    "deploy.gpus_per_node": "a deployment larger than one node becomes a LeaderWorkerSet",
    "deploy.hf_token_secret": "name of a Kubernetes Secret holding HF_TOKEN; never the token itself",
    "deploy.autoscaling.enabled": "the HPA adds replicas on other nodes, so the volume must be ReadWriteMany",
    "deploy.storage.storage_class": (
        "a ReadWriteMany class (NFS, CephFS, EFS, Filestore), needed by several nodes (autoscaling, replicas > 1, "
        "a multi-node group); null: the cluster's default, one node only"
    ),
}


def _read_hf_config(ref: str, base_dir: Path) -> dict[str, Any]:
    path = resolve_checkpoint(ref, base_dir)
    if path is None:
        return {}
    return read_hf_config(path)


def draft_mode(draft: str, base_dir: Path) -> SpecMode | None:
    """The mode a draft checkpoint belongs to by its config.json (EAGLE-3 or Medusa heads), None for a model."""
    return mode_for_draft(_read_hf_config(draft, base_dir))


def build_config_dict(
    name: str,
    target: str,
    draft: str | None,
    mode: Mode,
    backend: Backend,
    base_dir: Path,
) -> dict[str, Any]:
    """The settings a sensible first deployment of this pair would use."""
    hf = _read_hf_config(target, base_dir)
    draft_hf = _read_hf_config(draft, base_dir) if draft is not None else {}
    context = int(hf.get("max_position_embeddings", 4096))
    max_seq_len = min(context, 8192)
    data: dict[str, Any] = {"name": name, "target": {"checkpoint": target, "dtype": "auto", "quantization": "none"}}
    spec = get_mode(mode)
    if spec.needs_draft:
        data["draft"] = {"checkpoint": draft, "dtype": "auto"}
    data.update(spec.init_sections(target, hf, draft_hf, backend))
    flavour, streaming = serve_defaults(mode, backend)
    data["speculation"] = {
        "mode": mode,
        **({"num_draft_tokens": spec.default_k} if spec.default_k is not None else {}),
        "policy": "auto",
        "max_concurrency": None,
        "sampling": {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "max_tokens": 128},
    }
    data["build"] = {
        "backend": backend,
        "tensorrt_llm_version": "1.2.1",
        "tp": 1,
        "pp": 1,
        "max_batch_size": 8 if backend != "torch" else 4,
        "max_input_len": max_seq_len // 2,
        "max_seq_len": max_seq_len,
        "max_num_tokens": 8192,
        "kv_cache_free_gpu_mem_fraction": 0.9,
        "gpu_memory_gb": None,
        "device": "auto",
    }
    data["serve"] = {
        "flavour": flavour,
        "instances": 1,
        "http_port": 8000,
        "grpc_port": 8001,
        "metrics_port": 8002,
        "streaming": streaming,
    }
    data["deploy"] = {
        "image": None,
        "gpus_per_node": 8,
        "replicas": 1,
        "hf_token_secret": None,
        # written out because they decide the volume's access mode: deploy refuses RWX without a class
        "autoscaling": {"enabled": DeploySection().autoscaling.enabled},
        "storage": DeploySection().storage.model_dump(),
    }
    return data


def serve_defaults(mode: str, backend: str) -> tuple[str, bool]:
    """The flavour and streaming a mode is served with by default on a backend: compiled engines through the
    ensemble/BLS, the LLM API's one model otherwise (on torch, the flavour TensorRT-LLM serves the mode by)."""
    spec = get_mode(mode)
    flavour = {"tensorrt": "engine", "torch": spec.torch_flavour}.get(backend, "llmapi")
    return flavour, flavour != "engine" or spec.engine_streams


def render_commented_yaml(data: dict[str, Any], prefix: str = "", indent: int = 0) -> str:
    """YAML with a comment above each key that has one; values are dumped by PyYAML."""
    lines: list[str] = []
    pad = "  " * indent
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if dotted in COMMENTS:
            lines.append(f"{pad}# {COMMENTS[dotted]}")
        if isinstance(value, dict):
            lines.append(f"{pad}{key}:")
            lines.append(render_commented_yaml(value, f"{dotted}.", indent + 1))
        else:
            scalar = yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
            lines.append(f"{pad}{key}: {scalar}")
    return "\n".join(lines)


def write_init_config(out: Path, data: dict[str, Any], force: bool) -> Path:
    refuse_overwrite(out, force)
    text = "# trtspec deployment config, written by `trtspec init`; every stage reads this file.\n"
    text += render_commented_yaml(data) + "\n"
    validate_config(yaml.safe_load(text), source=out)
    with writing(out):
        return atomic_write_text(out, text)
