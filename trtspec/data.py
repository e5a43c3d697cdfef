"""The public data sets benchmarks and training read, by path: never shipped, never needed by tests.

They live in one directory named by TRTSPEC_DATA (CI sets it); a missing one stops the run with a
line saying where to fetch it.
"""

from __future__ import annotations

import os
from pathlib import Path

from trtspec.errors import UsageError

DATA_ENV = "TRTSPEC_DATA"
PUBLIC_SETS = {
    "spec_bench_questions.jsonl": "Spec-Bench's questions, data/spec_bench/question.jsonl of https://github.com/hemingkx/Spec-Bench",
    "tinyshakespeare.txt": "Tiny Shakespeare, https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
}


def data_file(name: str) -> Path:
    """$TRTSPEC_DATA/name, or a one-line UsageError naming the set and where it comes from."""
    where = os.environ.get(DATA_ENV)
    path = Path(where) / name if where else None
    if path is None or not path.is_file():
        found = f"{path} not found" if path else f"{DATA_ENV} is not set"
        raise UsageError(f"{found}: save {PUBLIC_SETS[name]} as {name} in the directory ${DATA_ENV} names")
    return path
