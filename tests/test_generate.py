"""`trtspec generate` on the embedded pair: real tokenizer, real trained weights, every mode."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import CONFIGS, REPO

from trtspec.assets import EMBEDDED_CHECKPOINTS
from trtspec.cli import cli
from trtspec.speculative.drafters import latest_match

PROMPT = "ROMEO:\nBut soft, what light"


@pytest.fixture(scope="module")
def greedy_outputs():
    from click.testing import CliRunner

    runner = CliRunner()
    results = {}
    for mode in ("none", "draft-target", "mtp", "ngram"):
        res = runner.invoke(
            cli,
            [
                "generate",
                str(CONFIGS / "tiny-draft-target.yaml"),
                "--prompt",
                PROMPT,
                "--mode",
                mode,
                "--max-tokens",
                "48",
                "--ignore-eos",
                "--json",
            ],
        )
        assert res.exit_code == 0, res.output
        results[mode] = json.loads(res.output)
    return results


def test_every_mode_generates_the_same_greedy_text(greedy_outputs):
    plain = greedy_outputs["none"]
    assert len(plain["tokens"]) == 48 and plain["text"].strip()
    for mode in ("draft-target", "mtp", "ngram"):
        assert greedy_outputs[mode]["tokens"] == plain["tokens"], mode
        assert greedy_outputs[mode]["text"] == plain["text"]


def test_trees_and_trained_heads_generate_the_same_greedy_text(runner, greedy_outputs, tmp_path):
    """--tree on each drafter that makes trees, the shipped Medusa heads (chain and tree) and EAGLE-3 head."""
    plain = greedy_outputs["none"]
    base = ["generate", str(CONFIGS / "tiny-draft-target.yaml"), "--prompt", PROMPT, "--max-tokens", "48"]
    base += ["--ignore-eos", "--json"]
    for extra in (["--mode", "draft-target", "--tree", "3x2"], ["--mode", "ngram", "--tree", "2x3"]):
        res = runner.invoke(cli, base + extra)
        assert res.exit_code == 0, res.output
        out = json.loads(res.output)
        assert out["tokens"] == plain["tokens"] and out["tree"] == extra[-1], extra
    config = {"name": "medusa", "target": {"checkpoint": "embedded:tiny-target"}}
    config |= {"draft": {"checkpoint": "embedded:tiny-medusa"}, "speculation": {"mode": "medusa"}}
    path = tmp_path / "medusa.yaml"
    path.write_text(json.dumps(config))
    for extra in ([], ["--tree", "2x4"]):
        medusa = ["generate", str(path), "--prompt", PROMPT, "--max-tokens", "48", "--ignore-eos", "--json"]
        res = runner.invoke(cli, medusa + extra)
        assert res.exit_code == 0, res.output
        out = json.loads(res.output)
        assert out["tokens"] == plain["tokens"] and out["stats"]["acceptance_rate"] > 0.1, extra
    config |= {"name": "eagle3", "draft": {"checkpoint": "embedded:tiny-eagle3"}}
    config |= {"speculation": {"mode": "eagle3", "num_draft_tokens": 3}, "eagle3": {"layers_to_capture": [1, 2, 4]}}
    path.write_text(json.dumps(config))
    eagle = ["generate", str(path), "--prompt", PROMPT, "--max-tokens", "48", "--ignore-eos", "--json"]
    res = runner.invoke(cli, eagle)
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    # the head agrees with the target far above chance (1/2048), as its training log says it does
    assert out["tokens"] == plain["tokens"] and out["stats"]["acceptance_per_position"][0] > 0.3, out["stats"]
    res = runner.invoke(cli, [*base, "--mode", "mtp", "--tree", "3x2"])
    assert res.exit_code == 2 and "drafts chains only" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = runner.invoke(cli, [*base, "--mode", "ngram", "--tree", "9x9"])
    assert res.exit_code == 2 and "at most 64" in res.stderr


def test_trained_drafters_are_accepted_often(greedy_outputs):
    # a trained draft and trained MTP layers agree with the target far above chance (1/2048): the first
    # draft of a step is accepted about 60% of the time (the model card's teacher-forced top-1 agreement)
    for mode in ("draft-target", "mtp"):
        stats = greedy_outputs[mode]["stats"]
        assert stats["acceptance_per_position"][0] > 0.4, mode
        assert stats["tokens_per_step"] > 1.5, mode


SAMPLED_MTP = [
    "generate",
    str(CONFIGS / "tiny-mtp.yaml"),
    "--prompt",
    PROMPT,
    "--max-tokens",
    "20",
    "--temperature",
    "0.8",
    "--seed",
    "3",
]


def test_generate_streams_text_and_reports_stats(runner):
    res = runner.invoke(cli, SAMPLED_MTP)
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith(PROMPT) and len(res.stdout) > len(PROMPT)
    assert "[mtp, K=2]" in res.stderr and "acceptance" in res.stderr
    again = runner.invoke(cli, SAMPLED_MTP)
    assert again.stdout == res.stdout


def test_generate_rejects_bad_input_with_one_line(runner, tmp_path):
    long_prompt = "word " * 2000
    res = runner.invoke(cli, ["generate", str(CONFIGS / "tiny-draft-target.yaml"), "--prompt", long_prompt])
    assert res.exit_code == 2 and "max_input_len" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    res = runner.invoke(
        cli, ["generate", str(CONFIGS / "tiny-baseline.yaml"), "--prompt", "x", "--mode", "mtp", "--max-tokens", "0"]
    )
    assert res.exit_code == 2
    no_draft = runner.invoke(
        cli, ["generate", str(CONFIGS / "tiny-mtp.yaml"), "--prompt", "x", "--mode", "draft-target"]
    )
    assert no_draft.exit_code == 2 and "draft checkpoint" in no_draft.stderr


def test_corrupt_checkpoint_is_a_one_line_error(runner, tmp_path):
    import shutil

    bad = tmp_path / "bad-target"
    shutil.copytree(EMBEDDED_CHECKPOINTS["tiny-target"], bad)
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"name: c\ntarget: {{checkpoint: {bad}}}\nspeculation: {{mode: none}}\n"
        "build: {backend: torch, max_input_len: 64, max_seq_len: 256}\n"
    )
    res = runner.invoke(cli, ["generate", str(cfg), "--prompt", "hello"])
    assert res.exit_code == 2 and "corrupt safetensors" in res.stderr
    # cut after its header, the tensors it describes missing: check finds it, not only the build's load
    whole = (EMBEDDED_CHECKPOINTS["tiny-target"] / "model.safetensors").read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])
    res = runner.invoke(cli, ["check", str(cfg)])
    assert res.exit_code == 2 and "truncated safetensors file" in res.stderr and "Traceback" not in res.output


def test_the_cascades_guesses_continue_the_latest_match():
    assert latest_match([1, 2, 3, 9, 1, 2, 3, 7, 1, 2], 3, max_ngram=2) == [3, 7, 1]
    assert latest_match([5, 6, 7], 3) == []
    assert latest_match([4, 4, 4], 2) == [4]


def load_training_script():
    """tools/train_embedded_pair.py, which is in the repository but not in the installed package."""
    import importlib.util
    import sys

    name = "train_embedded_pair"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, REPO / "tools" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # before exec: dataclasses look their module up there
        spec.loader.exec_module(module)
    return sys.modules[name]


def test_embedded_mtp_layers_match_the_training_script():
    """The runner's MTP math is the math the layers were trained with (TargetWithMTP in the training script)."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig

    from trtspec.speculative.model import load_transformer

    path = EMBEDDED_CHECKPOINTS["tiny-target"]
    cfg = LlamaConfig.from_pretrained(path)
    ref = load_training_script().TargetWithMTP(cfg, cfg.num_nextn_predict_layers).float().eval()
    layers = cfg.num_hidden_layers
    state = {}
    for key, value in load_file(str(path / "model.safetensors")).items():
        parts = key.split(".")
        if key.startswith("model.layers.") and int(parts[2]) >= layers:
            rest = ".".join(parts[3:])
            if rest not in ("embed_tokens.weight", "shared_head.head.weight"):
                state[f"mtp.{int(parts[2]) - layers}.{rest}"] = value.float()
        else:
            state[f"trunk.{key}"] = value.float()
    state.setdefault("trunk.lm_head.weight", state["trunk.model.embed_tokens.weight"])
    ref.load_state_dict(state, strict=True)
    ours = load_transformer(path)
    ids = torch.randint(0, cfg.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = ref(ids)
        out = ours(ids, torch.arange(40)[None], ours.new_cache(1, 64))
        cache = ours.new_mtp_cache(1, 64)
        d1 = ours.mtp_forward(0, out.hidden[:, :39], ids[:, 1:], torch.arange(39)[None], cache)
        d2 = ours.mtp_forward(1, d1.hidden[:, :38], ids[:, 2:], torch.arange(38)[None], cache)
    for got, want in zip((out.logits, d1.logits, d2.logits), expected, strict=True):
        assert torch.allclose(got, want, atol=1e-4)
