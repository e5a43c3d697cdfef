"""Model families: which architectures each backend runs, and how TensorRT-LLM converts each. One table:
the support rows, `trtspec check`, the build's convert command and the torch runner all read it, so what
check accepts the build can convert."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConvertDialect:
    """How one convert_checkpoint.py spells its arguments; the scripts do not agree."""

    model_dir: str = "--model_dir"
    output_dir: str = "--output_dir"
    dtype: str = "--dtype"
    tp: str = "--tp_size"
    pp: str | None = "--pp_size"  # None: the script cannot split layers across pipeline stages
    fixed: tuple[str, ...] = ()  # arguments the script always needs
    weight_only: tuple[str, str] | None = ("--use_weight_only", "--weight_only_precision")  # flag, precision flag


# Sources, all github.com/NVIDIA/TensorRT-LLM examples/models/core/ (1.x): llama/convert_checkpoint.py @ fd96a08b
# (--model_dir --output_dir --dtype --tp_size --pp_size); qwen/ @ 65b31db1 (same names; Qwen3 dense since
# 1.0.0rc3, PR #5650); mixtral/README.md @ 92645eff ("We use the LLaMA convert_checkpoint.py");
# phi/convert_checkpoint.py @ 567239fc (Phi3ForCausalLM; `assert args.pp_size == 1`); nemotron/README.md
# @ 5717e5e0 (HF checkpoints: ../gpt/convert_checkpoint.py, gpt_variant nemotron).
STANDARD = ConvertDialect()
NO_PIPELINE = ConvertDialect(pp=None)
# gemma/convert_checkpoint.py @ fbbc05dd, 310decb9: one script for Gemma and Gemma 2, --ckpt-type hf for
# Hugging Face weights, dashed names (the underscore aliases are not in every release), TP only as
# --world-size ("We don't support pipeline parallelism yet for Gemma"), no --use_weight_only.
GEMMA = ConvertDialect(
    model_dir="--model-dir",
    output_dir="--output-model-dir",
    tp="--world-size",
    pp=None,
    fixed=("--ckpt-type=hf",),
    weight_only=None,
)


@dataclass(frozen=True)
class Family:
    architecture: str  # config.json "architectures"[0]
    convert_folder: str | None = None  # examples/models/core/<folder>/ (examples/<folder>/ in 0.x); None: no engines
    dialect: ConvertDialect = STANDARD
    torch_runner: bool = False  # trtspec's own runner loads it (trtspec.speculative.model)
    mtp: bool = False  # TensorRT-LLM's MTP supports it (docs/source/models/supported-models.md)
    mtp_unverified: bool = False  # reported to work with MTP, not in that table
    eagle3: bool = False  # in TensorRT-LLM's EAGLE-3 support table (1.0 docs: Llama 3.1/3.3, Llama 4 Maverick)
    eagle3_one_model: bool = False  # ... and one-model there (Llama 4 Maverick only)
    medusa: bool = False  # Medusa's engine path (examples/medusa: Vicuna, a Llama)


FAMILIES: tuple[Family, ...] = (
    Family("LlamaForCausalLM", "llama", torch_runner=True, eagle3=True, medusa=True),
    Family("MistralForCausalLM", "llama", torch_runner=True),
    Family("MixtralForCausalLM", "llama"),
    Family("Qwen2ForCausalLM", "qwen", torch_runner=True),
    Family("Qwen3ForCausalLM", "qwen"),
    Family("GemmaForCausalLM", "gemma", GEMMA),
    Family("Gemma2ForCausalLM", "gemma", GEMMA),
    Family("Phi3ForCausalLM", "phi", NO_PIPELINE),
    Family("NemotronForCausalLM", "gpt"),
    Family("Llama4ForConditionalGeneration", eagle3=True, eagle3_one_model=True),
    Family("DeepseekV3ForCausalLM", mtp=True),
    Family("Glm4MoeForCausalLM", mtp_unverified=True),
)
BY_ARCHITECTURE: dict[str, Family] = {f.architecture: f for f in FAMILIES}

ENGINE_FAMILIES = tuple(f.architecture for f in FAMILIES if f.convert_folder)
TORCH_RUNNER_FAMILIES = tuple(f.architecture for f in FAMILIES if f.torch_runner)
MTP_FAMILIES = tuple(f.architecture for f in FAMILIES if f.mtp)
UNVERIFIED_MTP_FAMILIES = tuple(f.architecture for f in FAMILIES if f.mtp_unverified)
EAGLE3_FAMILIES = tuple(f.architecture for f in FAMILIES if f.eagle3)
EAGLE3_ONE_MODEL_FAMILIES = tuple(f.architecture for f in FAMILIES if f.eagle3_one_model)
MEDUSA_FAMILIES = tuple(f.architecture for f in FAMILIES if f.medusa)


def convert_family(architecture: str) -> Family | None:
    """The family whose convert_checkpoint.py handles this architecture, if TensorRT-LLM has one."""
    family = BY_ARCHITECTURE.get(architecture)
    return family if family is not None and family.convert_folder else None
