"""`trtspec package`: a built config's engines -> model_repository/NAME, written atomically.

So far: the llmapi flavour on the torch backend (trtspec's python model behind TensorRT-LLM's
contract). The engine flavour (ensemble + BLS) and the repositories for NVIDIA's container are
refused with a one-line error until they land.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import yaml

from trtspec.build.builder import engine_dir_for
from trtspec.build.manifest import Manifest
from trtspec.build.recipes import llm_api_options
from trtspec.config import DeploymentConfig
from trtspec.errors import UsageError
from trtspec.fsutil import replace_dir
from trtspec.repository import llmapi
from trtspec.repository.pbtxt import render

MODEL_PY = "from trtspec.repository.torch_llmapi_model import TorchLLMAPIModel as TritonPythonModel  # noqa: F401\n"


def repository_dir_for(cfg: DeploymentConfig) -> Path:
    return Path(cfg.serve.repository) / cfg.name


def _built(cfg: DeploymentConfig) -> tuple[Path, Manifest]:
    engines = engine_dir_for(cfg)
    manifest = Manifest.load(engines)
    if manifest is None or manifest.backend != cfg.build.backend or manifest.mode != cfg.mode:
        raise UsageError(f"no {cfg.build.backend} build of {cfg.name} in {engines}: run `trtspec build` first")
    return engines.resolve(), manifest


def torch_model_yaml(cfg: DeploymentConfig, engines: Path, k: int) -> dict:
    draft = str(engines / "draft") if cfg.mode == "draft-target" else None
    options = llm_api_options(cfg, k, draft)
    options.update(model=str(engines / "target"), backend="torch")  # NVIDIA's model would say pytorch
    if "speculative_config" in options:
        spec = options["speculative_config"]
        spec.pop("speculative_model_dir", None)
        if draft:
            spec["speculative_model"] = draft
    s = cfg.speculation.sampling
    options["trtspec"] = {
        "device": cfg.build.device,
        "dtype": cfg.target.dtype,
        "sampling": {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "max_tokens": s.max_tokens},
    }
    return llmapi.model_yaml({"model": options.pop("model"), **options}, decoupled=cfg.serve.streaming)


def package_repository(cfg: DeploymentConfig) -> Path:
    if cfg.build.backend != "torch" or cfg.serve.flavour != "llmapi":
        raise UsageError(
            f"packaging backend {cfg.build.backend} with flavour {cfg.serve.flavour} is not implemented yet; "
            "trtspec packages the llmapi flavour of the torch backend"
        )
    engines, manifest = _built(cfg)
    final = repository_dir_for(cfg)
    staging = final.parent / f".staging-{final.name}-{os.getpid()}"
    try:
        model = staging / llmapi.MODEL
        (model / "1").mkdir(parents=True)
        config = llmapi.llmapi_config(cfg.serve.instances)
        config.model_transaction_policy.decoupled = cfg.serve.streaming
        (model / "config.pbtxt").write_text(render(config), encoding="utf-8")
        options = torch_model_yaml(cfg, engines, manifest.num_draft_tokens or 0)
        (model / "1" / "model.yaml").write_text(yaml.safe_dump(options, sort_keys=False), encoding="utf-8")
        (model / "1" / "model.py").write_text(MODEL_PY, encoding="utf-8")
        replace_dir(staging, final)
    except OSError as exc:
        raise UsageError(f"cannot write {final}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return final
