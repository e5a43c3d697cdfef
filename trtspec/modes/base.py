"""A speculative mode as one object: every fact a stage needs about it is declared on its class.

TensorRT-LLM models `speculative_config` as one class per mode (tensorrt_llm/llmapi/llm_args.py); trtspec
does the same for the whole pipeline, so adding a mode is one module here plus its tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import ValidationError

from trtspec.config_types import Section
from trtspec.errors import UsageError
from trtspec.versions import at_least, supported_minors

if TYPE_CHECKING:
    from trtspec.build.recipes import Command
    from trtspec.check import Report
    from trtspec.checkpoints.inspect import CheckpointInfo
    from trtspec.config import DeploymentConfig, ModelSection
    from trtspec.families import Family
    from trtspec.speculative.batch import KPolicy
    from trtspec.speculative.drafters import Drafter
    from trtspec.speculative.model import Transformer
    from trtspec.speculative.tree import TreeShape

BACKENDS = ("tensorrt", "pytorch", "torch")  # compiled engines, TensorRT-LLM's LLM API, trtspec's runner


@dataclass(frozen=True)
class Support:
    """Where a mode exists on one backend; `versions == ()` records that it does not exist there."""

    mode: str
    backend: str
    versions: tuple[str, ...] | None  # minor releases where it exists; None: needs no TensorRT-LLM
    min_sm: float | None  # minimum compute capability; None: no GPU needed
    architectures: tuple[str, ...] | None  # None: any the backend runs
    unverified_architectures: tuple[str, ...] = ()  # reported to work, not in the docs' table
    note: str = ""

    @property
    def exists(self) -> bool:
        return self.versions is None or bool(self.versions)


class SpecMode:
    """One speculative mode. Subclasses set the class variables and override what they add."""

    name: ClassVar[str]
    support: ClassVar[tuple[Support, ...]]  # one row per backend in BACKENDS
    needs_draft: ClassVar[bool] = False  # a second checkpoint: the `draft` section and a draft engine/model
    draft_engine: ClassVar[bool] = False  # the draft runs as a model of its own: a second engine, Triton's BLS loop
    draft_head: ClassVar[bool] = False  # that checkpoint is a head on the target's states: no tokenizer of its own
    draft_role: ClassVar[str] = ""  # what the draft checkpoint is, for messages
    in_target: ClassVar[bool] = False  # the target drafts by itself (MTP layers, heads): one engine, no draft model
    refuses_draft: ClassVar[bool] = False  # a `draft` section is a mistake (the drafter is elsewhere)
    section: ClassVar[str | None] = None  # the DeploymentConfig field holding this mode's own settings ...
    settings_model: ClassVar[type[Section] | None] = None  # ... and their model, defined beside the mode
    decoding_types: ClassVar[tuple[str, ...]] = ()  # speculative_config.decoding_type spellings it reads back
    served_settings: ClassVar[tuple[str, ...]] = ()  # speculative_config fields the served torch runner reads
    # section fields TensorRT-LLM has no key for: the llmapi model.yaml carries them in its own `trtspec` section
    runner_only_settings: ClassVar[tuple[str, ...]] = ()
    engine_mode: ClassVar[str | None] = None  # trtllm-build --speculative_decoding_mode of the target engine
    build_sets_max_draft_len: ClassVar[bool] = True  # trtllm-build gets --max_draft_len (else the checkpoint has it)
    torch_engine_mode: ClassVar[str | None] = None  # the mode trtspec's torch engine stand-ins record
    engine_streams: ClassVar[bool] = True  # the engine flavour can stream it (the BLS loop cannot)
    llm_api_extra: ClassVar[dict[str, Any]] = {}  # LLM API options the mode sets besides speculative_config
    default_k: ClassVar[int | None] = 4  # what `trtspec init` writes (None: the mode's settings fix K)
    torch_deploys: ClassVar[bool] = (
        True  # `trtspec build` makes a torch engine of it (else runner only: generate, plan, bench)
    )
    torch_flavour: ClassVar[str] = "llmapi"  # the flavour that serves it on backend torch (`trtspec init` writes it)
    runner_trees: ClassVar[bool] = False  # the torch runner's drafter also proposes token trees (speculation.tree)

    def settings(self, cfg: DeploymentConfig) -> Any:
        """The mode's section as configured, or its defaults."""
        value = getattr(cfg, self.section, None) if self.section else None
        if value is None and self.settings_model is not None:
            return self.settings_model()
        return value

    def row(self, backend: str) -> Support:
        for row in self.support:
            if row.backend == backend:
                return row
        raise KeyError((self.name, backend))

    def where(self, besides: str | None = None) -> str:
        """Where the mode exists (other than backend `besides`), for errors that refuse it elsewhere:
        'pytorch (TensorRT-LLM 1.0-1.2), torch'."""
        places = []
        for row in self.support:
            if not row.exists or row.backend == besides:
                continue
            if row.versions is None:
                places.append(row.backend)
            else:
                places.append(f"{row.backend} (TensorRT-LLM {_span(row.versions)})")
        return ", ".join(places)

    def extra_options(self, cfg: DeploymentConfig) -> dict[str, Any]:
        """LLM API options the mode sets besides speculative_config."""
        return dict(self.llm_api_extra)

    def torch_deploy_refusal(self, cfg: DeploymentConfig) -> str | None:
        """Why `trtspec build` cannot make a torch engine of this configuration (None: it can)."""
        if self.torch_deploys and self.torch_flavour == "engine" and cfg.serve.flavour != "engine":
            return (
                f"mode {self.name} has no LLM API config (TensorRT-LLM serves it from compiled engines only), so the "
                "llmapi flavour cannot serve it: set serve.flavour engine, which serves it as TensorRT-LLM's engines do"
            )
        if self.torch_deploys:
            return None
        return (
            f"mode {self.name} runs in trtspec's torch runner (generate, plan, bench) but is not built or served on "
            f"backend torch yet; build it for {self.where(besides='torch')}"
        )

    def fixed_draft_len(self, cfg: DeploymentConfig) -> int | None:
        """Drafts per step the mode's own settings fix (None: speculation.num_draft_tokens)."""
        return None

    def drafts_per_step(self, cfg: DeploymentConfig) -> int:
        """Tokens a step may draft, as sequence lengths must leave room for (0 while `auto` awaits plan)."""
        if not self.speculates():
            return 0
        fixed = self.fixed_draft_len(cfg)
        k = cfg.speculation.num_draft_tokens
        return fixed if fixed is not None else (k if isinstance(k, int) else 0)

    def engine_draft_len(self, cfg: DeploymentConfig, k: int) -> int:
        """The target engine's max_draft_len for K drafts per step: what the mode's settings fix, else K."""
        fixed = self.fixed_draft_len(cfg)
        return fixed if fixed is not None else k

    def validate(self, cfg: DeploymentConfig) -> list[tuple[str, str]]:
        """Config rules of this mode beyond the common ones (field, fix)."""
        return []

    def init_sections(
        self, target: str, hf_config: dict[str, Any], draft_config: dict[str, Any], backend: str
    ) -> dict[str, Any]:
        """The mode's own config sections as `trtspec init` writes them, from the target's (and draft's) config.json."""
        return {self.section: self.settings_model().model_dump()} if self.section and self.settings_model else {}

    def claims_draft(self, draft_config: dict[str, Any]) -> bool:
        """Whether a draft checkpoint's config.json marks it as this mode's alone (a head, not a model): `init`
        picks the mode from it, and `check` names it when another mode is configured."""
        return False

    def check(
        self, cfg: DeploymentConfig, target: CheckpointInfo | None, draft: CheckpointInfo | None, report: Report
    ) -> None:
        """What `trtspec check` verifies for this mode beyond the common checks (support, tokenizers, limits)."""

    def speculative_config(self, cfg: DeploymentConfig, k: int, draft_dir: str | None) -> dict[str, Any] | None:
        """The LLM API's `speculative_config` for the configured TensorRT-LLM version (None: no speculation)."""
        return None

    def drafter(self, target: Transformer, draft: Transformer | None, settings: dict[str, Any]) -> Drafter | None:
        """The torch runner's drafter (None: plain decoding); `settings` are the mode's section's fields."""
        return None

    def runner_tree(self, settings: dict[str, Any]) -> TreeShape | None:
        """The token tree the runner's drafter verifies where the mode's own settings fix it (lookahead's
        (W, N, G)); None where K or speculation.tree choose it."""
        return None

    def tree_draft_len(self, settings: dict[str, Any]) -> int | None:
        """The engine max_draft_len the tree these settings fix needs (None: no such tree); a served engine
        refuses settings that need more than it was built with, as TensorRT-LLM's does."""
        return None

    def engine_room_problem(self, settings: dict[str, Any], engine: dict[str, Any]) -> str | None:
        """Why an engine (its config: a compiled engine's config.json, a torch engine's engine.json) cannot
        run the tree these settings fix (None: it can). TensorRT-LLM's executor takes settings that need up to
        the engine's max_draft_len (trtGptModelInflightBatching.cpp: `maxDraftTokens <= getMaxDecodingDraftTokens`)."""
        need = self.tree_draft_len(settings)
        room = engine.get("build_config", {}).get("max_draft_len")
        if need is None or (isinstance(room, int) and need <= room):
            return None
        return f"the engine was built with max_draft_len {room}; the {self.name} settings need {need}"

    def own_tree(self, cfg: DeploymentConfig) -> TreeShape | None:
        """runner_tree for the config's section (its defaults where the config has none)."""
        section = self.settings(cfg)
        return self.runner_tree(section.model_dump() if section is not None else {})

    def drafts_label(self, cfg: DeploymentConfig, k: Any) -> str:
        """What a step drafts, for one-line summaries: K, or on backend torch the tree the settings fix."""
        tree = self.own_tree(cfg) if cfg.build.backend == "torch" else None
        return f"the {tree} tree its settings give" if tree is not None else f"num_draft_tokens {k}"

    def load_draft(self, path: Path, dtype: Any, device: str, max_len: int) -> Any:
        """The draft checkpoint as the torch runner holds it (a model; heads override)."""
        from trtspec.speculative.model import load_transformer

        return load_transformer(path, dtype=dtype, device=device, max_len=max_len, draft_for=self.name)

    def runner_settings(self, spec: dict[str, Any]) -> dict[str, Any]:
        """The mode's section fields (as its drafter reads them) from a served model.yaml's speculative_config,
        held to the section's rules before any model loads (a hand-written yaml is checked by nothing else)."""
        values = {f: spec[f] for f in self.served_settings if f in spec}
        if values and self.settings_model is not None:
            try:
                self.settings_model(**values)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = f"speculative_config.{first['loc'][0]}"
                raise UsageError(f"{where}: {first['msg']} (got {first['input']!r})") from None
        return values

    def served_draft_len(self, spec: dict[str, Any]) -> int:
        """K as a served model.yaml's speculative_config gives it."""
        return int(spec.get("max_draft_len") or 0)

    def convert_command(
        self,
        cfg: DeploymentConfig,
        section: ModelSection,
        model_dir: str,
        heads_dir: str | None,
        output_dir: str,
        family: Family | None,
        dtype: str,
    ) -> Command | None:
        """The target's conversion when the mode has its own (None: the family's convert_checkpoint.py)."""
        return None

    def torch_engine_settings(self, cfg: DeploymentConfig) -> dict[str, Any]:
        """What trtspec's torch engine records for the target beyond the common limits."""
        return {}

    def triton_parameters(self, cfg: DeploymentConfig) -> dict[str, str]:
        """Parameters of the tensorrt_llm model's config.pbtxt the mode sets (NVIDIA's template keys)."""
        return {}

    def triton_settings(self, parameters: dict[str, str]) -> dict[str, Any]:
        """The section's fields back from those parameters, as trtspec's tensorrt_llm stand-in runs them."""
        return {}

    def k_policy(self) -> KPolicy | None:
        """K per step the mode prescribes itself (None: the config's policy, fixed or adaptive)."""
        return None

    def speculates(self) -> bool:
        return True


def _span(versions: tuple[str, ...]) -> str:
    """'1.0-1.2' for a run of consecutive releases, else each: '1.0, 1.2'."""
    known = supported_minors()
    first = known.index(versions[0]) if versions[0] in known else -1
    if len(versions) > 1 and first >= 0 and known[first : first + len(versions)] == versions:
        return f"{versions[0]}-{versions[-1]}"
    return ", ".join(versions)


def draft_model_key(version: str) -> str:
    """1.0 and 1.1 name the draft checkpoint `speculative_model_dir`; 1.2 `speculative_model` (the old name
    stays an alias) (llm_args.py DecodingBaseConfig, ref trtllm §2.2)."""
    return "speculative_model" if at_least(version, "1.2") else "speculative_model_dir"
