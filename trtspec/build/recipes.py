"""TensorRT-LLM's documented build steps, as data: argv lists for compiled engines, a dict for the LLM API.

Everything here is a pure function of the config, so the golden tests can hold each output against
the commands and YAML NVIDIA documents (github.com/NVIDIA/TensorRT-LLM: examples/draft_target_model/README.md
@ 567239fc, docs/source/features/speculative-decoding.md, tensorrt_llm/llmapi/llm_args.py).
Flags use the documentation's `--flag=value` form; a flag the documentation omits for its defaults
(tp/pp 1, no max_num_tokens) is omitted here too, so the same inputs give the same command.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trtspec.config import DeploymentConfig, ModelSection
from trtspec.errors import UsageError
from trtspec.families import FAMILIES, MTP_FAMILIES, STANDARD, ConvertDialect, Family
from trtspec.modes import get_mode

# quantization -> the ModelOpt --qformat of examples/quantization/quantize.py (NVIDIA's FP8 path).
MODELOPT_QFORMATS = {"fp8": "fp8", "int4_awq": "int4_awq", "nvfp4": "nvfp4"}
# quantization -> convert_checkpoint.py's weight-only precision.
WEIGHT_ONLY = {"int8_weight_only": "int8", "int4_weight_only": "int4"}
# build_config.speculative_decoding_mode in an engine's config.json is SpeculativeDecodingMode, an
# IntFlag serialised as its value, its members auto() in order: NONE = 1, DRAFT_TOKENS_EXTERNAL = 2, MEDUSA = 4,
# LOOKAHEAD_DECODING = 8 (tensorrt_llm/models/modeling_utils.py).
# Keyed by the --speculative_decoding_mode name a mode declares (SpecMode.engine_mode).
ENGINE_SPEC_MODES = {"none": 1, "draft_tokens_external": 2, "medusa": 4, "lookahead_decoding": 8}


@dataclass(frozen=True)
class Command:
    """One process to run: `program` is resolved on the build host (a script path or a CLI name)."""

    program: str  # "convert_checkpoint.py", "quantization/quantize.py" or a CLI such as "trtllm-build"
    args: tuple[str, ...]
    family: str | None = None  # for convert_checkpoint.py: the examples/ folder it lives in

    @property
    def is_script(self) -> bool:
        return self.program.endswith(".py")


def trt_dtype(section: ModelSection, checkpoint_dtype: str | None) -> str:
    """The dtype convert_checkpoint.py is given: the config's, else the checkpoint's, else float16."""
    if section.dtype != "auto":
        return section.dtype
    if checkpoint_dtype in ("float16", "bfloat16", "float32"):
        return checkpoint_dtype
    return "float16"


def convert_command(
    cfg: DeploymentConfig,
    section: ModelSection,
    model_dir: str,
    output_dir: str,
    family: Family | None,
    dtype: str,
) -> Command:
    """convert_checkpoint.py (or ModelOpt's quantize.py): tp and pp are fixed here, not at trtllm-build.

    `family` None is a hub id, resolved on the build host: it gets the standard spelling here, and the
    emitted script picks each family's own from the downloaded config.json."""
    b = cfg.build
    parallel = ([f"--tp_size={b.tp}"] if b.tp > 1 else []) + ([f"--pp_size={b.pp}"] if b.pp > 1 else [])
    if section.quantization in MODELOPT_QFORMATS:
        args = [
            f"--model_dir={model_dir}",
            f"--dtype={dtype}",
            f"--qformat={MODELOPT_QFORMATS[section.quantization]}",
            *([f"--kv_cache_dtype={section.quantization}"] if section.quantization == "fp8" else []),
            f"--output_dir={output_dir}",
            "--calib_size=512",
            *parallel,
        ]
        return Command("quantization/quantize.py", tuple(args))
    d = family.dialect if family else STANDARD
    args = [*d.fixed, f"{d.model_dir}={model_dir}", f"{d.output_dir}={output_dir}", f"{d.dtype}={dtype}"]
    if b.tp > 1:
        args.append(f"{d.tp}={b.tp}")
    if b.pp > 1:
        if d.pp is None:
            raise UsageError(
                f"{family.architecture if family else 'this family'}: its convert_checkpoint.py has no"
                " pipeline parallelism; set build.pp to 1"
            )
        args.append(f"{d.pp}={b.pp}")
    if section.quantization in WEIGHT_ONLY:
        if d.weight_only is None:
            name = family.architecture if family else "this family"
            raise UsageError(
                f"{name}: its convert_checkpoint.py has no weight-only flag trtspec knows; use fp8 or int4_awq"
            )
        flag, precision = d.weight_only
        args += [flag, f"{precision}={WEIGHT_ONLY[section.quantization]}"]
    return Command("convert_checkpoint.py", tuple(args), family=family.convert_folder if family else None)


def convert_variants(
    cfg: DeploymentConfig, section: ModelSection, model_dir: str, output_dir: str, dtype: str
) -> list[tuple[tuple[str, ...], Command | str]]:
    """For a hub id, whose family is known only once it is downloaded: the convert command of each argv
    dialect, with the examples/ folders that speak it (a str says why that dialect cannot run this config)."""
    by_dialect: dict[ConvertDialect, list[Family]] = {}
    for family in FAMILIES:
        if family.convert_folder:
            by_dialect.setdefault(family.dialect, []).append(family)
    variants: list[tuple[tuple[str, ...], Command | str]] = []
    for families in by_dialect.values():
        folders = tuple(dict.fromkeys(f.convert_folder for f in families if f.convert_folder))
        try:
            variants.append((folders, convert_command(cfg, section, model_dir, output_dir, families[0], dtype)))
        except UsageError as exc:
            variants.append((folders, str(exc)))
    return variants


def gemm_plugin(section: ModelSection, dtype: str) -> str:
    if section.quantization == "fp8":
        return "fp8"
    if section.quantization != "none":
        return "auto"
    return dtype


def trtllm_build_command(
    cfg: DeploymentConfig,
    section: ModelSection,
    checkpoint_dir: str,
    output_dir: str,
    dtype: str,
    role: str,
    num_draft_tokens: int,
) -> Command:
    """trtllm-build for one engine; only the target speculates (draft-target README @ 567239fc)."""
    b = cfg.build
    engine_mode = get_mode(cfg.mode).engine_mode
    speculating_target = role == "target" and engine_mode is not None
    args = [
        f"--checkpoint_dir={checkpoint_dir}",
        f"--output_dir={output_dir}",
        f"--gemm_plugin={gemm_plugin(section, dtype)}",
        "--use_paged_context_fmha=enable",
    ]
    if speculating_target:
        args.append(f"--speculative_decoding_mode={engine_mode}")
    args.append(f"--max_batch_size={b.max_batch_size}")
    if speculating_target and get_mode(cfg.mode).build_sets_max_draft_len:
        args.append(f"--max_draft_len={get_mode(cfg.mode).engine_draft_len(cfg, num_draft_tokens)}")
    args += [f"--max_input_len={b.max_input_len}", f"--max_seq_len={b.max_seq_len}"]
    if b.max_num_tokens is not None:
        args.append(f"--max_num_tokens={b.max_num_tokens}")
    if get_mode(cfg.mode).draft_engine:
        # NVIDIA's BLS asks both engines for generation logits when a request sets use_draft_logits (the
        # documented request does): without them that request fails, so both always keep them
        args.append("--gather_generation_logits")
    return Command("trtllm-build", tuple(args))


def engine_expectations(
    cfg: DeploymentConfig, role: str, num_draft_tokens: int, vocab_size: int | None, backend: str = "tensorrt"
) -> dict[str, tuple[Any, str]]:
    """What serving needs to find in an engine's config, and the build flag that sets each.

    Compiled engines store SpeculativeDecodingMode as its integer value; trtspec's torch engines
    write the mode's name, and also speculate with MTP, which compiled engines cannot.
    """
    b = cfg.build
    spec = get_mode(cfg.mode)
    speculating = role == "target" and spec.speculates()
    want: dict[str, tuple[Any, str]] = {
        "build_config.max_batch_size": (b.max_batch_size, f"--max_batch_size={b.max_batch_size}"),
        "build_config.max_seq_len": (b.max_seq_len, f"--max_seq_len={b.max_seq_len}"),
    }
    if backend == "tensorrt":
        want["build_config.plugin_config.use_paged_context_fmha"] = (True, "--use_paged_context_fmha=enable")
        if speculating and spec.engine_mode:
            want["build_config.speculative_decoding_mode"] = (
                ENGINE_SPEC_MODES[spec.engine_mode],
                f"--speculative_decoding_mode={spec.engine_mode}",
            )
    elif speculating:
        mode = spec.torch_engine_mode
        want["build_config.speculative_decoding_mode"] = (mode, f"speculative mode {mode}")
    if speculating:
        longest = spec.engine_draft_len(cfg, num_draft_tokens)
        flag = f"--max_draft_len={longest}" if backend == "tensorrt" else f"max_draft_len {longest}"
        want["build_config.max_draft_len"] = (longest, flag)
    if backend == "tensorrt" and spec.draft_engine:
        want["build_config.gather_generation_logits"] = (True, "--gather_generation_logits")
    if vocab_size is not None:
        want["pretrained_config.vocab_size"] = (vocab_size, "the checkpoint's vocab_size (convert it again)")
    return want


def missing_flags(engine_config: dict[str, Any], want: dict[str, tuple[Any, str]]) -> list[str]:
    """Each expectation the engine's config does not meet, as 'field = got (want X: build with FLAG)'."""
    problems = []
    for dotted, (value, flag) in want.items():
        node: Any = engine_config
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node != value:
            problems.append(f"{dotted} = {node!r}, want {value!r} ({flag})")
    return problems


def llm_api_options(cfg: DeploymentConfig, num_draft_tokens: int, draft_model_dir: str | None) -> dict[str, Any]:
    """The LLM API arguments (`trtllm-serve --extra_llm_api_options`, Triton's llmapi model.yaml).

    The mode writes its own `speculative_config`, with the field names of the configured version.
    """
    b = cfg.build
    options: dict[str, Any] = {
        "backend": "pytorch",
        "tensor_parallel_size": b.tp,
        "pipeline_parallel_size": b.pp,
        "max_batch_size": b.max_batch_size,
        "max_input_len": b.max_input_len,
        "max_seq_len": b.max_seq_len,
    }
    if b.max_num_tokens is not None:
        options["max_num_tokens"] = b.max_num_tokens
    options["kv_cache_config"] = {"free_gpu_memory_fraction": b.kv_cache_free_gpu_mem_fraction}
    options["enable_iter_perf_stats"] = True  # /metrics then reports specDecodingStats
    spec = get_mode(cfg.mode)
    if spec.needs_draft and draft_model_dir is None:
        raise UsageError(f"mode {cfg.mode} needs draft.checkpoint")
    options.update(spec.extra_options(cfg))
    speculative_config = spec.speculative_config(cfg, num_draft_tokens, draft_model_dir)
    if speculative_config is not None:
        options["speculative_config"] = speculative_config
    if "speculative_config" in options and cfg.speculation.max_concurrency is not None:
        options["speculative_config"]["max_concurrency"] = cfg.speculation.max_concurrency  # 1.2+, pytorch backend
    if deepseek_family(cfg):  # the baseline of an A/B gets the same serving recipe as MTP
        options.update(deepseek_serving_options(cfg))
    return options


def deepseek_family(cfg: DeploymentConfig) -> bool:
    """DeepSeek-V3/R1: a mode that exists only for this family (MTP, by its support row) says so; a local
    checkpoint says so itself."""
    served = get_mode(cfg.mode).row("pytorch").architectures
    if served and set(served) <= set(MTP_FAMILIES):
        return True
    path = cfg.checkpoint_path(cfg.target)
    if path is None or not (path / "config.json").is_file():
        return False
    try:
        architectures = json.loads((path / "config.json").read_text(encoding="utf-8")).get("architectures") or []
    except (OSError, ValueError):
        return False
    return bool(set(architectures) & set(MTP_FAMILIES))


def deepseek_serving_options(cfg: DeploymentConfig) -> dict[str, Any]:
    """NVIDIA's DeepSeek-V3/R1 serving recipe (deployment guide and examples/serve/deepseek_r1_reasoning_parser.sh):
    experts split across the tensor-parallel GPUs (--ep_size = --tp_size), an FP8 KV cache, CUDA graphs
    padded up to the batch size, and streamed output every 10 iterations."""
    b = cfg.build
    return {
        "moe_expert_parallel_size": b.tp,
        "kv_cache_config": {"free_gpu_memory_fraction": b.kv_cache_free_gpu_mem_fraction, "dtype": "fp8"},
        "cuda_graph_config": {"enable_padding": True, "max_batch_size": b.max_batch_size},
        "stream_interval": 10,
    }


def trtllm_serve_command(model: str, options_file: str) -> Command:
    """`--extra_llm_api_options` works in every 1.x release (`--config` arrived in 1.2)."""
    return Command("trtllm-serve", (model, f"--extra_llm_api_options={options_file}"))
