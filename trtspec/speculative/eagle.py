"""EAGLE-3 draft heads: one decoder layer that reads the target's own features and drafts recursively.

At position i the head fuses the outputs of a few target layers (low, middle, high) through `fc`,
joins them with the embedding of token i+1, and predicts token i+2 through one decoder layer whose
attention reads both ([norm(embedding), norm(hidden)], width 2d). Further drafts feed the layer's own
output back in place of the target's features, as the MTP chain does past its last layer; the head
keeps its own KV cache, so a draft step is one layer and a small output matrix, not a model.

The checkpoint is the layout TensorRT-LLM's EAGLE-3 loader reads (tensorrt_llm/_torch/models/
modeling_speculative.py, `Eagle3ForCausalLM`, as the published EAGLE-3 heads are): `fc.weight`,
`midlayer.{hidden_norm,input_layernorm,self_attn.{q,k,v,o}_proj,post_attention_layernorm,
mlp.{gate,up,down}_proj}`, `norm.weight`, `lm_head.weight` over the draft vocabulary, and `d2t`
(target id = draft id + d2t[draft id]), no `model.` prefix; the embedding is the target's and is not
stored. Its loader knows a head by `draft_vocab_size` in config.json (any Llama architecture name), and
takes the captured layers from the deployment's `eagle3_layers_to_capture`, not from the head: the head
records them in `eagle_config.eagle_aux_hidden_state_layer_ids` so that `trtspec check` can compare.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from trtspec.errors import UsageError
from trtspec.fsutil import atomic_write_text
from trtspec.modes.eagle3 import trtllm_default_capture
from trtspec.speculative.drafters import MTPDrafter
from trtspec.speculative.model import (
    Block,
    ForwardOut,
    KVCache,
    ModelDims,
    RMSNorm,
    Slots,
    Transformer,
    dims_from_hf_config,
    read_weights,
)

ARCHITECTURE = "LlamaForCausalLM"  # every TensorRT-LLM version maps it to the EAGLE-3 class given draft_vocab_size
WEIGHTS = "model.safetensors"


def default_capture(num_layers: int) -> tuple[int, ...]:
    """TensorRT-LLM's default layers where it has three distinct ones, else low, middle and high of a shallow
    target (which a deployment then names in eagle3.layers_to_capture)."""
    if (layers := trtllm_default_capture(num_layers)) is not None and len(set(layers)) == 3:
        return layers
    return tuple(sorted({min(1, num_layers - 1), num_layers // 2 - 1 if num_layers > 3 else 0, num_layers - 2}))


class Eagle3Head(nn.Module):
    def __init__(self, dims: ModelDims, capture: tuple[int, ...], target_hidden: int, draft_vocab: int) -> None:
        super().__init__()
        self.dims, self.capture = dims, tuple(capture)
        self.recorded = True  # config.json names the layers it was trained on (else TensorRT-LLM's default)
        d = dims.hidden_size
        self.fc = nn.Linear(len(capture) * target_hidden, d, bias=False)
        self.hidden_norm = RMSNorm(d, dims.rms_norm_eps)
        self.block = Block(dims, attention_in=2 * d)  # its input_layernorm norms the embedding
        self.norm = RMSNorm(d, dims.rms_norm_eps)
        self.lm_head = nn.Linear(d, draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))

    @property
    def draft_vocab(self) -> int:
        return self.lm_head.out_features

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        w = self.fc.weight
        return KVCache(self.dims, 1, batch, capacity, w.dtype, w.device)

    def draft_to_target(self) -> torch.Tensor:
        """Target token id of each draft id."""
        return torch.arange(self.draft_vocab, device=self.d2t.device) + self.d2t

    def layer(
        self,
        target: Transformer,
        hidden: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        slots: Slots | None = None,
        last_only: bool = False,
    ) -> ForwardOut:
        """The head at `positions`: `hidden` is the target's captured features (fused by fc first) or the
        head's own previous output; `tokens` are the next tokens. Logits come over the target's vocabulary
        (-inf outside the draft vocabulary), `hidden` is the layer's output before the final norm."""
        cache, index = slots.resolve(cache) if slots is not None else (cache, None)
        cos, sin, mask, kv_len = target._attention_inputs(positions, cache)
        if hidden.shape[-1] != self.dims.hidden_size:
            hidden = self.fc(hidden)
        b = self.block
        joined = torch.cat([b.input_layernorm(target.embed_tokens(tokens)), self.hidden_norm(hidden)], -1)
        x = hidden + b.attention(joined, cos, sin, cache, 0, positions, mask, kv_len, index)
        x = x + b.mlp(b.post_attention_layernorm(x))
        head_in = x[:, -1:] if last_only else x
        logits = self.lm_head(self.norm(head_in)).float()
        if self.draft_vocab != target.dims.vocab_size or bool(self.d2t.any()):
            full = logits.new_full((*logits.shape[:-1], target.dims.vocab_size), float("-inf"))
            logits = full.index_copy_(-1, self.draft_to_target(), logits)
        return ForwardOut(logits, x)

    def config(self, target_config: dict, extra: dict | None = None, dtype: torch.dtype = torch.bfloat16) -> dict:
        d = self.dims
        keep = ("rms_norm_eps", "rope_theta", "rope_parameters", "rope_scaling", "max_position_embeddings")
        return {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            **{k: target_config[k] for k in keep if k in target_config},
            "hidden_size": d.hidden_size,
            "intermediate_size": d.intermediate_size,
            "num_attention_heads": d.num_heads,
            "num_key_value_heads": d.num_kv_heads,
            "head_dim": d.head_dim,
            "num_hidden_layers": 1,
            "vocab_size": target_config["vocab_size"],
            "draft_vocab_size": self.draft_vocab,
            "target_hidden_size": self.fc.in_features // len(self.capture),
            "tie_word_embeddings": False,
            "torch_dtype": str(dtype).removeprefix("torch."),
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.capture)},
            **(extra or {}),
        }

    def save(self, out: Path, target_config: dict, extra: dict | None = None, dtype=torch.bfloat16) -> None:
        d, b = self.dims, self.block
        q, kv = d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim
        qw, kw, vw = b.qkv.weight.split([q, kv, kv])
        gate, up = b.gate_up.weight.chunk(2)
        a, m = "midlayer.self_attn", "midlayer.mlp"
        tensors = {
            "fc.weight": self.fc.weight,
            "midlayer.hidden_norm.weight": self.hidden_norm.weight,
            "midlayer.input_layernorm.weight": b.input_layernorm.weight,
            "midlayer.post_attention_layernorm.weight": b.post_attention_layernorm.weight,
            f"{a}.q_proj.weight": qw,
            f"{a}.k_proj.weight": kw,
            f"{a}.v_proj.weight": vw,
            f"{a}.o_proj.weight": b.o_proj.weight,
            f"{m}.gate_proj.weight": gate,
            f"{m}.up_proj.weight": up,
            f"{m}.down_proj.weight": b.down_proj.weight,
            "norm.weight": self.norm.weight,
            "lm_head.weight": self.lm_head.weight,
        }
        out.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to(dtype).contiguous() for k, v in tensors.items()}
        state["d2t"] = self.d2t.clone()
        save_file(state, str(out / WEIGHTS))
        atomic_write_text(out / "config.json", json.dumps(self.config(target_config, extra, dtype), indent=2) + "\n")


