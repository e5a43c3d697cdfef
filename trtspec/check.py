"""`trtspec check`: every known pitfall of a pair, found from metadata before an hour-long build.

Each finding carries a severity (error fails the check), what is wrong and how to fix it. The
pitfalls come from https://github.com/NVIDIA/TensorRT-LLM/issues (and tensorrtllm_backend's); a
finding names its issue or PR number where there is one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trtspec import support
from trtspec.build.recipes import WEIGHT_ONLY, deepseek_family, deepseek_serving_options
from trtspec.checkpoints.inspect import (
    VOCAB_ROWS_FIX,
    CheckpointInfo,
    pre_quantized,
    read_checkpoint,
    vocab_rows_mismatch,
)
from trtspec.checkpoints.memory import MemoryPlan, ModelMemory, missing_size_keys, model_memory
from trtspec.checkpoints.tokenizer_compare import compare
from trtspec.config import DeploymentConfig
from trtspec.deploy import sizing
from trtspec.errors import UsageError
from trtspec.families import convert_family
from trtspec.modes import HEAD_MODE_NAMES, get_mode, mode_for_draft, wrong_draft
from trtspec.versions import minor

MANY_DRAFT_TOKENS = 8


@dataclass
class Finding:
    severity: str  # "error", "warning" or "info"
    code: str
    message: str
    fix: str = ""


class Report:
    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self.facts: dict[str, Any] = {}

    def add(self, severity: str, code: str, message: str, fix: str = "") -> None:
        self.findings.append(Finding(severity, code, message, fix))

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "findings": [asdict(f) for f in self.findings], "facts": self.facts}


def _load(cfg: DeploymentConfig, field: str, report: Report) -> CheckpointInfo | None:
    section = getattr(cfg, field)
    path = cfg.checkpoint_path(section)
    if path is None:
        report.add(
            "warning",
            f"{field}-remote",
            f"{field} {section.checkpoint} is a hub id and was not inspected",
            "run trtspec check on the build host after downloading it, or point the config at a local copy",
        )
        return None
    return read_checkpoint(path)


def _decoder(role: str, info: CheckpointInfo | None, report: Report) -> CheckpointInfo | None:
    """A model checkpoint whose config.json describes a decoder trtspec can size; None (and an error) if not."""
    if info is None or not (missing := missing_size_keys(info.config)):
        return info
    report.add(
        "error",
        "model-config",
        f"{role} {info.path}: config.json has no {', '.join(missing)}, so it is no decoder trtspec can read",
        f"point it at a Hugging Face decoder checkpoint (heads are the draft of mode {HEAD_MODE_NAMES})",
    )
    return None


def _check_weights(infos: dict[str, CheckpointInfo | None], report: Report) -> None:
    """config.json against the weights' shapes (safetensors headers): loading would fail at the build."""
    for role, info in infos.items():
        if info is not None and (problem := vocab_rows_mismatch(info.path, info.config)):
            report.add("error", "vocab-weights-mismatch", f"{role}: {problem}", VOCAB_ROWS_FIX)


