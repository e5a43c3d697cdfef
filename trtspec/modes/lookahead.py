"""Lookahead decoding: the target drafts for itself by Jacobi iteration over a window of future positions,
keeping an n-gram pool of what it has seen; no draft model and no training. Compiled engines only.

Sources (github.com/NVIDIA/TensorRT-LLM): examples/lookahead/README.md @ 7ed07f06 and @ 83ab45a5 (build the
target with `--speculative_decoding_mode=lookahead_decoding --max_draft_len=<f(W,N,G)>`, where f is
`(0 if N == 1 else N - 2) + (W - 1 + G) * (N - 1)`, (7, 7, 7) -> 83; the server's (W, N, G) must give the
engine's max_draft_len; a request's (w, n, g) may not exceed it; SM >= 8.0); Triton's tensorrt_llm
config.pbtxt parameters lookahead_window_size, lookahead_ngram_size, lookahead_verification_set_size and
decoding_mode `lookahead` (triton_backend all_models, ref triton-model-repository §1.4);
`SpeculativeDecodingMode.LOOKAHEAD_DECODING` (tensorrt_llm/models/modeling_utils.py). The engine path ends
with 1.2.x; `LookaheadDecodingConfig` is not a pytorch-backend config.

trtspec's torch runner runs it too (trtspec.speculative.lookahead) for generate, plan and the benchmark; it is
not built or served on backend torch.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import Field

from trtspec.config_types import Int, PositiveInt, Section
from trtspec.families import ENGINE_FAMILIES, TORCH_RUNNER_FAMILIES
from trtspec.modes.base import SpecMode, Support
from trtspec.versions import engine_minors

if TYPE_CHECKING:
    from trtspec.check import Report
    from trtspec.checkpoints.inspect import CheckpointInfo
    from trtspec.config import DeploymentConfig
    from trtspec.speculative.drafters import Drafter
    from trtspec.speculative.model import Transformer
    from trtspec.speculative.tree import TreeShape


class LookaheadSection(Section):
    """Lookahead's (W, N, G) (trtspec.modes.lookahead): the engine's max_draft_len follows from them."""

    window_size: PositiveInt = Field(default=7, le=64, description="W: future positions per Jacobi step")
    ngram_size: PositiveInt = Field(default=7, le=64, description="N: length of the n-grams in the pool")
    verification_set_size: Annotated[Int, Field(ge=0, le=64)] = Field(
        default=7, description="G: candidate n-grams verified per step"
    )


def lookahead_draft_len(window: int, ngram: int, verification: int) -> int:
    """The engine's max_draft_len for a server's (W, N, G), as examples/lookahead/README.md gives it."""
    return (0 if ngram == 1 else ngram - 2) + (window - 1 + verification) * (ngram - 1)


def _section(settings: dict[str, Any]) -> LookaheadSection:
    """The runner's settings (the section's fields among others) as the section, defaults filled in."""
    return LookaheadSection(**{k: v for k, v in settings.items() if k in LookaheadSection.model_fields})


class Lookahead(SpecMode):
    name: ClassVar[str] = "lookahead"
    support: ClassVar[tuple[Support, ...]] = (
        Support(
            "lookahead",
            "tensorrt",
            engine_minors(),
            8.0,
            ENGINE_FAMILIES,
            note="target built with lookahead_decoding + max_draft_len f(W,N,G); Triton lookahead_* parameters",
        ),
        Support("lookahead", "pytorch", (), None, (), note="does not exist: LookaheadDecodingConfig is engines only"),
        Support(
            "lookahead",
            "torch",
            None,
            None,
            TORCH_RUNNER_FAMILIES,
            note="trtspec runner only (generate, plan, bench): one window level per pass, older levels on the host",
        ),
    )
    in_target: ClassVar[bool] = True
    refuses_draft: ClassVar[bool] = True
    section: ClassVar[str | None] = "lookahead"
    settings_model: ClassVar[type[Section] | None] = LookaheadSection
    engine_mode: ClassVar[str | None] = "lookahead_decoding"
    default_k: ClassVar[int | None] = None
    torch_deploys: ClassVar[bool] = False  # served torch models read TensorRT-LLM's speculative_config: none here

    def torch_deploy_refusal(self, cfg: DeploymentConfig) -> str | None:
        versions = ", ".join(self.row("tensorrt").versions or ())
        return (
            "mode lookahead runs in trtspec's torch runner (generate, plan, bench) and is not built or served on "
            f"backend torch: deploy it on backend tensorrt (TensorRT-LLM {versions})"
        )

    def drafter(self, target: Transformer, draft: Transformer | None, settings: dict[str, Any]) -> Drafter | None:
        from trtspec.errors import UsageError
        from trtspec.speculative.lookahead import LookaheadDrafter

        s = _section(settings)
        try:
            return LookaheadDrafter(s.window_size, s.ngram_size, s.verification_set_size)
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    def runner_tree(self, settings: dict[str, Any]) -> TreeShape:
        from trtspec.speculative.lookahead import lookahead_tree

        s = _section(settings)
        return lookahead_tree(s.window_size, s.ngram_size, s.verification_set_size)

    def draft_len(self, cfg: DeploymentConfig) -> int:
        s = self.settings(cfg)
        return lookahead_draft_len(s.window_size, s.ngram_size, s.verification_set_size)

    def fixed_draft_len(self, cfg: DeploymentConfig) -> int | None:
        return self.draft_len(cfg)  # set by (W, N, G); speculation.num_draft_tokens does not apply

    def validate(self, cfg: DeploymentConfig) -> list[tuple[str, str]]:
        errors = []
        s = self.settings(cfg)
        if "num_draft_tokens" in cfg.speculation.model_fields_set:
            errors.append(("speculation.num_draft_tokens", "lookahead's drafts follow from its (W, N, G); remove it"))
        if self.draft_len(cfg) < 1:
            errors.append(
                (
                    "lookahead",
                    f"(W, N, G) = ({s.window_size}, {s.ngram_size}, {s.verification_set_size})"
                    " drafts nothing: N >= 2 and W - 1 + G >= 1 (NVIDIA's smallest useful is (2, 2, 1))",
                )
            )
        return errors

    def triton_parameters(self, cfg: DeploymentConfig) -> dict[str, str]:
        s = self.settings(cfg)
        return {
            "decoding_mode": "lookahead",
            "lookahead_window_size": str(s.window_size),
            "lookahead_ngram_size": str(s.ngram_size),
            "lookahead_verification_set_size": str(s.verification_set_size),
        }

    def check(
        self, cfg: DeploymentConfig, target: CheckpointInfo | None, draft: CheckpointInfo | None, report: Report
    ) -> None:
        """The server's (W, N, G) must reproduce the engine's max_draft_len: an engine built for other
        settings is found here, not when the server refuses to start."""
        from trtspec.build.builder import engine_dir_for

        built = engine_dir_for(cfg) / "target" / "config.json"
        if not built.is_file():
            return
        try:
            longest = json.loads(built.read_text(encoding="utf-8")).get("build_config", {}).get("max_draft_len")
        except (OSError, ValueError):
            return
        s = self.settings(cfg)
        if longest != self.draft_len(cfg):
            report.add(
                "error",
                "lookahead-draft-len",
                f"{built}: the engine has max_draft_len {longest}; lookahead ({s.window_size}, {s.ngram_size}, "
                f"{s.verification_set_size}) needs {self.draft_len(cfg)}",
                "rebuild the engine (trtspec build) or set lookahead back to the settings it was built with",
            )
