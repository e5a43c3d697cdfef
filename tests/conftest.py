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


def pbtxt_parameters(config_pbtxt: Path) -> dict[str, str]:
    """A config.pbtxt's parameters, parsed by Triton's own protobuf."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse(config_pbtxt.read_text(), model_config_pb2.ModelConfig())
    return {key: value.string_value for key, value in config.parameters.items()}
