"""What a checkpoint directory holds, read from its metadata only (config.json, weight index or
safetensors headers, tokenizer files): a 70B check must take a second, not a weight load."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtspec.errors import UsageError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@dataclass
class CheckpointInfo:
    path: Path
    config: dict[str, Any]
    weight_names: set[str] | None  # None: no index or headers readable
    tokenizer: dict[str, Any] = field(default_factory=dict)  # file name -> parsed JSON

    @property
    def architecture(self) -> str:
        return (self.config.get("architectures") or ["?"])[0]


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: corrupt JSON: {exc}") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc}") from None


def read_hf_config(path: Path) -> dict[str, Any]:
    """config.json of a checkpoint directory, with a one-line error when absent or corrupt."""
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise UsageError(f"{path}: not a Hugging Face checkpoint (no config.json)")
    config = _read_json(cfg_path)
    if not isinstance(config, dict):
        raise UsageError(f"{cfg_path}: not a JSON object, so no model config")
    return config


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a .safetensors file (names, dtypes, shapes) without reading tensors."""
    with path.open("rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise UsageError(f"{path}: corrupt safetensors file (shorter than its header length)")
        (size,) = struct.unpack("<Q", raw)
        if size > 100 * 2**20:
            raise UsageError(f"{path}: corrupt safetensors file (header of {size} bytes)")
        try:
            header = json.loads(fh.read(size))
        except json.JSONDecodeError:
            raise UsageError(f"{path}: corrupt safetensors header") from None
    header.pop("__metadata__", None)
    try:  # a copy cut short keeps its header: the tensors it describes must all be there
        expected = 8 + size + max((entry["data_offsets"][1] for entry in header.values()), default=0)
    except (TypeError, KeyError, IndexError):
        raise UsageError(f"{path}: corrupt safetensors header (no data_offsets)") from None
    if (actual := path.stat().st_size) < expected:
        raise UsageError(f"{path}: truncated safetensors file ({actual} bytes; its header describes {expected})")
    return header


def weight_names(path: Path) -> set[str] | None:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        return set(_read_json(index).get("weight_map", {}))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        return None
    names: set[str] = set()
    for f in files:
        names |= set(safetensors_header(f))
    return names


def read_checkpoint(path: Path) -> CheckpointInfo:
    if not path.is_dir():
        raise UsageError(f"{path}: no such checkpoint directory")
    config = read_hf_config(path)
    tokenizer = {name: _read_json(path / name) for name in TOKENIZER_FILES if (path / name).is_file()}
    return CheckpointInfo(path, config, weight_names(path), tokenizer)


def pre_quantized(info: CheckpointInfo) -> bool:
    """A checkpoint that carries its own quantization (ModelOpt's hf_quant_config.json, or a
    quantization_config in config.json): what the LLM API reads, since it quantizes nothing itself."""
    return "quantization_config" in info.config or (info.path / "hf_quant_config.json").is_file()


EMBEDDING = "model.embed_tokens.weight"
VOCAB_ROWS_FIX = "use the config.json that came with these weights (or weights for this vocabulary)"


def vocab_rows_message(path: Path, vocab_size: object, weight: str, rows: int, file: Path | str) -> str:
    """One line: config.json's vocab_size disagrees with the rows of an embedding or head in the weights."""
    return f"{path / 'config.json'}: vocab_size {vocab_size} but {weight} in {file} has {rows} rows"


def vocab_rows_mismatch(path: Path, config: dict[str, Any]) -> str | None:
    """`vocab_rows_message` when the embedding's rows (from safetensors headers, no weights read) are
    not config.json's vocab_size; None when they agree or the headers are not here to read."""
    vocab = config.get("vocab_size")
    if vocab is None:
        return None
    index = path / "model.safetensors.index.json"
    if index.is_file():
        shard = _read_json(index).get("weight_map", {}).get(EMBEDDING)
        files = [path / shard] if isinstance(shard, str) else []
    else:
        files = sorted(path.glob("*.safetensors"))
    for file in files:
        if not file.is_file():
            return None  # an index without its shards (metadata-only copies): nothing to compare
        entry = safetensors_header(file).get(EMBEDDING)
        shape = entry.get("shape") if isinstance(entry, dict) else None
        if shape:
            return None if shape[0] == vocab else vocab_rows_message(path, vocab, EMBEDDING, shape[0], file.name)
    return None


def refuse_vocab_rows_mismatch(path: Path) -> None:
    """UsageError before anything loads weights whose embedding does not fit config.json's vocab_size."""
    if problem := vocab_rows_mismatch(path, read_hf_config(path)):
        raise UsageError(f"{problem}: {VOCAB_ROWS_FIX}")
