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
stored. Its loader knows a head by `draft_vocab_size` in config.json (architecture `LlamaForCausalLM`), and
takes the captured layers from the deployment's `eagle3_layers_to_capture`, not from the head: the head
records them in `eagle_config.eagle_aux_hidden_state_layer_ids` so that `trtspec check` can compare.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from trtspec.errors import UsageError
from trtspec.fsutil import atomic_write_text
from trtspec.modes.eagle3 import recorded_layers, trtllm_default_capture
from trtspec.speculative.drafters import BatchState, MTPDrafter, grow_tree
from trtspec.speculative.model import (
    Block,
    ForwardOut,
    KVCache,
    Linear,
    ModelDims,
    RMSNorm,
    Slots,
    Transformer,
    TreeAttention,
    dims_from_hf_config,
    read_weights,
    save_weights,
)
from trtspec.speculative.tree import TokenTree, TreeShape, tree_attention

ARCHITECTURE = "LlamaForCausalLM"  # every TensorRT-LLM version maps it to the EAGLE-3 class given draft_vocab_size
WEIGHTS = "model.safetensors"
# the head's parameters as the checkpoint names them; q/k/v and gate/up are fused here (one matmul each)
NAMES = {
    "fc.weight": ("fc.weight",),
    "hidden_norm.weight": ("midlayer.hidden_norm.weight",),
    "block.input_layernorm.weight": ("midlayer.input_layernorm.weight",),
    "block.post_attention_layernorm.weight": ("midlayer.post_attention_layernorm.weight",),
    "block.qkv.weight": tuple(f"midlayer.self_attn.{p}_proj.weight" for p in "qkv"),
    "block.o_proj.weight": ("midlayer.self_attn.o_proj.weight",),
    "block.gate_up.weight": ("midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight"),
    "block.down_proj.weight": ("midlayer.mlp.down_proj.weight",),
    "norm.weight": ("norm.weight",),
    "lm_head.weight": ("lm_head.weight",),
}


