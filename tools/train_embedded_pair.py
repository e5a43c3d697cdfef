"""Train trtspec's embedded tiny speculative-decoding pair on CPU.

One module, one command, three phases (plus measurement):

1. a byte-level BPE tokenizer trained on the training split of the corpus;
2. a small Llama TARGET trained jointly with ``D`` DeepSeek-V3-style multi-token-prediction
   (MTP) layers (loss ``CE_main + lambda / D * sum_k CE_k``), then a short phase that freezes
   the trunk and fits only the MTP layers to the trunk's own next-token distributions;
3. a much smaller Llama DRAFT distilled from the finished target (KL at temperature 1).

The weights are written as Hugging Face checkpoints (``LlamaForCausalLM`` loads both; the MTP
tensors sit in the target's safetensors under DeepSeek-V3's key names) together with a
``training_log.json`` of every number the model card quotes, and the card itself, rendered from
that log through ``tools/model_card.md.tmpl`` (``--card-only`` re-renders it without training).

Usage (from the repository root)::

    python tools/train_embedded_pair.py --out trtspec/assets

The corpus is ``--corpus PATH``, by default ``$TRTSPEC_DATA/tinyshakespeare.txt`` (Tiny Shakespeare,
see trtspec.data.PUBLIC_SETS). It is never copied into ``--out``; only the split offset is recorded. The
script lives in ``tools/`` because it is how the shipped weights were made, not something an
installed trtspec runs.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import math
import os
import platform
import shutil
import string
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from torch import nn
from transformers import AutoTokenizer, DynamicCache, LlamaConfig, LlamaForCausalLM
from transformers.masking_utils import create_causal_mask
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm

from trtspec.assets import ASSETS_BUDGET_BYTES
from trtspec.data import PUBLIC_SETS, data_file
from trtspec.errors import UsageError

SPECIAL_TOKENS = ["<s>", "</s>", "<pad>", "<unk>"]
BOS_ID, EOS_ID, PAD_ID, UNK_ID = 0, 1, 2, 3
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
VAL_FRACTION = 0.05
SAMPLE_PROMPTS = ["ROMEO:\n", "First Citizen:\nWe are", "KING HENRY VI:\nO God, "]
CORPUS_NAME = "tinyshakespeare.txt"
SCRIPT = "tools/train_embedded_pair.py"
CARD_TEMPLATE = Path(__file__).resolve().with_name("model_card.md.tmpl")


# --------------------------------------------------------------------------------------------
# small utilities
# --------------------------------------------------------------------------------------------


def log(msg: str, **fields: Any) -> None:
    """Print one timestamped progress line (flushed, so ``nohup`` logs can be tailed)."""
    extra = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())
    print(f"[{time.strftime('%H:%M:%S')}] {msg} {extra}".rstrip(), flush=True)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write via a temporary file + rename so a crash never leaves a half-written file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, ensure_ascii=False) + "\n").encode())


def atomic_torch_save(obj: Any, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def count_params(module: nn.Module) -> int:
    """Count unique parameters (tied embedding/head counted once)."""
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


def autocast_ctx(precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast uses AMX tiles on recent Xeons; fp32 is the fallback."""
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def lr_at(step: int, total: int, peak: float, warmup: int, floor_frac: float = 0.1) -> float:
    """Linear warmup then cosine decay to ``floor_frac * peak``."""
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor_frac + (1 - floor_frac) * 0.5 * (1 + math.cos(math.pi * t)))


# --------------------------------------------------------------------------------------------
# corpus and tokenizer
# --------------------------------------------------------------------------------------------


def split_corpus(text: str) -> tuple[str, str, int]:
    """Hold out the last 5% (snapped forward to a line start) as validation text."""
    cut = int(len(text) * (1 - VAL_FRACTION))
    nl = text.find("\n", cut)
    offset = cut if nl < 0 else nl + 1
    return text[:offset], text[offset:], offset


def train_tokenizer(train_text: str, vocab_size: int) -> Tokenizer:
    """Byte-level BPE (GPT-2 pre-tokenisation) so every string round-trips with no <unk>."""
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([train_text], trainer=trainer)
    # Llama convention: encoding with special tokens prepends <s>; training windows start with it too.
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", BOS_ID)]
    )
    for i, s in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    return tok


def write_tokenizer(tok: Tokenizer, out_dir: Path, model_max_length: int) -> None:
    """Write the three files ``AutoTokenizer.from_pretrained`` needs, offline, deterministically."""
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out_dir / "tokenizer.json", (tok.to_str(pretty=True) + "\n").encode())
    special = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
    atomic_write_json(
        out_dir / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **special,
            "add_bos_token": True,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": model_max_length,
            "padding_side": "left",
        },
    )
    atomic_write_json(out_dir / "special_tokens_map.json", special)


def check_tokenizer(tok_dir: Path, sample: str) -> dict[str, Any]:
    """Reload through transformers and verify special ids and exact encode/decode round-trip."""
    hf = AutoTokenizer.from_pretrained(str(tok_dir))
    ids = hf(sample, add_special_tokens=False)["input_ids"]
    assert hf.decode(ids) == sample, "tokenizer does not round-trip the validation text"
    with_bos = hf("Hello")["input_ids"]
    assert with_bos[0] == BOS_ID, with_bos
    assert hf.decode(with_bos, skip_special_tokens=True) == "Hello"
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id, hf.unk_token_id) == (BOS_ID, EOS_ID, PAD_ID, UNK_ID)
    return {"class": type(hf).__name__, "roundtrip_chars": len(sample), "chars_per_token": len(sample) / len(ids)}


# --------------------------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------------------------


def llama_config(vocab: int, d: int, layers: int, heads: int, kv_heads: int, ffn: int, max_pos: int) -> LlamaConfig:
    """A tied-embedding Llama config; tying halves the duplicated embed/head copies on disk."""
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=d,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=d // heads,
        max_position_embeddings=max_pos,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=BOS_ID,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
        attention_bias=False,
        mlp_bias=False,
    )
    cfg._attn_implementation = "sdpa"
    return cfg


def init_linear_and_norms(module: nn.Module, std: float) -> None:
    """Same init as HF's Llama (normal(0, std) weights, unit norms) for modules we build by hand."""
    for m in module.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=std)
        elif isinstance(m, LlamaRMSNorm):
            nn.init.ones_(m.weight)


class MTPLayer(LlamaDecoderLayer):
    """One DeepSeek-V3 MTP module: a standard Llama block plus enorm/hnorm/eh_proj/shared_head.norm.

    Subclassing ``LlamaDecoderLayer`` makes the state-dict keys exactly DeepSeek-V3's
    (``self_attn.*``, ``mlp.*``, ``input_layernorm``, ``post_attention_layernorm``, ``enorm``,
    ``hnorm``, ``eh_proj``, ``shared_head.norm``). Embedding and output head are the trunk's.
    """

    def __init__(self, config: LlamaConfig, layer_idx: int) -> None:
        super().__init__(config, layer_idx)
        d = config.hidden_size
        self.enorm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.hnorm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * d, d, bias=False)
        self.shared_head = nn.Module()
        self.shared_head.norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)


