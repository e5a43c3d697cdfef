"""AUTO: TensorRT-LLM picks a draft-model-free method itself, n-gram lookup with a concurrency heuristic.

Sources: tensorrt_llm/llmapi/llm_args.py AutoDecodingConfig (`decoding_type` "AUTO", pytorch backend only,
"Attributes that are inherited from the base class are ignored"; a 1.2-era copy, code index id 7019226376),
and an earlier copy's docstring for the heuristic (id 1520735490): "With concurrency <= 4, max_draft_len = 5,
max_matching_ngram_size = 3; With concurrency <= 32, max_draft_len = 3, max_matching_ngram_size = 5; With
concurrency > 32, speculative decoding is disabled." NVIDIA's blog7 (ref trtllm-speculative-decoding §2.6):
"Set spec_decode_algo=AUTO to enable N-Gram by default". Which 1.0/1.1 release first carried the class is not
pinned, so trtspec claims 1.2 only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from trtspec.families import TORCH_RUNNER_FAMILIES
from trtspec.modes.base import SpecMode, Support

if TYPE_CHECKING:
    from trtspec.config import DeploymentConfig
    from trtspec.speculative.batch import KPolicy
    from trtspec.speculative.drafters import Drafter
    from trtspec.speculative.model import Transformer

# (largest concurrency, max_draft_len, max_matching_ngram_size); above the last, no speculation
HEURISTIC: tuple[tuple[int, int, int], ...] = ((4, 5, 3), (32, 3, 5))


class Auto(SpecMode):
    name: ClassVar[str] = "auto"
    support: ClassVar[tuple[Support, ...]] = (
        Support("auto", "tensorrt", (), None, (), note="does not exist: AutoDecodingConfig is pytorch only"),
        Support(
            "auto",
            "pytorch",
            ("1.2",),
            7.0,
            None,
            note="speculative_config AUTO: n-gram by a concurrency heuristic; 1.0/1.1 not pinned",
        ),
        Support(
            "auto",
            "torch",
            None,
            None,
            TORCH_RUNNER_FAMILIES,
            note="trtspec runner: NVIDIA's documented heuristic on the running batch",
        ),
    )
    refuses_draft: ClassVar[bool] = True
    decoding_types: ClassVar[tuple[str, ...]] = ("AUTO",)
    default_k: ClassVar[int | None] = max(k for _, k, _ in HEURISTIC)

    def validate(self, cfg: DeploymentConfig) -> list[tuple[str, str]]:
        errors = []
        if cfg.speculation.max_concurrency is not None:
            errors.append(("speculation.max_concurrency", "AUTO ignores it: its heuristic stops above 32 requests"))
        if cfg.speculation.policy != "auto":
            errors.append(("speculation.policy", "AUTO chooses K by its own heuristic; set policy: auto"))
        return errors

    def speculative_config(self, cfg: DeploymentConfig, k: int, draft_dir: str | None) -> dict[str, Any] | None:
        return {"decoding_type": "AUTO"}  # the base fields (max_draft_len) are ignored

    def served_draft_len(self, spec: dict[str, Any]) -> int:
        return self.default_k  # the heuristic's longest; the served config carries none

    def k_policy(self) -> KPolicy | None:
        from trtspec.speculative.policy import TableK

        return TableK(tuple((ceiling, k) for ceiling, k, _ in HEURISTIC))

    def drafter(self, target: Transformer, draft: Transformer | None, settings: dict[str, Any]) -> Drafter | None:
        from trtspec.speculative.drafters import NgramDrafter

        class HeuristicNgram(NgramDrafter):
            def ngram_size(self, batch: int) -> int:
                return next((size for ceiling, _, size in HEURISTIC if batch <= ceiling), HEURISTIC[-1][2])

        return HeuristicNgram(max_ngram=HEURISTIC[0][2])
