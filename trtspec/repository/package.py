"""`trtspec package`: a config -> model_repository/NAME, staged in a temporary directory and renamed.

Four repositories, one client contract:
- torch + llmapi: `tensorrt_llm` is trtspec's python model reading 1/model.yaml.
- torch + engine: ensemble, preprocessing, postprocessing, tensorrt_llm (+ tensorrt_llm_draft and
  tensorrt_llm_bls) are all trtspec's python models behind TensorRT-LLM's tensor names.
- pytorch + llmapi and tensorrt + engine are for NVIDIA's tritonserver-trtllm container: the configs
  are trtspec's (typed, parameters as the documented fill_template commands set them), the python
  code is the container's own, linked from /app/all_models (see CONTAINER_MODELS for why), and paths
  are those the deployment mounts: engines under /trtspec/engines/NAME, checkpoints under
  /trtspec/checkpoints/{target,draft} (hub ids are passed through).
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import yaml

from trtspec.build.builder import (
    engine_dir_for,
    plan_steps,
    refuse_unapplied_quantization,
    resolve_num_draft_tokens,
    torch_roles,
)
from trtspec.build.manifest import Manifest
from trtspec.build.recipes import llm_api_options
from trtspec.build.shared_gpu import shared_gpu_plan
from trtspec.build.torch_engine import read_engine_config
from trtspec.config import DeploymentConfig, ModelSection
from trtspec.errors import TrtspecError, UsageError
from trtspec.fsutil import atomic_write_text, replace_dir, staging_for
from trtspec.modes import get_mode
from trtspec.repository import contract, engine, llmapi
from trtspec.repository.pbtxt import render

CONTAINER_ROOT = "/trtspec"
# Why the container's python models and not trtspec's: preprocessing, postprocessing, the BLS and the
# llmapi model are versioned with the tensorrtllm backend they call (their tensors and parameters
# change between releases), so only the copy inside the image is sure to match it.
CONTAINER_MODELS = "/app/all_models"
NVIDIA_PYTHON_MODELS = ("preprocessing", "postprocessing", "tensorrt_llm_bls")
TORCH_MODELS = {
    "tensorrt_llm": "TensorRTLLMModel",
    "tensorrt_llm_draft": "TensorRTLLMModel",
    "preprocessing": "PreprocessingModel",
    "postprocessing": "PostprocessingModel",
    "tensorrt_llm_bls": "BLSModel",
}
IMPORT = "from trtspec.repository.{module} import {cls} as TritonPythonModel  # noqa: F401\n"


def config_digest_path(repository: Path) -> Path:
    return repository.parent / f".{repository.name}.config-digest"


def repository_dir_for(cfg: DeploymentConfig) -> Path:
    return Path(cfg.serve.repository) / cfg.name


def _built(cfg: DeploymentConfig) -> tuple[Path, int]:
    """The torch engines of this config and the K it serves (the config's, which the engine's room may exceed:
    the repository is stamped with this config, so it must say what the config says)."""
    engines = engine_dir_for(cfg)
    manifest = Manifest.load(engines)
    if manifest is None or manifest.backend != cfg.build.backend or manifest.mode != cfg.mode:
        raise UsageError(f"no {cfg.build.backend} build of {cfg.name} in {engines}: run `trtspec build` first")
    k = resolve_num_draft_tokens(cfg, engines)
    # the engines of this config, not of an earlier edit (a checkpoint, a dtype, K past the engine's room) or
    # damaged since: what build would rebuild; where this host cannot tell (a checkpoint unreadable here, a
    # device it lacks), build's own check stands
    try:
        steps, _ = plan_steps(cfg, engines, k)
    except (OSError, UsageError):
        steps = []
    if stale := [s.name for s in steps if not manifest.current(s.name, s.key, engines)]:
        raise UsageError(
            f"the {' and '.join(stale)} engine in {engines} was built from another config or checkpoint than "
            f"{cfg.name}'s, or changed since: run `trtspec build` first"
        )
    return engines.resolve(), k


def _sampling(cfg: DeploymentConfig) -> dict:
    s = cfg.speculation.sampling
    return {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "max_tokens": s.max_tokens}


def torch_model_yaml(cfg: DeploymentConfig, engines: Path, k: int) -> dict:
    draft = str(engines / "draft") if "draft" in dict(torch_roles(cfg)) else None
    options = llm_api_options(cfg, k, draft)
    options.update(model=str(engines / "target"), backend="torch")  # NVIDIA's model would say pytorch
    if "speculative_config" in options:
        spec = options["speculative_config"]
        spec.pop("speculative_model_dir", None)
        if draft:
            spec["speculative_model"] = draft
    mode = get_mode(cfg.mode)  # and the section's fields TensorRT-LLM has no key for (draft-target's cascade)
    own = {f: getattr(mode.settings(cfg), f) for f in mode.runner_only_settings}
    options["trtspec"] = {
        "device": cfg.build.device,
        "dtype": cfg.target.dtype,
        "sampling": _sampling(cfg),
        "policy": cfg.policy,
        **({"tree": cfg.speculation.tree} if cfg.speculation.tree else {}),
        **({"settings": own} if own else {}),
    }
    return llmapi.model_yaml({"model": options.pop("model"), **options}, decoupled=cfg.serve.streaming)


def _write(model_dir: Path, config, files: dict[str, str] | None = None, links: dict[str, str] | None = None) -> None:
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(render(config), encoding="utf-8")
    for name, text in (files or {}).items():
        (model_dir / "1" / name).write_text(text, encoding="utf-8")
    for name, target in (links or {}).items():
        (model_dir / "1" / name).symlink_to(target)


def _torch_llmapi(cfg: DeploymentConfig, out: Path) -> None:
    engines, k = _built(cfg)
    config = llmapi.llmapi_config(cfg.serve.instances)
    config.model_transaction_policy.decoupled = cfg.serve.streaming
    options = torch_model_yaml(cfg, engines, k)
    files = {
        "model.yaml": yaml.safe_dump(options, sort_keys=False),
        "model.py": IMPORT.format(module="torch_llmapi_model", cls="TorchLLMAPIModel"),
    }
    _write(out / llmapi.MODEL, config, files)


def _engine_models(cfg: DeploymentConfig, p: engine.EngineParams, backend: str, draft_dir: str, extra: dict) -> dict:
    """name -> ModelConfig for the engine flavour, the same set and wiring for both engines."""
    speculating = get_mode(cfg.mode).draft_engine  # the BLS orchestrates a draft engine
    models = {
        "ensemble": engine.ensemble_config(p),
        "preprocessing": engine.preprocessing_config(p),
        "postprocessing": engine.postprocessing_config(p),
        "tensorrt_llm": engine.tensorrt_llm_config("tensorrt_llm", p, backend, extra.get("tensorrt_llm")),
        "tensorrt_llm_bls": engine.bls_config(
            p,
            "tensorrt_llm_draft" if speculating else None,
            streams=backend == "tensorrtllm",
            extra=extra.get("tensorrt_llm_bls"),
        ),
    }
    if speculating:
        draft = engine.EngineParams(**{**p.__dict__, "engine_dir": draft_dir})
        models["tensorrt_llm_draft"] = engine.tensorrt_llm_config(
            "tensorrt_llm_draft", draft, backend, extra.get("tensorrt_llm_draft")
        )
    return models


def _torch_engine(cfg: DeploymentConfig, out: Path) -> None:
    engines, k = _built(cfg)
    b = cfg.build
    p = engine.EngineParams(
        max_batch_size=b.max_batch_size,
        decoupled=cfg.serve.streaming and get_mode(cfg.mode).engine_streams,
        engine_dir=str(engines / "target"),
        tokenizer_dir=str(engines / "target"),
        instances=cfg.serve.instances,
    )
    common = {
        "trtspec_device": b.device,
        "trtspec_dtype": cfg.target.dtype,
        "trtspec_max_seq_len": str(b.max_seq_len),
        "trtspec_sampling": json.dumps(_sampling(cfg)),
    }
    spec = get_mode(cfg.mode)
    drafts_itself = spec.in_target and spec.torch_engine_mode is not None  # the target engine drafts by itself
    # the mode's own settings under NVIDIA's parameter names (lookahead's W, N, G), which the stand-in reads back
    target = {**common, "trtspec_mode": cfg.mode if drafts_itself else "none", **spec.triton_parameters(cfg)}
    if drafts_itself and spec.draft_head:  # Medusa's heads: TensorRT-LLM folds them into the engine
        target["trtspec_draft_dir"] = str(engines / "draft")
    if drafts_itself:  # drafts a step makes: K, or the depth of the tree the mode's own settings fix
        own = spec.own_tree(cfg)
        target["trtspec_num_draft_tokens"] = str(own.depth if own is not None else k or 1)
        target["trtspec_policy"] = cfg.policy
        if cfg.speculation.max_concurrency is not None:
            target["trtspec_max_concurrency"] = str(cfg.speculation.max_concurrency)
    draft = {**common, "trtspec_dtype": cfg.draft.dtype if cfg.draft else cfg.target.dtype}
    # On a CPU the draft stand-in runs one intra-op thread: a draft step is too small to split, and an
    # OpenMP team left spinning after each BLS call takes the cores the target's call needs next (the BLS
    # path served 47 -> 61 tokens/s on 2 cores, docs/measurements.md)
    draft["trtspec_cpu_threads"] = "1"
    # the BLS refuses a request that cannot fit the target before running it (trtspec's torch BLS reads these)
    bls = {"trtspec_max_seq_len": str(b.max_seq_len)}
    longest = read_engine_config(engines / "target").get("build_config", {}).get("max_draft_len")
    if longest is not None:
        bls["trtspec_max_draft_len"] = str(longest)
    extra = {"tensorrt_llm": target, "tensorrt_llm_draft": draft, "tensorrt_llm_bls": bls}
    models = _engine_models(cfg, p, "python", str(engines / "draft"), extra)
    engine.required_inputs_checked_by_preprocessing(models["ensemble"], models["preprocessing"])
    for name, config in models.items():
        cls = TORCH_MODELS.get(name)
        code = IMPORT.format(module="torch_engine_models", cls=cls)
        _write(out / name, config, {"model.py": code} if cls else None)


def _container_checkpoint(section: ModelSection, role: str, root: str = CONTAINER_ROOT) -> str:
    local = section.checkpoint.startswith(("/", ".", "embedded:")) or Path(section.checkpoint).exists()
    return f"{root}/checkpoints/{role}" if local else section.checkpoint


def nvidia_links(model: str, nvidia_models: str) -> dict[str, str]:
    """model.py and every sibling it imports (lib/, helpers.py), from NVIDIA's folder for that model."""
    c = contract.model(model)
    return {name: f"{nvidia_models}/{c.template}/1/{name}" for name in ("model.py", *c.sibling_files)}


