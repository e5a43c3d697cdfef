"""Self-drafting: the target drafts for itself with some of its layers (self-speculation) or with its
own weights in int8 (a quantized self-draft). Nothing to train and no second checkpoint.

TensorRT-LLM has no mode of this name: the same draft is a draft-target pair whose draft checkpoint is
the target cut to those layers (a Llama checkpoint with fewer `num_hidden_layers`), or the target built
with `--use_weight_only --weight_only_precision int8` as the draft engine. In trtspec it is a torch-runner
method (generate, plan, bench); `trtspec export-self-draft` writes that draft-target config (and the cut
checkpoint) to build and serve (trtspec.checkpoints.self_draft).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator

from trtspec.config_types import Int, Section
from trtspec.families import TORCH_RUNNER_FAMILIES
from trtspec.modes.base import SpecMode, Support

if TYPE_CHECKING:
    from trtspec.config import DeploymentConfig
    from trtspec.speculative.drafters import Drafter
    from trtspec.speculative.model import Transformer

NOT_A_MODE = (
    "no mode of its own: a draft-target pair whose draft is the target's layers (or its int8 engine), "
    "as trtspec export-self-draft writes it"
)


class SelfDraftSection(Section):
    """Which of the target's layers draft, and in which weights (trtspec.modes.self_draft)."""

    layers: list[Annotated[Int, Field(ge=0)]] | None = Field(
        default=None,
        description="target layers the draft runs, ascending (default: the first half, every layer with int8)",
    )
    weights: Literal["same", "int8"] = Field(
        default="same", description="the target's weights, or an int8 weight-only copy (a quantized self-draft)"
    )

    @field_validator("layers")
    @classmethod
    def _ascending(cls, layers: list[int] | None) -> list[int] | None:
        if layers is not None and (not layers or layers != sorted(set(layers))):
            raise ValueError("layers must be distinct and ascending, at least one (the order the target runs them)")
        return layers


class SelfDraft(SpecMode):
    name: ClassVar[str] = "self-draft"
    support: ClassVar[tuple[Support, ...]] = (
        Support("self-draft", "tensorrt", (), None, (), note=NOT_A_MODE),
        Support("self-draft", "pytorch", (), None, (), note=NOT_A_MODE),
        Support(
            "self-draft",
            "torch",
            None,
            None,
            TORCH_RUNNER_FAMILIES,
            note="trtspec runner (generate, plan, bench): the target's first layers, or its int8 copy; deployed as "
            "draft-target (trtspec export-self-draft)",
        ),
    )
    in_target: ClassVar[bool] = True
    refuses_draft: ClassVar[bool] = True
    section: ClassVar[str | None] = "self_draft"
    settings_model: ClassVar[type[Section] | None] = SelfDraftSection
    runner_trees: ClassVar[bool] = True
    torch_deploys: ClassVar[bool] = False  # served models read TensorRT-LLM's speculative_config: no such mode

    def torch_deploy_refusal(self, cfg: DeploymentConfig) -> str | None:
        return (
            "mode self-draft runs in trtspec's torch runner (generate, plan, bench) and is not built or served: "
            "`trtspec export-self-draft CONFIG` writes it as a draft-target config (the target cut to its layers "
            "as the draft checkpoint), which builds and serves on every backend"
        )

    def drafter(self, target: Transformer, draft: Transformer | None, settings: dict[str, Any]) -> Drafter | None:
        from trtspec.speculative.drafters import DraftModelDrafter
        from trtspec.speculative.self_draft import resolve_layers, self_draft_model

        weights = settings.get("weights") or "same"
        layers = resolve_layers(settings.get("layers"), weights, target.dims.num_layers)
        return DraftModelDrafter(self_draft_model(target, layers, weights))
