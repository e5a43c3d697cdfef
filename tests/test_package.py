"""`trtspec package` without a server: what each repository holds, checked against the documented
draft-target setup (NVIDIA/TensorRT-LLM examples/draft_target_model/README.md's fill_template.py commands and
triton_backend/all_models/inflight_batcher_llm's templates) and TensorRT-LLM's llmapi model.yaml; and that a
failed write leaves the previous repository whole."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import CONFIGS

from trtspec.cli import cli
from trtspec.config import load_config, validate_config
from trtspec.errors import UsageError
from trtspec.repository import engine, package
from trtspec.repository.pbtxt import parse


def read(repo: Path, model: str):
    return parse((repo / model / "config.pbtxt").read_text())


def params(config) -> dict[str, str]:
    return {k: v.string_value for k, v in config.parameters.items()}


def test_engine_repository_for_nvidias_container(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "build.sh"
    res = runner.invoke(cli, ["build", str(CONFIGS / "llama-3.3-70b-1b-draft-h200.yaml"), "--emit-script", str(script)])
    assert res.exit_code == 0, res.output
    repo = tmp_path / "model_repository" / "llama-3-3-70b-1b-draft"
    expected = {"ensemble", "preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_draft", "tensorrt_llm_bls"}
    assert {p.name for p in repo.iterdir()} == expected
    for name, role in (("tensorrt_llm", "target"), ("tensorrt_llm_draft", "draft")):
        config = read(repo, name)
        p = params(config)
        assert (
            config.name == name and config.backend == "tensorrtllm" and config.max_batch_size == 16
        )  # build.max_batch_size
        assert config.model_transaction_policy.decoupled is False  # BLS speculation: decoupled_mode False
        assert p["gpt_model_path"] == f"/trtspec/engines/llama-3-3-70b-1b-draft/{role}"
        assert p["gpt_model_type"] == "inflight_fused_batching" and p["enable_kv_cache_reuse"] == "True"
        # two models on one GPU: the config's fraction, each capped at what its engine can hold so the
        # one loaded first cannot take the other's share (hub ids: no config.json here for a memory plan)
        assert p["kv_cache_free_gpu_mem_fraction"] == "0.9" and p["gpu_device_ids"] == "0"
        assert p["max_tokens_in_paged_kv_cache"] == str(16 * 8192)
        dtypes = {t.name: t.data_type for t in [*config.input, *config.output]}
        assert dtypes["draft_logits"] == dtypes["generation_logits"] == engine.mc.TYPE_FP32  # logits_datatype
        assert not (repo / name / "1" / "model.py").exists()  # the C++ backend: no python code
    bls = read(repo, "tensorrt_llm_bls")
    assert params(bls)["tensorrt_llm_draft_model_name"] == "tensorrt_llm_draft"
    assert {"num_draft_tokens", "use_draft_logits"} <= {t.name for t in bls.input}
    assert "num_draft_tokens" not in {t.name for t in read(repo, "ensemble").input}
    for name in ("preprocessing", "postprocessing", "tensorrt_llm_bls"):
        link = repo / name / "1" / "model.py"
        assert link.is_symlink()
        assert os.readlink(link) == f"/app/all_models/inflight_batcher_llm/{name}/1/model.py"
    assert os.readlink(repo / "tensorrt_llm_bls" / "1" / "lib").endswith("tensorrt_llm_bls/1/lib")
    # the checkpoint is a hub id: preprocessing loads the tokenizer by that id
    assert params(read(repo, "preprocessing"))["tokenizer_dir"] == "meta-llama/Llama-3.3-70B-Instruct"


def test_ensemble_wiring_is_consistent():
    p = engine.EngineParams(max_batch_size=4, decoupled=False, engine_dir="/e", tokenizer_dir="/t")
    ensemble = engine.ensemble_config(p)
    models = {
        "preprocessing": engine.preprocessing_config(p),
        "tensorrt_llm": engine.tensorrt_llm_config("tensorrt_llm", p, "tensorrtllm"),
        "postprocessing": engine.postprocessing_config(p),
    }
    produced = {t.name for t in ensemble.input}
    for step in ensemble.ensemble_scheduling.step:
        model = models[step.model_name]
        inputs, outputs = {t.name for t in model.input}, {t.name for t in model.output}
        assert set(step.input_map) <= inputs and set(step.input_map.values()) <= produced, step.model_name
        assert set(step.output_map) <= outputs, step.model_name
        produced |= set(step.output_map.values())
        required = {t.name for t in model.input if not t.optional}
        assert required <= set(step.input_map), (step.model_name, required - set(step.input_map))
    assert {t.name for t in ensemble.output} <= produced


def test_llmapi_repository_for_nvidias_container(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(cli, ["package", str(CONFIGS / "deepseek-r1-mtp-8gpu.yaml")])
    assert res.exit_code == 0, res.output
    model = tmp_path / "model_repository" / "deepseek-r1-mtp" / "tensorrt_llm"
    options = yaml.safe_load((model / "1" / "model.yaml").read_text())
    assert options["model"] == "deepseek-ai/DeepSeek-R1" and options["backend"] == "pytorch"
    assert options["speculative_config"] == {"decoding_type": "MTP", "num_nextn_predict_layers": 3}
    assert options["triton_config"]["decoupled"] is True and options["tensor_parallel_size"] == 8
    assert os.readlink(model / "1" / "model.py") == "/app/all_models/llmapi/tensorrt_llm/1/model.py"
    assert os.readlink(model / "1" / "helpers.py") == "/app/all_models/llmapi/tensorrt_llm/1/helpers.py"
    assert read(model.parent, "tensorrt_llm").backend == "python"


@pytest.mark.slow
def test_torch_engine_repository_names_trtspecs_models(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data = yaml.safe_load((CONFIGS / "tiny-draft-target.yaml").read_text())
    data["serve"].update(flavour="engine", streaming=False)
    config = tmp_path / "pair.yaml"
    config.write_text(yaml.safe_dump(data))
    res = runner.invoke(cli, ["build", str(config), "--json"])
    assert res.exit_code == 0, res.output
    repo = tmp_path / "model_repository" / "tiny-draft-target"
    import importlib

    for model in repo.iterdir():
        code = model / "1" / "model.py"
        if model.name == "ensemble":
            assert not code.exists() and read(repo, "ensemble").platform == "ensemble"
            continue
        module, cls = code.read_text().split()[1], code.read_text().split()[3]
        assert hasattr(importlib.import_module(module), cls), code
    target = params(read(repo, "tensorrt_llm"))
    assert Path(target["gpt_model_path"]) == (tmp_path / "engines" / "tiny-draft-target" / "target").resolve()
    assert target["trtspec_mode"] == "none"  # the target verifies drafts the BLS sends; it drafts nothing


def test_a_failed_write_keeps_the_previous_repository(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = load_config(CONFIGS / "deepseek-r1-mtp-8gpu.yaml")
    first = package.package_repository(cfg)
    before = (first / "tensorrt_llm" / "1" / "model.yaml").read_text()

    def broken(cfg, out, **_):
        (out / "half-written").mkdir()
        raise OSError(28, "No space left on device")

    monkeypatch.setitem(package.WRITERS, ("pytorch", "llmapi"), broken)
    with pytest.raises(Exception, match="No space left on device"):
        package.package_repository(cfg)
    assert (first / "tensorrt_llm" / "1" / "model.yaml").read_text() == before
    # no staging directory left; the record of which config the repository in place serves is the first's
    assert sorted(p.name for p in first.parent.iterdir()) == sorted(
        [first.name, package.config_digest_path(first).name]
    )
    assert package.config_digest_path(first).read_text().strip() == cfg.serving_digest()


def test_nvidias_models_come_from_where_the_image_has_them(runner, tmp_path, monkeypatch):
    """--nvidia-models links model.py and what it imports from another all_models folder."""
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(
        cli, ["package", str(CONFIGS / "llama-3.3-70b-1b-draft-h200.yaml"), "--nvidia-models", "/opt/x/"]
    )
    assert res.exit_code == 0, res.output
    bls = tmp_path / "model_repository" / "llama-3-3-70b-1b-draft" / "tensorrt_llm_bls" / "1"
    assert os.readlink(bls / "lib") == "/opt/x/inflight_batcher_llm/tensorrt_llm_bls/1/lib"
    pre = params(read(bls.parent.parent, "preprocessing"))
    # every template parameter is there: ours filled, the rest unfilled as fill_template leaves them
    assert pre["multimodal_model_path"] == "${multimodal_model_path}" and pre["add_special_tokens"] == "True"
    assert read(bls.parent.parent, "preprocessing").dynamic_batching.preferred_batch_size == [16]


def test_nvidia_backends_take_one_instance_and_an_absolute_models_path(tmp_path, monkeypatch):
    """NVIDIA's llmapi model needs GPUs per instance that a pod of tp x pp does not have: replicas scale."""
    from trtspec.config import validate_config
    from trtspec.errors import ConfigError, UsageError

    monkeypatch.chdir(tmp_path)
    data = yaml.safe_load((CONFIGS / "deepseek-r1-mtp-8gpu.yaml").read_text())
    data["serve"]["instances"] = 2
    with pytest.raises(ConfigError, match=r"serve\.instances"):
        validate_config(data)
    with pytest.raises(UsageError, match="absolute"):
        package.package_repository(load_config(CONFIGS / "deepseek-r1-mtp-8gpu.yaml"), nvidia_models="all_models")


