"""The mode registry and the family table: every fact defined once, every stage reading it, and every mode
walked from `trtspec init` to a repository and manifests on each backend it claims."""

from __future__ import annotations

import json
import os
import re
import typing
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from tiny_models import make_checkpoint

from trtspec.build import recipes
from trtspec.cli import cli, generate, init
from trtspec.config import Mode, load_config, validate_config
from trtspec.errors import ConfigError, UsageError
from trtspec.families import BY_ARCHITECTURE, ENGINE_FAMILIES, FAMILIES, convert_family
from trtspec.modes import BACKENDS, MODE_NAMES, REGISTRY, RUNNER_MODES, SpecMode, get_mode
from trtspec.repository.serving import decoding_mode
from trtspec.support import TABLE
from trtspec.versions import TRTLLM_CONTAINERS, at_least, engine_minors, minor, supported_minors

# a hub id per architecture the walk needs on NVIDIA's backends (never downloaded: hub ids stay as they are)
HUB_IDS = {"LlamaForCausalLM": "meta-llama/Llama-3.3-70B-Instruct", "DeepseekV3ForCausalLM": "deepseek-ai/DeepSeek-R1"}
CLAIMED = [(m.name, row.backend) for m in REGISTRY.values() for row in m.support if row.exists]


def test_every_mode_has_one_row_per_backend_and_the_names_agree_everywhere():
    for mode in REGISTRY.values():
        assert [row.backend for row in mode.support] == list(BACKENDS), mode.name
        assert mode.engine_mode is None or mode.engine_mode in recipes.ENGINE_SPEC_MODES, mode.name
        assert all(v in supported_minors() for row in mode.support for v in (row.versions or ())), mode.name
        if mode.row("tensorrt").versions:  # compiled engines end with 1.2.x
            assert set(mode.row("tensorrt").versions) <= set(engine_minors()), mode.name
        # a draft engine or a head is a draft checkpoint; a drafter inside the target is neither
        assert mode.needs_draft >= mode.draft_engine and mode.needs_draft >= mode.draft_head, mode.name
        assert not (mode.draft_engine and (mode.draft_head or mode.in_target)), mode.name
        assert all(row.mode == mode.name for row in mode.support), mode.name
        assert mode.where(), f"{mode.name} exists nowhere"
    assert typing.get_args(Mode) == MODE_NAMES
    assert tuple(next(p for p in init.params if p.name == "mode").type.choices) == MODE_NAMES
    assert tuple(next(p for p in generate.params if p.name == "mode").type.choices) == RUNNER_MODES
    assert tuple(m.name for m in REGISTRY.values() if m.row("torch").exists) == RUNNER_MODES
    assert tuple(row for m in REGISTRY.values() for row in m.support) == TABLE
    spellings = [t for m in REGISTRY.values() for t in m.decoding_types]
    assert len(spellings) == len(set(spellings)), "two modes claim one decoding_type"


@pytest.mark.parametrize(
    ("name", "version"),
    [
        (m.name, v)
        for m in REGISTRY.values()
        for v in TRTLLM_CONTAINERS
        if m.row("pytorch").exists and minor(v) in m.row("pytorch").versions
    ],
)
def test_what_a_mode_writes_for_each_version_reads_back_as_that_mode(name, version):
    """The served side parses every spelling the build side writes, version by version."""
    mode = get_mode(name)
    data = {
        "name": "walk",
        "target": {"checkpoint": HUB_IDS["LlamaForCausalLM"]},
        "speculation": {"mode": name, "num_draft_tokens": 3},
        "build": {"backend": "pytorch", "tensorrt_llm_version": version},
        "serve": {"flavour": "llmapi"},
    }
    if mode.needs_draft:
        data["draft"] = {"checkpoint": "meta-llama/Llama-3.2-1B-Instruct"}
    options = recipes.llm_api_options(validate_config(data), 3, "/draft" if mode.needs_draft else None)
    assert decoding_mode(options) == name
    spec = options.get("speculative_config")
    assert (spec is not None) == mode.speculates()
    if spec is not None:
        assert spec["decoding_type"] in mode.decoding_types
        draft_keys = {"speculative_model", "speculative_model_dir"} & set(spec)
        assert draft_keys == (
            {"speculative_model" if at_least(version, "1.2") else "speculative_model_dir"}
            if mode.needs_draft
            else set()
        )


def test_versions_compare_as_releases_not_strings():
    assert at_least("1.10.0", "1.2") and not at_least("1.1.0", "1.2") and at_least("1.2.1", "1.2")
    assert supported_minors() == ("1.0", "1.1", "1.2")


def test_a_mode_in_a_release_without_it_is_refused_naming_where_it_exists():
    data = {
        "name": "a",
        "target": {"checkpoint": HUB_IDS["LlamaForCausalLM"]},
        "speculation": {"mode": "auto"},
        "build": {"backend": "pytorch", "tensorrt_llm_version": "1.1.0"},
        "serve": {"flavour": "llmapi"},
    }
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "mode auto on backend pytorch does not exist in TensorRT-LLM 1.1.0; it exists on pytorch"
            " (TensorRT-LLM 1.2), torch"
        ),
    ):
        validate_config(data)


def test_a_mode_on_a_backend_it_lacks_is_refused_naming_where_it_exists():
    data = {
        "name": "m",
        "target": {"checkpoint": HUB_IDS["DeepseekV3ForCausalLM"]},
        "speculation": {"mode": "mtp"},
        "build": {"backend": "tensorrt"},
    }
    with pytest.raises(ConfigError) as err:
        validate_config(data)
    message = str(err.value)
    assert "build.backend" in message and "mode mtp does not exist on backend tensorrt" in message
    assert get_mode("mtp").where() in message and "pytorch (TensorRT-LLM 1.0-1.2)" in message


# --- families: what check accepts, build converts -------------------------------------------------------------


def test_every_family_check_accepts_for_engines_has_a_convert_recipe():
    claimed = {a for row in TABLE if row.backend == "tensorrt" and row.architectures for a in row.architectures}
    assert claimed == set(ENGINE_FAMILIES)
    for arch in claimed:
        family = convert_family(arch)
        assert family is not None and family.convert_folder, arch
    assert {f.architecture for f in FAMILIES if f.torch_runner} == set(get_mode("none").row("torch").architectures)


