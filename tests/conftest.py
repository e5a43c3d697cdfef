"""Shared fixtures: paths of the repository, the shared data beside it, and a CLI runner."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
CONFIGS = REPO / "configs"


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()