def _check_tokenizers(target: CheckpointInfo, draft: CheckpointInfo, report: Report) -> None:
    diff = compare(target, draft)
    if not diff.comparable:
        report.add(
            "warning",
            "tokenizer-unknown",
            "no tokenizer files to compare in one or both checkpoints",
            "add tokenizer.json (or the tokenizer's vocab files) to both checkpoints",
        )
    for what, items in (
        ("token-to-id map", diff.vocab_differences),
        ("added tokens", diff.added_differences),
        ("special tokens", diff.special_differences),
    ):
        if items:
            report.add(
                "error",
                "tokenizer-mismatch",
                f"draft and target differ in their {what}: {'; '.join(items)}",
                "use a draft trained with the target's tokenizer; acceptance collapses otherwise",
            )
    if diff.merges_differ:
        report.add(
            "error",
            "tokenizer-mismatch",
            "draft and target BPE merges differ",
            "use a draft trained with the target's tokenizer",
        )
    if diff.raw_differences:
        report.add(
            "error",
            "tokenizer-mismatch",
            f"tokenizer files differ: {', '.join(diff.raw_differences)}",
            "use a draft trained with the target's tokenizer",
        )
    tv, dv = target.config.get("vocab_size"), draft.config.get("vocab_size")
    report.facts["vocab_size"] = {"target": tv, "draft": dv, "tokenizer_max_id": diff.target_max_id}
    for name, info, size, max_id in (
        ("target", target, tv, diff.target_max_id),
        ("draft", draft, dv, diff.draft_max_id),
    ):
        if size is not None and max_id >= size:
            report.add(
                "error",
                "tokenizer-beyond-vocab",
                f"{name}'s tokenizer produces id {max_id} but its vocab_size is {size}",
                f"pair {info.path} with the tokenizer it was trained with",
            )
    if tv is not None and dv is not None and tv != dv:
        lo, hi = min(tv, dv), max(tv, dv)
        larger = "target" if tv > dv else "draft"
        if max(diff.target_max_id, diff.draft_max_id) >= lo:
            report.add(
                "error",
                "vocab-size-mismatch",
                f"vocab_size differs (target {tv}, draft {dv}) and the tokenizer maps tokens into ids "
                f"{lo}..{hi - 1}, which only the {larger} has",
                "use a draft with the target's vocabulary",
            )
        else:
            report.add(
                "warning",
                "vocab-padding",
                f"vocab_size differs (target {tv}, draft {dv}): ids {lo}..{hi - 1} exist only in the "
                f"{larger}'s embedding; no token maps there (the tokenizer ends at id "
                f"{max(diff.target_max_id, diff.draft_max_id)}), so they are padding",
                "compatible if those ids are never sampled; TensorRT-LLM crashed on such pairs with draft "
                "logits (#2789): prefer token acceptance (use_draft_logits: false) or pad both to the "
                "same size",
            )


def _check_support(
    cfg: DeploymentConfig,
    target: CheckpointInfo | None,
    draft: CheckpointInfo | None,
    gpu_sm: float | None,
    report: Report,
) -> None:
    mode, backend = cfg.mode, cfg.build.backend
    row = support.lookup(mode, backend)
    version = minor(cfg.build.tensorrt_llm_version)
    if row.versions is not None and version not in row.versions:
        report.add(
            "error",
            "unsupported",
            f"mode {mode} does not exist on backend {backend} in TensorRT-LLM {version}",
            f"{mode} exists on {get_mode(mode).where()}",
        )
        return
    for name, info in (("target", target), ("draft", draft)):
        if info is None or row.architectures is None:
            continue
        arch = info.architecture
        if arch in row.unverified_architectures:
            report.add(
                "warning",
                "architecture-unverified",
                f"{name} architecture {arch}: {mode} on {backend} is reported to work but is not in the "
                "documentation's support table",
                "validate on a small run before a long build",
            )
        elif arch not in row.architectures:
            report.add(
                "error",
                "architecture-unsupported",
                f"{name} architecture {arch} is not supported for {mode} on backend {backend} "
                f"(supported: {', '.join(row.architectures)})",
                f"{mode} exists on {get_mode(mode).where()}" if backend != "pytorch" else "use a supported model",
            )
        elif backend == "tensorrt":
            _check_convert(cfg, name, info, report)
    if row.min_sm is not None:
        if gpu_sm is None:
            report.add(
                "info", "compute-capability", f"needs compute capability >= {row.min_sm:.1f}; no GPU here to check", ""
            )
        elif gpu_sm < row.min_sm:
            report.add(
                "error",
                "compute-capability",
                f"{mode} on {backend} needs compute capability >= {row.min_sm:.1f}, this GPU has {gpu_sm:.1f}",
                f"use a GPU of compute capability {row.min_sm:.1f} or newer",
            )


