"""Plain decoding: the baseline every speculative mode is measured against."""

from __future__ import annotations

from typing import ClassVar

from trtspec.families import ENGINE_FAMILIES, TORCH_RUNNER_FAMILIES
from trtspec.modes.base import SpecMode, Support
from trtspec.versions import engine_minors, supported_minors


class NoSpeculation(SpecMode):
    name: ClassVar[str] = "none"
    support: ClassVar[tuple[Support, ...]] = (
        Support("none", "tensorrt", engine_minors(), 7.0, ENGINE_FAMILIES),
        Support("none", "pytorch", supported_minors(), 7.0, None),
        Support("none", "torch", None, None, TORCH_RUNNER_FAMILIES),
    )

    def speculates(self) -> bool:
        return False
