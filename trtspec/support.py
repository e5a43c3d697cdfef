"""What each TensorRT-LLM release supports for speculative decoding, per backend, as one table.

The rows are declared by the modes themselves (trtspec.modes, each citing its sources) over the families of
trtspec.families; this module only gathers and renders them. The README shows this table, rendered by
`support_table_markdown()`; a test keeps them equal.
"""

from __future__ import annotations

from trtspec.modes import REGISTRY, Support

TABLE: tuple[Support, ...] = tuple(row for mode in REGISTRY.values() for row in mode.support)


def lookup(mode: str, backend: str) -> Support:
    for row in TABLE:
        if row.mode == mode and row.backend == backend:
            return row
    raise KeyError((mode, backend))


def support_table_markdown() -> str:
    lines = ["| mode | backend | TensorRT-LLM | min SM | architectures | note |", "|---|---|---|---|---|---|"]
    for r in TABLE:
        versions = "not needed" if r.versions is None else (", ".join(r.versions) or "none")
        sm = f"{r.min_sm:.1f}" if r.min_sm is not None else "-"
        archs = "any" if r.architectures is None else (", ".join(r.architectures) or "-")
        if r.unverified_architectures:
            archs += f" (unverified: {', '.join(r.unverified_architectures)})"
        lines.append(f"| {r.mode} | {r.backend} | {versions} | {sm} | {archs} | {r.note} |")
    return "\n".join(lines)