def _engine_config(tmp_path: Path, arch: str, **build) -> tuple:
    ckpt = make_checkpoint(tmp_path / arch)
    hf = json.loads((ckpt / "config.json").read_text())
    hf["architectures"] = [arch]
    (ckpt / "config.json").write_text(json.dumps(hf))
    cfg = validate_config(
        {
            "name": "fam",
            "target": {"checkpoint": str(ckpt)},
            "speculation": {"mode": "none"},
            "build": {"backend": "tensorrt", **build},
            "serve": {"flavour": "engine", "streaming": False},
        },
    )
    return cfg, ckpt


def test_gemma_2_converts_with_its_own_scripts_flags(tmp_path):
    """examples/models/core/gemma/convert_checkpoint.py: --ckpt-type hf, dashed names, TP as --world-size."""
    from trtspec.build.builder import tensorrt_commands

    cfg, ckpt = _engine_config(tmp_path, "Gemma2ForCausalLM", tp=2)
    convert, build = tensorrt_commands(cfg, "target", cfg.target, str(ckpt), 0, "/w", "/out")
    assert convert.family == "gemma"
    assert convert.args == (
        "--ckpt-type=hf",
        f"--model-dir={ckpt}",
        "--output-model-dir=/w/target-ckpt",
        "--dtype=float32",
        "--world-size=2",
    )
    assert build.program == "trtllm-build" and "--checkpoint_dir=/w/target-ckpt" in build.args


@pytest.mark.parametrize(("arch", "folder"), [("Phi3ForCausalLM", "phi"), ("Gemma2ForCausalLM", "gemma")])
def test_a_family_without_pipeline_parallelism_is_refused_in_one_line(tmp_path, arch, folder):
    from trtspec.build.builder import tensorrt_commands

    cfg, ckpt = _engine_config(tmp_path, arch, pp=2)
    assert convert_family(arch).convert_folder == folder
    with pytest.raises(UsageError, match=f"{arch}: its convert_checkpoint.py has no pipeline parallelism"):
        tensorrt_commands(cfg, "target", cfg.target, str(ckpt), 0, "/w", "/out")


def test_nemotron_and_mixtral_go_through_the_scripts_nvidia_names():
    assert convert_family("NemotronForCausalLM").convert_folder == "gpt"
    assert convert_family("MixtralForCausalLM").convert_folder == "llama"
    assert convert_family("DeepseekV3ForCausalLM") is None  # MTP on the LLM API only: no compiled engine


