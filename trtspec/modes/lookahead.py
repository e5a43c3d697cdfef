"""Lookahead decoding: the target drafts for itself by Jacobi iteration over a window of future positions,
keeping an n-gram pool of what it has seen; no draft model and no training. Compiled engines only.

Sources (github.com/NVIDIA/TensorRT-LLM): examples/lookahead/README.md @ 7ed07f06 and @ 83ab45a5 (build the
target with `--speculative_decoding_mode=lookahead_decoding --max_draft_len=<f(W,N,G)>`, where f is
`(0 if N == 1 else N - 2) + (W - 1 + G) * (N - 1)`, (7, 7, 7) -> 83; the README has the server's (W, N, G)
give the engine's max_draft_len, while the executor's code (cpp/tensorrt_llm/batch_manager/
trtGptModelInflightBatching.cpp: `TLLM_CHECK(maxDraftTokens <= mModelConfig.getMaxDecodingDraftTokens())`)
takes any that need no more; a request's (w, n, g) may not exceed the server's; SM >= 8.0); Triton's tensorrt_llm
config.pbtxt parameters lookahead_window_size, lookahead_ngram_size, lookahead_verification_set_size and
decoding_mode `lookahead` (triton_backend all_models, ref triton-model-repository §1.4);
`SpeculativeDecodingMode.LOOKAHEAD_DECODING` (tensorrt_llm/models/modeling_utils.py). The engine path ends
with 1.2.x; `LookaheadDecodingConfig` is not a pytorch-backend config.

trtspec's torch runner runs it too (trtspec.speculative.lookahead) for generate, plan and the benchmark. On
backend torch it is built and served by the engine flavour only, as TensorRT-LLM serves it from compiled engines:
the torch engine records max_draft_len f(W, N, G), and trtspec's tensorrt_llm stand-in reads the same
lookahead_* parameters NVIDIA's backend does. The llmapi flavour stands in for the LLM API, which has no
lookahead config, so it is refused there.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import Field, ValidationError

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


# the tensorrt_llm model's config.pbtxt parameter for each of the section's fields (NVIDIA's template keys)
TRITON_FIELDS = {
    "lookahead_window_size": "window_size",
    "lookahead_ngram_size": "ngram_size",
    "lookahead_verification_set_size": "verification_set_size",
}


def lookahead_draft_len(window: int, ngram: int, verification: int) -> int:
    """The engine's max_draft_len for a server's (W, N, G), as examples/lookahead/README.md gives it."""
    return (0 if ngram == 1 else ngram - 2) + (window - 1 + verification) * (ngram - 1)


def runner_problem(window: int, ngram: int, verification: int) -> str | None:
    """Why trtspec's torch runner cannot run these (W, N, G): it feeds one window level a pass, so its n-grams
    run along the window, and it verifies W + G(N-1) tokens a pass."""
    from trtspec.speculative.requests import MAX_TREE_NODES

    if window < 1 or ngram < 2 or verification < 0:
        return f"lookahead needs W >= 1, N >= 2, G >= 0; got ({window}, {ngram}, {verification})"
    if ngram > window + 1:
        return f"lookahead needs N <= W + 1 (its n-grams run along its window): W={window} N={ngram}"
    if (nodes := window + verification * (ngram - 1)) > MAX_TREE_NODES:
        return (
            f"lookahead ({window}, {ngram}, {verification}) verifies W + G(N-1) = {nodes} tokens a step; "
            f"at most {MAX_TREE_NODES}"
        )
    return None


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
            note="runner (generate, plan, bench), served by the engine flavour: one window level per pass",
        ),
    )
    in_target: ClassVar[bool] = True
    refuses_draft: ClassVar[bool] = True
    section: ClassVar[str | None] = "lookahead"
    settings_model: ClassVar[type[Section] | None] = LookaheadSection
    engine_mode: ClassVar[str | None] = "lookahead_decoding"
    torch_engine_mode: ClassVar[str | None] = "lookahead_decoding"
    torch_flavour: ClassVar[str] = "engine"
    default_k: ClassVar[int | None] = None

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

    def tree_draft_len(self, settings: dict[str, Any]) -> int:
        s = _section(settings)
        return lookahead_draft_len(s.window_size, s.ngram_size, s.verification_set_size)

    def draft_len(self, cfg: DeploymentConfig) -> int:
        return self.tree_draft_len(self.settings(cfg).model_dump())

    def fixed_draft_len(self, cfg: DeploymentConfig) -> int | None:
        return self.draft_len(cfg)  # set by (W, N, G); speculation.num_draft_tokens does not apply

    def validate(self, cfg: DeploymentConfig) -> list[tuple[str, str]]:
        errors = []
        s = self.settings(cfg)
        if "num_draft_tokens" in cfg.speculation.model_fields_set:
            errors.append(("speculation.num_draft_tokens", "lookahead's drafts follow from its (W, N, G); remove it"))
        if cfg.build.backend == "torch" and (
            why := runner_problem(s.window_size, s.ngram_size, s.verification_set_size)
        ):
            errors.append(("lookahead", f"{why} in trtspec's torch runner"))
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
        return {"decoding_mode": "lookahead"} | {key: str(getattr(s, f)) for key, f in TRITON_FIELDS.items()}

    def triton_settings(self, parameters: dict[str, str]) -> dict[str, Any]:
        from trtspec.errors import UsageError

        given = {key: parameters[key] for key in TRITON_FIELDS if key in parameters}
        if bad := next((key for key, value in given.items() if not re.fullmatch(r"\s*[0-9]+\s*", value)), None):
            raise UsageError(f"{bad} must be a whole number, got {given[bad]!r}")
        settings = {TRITON_FIELDS[key]: int(value) for key, value in given.items()}
        try:
            LookaheadSection(**settings)
        except ValidationError as exc:
            problem = exc.errors()[0]
            key = next(k for k, f in TRITON_FIELDS.items() if f == problem["loc"][0])
            raise UsageError(f"{key} {problem['msg'].lower()}") from None
        return settings

    def check(
        self, cfg: DeploymentConfig, target: CheckpointInfo | None, draft: CheckpointInfo | None, report: Report
    ) -> None:
        """Beyond check's rule for every tree (no more drafts than the engine's max_draft_len): fewer is what
        NVIDIA's code runs but not what its README builds, a warning, as the engine holds room it never uses."""
        from trtspec.check import built_engine

        if (built := built_engine(cfg)) is None:
            return
        engine, longest = built[0], built[1].get("build_config", {}).get("max_draft_len")
        s = self.settings(cfg)
        need, wng = self.draft_len(cfg), f"({s.window_size}, {s.ngram_size}, {s.verification_set_size})"
        if isinstance(longest, int) and longest > need:
            report.add(
                "warning",
                "tree-draft-len",
                f"{engine}: the engine has max_draft_len {longest}; lookahead {wng} drafts at most {need}, which "
                "TensorRT-LLM's executor runs on it, the engine's room for the rest unused",
                "trtspec build rebuilds it to these settings (as NVIDIA's README builds them)",
            )