def _check_convert(cfg: DeploymentConfig, name: str, info: CheckpointInfo, report: Report) -> None:
    """What the family's convert_checkpoint.py cannot do, found here rather than at build."""
    family = convert_family(info.architecture)
    section = cfg.target if name == "target" else cfg.draft
    if family is None or section is None:
        return
    own = get_mode(cfg.mode).convert_command(cfg, section, "", None, "", family, "float16")
    if name == "target" and own is not None:
        return  # the mode converts the target with a script of its own
    script = f"examples/models/core/{family.convert_folder}/convert_checkpoint.py"
    if cfg.build.pp > 1 and family.dialect.pp is None:
        report.add("error", "convert-pipeline", f"{name}: {script} has no pipeline parallelism", "set build.pp to 1")
    if section.quantization in WEIGHT_ONLY and family.dialect.weight_only is None:
        report.add(
            "error",
            "convert-weight-only",
            f"{name}: {script} takes no weight-only quantization flag",
            "use fp8 (ModelOpt) or no quantization",
        )


def _check_limits(
    cfg: DeploymentConfig, target: CheckpointInfo | None, draft: CheckpointInfo | None, report: Report
) -> None:
    b, drafts = cfg.build, get_mode(cfg.mode).drafts_per_step(cfg)
    output = cfg.speculation.sampling.max_tokens
    need = b.max_input_len + output + drafts
    if b.max_seq_len < need:
        report.add(
            "error",
            "max-seq-len",
            f"max_seq_len {b.max_seq_len} < max_input_len {b.max_input_len} + output "
            f"{output} + draft tokens {drafts} = {need} (TensorRT-LLM asserts this at run time, #2494)",
            f"raise build.max_seq_len to {need} or lower max_input_len / sampling.max_tokens",
        )
    if drafts > MANY_DRAFT_TOKENS and get_mode(cfg.mode).fixed_draft_len(cfg) is None:  # a K to choose
        report.add(
            "warning",
            "many-drafts",
            f"num_draft_tokens {drafts}: acceptance of late positions rarely pays for their verify cost",
            "run trtspec plan to measure the best K",
        )
    for name, info in (("target", target), ("draft", draft)):
        if info is None:
            continue
        c = info.config
        ctx = c.get("max_position_embeddings")
        if ctx is not None and b.max_seq_len > ctx:
            report.add(
                "error",
                "context-length",
                f"{name} max_position_embeddings is {ctx}, below max_seq_len "
                f"{b.max_seq_len} (prompt, output and drafts must fit; a draft cannot inherit the target's "
                "max_seq_len, PR #4879)",
                f"lower build.max_seq_len to {ctx}",
            )
        heads, kv = c.get("num_attention_heads"), c.get("num_key_value_heads") or c.get("num_attention_heads")
        if heads and heads % b.tp:
            report.add(
                "error",
                "tp-heads",
                f"{name} has {heads} attention heads, not divisible by tp {b.tp}",
                "choose tp dividing the head count",
            )
        if kv and kv % b.tp and b.tp % kv and not c.get("kv_lora_rank"):
            report.add(
                "error",
                "tp-kv-heads",
                f"{name} has {kv} KV heads: tp {b.tp} must divide them or be a multiple",
                "choose a tp that divides or is a multiple of the KV heads",
            )
        layers = c.get("num_hidden_layers")
        if layers and layers % b.pp:
            report.add(
                "error",
                "pp-layers",
                f"{name} has {layers} layers, not divisible by pp {b.pp}",
                "choose pp dividing the layer count",
            )


def _check_differences(target: CheckpointInfo, draft: CheckpointInfo, report: Report) -> None:
    t, d = target.config, draft.config
    for key, why in (
        ("torch_dtype", "mixed precision pairs build with different gemm plugins"),
        ("rope_scaling", "different RoPE scaling changes long-context behaviour"),
        ("rope_parameters", "different RoPE settings change long-context behaviour"),
        ("max_position_embeddings", "the shorter context bounds the deployment"),
    ):
        tv, dv = (
            t.get(key, t.get("dtype") if key == "torch_dtype" else None),
            d.get(key, d.get("dtype") if key == "torch_dtype" else None),
        )
        if tv != dv:
            report.add("warning", f"differs-{key.replace('_', '-')}", f"{key}: target {tv} vs draft {dv}", why)


