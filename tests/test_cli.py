"""The CLI contract: --version, --help everywhere, exit codes, one-line errors, init and doctor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from trtspec import __version__
from trtspec.cli import cli
from trtspec.config import load_config
from trtspec.modes import get_mode


def test_version(runner):
    result = runner.invoke(cli, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_every_command_has_help(runner):
    assert cli.commands, "the group has commands"
    for name, command in cli.commands.items():
        result = runner.invoke(cli, [name, "--help"])
        assert result.exit_code == 0, name
        assert command.get_short_help_str() and "Usage: " in result.output


def test_unknown_command_and_bad_option_exit_2(runner):
    assert runner.invoke(cli, ["frobnicate"]).exit_code == 2
    assert runner.invoke(cli, ["doctor", "--bogus"]).exit_code == 2


def test_console_script_error_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntarget: {checkpoint: a/b}\nbuild: {tp: zero}\n")
    run = subprocess.run([sys.executable, "-m", "trtspec", "validate", str(bad)], capture_output=True, text=True)
    assert run.returncode == 2
    assert run.stderr.strip() == f"trtspec: error: {bad}: build.tp: must be an integer, got 'zero'"
    verbose = subprocess.run(
        [sys.executable, "-m", "trtspec", "--verbose", "validate", str(bad)], capture_output=True, text=True
    )
    assert verbose.returncode == 2 and "Traceback" in verbose.stderr


def test_validate_json_reports_resolved_values(runner, tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("name: p\ntarget: {checkpoint: org/model}\nspeculation: {mode: none}\n")
    result = runner.invoke(cli, ["validate", str(path), "--json"])
    data = json.loads(result.output)
    assert data["target"]["resolved_path"] is None  # a hub id: fetched on the GPU host
    assert data["build"]["backend"] == "torch" and data["speculation"]["mode"] == "none"


def _fake_checkpoint(path, **extra):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": 4096, **extra}))
    return path


def test_init_pair_writes_a_commented_config_that_validates(runner, tmp_path):
    target = _fake_checkpoint(tmp_path / "Big-Model")
    draft = _fake_checkpoint(tmp_path / "small")
    out = tmp_path / "configs" / "pair.yaml"
    result = runner.invoke(cli, ["init", "--target", str(target), "--draft", str(draft), "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "# the drafter; must share the target's tokenizer" in text
    assert "# a ReadWriteMany class" in text and "storage_class: null" in text  # what deploy's RWX refusal names
    cfg = load_config(out)
    assert cfg.name == "big-model" and cfg.mode == "draft-target" and cfg.build.backend == "tensorrt"
    assert cfg.serve.flavour == "engine" and cfg.serve.streaming is False
    assert cfg.build.max_seq_len == 4096
    again = runner.invoke(cli, ["init", "--target", str(target), "--draft", str(draft), "--out", str(out)])
    assert again.exit_code == 2 and "already exists" in again.stderr


@pytest.mark.parametrize("out", [None, "sub/deep/pair.yaml"])
def test_init_reads_relative_checkpoint_paths_from_where_it_runs(runner, tmp_path, monkeypatch, out):
    """Paths typed relative to the current directory are written relative to the config's folder, which is
    where the config resolves them from; a hub id stays as typed."""
    monkeypatch.chdir(tmp_path)
    _fake_checkpoint(tmp_path / "models" / "t")
    _fake_checkpoint(tmp_path / "d")
    args = ["init", "--target", "./models/t", "--draft", "d", "--name", "rel", *(["--out", out] if out else [])]
    assert runner.invoke(cli, args).exit_code == 0
    cfg = load_config(tmp_path / (out or "configs/rel.yaml"))
    assert cfg.checkpoint_path(cfg.target) == tmp_path / "models" / "t"
    assert cfg.checkpoint_path(cfg.draft) == tmp_path / "d"
    hub = ["init", "--target", "meta-llama/Llama-3.2-1B-Instruct", "--backend", "pytorch", "--out", "h.yaml"]
    assert runner.invoke(cli, hub).exit_code == 0
    assert load_config(tmp_path / "h.yaml").target.checkpoint == "meta-llama/Llama-3.2-1B-Instruct"


def test_init_mtp_reads_layers_and_refuses_a_checkpoint_without_them(runner, tmp_path):
    mtp = _fake_checkpoint(tmp_path / "ds", num_nextn_predict_layers=1)
    out = tmp_path / "ds.yaml"
    result = runner.invoke(cli, ["init", "--target", str(mtp), "--mtp", "--out", str(out)])
    assert result.exit_code == 0, result.output
    cfg = load_config(out)
    assert cfg.mode == "mtp" and cfg.build.backend == "pytorch" and cfg.mtp.num_nextn_predict_layers == 1
    plain = _fake_checkpoint(tmp_path / "plain")
    bad = runner.invoke(cli, ["init", "--target", str(plain), "--mtp", "--out", str(tmp_path / "p.yaml")])
    assert bad.exit_code == 2 and "carries no MTP layers" in bad.stderr
    assert not (tmp_path / "p.yaml").exists()


def test_init_hub_ids_need_no_download(runner, tmp_path):
    out = tmp_path / "r1.yaml"
    result = runner.invoke(cli, ["init", "--target", "deepseek-ai/DeepSeek-R1", "--mtp", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(out.read_text())["mtp"]["num_nextn_predict_layers"] is None


@pytest.fixture(scope="module")
def doctor_report():
    run = subprocess.run(
        [sys.executable, "-m", "trtspec", "doctor", "--json"], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def test_doctor_reports_this_machine(doctor_report):
    import torch

    assert doctor_report["torch"]["version"] == torch.__version__
    assert doctor_report["torch"]["cuda_available"] is torch.cuda.is_available()
    caps = doctor_report["capabilities"]
    assert caps["torch"]["build"] is True
    try:
        import tensorrt_llm  # noqa: F401
    except Exception:
        assert doctor_report["tensorrt_llm"]["imports"] is False
        assert caps["tensorrt"]["build"] is False and caps["pytorch"]["build"] is False
        assert any("tensorrt_llm" in why for why in caps["tensorrt"]["why_not"])


def test_doctor_finds_tritonserver_from_the_server_extra(doctor_report):
    pytest.importorskip("pytriton", reason="the server extra (nvidia-pytriton) is not installed")
    server = doctor_report["tritonserver"]
    assert server is not None and server["binary"].endswith("tritonserver")
    assert doctor_report["capabilities"]["torch"]["serve"] is True


def test_readme_shows_the_support_table_from_code():
    from conftest import REPO

    from trtspec.support import support_table_markdown

    readme = (REPO / "README.md").read_text()
    block = readme.split("<!-- support-table -->")[1].split("<!-- /support-table -->")[0].strip()
    assert block == support_table_markdown()


def test_demo_methods_are_the_servable_modes_and_others_are_refused_saying_why(runner, tmp_path, monkeypatch):
    """`trtspec demo --methods` serves any mode the torch engine deploys; a runner-only mode is refused in its
    own words before anything is built, and the configs written for a choice load and run that mode."""
    from trtspec import demo
    from trtspec.modes import REGISTRY

    # auto is left out: plan picks its K, and the demo runs each mode at a fixed K and adaptively
    servable = {m.name for m in REGISTRY.values() if m.torch_deploys and m.speculates() and m.name != "auto"}
    servable &= {m.name for m in REGISTRY.values() if m.row("torch").exists}
    # a mode the engine gains needs a demo setup, and the demo no other; beside the modes, a setting of one
    # and the self-draft, which is served as the draft-target pair export-self-draft writes
    assert {setup["speculation"]["mode"] for setup in demo.SPECULATIVE.values()} == servable | {"self-draft"}
    assert set(demo.SPECULATIVE) - servable == {"draft-target-cascade", "self-draft"}

    ran = []
    monkeypatch.setattr(demo, "run_demo", lambda out, console, *args: ran.append(args) or 0)
    result = runner.invoke(cli, ["demo", "--out", str(tmp_path / "d"), "--methods", "auto"])
    assert result.exit_code == 2 and "auto" in result.output and "the demo serves" in result.output
    assert "Traceback" not in result.output and not ran
    for mode in REGISTRY.values():  # every mode the engine lacks is refused in a line, none crashes the option
        if mode.name not in demo.SPECULATIVE:
            refused = runner.invoke(cli, ["demo", "--methods", mode.name])
            assert refused.exit_code == 2 and mode.name in refused.output, mode.name
            assert isinstance(refused.exception, SystemExit), refused.exception  # a usage error, not a crash
    assert runner.invoke(cli, ["demo", "--methods", " , "]).exit_code == 2
    refused = runner.invoke(cli, ["demo", "--methods", "none"])
    assert refused.exit_code == 2 and "the baseline always runs" in refused.output
    result = runner.invoke(cli, ["demo", "--out", str(tmp_path / "d")])  # the default: the demo as it always ran
    assert result.exit_code == 0 and ran[-1][-1] == demo.DEFAULT_METHODS == ("draft-target", "mtp")
    result = runner.invoke(cli, ["demo", "--out", str(tmp_path / "d"), "--methods", "ngram,ngram"])
    assert result.exit_code == 0, result.output
    assert ran[-1][-1] == ("ngram",)

    paths = demo.write_configs(tmp_path / "w", ("ngram",))
    assert list(paths) == ["baseline", "ngram-fixed", "ngram-adaptive"]
    cfgs = {name: load_config(path) for name, path in paths.items()}
    assert cfgs["ngram-fixed"].mode == "ngram" and cfgs["ngram-adaptive"].speculation.policy == "adaptive"
    assert len({c.serve.grpc_port for c in cfgs.values()}) == 3
    every = demo.write_configs(tmp_path / "all", tuple(demo.SPECULATIVE))  # each setup is a valid deployment
    assert {load_config(path).mode for path in every.values()} == {"none", *servable}
    cascade = load_config(every["draft-target-cascade-fixed"])  # served by the llmapi flavour, which reads it
    assert cascade.draft_target.cascade == "ngram" and cascade.serve.flavour == "llmapi"
    self_draft = load_config(every["self-draft-adaptive"])  # the embedded target cut to its first layer
    assert self_draft.mode == "draft-target" and self_draft.speculation.policy == "adaptive"
    assert (
        json.loads((self_draft.checkpoint_path(self_draft.draft) / "config.json").read_text())["num_hidden_layers"] == 1
    )
    monkeypatch.chdir(tmp_path)  # the demo's default --out is relative: the cut is still found from its config
    relative = load_config(demo.write_configs(Path("rel"), ("self-draft",))["self-draft-fixed"])
    assert relative.checkpoint_path(relative.draft) == (tmp_path / "rel" / "self-draft" / "layers-0").resolve()
    # a method the engine flavour serves (lookahead) is benched against plain decoding served the same way
    loaded = {name: load_config(path) for name, path in every.items()}
    assert {n: c.serve.flavour for n, c in loaded.items() if c.mode == "none"} == {
        "baseline": "llmapi", "baseline-engine": "engine"
    }  # fmt: skip
    for name, cfg in loaded.items():
        assert cfg.serve.flavour == get_mode(cfg.mode).torch_flavour or cfg.mode == "none", name
        baseline = loaded[demo.baseline_for(demo.demo_modes(tuple(demo.SPECULATIVE))[name])]
        assert baseline.mode == "none" and baseline.serve.flavour == cfg.serve.flavour
    assert [demo.bench_model(demo.SPECULATIVE[m]) for m in ("medusa", "mtp")] == ["ensemble", "tensorrt_llm"]
    # a tree the mode's settings fix has no K to adapt: those methods run fixed only
    assert [n for n in every if n.startswith(("medusa", "lookahead"))] == ["medusa-fixed", "lookahead-fixed"]
