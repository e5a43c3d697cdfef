"""Multi-token prediction: the target's own MTP layers draft (DeepSeek-V3 layout).

Sources (github.com/NVIDIA/TensorRT-LLM): tensorrt_llm/llmapi/llm_args.py MTPDecodingConfig (supports_backend
pytorch only; `num_nextn_predict_layers` through 1.2, `max_draft_len` from 1.3), docs/source/models/
supported-models.md ("MTP is currently only supported by Deepseek"), the 1.3 example's SM >= 90 warning, and
`trtllm-build --speculative_decoding_mode` (no MTP choice).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import Field

from trtspec.config_types import Float, PositiveInt, Section
from trtspec.families import MTP_FAMILIES, TORCH_RUNNER_FAMILIES, UNVERIFIED_MTP_FAMILIES
from trtspec.modes.base import SpecMode, Support
from trtspec.versions import at_least, supported_minors

if TYPE_CHECKING:
    from trtspec.check import Report
    from trtspec.checkpoints.inspect import CheckpointInfo
    from trtspec.config import DeploymentConfig
    from trtspec.speculative.drafters import Drafter
    from trtspec.speculative.model import Transformer


class MTPSection(Section):
    """MTP settings: the layers come from the target checkpoint (DeepSeek-V3 layout)."""

    num_nextn_predict_layers: PositiveInt | None = Field(
        default=None, description="MTP layers to use; default: the checkpoint's num_nextn_predict_layers"
    )
    relaxed_acceptance: bool = Field(
        default=False, description="TensorRT-LLM's relaxed acceptance for thinking: faster, NOT lossless"
    )
    relaxed_topk: PositiveInt = 1
    relaxed_delta: Float = Field(default=0.0, ge=0.0, le=1.0)


class MTP(SpecMode):
    name: ClassVar[str] = "mtp"
    support: ClassVar[tuple[Support, ...]] = (
        Support("mtp", "tensorrt", (), None, (), note="does not exist: use backend pytorch"),
        Support(
            "mtp",
            "pytorch",
            supported_minors(),
            9.0,
            MTP_FAMILIES,
            UNVERIFIED_MTP_FAMILIES,
            note="speculative_config MTP; relaxed acceptance is not lossless",
        ),
        Support(
            "mtp",
            "torch",
            None,
            None,
            TORCH_RUNNER_FAMILIES,
            note="trtspec runner; DeepSeek-V3 MTP layout on Llama-family targets",
        ),
    )
    in_target: ClassVar[bool] = True
    refuses_draft: ClassVar[bool] = True
    section: ClassVar[str | None] = "mtp"
    settings_model: ClassVar[type[Section] | None] = MTPSection
    decoding_types: ClassVar[tuple[str, ...]] = ("MTP",)
    torch_engine_mode: ClassVar[str | None] = "mtp"
    default_k: ClassVar[int | None] = 3

    def speculative_config(self, cfg: DeploymentConfig, k: int, draft_dir: str | None) -> dict[str, Any] | None:
        # through 1.2 the depth is num_nextn_predict_layers, which overwrites max_draft_len; 1.3 renames it
        # max_draft_len (ref trtllm-speculative-decoding §2.4)
        depth = "max_draft_len" if at_least(cfg.build.tensorrt_llm_version, "1.3") else "num_nextn_predict_layers"
        spec: dict[str, Any] = {"decoding_type": "MTP", depth: k}
        if cfg.mtp is not None and cfg.mtp.relaxed_acceptance:
            spec.update(
                use_relaxed_acceptance_for_thinking=True,
                relaxed_topk=cfg.mtp.relaxed_topk,
                relaxed_delta=cfg.mtp.relaxed_delta,
            )
        return spec

    def torch_engine_settings(self, cfg: DeploymentConfig) -> dict[str, Any]:
        return {"num_nextn_predict_layers": cfg.mtp.num_nextn_predict_layers if cfg.mtp else None}

    def served_draft_len(self, spec: dict[str, Any]) -> int:
        return int(spec.get("num_nextn_predict_layers") or spec.get("max_draft_len") or 0)

    def init_sections(
        self, target: str, hf_config: dict[str, Any], draft_config: dict[str, Any], backend: str
    ) -> dict[str, Any]:
        layers = hf_config.get("num_nextn_predict_layers")
        if hf_config and not layers:
            from trtspec.errors import UsageError

            raise UsageError(f"{target}: config.json has no num_nextn_predict_layers > 0; it carries no MTP layers")
        return {"mtp": {"num_nextn_predict_layers": layers, "relaxed_acceptance": False}}

    def check(
        self, cfg: DeploymentConfig, target: CheckpointInfo | None, draft: CheckpointInfo | None, report: Report
    ) -> None:
        """The target carries the MTP layers it is asked for, with their weights; relaxed acceptance is
        flagged, since it gives up the lossless promise."""
        if cfg.mtp is not None and cfg.mtp.relaxed_acceptance:
            report.add(
                "warning",
                "not-lossless",
                "mtp.relaxed_acceptance changes outputs: speculation is no longer "
                "lossless (TensorRT-LLM applies it in DeepSeek-R1's thinking phase only)",
                "set relaxed_acceptance: false to keep the target's exact distribution",
            )
        if target is None:
            return
        layers = int(target.config.get("num_nextn_predict_layers") or 0)
        if layers <= 0:
            report.add(
                "error",
                "mtp-missing",
                f"{target.path}: config.json has no num_nextn_predict_layers > 0",
                "use a checkpoint that carries MTP layers (DeepSeek-V3/R1) or mode draft-target",
            )
            return
        wanted = cfg.mtp.num_nextn_predict_layers if cfg.mtp and cfg.mtp.num_nextn_predict_layers else layers
        if wanted > layers:
            report.add(
                "error",
                "mtp-layers",
                f"mtp.num_nextn_predict_layers is {wanted}, the checkpoint has {layers}",
                f"set it to at most {layers}; more drafts reuse the layers (speculation.num_draft_tokens)",
            )
        base = int(target.config["num_hidden_layers"])
        if target.weight_names is None:
            report.add(
                "warning", "mtp-weights-unknown", "no weight index or safetensors headers to look for MTP weights", ""
            )
            return
        for k in range(min(wanted, layers)):
            need = [
                f"model.layers.{base + k}.{n}"
                for n in ("eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.norm.weight")
            ]
            missing = [n for n in need if n not in target.weight_names]
            if missing:
                report.add(
                    "error",
                    "mtp-weights-missing",
                    f"MTP layer {base + k} weights missing: {', '.join(missing)}",
                    "use the full checkpoint: some conversions drop the MTP layer (DeepSeek's convert.py skips it)",
                )

    def drafter(self, target: Transformer, draft: Transformer | None, settings: dict[str, Any]) -> Drafter | None:
        from trtspec.errors import UsageError
        from trtspec.speculative.drafters import MTPDrafter

        if target.dims.num_mtp_layers == 0:
            raise UsageError("the target has no MTP layers (config.json num_nextn_predict_layers is 0 or absent)")
        return MTPDrafter(target, settings.get("num_nextn_predict_layers"))