class TargetWithMTP(nn.Module):
    """Llama trunk + MTP layers, computing the exact math the trtspec runner implements."""

    def __init__(self, config: LlamaConfig, depth: int) -> None:
        super().__init__()
        self.trunk = LlamaForCausalLM(config)
        L = config.num_hidden_layers
        self.mtp = nn.ModuleList(MTPLayer(config, L + k) for k in range(depth))
        init_linear_and_norms(self.mtp, config.initializer_range)

    def forward(self, ids: torch.Tensor, mtp: bool = True) -> list[torch.Tensor]:
        """Return ``[logits0, logits1, ..., logitsD]``; ``logits_k[:, i]`` predicts ``ids[:, i + k + 1]``."""
        h = self.trunk.model(input_ids=ids).last_hidden_state  # after the final model.norm
        return [self.trunk.lm_head(h), *(self.mtp_forward(ids, h) if mtp else [])]

    def mtp_forward(self, ids: torch.Tensor, h: torch.Tensor) -> list[torch.Tensor]:
        """MTP logits from the trunk's normed final hidden states ``h``.

        Depth k (layer L+k-1) sees ``x_i = eh_proj([enorm(embed(tok[i+k])); hnorm(h_{k-1,i})])``
        for i = 0..n-1-k, runs a causal Llama block with rotary positions i (not i+k), and
        predicts ``tok[i+k+1]`` with the shared head after ``shared_head.norm``.
        """
        model = self.trunk.model
        n, outs = ids.shape[1], []
        for k, layer in enumerate(self.mtp, start=1):
            m = n - k
            pos = torch.arange(m, device=ids.device).unsqueeze(0).expand(ids.shape[0], -1)
            e = layer.enorm(model.embed_tokens(ids[:, k:]))
            x = layer.eh_proj(torch.cat([e, layer.hnorm(h[:, :m])], dim=-1))
            # no cache, passed by position: transformers renamed the argument (past_key_values -> cache, 5.2x)
            mask = create_causal_mask(self.trunk.config, x, None, None, position_ids=pos)
            h = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=model.rotary_emb(x, pos))
            outs.append(self.trunk.lm_head(layer.shared_head.norm(h)))
        return outs


def add_residual_dropout(model: LlamaForCausalLM, p: float) -> list[Any]:
    """GPT-2 style dropout on each block's attention/MLP output, active only in train mode.

    Shakespeare is ~0.3M tokens, so the 10M-parameter trunk sees it many times; this keeps it
    from memorising without changing the inference-time architecture (hooks are removed after).
    """
    if p <= 0:
        return []

    def drop_tuple(mod: nn.Module, inp: Any, out: Any) -> Any:
        return (F.dropout(out[0], p, mod.training), *out[1:])

    def drop(mod: nn.Module, inp: Any, out: torch.Tensor) -> torch.Tensor:
        return F.dropout(out, p, mod.training)

    handles = []
    for layer in model.model.layers:
        handles.append(layer.self_attn.register_forward_hook(drop_tuple))
        handles.append(layer.mlp.register_forward_hook(drop))
    return handles


# --------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------


def random_windows(ids: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator) -> torch.Tensor:
    """``[<s>] + seq_len-1`` consecutive tokens from a random offset: matches bos-prefixed prompts."""
    starts = torch.randint(0, len(ids) - seq_len, (batch,), generator=gen)
    rows = torch.stack([ids[s : s + seq_len - 1] for s in starts.tolist()])
    return torch.cat([torch.full((batch, 1), BOS_ID, dtype=torch.long), rows], dim=1)


def fixed_windows(ids: torch.Tensor, seq_len: int, limit: int | None = None) -> list[torch.Tensor]:
    """Non-overlapping ``[<s>] + chunk`` windows covering ``ids`` (for deterministic evaluation)."""
    out = []
    for s in range(0, len(ids) - 1, seq_len - 1):
        chunk = ids[s : s + seq_len - 1]
        if len(chunk) < 16:
            break
        out.append(torch.cat([torch.tensor([BOS_ID]), chunk]))
        if limit is not None and len(out) >= limit:
            break
    return out


@torch.no_grad()
def sample_from_target(
    trunk: LlamaForCausalLM,
    prompts: torch.Tensor,
    total_len: int,
    gen: torch.Generator,
    temperature: float = 1.0,
    precision: str = "fp32",
) -> torch.Tensor:
    """Ancestral sampling with a KV cache. The samples are the target's *own* text, on which
    the draft and MTP layers are later fitted: that is the text speculative decoding drafts for."""
    trunk.eval()
    cache = DynamicCache(config=trunk.config)
    seqs = prompts.clone()
    with autocast_ctx(precision):
        logits = trunk(seqs, past_key_values=cache, use_cache=True).logits[:, -1]
        while seqs.shape[1] < total_len:
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=gen)
            seqs = torch.cat([seqs, nxt], dim=1)
            if seqs.shape[1] == total_len:
                break
            logits = trunk(nxt, past_key_values=cache, use_cache=True).logits[:, -1]
    return seqs


# --------------------------------------------------------------------------------------------
# losses
# --------------------------------------------------------------------------------------------


def ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))


