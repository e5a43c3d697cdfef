"""N-gram (prompt lookup): drafts are the tokens that followed the request's last tokens where they occurred
before, in a pool of patterns that TensorRT-LLM shares between requests by default. No draft model and no
training; it pays on input-grounded traffic (summaries, code edits, second turns) and costs almost nothing
where it finds no match.

Sources: tensorrt_llm/llmapi/llm_args.py NGramDecodingConfig (`decoding_type: NGram`; fields
max_matching_ngram_size, is_keep_all, is_use_oldest, is_public_pool, all three pool flags True by default;
`supports_backend` pytorch only; max_draft_len > 0), the 1.0 features doc listing `NGram` among the
`decoding_type` options, and its example `NGramDecodingConfig(max_draft_len=3, max_matching_ngram_size=4,
is_public_pool=True)` with `disable_overlap_scheduler=True` (ref trtllm-speculative-decoding §2.6).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from trtspec.config_types import PositiveInt, Section
from trtspec.families import TORCH_RUNNER_FAMILIES
from trtspec.modes.base import SpecMode, Support
from trtspec.versions import supported_minors

if TYPE_CHECKING:
    from trtspec.config import DeploymentConfig
    from trtspec.speculative.drafters import Drafter
    from trtspec.speculative.model import Transformer


class NGramSection(Section):
    """N-gram settings, with TensorRT-LLM's NGramDecodingConfig names (trtspec.modes.ngram)."""

    max_matching_ngram_size: PositiveInt = Field(
        default=3, le=64, description="longest suffix of the sequence looked up in earlier tokens"
    )
    is_keep_all: bool = Field(default=True, description="TensorRT-LLM's pool: keep every candidate of a prefix")
    is_use_oldest: bool = Field(default=True, description="TensorRT-LLM's pool: propose the oldest candidate")
    is_public_pool: bool = Field(default=True, description="TensorRT-LLM's pool: one pool shared by all requests")


class NGram(SpecMode):
    name: ClassVar[str] = "ngram"
    support: ClassVar[tuple[Support, ...]] = (
        Support("ngram", "tensorrt", (), None, (), note="does not exist: NGramDecodingConfig is pytorch only"),
        Support(
            "ngram",
            "pytorch",
            supported_minors(),
            7.0,
            None,
            note="speculative_config NGram; no draft model; SM: the backend's own (none documented for NGram)",
        ),
        Support(
            "ngram",
            "torch",
            None,
            None,
            TORCH_RUNNER_FAMILIES,
            note="trtspec runner: TensorRT-LLM's NGram pool rules and flags",
        ),
    )
    refuses_draft: ClassVar[bool] = True
    section: ClassVar[str | None] = "ngram"
    settings_model: ClassVar[type[Section] | None] = NGramSection
    decoding_types: ClassVar[tuple[str, ...]] = ("NGram",)
    served_settings: ClassVar[tuple[str, ...]] = tuple(NGramSection.model_fields)
    llm_api_extra: ClassVar[dict[str, Any]] = {"disable_overlap_scheduler": True}  # as NVIDIA's example sets
    runner_trees: ClassVar[bool] = True
    default_k: ClassVar[int | None] = 3

    def speculative_config(self, cfg: DeploymentConfig, k: int, draft_dir: str | None) -> dict[str, Any] | None:
        # every field written out: 1.0/1.1-era code defaults max_matching_ngram_size to 0, 1.2 to 2
        s = self.settings(cfg)
        return {
            "decoding_type": "NGram",
            "max_draft_len": k,
            "max_matching_ngram_size": s.max_matching_ngram_size,
            "is_keep_all": s.is_keep_all,
            "is_use_oldest": s.is_use_oldest,
            "is_public_pool": s.is_public_pool,
        }

    def drafter(self, target: Transformer, draft: Transformer | None, settings: dict[str, Any]) -> Drafter | None:
        from trtspec.speculative.drafters import NgramDrafter

        # checked already: by the config's section, or a served yaml's by runner_settings
        s = NGramSection(**{f: v for f, v in settings.items() if f in NGramSection.model_fields})
        pool = {"keep_all": s.is_keep_all, "use_oldest": s.is_use_oldest, "public": s.is_public_pool}
        return NgramDrafter(max_ngram=s.max_matching_ngram_size, **pool)