def test_a_hub_id_gets_each_familys_argv_once_its_config_is_downloaded(tmp_path, runner, monkeypatch):
    """The emitted script cannot know a hub id's family in advance: it branches on the downloaded one."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "hub.yaml"
    data = {
        "name": "hub",
        "target": {"checkpoint": "google/gemma-2-9b-it"},
        "speculation": {"mode": "none"},
        "build": {"backend": "tensorrt", "pp": 2, "tp": 2},
        "serve": {"flavour": "engine", "streaming": False},
        "deploy": {"gpus_per_node": 4},
    }
    config.write_text(yaml.safe_dump(data))
    script = tmp_path / "build.sh"
    res = runner.invoke(cli, ["build", str(config), "--emit-script", str(script), "--no-package"])
    assert res.exit_code == 0, res.output
    text = script.read_text()
    assert 'case "$family" in' in text
    gemma = next(line for line in text.splitlines() if line.lstrip().startswith("gemma)"))
    assert "exit 1" in gemma and "no pipeline parallelism" in gemma  # pp 2 cannot run there
    llama = next(line for line in text.splitlines() if line.lstrip().startswith("llama|"))
    assert "--model_dir=" in llama and "--tp_size=2" in llama and "--pp_size=2" in llama
    assert {"llama", "qwen", "gpt"} <= set(llama.strip().split(")")[0].split("|"))


# --- the walk: every mode, every backend it claims ------------------------------------------------------------


def _overridden(mode: SpecMode, method: str) -> bool:
    return getattr(type(mode), method) is not getattr(SpecMode, method)


EMBEDDED_HEADS = {"medusa": "embedded:tiny-medusa", "eagle3": "embedded:tiny-eagle3"}  # heads for tiny-target


@pytest.mark.parametrize(("name", "backend"), CLAIMED)
def test_every_mode_goes_from_init_to_a_repository_and_manifests(name, backend, runner, tmp_path, monkeypatch):
    """init -> validate -> check (local checkpoints) -> build plan or script -> repository -> k8s manifests,
    and the docs: a mode missing any of them fails here."""
    from trtspec.deploy import k8s

    monkeypatch.chdir(tmp_path)
    mode = get_mode(name)
    row = mode.row(backend)
    if backend == "torch":
        target, draft = "embedded:tiny-target", EMBEDDED_HEADS.get(name, "embedded:tiny-draft")
    else:
        arch = next((a for a in (row.architectures or ("LlamaForCausalLM",)) if a in HUB_IDS), None)
        assert arch is not None, f"add a hub id for one of {row.architectures} to HUB_IDS"
        target, draft = HUB_IDS[arch], "meta-llama/Llama-3.2-1B-Instruct"
    args = ["init", "--target", target, "--mode", name, "--backend", backend, "--name", "walk", "--out", "walk.yaml"]
    res = runner.invoke(cli, args + (["--draft", draft] if mode.needs_draft else []))
    assert res.exit_code == 0, res.output
    cfg = load_config(tmp_path / "walk.yaml")
    assert cfg.mode == name and cfg.build.backend == backend
    if backend == "torch":
        res = runner.invoke(cli, ["check", "walk.yaml"])
        assert res.exit_code == 0, res.output
        res = runner.invoke(cli, ["build", "walk.yaml", "--dry-run"])
        refusal = mode.torch_deploy_refusal(cfg)
        assert refusal is None or not mode.torch_deploys, f"init wrote a {name} config build refuses: {refusal}"
        if refusal:  # modes the runner runs but trtspec does not serve
            assert res.exit_code != 0 and " ".join(refusal.split()[:6]) in " ".join(res.output.split()), res.output
        else:
            assert res.exit_code == 0 and f"mode {name}" in res.output, res.output
            assert ("draft (would build)" in res.output) == mode.needs_draft  # a draft model or a head
        assert not mode.speculates() or _overridden(mode, "drafter"), f"{name} has no torch drafter"
    else:
        res = runner.invoke(cli, ["build", "walk.yaml", "--emit-script", "build.sh"])
        assert res.exit_code == 0, res.output
        repo = tmp_path / "model_repository" / "walk"
        from trtspec.repository import contract

        assert contract.violations(repo) == []  # the names and types NVIDIA's models read
        if cfg.serve.flavour == "engine":
            assert (repo / "tensorrt_llm_draft").is_dir() == mode.draft_engine
            assert f"--speculative_decoding_mode={mode.engine_mode}" in (tmp_path / "build.sh").read_text() or (
                mode.engine_mode is None
            )
        else:
            options = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
            assert decoding_mode(options) == name
    manifests = k8s.render(cfg)
    assert manifests, "no manifests"
    docs = (REPO / "docs" / "modes.md").read_text()
    assert f"## `{name}`" in docs, f"docs/modes.md has no section for {name}"


def test_the_family_table_is_the_runners_too():
    from trtspec.speculative.model import SUPPORTED_ARCHITECTURES

    assert {a for a, f in BY_ARCHITECTURE.items() if f.torch_runner} == SUPPORTED_ARCHITECTURES


# --- n-gram ---------------------------------------------------------------------------------------------------


def test_ngram_writes_nvidias_documented_config_with_every_field_out():
    """NGramDecodingConfig (llm_args.py; the feature doc's example: max_draft_len 3, max_matching_ngram_size 4,
    disable_overlap_scheduler). Every field is written: 1.0/1.1-era code defaults the match size to 0."""
    cfg = load_config(REPO / "configs" / "llama-3.1-8b-ngram.yaml")
    options = recipes.llm_api_options(cfg, 3, None)
    assert options["speculative_config"] == {
        "decoding_type": "NGram",
        "max_draft_len": 3,
        "max_matching_ngram_size": 4,
        "is_keep_all": True,
        "is_use_oldest": True,
        "is_public_pool": True,
    }
    assert options["disable_overlap_scheduler"] is True


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"draft": {"checkpoint": "meta-llama/Llama-3.2-1B-Instruct"}}, "draft", "not used with speculation.mode"),
        ({"mtp": {"num_nextn_predict_layers": 1}}, "mtp", "only used with speculation.mode mtp"),
        ({"build": {"backend": "tensorrt"}}, "build.backend", "mode ngram does not exist on backend tensorrt"),
    ],
)
def test_ngram_configs_that_cannot_mean_anything_are_refused(change, field, message):
    data = {
        "name": "ng",
        "target": {"checkpoint": "embedded:tiny-target"},
        "speculation": {"mode": "ngram"},
        "build": {"backend": "torch"},
    }
    with pytest.raises(ConfigError) as err:
        validate_config({**data, **change})
    assert f"{field}: " in str(err.value) and message in str(err.value)


def test_the_served_torch_runner_reads_the_ngram_settings_nvidias_yaml_carries(tmp_path):
    from trtspec.repository.serving import runner_from_model_yaml
    from trtspec.speculative.drafters import NgramDrafter

    cfg = load_config(REPO / "configs" / "tiny-ngram.yaml")
    data = cfg.model_dump(mode="json")
    data["ngram"].update(max_matching_ngram_size=5, is_use_oldest=False, is_public_pool=False)
    options = recipes.llm_api_options(validate_config(data, REPO / "configs" / "x.yaml"), 2, None)
    options["model"] = str(cfg.checkpoint_path(cfg.target))
    runner, _ = runner_from_model_yaml(options)
    assert isinstance(runner.drafter, NgramDrafter) and runner.drafter.max_ngram == 5
    pool = runner.drafter.pool
    assert (pool.keep_all, pool.use_oldest, pool.public) == (True, False, False)
    options["speculative_config"]["max_matching_ngram_size"] = 0  # a hand-written yaml: one line, before serving
    with pytest.raises(UsageError, match=r"^speculative_config.max_matching_ngram_size: .*\(got 0\)$"):
        runner_from_model_yaml(options)
    assert runner.num_draft_tokens == 2


# --- AUTO -----------------------------------------------------------------------------------------------------


def test_auto_follows_nvidias_documented_heuristic_on_the_running_batch():
    """AutoDecodingConfig's docstring: <= 4 requests: 5 drafts from 3-grams; <= 32: 3 from 5-grams; above: none."""
    mode = get_mode("auto")
    policy, drafter = mode.k_policy(), mode.drafter(None, None, {})
    assert [policy.k(b, 5) for b in (1, 4, 5, 32, 33, 64)] == [5, 5, 3, 3, 0, 0]
    assert [drafter.ngram_size(b) for b in (1, 4, 5, 32)] == [3, 3, 5, 5]
    assert policy.k(1, 2) == 2  # never more than the runner was built for


def test_auto_writes_only_its_type_and_refuses_what_its_heuristic_decides():
    data = {
        "name": "auto",
        "target": {"checkpoint": HUB_IDS["LlamaForCausalLM"]},
        "speculation": {"mode": "auto"},
        "build": {"backend": "pytorch", "tensorrt_llm_version": "1.2.1"},
        "serve": {"flavour": "llmapi"},
    }
    assert recipes.llm_api_options(validate_config(data), 5, None)["speculative_config"] == {"decoding_type": "AUTO"}
    for change, field in (
        ({"max_concurrency": 8}, "speculation.max_concurrency"),
        ({"policy": "fixed"}, "speculation.policy"),
    ):
        with pytest.raises(ConfigError, match=re.escape(field) + ": AUTO"):
            validate_config({**data, "speculation": {"mode": "auto", **change}})


