"""Tiny Llama checkpoints made in the test: random weights, real HF layout, optional MTP layers."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def make_checkpoint(
    path: Path,
    vocab: int = 8,
    hidden: int = 16,
    layers: int = 1,
    heads: int = 2,
    kv_heads: int = 1,
    mtp_layers: int = 0,
    seed: int = 0,
    scale: float = 1.0,
    max_positions: int = 256,
) -> Path:
    """A LlamaForCausalLM directory (config.json + model.safetensors) with DeepSeek-V3 MTP keys."""
    g = torch.Generator().manual_seed(seed)
    head_dim = hidden // heads
    inter = hidden * 2

    def w(*shape: int, std: float = 0.3) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std * scale

    def block(prefix: str) -> dict[str, torch.Tensor]:
        return {
            f"{prefix}.input_layernorm.weight": 1 + 0.1 * torch.randn(hidden, generator=g),
            f"{prefix}.post_attention_layernorm.weight": 1 + 0.1 * torch.randn(hidden, generator=g),
            f"{prefix}.self_attn.q_proj.weight": w(heads * head_dim, hidden),
            f"{prefix}.self_attn.k_proj.weight": w(kv_heads * head_dim, hidden),
            f"{prefix}.self_attn.v_proj.weight": w(kv_heads * head_dim, hidden),
            f"{prefix}.self_attn.o_proj.weight": w(hidden, heads * head_dim),
            f"{prefix}.mlp.gate_proj.weight": w(inter, hidden),
            f"{prefix}.mlp.up_proj.weight": w(inter, hidden),
            f"{prefix}.mlp.down_proj.weight": w(hidden, inter),
        }

    tensors = {
        "model.embed_tokens.weight": w(vocab, hidden, std=1.0),
        "model.norm.weight": torch.ones(hidden),
        "lm_head.weight": w(vocab, hidden, std=0.5),
    }
    for i in range(layers):
        tensors.update(block(f"model.layers.{i}"))
    for k in range(mtp_layers):
        p = f"model.layers.{layers + k}"
        tensors.update(block(p))
        tensors[f"{p}.enorm.weight"] = torch.ones(hidden)
        tensors[f"{p}.hnorm.weight"] = torch.ones(hidden)
        tensors[f"{p}.eh_proj.weight"] = w(hidden, 2 * hidden)
        tensors[f"{p}.shared_head.norm.weight"] = torch.ones(hidden)
        tensors[f"{p}.embed_tokens.weight"] = tensors["model.embed_tokens.weight"]
        tensors[f"{p}.shared_head.head.weight"] = tensors["lm_head.weight"]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "torch_dtype": "float32",
    }
    if mtp_layers:
        config["num_nextn_predict_layers"] = mtp_layers
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous().clone() for k, v in tensors.items()}, str(path / "model.safetensors"))
    return path


def make_eagle3_head(path: Path, target: Path, draft_vocab: int | None = None, seed: int = 0) -> Path:
    """An EAGLE-3 head folder for the `target` checkpoint: random weights in the layout trtspec writes, its
    draft vocabulary the target's last `draft_vocab` ids (d2t offsets), its layers the default low/mid/high."""
    from trtspec.speculative.eagle import Eagle3Head, default_capture
    from trtspec.speculative.model import ModelDims, dims_from_hf_config

    cfg = json.loads((target / "config.json").read_text())
    dims = dims_from_hf_config(cfg)
    vocab = draft_vocab or dims.vocab_size
    head_dims = ModelDims(**{**dims.__dict__, "num_layers": 1, "num_mtp_layers": 0})
    torch.manual_seed(seed)
    head = Eagle3Head(head_dims, default_capture(dims.num_layers), dims.hidden_size, vocab)
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn_like(p) * 0.3 if p.dim() > 1 else 1 + 0.1 * torch.randn_like(p))
        head.d2t.fill_(dims.vocab_size - vocab)  # draft id i is target id i + (V - v)
    head.save(path, cfg, dtype=torch.float32)
    return path