def _nvidia_engine(cfg: DeploymentConfig, out: Path, nvidia_models: str, root: str) -> None:
    """tensorrt backend: NVIDIA's inflight_batcher_llm python models beside the tensorrtllm backend."""
    b = cfg.build
    engines = f"{root}/engines/{cfg.name}"
    share = shared_gpu_plan(cfg)
    p = engine.EngineParams(
        max_batch_size=b.max_batch_size,
        decoupled=cfg.serve.streaming and get_mode(cfg.mode).engine_streams,
        engine_dir=f"{engines}/target",
        tokenizer_dir=_container_checkpoint(cfg.target, "target", root),
        kv_cache_free_gpu_mem_fraction=b.kv_cache_free_gpu_mem_fraction,
        max_tokens_in_paged_kv_cache=share.max_tokens_in_paged_kv_cache if share else None,
        gpu_device_ids=share.gpu_device_ids if share else None,
        instances=cfg.serve.instances,
    )
    # the mode's own settings on the tensorrt_llm model (lookahead's W, N, G; Medusa's choices)
    extra = {"tensorrt_llm": get_mode(cfg.mode).triton_parameters(cfg)}
    models = _engine_models(cfg, p, "tensorrtllm", f"{engines}/draft", extra)
    for name, config in models.items():
        links = nvidia_links(name, nvidia_models) if name in NVIDIA_PYTHON_MODELS else None
        _write(out / name, config, links=links)