def test_a_served_auto_model_runs_the_heuristic_not_the_configured_policy():
    from trtspec.repository.serving import engine_from_model_yaml
    from trtspec.speculative.policy import TableK

    cfg = load_config(REPO / "configs" / "tiny-ngram.yaml")
    data = cfg.model_dump(mode="json", exclude={"ngram"})
    data["speculation"].update(mode="auto", num_draft_tokens=5)
    options = recipes.llm_api_options(validate_config(data, REPO / "configs" / "x.yaml"), 5, None)
    options.update(model=str(cfg.checkpoint_path(cfg.target)), trtspec={"policy": "adaptive"}, max_batch_size=2)
    engine, _ = engine_from_model_yaml(options)
    assert isinstance(engine.policy, TableK) and engine.num_draft_tokens == 5


@pytest.mark.parametrize("name", ["ngram", "auto"])
def test_the_engine_flavour_refuses_modes_compiled_engines_lack(name):
    data = {
        "name": "e",
        "target": {"checkpoint": "embedded:tiny-target"},
        "speculation": {"mode": name},
        "build": {"backend": "torch"},
        "serve": {"flavour": "engine", "streaming": False},
    }
    with pytest.raises(
        ConfigError, match=f"serve.flavour: the engine flavour stands in for compiled engines, where mode {name}"
    ):
        validate_config(data)


# --- EAGLE-3 --------------------------------------------------------------------------------------------------


def _eagle3(version: str, **section) -> dict:
    return {
        "name": "e3",
        "target": {"checkpoint": HUB_IDS["LlamaForCausalLM"]},
        "draft": {"checkpoint": "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"},
        "eagle3": section,
        "speculation": {"mode": "eagle3", "num_draft_tokens": 3},
        "build": {"backend": "pytorch", "tensorrt_llm_version": version},
        "serve": {"flavour": "llmapi"},
    }


def test_eagle3_writes_each_releases_documented_names():
    """1.0: EagleDecodingConfig with speculative_model_dir (1.0.0 example page); 1.2: Eagle3DecodingConfig."""
    old = recipes.llm_api_options(validate_config(_eagle3("1.0.3")), 3, "/head")
    assert old["speculative_config"] == {
        "decoding_type": "Eagle",
        "max_draft_len": 3,
        "speculative_model_dir": "/head",
        "eagle3_one_model": False,  # two models: NVIDIA's table lists one-model for Llama 4 Maverick only
    }
    assert old["disable_overlap_scheduler"] is True  # the two-model path
    one = recipes.llm_api_options(validate_config(_eagle3("1.0.3", one_model=True)), 3, "/head")
    assert one["speculative_config"]["eagle3_one_model"] is True and "disable_overlap_scheduler" not in one
    new = recipes.llm_api_options(
        validate_config(_eagle3("1.2.1", one_model=False, layers_to_capture=[1, 39, 76])), 3, "/h"
    )
    assert new["speculative_config"] == {
        "decoding_type": "Eagle3",
        "max_draft_len": 3,
        "speculative_model": "/h",
        "eagle3_layers_to_capture": [1, 39, 76],
        "eagle3_one_model": False,
    }
    assert new["disable_overlap_scheduler"] is True  # the two-model path
    with pytest.raises(
        ConfigError, match=re.escape("eagle3.layers_to_capture: eagle3_layers_to_capture needs TensorRT-LLM 1.2")
    ):
        validate_config(_eagle3("1.0.3", layers_to_capture=[1, 2, 3]))
    with pytest.raises(ConfigError, match=re.escape("draft: required when speculation.mode is eagle3")):
        validate_config({**_eagle3("1.2.1"), "draft": None})


def _head(path: Path, **config) -> Path:
    make_checkpoint(path, vocab=8, hidden=16, layers=1)
    hf = json.loads((path / "config.json").read_text())
    hf.update(config)
    (path / "config.json").write_text(json.dumps(hf))
    return path


@pytest.mark.parametrize(
    ("head", "layers", "cause"),
    [
        ({"target_hidden_size": 32}, None, "eagle3-hidden"),
        ({"vocab_size": 9}, None, "eagle3-vocab"),
        ({}, [0, 1, 5], "eagle3-layers"),
        ({}, None, "eagle3-fc"),  # the tiny checkpoint has no fc.weight: not an EAGLE-3 head
        ({}, None, "eagle3-capture"),  # a 2-layer target: TensorRT-LLM has no default layers to capture
        ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1]}}, [1, 0, 1], "eagle3-capture"),
    ],
)
def test_check_holds_the_eagle3_head_to_its_target(tmp_path, head, layers, cause):
    from trtspec.check import run_check

    target = make_checkpoint(tmp_path / "t", vocab=8, hidden=16, layers=2)
    data = {**_eagle3("1.2.1", layers_to_capture=layers)}
    data["target"] = {"checkpoint": str(target)}
    data["draft"] = {"checkpoint": str(_head(tmp_path / "h", **head))}
    report = run_check(validate_config(data))
    causes = {f.code for f in report.findings}
    assert cause in causes, causes
    assert "tokenizer-mismatch" not in causes and not any(c.startswith("tokenizer") for c in causes)


def test_check_passes_an_eagle3_head_captured_where_it_was_trained(tmp_path):
    from trtspec.check import run_check
    from trtspec.modes.eagle3 import trtllm_default_capture

    assert trtllm_default_capture(32) == (1, 15, 28) and trtllm_default_capture(5) is None  # Eagle3SpecMetadata
    target = make_checkpoint(tmp_path / "t", vocab=8, hidden=16, layers=2)
    data = {**_eagle3("1.2.1", layers_to_capture=[1, 0])}
    data["target"] = {"checkpoint": str(target)}
    head = _head(tmp_path / "h", eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1]})
    data["draft"] = {"checkpoint": str(head)}
    causes = {f.code for f in run_check(validate_config(data)).findings}
    assert "eagle3-capture" not in causes and "eagle3-layers" not in causes
    assert "eagle3-fc" in causes  # the mode's own check ran (the tiny checkpoint has no fc)
    # no layers configured: the default TensorRT-LLM captures for 8 layers is the one the head records
    deep = make_checkpoint(tmp_path / "t8", vocab=8, hidden=16, layers=8)
    data = {**_eagle3("1.2.1"), "target": {"checkpoint": str(deep)}}
    data["draft"] = {
        "checkpoint": str(_head(tmp_path / "h8", eagle_config={"eagle_aux_hidden_state_layer_ids": [4, 1, 3]}))
    }
    causes = {f.code for f in run_check(validate_config(data)).findings}
    assert "eagle3-capture" not in causes and "eagle3-fc" in causes


