"""What each TensorRT-LLM release supports for speculative decoding, per backend: one table in code.

Sources (github.com/NVIDIA/TensorRT-LLM: examples/draft_target_model/README.md, tensorrt_llm/llmapi/llm_args.py,
docs/source/models/supported-models.md): the draft-target README's support
matrix (compute capability >= 8.0), `MTPDecodingConfig.supports_backend` (pytorch only) and the
supported-models page ("MTP is currently only supported by Deepseek"), the 1.3 example's SM >= 90
warning for MTP, and `trtllm-build --speculative_decoding_mode` (no MTP choice). The README shows
this table, rendered by `support_table_markdown()`; a test keeps them equal.
"""

from __future__ import annotations

from dataclasses import dataclass

VERSIONS = ("1.0", "1.1", "1.2")


@dataclass(frozen=True)
class Support:
    mode: str
    backend: str
    versions: tuple[str, ...] | None  # minor releases where it exists; None: needs no TensorRT-LLM
    min_sm: float | None  # minimum compute capability; None: no GPU needed
    architectures: tuple[str, ...] | None  # None: any the backend runs
    unverified_architectures: tuple[str, ...] = ()  # reported to work, not in the docs' table
    note: str = ""


# Families with a convert_checkpoint.py under examples/models/core/ in 1.x (compiled engines).
ENGINE_FAMILIES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "MixtralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "GemmaForCausalLM",
    "Gemma2ForCausalLM",
    "Phi3ForCausalLM",
    "NemotronForCausalLM",
)
MTP_ARCHITECTURES = ("DeepseekV3ForCausalLM",)
TORCH_RUNNER_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")

TABLE: tuple[Support, ...] = (
    Support(
        "draft-target",
        "tensorrt",
        VERSIONS,
        8.0,
        ENGINE_FAMILIES,
        note="target built with draft_tokens_external + max_draft_len; Triton BLS; no streaming",
    ),
    Support(
        "draft-target",
        "pytorch",
        VERSIONS,
        8.0,
        None,
        note="speculative_config decoding_type DraftTarget; draft loaded from HF weights",
    ),
    Support("draft-target", "torch", None, None, TORCH_RUNNER_ARCHITECTURES, note="trtspec runner, CPU or GPU"),
    Support("mtp", "tensorrt", (), None, (), note="does not exist: use backend pytorch"),
    Support(
        "mtp",
        "pytorch",
        VERSIONS,
        9.0,
        MTP_ARCHITECTURES,
        ("Glm4MoeForCausalLM",),
        note="speculative_config MTP; relaxed acceptance is not lossless",
    ),
    Support(
        "mtp",
        "torch",
        None,
        None,
        TORCH_RUNNER_ARCHITECTURES,
        note="trtspec runner; DeepSeek-V3 MTP layout on Llama-family targets",
    ),
    Support("none", "tensorrt", VERSIONS, 7.0, ENGINE_FAMILIES),
    Support("none", "pytorch", VERSIONS, 7.0, None),
    Support("none", "torch", None, None, TORCH_RUNNER_ARCHITECTURES),
)


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