def _nvidia_llmapi(cfg: DeploymentConfig, out: Path, nvidia_models: str, root: str) -> None:
    """pytorch backend: NVIDIA's llmapi model with model.yaml (LLM() arguments + triton_config)."""
    refuse_unapplied_quantization(cfg)
    k = resolve_num_draft_tokens(cfg, engine_dir_for(cfg))
    draft = _container_checkpoint(cfg.draft, "draft", root) if cfg.draft and get_mode(cfg.mode).needs_draft else None
    options = llm_api_options(cfg, k, draft)
    target = _container_checkpoint(cfg.target, "target", root)
    options = llmapi.model_yaml({"model": target, **options}, cfg.serve.streaming)
    config = llmapi.llmapi_config(cfg.serve.instances)
    config.model_transaction_policy.decoupled = cfg.serve.streaming
    _write(
        out / llmapi.MODEL,
        config,
        {"model.yaml": yaml.safe_dump(options, sort_keys=False)},
        nvidia_links("llmapi", nvidia_models),
    )


WRITERS = {
    ("torch", "llmapi"): _torch_llmapi,
    ("torch", "engine"): _torch_engine,
    ("pytorch", "llmapi"): _nvidia_llmapi,
    ("tensorrt", "engine"): _nvidia_engine,
}