# --- lookahead ------------------------------------------------------------------------------------------------


def test_lookahead_draft_len_is_nvidias_formula():
    from trtspec.modes.lookahead import lookahead_draft_len

    assert lookahead_draft_len(7, 7, 7) == 83  # examples/lookahead/README.md
    assert lookahead_draft_len(1, 1, 0) == 0  # "(1, 1, 0)": no speculation
    assert lookahead_draft_len(2, 2, 1) == 2 and lookahead_draft_len(4, 3, 2) == 1 + 5 * 2


def test_a_lookahead_engine_is_built_and_served_with_the_same_w_n_g(tmp_path, runner, monkeypatch):
    """trtllm-build gets max_draft_len from (W, N, G); Triton's tensorrt_llm model gets the same (W, N, G)."""
    from trtspec.repository import contract
    from trtspec.repository.pbtxt import parse

    monkeypatch.chdir(tmp_path)
    data = yaml.safe_load((REPO / "configs" / "llama-3.1-8b-lookahead.yaml").read_text())
    data["lookahead"] = {"window_size": 4, "ngram_size": 3, "verification_set_size": 2}
    (tmp_path / "la.yaml").write_text(yaml.safe_dump(data))
    res = runner.invoke(cli, ["build", "la.yaml", "--emit-script", "build.sh"])
    assert res.exit_code == 0, res.output
    build = next(line for line in (tmp_path / "build.sh").read_text().splitlines() if line.startswith("trtllm-build"))
    assert "--speculative_decoding_mode=lookahead_decoding" in build and "--max_draft_len=11" in build
    assert "--gather_generation_logits" not in build  # no draft model asks for logits
    repo = tmp_path / "model_repository" / "llama-3-1-8b-lookahead"
    assert not (repo / "tensorrt_llm_draft").exists()
    params = {
        k: v.string_value for k, v in parse((repo / "tensorrt_llm" / "config.pbtxt").read_text()).parameters.items()
    }
    assert params["decoding_mode"] == "lookahead"
    assert (
        params["lookahead_window_size"],
        params["lookahead_ngram_size"],
        params["lookahead_verification_set_size"],
    ) == (
        "4",
        "3",
        "2",
    )
    assert contract.violations(repo) == []
    cfg = load_config(tmp_path / "la.yaml")
    want = recipes.engine_expectations(cfg, "target", 11, None, "tensorrt")
    assert want["build_config.speculative_decoding_mode"][0] == 8  # SpeculativeDecodingMode.LOOKAHEAD_DECODING
    assert want["build_config.max_draft_len"][0] == 11


def test_check_refuses_w_n_g_the_built_engine_does_not_match(tmp_path, runner, monkeypatch):
    from trtspec.build.builder import engine_dir_for
    from trtspec.check import run_check

    monkeypatch.chdir(tmp_path)
    cfg = load_config(REPO / "configs" / "llama-3.1-8b-lookahead.yaml")
    built = engine_dir_for(cfg) / "target"
    built.mkdir(parents=True)
    (built / "config.json").write_text(json.dumps({"build_config": {"max_draft_len": 83}}))
    assert "tree-draft-len" not in {f.code for f in run_check(cfg).findings}
    (built / "config.json").write_text(json.dumps({"build_config": {"max_draft_len": 23}}))
    found = [f for f in run_check(cfg).findings if f.code == "tree-draft-len"]
    assert found and found[0].severity == "error" and "need 83" in found[0].message
    (built / "config.json").write_text(json.dumps({"build_config": {"max_draft_len": 90}}))  # room to spare
    found = [f for f in run_check(cfg).findings if f.code == "tree-draft-len"]
    assert [f.severity for f in found] == ["warning"] and "drafts at most 83" in found[0].message
    (built / "config.json").write_text(json.dumps({"build_config": {}}))  # no room recorded: none to run in
    found = [f for f in run_check(cfg).findings if f.code == "tree-draft-len"]
    assert [f.severity for f in found] == ["error"] and "max_draft_len None" in found[0].message


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"lookahead": {"window_size": 1, "ngram_size": 1, "verification_set_size": 0}}, "drafts nothing"),
        ({"speculation": {"mode": "lookahead", "num_draft_tokens": 4}}, "follow from its (W, N, G)"),
        ({"build": {"backend": "pytorch"}, "serve": {"flavour": "llmapi"}}, "mode lookahead does not exist on backend"),
    ],
)
def test_lookahead_settings_that_cannot_work_are_refused(change, message):
    data = yaml.safe_load((REPO / "configs" / "llama-3.1-8b-lookahead.yaml").read_text())
    for key, value in change.items():
        data[key] = {**data.get(key, {}), **value} if key == "build" else value
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_config(data)


# --- Medusa ---------------------------------------------------------------------------------------------------


def test_medusa_converts_target_and_heads_as_nvidias_readme_does(tmp_path):
    """examples/medusa/README.md: convert_checkpoint.py --model_dir vicuna --medusa_model_dir heads --output_dir
    --dtype float16 --num_medusa_heads 4; trtllm-build --speculative_decoding_mode medusa (no --max_draft_len)."""
    from trtspec.build.builder import tensorrt_commands

    cfg = load_config(REPO / "configs" / "vicuna-7b-medusa.yaml")
    convert, build = tensorrt_commands(cfg, "target", cfg.target, "/m/vicuna", 0, "/w", "/out", "/m/heads")
    assert (convert.program, convert.family) == ("convert_checkpoint.py", "medusa")
    assert convert.args == (
        "--model_dir=/m/vicuna",
        "--medusa_model_dir=/m/heads",
        "--output_dir=/w/target-ckpt",
        "--dtype=float16",
        "--num_medusa_heads=4",
    )
    assert "--speculative_decoding_mode=medusa" in build.args
    assert not any(a.startswith("--max_draft_len") for a in build.args)
    want = recipes.engine_expectations(cfg, "target", 63, None, "tensorrt")
    assert want["build_config.speculative_decoding_mode"][0] == 4  # SpeculativeDecodingMode.MEDUSA
    assert want["build_config.max_draft_len"][0] == 63  # from the converted checkpoint's max_medusa_token_len


