"""Shared fixtures: paths of the repository and a CLI runner."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def require_tool(name: str, install: str) -> str:
    """A command the tests need: skipped where it is missing, but a failure in CI (which installs it)."""
    found = shutil.which(name)
    if not found:
        if os.environ.get("CI"):
            pytest.fail(f"{name} is not installed ({install})")
        pytest.skip(f"{name} is not installed ({install})")
    return found