def kl_soft(teacher_logits: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """Mean over positions of KL(p_teacher || q_student) at temperature 1."""
    logp = F.log_softmax(teacher_logits.float(), dim=-1)
    logq = F.log_softmax(student_logits.float(), dim=-1)
    return (logp.exp() * (logp - logq)).sum(-1).mean()


def joint_loss(target: TargetWithMTP, ids: torch.Tensor, lam: float) -> tuple[torch.Tensor, dict[str, float]]:
    """DeepSeek-V3 MTP objective: CE_main + lam / D * sum_k CE_k."""
    outs = target(ids)
    main = ce(outs[0][:, :-1], ids[:, 1:])
    parts = {"ce_main": main.item()}
    total = main
    D = len(outs) - 1
    for k in range(1, D + 1):
        ck = ce(outs[k][:, :-1], ids[:, k + 1 :])
        parts[f"ce_mtp{k}"] = ck.item()
        total = total + lam / D * ck
    return total, parts


def mtp_kl_loss(target: TargetWithMTP, ids: torch.Tensor, ce_weight: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Frozen trunk: fit depth k at i to the trunk's distribution at position i+k (its own next
    token given the true prefix), i.e. exactly the distribution the MTP draft is verified against."""
    with torch.no_grad():
        h = target.trunk.model(input_ids=ids).last_hidden_state
        p_logits = target.trunk.lm_head(h)
    total = torch.zeros((), dtype=torch.float32)
    parts: dict[str, float] = {}
    for k, lk in enumerate(target.mtp_forward(ids, h), start=1):
        kl = kl_soft(p_logits[:, k:], lk)
        ck = ce(lk[:, :-1], ids[:, k + 1 :])
        parts[f"kl_mtp{k}"], parts[f"ce_mtp{k}"] = kl.item(), ck.item()
        total = total + (1 - ce_weight) * kl + ce_weight * ck
    return total / len(target.mtp), parts


def draft_loss(
    trunk: LlamaForCausalLM, draft: LlamaForCausalLM, ids: torch.Tensor, ce_weight: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Distillation: KL(p_target || q_draft) at T=1 (+ optional CE on the text)."""
    with torch.no_grad():
        p_logits = trunk(input_ids=ids).logits
    q_logits = draft(input_ids=ids).logits
    kl = kl_soft(p_logits, q_logits)
    c = ce(q_logits[:, :-1], ids[:, 1:])
    return (1 - ce_weight) * kl + ce_weight * c, {"kl_draft": kl.item(), "ce_draft": c.item()}


# --------------------------------------------------------------------------------------------
# generic resumable training loop
# --------------------------------------------------------------------------------------------


def train_phase(
    name: str,
    module: nn.Module,
    params: list[nn.Parameter],
    loss_fn: Callable[[torch.Tensor, int], tuple[torch.Tensor, dict[str, float]]],
    batches: Callable[[torch.Generator], torch.Tensor],
    steps: int,
    lr: float,
    args: argparse.Namespace,
    gen_seed: int,
    ckpt_dir: Path,
) -> dict[str, Any]:
    """AdamW + warmup/cosine + grad clipping, checkpointing every ``--ckpt-every`` steps.

    A finished phase is skipped on re-run (its weights are loaded); an unfinished one resumes
    from its last checkpoint with the same data-sampling and dropout RNG state.
    """
    ckpt = ckpt_dir / f"{name}.pt"
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    gen = torch.Generator().manual_seed(gen_seed)
    state: dict[str, Any] = {"step": 0, "history": [], "wall_s": 0.0}
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        module.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        gen.set_state(saved["gen"])
        torch.set_rng_state(saved["rng"])
        state = saved["state"]
        log(f"{name}: resumed", step=state["step"], done=state.get("done", False))
        if state.get("done"):
            return state
    warmup = max(1, min(args.warmup, steps // 10))
    ema: dict[str, float] = {}
    module.train()
    t_start = time.time() - state["wall_s"]
    tokens = 0
    t_window = time.time()
    for step in range(state["step"], steps):
        cur_lr = lr_at(step, steps, lr, warmup)
        for g in opt.param_groups:
            g["lr"] = cur_lr
        ids = batches(gen)
        with autocast_ctx(args.precision_used):
            loss, parts = loss_fn(ids, step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(params, args.grad_clip).item()
        opt.step()
        tokens += ids.numel()
        for k, v in parts.items():
            ema[k] = v if k not in ema else 0.98 * ema[k] + 0.02 * v
        if (step + 1) % args.log_every == 0 or step + 1 == steps:
            dt = time.time() - t_window
            rec = {"step": step + 1, "lr": cur_lr, "grad_norm": gnorm, "tok_per_s": tokens / dt, **ema}
            rec["elapsed_s"] = time.time() - t_start
            state["history"].append(rec)
            log(f"{name}", **rec)
            tokens, t_window = 0, time.time()
        if (step + 1) % args.ckpt_every == 0 or step + 1 == steps:
            state.update(step=step + 1, wall_s=time.time() - t_start, done=step + 1 == steps, final_ema=dict(ema))
            atomic_torch_save(
                {
                    "model": module.state_dict(),
                    "opt": opt.state_dict(),
                    "gen": gen.get_state(),
                    "rng": torch.get_rng_state(),
                    "state": state,
                },
                ckpt,
            )
    module.eval()
    return state


# --------------------------------------------------------------------------------------------
# evaluation
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate(
    target: TargetWithMTP, draft: LlamaForCausalLM | None, windows: list[torch.Tensor], batch: int = 8
) -> dict[str, float]:
    """fp32 teacher-forced metrics on ``windows``.

    Acceptance proxies, per position: top-1 agreement (argmax q == argmax p) and
    ``sum_x min(p, q)`` (= expected acceptance of one speculative-sampling proposal at T=1).
    MTP depth k at i is compared with the trunk's distribution at position i+k.
    """
    target.eval()
    acc: dict[str, float] = {}
    cnt: dict[str, int] = {}

    def add(key: str, total: torch.Tensor, n: int) -> None:
        acc[key] = acc.get(key, 0.0) + float(total)
        cnt[key] = cnt.get(key, 0) + n

    by_len: dict[int, list[torch.Tensor]] = {}
    for w in windows:
        by_len.setdefault(len(w), []).append(w)
    for group in by_len.values():
        for b in range(0, len(group), batch):
            ids = torch.stack(group[b : b + batch])
            outs = target(ids)
            p = torch.softmax(outs[0].float(), -1)
            lab = ids[:, 1:]
            add(
                "ce_main",
                F.cross_entropy(outs[0][:, :-1].reshape(-1, p.shape[-1]), lab.reshape(-1), reduction="sum"),
                lab.numel(),
            )
            for k in range(1, len(outs)):
                lk = outs[k].float()
                labk = ids[:, k + 1 :]
                add(
                    f"ce_mtp{k}",
                    F.cross_entropy(lk[:, :-1].reshape(-1, lk.shape[-1]), labk.reshape(-1), reduction="sum"),
                    labk.numel(),
                )
                pk, qk = p[:, k:], torch.softmax(lk, -1)
                add(f"mtp{k}_top1_agree", (pk.argmax(-1) == qk.argmax(-1)).sum(), pk.shape[0] * pk.shape[1])
                add(f"mtp{k}_sum_min", torch.minimum(pk, qk).sum(-1).sum(), pk.shape[0] * pk.shape[1])
            if draft is not None:
                dl = draft(input_ids=ids).logits.float()
                q = torch.softmax(dl, -1)
                add(
                    "ce_draft",
                    F.cross_entropy(dl[:, :-1].reshape(-1, dl.shape[-1]), lab.reshape(-1), reduction="sum"),
                    lab.numel(),
                )
                logp, logq = torch.log_softmax(outs[0].float(), -1), torch.log_softmax(dl, -1)
                npos = ids.shape[0] * ids.shape[1]
                add("kl_draft", (p * (logp - logq)).sum(), npos)
                add("draft_top1_agree", (p.argmax(-1) == q.argmax(-1)).sum(), npos)
                add("draft_sum_min", torch.minimum(p, q).sum(-1).sum(), npos)
    res = {k: acc[k] / cnt[k] for k in acc}
    res["positions"] = cnt["ce_main"]
    return res


# --------------------------------------------------------------------------------------------
# timing (used both for choosing sizes and for the final record)
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def decode_ms(model: LlamaForCausalLM, ctx: int = 256, reps: int = 60) -> dict[str, float]:
    """Median wall time of one single-token HF forward with a ``ctx``-token DynamicCache (fp32),
    and the median time of just the weight mat-vecs (``torch.mv`` per matrix incl. the head) so
    the Python/framework overhead share is visible."""
    model = model.float().eval()
    cfg = model.config
    ids = torch.randint(4, cfg.vocab_size, (1, ctx), generator=torch.Generator().manual_seed(0))
    cache = DynamicCache(config=cfg)
    model(ids, past_key_values=cache, use_cache=True)
    tok = torch.tensor([[5]])
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        model(tok, past_key_values=cache, use_cache=True)
        times.append(time.perf_counter() - t0)
        cache.crop(-1)  # transformers 5: negative = number of tokens to drop
    mats = [m.weight.detach() for m in model.modules() if isinstance(m, nn.Linear)]
    x = {m.shape[1]: torch.randn(m.shape[1]) for m in mats}
    mv = []
    for _ in range(reps // 2):
        t0 = time.perf_counter()
        for w in mats:
            torch.mv(w, x[w.shape[1]])
        mv.append(time.perf_counter() - t0)
    med = lambda v: sorted(v[len(v) // 6 :])[len(v[len(v) // 6 :]) // 2] * 1e3  # noqa: E731
    return {"hf_forward_ms": med(times), "matvec_ms": med(mv)}


@torch.no_grad()
def mtp_matvec_ms(target: TargetWithMTP, reps: int = 30) -> float:
    """Weight mat-vec time of one MTP step (eh_proj + block + shared head), fp32."""
    layer = target.mtp[0]
    mats = [m.weight.detach().float() for m in layer.modules() if isinstance(m, nn.Linear)]
    mats.append(target.trunk.lm_head.weight.detach().float())
    x = {w.shape[1]: torch.randn(w.shape[1]) for w in mats}
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for w in mats:
            torch.mv(w, x[w.shape[1]])
        ts.append(time.perf_counter() - t0)
    return sorted(ts[5:])[len(ts[5:]) // 2] * 1e3


def sizing_sweep(vocab: int, max_pos: int) -> dict[str, Any]:
    """Time random-init candidates so the chosen sizes are measured, not guessed."""
    cands = {
        "target d384 L6 h6/kv2 ffn1024": (384, 6, 6, 2, 1024),
        "target d384 L8 h6/kv2 ffn1024": (384, 8, 6, 2, 1024),
        "target d512 L6 h8/kv2 ffn1376": (512, 6, 8, 2, 1376),
        "draft d192 L2 h3/kv3 ffn512": (192, 2, 3, 3, 512),
        "draft d256 L1 h4/kv2 ffn704": (256, 1, 4, 2, 704),
        "draft d128 L2 h2/kv2 ffn384": (128, 2, 2, 2, 384),
    }
    out = {}
    for name, (d, L, h, kv, ffn) in cands.items():
        torch.manual_seed(0)
        m = LlamaForCausalLM(llama_config(vocab, d, L, h, kv, ffn, max_pos))
        out[name] = {"params": count_params(m), **decode_ms(m)}
        log("sizing", cand=name, **out[name])
    return out


def measure_train_throughput(
    target: TargetWithMTP, train_ids: torch.Tensor, args: argparse.Namespace, steps: int = 4
) -> dict[str, float]:
    """tokens/s of full joint train steps (fwd+bwd+AdamW) in bf16 autocast vs fp32, on a copy."""
    res = {}
    for prec in ["bf16", "fp32"]:
        model = copy.deepcopy(target).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        gen = torch.Generator().manual_seed(0)
        times = []
        for _ in range(steps + 2):
            ids = random_windows(train_ids, args.batch_size, args.seq_len, gen)
            t0 = time.perf_counter()
            with autocast_ctx(prec):
                loss, _ = joint_loss(model, ids, 0.3)
            opt.zero_grad()
            loss.backward()
            opt.step()
            times.append(time.perf_counter() - t0)
        res[prec] = args.batch_size * args.seq_len / (sum(times[2:]) / steps)  # 2 warm-up steps (oneDNN)
        log("throughput", precision=prec, tok_per_s=res[prec])
    return res


# --------------------------------------------------------------------------------------------
# saving and verification
# --------------------------------------------------------------------------------------------


def target_tensors(target: TargetWithMTP) -> dict[str, torch.Tensor]:
    """HF Llama trunk keys + DeepSeek-V3 MTP keys at layer L+k, with the shared embed/head copied."""
    cfg = target.trunk.config
    L = cfg.num_hidden_layers
    sd = {k: v for k, v in target.trunk.state_dict().items() if not (cfg.tie_word_embeddings and k == "lm_head.weight")}
    embed = target.trunk.model.embed_tokens.weight
    head = target.trunk.lm_head.weight
    for k, layer in enumerate(target.mtp):
        for name, t in layer.state_dict().items():
            sd[f"model.layers.{L + k}.{name}"] = t
        sd[f"model.layers.{L + k}.embed_tokens.weight"] = embed
        sd[f"model.layers.{L + k}.shared_head.head.weight"] = head
    # safetensors refuses aliased storage: every entry gets its own contiguous bf16 copy.
    return {k: v.detach().to(torch.bfloat16).contiguous().clone() for k, v in sorted(sd.items())}


def save_checkpoint_dir(
    out_dir: Path, tensors: dict[str, torch.Tensor], config: LlamaConfig, extra: dict[str, Any], tok_dir: Path
) -> None:
    """config.json + model.safetensors + generation_config.json + byte-identical tokenizer files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = config.to_dict()
    generic = {
        "id2label",
        "label2id",
        "chunk_size_feed_forward",
        "is_encoder_decoder",
        "output_attentions",
        "output_hidden_states",
        "problem_type",
        "return_dict",
    }
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_") and k not in generic}
    cfg.update(
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "dtype": "bfloat16",
            "torch_dtype": "bfloat16",
            **extra,
        }
    )
    atomic_write_json(out_dir / "config.json", dict(sorted(cfg.items())))
    atomic_write_json(
        out_dir / "generation_config.json",
        {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID, "do_sample": False},
    )
    tmp = out_dir / "model.safetensors.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.chmod(tmp, 0o644)  # safetensors creates the file 0600
    os.replace(tmp, out_dir / "model.safetensors")
    for f in TOKENIZER_FILES:
        shutil.copyfile(tok_dir / f, out_dir / f)


def bf16_roundtrip(module: nn.Module) -> None:
    """Round weights to bf16 in place so in-memory evaluation equals what is shipped."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.to(torch.bfloat16).float())


@torch.no_grad()
def verify_target_dir(target_dir: Path, target: TargetWithMTP, probe: torch.Tensor) -> dict[str, Any]:
    """Reload with plain ``LlamaForCausalLM`` (trunk) and rebuild MTP layers from the raw keys;
    both must reproduce the training module's logits, and MTP embed/head copies must equal the trunk's."""
    hf = LlamaForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32, attn_implementation="sdpa").eval()
    ref = target(probe)
    got = hf(probe).logits
    trunk_diff = (got - ref[0]).abs().max().item()
    tensors = load_file(str(target_dir / "model.safetensors"))
    cfg = hf.config
    L, D = cfg.num_hidden_layers, cfg.num_nextn_predict_layers
    rebuilt = TargetWithMTP(copy.deepcopy(target.trunk.config), D)
    rebuilt.trunk.load_state_dict(hf.state_dict())
    for k in range(D):
        pre = f"model.layers.{L + k}."
        own = {n[len(pre) :]: t.float() for n, t in tensors.items() if n.startswith(pre)}
        assert torch.equal(own.pop("embed_tokens.weight"), tensors["model.embed_tokens.weight"].float())
        head_key = "lm_head.weight" if "lm_head.weight" in tensors else "model.embed_tokens.weight"
        assert torch.equal(own.pop("shared_head.head.weight"), tensors[head_key].float())
        rebuilt.mtp[k].load_state_dict(own, strict=True)
    rebuilt.eval()
    mtp_diff = max((a - b).abs().max().item() for a, b in zip(rebuilt(probe)[1:], ref[1:], strict=True))
    assert trunk_diff < 1e-3 and mtp_diff < 1e-3, (trunk_diff, mtp_diff)
    return {"max_abs_logit_diff_trunk": trunk_diff, "max_abs_logit_diff_mtp": mtp_diff, "n_tensors": len(tensors)}


@torch.no_grad()
def greedy_samples(target_dir: Path, max_new: int) -> list[dict[str, str]]:
    """Greedy continuations from the reloaded HF target (fp32)."""
    tok = AutoTokenizer.from_pretrained(str(target_dir))
    model = LlamaForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    out = []
    for prompt in SAMPLE_PROMPTS:
        enc = tok(prompt, return_tensors="pt")
        gen = model.generate(**enc, max_new_tokens=max_new, do_sample=False)
        out.append({"prompt": prompt, "completion": tok.decode(gen[0, enc["input_ids"].shape[1] :])})
    return out


# --------------------------------------------------------------------------------------------
# model card
# --------------------------------------------------------------------------------------------


def card_fields(rec: dict[str, Any]) -> dict[str, str]:
    """Every value the card template quotes, formatted, from the training log alone.

    Only the log goes in, so the card can be re-rendered after a template edit without retraining
    (``--card-only``) and can never quote a number the log does not hold.
    """
    t, d, ev = rec["models"]["target"], rec["models"]["draft"], rec["eval"]
    vl, tr, gn = ev["validation"], ev["train_subset"], ev.get("target_samples", {})
    split, timing, hp, ver = rec["corpus"], rec["timing_fp32_2threads"], rec["hparams"], rec["verification"]
    f = lambda x, n=3: f"{x:.{n}f}"  # noqa: E731

    def cfg_line(c: dict[str, Any]) -> str:
        return (
            f"d_model {c['hidden_size']}, {c['num_hidden_layers']} layers, {c['num_attention_heads']} heads "
            f"({c['num_key_value_heads']} KV heads, head_dim {c['head_dim']}), SwiGLU ffn "
            f"{c['intermediate_size']}, vocab {c['vocab_size']}, tied embeddings, RMSNorm eps "
            f"{c['rms_norm_eps']}, RoPE theta {c['rope_parameters']['rope_theta']}, max positions "
            f"{c['max_position_embeddings']}"
        )

    loss_rows = [
        f"| {name} | {f(r['ce_main'])} | {f(r['ce_mtp1'])} | {f(r['ce_mtp2'])} | {f(r['ce_draft'])} "
        f"| {f(r['kl_draft'])} |"
        for name, r in [
            ("validation (held-out Shakespeare)", vl),
            ("train subset", tr),
            ("target's own T=1 samples", gn),
        ]
        if r
    ]
    agreement_rows = [
        f"| {name} | {f(r['draft_top1_agree'])} | {f(r['draft_sum_min'])} | "
        f"{f(r['mtp1_top1_agree'])} | {f(r['mtp1_sum_min'])} | {f(r['mtp2_top1_agree'])} | "
        f"{f(r['mtp2_sum_min'])} |"
        for name, r in [("validation", vl), ("target samples", gn)]
        if r
    ]
    sizing_rows = [
        f"| {k} | {v['params']:,} | {f(v['hf_forward_ms'], 2)} | {f(v['matvec_ms'], 2)} |"
        for k, v in rec.get("sizing_sweep", {}).items()
    ]
    phase_rows = [
        f"| {n} | {p['steps']} | {p['batch_size']}x{p['seq_len']} | {p['peak_lr']} | {f(p['wall_s'] / 60, 1)} | "
        f"{p['notes']} |"
        for n, p in rec["phases"].items()
    ]
    samples = [
        f"Prompt `{s['prompt']!r}` →\n\n```text\n{s['prompt']}{s['completion']}\n```" for s in rec["greedy_samples"]
    ]
    notes = rec.get("card_notes")  # added to the log by hand after a run, never by this script
    hidden = t["config"]["hidden_size"]
    return {
        "command": rec["command"],
        "wall_min": f(rec["total_wall_s"] / 60, 1),
        "cpu": rec["machine"]["cpu"],
        "threads": str(rec["machine"]["threads"]),
        "torch_version": rec["machine"]["torch"],
        "transformers_version": rec["machine"]["transformers"],
        "precision": rec["precision"],
        "corpus_chars": f"{split['chars']:,}",
        "corpus_sha256_prefix": split["sha256"][:16],
        "val_offset": f"{split['val_offset']:,}",
        "train_tokens": f"{split['train_tokens']:,}",
        "val_tokens": f"{split['val_tokens']:,}",
        "vocab_size": str(rec["tokenizer"]["vocab_size"]),
        "chars_per_token": f(rec["tokenizer"]["chars_per_token"], 2),
        "target_hidden": str(hidden),
        "mb_per_1k_vocab": f"{5 * 1024 * hidden * 2 / 1e6:.1f}",
        "budget_mb": f"{ASSETS_BUDGET_BYTES / 1e6:.0f}",
        "target_config": cfg_line(t["config"]),
        "params_trunk": f"{t['params_trunk']:,}",
        "params_mtp": f"{t['params_mtp']:,}",
        "params_mtp_copies": f"{t['params_mtp_copies']:,}",
        "draft_config": cfg_line(d["config"]),
        "params_draft": f"{d['params']:,}",
        "target_bytes": f"{t['bytes']:,}",
        "draft_bytes": f"{d['bytes']:,}",
        "assets_bytes": f"{rec['bytes_assets_total']:,}",
        "trunk_logit_diff": f"{ver['max_abs_logit_diff_trunk']:.2e}",
        "mtp_logit_diff": f"{ver['max_abs_logit_diff_mtp']:.2e}",
        "target_layers": str(t["config"]["num_hidden_layers"]),
        "phase_rows": "\n".join(phase_rows),
        "weight_decay": str(hp["weight_decay"]),
        "grad_clip": str(hp["grad_clip"]),
        "late_lambda_pct": str(int(100 * (1 - hp["lambda_switch"]))),
        "dropout": str(hp["dropout"]),
        "mtp_ce_weight": str(hp["mtp_ce_weight"]),
        "draft_ce_weight": str(hp["draft_ce_weight"]),
        "loss_rows": "\n".join(loss_rows),
        "agreement_rows": "\n".join(agreement_rows),
        "target_samples_info": ev["target_samples_info"],
        "timing_ctx": str(timing["ctx"]),
        "target_forward_ms": f(timing["target"]["hf_forward_ms"], 2),
        "target_matvec_ms": f(timing["target"]["matvec_ms"], 2),
        "draft_forward_ms": f(timing["draft"]["hf_forward_ms"], 2),
        "draft_matvec_ms": f(timing["draft"]["matvec_ms"], 2),
        "mtp_step_matvec_ms": f(timing["mtp_step_matvec_ms"], 2),
        "target_over_draft_matvec": f"{timing['target']['matvec_ms'] / timing['draft']['matvec_ms']:.1f}",
        "sizing_rows": "\n".join(sizing_rows),
        "throughput_bf16": f"{rec['train_throughput']['bf16']:.0f}",
        "throughput_fp32": f"{rec['train_throughput']['fp32']:.0f}",
        "greedy_samples": "\n\n".join(samples),
        "seq_len": str(hp["seq_len"]),
        "notes_after_the_run": "\n" + "\n".join(notes) if notes else "",
    }


def render_model_card(rec: dict[str, Any]) -> str:
    """MODEL_CARD.md from the training log through ``tools/model_card.md.tmpl``.

    The prose lives in the template so it can be read and edited as Markdown; ``substitute``
    (not ``safe_substitute``) makes a field the template names but the log lacks an error.
    """
    text = string.Template(CARD_TEMPLATE.read_text(encoding="utf-8")).substitute(card_fields(rec))
    return text.rstrip("\n") + "\n"


def write_model_card(path: Path, rec: dict[str, Any]) -> None:
    """Render MODEL_CARD.md from the training log so the two can never disagree."""
    atomic_write_bytes(path, render_model_card(rec).encode())


# --------------------------------------------------------------------------------------------
# main pipeline
# --------------------------------------------------------------------------------------------


def resolve_corpus(given: Path | None) -> Path:
    """``--corpus`` or ``$TRTSPEC_DATA/tinyshakespeare.txt``; without one, exit 2 saying what to fetch.

    The corpus is not in the repository (only the weights trained on it are), so a missing file is
    the first thing a re-run meets: one line naming the download beats a traceback.
    """
    if given is not None and given.is_file():
        return given
    try:
        if given is not None:
            raise UsageError(f"{given} not found: save {PUBLIC_SETS[CORPUS_NAME]} as {CORPUS_NAME} in $TRTSPEC_DATA")
        return data_file(CORPUS_NAME)
    except UsageError as exc:
        print(f"{SCRIPT}: {exc} (or pass --corpus PATH)", file=sys.stderr)
        raise SystemExit(2) from None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options; every one is recorded in the log's ``hparams`` so a run can be repeated."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", type=Path, default=None, help=f"default: $TRTSPEC_DATA/{CORPUS_NAME} (Tiny Shakespeare)")
    p.add_argument("--out", type=Path, required=True, help="gets tiny-target/, tiny-draft/, training_log.json, card")
    p.add_argument(
        "--ckpt-dir",
        type=Path,
        default=None,
        help="resumable checkpoints, kept out of the repo (default: ~/.cache/trtspec-train/seedN)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--vocab-size", type=int, default=2048)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=1000, help="joint target+MTP steps")
    p.add_argument("--mtp-steps", type=int, default=300, help="MTP-only distillation steps (0 to skip)")
    p.add_argument("--draft-steps", type=int, default=1200)
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--mtp-lr", type=float, default=1e-3)
    p.add_argument("--draft-lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--mtp-lambda", type=float, default=0.3)
    p.add_argument("--mtp-lambda-late", type=float, default=0.1)
    p.add_argument("--lambda-switch", type=float, default=0.7, help="fraction of joint steps after which lambda drops")
    p.add_argument("--mtp-ce-weight", type=float, default=0.1)
    p.add_argument("--draft-ce-weight", type=float, default=0.0)
    p.add_argument("--pool-seqs", type=int, default=256, help="target T=1 samples used by the MTP and draft phases")
    p.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto")
    p.add_argument("--ckpt-every", type=int, default=100)
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--no-sizing", action="store_true", help="skip the pre-training timing sweep")
    p.add_argument(
        "--card-only",
        action="store_true",
        help="only re-render MODEL_CARD.md in --out from its training_log.json (after a template edit); no training",
    )
    return p.parse_args(argv)


# The shapes the sizing sweep chose (d_model, layers, heads, KV heads, ffn); the card explains why.
TARGET_SHAPE = (384, 6, 6, 2, 1024)
DRAFT_SHAPE = (192, 2, 3, 3, 512)
MTP_DEPTH = 2


@dataclass
class Corpus:
    """The corpus bytes and its train/validation split (the card quotes sizes, hash and offset)."""

    path: Path
    raw: bytes
    text: str
    train_text: str
    val_text: str
    offset: int


@dataclass
class Tokens:
    """The trained tokenizer's directory and facts, and both splits encoded with it."""

    tok_dir: Path
    info: dict[str, Any]
    train_ids: torch.Tensor
    val_ids: torch.Tensor


def configure_torch(args: argparse.Namespace) -> None:
    """Fix threads, seed and kernels first: the run is only reproducible for a given seed and thread count."""
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)  # denormals in AdamW state made fp32 steps several times slower here
    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True, warn_only=True)


def checkpoint_dir(args: argparse.Namespace) -> Path:
    """Resumable checkpoints live outside the repository (they are large and never shipped)."""
    ckpt_dir: Path = args.ckpt_dir or Path.home() / ".cache" / "trtspec-train" / f"seed{args.seed}"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    return ckpt_dir


def read_corpus(path: Path) -> Corpus:
    """Read and split the corpus once; the raw bytes are kept for the hash the log records."""
    raw = path.read_bytes()
    text = raw.decode("utf-8")
    train_text, val_text, offset = split_corpus(text)
    log("corpus", chars=len(text), val_offset=offset)
    return Corpus(path, raw, text, train_text, val_text, offset)


def build_tokenizer(corpus: Corpus, ckpt_dir: Path, args: argparse.Namespace) -> Tokens:
    """Train, write and round-trip-check the tokenizer on the training split, then encode both splits."""
    tok_dir = ckpt_dir / "tokenizer"
    tok = train_tokenizer(corpus.train_text, args.vocab_size)
    write_tokenizer(tok, tok_dir, args.seq_len)
    info = check_tokenizer(tok_dir, corpus.val_text)
    info["vocab_size"] = tok.get_vocab_size()
    train_ids = torch.tensor(tok.encode(corpus.train_text, add_special_tokens=False).ids, dtype=torch.long)
    val_ids = torch.tensor(tok.encode(corpus.val_text, add_special_tokens=False).ids, dtype=torch.long)
    log(
        "tokenizer",
        vocab=info["vocab_size"],
        train_tokens=len(train_ids),
        val_tokens=len(val_ids),
        chars_per_token=info["chars_per_token"],
    )
    return Tokens(tok_dir, info, train_ids, val_ids)


def choose_precision(target: TargetWithMTP, train_ids: torch.Tensor, args: argparse.Namespace) -> dict[str, float]:
    """Measure bf16 against fp32 train steps and set ``args.precision_used`` (``auto``: the faster one).

    bf16 only wins on CPUs with bf16 units, so it is measured on this machine rather than assumed.
    """
    throughput = measure_train_throughput(target, train_ids, args)
    if args.precision == "auto":
        args.precision_used = "bf16" if throughput["bf16"] > throughput["fp32"] else "fp32"
    else:
        args.precision_used = args.precision
    log("precision", used=args.precision_used)
    return throughput


def train_joint(
    target: TargetWithMTP, train_ids: torch.Tensor, args: argparse.Namespace, ckpt_dir: Path
) -> dict[str, Any]:
    """Phase 1: trunk and MTP layers together on corpus text, then the trunk rounded to bf16.

    The rounding comes before the MTP and draft phases so they fit the trunk exactly as shipped.
    """
    handles = add_residual_dropout(target.trunk, args.dropout)
    switch = int(args.steps * args.lambda_switch)
    state = train_phase(
        "joint",
        target,
        list(target.parameters()),
        lambda ids, step: joint_loss(target, ids, args.mtp_lambda if step < switch else args.mtp_lambda_late),
        lambda g: random_windows(train_ids, args.batch_size, args.seq_len, g),
        args.steps,
        args.lr,
        args,
        args.seed + 1,
        ckpt_dir,
    )
    for h in handles:
        h.remove()
    target.eval()
    bf16_roundtrip(target.trunk)  # the shipped trunk is bf16: fit MTP and draft to exactly that
    return state


def target_sample_pool(
    target: TargetWithMTP, train_ids: torch.Tensor, args: argparse.Namespace, ckpt_dir: Path
) -> torch.Tensor:
    """The target's own T=1 text (cached in ``ckpt_dir``): what MTP and draft are fitted on, since
    it is the text speculative decoding drafts for."""
    pool_path = ckpt_dir / "pool.pt"
    if pool_path.exists():
        return torch.load(pool_path)
    t0 = time.time()
    g = torch.Generator().manual_seed(args.seed + 2)
    chunks = []
    for _ in range(0, args.pool_seqs, 64):
        prompts = random_windows(train_ids, 64, 32, g)
        chunks.append(sample_from_target(target.trunk, prompts, args.seq_len, g))
    pool = torch.cat(chunks)[: args.pool_seqs]
    atomic_torch_save(pool, pool_path)
    log("pool", seqs=len(pool), wall_s=time.time() - t0)
    return pool


def mixed_batches(
    pool: torch.Tensor, train_ids: torch.Tensor, args: argparse.Namespace
) -> Callable[[torch.Generator], torch.Tensor]:
    """Half corpus windows, half target samples: on-policy text without forgetting the corpus."""

    def batch(g: torch.Generator) -> torch.Tensor:
        half = args.batch_size // 2
        rows = torch.randint(0, len(pool), (args.batch_size - half,), generator=g)
        return torch.cat([random_windows(train_ids, half, args.seq_len, g), pool[rows]])

    return batch


def train_mtp(
    target: TargetWithMTP,
    batches: Callable[[torch.Generator], torch.Tensor],
    args: argparse.Namespace,
    ckpt_dir: Path,
) -> dict[str, Any]:
    """Phase 2: the trunk frozen, the MTP layers fitted to its distributions; then all rounded to bf16."""
    for p in target.trunk.parameters():
        p.requires_grad_(False)
    state: dict[str, Any] = {"wall_s": 0.0, "history": []}
    if args.mtp_steps > 0:
        state = train_phase(
            "mtp",
            target,
            list(target.mtp.parameters()),
            lambda ids, step: mtp_kl_loss(target, ids, args.mtp_ce_weight),
            batches,
            args.mtp_steps,
            args.mtp_lr,
            args,
            args.seed + 3,
            ckpt_dir,
        )
    target.eval()
    bf16_roundtrip(target)
    return state


def train_draft(
    target: TargetWithMTP,
    d_cfg: LlamaConfig,
    batches: Callable[[torch.Generator], torch.Tensor],
    args: argparse.Namespace,
    ckpt_dir: Path,
) -> tuple[LlamaForCausalLM, dict[str, Any]]:
    """Phase 3: the draft distilled from the finished target, then rounded to bf16 as shipped."""
    torch.manual_seed(args.seed + 4)
    draft = LlamaForCausalLM(d_cfg)
    state = train_phase(
        "draft",
        draft,
        list(draft.parameters()),
        lambda ids, step: draft_loss(target.trunk, draft, ids, args.draft_ce_weight),
        batches,
        args.draft_steps,
        args.draft_lr,
        args,
        args.seed + 5,
        ckpt_dir,
    )
    draft.eval()
    bf16_roundtrip(draft)
    return draft, state


def save_models(
    out: Path,
    target: TargetWithMTP,
    draft: LlamaForCausalLM,
    t_cfg: LlamaConfig,
    d_cfg: LlamaConfig,
    tok_dir: Path,
) -> tuple[Path, Path]:
    """Write ``tiny-target/`` and ``tiny-draft/``; the pair must share byte-identical tokenizer files."""
    target_dir, draft_dir = out / "tiny-target", out / "tiny-draft"
    save_checkpoint_dir(target_dir, target_tensors(target), t_cfg, {"num_nextn_predict_layers": MTP_DEPTH}, tok_dir)
    d_tensors = {
        k: v.detach().to(torch.bfloat16).contiguous().clone()
        for k, v in draft.state_dict().items()
        if k != "lm_head.weight"
    }
    save_checkpoint_dir(draft_dir, d_tensors, d_cfg, {}, tok_dir)
    for f in TOKENIZER_FILES:
        assert (target_dir / f).read_bytes() == (draft_dir / f).read_bytes()
    return target_dir, draft_dir


def verify_saved(
    target_dir: Path, draft_dir: Path, target: TargetWithMTP, draft: LlamaForCausalLM, val_ids: torch.Tensor
) -> dict[str, Any]:
    """Reload what was written and compare logits with the in-memory models: the files are what ships."""
    probe = torch.stack(fixed_windows(val_ids, 64, limit=2))
    verification = verify_target_dir(target_dir, target, probe)
    hf_draft = LlamaForCausalLM.from_pretrained(str(draft_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        verification["max_abs_logit_diff_draft"] = (hf_draft(probe).logits - draft(probe).logits).abs().max().item()
    assert verification["max_abs_logit_diff_draft"] < 1e-3
    log("verified", **verification)
    return verification


def evaluate_all(
    target: TargetWithMTP, draft: LlamaForCausalLM, tokens: Tokens, args: argparse.Namespace
) -> dict[str, Any]:
    """Losses and agreement on held-out text, an equal-sized train subset and the target's own samples
    (the last is closest to what the draft sees while speculating)."""
    val_windows = fixed_windows(tokens.val_ids, args.seq_len)
    train_windows = fixed_windows(tokens.train_ids, args.seq_len, limit=len(val_windows))
    g = torch.Generator().manual_seed(args.seed + 6)
    val_prompts = torch.stack([w[:32] for w in val_windows[:16]])
    gen_eval = sample_from_target(target.trunk, val_prompts, args.seq_len, g)
    ev = {
        "validation": evaluate(target, draft, val_windows),
        "train_subset": evaluate(target, draft, train_windows),
        "target_samples": evaluate(target, draft, list(gen_eval)),
        "target_samples_info": (
            f"{len(gen_eval)} sequences sampled from the shipped target at T=1, "
            f"{args.seq_len} tokens each, prompted with the first 31 tokens of validation windows"
        ),
    }
    for k, v in ev.items():
        if isinstance(v, dict):
            log(f"eval {k}", **v)
    return ev


def time_shipped(target_dir: Path, draft_dir: Path, target: TargetWithMTP) -> dict[str, Any]:
    """Per-token times of the shipped models in fp32, as a CPU runner would hold them."""
    timing = {
        "ctx": 256,
        "target": decode_ms(LlamaForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32)),
        "draft": decode_ms(LlamaForCausalLM.from_pretrained(str(draft_dir), dtype=torch.float32)),
        "mtp_step_matvec_ms": mtp_matvec_ms(target),
    }
    log("timing", **{f"{k}_{m}": v for k, d in timing.items() if isinstance(d, dict) for m, v in d.items()})
    return timing


def corpus_record(corpus: Corpus, tokens: Tokens) -> dict[str, Any]:
    """The corpus by name, size, hash and split offset: enough to re-derive the split, nothing shipped."""
    return {
        "file": corpus.path.name,
        "chars": len(corpus.text),
        "bytes": len(corpus.raw),
        "sha256": hashlib.sha256(corpus.raw).hexdigest(),
        "val_offset": corpus.offset,
        "val_offset_note": "character offset == byte offset (ASCII); validation = text[val_offset:]",
        "train_chars": len(corpus.train_text),
        "val_chars": len(corpus.val_text),
        "train_tokens": len(tokens.train_ids),
        "val_tokens": len(tokens.val_ids),
        "shipped": False,
    }


def models_record(
    target: TargetWithMTP, draft: LlamaForCausalLM, target_dir: Path, draft_dir: Path, vocab: int
) -> dict[str, Any]:
    """Configs as written, parameter counts and file sizes of the shipped pair."""
    return {
        "target": {
            "config": json.loads((target_dir / "config.json").read_text()),
            "params_trunk": count_params(target.trunk),
            "params_mtp": count_params(target.mtp),
            "params_mtp_copies": 2 * MTP_DEPTH * vocab * target.trunk.config.hidden_size,
            "bytes": (target_dir / "model.safetensors").stat().st_size,
        },
        "draft": {
            "config": json.loads((draft_dir / "config.json").read_text()),
            "params": count_params(draft),
            "bytes": (draft_dir / "model.safetensors").stat().st_size,
        },
    }


def phase_record(args: argparse.Namespace, state: dict[str, Any], steps: int, lr: float, notes: str) -> dict[str, Any]:
    """One phase's settings, wall time and loss history, as the card's training table reads them."""
    return {
        "steps": steps,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "peak_lr": lr,
        "wall_s": state.get("wall_s", 0.0),
        "final_train_ema": state.get("final_ema", {}),
        "history": state.get("history", []),
        "notes": notes,
    }


def phases_record(
    args: argparse.Namespace, joint: dict[str, Any], mtp: dict[str, Any], draft: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """The three phases in training order, each with the one-line summary the card's table shows."""
    return {
        "joint": phase_record(
            args, joint, args.steps, args.lr, f"target + 2 MTP layers, CE + λ/2 ΣCE_k, dropout {args.dropout}"
        ),
        "mtp": phase_record(args, mtp, args.mtp_steps, args.mtp_lr, "trunk frozen, MTP layers only, KL to trunk"),
        "draft": phase_record(args, draft, args.draft_steps, args.draft_lr, "KL(target‖draft) at T=1"),
    }


def machine_record(args: argparse.Namespace) -> dict[str, Any]:
    """Where the timings were taken: they only mean something next to the machine and versions."""
    return {
        "cpu": platform.processor() or platform.machine(),
        "threads": args.threads,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def hparams_record(args: argparse.Namespace) -> dict[str, Any]:
    """The arguments as run; a defaulted corpus is named by its variable, not by this machine's path."""
    rec = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    if args.corpus is None:
        rec["corpus"] = f"$TRTSPEC_DATA/{CORPUS_NAME}"
    return rec


def assets_bytes(out: Path) -> int:
    """Size of everything under ``--out`` that ships (the card states it against the size budget)."""
    return sum(
        p.stat().st_size
        for p in out.rglob("*")
        if p.is_file() and not p.name.endswith((".tmp", ".pyc")) and "__pycache__" not in p.parts
    )


def write_log_and_card(out: Path, record: dict[str, Any]) -> None:
    """Write training_log.json and MODEL_CARD.md, then again with the assets' total size in them.

    The total includes the log and card themselves, so it is measured after writing them; three
    passes settle it (the log's own size barely moves).
    """
    log_path, card_path = out / "training_log.json", out / "MODEL_CARD.md"
    record["bytes_assets_total"] = 0
    for _ in range(3):
        atomic_write_json(log_path, record)
        write_model_card(card_path, record)
        record["bytes_assets_total"] = assets_bytes(out)
    atomic_write_json(log_path, record)
    write_model_card(card_path, record)


def main(argv: list[str] | None = None) -> None:
    """Tokenizer, three training phases, save, verify, evaluate, time, then the log and card."""
    args = parse_args(argv)
    if args.card_only:
        rec = json.loads((args.out / "training_log.json").read_text(encoding="utf-8"))
        write_model_card(args.out / "MODEL_CARD.md", rec)
        return
    corpus_path = resolve_corpus(args.corpus)
    t_total = time.time()
    configure_torch(args)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    ckpt_dir = checkpoint_dir(args)

    corpus = read_corpus(corpus_path)
    tokens = build_tokenizer(corpus, ckpt_dir, args)
    vocab = tokens.info["vocab_size"]
    t_cfg = llama_config(vocab, *TARGET_SHAPE, args.seq_len)
    d_cfg = llama_config(vocab, *DRAFT_SHAPE, args.seq_len)

    sweep = {} if args.no_sizing else sizing_sweep(vocab, args.seq_len)
    torch.manual_seed(args.seed)
    target = TargetWithMTP(t_cfg, MTP_DEPTH)
    throughput = choose_precision(target, tokens.train_ids, args)

    joint = train_joint(target, tokens.train_ids, args, ckpt_dir)
    batches = mixed_batches(target_sample_pool(target, tokens.train_ids, args, ckpt_dir), tokens.train_ids, args)
    mtp_state = train_mtp(target, batches, args, ckpt_dir)
    draft, draft_state = train_draft(target, d_cfg, batches, args, ckpt_dir)

    target_dir, draft_dir = save_models(out, target, draft, t_cfg, d_cfg, tokens.tok_dir)
    verification = verify_saved(target_dir, draft_dir, target, draft, tokens.val_ids)
    ev = evaluate_all(target, draft, tokens, args)
    timing = time_shipped(target_dir, draft_dir, target)
    samples = greedy_samples(target_dir, 80)

    record: dict[str, Any] = {
        "command": f"python {SCRIPT} " + " ".join(sys.argv[1:] if argv is None else argv),
        "seed": args.seed,
        "machine": machine_record(args),
        "corpus": corpus_record(corpus, tokens),
        "tokenizer": tokens.info,
        "models": models_record(target, draft, target_dir, draft_dir, vocab),
        "precision": args.precision_used,
        "train_throughput": throughput,
        "sizing_sweep": sweep,
        "hparams": hparams_record(args),
        "phases": phases_record(args, joint, mtp_state, draft_state),
        "verification": verification,
        "eval": ev,
        "timing_fp32_2threads": timing,
        "greedy_samples": samples,
    }
    record["total_wall_s"] = time.time() - t_total
    write_log_and_card(out, record)
    log("done", total_min=record["total_wall_s"] / 60, assets_bytes=record["bytes_assets_total"])


if __name__ == "__main__":
    main()
