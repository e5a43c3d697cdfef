"""The deployment config: every example loads; every malformed one fails on one line naming file and field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import CONFIGS

from trtspec.cli import cli
from trtspec.config import load_config
from trtspec.errors import ConfigError

EXAMPLES = sorted(CONFIGS.glob("*.yaml"))

# A valid config that needs no local checkpoint: hub ids are resolved on the GPU host.
GOOD = {
    "name": "pair",
    "target": {"checkpoint": "meta-llama/Llama-3.3-70B-Instruct"},
    "draft": {"checkpoint": "meta-llama/Llama-3.2-1B-Instruct"},
    "speculation": {"mode": "draft-target", "num_draft_tokens": 4},
    "build": {"backend": "tensorrt", "max_input_len": 1024, "max_seq_len": 2048},
    "serve": {"flavour": "engine", "streaming": False},
}


def _with(path: str, value) -> dict:
    """GOOD with one dotted field set (or removed when value is ...)."""
    data = yaml.safe_load(yaml.safe_dump(GOOD))
    *parents, leaf = path.split(".")
    node = data
    for p in parents:
        node = node.setdefault(p, {})
    if value is ...:
        node.pop(leaf)
    else:
        node[leaf] = value
    return data


def test_examples_exist_for_every_required_deployment():
    names = {p.stem for p in EXAMPLES}
    assert {
        "tiny-draft-target",
        "tiny-mtp",
        "llama-3.3-70b-1b-draft-h200",
        "llama-3.1-405b-3b-draft-tp4",
        "deepseek-r1-mtp-8gpu",
    } <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_config_validates(path: Path, runner):
    cfg = load_config(path)
    assert cfg.source == path.resolve()
    result = runner.invoke(cli, ["validate", str(path)])
    assert result.exit_code == 0, result.output
    assert f"{cfg.name}: mode {cfg.mode}" in result.output


def test_examples_carry_the_documented_setups():
    deepseek = load_config(CONFIGS / "deepseek-r1-mtp-8gpu.yaml")
    assert (deepseek.mode, deepseek.build.backend, deepseek.build.tp) == ("mtp", "pytorch", 8)
    llama405 = load_config(CONFIGS / "llama-3.1-405b-3b-draft-tp4.yaml")
    assert (llama405.build.tp, llama405.build.backend) == (4, "tensorrt")
    tiny = load_config(CONFIGS / "tiny-draft-target.yaml")
    assert tiny.checkpoint_path(tiny.target).name == "tiny-target"


MALFORMED = [
    # (id, yaml text or dict, expected field, expected words)
    ("bad-yaml", "name: x\ntarget: [unclosed\n", "invalid YAML", "line"),
    ("not-a-mapping", "- just\n- a list\n", "must be a YAML mapping", ""),
    ("unknown-key", _with("speculation.num_drafts", 4), "speculation.num_drafts", "unknown key"),
    ("wrong-type", _with("build.max_batch_size", "lots"), "build.max_batch_size", "must be an integer"),
    (
        "draft-tokens-zero",
        _with("speculation.num_draft_tokens", 0),
        "speculation.num_draft_tokens",
        "must be >= 1 or 'auto', got 0",
    ),
    ("draft-tokens-word", _with("speculation.num_draft_tokens", "many"), "speculation.num_draft_tokens", "'auto'"),
    ("missing-target", _with("target", ...), "target", "required"),
    (
        "missing-checkpoint-path",
        _with("draft.checkpoint", "./no/such/dir"),
        "draft.checkpoint",
        "no such checkpoint directory",
    ),
    (
        "unknown-embedded",
        _with("target.checkpoint", "embedded:huge"),
        "target.checkpoint",
        "unknown embedded checkpoint",
    ),
    (
        "mtp-with-tensorrt",
        {**_with("draft", ...), "speculation": {"mode": "mtp"}},
        "build.backend",
        "use backend pytorch",
    ),
    ("seq-len-too-small", _with("build.max_seq_len", 1027), "build.max_seq_len", ">= 1029"),
    ("input-above-seq", _with("build.max_input_len", 4096), "build.max_input_len", "must be below max_seq_len"),
    ("bad-mode", _with("speculation.mode", "redrafter"), "speculation.mode", "must be one of"),
    ("bad-backend", _with("build.backend", "onnx"), "build.backend", "must be one of"),
    ("draft-target-without-draft", _with("draft", ...), "draft", "required when speculation.mode is draft-target"),
    (
        "kv-fraction",
        _with("build.kv_cache_free_gpu_mem_fraction", 1.5),
        "build.kv_cache_free_gpu_mem_fraction",
        "must be <= 1, got 1.5",
    ),
    (
        "kv-fraction-zero",
        _with("build.kv_cache_free_gpu_mem_fraction", 0),
        "build.kv_cache_free_gpu_mem_fraction",
        "> 0",
    ),
    ("port-range", _with("serve.metrics_port", 70000), "serve.metrics_port", "must be <= 65535, got 70000"),
    ("batch-size", _with("build.max_batch_size", 0), "build.max_batch_size", "must be >= 1, got 0"),
    ("gpu-memory", _with("build.gpu_memory_gb", 0.5), "build.gpu_memory_gb", "must be >= 1, got 0.5"),
    (
        "alert-for",
        _with("deploy.monitoring", {"alert_for": "soon"}),
        "deploy.monitoring.alert_for",
        "must match ^[1-9][0-9]*[smh]$, got 'soon'",
    ),
    ("engine-streaming-bls", _with("serve.streaming", True), "serve.streaming", "does not stream"),
    (
        "trtllm-1.3-engines",
        _with("build.tensorrt_llm_version", "1.3.0"),
        "build.tensorrt_llm_version",
        "compiled engines end with 1.2.x",
    ),
    ("bad-name", _with("name", "My Model"), "name", "DNS-1123"),
    ("same-ports", _with("serve.grpc_port", 8000), "serve.http_port", "must differ"),
    (
        "temperature",
        _with("speculation.sampling", {"temperature": -1}),
        "speculation.sampling.temperature",
        "must be >= 0, got -1",
    ),
    ("top-p", _with("speculation.sampling", {"top_p": 0}), "speculation.sampling.top_p", "must be > 0, got 0"),
    (
        "torch-with-tp",
        {**GOOD, "build": {"backend": "torch", "tp": 2}, "serve": {"flavour": "llmapi"}},
        "build.tp",
        "one device",
    ),
    ("adaptive-on-engines", _with("speculation.policy", "adaptive"), "speculation.policy", "torch backend"),
    ("bad-policy", _with("speculation.policy", "greedy"), "speculation.policy", "must be one of"),
    ("cutoff-on-engines", _with("speculation.max_concurrency", 8), "speculation.max_concurrency", "pytorch backend"),
    (
        "cutoff-before-1.2",
        {
            **_with("speculation.max_concurrency", 8),
            "build": {"backend": "pytorch", "tensorrt_llm_version": "1.1.0"},
            "serve": {"flavour": "llmapi"},
        },
        "speculation.max_concurrency",
        "needs TensorRT-LLM 1.2+",
    ),
]


@pytest.mark.parametrize("case", MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed_config_fails_with_one_line_naming_file_and_field(case, tmp_path, runner):
    _, content, field, words = case
    path = tmp_path / "x.yaml"
    path.write_text(content if isinstance(content, str) else yaml.safe_dump(content))
    result = runner.invoke(cli, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"trtspec: error: {path}: ")
    assert field in lines[0] and words in lines[0]
    assert "Traceback" not in result.output


def test_good_base_config_is_valid_so_each_case_tests_one_fault():
    from trtspec.config import validate_config

    assert validate_config(GOOD).name == "pair"


def test_missing_config_file(tmp_path, runner):
    result = runner.invoke(cli, ["validate", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "no such config file" in result.stderr


def test_error_lists_every_fault_in_one_line(tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text(
        textwrap.dedent("""\
        name: two
        target: {checkpoint: a/b}
        speculation: {num_draft_tokens: 99}
        build: {tp: 0}
    """)
    )
    with pytest.raises(ConfigError) as info:
        load_config(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert (
        "speculation.num_draft_tokens: must be <= 16 or 'auto', got 99" in msg
        and "build.tp: must be >= 1, got 0" in msg
    )


def test_relative_checkpoint_resolves_against_config_dir(tmp_path):
    ckpt = tmp_path / "models" / "target"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text("{}")
    cfg_dir = tmp_path / "configs"
    cfg_dir.mkdir()
    path = cfg_dir / "local.yaml"
    path.write_text("name: local\ntarget: {checkpoint: ../models/target}\nspeculation: {mode: none}\n")
    cfg = load_config(path)
    assert cfg.checkpoint_path(cfg.target) == ckpt.resolve()
    (ckpt / "config.json").unlink()
    with pytest.raises(ConfigError, match=r"target.checkpoint: not a Hugging Face checkpoint"):
        load_config(path)


def test_digest_changes_with_settings():
    from trtspec.config import validate_config

    a = validate_config(GOOD).digest()
    b = validate_config(_with("speculation.num_draft_tokens", 5)).digest()
    assert a != b and a == validate_config(GOOD).digest()


def test_an_unset_tree_leaves_the_hashes_as_they_were():
    """speculation.tree came later: configs without it hash as before (the deploy goldens hold those hashes:
    no pod roll, no rebuild), and setting it changes both hashes."""
    from trtspec.config import validate_config

    data = _with("build.backend", "torch")
    data["serve"] = {**data.get("serve", {}), "flavour": "llmapi"}
    cfg = validate_config(data)
    assert "tree" not in cfg.model_dump(mode="json", exclude=cfg._unused())["speculation"]
    data["speculation"] = {**data.get("speculation", {}), "tree": "3x2", "policy": "fixed"}
    treed = validate_config(data)
    assert treed.digest() != cfg.digest() and treed.serving_digest() != cfg.serving_digest()


@pytest.mark.parametrize("name", ["tiny-draft-target", "tiny-mtp", "tiny-baseline"])
def test_embedded_configs_pass_trtspec_check(name):
    from trtspec.check import run_check

    report = run_check(load_config(CONFIGS / f"{name}.yaml"))
    assert report.ok, [f for f in report.findings if f.severity == "error"]