def default_capture(num_layers: int) -> tuple[int, ...]:
    """The layers a new head is trained on: TensorRT-LLM's default where it has three distinct ones, else low,
    middle and high of a shallow target (which a deployment then names in eagle3.layers_to_capture), fewer
    where those coincide (targets of 2 to 5 layers)."""
    if num_layers < 2:
        raise ValueError(f"an EAGLE-3 head reads layers of a target with 2 or more, not {num_layers}")
    if (layers := trtllm_default_capture(num_layers)) is not None and len(set(layers)) == 3:
        return layers
    return tuple(sorted({1, max(0, num_layers // 2 - 1), num_layers - 2}))


class Eagle3Head(nn.Module):
    def __init__(self, dims: ModelDims, capture: tuple[int, ...], target_hidden: int, draft_vocab: int) -> None:
        super().__init__()
        self.dims, self.capture = dims, tuple(capture)
        self.recorded = True  # config.json names the layers it was trained on (else TensorRT-LLM's default)
        self.needs_target_head = False  # loaded without lm_head (draft vocabulary = the target's): tie() first
        d = dims.hidden_size
        self.fc = Linear(len(capture) * target_hidden, d, bias=False)
        self.hidden_norm = RMSNorm(d, dims.rms_norm_eps)
        self.block = Block(dims, attention_in=2 * d)  # its input_layernorm norms the embedding
        self.norm = RMSNorm(d, dims.rms_norm_eps)
        self.lm_head = Linear(d, draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long))
        self.vocab_map: torch.Tensor | None = None  # target id per draft id, set by bind() where it is not 1:1
        self.bound = False

    @property
    def draft_vocab(self) -> int:
        return self.lm_head.out_features

    def new_cache(self, batch: int, capacity: int) -> KVCache:
        w = self.norm.weight
        return KVCache(self.dims, 1, batch, capacity, w.dtype, w.device)

    def draft_to_target(self) -> torch.Tensor:
        """Target token id of each draft id (TensorRT-LLM: `tokens += d2t[tokens]`)."""
        return torch.arange(self.draft_vocab, device=self.d2t.device) + self.d2t

    def bind(self, target: Transformer) -> None:
        """Check the draft vocabulary maps into the target's, tie the target's output matrix where the head
        has none, and fix the mapping once (not a host sync per draft)."""
        vocab, ids = target.dims.vocab_size, self.draft_to_target()
        if self.draft_vocab > vocab or int(ids.min()) < 0 or int(ids.max()) >= vocab or len(ids.unique()) != len(ids):
            raise UsageError(
                f"the EAGLE-3 head's d2t maps its {self.draft_vocab} draft tokens outside the target's {vocab} "
                "or onto one token twice: a head for another model"
            )
        if self.needs_target_head:
            if self.draft_vocab != vocab:
                raise UsageError(
                    f"the EAGLE-3 head has no lm_head and drafts {self.draft_vocab} tokens; the target has {vocab}: "
                    "a head for another model"
                )
            self.lm_head.weight = target.lm_head.weight
            self.needs_target_head = False
        self.vocab_map = None if self.draft_vocab == vocab and not bool(self.d2t.any()) else ids
        self.bound = True

    def step(self, embeds, hidden, cos, sin, cache: KVCache, positions, mask, kv_len: int, slots=None) -> torch.Tensor:
        """The layer on `hidden` (width d) and the next tokens' embeddings: its output before the final norm,
        which the next draft reads back. Training (tools/train_eagle3_head.py) runs this same step."""
        b = self.block
        joined = torch.cat([b.input_layernorm(embeds), self.hidden_norm(hidden)], -1)
        x = hidden + b.attention(joined, cos, sin, cache, 0, positions, mask, kv_len, slots)
        return x + b.mlp(b.post_attention_layernorm(x))

    def layer(
        self,
        target: Transformer,
        hidden: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        slots: Slots | None = None,
        last_only: bool = False,
        tree: TreeAttention | None = None,
    ) -> ForwardOut:
        """The head at `positions`: `hidden` is the target's captured features (fused by fc first, which
        TensorRT-LLM also decides by the input's width) or the head's own previous output; `tokens` are the
        next tokens. Logits come over the target's vocabulary (-inf outside the draft vocabulary). With
        `tree`, `positions` are cache slots and the tree gives rotary positions and visibility (as the target's)."""
        cache, index = slots.resolve(cache) if slots is not None else (cache, None)
        cos, sin, mask, kv_len = target._attention_inputs(positions, cache, tree)
        if hidden.shape[-1] != self.dims.hidden_size:
            hidden = self.fc(hidden)
        x = self.step(target.embed_tokens(tokens), hidden, cos, sin, cache, positions, mask, kv_len, index)
        head_in = x[:, -1:] if last_only else x
        logits = self.lm_head(self.norm(head_in)).float()
        ids = self.vocab_map if self.bound else self.draft_to_target()  # unbound: mapped on every call
        if ids is not None:
            full = logits.new_full((*logits.shape[:-1], target.dims.vocab_size), float("-inf"))
            logits = full.index_copy_(-1, ids, logits)
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

    def _fused_sizes(self, name: str) -> list[int]:
        d = self.dims
        if name == "block.qkv.weight":
            return [d.num_heads * d.head_dim, d.num_kv_heads * d.head_dim, d.num_kv_heads * d.head_dim]
        return [d.intermediate_size, d.intermediate_size]

    def save(self, out: Path, target_config: dict, extra: dict | None = None, dtype=torch.bfloat16) -> None:
        params = dict(self.named_parameters())
        state = {}
        for name, keys in NAMES.items():
            parts = params[name].split(self._fused_sizes(name)) if len(keys) > 1 else (params[name],)
            state.update({k: v.detach().to(dtype).contiguous() for k, v in zip(keys, parts, strict=True)})
        state["d2t"] = self.d2t.clone()
        out.mkdir(parents=True, exist_ok=True)
        save_weights(state, out / WEIGHTS)
        atomic_write_text(out / "config.json", json.dumps(self.config(target_config, extra, dtype), indent=2) + "\n")


def load_eagle3(path: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> Eagle3Head:
    path = Path(path)
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: no readable config.json for the EAGLE-3 head ({exc})") from None
    if "draft_vocab_size" not in cfg:
        raise UsageError(f"{path}: not an EAGLE-3 head (config.json has no draft_vocab_size)")
    try:  # the head's own Llama fields; its attention has no bias (TensorRT-LLM's EAGLE-3 layer reads none here)
        dims = dims_from_hf_config({**cfg, "num_nextn_predict_layers": 0, "attention_bias": False})
        recorded = recorded_layers(cfg)
        draft_vocab = int(cfg.get("draft_vocab_size") or dims.vocab_size)
        target_hidden = int(cfg.get("target_hidden_size") or dims.hidden_size)
        sizes = (draft_vocab, target_hidden, dims.hidden_size, dims.vocab_size, dims.head_dim, dims.num_heads)
        sizes += (dims.num_kv_heads, dims.intermediate_size)
        if not all(type(n) is int and n > 0 for n in sizes):
            raise ValueError("sizes must be positive integers (hidden, heads, head_dim, intermediate, vocabularies)")
    except KeyError as exc:
        raise UsageError(f"{path}: the EAGLE-3 head's config.json has no {exc.args[0]}") from None
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{path}: the EAGLE-3 head's config.json: {exc}") from None
    w = read_weights(path)
    # TensorRT-LLM's loader: d2t is required where the draft vocabulary is smaller; lm_head may be left out where
    # it is the target's whole vocabulary (it then takes the target's)
    tied = "lm_head.weight" not in w and draft_vocab == dims.vocab_size
    if tied:
        w["lm_head.weight"] = torch.zeros(draft_vocab, dims.hidden_size)  # tied to the target's by bind()
    if draft_vocab != dims.vocab_size and "d2t" not in w:
        raise UsageError(f"{path}: EAGLE-3 head drafts {draft_vocab} of {dims.vocab_size} tokens but has no d2t")
    try:
        if any(w[k].dim() != 2 for keys in NAMES.values() for k in keys if not k.endswith("norm.weight")):
            raise UsageError(f"{path}: the EAGLE-3 head's matrices are not all 2-D: a corrupt or foreign checkpoint")
        state = {name: torch.cat([w[k] for k in keys]) for name, keys in NAMES.items()}
    except KeyError as exc:
        raise UsageError(f"{path}: EAGLE-3 head is missing weight {exc.args[0]}") from None
    except RuntimeError:  # q/k/v or gate/up of different widths
        raise UsageError(f"{path}: the EAGLE-3 head's q/k/v or gate/up weights do not fit together") from None
    state["d2t"] = w.get("d2t", torch.zeros(draft_vocab, dtype=torch.long)).long()
    # a head that does not record its layers (the published ones) is bound to TensorRT-LLM's default by the drafter
    capture = tuple(recorded or range(state["fc.weight"].shape[1] // target_hidden))
    with torch.device("meta"):
        head = Eagle3Head(dims, capture, target_hidden, draft_vocab)
    head.recorded, head.needs_target_head = recorded is not None, tied
    for name, want in head.state_dict().items():
        if state[name].shape != want.shape:
            raise UsageError(
                f"{path}: weight {name} has shape {list(state[name].shape)} but config.json implies {list(want.shape)}"
            )
    head.load_state_dict(state, strict=True, assign=True)
    return head.to(device=device, dtype=dtype).eval().requires_grad_(False)  # d2t stays integer


class EagleDrafter(MTPDrafter):
    """The EAGLE-3 head as a one-layer MTP chain: the target's captured features at position n-2 and the
    last committed token draft the first token; the head's own output drafts the rest (cyclic reuse).

    The layers captured are the deployment's `eagle3.layers_to_capture` where it names them (as TensorRT-LLM
    takes them), else the ones the head records, else TensorRT-LLM's default; a deployment naming others than
    the head records is refused (the head would read features it was not trained on)."""

    def __init__(self, target: Transformer, head: Eagle3Head, layers: list[int] | None = None) -> None:
        d = target.dims
        if layers is not None and not layers:
            raise UsageError("eagle3.layers_to_capture is empty: name the layers the head reads")
        capture = tuple(sorted(layers)) if layers is not None else None
        if capture is not None and head.recorded and capture != tuple(sorted(head.capture)):
            raise UsageError(
                f"eagle3.layers_to_capture {list(capture)}: the EAGLE-3 head was trained on layers {list(head.capture)}"
            )
        if capture is None and not head.recorded:  # trained for TensorRT-LLM's default, as published heads are
            capture = trtllm_default_capture(d.num_layers)
            if capture is None:
                raise UsageError(
                    "the EAGLE-3 head does not record its layers (eagle_config.eagle_aux_hidden_state_layer_ids) and "
                    f"TensorRT-LLM has no default for a {d.num_layers}-layer target: set eagle3.layers_to_capture"
                )
        capture = capture or head.capture
        width = head.fc.in_features // len(head.capture)
        if len(capture) != len(head.capture) or width != d.hidden_size or max(capture) >= d.num_layers:
            raise UsageError(
                f"the EAGLE-3 head reads {len(head.capture)} layers of width {width}; the target has {d.num_layers} "
                f"layers of width {d.hidden_size} (layers {list(capture)} asked): a head for another model"
            )
        if (head.dims.hidden_size, head.dims.head_dim) != (d.hidden_size, d.head_dim):
            raise UsageError(
                f"the EAGLE-3 head's width and head_dim {head.dims.hidden_size}, {head.dims.head_dim} are not the "
                f"target's {d.hidden_size}, {d.head_dim}: a head for another model"
            )
        head.bind(target)
        head.capture = capture
        # MTPDrafter's own __init__ reads the target's MTP layers, which an EAGLE-3 deployment need not have
        self.model, self.head, self.depths = target, head, 1
        self.feature_layers = capture

    def _new_cache(self, batch: int, capacity: int) -> KVCache:
        return self.head.new_cache(batch, capacity)

    def _layer(self, depth, hidden, tokens, positions, cache, slots, last_only: bool = False, tree=None) -> ForwardOut:
        return self.head.layer(self.model, hidden, tokens, positions, cache, slots, last_only, tree)

    proposes_trees = True

    def propose_tree(self, state: BatchState, shape: TreeShape, slots: Slots) -> TokenTree:
        """EAGLE-2's dynamic tree from the head: the root's top `width` tokens, then per level every kept node
        run through the head at once (its parent's output and its own token, at its branch's position, seeing
        the committed prefix and its ancestors), the `width` children with the best cumulative log-probability
        kept. One head pass per level, as a chain of the tree's depth costs."""
        n = state.lengths[slots.index]
        logits, hidden = self._catch_up(state, 0, state.tokens[slots.index], slots)  # at n-2: drafts position n
        last_out: list[torch.Tensor] = []  # the head's outputs for the previous level's nodes

        def expand(level: int, last: torch.Tensor, frontier: torch.Tensor, seen: torch.Tensor, parents) -> torch.Tensor:
            # each node is run on its parent's output (the root's children on the catch-up pass's)
            if last_out:
                previous = last_out.pop()
                reads = previous.gather(1, (parents - (frontier[0] - last.shape[1]))[..., None].expand_as(previous))
            else:
                reads = hidden[:, None].expand(*last.shape, -1)
            # the head's cache holds positions up to n-2; node i sits at slot n-1+i, at the position before its
            # token's (n-2+level for a node of depth `level`), as the chain's later drafts do
            rope = (n - 2 + level)[:, None].expand_as(last)
            attention = tree_attention(n - 1, n - 1, seen, rope)
            out = self._layer(0, reads, last, (n - 1)[:, None] + frontier, self.cache, slots, tree=attention)
            last_out.append(out.hidden)
            return out.logits.log_softmax(-1)

        return grow_tree(logits.log_softmax(-1), shape, expand)

    def commit_tree(self, state: BatchState, old_lengths: torch.Tensor, slots: Slots, logits: torch.Tensor) -> None:
        # the slots from n-1 on held the tree's branches: positions before them are exact, as after a chain
        self.commit(state, old_lengths, 1, slots)
