"""The registry of speculative modes: each stage asks the mode, never compares its name."""

from __future__ import annotations

from trtspec.errors import UsageError
from trtspec.modes.auto import Auto
from trtspec.modes.base import BACKENDS, SpecMode, Support
from trtspec.modes.draft_target import DraftTarget
from trtspec.modes.eagle3 import Eagle3
from trtspec.modes.lookahead import Lookahead
from trtspec.modes.medusa import Medusa
from trtspec.modes.mtp import MTP
from trtspec.modes.ngram import NGram
from trtspec.modes.none import NoSpeculation
from trtspec.modes.self_draft import SelfDraft

# the order `trtspec init --help`, the README's support table and the docs list them in
MODES: tuple[SpecMode, ...] = (
    DraftTarget(),
    Eagle3(),
    MTP(),
    NGram(),
    Auto(),
    Medusa(),
    SelfDraft(),
    Lookahead(),
    NoSpeculation(),
)
REGISTRY: dict[str, SpecMode] = {m.name: m for m in MODES}
MODE_NAMES: tuple[str, ...] = tuple(REGISTRY)
# what the torch runner can run (`generate --mode`, the bench)
RUNNER_MODES: tuple[str, ...] = tuple(m.name for m in REGISTRY.values() if m.row("torch").exists)


def get_mode(name: str) -> SpecMode:
    try:
        return REGISTRY[name]
    except KeyError:
        raise UsageError(f"mode must be one of {', '.join(MODE_NAMES)}, got {name!r}") from None


def mode_for_decoding_type(decoding_type: str) -> SpecMode | None:
    """The mode a served `speculative_config.decoding_type` names (any version's spelling)."""
    for mode in REGISTRY.values():
        if decoding_type in mode.decoding_types:
            return mode
    return None


def mode_for_draft(draft_config: dict) -> SpecMode | None:
    """The mode whose own kind of draft checkpoint this is (a head), None for a model any drafting mode reads."""
    return next((mode for mode in REGISTRY.values() if mode.claims_draft(draft_config)), None)


# the modes whose draft is a head on the target, known by its config.json (claims_draft), as messages name them
HEAD_MODE_NAMES: str = " or ".join(m.name for m in REGISTRY.values() if m.draft_head)


def wrong_draft(draft: str, head: SpecMode, mode: str) -> str:
    """What init and check say of a head configured as another mode's draft."""
    return f"{draft} is {head.draft_role}, not a draft for mode {mode}"


__all__ = [
    "BACKENDS",
    "HEAD_MODE_NAMES",
    "MODES",
    "MODE_NAMES",
    "REGISTRY",
    "RUNNER_MODES",
    "SpecMode",
    "Support",
    "get_mode",
    "mode_for_decoding_type",
    "mode_for_draft",
    "wrong_draft",
]