def load_eagle3(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Eagle3Head:
    path = Path(path)
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: no readable config.json for the EAGLE-3 head ({exc})") from None
    if "draft_vocab_size" not in cfg:
        raise UsageError(f"{path}: not an EAGLE-3 head (config.json has no draft_vocab_size)")
    dims = dims_from_hf_config({**cfg, "num_nextn_predict_layers": 0})
    recorded = tuple((cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or ())
    w = read_weights(path)
    a, m = "midlayer.self_attn", "midlayer.mlp"
    try:
        state = {
            "fc.weight": w["fc.weight"],
            "hidden_norm.weight": w["midlayer.hidden_norm.weight"],
            "block.input_layernorm.weight": w["midlayer.input_layernorm.weight"],
            "block.post_attention_layernorm.weight": w["midlayer.post_attention_layernorm.weight"],
            "block.qkv.weight": torch.cat([w[f"{a}.q_proj.weight"], w[f"{a}.k_proj.weight"], w[f"{a}.v_proj.weight"]]),
            "block.o_proj.weight": w[f"{a}.o_proj.weight"],
            "block.gate_up.weight": torch.cat([w[f"{m}.gate_proj.weight"], w[f"{m}.up_proj.weight"]]),
            "block.down_proj.weight": w[f"{m}.down_proj.weight"],
            "norm.weight": w["norm.weight"],
            "lm_head.weight": w["lm_head.weight"],
            "d2t": w.get("d2t", torch.zeros(w["lm_head.weight"].shape[0], dtype=torch.long)).long(),
        }
    except KeyError as exc:
        raise UsageError(f"{path}: EAGLE-3 head is missing weight {exc.args[0]}") from None
    target_hidden = int(cfg.get("target_hidden_size") or dims.hidden_size)
    # a head that does not record its layers (the published ones) is bound to TensorRT-LLM's default by the drafter
    capture = recorded or tuple(range(state["fc.weight"].shape[1] // target_hidden))
    with torch.device("meta"):
        head = Eagle3Head(dims, capture, target_hidden, int(cfg.get("draft_vocab_size") or dims.vocab_size))
    head.recorded = bool(recorded)
    expected = head.state_dict()
    for name, want in expected.items():
        if state[name].shape != want.shape:
            raise UsageError(
                f"{path}: weight {name} has shape {list(state[name].shape)} but config.json implies {list(want.shape)}"
            )
    head.load_state_dict(state, strict=True, assign=True)
    return head.to(device=device, dtype=dtype).eval().requires_grad_(False)  # d2t stays integer


class EagleDrafter(MTPDrafter):
    """The EAGLE-3 head as a one-layer MTP chain: the target's captured features at position n-2 and the
    last committed token draft the first token; the head's own output drafts the rest (cyclic reuse)."""

    def __init__(self, target: Transformer, head: Eagle3Head) -> None:
        d = target.dims
        if not head.recorded:  # trained for TensorRT-LLM's default layers, as published heads are
            default = trtllm_default_capture(d.num_layers)
            if default is None or len(default) != len(head.capture):
                raise UsageError(
                    f"the EAGLE-3 head does not record its layers (eagle_config.eagle_aux_hidden_state_layer_ids) and "
                    f"TensorRT-LLM's default {default} does not fit its fc of {len(head.capture)} layers"
                )
            head.capture = default
        width = head.fc.in_features // len(head.capture)
        if width != d.hidden_size or max(head.capture) >= d.num_layers:
            raise UsageError(
                f"the EAGLE-3 head reads layers {list(head.capture)} of width {width}; the target has "
                f"{d.num_layers} layers of width {d.hidden_size}: a head for another model"
            )
        if head.dims.hidden_size != d.hidden_size:
            raise UsageError(f"the EAGLE-3 head's width {head.dims.hidden_size} is not the target's {d.hidden_size}")
        self.model, self.head, self.depths = target, head, 1
        self.feature_layers = head.capture

    def _new_cache(self, batch: int, capacity: int) -> KVCache:
        return self.head.new_cache(batch, capacity)

    def _layer(self, depth, hidden, tokens, positions, cache, slots, last_only: bool = False) -> ForwardOut:
        return self.head.layer(self.model, hidden, tokens, positions, cache, slots, last_only)
