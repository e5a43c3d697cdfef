"""engines/NAME/manifest.json: what a build used, ran and produced, so a re-run knows what is current.

A step is current when its recorded key (a hash of every input it depends on) equals the key the
config gives now and its output directory exists. The manifest is rewritten atomically after every
step, so an interrupted build keeps the steps it finished.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trtspec import __version__
from trtspec.fsutil import atomic_write_text

MANIFEST = "manifest.json"
FULL_HASH_LIMIT = 1 << 30  # files up to 1 GiB are hashed whole; larger ones by size, mtime and both ends
EDGE_BYTES = 1 << 20


def _file_digest(path: Path) -> str:
    size = path.stat().st_size
    h = hashlib.sha256()
    with path.open("rb") as fh:
        if size <= FULL_HASH_LIMIT:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
            return h.hexdigest()
        h.update(fh.read(EDGE_BYTES))  # a safetensors header (names, shapes, offsets) sits at the start
        fh.seek(size - EDGE_BYTES)
        h.update(fh.read(EDGE_BYTES))
    h.update(f"{size}:{path.stat().st_mtime_ns}".encode())
    return "partial:" + h.hexdigest()


def fingerprint(checkpoint: str, path: Path | None) -> dict[str, Any]:
    """A checkpoint's identity: every file's digest for a local directory, the id for a hub model."""
    if path is None:
        return {"ref": checkpoint, "hub_id": checkpoint, "digest": hashlib.sha256(checkpoint.encode()).hexdigest()}
    files = {
        str(p.relative_to(path)): _file_digest(p)
        for p in sorted(path.rglob("*"))
        if p.is_file() and not p.name.startswith(".") and "__pycache__" not in p.parts
    }
    digest = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    return {"ref": checkpoint, "path": str(path), "files": len(files), "digest": digest}


def step_key(inputs: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


def tool_versions() -> dict[str, str | None]:
    import importlib.metadata as md

    def version(dist: str) -> str | None:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return None

    return {
        "trtspec": __version__,
        "python": platform.python_version(),
        "torch": version("torch"),
        "transformers": version("transformers"),
        "tensorrt_llm": version("tensorrt_llm") or version("tensorrt-llm"),
    }


@dataclass
class CommandRecord:
    argv: list[str]
    exit_code: int
    duration_s: float
    log: str


@dataclass
class StepRecord:
    key: str
    output: str
    inputs: dict[str, Any]
    commands: list[CommandRecord] = field(default_factory=list)
    duration_s: float = 0.0
    finished_at: str = ""
    files: dict[str, int] | None = None  # every file the output held when built, by its size (None: not recorded)


def output_files(output: Path) -> dict[str, int]:
    """The files under a step's output and their sizes: a file deleted or cut short since is a step to rebuild."""
    if output.is_file():
        return {".": output.stat().st_size}
    return {str(p.relative_to(output)): p.stat().st_size for p in sorted(output.rglob("*")) if p.is_file()}


@dataclass
class Manifest:
    name: str
    backend: str
    mode: str
    config_sha256: str = ""
    config_path: str | None = None
    tools: dict[str, str | None] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    steps: dict[str, StepRecord] = field(default_factory=dict)
    num_draft_tokens: int | None = None
    serving: dict[str, Any] = field(default_factory=dict)  # trade-offs the repository is generated with

    @classmethod
    def load(cls, engine_dir: Path) -> Manifest | None:
        path = engine_dir / MANIFEST
        if not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            steps = {
                name: StepRecord(**{**s, "commands": [CommandRecord(**c) for c in s.get("commands", [])]})
                for name, s in data.pop("steps", {}).items()
            }
            data.pop("outputs", None)
            data.pop("updated_at", None)
            return cls(**data, steps=steps)
        except (ValueError, TypeError):
            return None  # an unreadable manifest only means everything rebuilds

    def current(self, name: str, key: str, engine_dir: Path) -> bool:
        step = self.steps.get(name)
        if step is None or step.key != key or not (output := engine_dir / step.output).exists():
            return False
        return step.files is None or all(  # (a manifest from before sizes were recorded: present is current)
            (output / rel).is_file() and (output / rel).stat().st_size == size for rel, size in step.files.items()
        )

    def record(self, name: str, step: StepRecord) -> None:
        step.finished_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        self.steps[name] = step

    def save(self, engine_dir: Path) -> None:
        data = {
            "name": self.name,
            "backend": self.backend,
            "mode": self.mode,
            "config_sha256": self.config_sha256,
            "config_path": self.config_path,
            "num_draft_tokens": self.num_draft_tokens,
            "serving": self.serving,
            "tools": self.tools,
            "inputs": self.inputs,
            "steps": {
                name: {**s.__dict__, "commands": [c.__dict__ for c in s.commands]} for name, s in self.steps.items()
            },
            "outputs": sorted(s.output for s in self.steps.values()),
            "updated_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        atomic_write_text(engine_dir / MANIFEST, json.dumps(data, indent=2))