def test_medusa_is_served_by_one_engine_with_its_tree(tmp_path, runner, monkeypatch):
    from trtspec.repository import contract
    from trtspec.repository.pbtxt import parse

    monkeypatch.chdir(tmp_path)
    data = yaml.safe_load((REPO / "configs" / "vicuna-7b-medusa.yaml").read_text())
    data["medusa"]["choices"] = [[0], [0, 0], [1], [0, 1]]
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(data))
    res = runner.invoke(cli, ["build", "m.yaml", "--emit-script", "build.sh"])
    assert res.exit_code == 0, res.output
    script = (tmp_path / "build.sh").read_text()
    assert 'huggingface-cli download FasterDecoding/medusa-vicuna-7b-v1.3 --local-dir "$WORK/hf-draft"' in script
    assert '"--medusa_model_dir=$WORK/hf-draft"' in script
    repo = tmp_path / "model_repository" / "vicuna-7b-medusa"
    assert not (repo / "tensorrt_llm_draft").exists()
    params = {
        k: v.string_value for k, v in parse((repo / "tensorrt_llm" / "config.pbtxt").read_text()).parameters.items()
    }
    assert params["decoding_mode"] == "medusa" and params["medusa_choices"] == "{0}, {0, 0}, {1}, {0, 1}"
    assert contract.violations(repo) == []


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"medusa": {"num_heads": 2, "choices": [[0], [0, 0, 0]]}}, "a path of depth 3 needs 3 heads"),
        ({"medusa": {"max_token_len": 2, "choices": [[0], [1], [2]]}}, "3 nodes, more than max_token_len 2"),
        ({"target": {"checkpoint": "lmsys/vicuna-7b-v1.3", "quantization": "fp8"}}, "FP16/BF16 weights only"),
        ({"speculation": {"mode": "medusa", "num_draft_tokens": 4}}, "Medusa's drafts are its tree"),
        ({"draft": None}, "draft: required when speculation.mode is medusa"),
    ],
)
def test_medusa_settings_that_cannot_build_are_refused(change, message):
    data = yaml.safe_load((REPO / "configs" / "vicuna-7b-medusa.yaml").read_text())
    data.update(change)
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_config(data)


def test_check_refuses_more_medusa_heads_than_the_checkpoint_has(tmp_path):
    from trtspec.check import run_check

    target = make_checkpoint(tmp_path / "t", vocab=8, hidden=16, layers=2)
    heads = _head(tmp_path / "h", medusa_num_heads=3)
    data = yaml.safe_load((REPO / "configs" / "vicuna-7b-medusa.yaml").read_text())
    data["target"], data["draft"] = {"checkpoint": str(target)}, {"checkpoint": str(heads)}
    data["medusa"]["choices"] = [[0], [0, 0], [1]]  # three deep at most: three heads can run it
    found = {f.code: f for f in run_check(validate_config(data)).findings}
    assert found["medusa-heads"].severity == "error" and "has 3" in found["medusa-heads"].message
    data["medusa"]["num_heads"] = 3
    assert "medusa-heads" not in {f.code for f in run_check(validate_config(data)).findings}


def test_check_refuses_a_model_given_as_medusa_heads(tmp_path):
    """A draft model in a Medusa config passed check (and failed at load): its config.json counts no heads."""
    from trtspec.check import run_check

    target = make_checkpoint(tmp_path / "t", vocab=8, hidden=16, layers=2)
    model = make_checkpoint(tmp_path / "d", vocab=8, hidden=16, layers=1)
    data = yaml.safe_load((REPO / "configs" / "vicuna-7b-medusa.yaml").read_text())
    data["target"], data["draft"] = {"checkpoint": str(target)}, {"checkpoint": str(model)}
    found = {f.code: f for f in run_check(validate_config(data)).findings}
    assert found["medusa-heads"].severity == "error"
    assert "counts no heads (medusa_num_heads): no Medusa heads folder" in found["medusa-heads"].message


def test_where_a_mode_runs_names_each_release_it_claims():
    assert get_mode("draft-target").where() == "tensorrt (TensorRT-LLM 1.0-1.2), pytorch (TensorRT-LLM 1.0-1.2), torch"
    assert get_mode("eagle3").where() == "pytorch (TensorRT-LLM 1.0, 1.2), torch"  # 1.1 is not pinned
    assert get_mode("eagle3").where(besides="torch") == "pytorch (TensorRT-LLM 1.0, 1.2)"
    assert get_mode("auto").where() == "pytorch (TensorRT-LLM 1.2), torch"


@pytest.mark.parametrize("name", ["eagle3", "medusa"])
def test_check_treats_heads_as_heads_not_as_models(tmp_path, name):
    """A real EAGLE-3 head names its own architecture and a short context; Medusa's heads have no hidden_size:
    neither is a model to hold to the support table, the context length or the memory formula."""
    from trtspec.check import run_check

    target = make_checkpoint(tmp_path / "t", vocab=8, hidden=16, layers=2)
    head = make_checkpoint(tmp_path / "h", vocab=8, hidden=16, layers=1)
    config = {"architectures": ["LlamaForCausalLMEagle3"], "max_position_embeddings": 16, "hidden_size": 16}
    if name == "medusa":
        config = {"medusa_num_heads": 5, "medusa_num_layers": 1, "base_model_name_or_path": "lmsys/vicuna-7b-v1.3"}
    hf = json.loads((head / "config.json").read_text()) if name == "eagle3" else {}
    (head / "config.json").write_text(json.dumps({**hf, **config}))
    if name == "eagle3":
        data = _eagle3("1.2.1")
    else:
        data = yaml.safe_load((REPO / "configs" / "vicuna-7b-medusa.yaml").read_text())
    data["target"], data["draft"] = {"checkpoint": str(target)}, {"checkpoint": str(head)}
    data["build"].update(max_seq_len=128, max_input_len=16, gpu_memory_gb=80)  # room for Medusa's 63 drafts
    data["speculation"]["sampling"] = {"max_tokens": 16}
    report = run_check(validate_config(data))
    codes = {f.code for f in report.findings if f.severity == "error"}
    assert not codes & {"architecture-unsupported", "context-length"}, codes
    assert "memory" in report.facts  # the heads' files counted, no crash on their config


