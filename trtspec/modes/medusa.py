"""Medusa: K extra heads on the target's last hidden state each guess one more future token; the guesses
form a tree the target verifies in one pass. The heads are a checkpoint of their own, folded into the target
engine at conversion. Compiled engines only.

Sources (github.com/NVIDIA/TensorRT-LLM): examples/medusa/README.md and convert_checkpoint.py @ 063e02f7
(`--model_dir --medusa_model_dir --output_dir --dtype --num_medusa_heads`, default 4 heads,
`--max_medusa_token_len` default 63, `--tp_size`, `--pp_size`; FP16/BF16; SM >= 8.0); `trtllm-build
--speculative_decoding_mode medusa` (commands/build.py choices, the Triton speculative-decoding tutorial;
NVIDIA's CLI examples pass no --max_draft_len: the converted checkpoint carries it);
`SpeculativeDecodingMode.MEDUSA` (tensorrt_llm/models/modeling_utils.py); Triton's tensorrt_llm parameters
`decoding_mode` medusa and `medusa_choices` ("{0, 0, 0}, {0, 1}" form; mc_sim_7b_63 by default;
tensorrtllm_backend docs/model_config.md @ 05ceae03); the LLM API's MedusaDecodingConfig is not a
pytorch-backend config. The engine path ends with 1.2.x.

trtspec's torch runner runs the heads for generate, plan and the benchmark: their argmax chain, a tree it
grows (speculation.tree), or the static tree `medusa.choices` gives, as the engine verifies it. On backend
torch the engine flavour builds and serves that static tree, as TensorRT-LLM serves Medusa from compiled
engines: the heads are cast into the build's draft folder, the torch engine records `medusa` and max_token_len
as max_draft_len, and trtspec's tensorrt_llm stand-in reads the tree back from `medusa_choices`. The
llmapi flavour refuses Medusa (the LLM API has no Medusa config), and so does a config without choices
(trtspec has no copy of the backend's default tree; `trtspec init` writes one, `runner_up_once_tree`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import Field

from trtspec.config_types import Int, PositiveInt, Section
from trtspec.families import MEDUSA_FAMILIES, TORCH_RUNNER_FAMILIES
from trtspec.modes.base import SpecMode, Support
from trtspec.speculative.requests import MAX_TREE_NODES
from trtspec.versions import engine_minors

if TYPE_CHECKING:
    from trtspec.build.recipes import Command
    from trtspec.check import Report
    from trtspec.checkpoints.inspect import CheckpointInfo
    from trtspec.config import DeploymentConfig, ModelSection
    from trtspec.families import Family
    from trtspec.speculative.drafters import Drafter
    from trtspec.speculative.model import Transformer
    from trtspec.speculative.tree import TreeShape

MEDUSA_FOLDER = "medusa"  # examples/medusa/convert_checkpoint.py
HEADS_KEY = "medusa_num_heads"  # a heads folder's config.json: how many heads (FasterDecoding/Medusa's layout)
DEFAULT_TOKEN_LEN = 63  # convert_checkpoint.py --max_medusa_token_len's default: the tree's nodes
# the backend's default tree, Medusa's mc_sim_7b_63 (FasterDecoding/Medusa medusa/model/medusa_choices.py): 63
# nodes, paths up to 4 deep, so it needs 4 heads and room for 63 drafts
DEFAULT_TREE_DEPTH, DEFAULT_TREE_NODES = 4, 63


def counted_heads(config: dict[str, Any]) -> int | None:
    """The heads a config.json counts; None where it is no Medusa heads folder's (null, 0 or true counts none)."""
    heads = config.get(HEADS_KEY)
    return heads if isinstance(heads, int) and not isinstance(heads, bool) and heads > 0 else None


def runner_up_once_tree(depth: int, nodes: int | None = None) -> list[list[int]]:
    """A static tree for `depth` heads in at most `nodes` nodes (None: all): the paths that take a head's
    second guess at most once, shallow first (2 heads: [0], [1], [0, 0], [0, 1], [1, 0]; depth(depth + 3) / 2
    nodes before the cut, which keeps every kept path's parent). It spends the nodes where acceptance is
    highest, the heads' best guesses, as mc_sim_7b_63 does, without a copy of a tree calibrated for another
    model."""
    paths = [[0] * d for d in range(1, depth + 1)]
    paths += [[*p[:i], 1, *p[i + 1 :]] for p in paths for i in range(len(p))]
    return sorted(paths, key=lambda p: (len(p), p))[:nodes]


