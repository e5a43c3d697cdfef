"""A lean Llama decoder with a static KV cache, loading Hugging Face checkpoints.

Why not `LlamaForCausalLM`: at batch 1 on a CPU, transformers' per-call overhead (cache objects,
mask builders) is a large share of a small model's step, and speculation is won or lost on that
share. Here the KV cache is a preallocated tensor written at absolute positions (as in gpt-fast), so
"rolling back" rejected drafts is just a shorter valid length: stale entries sit beyond it, are
masked, and are overwritten by the next write. Every row of a batch has its own positions, so
requests of different lengths share one forward pass.

MTP layers follow DeepSeek-V3 (checkpoint keys `model.layers.{L+k}.{enorm,hnorm,eh_proj,...}`):
depth k at position i combines the embedding of token i+k with the previous depth's hidden state at
i, runs one decoder block, and predicts token i+k+1 with the shared head.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from trtspec.checkpoints.inspect import VOCAB_ROWS_FIX, read_hf_config, vocab_rows_message
from trtspec.errors import TrtspecError, UsageError
from trtspec.families import TORCH_RUNNER_FAMILIES
from trtspec.fsutil import readable_by_others

SUPPORTED_ARCHITECTURES = set(TORCH_RUNNER_FAMILIES)  # trtspec.families: the one table


@dataclass(frozen=True)
class ModelDims:
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    attention_bias: bool
    tie_word_embeddings: bool
    num_mtp_layers: int
    max_position_embeddings: int


def dims_from_hf_config(cfg: dict) -> ModelDims:
    heads = cfg["num_attention_heads"]
    return ModelDims(
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        intermediate_size=cfg["intermediate_size"],
        rms_norm_eps=cfg.get("rms_norm_eps", 1e-6),
        attention_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        num_mtp_layers=int(cfg.get("num_nextn_predict_layers") or 0),
        max_position_embeddings=cfg.get("max_position_embeddings", 2048),
    )


# MKL's single-precision GEMM takes a slow path for x W^T with W stored [out, in] once x has more than 3
# rows: on the embedded target a [4, 384] x [384, 640] product took 10x the time of [3, 384] (and the
# whole forward 1.6x that of one token), while the same product against W stored column-major did not.
# Verifying K drafts is a forward of K+1 rows, and the method rests on its costing about one token's, as
# it does on a GPU; so CPU inference multiplies inputs wider than this against a column-major copy.
CPU_ROW_MAJOR_MAX_ROWS = 3


class Linear(nn.Linear):
    """nn.Linear whose CPU inference keeps a column-major copy of its weight for inputs of 4+ rows.

    The copy doubles the matrix's memory on CPU (only there, and only once such an input is seen). It
    hangs on the weight itself, so modules sharing a matrix (a head tied to the target's lm_head) share
    one copy, and is rebuilt when the weight changes in place (weights made under inference mode have no
    version to tell: change them out of it). Training (autograd on) uses the weight itself."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu" or torch.is_grad_enabled() or x.numel() <= CPU_ROW_MAJOR_MAX_ROWS * x.shape[-1]:
            return F.linear(x, self.weight, self.bias)
        return F.linear(x, column_major(self.weight), self.bias)


def column_major(w: torch.Tensor) -> torch.Tensor:
    """The weight's values stored column-major, made once per weight and kept on it."""
    key = (w.data_ptr(), w.dtype, w._version if not w.is_inference() else None)
    cached = getattr(w, "_trtspec_column_major", None)
    if cached is None or cached[0] != key:
        with torch.inference_mode(False):  # a normal tensor, whichever mode first asked for it
            copy = w.detach().t().contiguous().t()
        cached = (key, copy)
        w._trtspec_column_major = cached
    return cached[1]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class KVCache:
    """Keys and values for `layers` blocks at absolute positions, one row (slot) per sequence."""

    def __init__(self, dims: ModelDims, layers: int, batch: int, max_len: int, dtype: torch.dtype, device) -> None:
        shape = (layers, batch, dims.num_kv_heads, max_len, dims.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len

    def rows(self, start: int, stop: int) -> KVCache:
        """A view of slots start..stop-1 that writes through to this cache."""
        view = object.__new__(KVCache)
        view.k, view.v, view.max_len = self.k[:, start:stop], self.v[:, start:stop], self.max_len
        return view


@dataclass(frozen=True)
class Slots:
    """The cache rows a forward pass reads and writes: a batch that is a subset of the slots.

    A contiguous run of slots becomes a view (no copies); any other set is gathered for attention.
    """

    index: torch.Tensor  # [B] slot per row of the batch
    start: int | None = None  # set when the slots are start, start+1, ...

    @staticmethod
    def of(slots: list[int], device=None) -> Slots:
        contiguous = slots == list(range(slots[0], slots[0] + len(slots))) if slots else False
        return Slots(torch.tensor(slots, dtype=torch.long, device=device), slots[0] if contiguous else None)

    def resolve(self, cache: KVCache) -> tuple[KVCache, torch.Tensor | None]:
        if self.start is not None:
            return cache.rows(self.start, self.start + len(self.index)), None
        return cache, self.index


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Block(nn.Module):
    """A Llama decoder block; q/k/v and gate/up are fused into one matmul each for fewer calls."""

    def __init__(self, d: ModelDims, attention_in: int | None = None) -> None:
        super().__init__()
        self.d = d
        q, kv = d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim
        self.input_layernorm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        # attention reads the normed input: width d, or 2d in an EAGLE-3 layer ([embedding, hidden])
        self.qkv = Linear(attention_in or d.hidden_size, q + 2 * kv, bias=d.attention_bias)
        self.o_proj = Linear(q, d.hidden_size, bias=False)
        self.post_attention_layernorm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        self.gate_up = Linear(d.hidden_size, 2 * d.intermediate_size, bias=False)
        self.down_proj = Linear(d.intermediate_size, d.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache,
        layer: int,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        kv_len: int,
        slots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        x = x + self.attention(self.input_layernorm(x), cos, sin, cache, layer, positions, mask, kv_len, slots)
        return x + self.mlp(self.post_attention_layernorm(x))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)

    def attention(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache,
        layer: int,
        positions: torch.Tensor,
        mask: torch.Tensor | None,
        kv_len: int,
        slots: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Self-attention over the cache on already-normed input `h`, its keys and values written first."""
        d = self.d
        b, t, _ = h.shape
        qkv = self.qkv(h)
        q, k, v = qkv.split([d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim, d.num_kv_heads * d.head_dim], -1)
        q = q.view(b, t, d.num_heads, d.head_dim).transpose(1, 2)
        k = k.view(b, t, d.num_kv_heads, d.head_dim).transpose(1, 2)
        v = v.view(b, t, d.num_kv_heads, d.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if slots is not None:  # a scattered subset of the cache's rows: write in place, gather to attend
            cache.k[layer][slots[:, None], :, positions] = k.transpose(1, 2)
            cache.v[layer][slots[:, None], :, positions] = v.transpose(1, 2)
            keys = cache.k[layer][slots, :, :kv_len]
            values = cache.v[layer][slots, :, :kv_len]
        else:
            if b == 1:  # one row's positions are consecutive: a slice write
                start = int(positions[0, 0])
                cache.k[layer, :, :, start : start + t] = k
                cache.v[layer, :, :, start : start + t] = v
            else:
                rows = torch.arange(b, device=h.device)[:, None]
                cache.k[layer][rows, :, positions] = k.transpose(1, 2)
                cache.v[layer][rows, :, positions] = v.transpose(1, 2)
            keys = cache.k[layer, :, :, :kv_len]
            values = cache.v[layer, :, :, :kv_len]
        attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=d.num_kv_heads != d.num_heads)
        return self.o_proj(attn.transpose(1, 2).reshape(b, t, -1))


class MTPLayer(nn.Module):
    """One DeepSeek-V3 MTP module: norms, concat [embedding, hidden], projection, block, head norm."""

    def __init__(self, d: ModelDims) -> None:
        super().__init__()
        self.enorm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        self.hnorm = RMSNorm(d.hidden_size, d.rms_norm_eps)
        self.eh_proj = Linear(2 * d.hidden_size, d.hidden_size, bias=False)
        self.block = Block(d)
        self.head_norm = RMSNorm(d.hidden_size, d.rms_norm_eps)


@dataclass(frozen=True)
class TreeAttention:
    """Tokens of a token tree written at consecutive cache slots: each sits at its depth's rotary
    position and sees the committed prefix, its ancestors and itself, never its siblings' branches."""

    rope_positions: torch.Tensor  # [B, T] position in the sequence if this node's branch were taken
    mask: torch.Tensor  # [B, 1, T, >= kv_len] bool: slot visible to the query


@dataclass
class ForwardOut:
    logits: torch.Tensor  # [B, T, V] float32 (or [B, 1, V] for last-only)
    hidden: torch.Tensor  # [B, T, d] after the final norm (what MTP depth 1 consumes)
    features: torch.Tensor | None = None  # [B, T, C*d] captured layers' outputs, concatenated (EAGLE-3)


class Transformer(nn.Module):
    def __init__(self, dims: ModelDims, rope_cos: torch.Tensor, rope_sin: torch.Tensor) -> None:
        super().__init__()
        self.dims = dims
        self.embed_tokens = nn.Embedding(dims.vocab_size, dims.hidden_size)
        self.layers = nn.ModuleList(Block(dims) for _ in range(dims.num_layers))
        self.norm = RMSNorm(dims.hidden_size, dims.rms_norm_eps)
        self.lm_head = Linear(dims.hidden_size, dims.vocab_size, bias=False)
        self.mtp = nn.ModuleList(MTPLayer(dims) for _ in range(dims.num_mtp_layers))
        self.register_buffer("rope_cos", rope_cos, persistent=False)
        self.register_buffer("rope_sin", rope_sin, persistent=False)

    @property
    def max_positions(self) -> int:
        return self.rope_cos.shape[0]

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        return KVCache(
            self.dims,
            self.dims.num_layers,
            batch,
            max_len,
            self.embed_tokens.weight.dtype,
            self.embed_tokens.weight.device,
        )

    def new_mtp_cache(self, batch: int, max_len: int) -> KVCache:
        return KVCache(
            self.dims,
            max(1, self.dims.num_mtp_layers),
            batch,
            max_len,
            self.embed_tokens.weight.dtype,
            self.embed_tokens.weight.device,
        )

    def _attention_inputs(self, positions: torch.Tensor, cache: KVCache, tree: TreeAttention | None = None):
        """cos/sin at each row's positions, and a causal mask over the valid cache prefix (or the tree's)."""
        if int(positions.max()) >= min(cache.max_len, self.max_positions):
            raise UsageError(f"sequence longer than the KV cache ({cache.max_len} positions)")
        kv_len = int(positions.max()) + 1
        rope = positions if tree is None else tree.rope_positions
        cos = self.rope_cos[rope].unsqueeze(1)
        sin = self.rope_sin[rope].unsqueeze(1)
        b, t = positions.shape
        if tree is not None:
            mask = tree.mask[..., :kv_len]
        elif b == 1 and t == 1:
            mask = None  # one query at the last position sees the whole prefix
        else:
            keys = torch.arange(kv_len, device=positions.device)
            mask = (keys[None, None, :] <= positions[:, :, None]).unsqueeze(1)
        return cos, sin, mask, kv_len

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        last_only: bool = False,
        slots: Slots | None = None,
        tree: TreeAttention | None = None,
        capture: tuple[int, ...] = (),
    ) -> ForwardOut:
        """Run `tokens` [B, T] at `positions` [B, T], writing their keys and values into `cache`
        (into rows `slots` when the batch is a subset of the cache's rows). With `tree`, `positions`
        are the cache slots the tokens are written to, and the tree gives their rotary positions and
        which slots each one attends to. `capture` names layers whose outputs come back as `features`
        (an EAGLE-3 head reads them)."""
        cache, index = slots.resolve(cache) if slots is not None else (cache, None)
        cos, sin, mask, kv_len = self._attention_inputs(positions, cache, tree)
        x = self.embed_tokens(tokens)
        captured = {}
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, cache, i, positions, mask, kv_len, index)
            if i in capture:
                captured[i] = x
        hidden = self.norm(x)
        head_in = hidden[:, -1:] if last_only else hidden
        features = torch.cat([captured[i] for i in capture], -1) if capture else None
        return ForwardOut(self.lm_head(head_in).float(), hidden, features)

    def mtp_forward(
        self,
        depth: int,
        hidden: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        slots: Slots | None = None,
        last_only: bool = False,
    ) -> ForwardOut:
        """MTP layer `depth` (0-based) on the previous depth's hidden states and the next tokens."""
        mtp = self.mtp[depth]
        cache, index = slots.resolve(cache) if slots is not None else (cache, None)
        cos, sin, mask, kv_len = self._attention_inputs(positions, cache)
        x = mtp.eh_proj(torch.cat([mtp.enorm(self.embed_tokens(tokens)), mtp.hnorm(hidden)], dim=-1))
        h = mtp.block(x, cos, sin, cache, depth, positions, mask, kv_len, index)
        head_in = h[:, -1:] if last_only else h
        return ForwardOut(self.lm_head(mtp.head_norm(head_in)).float(), h)


def _rope_tables(hf_config: dict, dims: ModelDims, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin for positions 0..max_len-1, computed by transformers' own rotary code (all rope types)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cfg = LlamaConfig(**{k: v for k, v in hf_config.items() if k not in ("architectures", "model_type")})
    cfg.head_dim = dims.head_dim
    rope = LlamaRotaryEmbedding(cfg)
    positions = torch.arange(max_len)[None]
    cos, sin = rope(torch.zeros(1, dtype=torch.float32), positions)
    return cos[0], sin[0]


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise UsageError(f"{path}: no *.safetensors weights (trtspec reads safetensors only)")
    weights: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            weights.update(load_file(str(f)))
        except Exception as exc:  # safetensors raises its own error types for truncated files
            raise UsageError(f"{f}: corrupt safetensors file: {exc}") from None
    return weights


_OS_ERROR = re.compile(r"os error (\d+)|code: (\d+)")  # safetensors' Rust io::Error, new and old wording


def save_weights(weights: dict[str, torch.Tensor], file: Path) -> None:
    """save_file, with its I/O failures as the OSError they are: safetensors raises its own
    SafetensorError ("I/O error: No space left on device (os error 28)"), which the build maps to
    its one-line disk error only as an OSError."""
    try:
        save_file(weights, str(file), metadata={"format": "pt"})
        readable_by_others(file)
    except SafetensorError as exc:
        found = _OS_ERROR.search(str(exc))
        if found is None:
            raise TrtspecError(f"{file}: safetensors could not write the weights: {exc}") from None
        code = int(found.group(1) or found.group(2))
        raise OSError(code, os.strerror(code) if code in errno.errorcode else str(exc), str(file)) from None


def _block_state(prefix: str, w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    a = f"{prefix}.self_attn"
    m = f"{prefix}.mlp"
    out = {
        "input_layernorm.weight": w[f"{prefix}.input_layernorm.weight"],
        "post_attention_layernorm.weight": w[f"{prefix}.post_attention_layernorm.weight"],
        "qkv.weight": torch.cat([w[f"{a}.q_proj.weight"], w[f"{a}.k_proj.weight"], w[f"{a}.v_proj.weight"]]),
        "o_proj.weight": w[f"{a}.o_proj.weight"],
        "gate_up.weight": torch.cat([w[f"{m}.gate_proj.weight"], w[f"{m}.up_proj.weight"]]),
        "down_proj.weight": w[f"{m}.down_proj.weight"],
    }
    if f"{a}.q_proj.bias" in w:
        out["qkv.bias"] = torch.cat([w[f"{a}.q_proj.bias"], w[f"{a}.k_proj.bias"], w[f"{a}.v_proj.bias"]])
    return out


def _refuse_mismatched_shapes(path: Path, state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """One line instead of load_state_dict's traceback when config.json does not describe the weights."""
    for name in ("embed_tokens.weight", "lm_head.weight"):
        rows, vocab = state[name].shape[0], expected[name].shape[0]
        if rows != vocab:
            weight = "model.embed_tokens.weight" if name == "embed_tokens.weight" else "lm_head.weight"
            raise UsageError(f"{vocab_rows_message(path, vocab, weight, rows, 'the weights')}: {VOCAB_ROWS_FIX}")
    if extra := sorted(set(state) - set(expected)):
        raise UsageError(f"{path}: weights {', '.join(extra[:3])} are not in the model config.json describes")
    for name, want in expected.items():
        got = state[name].shape if name in state else want.shape
        if got != want.shape:
            raise UsageError(
                f"{path}: weight {name} has shape {list(got)} but config.json implies {list(want.shape)}: "
                "the config does not describe these weights"
            )


def refuse_unsupported_architecture(path: Path, hf: dict, draft_for: str | None = None) -> None:
    """One line for a checkpoint the runner cannot load, before anything is written from it; `draft_for` is the
    mode it is loaded as the draft of (None: the target), so a head is named in init's and check's words."""
    from trtspec.modes import HEAD_MODE_NAMES, mode_for_draft, wrong_draft

    if head := mode_for_draft(hf):  # EAGLE-3's original releases name LlamaForCausalLM: read before the name
        if draft_for is not None:
            raise UsageError(f"{wrong_draft(str(path), head, draft_for)}: use mode {head.name}")
        raise UsageError(f"{path} is {head.draft_role}, not a target model: it is the draft of mode {head.name}")
    names = hf.get("architectures") or []
    if not names:
        raise UsageError(
            f"{path}: config.json names no architectures, so it is no model the torch runner loads "
            f"({', '.join(sorted(SUPPORTED_ARCHITECTURES))}); heads are the draft of their own mode "
            f"({HEAD_MODE_NAMES})"
        )
    if names[0] not in SUPPORTED_ARCHITECTURES:
        raise UsageError(f"{path}: the torch runner supports {sorted(SUPPORTED_ARCHITECTURES)}, not {names[0]}")


def load_transformer(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    max_len: int = 2048,
    mtp_layers: int | None = None,
    draft_for: str | None = None,
) -> Transformer:
    """Load a Llama-family HF checkpoint (and any DeepSeek-V3-layout MTP layers) into a Transformer; `draft_for`
    names the mode it drafts for (None: the target)."""
    path = Path(path)
    hf = read_hf_config(path)
    refuse_unsupported_architecture(path, hf, draft_for)
    dims = dims_from_hf_config(hf)
    if mtp_layers is not None:
        if mtp_layers > dims.num_mtp_layers:
            raise UsageError(f"{path}: asked for {mtp_layers} MTP layers, checkpoint has {dims.num_mtp_layers}")
        dims = ModelDims(**{**dims.__dict__, "num_mtp_layers": mtp_layers})
    max_len = min(max_len, dims.max_position_embeddings)
    cos, sin = _rope_tables(hf, dims, max_len)
    w = read_weights(path)
    try:
        state = {"embed_tokens.weight": w["model.embed_tokens.weight"], "norm.weight": w["model.norm.weight"]}
        state["lm_head.weight"] = w.get("lm_head.weight", w["model.embed_tokens.weight"])
        if dims.tie_word_embeddings:
            state["lm_head.weight"] = w["model.embed_tokens.weight"]
        for i in range(dims.num_layers):
            for k, v in _block_state(f"model.layers.{i}", w).items():
                state[f"layers.{i}.{k}"] = v
        for k in range(dims.num_mtp_layers):
            p = f"model.layers.{dims.num_layers + k}"
            state[f"mtp.{k}.enorm.weight"] = w[f"{p}.enorm.weight"]
            state[f"mtp.{k}.hnorm.weight"] = w[f"{p}.hnorm.weight"]
            state[f"mtp.{k}.eh_proj.weight"] = w[f"{p}.eh_proj.weight"]
            state[f"mtp.{k}.head_norm.weight"] = w[f"{p}.shared_head.norm.weight"]
            for name, v in _block_state(p, w).items():
                state[f"mtp.{k}.block.{name}"] = v
    except KeyError as exc:
        raise UsageError(f"{path}: checkpoint is missing weight {exc.args[0]}") from None
    with torch.device("meta"):
        model = Transformer(dims, cos, sin)
    _refuse_mismatched_shapes(path, state, model.state_dict())
    model.load_state_dict(state, strict=True, assign=True)
    model.rope_cos, model.rope_sin = cos, sin
    model = model.to(device=device, dtype=dtype)
    model.rope_cos = cos.to(device=device, dtype=dtype)
    model.rope_sin = sin.to(device=device, dtype=dtype)
    return model.eval().requires_grad_(False)


def parameter_count(model: Transformer, include_mtp: bool = False) -> int:
    total = sum(p.numel() for n, p in model.named_parameters() if include_mtp or not n.startswith("mtp."))
    if model.dims.tie_word_embeddings:
        total -= model.lm_head.weight.numel()
    return total