def test_max_seq_len_leaves_room_for_the_drafts_a_mode_fixes():
    data = yaml.safe_load((REPO / "configs" / "vicuna-7b-medusa.yaml").read_text())
    data["build"]["max_input_len"] = 2000  # 2000 + 63 drafts + 1 > 2048
    with pytest.raises(ConfigError, match=re.escape("room for the prompt, 63 draft tokens")):
        validate_config(data)


def test_medusa_default_tree_needs_its_heads_and_nodes():
    data = yaml.safe_load((REPO / "configs" / "vicuna-7b-medusa.yaml").read_text())
    data["medusa"] = {"num_heads": 3}
    with pytest.raises(ConfigError, match=re.escape("mc_sim_7b_63 needs num_heads >= 4")):
        validate_config(data)
    data["medusa"] = {"num_heads": 3, "choices": [[0], [0, 0], [1]]}
    assert validate_config(data).medusa.num_heads == 3


def test_eagle3_one_model_on_a_llama_3_target_is_flagged(tmp_path):
    from trtspec.check import run_check

    target = make_checkpoint(tmp_path / "t", vocab=8, hidden=16, layers=2)
    data = _eagle3("1.2.1", one_model=True)
    data["target"] = {"checkpoint": str(target)}
    data["draft"] = {"checkpoint": str(_head(tmp_path / "h"))}
    assert "eagle3-one-model" in {f.code for f in run_check(validate_config(data)).findings}
    data["eagle3"] = {"one_model": False}
    assert "eagle3-one-model" not in {f.code for f in run_check(validate_config(data)).findings}


@pytest.mark.parametrize(
    ("arch", "build", "quantization", "code"),
    [
        ("Phi3ForCausalLM", {"pp": 2}, "none", "convert-pipeline"),
        ("Gemma2ForCausalLM", {}, "int8_weight_only", "convert-weight-only"),
    ],
)
def test_check_finds_what_a_familys_convert_script_cannot_do(tmp_path, arch, build, quantization, code):
    from trtspec.check import run_check

    cfg, _ = _engine_config(tmp_path, arch, **build)
    data = cfg.model_dump(mode="json", exclude_none=True)
    data["target"]["quantization"] = quantization
    found = {f.code: f for f in run_check(validate_config(data)).findings}
    assert found[code].severity == "error" and "convert_checkpoint.py" in found[code].message


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mode", "medusa"], "mode medusa needs --draft: its draft checkpoint (the Medusa heads trained for"),
        (["--mode", "none", "--draft", "x/y"], "--draft is not used with mode none: it takes no draft checkpoint"),
    ],
)
def test_init_says_what_the_draft_is(runner, tmp_path, args, message):
    res = runner.invoke(cli, ["init", "--target", "lmsys/vicuna-7b-v1.3", *args, "--out", str(tmp_path / "c.yaml")])
    assert res.exit_code == 2 and message in res.output


@pytest.mark.parametrize(
    ("config", "mode"),
    [
        ({"medusa_num_heads": 5, "medusa_num_layers": 1}, "medusa"),  # FasterDecoding/Medusa
        ({"architectures": ["LlamaForCausalLMEagle3"]}, "eagle3"),  # SpecForge, lmsys
        ({"architectures": ["LlamaForCausalLM"], "draft_vocab_size": 32000}, "eagle3"),  # EAGLE-3's own release
        ({"architectures": ["LlamaForCausalLM"], "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1]}}, "eagle3"),
        ({"architectures": ["LlamaForCausalLM"], "eagle_config": {"use_aux_hidden_state": False}}, None),  # EAGLE-1
        ({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2}, None),  # a model
        ({"architectures": 5, "eagle_config": [1]}, None),  # malformed: no head, and no crash
        ({"medusa_num_heads": None}, None),  # no count: check calls it no heads folder
        ({"medusa_num_heads": 0}, None),
        ({"medusa_num_heads": True}, None),
    ],
)
def test_which_mode_a_draft_checkpoint_belongs_to(config, mode):
    from trtspec.modes import mode_for_draft

    found = mode_for_draft(config)
    assert (found.name if found else None) == mode


@pytest.mark.parametrize(
    ("config", "draft_for", "message"),
    [
        ({"architectures": ["LlamaForCausalLM"], "draft_vocab_size": 32000}, "draft-target",
         "is the EAGLE-3 head trained for the target, not a draft for mode draft-target: use mode eagle3"),
        ({"architectures": ["LlamaForCausalLM"], "draft_vocab_size": 32000}, None,
         "is the EAGLE-3 head trained for the target, not a target model: it is the draft of mode eagle3"),
        ({"medusa_num_heads": 3}, "draft-target",
         "is the Medusa heads trained for the target, not a draft for mode draft-target: use mode medusa"),
        ({"medusa_num_heads": 3}, None, "not a target model: it is the draft of mode medusa"),
        ({"medusa_num_heads": 0}, None, "config.json names no architectures"),
        ({"architectures": ["GPT2LMHeadModel"]}, "draft-target", "not GPT2LMHeadModel"),
    ],
)  # fmt: skip
def test_the_runner_names_what_it_cannot_load(tmp_path, config, draft_for, message):
    """build and generate load through this, as the target or a mode's draft: a head says what it is in init's and
    check's words (EAGLE-3's releases name LlamaForCausalLM, so the name alone does not tell)."""
    from trtspec.speculative.model import refuse_unsupported_architecture

    with pytest.raises(UsageError, match=re.escape(message)):
        refuse_unsupported_architecture(tmp_path, config, draft_for)
    refuse_unsupported_architecture(tmp_path, {"architectures": ["LlamaForCausalLM"]}, draft_for)  # a model passes


def test_init_reads_the_draft_only_where_the_mode_is_its_to_say(runner, tmp_path):
    """--mtp or a mode without a draft says so before reading --draft; a config.json that is no object is one
    line; a hub id, which init cannot read, is said to be assumed a model."""
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("[1, 2]")
    base = ["init", "--target", "embedded:tiny-target", "--out", str(tmp_path / "c.yaml"), "--draft"]
    for extra in (["--mtp"], ["--mode", "ngram"]):
        res = runner.invoke(cli, [*base, str(broken), *extra])
        assert res.exit_code == 2 and "--draft is not used with mode" in res.output, res.output
    res = runner.invoke(cli, [*base, str(broken)])
    assert res.exit_code == 2 and "config.json: not a JSON object" in res.output and "Traceback" not in res.output
    res = runner.invoke(cli, [*base, "some-org/some-eagle3-head"])
    assert res.exit_code == 0 and "is a hub id, not read here: for heads pass --mode eagle3 or medusa" in res.output


def test_init_takes_the_mode_from_a_head_draft(runner, tmp_path):
    """A head is its own mode's draft: init without --mode writes that mode (a model still means draft-target),
    a published EAGLE-3 head is known by its architecture, and --mode draft-target with a head is refused."""
    published = tmp_path / "eagle3-head"
    published.mkdir()
    (published / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 8}))
    for draft, mode in (
        ("embedded:tiny-eagle3", "eagle3"),
        ("embedded:tiny-medusa", "medusa"),
        ("embedded:tiny-draft", "draft-target"),
        (str(published), "eagle3"),
    ):
        out = tmp_path / f"{mode}-{len(draft)}.yaml"
        res = runner.invoke(cli, ["init", "--target", "embedded:tiny-target", "--draft", draft, "--out", str(out)])
        assert res.exit_code == 0, res.output
        assert yaml.safe_load(out.read_text())["speculation"]["mode"] == mode, draft
    out = tmp_path / "refused.yaml"
    args = ["init", "--target", "embedded:tiny-target", "--draft", "embedded:tiny-medusa", "--mode", "draft-target"]
    res = runner.invoke(cli, [*args, "--out", str(out)])
    assert res.exit_code == 2 and not out.exists()
    assert "is the Medusa heads trained for the target, not a draft for mode draft-target: use --mode medusa" in (
        res.output
    )