def _check_memory(
    cfg: DeploymentConfig,
    target: CheckpointInfo,
    draft: CheckpointInfo | None,
    gpu_gb: float | None,
    report: Report,
    heads: CheckpointInfo | None = None,
) -> None:
    b = cfg.build
    if b.backend == "torch" and gpu_gb is None:
        return
    if gpu_gb is None:
        report.add("info", "memory", "GPU memory unknown: set build.gpu_memory_gb to check memory", "")
        return

    def quantization(section, info: CheckpointInfo) -> str:  # pytorch: only what the checkpoint carries
        return section.quantization if b.backend != "pytorch" or pre_quantized(info) else "none"

    fp8_kv = b.backend == "pytorch" and deepseek_family(cfg)  # deepseek_serving_options: an FP8 KV cache
    tm = model_memory(target.config, cfg.target.dtype, quantization(cfg.target, target), b.backend, b.tp, b.pp, fp8_kv)
    dm = None
    if draft is not None and cfg.draft is not None:
        dm = model_memory(draft.config, cfg.draft.dtype, quantization(cfg.draft, draft), b.backend, b.tp, b.pp)
    elif heads is not None:  # its weight files, held whole on every GPU; its one layer's KV left out
        size = sizing.weight_files_bytes(heads.path)
        dm = ModelMemory(params=int(size // 2), weight_bytes_per_gpu=float(size), kv_bytes_per_token_per_gpu=0.0)
    plan = MemoryPlan(gpu_gb, tm, dm, b.max_batch_size * b.max_seq_len, b.kv_cache_free_gpu_mem_fraction)
    report.facts["memory"] = plan.as_dict()
    if plan.weights_gb > gpu_gb:
        report.add(
            "error",
            "memory-weights",
            f"weights need {plan.weights_gb:.1f} GB per GPU, the GPU has {gpu_gb:.0f} GB",
            "quantize (fp8 halves BF16 weights) or raise tp/pp",
        )
        return
    if plan.kv_needed_gb > plan.kv_budget_gb:
        per_seq = plan.kv_needed_gb / b.max_batch_size
        fits = int(plan.kv_budget_gb // per_seq) if per_seq else 0
        report.add(
            "warning",
            "memory-kv",
            f"both KV caches at max_batch_size {b.max_batch_size} x max_seq_len "
            f"{b.max_seq_len} need {plan.kv_needed_gb:.1f} GB per GPU, {plan.kv_budget_gb:.1f} GB is left: "
            f"about {fits} full-length sequences fit",
            "lower max_batch_size or max_seq_len, or raise tp",
        )


def _unsized(report: Report, exc: UsageError) -> None:
    """Sizing reads the checkpoints itself: one it cannot read is one error, unless a finding above named it."""
    if not any(f.code in ("draft-kind", "model-config", "sizing") for f in report.findings):
        report.add("error", "sizing", f"cannot size the checkpoints: {exc}", "point the config at checkpoints it reads")


def _check_placement(cfg: DeploymentConfig, report: Report) -> None:
    """The GPUs the pods may land on (deploy.gpu_product, build.gpu_memory_gb, or any known GPU) against the
    weights per GPU, hub ids included (sizing.py's table), and /dev/shm against the memory limit."""
    try:
        reason, shm = sizing.fits(cfg), sizing.shm_problem(cfg)
    except UsageError as exc:
        _unsized(report, exc)
        return
    if reason and not any(f.code == "memory-weights" for f in report.findings):  # that finding says it already
        report.add("error", "gpu-fit", reason, "quantize, raise tp/pp, or require a larger GPU (deploy.gpu_product)")
    if shm is not None:
        report.add("error", "shm-size", shm, "")


def _check_quantization(cfg: DeploymentConfig, infos: dict[str, CheckpointInfo | None], report: Report) -> None:
    """Backend pytorch takes quantization from the checkpoint: `quantization: fp8` alone changes nothing."""
    if cfg.build.backend != "pytorch":
        return
    for role, info in infos.items():
        section = getattr(cfg, role)
        if section is None or section.quantization == "none":
            continue
        if info is None:
            report.add(
                "warning",
                "quantization-from-checkpoint",
                f"{role}.quantization {section.quantization}: backend pytorch applies it only if "
                f"{section.checkpoint} is itself quantized (e.g. a ModelOpt FP8 checkpoint)",
                "use a pre-quantized checkpoint, or backend tensorrt to quantize at build",
            )
        elif not pre_quantized(info):
            report.add(
                "error",
                "quantization-ignored",
                f"{role}.quantization {section.quantization}: backend pytorch takes quantization from the "
                f"checkpoint, and {info.path} is not quantized: it would load in {section.dtype}",
                "point the checkpoint at a pre-quantized one (ModelOpt hf_quant_config.json), quantize it with "
                "ModelOpt first, or use backend tensorrt",
            )


def _check_serving(cfg: DeploymentConfig, report: Report) -> None:
    """The trade-offs trtspec makes for serving (manifest.json's `serving`), shown before they matter."""
    from trtspec.build.builder import serving_decisions
    from trtspec.build.shared_gpu import shared_gpu_plan

    spec = get_mode(cfg.mode)
    if cfg.build.backend == "torch" and spec.torch_deploys and (why := spec.torch_deploy_refusal(cfg)):
        # generate and plan run it; the build refuses it (a mode only the runner runs says so at build time too)
        report.add("warning", "torch-deploy", f"trtspec build will refuse this config: {why}", "")
    k, longest = cfg.speculation.num_draft_tokens, None
    try:
        longest = serving_decisions(cfg, k).get("target_max_draft_len") if isinstance(k, int) else None
    except UsageError as exc:
        _unsized(report, exc)
    if longest:
        report.add(
            "info",
            "max-draft-len",
            f"the target engine takes up to {longest['value']} drafts (num_draft_tokens {k}, with room for "
            "NVIDIA's documented request of 10); a request asking for more is refused",
            "",
        )
    if cfg.build.backend == "pytorch" and deepseek_family(cfg):
        options = deepseek_serving_options(cfg)
        report.add(
            "info",
            "deepseek-recipe",
            f"NVIDIA's DeepSeek serving recipe is applied: expert parallel {options['moe_expert_parallel_size']}, "
            f"an FP8 KV cache, CUDA graphs padded to batch {cfg.build.max_batch_size}, stream_interval "
            f"{options['stream_interval']} (streamed chunks of 10 tokens)",
            "",
        )
    b = cfg.build
    if b.backend == "tensorrt" and get_mode(cfg.mode).draft_engine and cfg.serve.grpc_port != 8001:
        report.add(
            "warning",
            "bls-grpc-port",
            f"serve.grpc_port {cfg.serve.grpc_port}: newer NVIDIA BLS versions read the target's config from "
            "localhost:8001 before speculating",
            "keep gRPC on 8001 inside the container",
        )
    try:
        plan = shared_gpu_plan(cfg)
    except UsageError as exc:
        _unsized(report, exc)
        return
    if plan is None:
        return
    if plan.max_tokens_in_paged_kv_cache < b.max_seq_len:
        report.add(
            "error",
            "kv-shared-gpu",
            f"target and draft share GPUs {plan.gpu_device_ids}: each KV cache fits {plan.max_tokens_in_paged_kv_cache}"
            f" tokens, less than one max_seq_len {b.max_seq_len} sequence ({plan.basis})",
            "quantize, raise tp, or lower max_seq_len",
        )
        return
    report.add(
        "info" if plan.checked else "warning",
        "kv-shared-gpu",
        f"target and draft share GPUs {plan.gpu_device_ids}: each gets max_tokens_in_paged_kv_cache "
        f"{plan.max_tokens_in_paged_kv_cache} of the {plan.tokens_needed} max_batch_size x max_seq_len wants, "
        f"at kv_cache_free_gpu_mem_fraction {plan.kv_cache_free_gpu_mem_fraction}, whichever loads first "
        f"({plan.basis})",
        "trtspec writes these into the repository and manifest.json"
        if plan.checked
        else "both caches at this cap were not checked against the GPU: run check where the checkpoints and "
        "build.gpu_memory_gb are known",
    )


def detect_gpu() -> tuple[float | None, float | None]:
    """(compute capability, memory in GB) of GPU 0, or Nones."""
    import torch

    if not torch.cuda.is_available():
        return None, None
    props = torch.cuda.get_device_properties(0)
    return props.major + props.minor / 10, props.total_memory / 1e9


def built_engine(cfg: DeploymentConfig) -> tuple[Path, dict[str, Any]] | None:
    """The built target engine's folder and config (None: not built, or unreadable, which build reports)."""
    from trtspec.build.builder import engine_dir_for
    from trtspec.build.torch_engine import read_engine_config

    engine = engine_dir_for(cfg) / "target"
    if not (engine / "config.json").is_file():
        return None
    try:  # a compiled engine's config.json, or a torch engine's engine.json
        return engine, read_engine_config(engine)
    except UsageError:
        return None


def _check_engine_room(cfg: DeploymentConfig, report: Report) -> None:
    """A tree the mode's settings fix (lookahead's (W, N, G), Medusa's choices) must fit the built engine's
    max_draft_len: found here, not when the server refuses to start."""
    spec = get_mode(cfg.mode)
    if spec.settings_model is None or (built := built_engine(cfg)) is None:
        return
    engine, config = built
    if why := spec.engine_room_problem(spec.settings(cfg).model_dump(), config):
        report.add(
            "error",
            "tree-draft-len",
            f"{engine}: {why}",
            f"rebuild the engine (trtspec build) or change the {spec.section} settings to fit it",
        )


def run_check(cfg: DeploymentConfig) -> Report:
    report = Report()
    target = _load(cfg, "target", report)
    spec = get_mode(cfg.mode)
    loaded = _load(cfg, "draft", report) if cfg.draft is not None and spec.needs_draft else None
    head = mode_for_draft(loaded.config) if loaded is not None else None
    if head is not None and head is not spec:  # its config says what it is: no model checks that would misname it
        report.add(
            "error",
            "draft-kind",
            f"draft {wrong_draft(str(loaded.path), head, cfg.mode)}",
            f"use mode {head.name} with its settings (trtspec init --target ... --draft ... writes them)",
        )
        loaded = None
    # a head (EAGLE-3, Medusa) is not a model: the mode checks it against the target, the model checks skip it
    draft, heads = (None, loaded) if spec.draft_head else (loaded, None)
    target, draft = (_decoder(role, info, report) for role, info in (("target", target), ("draft", draft)))
    gpu_sm, gpu_gb = detect_gpu()
    gpu_gb = cfg.build.gpu_memory_gb or gpu_gb
    _check_weights({"target": target, "draft": draft}, report)
    if target is not None and draft is not None:
        _check_tokenizers(target, draft, report)
        _check_differences(target, draft, report)
    _check_support(cfg, target, draft, gpu_sm, report)
    spec.check(cfg, target, loaded, report)
    _check_engine_room(cfg, report)
    _check_limits(cfg, target, draft, report)
    _check_quantization(cfg, {"target": target, "draft": draft}, report)
    if target is not None:
        _check_memory(cfg, target, draft, gpu_gb, report, heads)
    _check_placement(cfg, report)
    _check_serving(cfg, report)
    return report
