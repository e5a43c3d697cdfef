"""Draft-target: a small model of the same tokenizer drafts, the target verifies.

Sources (github.com/NVIDIA/TensorRT-LLM): examples/draft_target_model/README.md @ 567239fc (support matrix,
compute capability >= 8.0, the target built with draft_tokens_external), tensorrt_llm/llmapi/llm_args.py
(DraftTargetDecodingConfig).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import Field

from trtspec.config_types import Section
from trtspec.families import ENGINE_FAMILIES, TORCH_RUNNER_FAMILIES
from trtspec.modes.base import SpecMode, Support, draft_model_key
from trtspec.versions import at_least, engine_minors, supported_minors

if TYPE_CHECKING:
    from trtspec.config import DeploymentConfig
    from trtspec.speculative.drafters import Drafter
    from trtspec.speculative.model import Transformer


# NVIDIA's draft-target README builds the target with --max_draft_len=10 and its documented BLS request
# sends num_draft_tokens 10: an engine built for exactly K refuses that request, so the target gets room
# for at least this many drafts (a few KB of buffers per sequence) while the BLS default stays K.
MAX_DRAFT_LEN_HEADROOM = 10


class DraftTargetSection(Section):
    """The draft model's own speed-up, trtspec's own: its torch runner and llmapi model (trtspec.modes.draft_target)."""

    cascade: Literal["none", "ngram"] = Field(
        default="none",
        description="ngram: n-gram guesses let the draft model run its chain in fewer passes (a vertical cascade)",
    )


class DraftTarget(SpecMode):
    name: ClassVar[str] = "draft-target"
    support: ClassVar[tuple[Support, ...]] = (
        Support(
            "draft-target",
            "tensorrt",
            engine_minors(),
            8.0,
            ENGINE_FAMILIES,
            note="target built with draft_tokens_external + max_draft_len; Triton BLS; no streaming",
        ),
        Support(
            "draft-target",
            "pytorch",
            supported_minors(),
            8.0,
            None,
            note="speculative_config decoding_type DraftTarget; draft loaded from HF weights",
        ),
        Support("draft-target", "torch", None, None, TORCH_RUNNER_FAMILIES, note="trtspec runner, CPU or GPU"),
    )
    needs_draft: ClassVar[bool] = True
    draft_engine: ClassVar[bool] = True
    draft_role: ClassVar[str] = "a model with the target's tokenizer"
    decoding_types: ClassVar[tuple[str, ...]] = ("DraftTarget", "Draft_Target")
    engine_mode: ClassVar[str | None] = "draft_tokens_external"
    torch_engine_mode: ClassVar[str | None] = "draft_tokens_external"
    engine_streams: ClassVar[bool] = False
    llm_api_extra: ClassVar[dict[str, Any]] = {"disable_overlap_scheduler": True}  # two-model speculation does
    runner_trees: ClassVar[bool] = True
    section: ClassVar[str | None] = "draft_target"
    settings_model: ClassVar[type[Section] | None] = DraftTargetSection
    runner_only_settings: ClassVar[tuple[str, ...]] = ("cascade",)

    def init_sections(
        self, target: str, hf_config: dict[str, Any], draft_config: dict[str, Any], backend: str
    ) -> dict[str, Any]:
        return {}  # its one setting is the torch runner's and off by default: nothing to write

    def validate(self, cfg: DeploymentConfig) -> list[tuple[str, str]]:
        if self.settings(cfg).cascade != "none" and cfg.build.backend != "torch":
            return [("draft_target.cascade", "a cascade is the torch runner's; TensorRT-LLM's draft drafts alone")]
        return []

    def torch_deploy_refusal(self, cfg: DeploymentConfig) -> str | None:
        if self.settings(cfg).cascade != "none" and cfg.serve.flavour == "engine":
            return (
                "draft_target.cascade runs in trtspec's llmapi model; the engine flavour's BLS runs TensorRT-LLM's "
                "documented draft loop: use serve.flavour llmapi"
            )
        return None

    def engine_draft_len(self, cfg: DeploymentConfig, k: int) -> int:
        return max(k, MAX_DRAFT_LEN_HEADROOM)

    @staticmethod
    def decoding_type(version: str) -> str:
        """1.0 and 1.1 map the documented `DraftTarget` in DecodingBaseConfig.from_dict; 1.2 validates a
        union discriminated on the literal `Draft_Target`."""
        return "Draft_Target" if at_least(version, "1.2") else "DraftTarget"

    def speculative_config(self, cfg: DeploymentConfig, k: int, draft_dir: str | None) -> dict[str, Any] | None:
        version = cfg.build.tensorrt_llm_version
        return {
            "decoding_type": self.decoding_type(version),
            "max_draft_len": k,
            draft_model_key(version): draft_dir,
        }

    def drafter(self, target: Transformer, draft: Transformer | None, settings: dict[str, Any]) -> Drafter | None:
        from trtspec.errors import UsageError
        from trtspec.speculative.drafters import DraftModelDrafter

        if draft is None:
            raise UsageError("mode draft-target needs a draft checkpoint")
        if draft.dims.vocab_size != target.dims.vocab_size:
            raise UsageError(
                f"draft vocab_size {draft.dims.vocab_size} != target vocab_size "
                f"{target.dims.vocab_size}; run `trtspec check` on the pair"
            )
        if (settings.get("cascade") or "none") == "ngram":
            from trtspec.speculative.drafters import CascadeDrafter

            return CascadeDrafter(draft)
        return DraftModelDrafter(draft)