def test_init_puts_an_embedded_target_where_its_mode_runs(runner, tmp_path):
    """torch for the modes trtspec's runner has (every mode now; NVIDIA's first backend for one it lacked)."""
    for mode, backend in (("ngram", "torch"), ("eagle3", "torch"), ("lookahead", "torch")):
        out = tmp_path / f"{mode}.yaml"
        extra = ["--draft", EMBEDDED_HEADS.get(mode, "embedded:tiny-draft")] if get_mode(mode).needs_draft else []
        res = runner.invoke(
            cli, ["init", "--target", "embedded:tiny-target", "--mode", mode, *extra, "--out", str(out)]
        )
        assert res.exit_code == 0, res.output
        assert yaml.safe_load(out.read_text())["build"]["backend"] == backend


# --- what every (mode, backend, release) writes, held to golden files reviewed against NVIDIA's sources -------

GOLDEN_MODES = REPO / "tests" / "golden" / "modes.json"


def _written(name: str, backend: str, version: str) -> dict:
    mode = get_mode(name)
    data = {
        "name": "golden",
        "target": {"checkpoint": HUB_IDS["DeepseekV3ForCausalLM" if name == "mtp" else "LlamaForCausalLM"]},
        "speculation": {"mode": name},
        "build": {"backend": backend, "tensorrt_llm_version": version},
        "serve": {"flavour": "engine" if backend == "tensorrt" else "llmapi", "streaming": False},
    }
    if mode.needs_draft:
        data["draft"] = {"checkpoint": "org/draft"}
    if mode.default_k is not None:
        data["speculation"]["num_draft_tokens"] = mode.default_k
    cfg = validate_config(data)
    k = mode.drafts_per_step(cfg)
    if backend == "pytorch":
        return recipes.llm_api_options(cfg, k, "/draft" if mode.needs_draft else None)
    from trtspec.build.builder import tensorrt_commands

    convert, build = tensorrt_commands(cfg, "target", cfg.target, "/target", k, "/w", "/out", "/draft")
    return {
        "convert": [convert.family, *convert.args],
        "trtllm-build": list(build.args),
        "tensorrt_llm parameters": mode.triton_parameters(cfg),
    }


CLAIMS = [
    (m.name, backend, v)
    for m in REGISTRY.values()
    for backend in ("tensorrt", "pytorch")
    for v in TRTLLM_CONTAINERS
    if m.row(backend).versions and minor(v) in m.row(backend).versions
]


def test_every_claimed_mode_backend_and_release_writes_its_golden_recipe():
    written = {f"{n} {b} {v}": _written(n, b, v) for n, b, v in CLAIMS}
    if os.environ.get("TRTSPEC_UPDATE_GOLDEN") == "1":
        GOLDEN_MODES.write_text(json.dumps(written, indent=1, sort_keys=True) + "\n")
    golden = json.loads(GOLDEN_MODES.read_text())
    assert sorted(written) == sorted(golden), "a claim was added or dropped (TRTSPEC_UPDATE_GOLDEN=1 rewrites)"
    for key, value in written.items():
        assert value == golden[key], f"{key} differs from tests/golden/modes.json"


def test_check_on_backend_torch_flags_head_layers_the_target_lacks_and_takes_layers_at_any_version(tmp_path):
    from trtspec.check import run_check

    target = make_checkpoint(tmp_path / "t", vocab=8, hidden=16, layers=2)
    data = {**_eagle3("1.0.3"), "target": {"checkpoint": str(target)}}
    data["build"] = {"backend": "torch", "tensorrt_llm_version": "1.0.3"}
    data["serve"] = {"flavour": "llmapi"}
    head = _head(tmp_path / "h", eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 5]})
    data["draft"] = {"checkpoint": str(head)}
    causes = {f.code for f in run_check(validate_config(data)).findings}
    assert "eagle3-layers" in causes  # the head reads layer 5 of a 2-layer target
    cfg = validate_config({**data, "eagle3": {"layers_to_capture": [0, 1]}})  # no TensorRT-LLM on torch
    assert cfg.eagle3.layers_to_capture == [0, 1]
    with pytest.raises(ConfigError, match="layers_to_capture"):
        validate_config({**data, "eagle3": {"layers_to_capture": []}})