def default_tree_problem(settings: MedusaSection, backend: str) -> str | None:
    """Why a config without choices cannot be served by the backend's default tree, mc_sim_7b_63 (None: it can)."""
    if backend == "torch":
        return "trtspec has no copy of the backend's default mc_sim_7b_63"
    if settings.num_heads < DEFAULT_TREE_DEPTH or settings.max_token_len < DEFAULT_TREE_NODES:
        return (
            f"the backend's default mc_sim_7b_63 needs num_heads >= {DEFAULT_TREE_DEPTH} and max_token_len >= "
            f"{DEFAULT_TREE_NODES}"
        )
    return None


def choices_text(choices: list[list[int]]) -> str:
    """medusa_choices as Triton's tensorrt_llm model takes it: "{0}, {0, 0}, {1}"."""
    return ", ".join("{" + ", ".join(str(i) for i in path) + "}" for path in choices)


def parse_choices(text: str) -> list[list[int]]:
    """choices_text's inverse; a malformed value is a ValueError naming it."""
    path = r"\{\s*\d+(?:\s*,\s*\d+)*\s*\}"
    if not re.fullmatch(rf"\s*{path}(?:\s*,\s*{path})*\s*", text):
        raise ValueError(f"medusa_choices must read like {{0}}, {{0, 0}}, {{1}}; got {text!r}")
    return [[int(i) for i in found.split(",")] for found in re.findall(r"\{([^{}]*)\}", text)]


def choices_problem(choices: list[list[int]]) -> str | None:
    """Why a tree of paths is not one Medusa can verify: each path's parent must be a path too, none twice."""
    seen = {tuple(c) for c in choices}
    if any(not c for c in choices) or len(seen) < len(choices):
        return "each path must be non-empty and given once"
    orphan = next((c for c in choices if len(c) > 1 and tuple(c[:-1]) not in seen), None)
    return f"the path {orphan} has no parent {orphan[:-1]} among the paths" if orphan else None


class MedusaSection(Section):
    """Medusa settings (trtspec.modes.medusa); the heads checkpoint is the `draft` section."""

    num_heads: PositiveInt = Field(default=4, le=16, description="num_medusa_heads: heads the tree may use")
    max_token_len: PositiveInt = Field(
        default=DEFAULT_TOKEN_LEN, le=1024, description="max_medusa_token_len: tree nodes, the engine's max_draft_len"
    )
    choices: list[Annotated[list[Annotated[Int, Field(ge=0)]], Field(min_length=1)]] | None = Field(
        default=None,
        min_length=1,
        description="medusa_choices: the tree's paths, [[0], [0, 0], [1], ...]; default mc_sim_7b_63",
    )


