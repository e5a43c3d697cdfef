"""EAGLE-3: a one-layer draft head reads the target's hidden states from three of its layers (low, mid,
high) and the next token's embedding, and drafts from them; the head is a checkpoint of its own, trained
for one target.

Sources (github.com/NVIDIA/TensorRT-LLM): the 1.0.0 example page llm_speculative_decoding.html
(`EagleDecodingConfig(max_draft_len=3, speculative_model_dir=..., eagle3_one_model=True)`) and the 1.0-era
features doc (`decoding_type: Eagle` for EAGLE 3; ref trtllm-speculative-decoding §2.7); 1.2's
llm_args.py `Eagle3DecodingConfig` (`decoding_type: Eagle3`, `speculative_model`, `eagle3_one_model`,
`eagle3_layers_to_capture`, `max_draft_len > 0`, a draft model required; code index id 7019226376, ref §2.5);
the supported-models table of 1.0 (one-model: Llama 4 Maverick; two-model: Llama 4 Maverick, Llama 3.1 8B,
Llama 3.3 70B; ref §2.1); tensorrt_llm/_torch/models/modeling_speculative.py for what the head must match
(its input width is `target_hidden_size` if the head's config has one, else `hidden_size`; its fc layer
takes that width times the captured layers; `draft_vocab_size` defaults to `vocab_size`). 1.1's exact field
names are not pinned, so trtspec claims 1.0 and 1.2.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import Field

from trtspec.config_types import Int, Section
from trtspec.families import EAGLE3_FAMILIES, EAGLE3_ONE_MODEL_FAMILIES, TORCH_RUNNER_FAMILIES
from trtspec.modes.base import SpecMode, Support
from trtspec.versions import at_least

if TYPE_CHECKING:
    from pathlib import Path

    from trtspec.check import Report
    from trtspec.checkpoints.inspect import CheckpointInfo
    from trtspec.config import DeploymentConfig
    from trtspec.speculative.drafters import Drafter
    from trtspec.speculative.model import Transformer


DEFAULT_CAPTURE_MIN_LAYERS = 6  # TensorRT-LLM refuses the default capture for 5 layers or fewer


def trtllm_default_capture(num_layers: int) -> tuple[int, ...] | None:
    """The target layers TensorRT-LLM's EAGLE-3 captures without eagle3_layers_to_capture (Eagle3SpecMetadata:
    low, middle, high), None where it refuses the target as too shallow."""
    if num_layers < DEFAULT_CAPTURE_MIN_LAYERS:
        return None
    return (1, num_layers // 2 - 1, num_layers - 4)


def recorded_layers(head_config: dict[str, Any]) -> list[int] | None:
    """The target layers a head records it was trained on (trtspec's heads write them; TensorRT-LLM reads the
    deployment's instead), sorted as TensorRT-LLM orders the fused features; None where it records none."""
    eagle = head_config.get("eagle_config") or {}
    if not isinstance(eagle, dict):
        raise ValueError(f"eagle_config must be a mapping, got {eagle!r}")
    layers = eagle.get("eagle_aux_hidden_state_layer_ids")
    if layers is None:
        return None
    ok = isinstance(layers, list) and layers and all(type(i) is int and i >= 0 for i in layers)
    if not ok:
        raise ValueError(f"eagle_config.eagle_aux_hidden_state_layer_ids must be layer numbers >= 0, got {layers!r}")
    return sorted(layers)


class Eagle3Section(Section):
    """EAGLE-3 settings (trtspec.modes.eagle3); the head checkpoint is the `draft` section."""

    one_model: bool = Field(
        default=False,
        description="eagle3_one_model: the head inside the target's engine; NVIDIA's 1.0 table lists it for Llama 4"
        " Maverick only (Llama 3.x: two models)",
    )
    layers_to_capture: list[Annotated[Int, Field(ge=0)]] | None = Field(
        default=None,
        min_length=1,
        description="target layers the head reads (TensorRT-LLM 1.2+); default: TensorRT-LLM's (1, L/2-1, L-4); the"
        " torch runner's: the layers the head records, else that default",
    )


class Eagle3(SpecMode):
    name: ClassVar[str] = "eagle3"
    support: ClassVar[tuple[Support, ...]] = (
        Support("eagle3", "tensorrt", (), None, (), note="does not exist: EAGLE-3 runs on the pytorch backend"),
        Support(
            "eagle3",
            "pytorch",
            ("1.0", "1.2"),
            7.0,
            EAGLE3_FAMILIES,
            note="speculative_config Eagle (1.0) / Eagle3 (1.2) + the head checkpoint; 1.1 not pinned",
        ),
        Support(
            "eagle3",
            "torch",
            None,
            None,
            TORCH_RUNNER_FAMILIES,
            note="trtspec runner and served models (llmapi flavour): the head's chains and trees on the captured"
            " layers",
        ),
    )
    needs_draft: ClassVar[bool] = True
    draft_head: ClassVar[bool] = True
    draft_role: ClassVar[str] = "the EAGLE-3 head trained for the target"
    section: ClassVar[str | None] = "eagle3"
    settings_model: ClassVar[type[Section] | None] = Eagle3Section
    decoding_types: ClassVar[tuple[str, ...]] = ("Eagle", "Eagle3")
    default_k: ClassVar[int | None] = 3
    runner_trees: ClassVar[bool] = True  # EAGLE-2's dynamic tree from the head (TensorRT-LLM: use_dynamic_tree)

    def load_draft(self, path: Path, dtype: Any, device: str, max_len: int) -> Any:
        from trtspec.speculative.eagle import load_eagle3

        return load_eagle3(path, dtype=dtype, device=device)

    def drafter(self, target: Transformer, draft: Any, settings: dict[str, Any]) -> Drafter | None:
        from trtspec.speculative.eagle import EagleDrafter

        return EagleDrafter(target, draft, settings.get("layers_to_capture"))

    def init_sections(
        self, target: str, hf_config: dict[str, Any], draft_config: dict[str, Any], backend: str
    ) -> dict[str, Any]:
        """The layers the head records it was trained on, where TensorRT-LLM's default would capture others."""
        section = Eagle3Section().model_dump()
        try:
            trained = recorded_layers(draft_config)
        except ValueError:
            trained = None  # check says what is wrong with it
        depth = int(hf_config.get("num_hidden_layers") or 0)
        if trained and depth and list(trtllm_default_capture(depth) or ()) != trained:
            section["layers_to_capture"] = trained
        return {self.section: section}

    def validate(self, cfg: DeploymentConfig) -> list[tuple[str, str]]:
        s, version = self.settings(cfg), cfg.build.tensorrt_llm_version
        if s.layers_to_capture is not None and cfg.build.backend != "torch" and not at_least(version, "1.2"):
            return [("eagle3.layers_to_capture", f"eagle3_layers_to_capture needs TensorRT-LLM 1.2+, got {version}")]
        if s.one_model and cfg.build.backend == "torch":
            return [
                (
                    "eagle3.one_model",
                    "TensorRT-LLM's engine layout; trtspec's torch runner runs the head beside the"
                    " target either way: remove it",
                )
            ]
        return []

    def extra_options(self, cfg: DeploymentConfig) -> dict[str, Any]:
        # the two-model path runs without the overlap scheduler (ref §2.1): said, as for draft-target
        return {} if self.settings(cfg).one_model else {"disable_overlap_scheduler": True}

    def speculative_config(self, cfg: DeploymentConfig, k: int, draft_dir: str | None) -> dict[str, Any] | None:
        s, version = self.settings(cfg), cfg.build.tensorrt_llm_version
        if at_least(version, "1.2"):
            spec: dict[str, Any] = {"decoding_type": "Eagle3", "max_draft_len": k, "speculative_model": draft_dir}
        else:
            spec = {"decoding_type": "Eagle", "max_draft_len": k, "speculative_model_dir": draft_dir}
        # validate() allows the field before 1.2 only on backend torch, whose served runner reads it
        if s.layers_to_capture is not None:
            spec["eagle3_layers_to_capture"] = list(s.layers_to_capture)
        spec["eagle3_one_model"] = s.one_model
        return spec

    def runner_settings(self, spec: dict[str, Any]) -> dict[str, Any]:
        layers = spec.get("eagle3_layers_to_capture")
        return {} if layers is None else {"layers_to_capture": list(layers)}

    def claims_draft(self, draft_config: dict[str, Any]) -> bool:
        """EAGLE-3's own vocabulary (`draft_vocab_size`: EAGLE-1/2 heads have none), an EAGLE-3 architecture name
        (LlamaForCausalLMEagle3, vLLM's Eagle3LlamaForCausalLM), or an `eagle_config` that reads the target's
        layers (trtspec's heads; ModelOpt writes one with use_aux_hidden_state false for EAGLE-1 too)."""
        names = draft_config.get("architectures")
        named = isinstance(names, list) and any("eagle3" in str(n).lower() for n in names)
        eagle = draft_config.get("eagle_config")
        fused = isinstance(eagle, dict) and eagle.get("use_aux_hidden_state") is not False
        return "draft_vocab_size" in draft_config or named or fused

    def check(
        self, cfg: DeploymentConfig, target: CheckpointInfo | None, draft: CheckpointInfo | None, report: Report
    ) -> None:
        """The head must have been trained for this target: the width it reads, the vocabulary it maps
        into and the layers it captures all come from the target."""
        if target is None or draft is None:
            return
        t, d = target.config, draft.config
        width = d.get("target_hidden_size") or d.get("hidden_size")
        if width != t.get("hidden_size"):
            report.add(
                "error",
                "eagle3-hidden",
                f"the EAGLE-3 head reads hidden states of width {width}, the target's hidden_size is "
                f"{t.get('hidden_size')}",
                "use the head trained for this target",
            )
        if d.get("vocab_size") != t.get("vocab_size"):
            report.add(
                "error",
                "eagle3-vocab",
                f"the head's vocab_size {d.get('vocab_size')} != the target's {t.get('vocab_size')} "
                "(its draft_vocab_size maps into the target's vocabulary)",
                "use the head trained for this target",
            )
        layers = self.settings(cfg).layers_to_capture
        depth = int(t.get("num_hidden_layers") or 0)
        if layers is not None and depth and any(i >= depth for i in layers):
            report.add(
                "error",
                "eagle3-layers",
                f"eagle3.layers_to_capture {list(layers)}: the target has layers 0..{depth - 1}",
                "capture layers the target has (the default is three: low, middle, high)",
            )
        try:
            self._check_capture(cfg, layers, depth, recorded_layers(d), report)
        except ValueError as exc:
            report.add("error", "eagle3-capture", str(exc), "use the head as its training wrote it")
        if self.settings(cfg).one_model and target.architecture not in EAGLE3_ONE_MODEL_FAMILIES:
            report.add(
                "warning",
                "eagle3-one-model",
                f"eagle3.one_model with {target.architecture}: NVIDIA's support table lists one-model EAGLE-3 for "
                f"{', '.join(EAGLE3_ONE_MODEL_FAMILIES)} only",
                "set eagle3.one_model: false (two models), or validate on a small run first",
            )
        names = draft.weight_names
        if names is not None and not any(n == "fc.weight" or n.endswith(".fc.weight") for n in names):
            report.add(
                "warning",
                "eagle3-fc",
                "the head has no fc.weight, the layer that fuses the captured hidden states: not an EAGLE-3 head?",
                "EAGLE-1/2 heads are not EAGLE-3 heads; use one trained with EAGLE-3",
            )

    def _check_capture(
        self, cfg: DeploymentConfig, configured: list[int] | None, depth: int, trained: list[int] | None, report: Report
    ) -> None:
        """TensorRT-LLM takes the captured layers from the deployment (eagle3_layers_to_capture, or its
        default), never from the head: they must be the layers the head was trained on. The torch runner
        reads the configured layers too, and the head's own where none are configured."""
        if not depth:
            return
        if trained is not None and max(trained) >= depth:
            report.add(
                "error",
                "eagle3-layers",
                f"the head was trained on target layers {trained}; the target has layers 0..{depth - 1}",
                "use the head trained for this target",
            )
            return
        runner = cfg.build.backend == "torch"
        who = "the torch runner" if runner else "TensorRT-LLM"
        if configured is not None:
            captured = sorted(configured)
        else:
            captured = list(trained) if runner and trained is not None else trtllm_default_capture(depth)
        fix = f"set eagle3.layers_to_capture: {trained or '[the layers the head was trained on]'}"
        fix += "" if runner else " (TensorRT-LLM 1.2+)"
        if captured is None:
            report.add(
                "error",
                "eagle3-capture",
                f"{who} has no default EAGLE-3 layers for a {depth}-layer target "
                f"(TensorRT-LLM's needs {DEFAULT_CAPTURE_MIN_LAYERS} or more)",
                fix,
            )
        elif trained is not None and list(captured) != trained:
            report.add(
                "error",
                "eagle3-capture",
                f"the head was trained on target layers {trained}; {who} would capture {list(captured)}",
                fix,
            )