def test_two_engines_that_cannot_hold_one_sequence_are_refused(tmp_path, monkeypatch):
    """With local checkpoints and a GPU size, the KV cap comes from the memory plan; below one max_seq_len
    sequence the repository is not written."""
    from tiny_models import make_checkpoint

    from trtspec.config import validate_config
    from trtspec.errors import UsageError

    monkeypatch.chdir(tmp_path)
    data = {
        "name": "tight",
        "target": {"checkpoint": str(make_checkpoint(tmp_path / "t", vocab=32, seed=1)), "dtype": "float16"},
        "draft": {"checkpoint": str(make_checkpoint(tmp_path / "d", vocab=32, seed=2)), "dtype": "float16"},
        "speculation": {"mode": "draft-target", "num_draft_tokens": 4},
        "build": {"backend": "tensorrt", "max_batch_size": 64, "max_input_len": 1024, "max_seq_len": 4800},
        "serve": {"flavour": "engine", "streaming": False},
    }
    roomy = validate_config({**data, "build": {**data["build"], "gpu_memory_gb": 80}})
    repo = package.package_repository(roomy)
    assert params(read(repo, "tensorrt_llm"))["max_tokens_in_paged_kv_cache"] == str(64 * 4800)
    tight = validate_config({**data, "build": {**data["build"], "gpu_memory_gb": 3.0001}})
    with pytest.raises(UsageError, match="less than max_seq_len 4800"):
        package.package_repository(tight)