class Medusa(SpecMode):
    name: ClassVar[str] = "medusa"
    support: ClassVar[tuple[Support, ...]] = (
        Support(
            "medusa",
            "tensorrt",
            engine_minors(),
            8.0,
            MEDUSA_FAMILIES,
            note="target + heads converted by examples/medusa, built with speculative_decoding_mode medusa",
        ),
        Support("medusa", "pytorch", (), None, (), note="does not exist: MedusaDecodingConfig is engines only"),
        Support(
            "medusa",
            "torch",
            None,
            None,
            TORCH_RUNNER_FAMILIES,
            note="runner (generate, plan, bench): the heads' chain or a tree; the engine flavour serves medusa.choices",
        ),
    )
    needs_draft: ClassVar[bool] = True  # the heads checkpoint
    draft_head: ClassVar[bool] = True
    draft_role: ClassVar[str] = "the Medusa heads trained for the target"
    in_target: ClassVar[bool] = True
    section: ClassVar[str | None] = "medusa"
    settings_model: ClassVar[type[Section] | None] = MedusaSection
    engine_mode: ClassVar[str | None] = "medusa"
    build_sets_max_draft_len: ClassVar[bool] = False
    default_k: ClassVar[int | None] = None
    runner_trees: ClassVar[bool] = True
    torch_engine_mode: ClassVar[str | None] = "medusa"
    torch_flavour: ClassVar[str] = "engine"

    def torch_deploy_refusal(self, cfg: DeploymentConfig) -> str | None:
        if why := super().torch_deploy_refusal(cfg):
            return why
        if self.settings(cfg).choices is None:
            return (
                "backend torch serves the static tree medusa.choices gives, as TensorRT-LLM's engines verify it: "
                f"set medusa.choices ({default_tree_problem(self.settings(cfg), 'torch')})"
            )
        return None

    def fixed_draft_len(self, cfg: DeploymentConfig) -> int | None:
        if cfg.build.backend == "torch" and self.settings(cfg).choices is None:  # the runner's chain or tree
            return None
        # the engine's room for a tree (as convert_checkpoint's --max_medusa_token_len): medusa_choices may
        # change at serve time within it; speculation.num_draft_tokens does not apply
        return self.settings(cfg).max_token_len

    def tree_draft_len(self, settings: dict[str, Any]) -> int | None:
        choices = settings.get("choices")
        return len(choices) if choices else None

    def runner_tree(self, settings: dict[str, Any]) -> TreeShape | None:
        from trtspec.speculative.drafters import MedusaDrafter

        choices = settings.get("choices")
        return MedusaDrafter.static_shape(choices) if choices else None

    def load_draft(self, path: Path, dtype: Any, device: str, max_len: int) -> Any:
        from trtspec.speculative.heads import load_heads

        return load_heads(path, dtype=dtype, device=device)

    def drafter(self, target: Transformer, draft: Any, settings: dict[str, Any]) -> Drafter | None:
        from trtspec.errors import UsageError
        from trtspec.speculative.drafters import MedusaDrafter

        cfg = draft.config()
        if (cfg["hidden_size"], cfg["vocab_size"]) != (target.dims.hidden_size, target.dims.vocab_size):
            raise UsageError(
                f"the Medusa heads read hidden size {cfg['hidden_size']} and write vocabulary {cfg['vocab_size']}; "
                f"the target has {target.dims.hidden_size} and {target.dims.vocab_size}: heads for another model"
            )
        choices = settings.get("choices")
        if choices and (why := choices_problem(choices)):
            raise UsageError(f"medusa.choices: {why}")
        if choices and (top := max(i for c in choices for i in c)) >= target.dims.vocab_size:
            raise UsageError(f"medusa.choices ranks a head's guess {top}; the vocabulary has {target.dims.vocab_size}")
        if choices and max(map(len, choices)) > draft.num_heads:
            raise UsageError(
                f"medusa.choices has a path {max(map(len, choices))} deep; the heads checkpoint has {draft.num_heads}"
            )
        if draft.needs_target_head:
            draft.tie(target.lm_head.weight)
        return MedusaDrafter(draft, choices)

    def validate(self, cfg: DeploymentConfig) -> list[tuple[str, str]]:
        errors = []
        s, torch = self.settings(cfg), cfg.build.backend == "torch"
        if "num_draft_tokens" in cfg.speculation.model_fields_set and (s.choices or not torch):
            errors.append(("speculation.num_draft_tokens", "Medusa's drafts are its tree (medusa.choices); remove it"))
        for field, section in (("target", cfg.target), ("draft", cfg.draft)):
            if section is not None and section.quantization != "none":
                errors.append((f"{field}.quantization", "Medusa's convert takes FP16/BF16 weights only (README)"))
        if s.choices is None:
            if not torch and (why := default_tree_problem(s, cfg.build.backend)):
                errors.append(("medusa.choices", f"unset: {why}; set choices to fit"))
            return errors
        deepest, nodes = max(map(len, s.choices)), len(s.choices)
        if why := choices_problem(s.choices):
            errors.append(("medusa.choices", why))
        if deepest > s.num_heads:
            why = f"a path of depth {deepest} needs {deepest} heads, num_heads is {s.num_heads}"
            errors.append(("medusa.choices", why))
        if nodes > s.max_token_len:
            errors.append(("medusa.choices", f"{nodes} nodes, more than max_token_len {s.max_token_len}"))
        if torch and nodes > MAX_TREE_NODES:
            errors.append(("medusa.choices", f"{nodes} nodes; the torch runner verifies at most {MAX_TREE_NODES}"))
        if torch and cfg.speculation.tree is not None:
            errors.append(("speculation.tree", "medusa.choices is the tree; set one or the other"))
        return errors

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
        from trtspec.build.recipes import Command

        b, s = cfg.build, self.settings(cfg)
        args = [
            f"--model_dir={model_dir}",
            f"--medusa_model_dir={heads_dir}",
            f"--output_dir={output_dir}",
            f"--dtype={dtype}",
            f"--num_medusa_heads={s.num_heads}",
        ]
        if s.max_token_len != DEFAULT_TOKEN_LEN:
            args.append(f"--max_medusa_token_len={s.max_token_len}")
        args += [f"--tp_size={b.tp}"] if b.tp > 1 else []
        args += [f"--pp_size={b.pp}"] if b.pp > 1 else []
        return Command("convert_checkpoint.py", tuple(args), family=MEDUSA_FOLDER)

    def triton_parameters(self, cfg: DeploymentConfig) -> dict[str, str]:
        choices = self.settings(cfg).choices
        params = {"decoding_mode": "medusa"}
        if choices is not None:  # unset: the backend's mc_sim_7b_63
            params["medusa_choices"] = choices_text(choices)
        return params

    def triton_settings(self, parameters: dict[str, str]) -> dict[str, Any]:
        from trtspec.errors import UsageError

        if "medusa_choices" not in parameters:
            return {}
        try:
            choices = parse_choices(parameters["medusa_choices"])
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if why := choices_problem(choices):
            raise UsageError(f"medusa_choices: {why}")
        return {"choices": choices}

    def init_sections(
        self, target: str, hf_config: dict[str, Any], draft_config: dict[str, Any], backend: str
    ) -> dict[str, Any]:
        """As many heads as the checkpoint has; a tree of its own where the backend's default does not fit
        (backend torch has no copy of mc_sim_7b_63, which needs 4 heads), so the config builds as written."""
        section = MedusaSection()
        if heads := counted_heads(draft_config):
            section.num_heads = heads
        if default_tree_problem(section, backend):
            room = section.max_token_len if backend != "torch" else min(section.max_token_len, MAX_TREE_NODES)
            section.choices = runner_up_once_tree(section.num_heads, room)
        return {self.section: section.model_dump()}

    def claims_draft(self, draft_config: dict[str, Any]) -> bool:
        """A heads folder's config.json counts its heads (FasterDecoding/Medusa's layout, and trtspec's)."""
        return counted_heads(draft_config) is not None

    def check(
        self, cfg: DeploymentConfig, target: CheckpointInfo | None, draft: CheckpointInfo | None, report: Report
    ) -> None:
        """The heads checkpoint says how many heads it has (its config.json's HEADS_KEY)."""
        if draft is None:
            return
        heads = counted_heads(draft.config)
        if heads is None:
            report.add(
                "error",
                "medusa-heads",
                f"draft {draft.path}: its config.json counts no heads ({HEADS_KEY}): no Medusa heads folder",
                "point draft at the heads trained for the target (FasterDecoding/Medusa's layout: config.json with "
                f"{HEADS_KEY} beside medusa_lm_head weights); a model checkpoint is draft-target's draft",
            )
            return
        from trtspec.speculative.heads import TIED

        if draft.config.get(TIED) and cfg.build.backend != "torch":
            report.add(
                "error",
                "medusa-heads",
                "the heads checkpoint stores no output matrices (trtspec's tied layout: they are the target's "
                "lm_head); TensorRT-LLM's converter needs them",
                "write the full layout: tools/train_medusa_heads.py --untied, or MedusaHeads.save(tied=False)",
            )
        if heads < self.settings(cfg).num_heads:
            report.add(
                "error",
                "medusa-heads",
                f"medusa.num_heads is {self.settings(cfg).num_heads}, the heads checkpoint has {heads}",
                f"set medusa.num_heads to at most {heads}",
            )
