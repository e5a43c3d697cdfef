"""`trtspec build`: documented recipes reproduced exactly, and a build that is resumable and safe.

The golden files in tests/golden/ hold NVIDIA's documented commands and YAML; the recipe functions,
given the documentation's own inputs, must produce exactly those. The torch backend really builds
here, so re-runs, a changed draft, a SIGKILL mid-build and a full disk are tested on real builds.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import CONFIGS
from tiny_models import make_checkpoint

from trtspec.build import builder, recipes
from trtspec.build.manifest import Manifest
from trtspec.cli import cli
from trtspec.config import load_config, validate_config
from trtspec.families import BY_ARCHITECTURE

LLAMA = BY_ARCHITECTURE["LlamaForCausalLM"]

GOLDEN = Path(__file__).parent / "golden"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def documented_commands(path: Path, env: dict[str, str]) -> list[list[str]]:
    """The shell block as argv lists: continuation lines joined, exports and `${VAR}`s expanded."""
    text = re.sub(r"\\\n\s*", " ", path.read_text())
    commands = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "cd ")):
            continue
        if line.startswith("export "):
            name, value = line.removeprefix("export ").split("=", 1)
            env[name] = value
            continue
        commands.append([re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], a) for a in shlex.split(line)])
    return commands


def pair(tmp: Path, arch_dtype: str = "float16") -> tuple[Path, Path]:
    target = make_checkpoint(tmp / "target", vocab=32, seed=1)
    draft = make_checkpoint(tmp / "draft", vocab=32, seed=2)
    for path in (target, draft):
        cfg = json.loads((path / "config.json").read_text())
        cfg["torch_dtype"] = arch_dtype
        (path / "config.json").write_text(json.dumps(cfg))
    return target, draft


def trt_config(target: Path, draft: Path, **build) -> object:
    data = {
        "name": "dtm",
        "target": {"checkpoint": str(target), "dtype": "float16"},
        "draft": {"checkpoint": str(draft), "dtype": "float16"},
        "speculation": {"mode": "draft-target", "num_draft_tokens": 10},
        "build": {
            "backend": "tensorrt",
            "max_batch_size": 4,
            "max_input_len": 3200,
            "max_seq_len": 4800,
            **build,
        },
        "serve": {"flavour": "engine", "streaming": False},
    }
    return validate_config(data)


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("trtspec: error:")]


def as_argv(command: recipes.Command) -> list[str]:
    prefix = ["python3", command.program] if command.is_script else [command.program]
    return prefix + list(command.args)


def test_draft_target_engine_recipe_equals_the_documented_one(tmp_path):
    target, draft = pair(tmp_path)
    cfg = trt_config(target, draft)
    env = {"DRAFT_MODEL_PATH": str(draft), "TARGET_MODEL_PATH": str(target)}
    documented = documented_commands(GOLDEN / "trtllm_draft_target_build.sh", env)
    ours = [
        recipes.convert_command(cfg, cfg.draft, env["DRAFT_MODEL_PATH"], env["DRAFT_CKPT_PATH"], LLAMA, "float16"),
        recipes.convert_command(cfg, cfg.target, env["TARGET_MODEL_PATH"], env["TARGET_CKPT_PATH"], LLAMA, "float16"),
        recipes.trtllm_build_command(
            cfg, cfg.draft, env["DRAFT_CKPT_PATH"], env["DRAFT_ENGINE_PATH"], "float16", "draft", 10
        ),
        recipes.trtllm_build_command(
            cfg, cfg.target, env["TARGET_CKPT_PATH"], env["TARGET_ENGINE_PATH"], "float16", "target", 10
        ),
    ]
    # one deliberate difference: both engines keep generation logits, so NVIDIA's documented BLS request
    # with use_draft_logits: true is served (the README's own note: the flag is needed for logit acceptance)
    documented = [[*c, "--gather_generation_logits"] if c[0] == "trtllm-build" else c for c in documented]
    assert [as_argv(c) for c in ours] == documented
    # and the builder's own plan for the config uses the same recipe (family from config.json)
    planned = builder.tensorrt_commands(cfg, "target", cfg.target, str(target), 10, "/w", "/e")
    assert planned[0].family == "llama"
    assert "--speculative_decoding_mode=draft_tokens_external" in planned[1].args


def test_tensor_parallel_is_set_at_conversion_as_documented(tmp_path):
    target, draft = pair(tmp_path)
    cfg = trt_config(target, draft, tp=2)
    env = {"TARGET_MODEL_PATH": str(target), "TARGET_CKPT_PATH": "/workspace/ckpt-target"}
    (documented,) = documented_commands(GOLDEN / "trtllm_draft_target_tp_convert.sh", env)
    ours = recipes.convert_command(cfg, cfg.target, str(target), "/workspace/ckpt-target", LLAMA, "float16")
    assert as_argv(ours) == documented
    build = recipes.trtllm_build_command(cfg, cfg.target, "/c", "/e", "float16", "target", 10)
    assert not any(a.startswith("--tp_size") for a in build.args)  # trtllm-build has no --tp_size


def test_build_flags_follow_the_config():
    cfg = load_config(CONFIGS / "llama-3.3-70b-1b-draft-h200.yaml")
    target = recipes.trtllm_build_command(cfg, cfg.target, "/c", "/e", "bfloat16", "target", 4)
    draft = recipes.trtllm_build_command(cfg, cfg.draft, "/c", "/e", "bfloat16", "draft", 4)
    # K = 4, built with room for NVIDIA's documented num_draft_tokens 10; more than 10 is built as asked
    assert "--max_draft_len=10" in target.args and "--gemm_plugin=fp8" in target.args
    assert "--max_draft_len=12" in recipes.trtllm_build_command(cfg, cfg.target, "/c", "/e", "bf16", "target", 12).args
    assert not any("speculative" in a or "draft_len" in a for a in draft.args)
    assert "--max_num_tokens=8192" in target.args
    quant = recipes.convert_command(cfg, cfg.target, "/m", "/c", None, "bfloat16")
    assert quant.program == "quantization/quantize.py" and "--qformat=fp8" in quant.args
    for engine_args in (target.args, draft.args):  # use_draft_logits requests work whatever the config's default
        assert "--gather_generation_logits" in engine_args


def _golden_yaml(name: str) -> dict:
    return yaml.safe_load((GOLDEN / name).read_text())


def test_llm_api_draft_target_options_match_the_documented_fields(tmp_path):
    target, draft = pair(tmp_path)
    data = {
        "name": "dtm",
        "target": {"checkpoint": str(target)},
        "draft": {"checkpoint": "/models/llama-3.2-1b-instruct"},
        "speculation": {"mode": "draft-target", "num_draft_tokens": 4},
        "build": {"backend": "pytorch", "tensorrt_llm_version": "1.0.0", "kv_cache_free_gpu_mem_fraction": 0.85},
    }
    cfg = validate_config({**data, "draft": {"checkpoint": str(draft)}})
    options = recipes.llm_api_options(cfg, 4, "/models/llama-3.2-1b-instruct")
    golden = _golden_yaml("llmapi_draft_target.yaml")
    assert {k: options[k] for k in golden} == golden
    assert options["tensor_parallel_size"] == 1 and options["max_batch_size"] == cfg.build.max_batch_size
    newer = cfg.model_copy(update={"build": cfg.build.model_copy(update={"tensorrt_llm_version": "1.2.1"})})
    spec = recipes.llm_api_options(newer, 4, "/d")["speculative_config"]
    assert spec["speculative_model"] == "/d" and "speculative_model_dir" not in spec
    assert "max_concurrency" not in spec  # unset: speculation at every batch size, TensorRT-LLM's default
    capped = newer.model_copy(update={"speculation": newer.speculation.model_copy(update={"max_concurrency": 8})})
    assert recipes.llm_api_options(capped, 4, "/d")["speculative_config"]["max_concurrency"] == 8


def test_llm_api_mtp_options_match_nvidia_blog():
    cfg = load_config(CONFIGS / "deepseek-r1-mtp-8gpu.yaml")
    mtp = cfg.mtp.model_copy(update={"relaxed_acceptance": True, "relaxed_topk": 10, "relaxed_delta": 0.6})
    relaxed = cfg.model_copy(update={"mtp": mtp})
    options = recipes.llm_api_options(relaxed, 3, None)
    assert options["speculative_config"] == _golden_yaml("llmapi_mtp_blog2.yaml")["speculative_config"]
    assert options["tensor_parallel_size"] == 8
    lossless = recipes.llm_api_options(cfg, 3, None)["speculative_config"]
    assert lossless == {"decoding_type": "MTP", "num_nextn_predict_layers": 3}


def engine_config(**overrides) -> dict:
    """The keys TensorRT-LLM's EngineConfig.to_dict writes (tensorrt_llm/builder.py), for the verifier."""
    build = {
        "max_batch_size": 4,
        "max_input_len": 3200,
        "max_seq_len": 4800,
        "max_draft_len": 10,
        "speculative_decoding_mode": 2,
        "gather_generation_logits": False,
        "plugin_config": {"use_paged_context_fmha": True, "gemm_plugin": "float16"},
    }
    build.update(overrides)
    return {"version": "1.2.1", "pretrained_config": {"vocab_size": 32}, "build_config": build}


