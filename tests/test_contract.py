"""The contract with NVIDIA's model code: where it comes from, that generated repositories meet it,
that a repository dropping any item is caught, and that the tool reads such items from code."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import yaml
from conftest import CONFIGS, REPO

from trtspec.config import load_config
from trtspec.errors import TrtspecError
from trtspec.repository import contract, engine, package
from trtspec.repository.pbtxt import parse, render

GPU_CONFIGS = [
    "llama-3.3-70b-1b-draft-h200.yaml",
    "llama-3.1-405b-3b-draft-tp4.yaml",
    "deepseek-r1-mtp-8gpu.yaml",
    "deepseek-r1-mtp-2x8-h100.yaml",
]


def tool():
    spec = importlib.util.spec_from_file_location("nvidia_contract_tool", REPO / "tools" / "nvidia_contract.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_source_names_its_upstream_tree():
    sources = contract.sources()
    assert len(sources) >= 2
    for source in sources:
        assert source["repo"] in ("NVIDIA/TensorRT-LLM", "triton-inference-server/tensorrtllm_backend"), source
        assert source["path"] and source["trtllm"], source
        commits = source["commit"].values() if isinstance(source["commit"], dict) else [source["commit"]]
        for commit in commits:  # one for the tree, or one per file where the files were read one by one
            assert len(commit) == 40 and all(c in "0123456789abcdef" for c in commit), source


def test_the_contract_holds_what_the_issue_saw_fail():
    """The four load failures seen with NVIDIA's code are items of the contract."""
    assert "multimodal_model_path" in contract.model("preprocessing").parameters_required
    assert {"OUT_PROMPT_TABLE_EXTRA_IDS", "PIXEL_VALUES", "IMAGE_SIZES"} <= contract.model(
        "preprocessing"
    ).outputs_looked_up
    assert {"IS_VIDEO_INPUT", "VISION_INPUT_ID", "ATTENTION_MASK", "IMAGE_GRID_THW"} <= contract.bls_requests()[
        "preprocessing"
    ]["asked"]
    assert "helpers.py" in contract.model("llmapi").sibling_files
    assert "lib" in contract.model("tensorrt_llm_bls").sibling_files