def package_repository(
    cfg: DeploymentConfig, nvidia_models: str = CONTAINER_MODELS, container_root: str = CONTAINER_ROOT
) -> Path:
    """nvidia_models: where the serving image has NVIDIA's all_models; container_root: where the
    deployment mounts engines and checkpoints (both only matter for NVIDIA's backends)."""
    writer = WRITERS[(cfg.build.backend, cfg.serve.flavour)]  # other pairs are refused by config validation
    if cfg.build.backend in ("tensorrt", "pytorch"):
        if not nvidia_models.startswith("/"):
            raise UsageError(f"--nvidia-models must be an absolute path in the serving image, got {nvidia_models}")
        share = shared_gpu_plan(cfg)
        if share is not None and share.max_tokens_in_paged_kv_cache < cfg.build.max_seq_len:
            raise UsageError(
                f"target and draft on GPUs {share.gpu_device_ids} leave room for "
                f"{share.max_tokens_in_paged_kv_cache} KV tokens each, less than max_seq_len {cfg.build.max_seq_len}"
                f" ({share.basis}): quantize, raise tp or lower max_seq_len"
            )
        writer = partial(writer, nvidia_models=nvidia_models.rstrip("/"), root=container_root.rstrip("/"))
    final = repository_dir_for(cfg)
    try:
        with staging_for(final) as staging:  # pods on a shared volume have the same pids
            writer(cfg, staging)
            if cfg.build.backend in ("tensorrt", "pytorch") and (problems := contract.violations(staging)):
                raise TrtspecError(f"{final} would not load in NVIDIA's container: {'; '.join(problems)}")
            replace_dir(staging, final)
        # which config the repository in place serves, written once it is in place: a server waiting for
        # it must not start on an older one (beside it: Triton would take a file inside for a model)
        atomic_write_text(config_digest_path(final), cfg.serving_digest() + "\n")
    except OSError as exc:
        raise UsageError(f"cannot write {final}: {exc.strerror or exc}") from None
    return final
