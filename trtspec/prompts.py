"""Prompt files: JSONL (Spec-Bench rows with category and turns, or rows with a prompt/text field) or
plain text with one prompt per line. Shared by `plan` and `bench` so both read the same datasets."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trtspec.assets import ASSETS_DIR
from trtspec.errors import UsageError

# Twelve openings from three kinds of play, the register the embedded pair was trained on: `plan` and
# the demo run on them when no prompts file is given, so both work on a fresh install.
BUILTIN_PROMPTS = ASSETS_DIR / "demo_prompts.jsonl"
TEXT_FIELDS = ("prompt", "text", "question", "input")


@dataclass(frozen=True)
class Prompt:
    text: str
    category: str = "all"
    id: str = ""


def _from_row(row: dict, where: str) -> Prompt:
    if isinstance(row.get("turns"), list) and row["turns"]:
        text = row["turns"][0]  # Spec-Bench / MT-bench: the first user turn
    else:
        text = next((row[f] for f in TEXT_FIELDS if isinstance(row.get(f), str)), None)
    if not isinstance(text, str) or not text.strip():
        raise UsageError(f"{where}: no prompt text (expected 'turns' or one of {', '.join(TEXT_FIELDS)})")
    ident = row.get("question_id", row.get("id", ""))
    return Prompt(text, str(row.get("category", "all")), str(ident))


def load_prompts(path: str | Path, limit: int | None = None, per_category: int | None = None) -> list[Prompt]:
    """Read prompts; `per_category` keeps the first N of each category, in file order."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UsageError(f"{path}: no such prompts file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read: {exc}") from None
    prompts: list[Prompt] = []
    is_jsonl = path.suffix in (".jsonl", ".json") or (lines and lines[0].lstrip().startswith("{"))
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if is_jsonl:
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise UsageError(f"{path}:{number}: invalid JSON: {exc.msg}") from None
            if not isinstance(row, dict):
                raise UsageError(f"{path}:{number}: expected a JSON object")
            prompts.append(_from_row(row, f"{path}:{number}"))
        else:
            prompts.append(Prompt(line.replace("\\n", "\n"), "all", str(number)))
    if per_category is not None:
        seen: dict[str, int] = {}
        kept = []
        for p in prompts:
            if seen.get(p.category, 0) < per_category:
                kept.append(p)
                seen[p.category] = seen.get(p.category, 0) + 1
        prompts = kept
    if limit is not None:
        prompts = prompts[:limit]
    if not prompts:
        raise UsageError(f"{path}: no prompts")
    return prompts