@pytest.mark.parametrize("name", GPU_CONFIGS)
def test_generated_repositories_meet_the_contract(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    repo = package.package_repository(load_config(CONFIGS / name))
    assert contract.violations(repo) == []
    if (repo / "ensemble").exists():  # every input a client of NVIDIA's ensemble or BLS may send
        assert len(parse((repo / "ensemble" / "config.pbtxt").read_text()).input) >= 36
        assert len(parse((repo / "tensorrt_llm_bls" / "config.pbtxt").read_text()).input) >= 42


def _rewrite(path: Path, edit) -> None:
    config = parse(path.read_text())
    edit(config)
    path.write_text(render(config))


def _drop(field: str, name: str):
    def edit(config):
        if field == "parameters":
            del config.parameters[name]
            return
        items = getattr(config, field)
        keep = [t for t in items if t.name != name]
        del items[:]
        items.extend(keep)

    return edit


@pytest.mark.parametrize(
    ("model", "field", "item", "expect"),
    [
        ("preprocessing", "parameters", "multimodal_model_path", "parameter multimodal_model_path"),
        ("preprocessing", "output", "OUT_PROMPT_TABLE_EXTRA_IDS", "output OUT_PROMPT_TABLE_EXTRA_IDS"),
        ("preprocessing", "output", "IS_VIDEO_INPUT", "output IS_VIDEO_INPUT"),
        ("tensorrt_llm", "input", "min_tokens", "input min_tokens"),
        ("tensorrt_llm_draft", "output", "generation_logits", "output generation_logits"),
        ("ensemble", "input", "repetition_penalty", "input repetition_penalty"),
        ("tensorrt_llm_bls", "input", "beam_width", "input beam_width"),
    ],
)
def test_a_repository_dropping_an_item_is_caught(model, field, item, expect, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    repo = package.package_repository(load_config(CONFIGS / "llama-3.3-70b-1b-draft-h200.yaml"))
    _rewrite(repo / model / "config.pbtxt", _drop(field, item))
    problems = contract.violations(repo)
    assert any(p.startswith(f"{model}: {expect}") for p in problems), problems


def test_a_tensor_of_another_type_is_caught(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    repo = package.package_repository(load_config(CONFIGS / "llama-3.3-70b-1b-draft-h200.yaml"))

    def retype(config):
        next(t for t in config.input if t.name == "draft_logits").data_type = engine.mc.TYPE_FP16

    _rewrite(repo / "tensorrt_llm" / "config.pbtxt", retype)
    assert "tensorrt_llm: draft_logits is not FP32 [-1, -1] as NVIDIA's template declares it" in contract.violations(
        repo
    )


def test_an_llmapi_repository_without_helpers_or_triton_config_is_caught(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    repo = package.package_repository(load_config(CONFIGS / "deepseek-r1-mtp-8gpu.yaml"))
    (repo / "tensorrt_llm" / "1" / "helpers.py").unlink()
    options = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    del options["triton_config"]["max_batch_size"]
    (repo / "tensorrt_llm" / "1" / "model.yaml").write_text(yaml.safe_dump(options))
    problems = contract.violations(repo)
    assert "tensorrt_llm: 1/helpers.py (imported by llmapi/tensorrt_llm/1/model.py)" in problems
    assert any("triton_config.max_batch_size" in p for p in problems), problems


def test_package_refuses_to_write_a_repository_nvidia_cannot_load(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(CONFIGS / "llama-3.3-70b-1b-draft-h200.yaml")
    real = engine.template_parameters

    def without_multimodal(name, values):
        return {k: v for k, v in real(name, values).items() if k != "multimodal_model_path"}

    monkeypatch.setattr(engine, "template_parameters", without_multimodal)
    with pytest.raises(TrtspecError, match="preprocessing: parameter multimodal_model_path"):
        package.package_repository(cfg)
    assert not (tmp_path / "model_repository" / cfg.name).exists()


FAKE_MODEL = """
import json
import triton_python_backend_utils as pb_utils
from helpers import util

class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args['model_config'])
        path = model_config['parameters']['needed_path']['string_value']
        maybe = model_config['parameters'].get('optional_flag')
        params = model_config['parameters']
        if 'guarded' in params:
            x = params['guarded']
        names = ["OUT_A", "OUT_B"]
        for name in names:
            pb_utils.get_output_config_by_name(model_config, name)
        pb_utils.get_input_config_by_name(model_config, "IN_C")
"""
FAKE_CONFIG = """
name: "m"
backend: "python"
max_batch_size: ${triton_max_batch_size}
input [ { name: "IN_C" data_type: TYPE_FP32 dims: [ -1 ] optional: true } ]
output [ { name: "OUT_A" data_type: ${logits_datatype} dims: [ -1 ] },
         { name: "OUT_B" data_type: TYPE_INT32 dims: [ 1 ] } ]
parameters: { key: "needed_path" value: { string_value: "${needed_path}" } }
instance_group [ { count: ${count} kind: KIND_CPU } ]
"""


def test_the_tool_reads_requirements_from_code(tmp_path):
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(FAKE_MODEL)
    (folder / "1" / "helpers.py").write_text("def util(): pass\n")
    (folder / "config.pbtxt").write_text(FAKE_CONFIG)
    t = tool()
    code = t.code_facts(folder / "1" / "model.py")
    assert code["parameters_unguarded"] == ["needed_path"]
    assert code["parameters_with_default"] == ["optional_flag"]
    assert code["outputs_looked_up"] == ["OUT_A", "OUT_B"] and code["inputs_looked_up"] == ["IN_C"]
    assert code["sibling_files"] == ["helpers.py"]
    facts = t.config_facts(folder / "config.pbtxt")
    assert facts["outputs"][0] == {"name": "OUT_A", "data_type": "${logits_datatype}", "dims": [-1]}
    assert facts["inputs"][0]["optional"] is True and facts["parameters"] == ["needed_path"]


@pytest.mark.nvidia
@pytest.mark.skipif(
    not os.environ.get("TRTSPEC_NVIDIA_MODELS"), reason="TRTSPEC_NVIDIA_MODELS is not set (NVIDIA's all_models folder)"
)
def test_the_contract_covers_the_nvidia_tree_at_hand(tmp_path):
    """Facts read from the folder the variable names are all in the committed contract: a newer tree
    that requires more fails here, and `tools/nvidia_contract.py` adds it as a source."""
    facts = tool().read_all_models(Path(os.environ["TRTSPEC_NVIDIA_MODELS"]))
    for name, entry in facts.items():
        c = contract.model(name)
        assert {t["name"] for t in entry["config"]["inputs"]} <= {t.name for t in c.inputs}, name
        assert {t["name"] for t in entry["config"]["outputs"]} <= {t.name for t in c.outputs}, name
        code = entry.get("code", {})
        assert set(code.get("parameters_unguarded", [])) <= c.parameters_required, name
        assert set(code.get("outputs_looked_up", [])) <= c.outputs_looked_up, name
        assert set(code.get("sibling_files", [])) <= set(c.sibling_files), name
    for target, request in facts["tensorrt_llm_bls"]["bls"]["requests"].items():
        assert set(request["asked"]) <= contract.bls_requests()[target]["asked"], target
