"""Tokenizer identity between draft and target, from the tokenizer files alone.

Speculation verifies draft token ids against the target's distribution, so the two tokenizers must
agree on every id the draft can produce: the token-to-id map, the merges, the special tokens and
the added tokens. A vocabulary padded to a different size (Qwen2.5 small vs large) is harmless only
if no token maps into the ids that exist in one model but not the other.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtspec.checkpoints.inspect import CheckpointInfo

SPECIAL_ROLES = ("bos_token", "eos_token", "pad_token", "unk_token")
RAW_TOKENIZER_FILES = ("tokenizer.model", "vocab.json", "merges.txt", "tiktoken.model")


@dataclass
class TokenizerView:
    vocab: dict[str, int] | None
    merges: list | None
    added: dict[str, int]
    special_ids: dict[str, int | None]
    raw_digest: dict[str, str]

    @property
    def max_id(self) -> int:
        ids = list((self.vocab or {}).values()) + list(self.added.values())
        return max(ids) if ids else -1


def _special_content(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def view(info: CheckpointInfo) -> TokenizerView:
    tok = info.tokenizer.get("tokenizer.json") or {}
    model = tok.get("model") or {}
    vocab = model.get("vocab")
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...] in id order
        vocab = {piece[0]: i for i, piece in enumerate(vocab)}
    added = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    cfg = info.tokenizer.get("tokenizer_config.json") or {}
    for key, entry in (cfg.get("added_tokens_decoder") or {}).items():
        added.setdefault(entry.get("content"), int(key))
    special_map = info.tokenizer.get("special_tokens_map.json") or {}
    lookup = {**(vocab or {}), **added}
    special_ids: dict[str, int | None] = {}
    for role in SPECIAL_ROLES:
        content = _special_content(cfg.get(role)) or _special_content(special_map.get(role))
        special_ids[role] = lookup.get(content) if content is not None else None
    digests = {}
    for name in RAW_TOKENIZER_FILES:
        path: Path = info.path / name
        if path.is_file():
            digests[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return TokenizerView(vocab, model.get("merges"), added, special_ids, digests)


@dataclass
class TokenizerDiff:
    comparable: bool  # False: neither tokenizer.json nor raw files to compare
    vocab_differences: list[str]
    merges_differ: bool
    added_differences: list[str]
    special_differences: list[str]
    raw_differences: list[str]
    target_max_id: int
    draft_max_id: int

    @property
    def identical(self) -> bool:
        return self.comparable and not (
            self.vocab_differences
            or self.merges_differ
            or self.added_differences
            or self.special_differences
            or self.raw_differences
        )


def _map_diff(a: dict[str, int], b: dict[str, int], limit: int = 5) -> list[str]:
    out = []
    for token in sorted(set(a) | set(b), key=lambda t: (a.get(t, b.get(t, -1)), t)):
        if a.get(token) != b.get(token):
            out.append(f"{token!r}: target {a.get(token)} vs draft {b.get(token)}")
            if len(out) == limit:
                break
    return out


def compare(target: CheckpointInfo, draft: CheckpointInfo) -> TokenizerDiff:
    t, d = view(target), view(draft)
    comparable = (t.vocab is not None and d.vocab is not None) or bool(set(t.raw_digest) & set(d.raw_digest))
    vocab_diff = _map_diff(t.vocab, d.vocab) if t.vocab is not None and d.vocab is not None else []
    merges_differ = t.merges is not None and d.merges is not None and t.merges != d.merges
    special = [
        f"{role}: target id {t.special_ids[role]} vs draft id {d.special_ids[role]}"
        for role in SPECIAL_ROLES
        if t.special_ids[role] != d.special_ids[role]
    ]
    raw = [name for name in set(t.raw_digest) & set(d.raw_digest) if t.raw_digest[name] != d.raw_digest[name]]
    return TokenizerDiff(
        comparable, vocab_diff, merges_differ, _map_diff(t.added, d.added), special, sorted(raw), t.max_id, d.max_id
    )
