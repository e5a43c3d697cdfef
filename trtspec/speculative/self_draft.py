"""The target as its own drafter: a subset of its layers (self-speculation), or its weights in int8.

Self-speculation (Draft & Verify, Zhang et al. 2023; LayerSkip, Elhoushi et al. 2024) drafts with the
target's embedding, some of its decoder layers, its final norm and its head, so there is nothing to
train and no second tokenizer: the draft shares the target's tensors and only keeps a KV cache of its
own (for the layers it runs). Which layers pay is an empirical question: `prefix_acceptance` measures, on
the user's prompts, how often each prefix of the layers agrees with the whole model, and `best_prefix`
weighs that against what each costs (trtspec.methods.self_draft_settings, for plan and the benchmark).

A quantized self-draft runs every layer with int8 weight-only matrices (per output row scales, as
TensorRT-LLM's `--use_weight_only --weight_only_precision int8` stores them): acceptance stays near
one. Each matrix is dequantized on its call into a buffer the model's matrices of that shape share
(gpt-fast's eager form, less the allocation): the buffer stays in cache, so a call reads a quarter of the
fp32 target's bytes from memory, and this CPU runs the copy's forward in half the target's time. A fresh
fp32 copy per call instead put the cost in the allocator's hands (2.7 ms or 14-18 ms a forward of the
embedded target, as glibc reused its 37 MB of pages or mapped and faulted them again). A fused int8
kernel (TensorRT-LLM's weight-only GEMM) would not need the buffer at all.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from trtspec.speculative.cost_model import expected_tokens_per_step_positional
from trtspec.speculative.model import Transformer
from trtspec.speculative.requests import SamplingParams
from trtspec.speculative.sampling import probs_from_logits


class Int8Linear(nn.Module):
    """y = x W^T with W stored as int8 rows and one scale per row (symmetric, round to nearest).

    `scratch` is shared by the matrices of one model, which runs one forward at a time (the runner's
    engine thread): one dequantized buffer per shape and dtype, not one per matrix or per call."""

    def __init__(self, linear: nn.Linear, scratch: dict | None = None) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
        self.register_buffer("weight", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(linear.weight.dtype))
        self.bias = linear.bias
        self.scratch = {} if scratch is None else scratch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = (tuple(self.weight.shape), x.dtype, x.device)
        dense = self.scratch.get(key)
        if dense is None:
            with torch.inference_mode(False):  # a normal tensor: copy_ into it works in and out of inference mode
                dense = self.scratch[key] = torch.empty(self.weight.shape, dtype=x.dtype, device=x.device)
        y = F.linear(x, dense.copy_(self.weight)) * self.scale
        return y if self.bias is None else y + self.bias


def _int8(module: nn.Module, scratch: dict) -> nn.Module:
    """A copy of `module` whose linear layers hold int8 weights; the original is untouched."""
    if isinstance(module, nn.Linear):
        return Int8Linear(module, scratch)
    module = copy.deepcopy(module)
    for name, child in list(module.named_children()):
        setattr(module, name, _int8(child, scratch))
    return module


def default_layers(num_layers: int) -> list[int]:
    """The first half of the layers: LayerSkip's early exit at the middle, before any measurement."""
    return list(range(max(1, num_layers // 2)))


def layers_problem(layers: Sequence[int], num_layers: int, weights: str) -> str | None:
    """Why these layers cannot draft for a target of `num_layers` layers (None: they can)."""
    if not layers:
        return "needs at least one layer"
    if list(layers) != sorted(set(layers)):
        return f"{list(layers)} must be distinct and ascending (the order the target runs them)"
    if layers[0] < 0 or layers[-1] >= num_layers:
        return f"{list(layers)} are not all among the target's layers 0..{num_layers - 1}"
    if weights == "same" and len(layers) == num_layers:
        return "every layer with the same weights is the target itself: skip some layers or set weights: int8"
    return None


def resolve_layers(layers: Sequence[int] | None, weights: str, num_layers: int) -> list[int]:
    """The layers a self-draft runs: as set, else the first half (every layer with int8); refused in one line."""
    from trtspec.errors import UsageError

    if layers is None:
        layers = default_layers(num_layers) if weights == "same" else range(num_layers)
    if problem := layers_problem(list(layers), num_layers, weights):
        raise UsageError(f"self_draft.layers {problem}")
    return list(layers)


def self_draft_model(target: Transformer, layers: Sequence[int], weights: str = "same") -> Transformer:
    """A Transformer over `layers` of `target` that shares its tensors (copies them as int8 with `weights`)."""
    dims = replace(target.dims, num_layers=len(layers), num_mtp_layers=0)
    with torch.device("meta"):
        model = Transformer(dims, target.rope_cos, target.rope_sin)
    scratch: dict = {}
    quantize = (lambda m: _int8(m, scratch)) if weights == "int8" else (lambda m: m)
    model.embed_tokens = target.embed_tokens  # a lookup: nothing to gain from int8
    model.layers = nn.ModuleList(quantize(target.layers[i]) for i in layers)
    model.norm = target.norm
    model.lm_head = quantize(target.lm_head)
    model.mtp = nn.ModuleList()
    model.rope_cos, model.rope_sin = target.rope_cos, target.rope_sin
    return model.eval().requires_grad_(False)


@torch.inference_mode()
def prefix_acceptance(target: Transformer, prompts: list[list[int]], sampling: SamplingParams) -> list[float]:
    """For L = 1 .. layers-1, the acceptance a draft of the first L layers gets on these prompts.

    One target pass per prompt gives every prefix's hidden states; at each position the chance a draft
    token is accepted is sum_v min(p, q) (Leviathan et al.), with p the target's processed distribution
    and q the prefix's (at temperature 0, whether their argmaxes agree)."""
    n = target.dims.num_layers
    agree, count = torch.zeros(n - 1, dtype=torch.float64), 0
    for ids in prompts:
        x = torch.tensor([ids], device=target.embed_tokens.weight.device)
        pos = torch.arange(len(ids), device=x.device)[None]
        cache = target.new_cache(1, len(ids))
        cos, sin, mask, kv_len = target._attention_inputs(pos, cache)
        h, states = target.embed_tokens(x), []
        for i, layer in enumerate(target.layers):
            h = layer(h, cos, sin, cache, i, pos, mask, kv_len)
            states.append(h)
        # one [T, V] distribution at a time: a large vocabulary times every layer would not fit
        p = probs_from_logits(target.lm_head(target.norm(h)), sampling)[0]
        for depth, state in enumerate(states[:-1]):
            q = probs_from_logits(target.lm_head(target.norm(state)), sampling)[0]
            agree[depth] += torch.minimum(p, q).sum().item()
        count += len(ids)
    return (agree / max(count, 1)).tolist()


def best_prefix(acceptance: list[float], cost: list[float], max_k: int = 4) -> int:
    """The number of first layers whose chain of up to `max_k` drafts the cost model rates fastest: tokens
    per step over K draft passes of relative cost c plus one target pass."""

    def speedup(layers: int) -> float:
        a, c = acceptance[layers - 1], cost[layers - 1]
        return max(expected_tokens_per_step_positional([a] * k) / (k * c + 1) for k in range(1, max_k + 1))

    return max(range(1, len(acceptance) + 1), key=speedup)
