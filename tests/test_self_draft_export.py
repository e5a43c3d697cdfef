"""`trtspec export-self-draft`: a self-draft written as the draft-target pair TensorRT-LLM deploys.

The cut checkpoint is the runner's self-draft, weight for weight (same logits); the config it writes runs the
same draft (same tokens, same acceptance) and builds on backend torch; what cannot be exported is refused in one
line with nothing written, and nothing already written is lost without --force.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner
from tiny_models import make_checkpoint

from trtspec.checkpoints.self_draft import cut_checkpoint
from trtspec.cli import cli
from trtspec.config import load_config
from trtspec.speculative.factory import runner_for
from trtspec.speculative.model import load_transformer
from trtspec.speculative.runner import GenerationParams
from trtspec.speculative.self_draft import self_draft_model

PROMPTS = [[3, 4, 5, 6, 7], [9, 10, 11], [12, 13, 14, 15, 16, 17, 18, 12, 13]]


@pytest.fixture(scope="module")
def target_path(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("export")
    path = make_checkpoint(root / "t", vocab=50, hidden=32, layers=3, heads=4, kv_heads=2, mtp_layers=1, seed=5)
    hf = json.loads((path / "config.json").read_text())
    hf["layer_types"] = ["full_attention", "sliding_attention", "full_attention"]  # a per-layer list, as Qwen3's
    (path / "config.json").write_text(json.dumps(hf))
    return path


def write_config(folder: Path, target: Path, section: dict, backend: str = "torch") -> Path:
    data = {
        "name": "tiny",
        "target": {"checkpoint": str(target)},
        "self_draft": section,
        "speculation": {"mode": "self-draft", "num_draft_tokens": 3},
        "build": {"backend": backend},
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tiny.yaml").write_text(yaml.safe_dump(data))
    return folder / "tiny.yaml"


def export(config: Path, *args: str):
    return CliRunner().invoke(cli, ["export-self-draft", str(config), *args])


@torch.inference_mode()
def test_the_cut_checkpoint_is_the_runners_self_draft(target_path, tmp_path):
    cut_checkpoint(target_path, [0, 2], tmp_path / "cut")
    hf = json.loads((tmp_path / "cut" / "config.json").read_text())
    assert hf["num_hidden_layers"] == 2 and "num_nextn_predict_layers" not in hf
    assert json.loads((tmp_path / "cut" / "trtspec-self-draft.json").read_text())["layers"] == [0, 2]
    assert hf["layer_types"] == ["full_attention", "full_attention"]  # layers 0 and 2's entries
    cut, target = load_transformer(tmp_path / "cut"), load_transformer(target_path)
    expected = self_draft_model(target, [0, 2])
    tokens = torch.tensor([[3, 4, 5, 6, 7, 8]])
    positions = torch.arange(6)[None]
    got = cut(tokens, positions, cut.new_cache(1, 8)).logits
    want = expected(tokens, positions, expected.new_cache(1, 8)).logits
    assert torch.equal(got, want)
    assert not torch.equal(got, target(tokens, positions, target.new_cache(1, 8)).logits)


def test_the_exported_config_runs_the_same_draft_and_builds(target_path, tmp_path, monkeypatch):
    config = write_config(tmp_path / "configs", target_path, {"layers": [0, 1]})
    result = export(config)
    assert result.exit_code == 0, result.output
    written = tmp_path / "configs" / "tiny-draft-target.yaml"
    exported = load_config(written)
    assert exported.mode == "draft-target" and exported.self_draft is None
    assert exported.draft.checkpoint == "./self-draft/tiny"  # beside the config: the pair moves together
    ran = [runner_for(load_config(c)).generate(PROMPTS, GenerationParams(max_tokens=24)) for c in (config, written)]
    assert [g.tokens for g in ran[0]] == [g.tokens for g in ran[1]]
    for stat in ("accepted_tokens", "draft_tokens"):
        counts = [sum(getattr(g.stats, stat) for g in out) for out in ran]
        assert counts[0] == counts[1] > 0, stat
    monkeypatch.chdir(tmp_path)
    built = CliRunner().invoke(cli, ["build", str(written), "--no-package"])
    assert built.exit_code == 0, built.output
    assert json.loads((tmp_path / "engines" / "tiny" / "draft" / "config.json").read_text())["num_hidden_layers"] == 2


def test_nothing_written_is_lost_without_force(target_path, tmp_path):
    config = write_config(tmp_path, target_path, {"layers": [0]})
    assert export(config).exit_code == 0
    marker = tmp_path / "self-draft" / "tiny" / "notes.txt"
    marker.write_text("mine")
    again = export(config)
    assert again.exit_code == 2 and "already exists" in again.output and "--force" in again.output
    assert marker.read_text() == "mine"
    (tmp_path / "tiny-draft-target.yaml").unlink()  # the checkpoint folder alone also holds it back
    again = export(config)
    assert again.exit_code == 2 and "self-draft/tiny: already exists" in again.output
    assert marker.exists() and not (tmp_path / "tiny-draft-target.yaml").exists()
    assert export(config, "--force").exit_code == 0
    assert not marker.exists() and (tmp_path / "tiny-draft-target.yaml").exists()
    # --force replaces a checkpoint folder, never another folder, a file, the target or the config's folder
    (tmp_path / "mine").mkdir()  # a checkpoint of the user's own: not a cut this command wrote
    (tmp_path / "mine" / "notes.txt").write_text("mine")
    (tmp_path / "mine" / "config.json").write_text("{}")
    (tmp_path / "file").write_text("mine")
    assert export(config, "--force", "--out", str(tmp_path / "file")).exit_code == 2  # click: "is a file"
    for out in (tmp_path / "mine", tmp_path, target_path, target_path.parent):
        refused = export(config, "--force", "--out", str(out))
        assert refused.exit_code == 2 and refused.output.count("\n") == 1, refused.output
    assert (tmp_path / "mine" / "notes.txt").read_text() == (tmp_path / "file").read_text() == "mine"
    assert (target_path / "config.json").exists() and config.exists()
    (tmp_path / "empty").mkdir()  # nothing to lose: an empty folder is filled
    assert export(config, "--force", "--out", str(tmp_path / "empty")).exit_code == 0
    assert (tmp_path / "empty" / "trtspec-self-draft.json").is_file()


@pytest.mark.parametrize(
    "section,backend,message",
    [
        ({"layers": [0, 5]}, "torch", "not all among the target's layers 0..2"),
        ({"layers": [0, 1, 2]}, "torch", "is the target itself"),
        ({"weights": "int8"}, "torch", "only backend tensorrt builds: pass --backend tensorrt"),
        (None, "torch", "speculation.mode is draft-target"),
    ],
)
def test_what_cannot_be_exported_is_refused_in_one_line_writing_nothing(
    target_path, tmp_path, section, backend, message
):
    config = write_config(tmp_path, target_path, section or {}, backend)
    if section is None:
        data = yaml.safe_load(config.read_text())
        data.pop("self_draft")
        data["speculation"]["mode"] = "draft-target"
        data["draft"] = {"checkpoint": str(target_path)}
        config.write_text(yaml.safe_dump(data))
    result = export(config)
    assert result.exit_code == 2 and message in result.output, result.output
    assert result.output.count("\n") == 1 and "Traceback" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.yaml"]


def test_the_int8_self_draft_exports_as_the_target_built_weight_only(target_path, tmp_path):
    config = write_config(tmp_path, target_path, {"weights": "int8"})
    result = export(config, "--backend", "tensorrt")
    assert result.exit_code == 0, result.output
    exported = load_config(tmp_path / "tiny-draft-target.yaml")
    assert exported.draft.checkpoint == str(target_path) and exported.draft.quantization == "int8_weight_only"
    assert (exported.build.backend, exported.serve.flavour) == ("tensorrt", "engine")
    assert not (tmp_path / "self-draft").exists()  # no checkpoint to cut


def test_an_int8_self_draft_of_some_layers_exports_their_cut_built_weight_only(target_path, tmp_path):
    config = write_config(tmp_path, target_path, {"weights": "int8", "layers": [0, 1]})
    assert export(config, "--backend", "tensorrt").exit_code == 0
    exported = load_config(tmp_path / "tiny-draft-target.yaml")
    assert exported.draft.checkpoint == "./self-draft/tiny" and exported.draft.quantization == "int8_weight_only"
    assert json.loads((tmp_path / "self-draft" / "tiny" / "config.json").read_text())["num_hidden_layers"] == 2


@pytest.mark.parametrize("backend,flavour", [("tensorrt", "engine"), ("pytorch", "llmapi")])
def test_another_backend_gets_the_flavour_init_would_serve_draft_target_by(target_path, tmp_path, backend, flavour):
    from trtspec.init_config import serve_defaults

    config = write_config(tmp_path, target_path, {"layers": [0]})
    assert export(config, "--backend", backend).exit_code == 0
    exported = load_config(tmp_path / "tiny-draft-target.yaml")
    assert (exported.build.backend, exported.serve.flavour) == (backend, flavour)
    assert (exported.serve.flavour, exported.serve.streaming) == serve_defaults("draft-target", backend)