def test_pytorch_quantization_of_an_unquantized_checkpoint_is_refused(tmp_path, monkeypatch):
    from tiny_models import make_checkpoint

    from trtspec.build import builder
    from trtspec.config import validate_config
    from trtspec.errors import UsageError

    monkeypatch.chdir(tmp_path)
    target = make_checkpoint(tmp_path / "t", vocab=32, seed=1)
    data = {
        "name": "q",
        "target": {"checkpoint": str(target), "quantization": "fp8"},
        "speculation": {"mode": "none"},
        "build": {"backend": "pytorch"},
        "serve": {"flavour": "llmapi"},
    }
    cfg = validate_config(data)
    with pytest.raises(UsageError, match=r"target\.quantization fp8: backend pytorch takes quantization"):
        package.package_repository(cfg)
    with pytest.raises(UsageError, match="is not quantized"):
        builder.refuse_unapplied_quantization(cfg)
    (target / "hf_quant_config.json").write_text("{}")  # a ModelOpt checkpoint carries its own
    builder.refuse_unapplied_quantization(cfg)
    assert package.package_repository(cfg).is_dir()


def test_the_bls_model_relays_requests_without_loading_torch():
    """Each BLS instance is its own process: importing torch on its first request cost that request
    seconds (four instances, four slow requests) and every instance hundreds of MB it never uses."""
    code = (
        "import sys; from trtspec.repository import torch_engine_models, contract, pb, spec_metrics; "
        "from trtspec.speculative.requests import Step; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_package_refuses_engines_built_from_an_earlier_edit(tmp_path, monkeypatch):
    """package writes the config's digest into the repository, which the launcher trusts: after an edit that
    build would rebuild for (the draft's dtype here), packaging the old engines would stamp them as the new config's."""
    from trtspec.build.builder import run_build
    from trtspec.repository.package import package_repository

    monkeypatch.chdir(tmp_path)
    data = yaml.safe_load((CONFIGS / "tiny-draft-target.yaml").read_text())
    cfg = validate_config(data, tmp_path / "c.yaml")
    run_build(cfg)
    assert package_repository(cfg).is_dir()
    # K within the engine's room (max(K, 10) drafts) is the repository's to say: packaged without a rebuild,
    # with the config's K, not the one the engines were built beside (the repository is stamped with this config)
    data["speculation"]["num_draft_tokens"] = 3
    repo = package_repository(validate_config(data, tmp_path / "c.yaml"))
    options = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert options["speculative_config"]["max_draft_len"] == 3
    data["draft"]["dtype"] = "bfloat16"  # the draft engine itself changes: build would rebuild it
    edited = validate_config(data, tmp_path / "c.yaml")
    with pytest.raises(UsageError, match=r"engine in .* was built from another config or checkpoint.*trtspec build"):
        package_repository(edited)
    run_build(edited)
    assert package_repository(edited).is_dir()
