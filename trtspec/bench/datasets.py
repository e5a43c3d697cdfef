"""The requests a bench sends: synthetic prompts exact in the model's tokens, or prompt files.

Synthetic prompts are windows of a corpus (or of random vocabulary tokens when none is given),
decoded and re-encoded until the server's tokenizer gives exactly the drawn length: a prompt
"of 128 tokens" that the server sees as 131 makes every ISL in the report wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from trtspec.errors import UsageError
from trtspec.prompts import load_prompts


@dataclass(frozen=True)
class BenchPrompt:
    text: str
    category: str
    input_tokens: int
    output_tokens: int | None  # the requested (fixed) output length, or None for the bench default


@dataclass(frozen=True)
class LengthSpec:
    """A token-length distribution: normal with mean and std, clipped to [1, mean + 4 std]."""

    mean: int
    std: float = 0.0

    def draw(self, rng: np.random.Generator, count: int) -> list[int]:
        values = np.rint(rng.normal(self.mean, self.std, size=count)) if self.std > 0 else np.full(count, self.mean)
        return [int(v) for v in np.clip(values, 1, self.mean + 4 * self.std + 1)]


@lru_cache(maxsize=4)
def load_tokenizer(ref: str):
    """The model's tokenizer (a directory or a hub id), loaded once per process."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(ref)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{ref}: cannot load a tokenizer: {str(exc).splitlines()[0]}") from None


def count_tokens(tokenizer, text: str) -> int:
    """What the server counts: the tokenizer's ids for the prompt, special tokens included."""
    return len(tokenizer(text).input_ids)


def _exact_window(tokenizer, source: list[int], length: int, rng: np.random.Generator) -> str:
    special = len(tokenizer("").input_ids)  # BOS and the like, which the server adds too
    want = length - special
    if want < 1:
        raise UsageError(f"synthetic input length {length} leaves no room after {special} special tokens")
    for _ in range(20):
        start = int(rng.integers(0, max(1, len(source) - 4 * want)))
        take = want
        for _ in range(8):
            text = tokenizer.decode(source[start : start + take], skip_special_tokens=True)
            got = count_tokens(tokenizer, text)
            if got == length:
                return text
            take += length - got
            if take < 1 or start + take > len(source):
                break
    raise UsageError(f"could not build a prompt of exactly {length} tokens from the corpus")


def synthetic(
    tokenizer,
    count: int,
    input_len: LengthSpec,
    output_len: LengthSpec,
    corpus: Path | None = None,
    seed: int = 0,
) -> list[BenchPrompt]:
    rng = np.random.default_rng(seed)
    if corpus is not None:
        try:
            source = tokenizer(corpus.read_text(encoding="utf-8"), add_special_tokens=False).input_ids
        except OSError as exc:
            raise UsageError(f"{corpus}: cannot read: {exc}") from None
    else:
        specials = set(tokenizer.all_special_ids)
        vocab = [i for i in range(len(tokenizer)) if i not in specials]
        source = [int(t) for t in rng.choice(vocab, size=max(4096, 8 * input_len.mean))]
    inputs, outputs = input_len.draw(rng, count), output_len.draw(rng, count)
    return [
        BenchPrompt(_exact_window(tokenizer, source, n, rng), "synthetic", n, m)
        for n, m in zip(inputs, outputs, strict=True)
    ]


def from_file(
    tokenizer, path: Path, output_tokens: int | None, limit: int | None = None, per_category: int | None = None
) -> list[BenchPrompt]:
    """Spec-Bench JSONL (category kept for per-category results), plain JSONL or one prompt per line."""
    return [
        BenchPrompt(p.text, p.category, count_tokens(tokenizer, p.text), output_tokens)
        for p in load_prompts(path, limit=limit, per_category=per_category)
    ]