def test_engine_verification_names_the_missing_flag(tmp_path):
    target, draft = pair(tmp_path)
    cfg = trt_config(target, draft)
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "config.json").write_text(json.dumps(engine_config(gather_generation_logits=True)))
    builder.verify_engine(engine, cfg, "target", 10, "tensorrt")
    (engine / "config.json").write_text(json.dumps(engine_config(max_draft_len=0, speculative_decoding_mode=1)))
    with pytest.raises(Exception, match=r"--max_draft_len=10") as err:
        builder.verify_engine(engine, cfg, "target", 10, "tensorrt")
    assert "--speculative_decoding_mode=draft_tokens_external" in str(err.value)
    (engine / "config.json").write_text(json.dumps(engine_config(plugin_config={"use_paged_context_fmha": False})))
    with pytest.raises(Exception, match="--use_paged_context_fmha=enable"):
        builder.verify_engine(engine, cfg, "target", 10, "tensorrt")


def test_without_tensorrt_llm_build_points_to_emit_script(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(builder, "trtllm_available", lambda: False)
    res = runner.invoke(cli, ["build", str(CONFIGS / "llama-3.3-70b-1b-draft-h200.yaml")])
    assert res.exit_code == 2
    assert "--emit-script" in res.output and len(res.output.strip().splitlines()) == 1
    assert not (tmp_path / "engines").exists()


def emit_script(runner, tmp_path, monkeypatch, config: str) -> tuple[Path, str]:
    """`trtspec build CONFIG --emit-script`, checked to exit 0 and to be valid bash."""
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "build.sh"
    res = runner.invoke(cli, ["build", str(CONFIGS / config), "--emit-script", str(script)])
    assert res.exit_code == 0, res.output
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    return script, script.read_text()


def test_emit_script_for_the_engine_recipe(runner, tmp_path, monkeypatch):
    script, text = emit_script(runner, tmp_path, monkeypatch, "llama-3.3-70b-1b-draft-h200.yaml")
    assert "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3" in text and "TRTLLM_VERSION=1.2.1" in text
    assert "huggingface-cli download meta-llama/Llama-3.3-70B-Instruct" in text
    assert "quantization/quantize.py" in text and "--qformat=fp8" in text
    assert "--speculative_decoding_mode=draft_tokens_external" in text and "--max_draft_len=10" in text
    assert text.count("trtllm-build ") == 2 and "engine verified" in text
    assert os.access(script, os.X_OK)


def test_emit_script_for_the_llm_api(runner, tmp_path, monkeypatch):
    _, text = emit_script(runner, tmp_path, monkeypatch, "deepseek-r1-mtp-8gpu.yaml")
    embedded = text.split("<<'YAML'\n", 1)[1].split("\nYAML\n", 1)[0]
    options = yaml.safe_load(embedded)
    assert options["speculative_config"] == {"decoding_type": "MTP", "num_nextn_predict_layers": 3}
    assert options["enable_iter_perf_stats"] is True and options["tensor_parallel_size"] == 8
    assert "trtllm-serve" in text and "--extra_llm_api_options" in text
    assert "$" not in embedded and "huggingface-cli" not in text  # the LLM API takes hub ids as they are


def test_dry_run_lists_steps_and_commands(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(cli, ["build", str(CONFIGS / "llama-3.3-70b-1b-draft-h200.yaml"), "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "target (would build)" in res.output and "draft (would build)" in res.output
    assert "trtllm-build --checkpoint_dir=$WORK/target-ckpt" in res.output
    res = runner.invoke(cli, ["build", str(CONFIGS / "tiny-draft-target.yaml"), "--dry-run"])
    assert res.exit_code == 0 and "num_draft_tokens 2" in res.output
    assert not (tmp_path / "engines").exists()
    config = str(CONFIGS / "llama-3.3-70b-1b-draft-h200.yaml")
    res = runner.invoke(cli, ["build", config, "--dry-run", "--emit-script", "s.sh"])  # the script writes files
    assert res.exit_code == 2 and "choose one" in res.output
    assert list(tmp_path.iterdir()) == []


# --- the torch backend builds for real ------------------------------------------------------------


def torch_project(tmp: Path) -> Path:
    """A config over copies of the embedded pair, so tests may change a checkpoint."""
    from trtspec.assets import EMBEDDED_CHECKPOINTS

    for name, role in (("tiny-target", "target"), ("tiny-draft", "draft")):
        shutil.copytree(EMBEDDED_CHECKPOINTS[name], tmp / role)
    text = (CONFIGS / "tiny-draft-target.yaml").read_text()
    text = text.replace("embedded:tiny-target", "./target").replace("embedded:tiny-draft", "./draft")
    config = tmp / "pair.yaml"
    config.write_text(text)
    return config


def run_cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trtspec", *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=300
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("torch-build")
    config = torch_project(tmp)
    first = run_cli("build", str(config), "--json", cwd=tmp)
    assert first.returncode == 0, first.stderr
    return tmp, config, json.loads(first.stdout)


def test_torch_build_writes_engines_manifest_and_logs(built):
    tmp, _, first = built
    engines = tmp / "engines" / "tiny-draft-target"
    assert first["built"] == ["target", "draft"] and first["num_draft_tokens"] == 2
    manifest = json.loads((engines / "manifest.json").read_text())
    assert manifest["steps"]["target"]["inputs"]["build"]["max_draft_len"] == 10  # K = 2, room for 10
    assert manifest["inputs"]["draft"]["files"] >= 4 and manifest["tools"]["torch"]
    assert all(c["exit_code"] == 0 for s in manifest["steps"].values() for c in s["commands"])
    engine = json.loads((engines / "target" / "engine.json").read_text())
    assert engine["build_config"]["speculative_decoding_mode"] == "draft_tokens_external"
    assert (engines / "logs" / "target.log").read_text().startswith("cast ")
    for name in TOKENIZER_FILES:
        assert (engines / "draft" / name).is_file()
    # the engine directory loads in trtspec's runner and matches the checkpoint it came from
    import torch

    from trtspec.speculative.model import load_transformer

    a = load_transformer(engines / "target", max_len=16)
    b = load_transformer(tmp / "target", max_len=16)
    tokens, pos = torch.tensor([[0, 5, 9]]), torch.arange(3)[None]
    assert torch.equal(a(tokens, pos, a.new_cache(1, 8)).logits, b(tokens, pos, b.new_cache(1, 8)).logits)


def test_second_build_is_a_no_op(built):
    tmp, config, _ = built
    manifest = tmp / "engines" / "tiny-draft-target" / "manifest.json"
    engine_file = tmp / "engines" / "tiny-draft-target" / "target" / "model.safetensors"
    before = engine_file.stat().st_mtime_ns
    again = run_cli("build", str(config), cwd=tmp)
    assert again.returncode == 0, again.stderr
    assert "nothing to do" in again.stdout and "up to date" in again.stdout
    assert engine_file.stat().st_mtime_ns == before
    assert json.loads(manifest.read_text())["steps"]["target"]["finished_at"]


def test_a_damaged_engine_is_rebuilt_not_trusted(tmp_path):
    """The manifest records every file a step wrote by its size: a weight file cut short or a file deleted
    since makes that step (only) stale, for build and for package."""
    config = torch_project(tmp_path)
    assert run_cli("build", str(config), "--no-package", cwd=tmp_path).returncode == 0
    engines = tmp_path / "engines" / "tiny-draft-target"
    weights = engines / "target" / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    (engines / "draft" / "config.json").unlink()
    res = run_cli("build", str(config), "--dry-run", cwd=tmp_path)
    assert "target (would build)" in res.stdout and "draft (would build)" in res.stdout, res.stdout
    res = run_cli("package", str(config), cwd=tmp_path)
    assert res.returncode == 2 and "changed since: run `trtspec build` first" in res.stderr, res.stderr
    res = run_cli("build", str(config), "--json", "--no-package", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["built"] == ["target", "draft"]
    assert run_cli("build", str(config), "--dry-run", cwd=tmp_path).stdout.count("(up to date)") == 2


def test_changed_draft_rebuilds_only_the_draft(tmp_path):
    from safetensors.torch import load_file, save_file

    config = torch_project(tmp_path)
    assert run_cli("build", str(config), cwd=tmp_path).returncode == 0
    engines = tmp_path / "engines" / "tiny-draft-target"
    target_before = (engines / "target" / "model.safetensors").stat().st_mtime_ns
    weights = load_file(str(tmp_path / "draft" / "model.safetensors"))
    weights["model.norm.weight"] = weights["model.norm.weight"] * 1.5
    save_file(weights, str(tmp_path / "draft" / "model.safetensors"))
    res = run_cli("build", str(config), "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["built"] == ["draft"] and out["up_to_date"] == ["target"]
    assert (engines / "target" / "model.safetensors").stat().st_mtime_ns == target_before
    rebuilt = load_file(str(engines / "draft" / "model.safetensors"))
    assert rebuilt["model.norm.weight"].float().allclose(weights["model.norm.weight"].float())


def test_sigkill_mid_build_leaves_no_engine_and_the_next_run_completes(tmp_path):
    config = torch_project(tmp_path)
    engines = tmp_path / "engines" / "tiny-draft-target"
    env = {**os.environ, builder.HOLD_ENV: "60"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "trtspec", "build", str(config)], cwd=tmp_path, env=env,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.time() + 120
        while not list(engines.glob(".staging-target-*/engine.json")):
            assert proc.poll() is None, "the build ended before it could be killed"
            assert time.time() < deadline, "the build never reached its first step"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert not (engines / "target").exists() and not (engines / "draft").exists()
    resumed = run_cli("build", str(config), "--json", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["built"] == ["target", "draft"]
    assert not list(engines.glob(".staging-*"))
    assert Manifest.load(engines).steps.keys() == {"target", "draft"}


def test_full_disk_is_one_line_and_leaves_nothing_half_written(runner, tmp_path, monkeypatch):
    config = torch_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    import trtspec.speculative.model as weights_io

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(weights_io, "save_file", full_disk)
    res = runner.invoke(cli, ["build", str(config)])
    assert res.exit_code == 1
    assert error_lines(res.output) == [res.output.strip().splitlines()[-1]] and "no space left" in res.output
    engines = tmp_path / "engines" / "tiny-draft-target"
    assert not (engines / "target").exists() and not list(engines.glob(".staging-*"))


def test_unwritable_output_is_one_line(runner, tmp_path, monkeypatch):
    config = torch_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "engines").write_text("a file where the engines directory should be")
    res = runner.invoke(cli, ["build", str(config)])
    assert res.exit_code == 2
    assert len(error_lines(res.output)) == 1 and "cannot write" in res.output


def test_auto_draft_tokens_come_from_plan_json(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    target, draft = pair(tmp_path)
    cfg = trt_config(target, draft)
    auto = cfg.model_copy(update={"speculation": cfg.speculation.model_copy(update={"num_draft_tokens": "auto"})})
    with pytest.raises(Exception, match="run `trtspec plan` first"):
        builder.resolve_num_draft_tokens(auto, builder.engine_dir_for(auto))
    plan = builder.engine_dir_for(auto) / "plan.json"
    plan.parent.mkdir(parents=True)
    plan.write_text(json.dumps({"recommended_num_draft_tokens": 12}))
    assert builder.resolve_num_draft_tokens(auto, builder.engine_dir_for(auto)) == 12
    assert "--max_draft_len=12" in "\n".join(builder.describe_plan(auto))


def test_examples_folder_layouts(tmp_path):
    """convert_checkpoint.py is found in the 1.x layout first, then the 0.x one."""
    old = tmp_path / "old"
    (old / "llama").mkdir(parents=True)
    (old / "llama" / "convert_checkpoint.py").write_text("")
    command = recipes.Command("convert_checkpoint.py", (), family="llama")
    assert builder.convert_script_path(old, command) == old / "llama" / "convert_checkpoint.py"
    (old / "models" / "core" / "llama").mkdir(parents=True)
    (old / "models" / "core" / "llama" / "convert_checkpoint.py").write_text("")
    assert builder.convert_script_path(old, command) == old / "models/core/llama/convert_checkpoint.py"


FAKE_TRTLLM_BUILD = """#!/usr/bin/env python3
# stand-in for trtllm-build (TensorRT-LLM cannot run here): writes the config.json keys a real
# build writes for the flags it was given, so the script's verification and layout are exercised
import json, os, sys
args = dict(a[2:].split("=", 1) if "=" in a else (a[2:], True) for a in sys.argv[1:])
os.makedirs(args["output_dir"], exist_ok=True)
spec = args.get("speculative_decoding_mode") == "draft_tokens_external"
build = {"max_batch_size": int(args["max_batch_size"]), "max_seq_len": int(args["max_seq_len"]),
         "max_draft_len": int(args.get("max_draft_len", 0)), "speculative_decoding_mode": 2 if spec else 1,
         "gather_generation_logits": "gather_generation_logits" in args,
         "plugin_config": {"use_paged_context_fmha": args.get("use_paged_context_fmha") == "enable"}}
vocab = json.load(open(args["checkpoint_dir"] + "/config.json"))["vocab_size"]
engine = {"pretrained_config": {"vocab_size": vocab}, "build_config": build}
json.dump(engine, open(args["output_dir"] + "/config.json", "w"))
"""
FAKE_CONVERT = """import json, os, sys
# stand-in for convert_checkpoint.py: a TensorRT-LLM checkpoint dir carrying the model's vocab_size
args = dict(a[2:].split("=", 1) for a in sys.argv[1:] if "=" in a)
os.makedirs(args["output_dir"], exist_ok=True)
vocab = json.load(open(args["model_dir"] + "/config.json"))["vocab_size"]
json.dump({"vocab_size": vocab}, open(args["output_dir"] + "/config.json", "w"))
"""


def test_emitted_engine_script_runs_end_to_end_with_stand_in_tools(tmp_path):
    """The script's shell logic for real (version check, convert lookup, verification, manifest),
    with stand-ins for what only NVIDIA's container has: tensorrt_llm, convert_checkpoint.py, trtllm-build."""
    target, draft = pair(tmp_path)
    config = tmp_path / "dtm.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "dtm",
                "target": {"checkpoint": str(target), "dtype": "float16"},
                "draft": {"checkpoint": str(draft), "dtype": "float16"},
                "speculation": {"mode": "draft-target", "num_draft_tokens": 3},
                "build": {"backend": "tensorrt", "max_batch_size": 4, "max_input_len": 64, "max_seq_len": 128},
                "serve": {"flavour": "engine", "streaming": False},
            }
        )
    )
    script = tmp_path / "build.sh"
    assert run_cli("build", str(config), "--emit-script", str(script), cwd=tmp_path).returncode == 0
    fake = tmp_path / "fake"
    (fake / "bin").mkdir(parents=True)
    (fake / "bin" / "trtllm-build").write_text(FAKE_TRTLLM_BUILD)
    (fake / "bin" / "trtllm-build").chmod(0o755)
    (fake / "tensorrt_llm").mkdir()
    (fake / "tensorrt_llm" / "__init__.py").write_text('__version__ = "1.2.1"\n')
    examples = fake / "examples" / "models" / "core" / "llama"
    examples.mkdir(parents=True)
    (examples / "convert_checkpoint.py").write_text(FAKE_CONVERT)
    env = {
        **os.environ,
        "PATH": f"{fake / 'bin'}:{os.environ['PATH']}",
        "PYTHONPATH": str(fake),
        "TRTLLM_EXAMPLES": str(fake / "examples"),
    }
    res = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    engines = tmp_path / "engines" / "dtm"
    assert json.loads((engines / "target" / "config.json").read_text())["build_config"]["max_draft_len"] == 10
    manifest = json.loads((engines / "manifest.json").read_text())
    assert manifest["tools"]["tensorrt_llm"] == "1.2.1" and set(manifest["steps"]) == {"target", "draft"}
    assert manifest["steps"]["target"]["commands"][1]["argv"][0] == "trtllm-build"
    # a container with another TensorRT-LLM refuses before building anything
    (fake / "tensorrt_llm" / "__init__.py").write_text('__version__ = "1.1.0"\n')
    shutil.rmtree(engines)
    res = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "needs 1.2.1" in res.stderr and not (engines / "target").exists()
    # a trtllm-build that drops the speculative flags fails verification, naming the flag
    (fake / "tensorrt_llm" / "__init__.py").write_text('__version__ = "1.2.1"\n')
    (fake / "bin" / "trtllm-build").write_text(FAKE_TRTLLM_BUILD.replace('args.get("max_draft_len", 0)', "0"))
    res = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode != 0 and "--max_draft_len=10" in res.stderr and not (engines / "target").exists()


def test_a_two_node_model_skips_the_one_host_warm_up(runner, tmp_path, monkeypatch):
    """TP16 over two 8-GPU nodes cannot load in one process on the build host: the script says so."""
    _, text = emit_script(runner, tmp_path, monkeypatch, "deepseek-r1-mtp-2x8-h100.yaml")
    assert "python3 -c" not in text.split("<<'YAML'", 1)[1].split("# serve it with", 1)[0]
    assert "warm-up skipped: tp x pp = 16 GPUs span nodes of 8" in text
    (tmp_path / "one").mkdir()
    _, single = emit_script(runner, tmp_path / "one", monkeypatch, "deepseek-r1-mtp-8gpu.yaml")
    assert 'if [ "${TRTSPEC_SKIP_WARM_UP:-0}" != 1 ]; then' in single and "python3 -c" in single


def test_draft_target_decoding_type_follows_the_version(tmp_path):
    """1.0 and 1.1 map `DraftTarget` in DecodingBaseConfig.from_dict; 1.2 validates the literal `Draft_Target`."""
    target, draft = pair(tmp_path)
    data = {
        "name": "dtm",
        "target": {"checkpoint": str(target)},
        "draft": {"checkpoint": str(draft)},
        "speculation": {"mode": "draft-target", "num_draft_tokens": 4},
        "serve": {"flavour": "llmapi"},
    }
    spellings = {}
    for version in ("1.0.0", "1.1.0", "1.2.0", "1.2.1"):
        cfg = validate_config({**data, "build": {"backend": "pytorch", "tensorrt_llm_version": version}})
        spellings[version] = recipes.llm_api_options(cfg, 4, "/d")["speculative_config"]["decoding_type"]
    assert spellings == {
        "1.0.0": "DraftTarget",
        "1.1.0": "DraftTarget",
        "1.2.0": "Draft_Target",
        "1.2.1": "Draft_Target",
    }


def test_deepseek_mtp_options_follow_nvidias_serving_recipe():
    """NVIDIA's DeepSeek-R1 deployment guide: --ep_size = --tp_size, an FP8 KV cache, padded CUDA graphs
    up to the batch size, stream_interval 10 (examples/serve/deepseek_r1_reasoning_parser.sh)."""
    cfg = load_config(CONFIGS / "deepseek-r1-mtp-8gpu.yaml")
    options = recipes.llm_api_options(cfg, 3, None)
    assert options["moe_expert_parallel_size"] == options["tensor_parallel_size"] == 8
    assert options["kv_cache_config"] == {
        "free_gpu_memory_fraction": cfg.build.kv_cache_free_gpu_mem_fraction,
        "dtype": "fp8",
    }
    assert options["cuda_graph_config"] == {"enable_padding": True, "max_batch_size": cfg.build.max_batch_size}
    assert options["stream_interval"] == 10
    llama = load_config(CONFIGS / "llama-3.3-70b-1b-draft-h200.yaml")
    assert "moe_expert_parallel_size" not in recipes.llm_api_options(llama, 4, "/d")


def test_a_deepseek_baseline_gets_the_same_serving_recipe(tmp_path):
    """The A/B is fair only if the plain-decoding baseline runs with the recipe MTP runs with."""
    target = tmp_path / "r1"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"]}))
    data = {
        "name": "r1-base", "target": {"checkpoint": str(target)}, "speculation": {"mode": "none"},
        "build": {"backend": "pytorch", "tp": 8}, "serve": {"flavour": "llmapi"},
    }  # fmt: skip
    baseline = recipes.llm_api_options(validate_config(data), 0, None)
    assert baseline["moe_expert_parallel_size"] == 8 and baseline["kv_cache_config"]["dtype"] == "fp8"
    (target / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert "cuda_graph_config" not in recipes.llm_api_options(validate_config(data), 0, None)


def test_the_manifest_records_the_serving_trade_offs(tmp_path, monkeypatch):
    """Shared-GPU KV caps from the memory plan where the checkpoints are local, and the draft room."""
    monkeypatch.chdir(tmp_path)
    target, draft = pair(tmp_path)
    cfg = trt_config(target, draft, gpu_memory_gb=4.0, max_batch_size=64, max_seq_len=4800)
    decisions = builder.serving_decisions(cfg, 4)
    assert decisions["target_max_draft_len"]["value"] == 10
    shared = decisions["shared_gpu"]
    assert shared["gpu_device_ids"] == "0" and shared["tokens_needed"] == 64 * 4800
    assert shared["max_tokens_in_paged_kv_cache"] == 64 * 4800 and shared["basis"].startswith("memory plan")
    tight = trt_config(target, draft, gpu_memory_gb=3.001, max_batch_size=64, max_seq_len=4800)
    capped = builder.serving_decisions(tight, 4)["shared_gpu"]["max_tokens_in_paged_kv_cache"]
    assert 0 <= capped < 64 * 4800  # 1 MB of budget: fewer tokens than the engines could use
    from trtspec.build.script import build_script

    assert '"max_tokens_in_paged_kv_cache": 307200' in build_script(cfg)  # the emitted build writes it too
