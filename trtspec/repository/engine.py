"""The engine flavour: preprocessing -> tensorrt_llm -> postprocessing (ensemble), plus
tensorrt_llm_draft and tensorrt_llm_bls for draft-target. Tensor names, types and dims are those of
TensorRT-LLM's `inflight_batcher_llm` templates (shared reference, triton-model-repository-and-k8s.md
§1.4-§1.8); the parameter values are those its documented draft-target fill_template commands set.

The same configs serve both engines: on NVIDIA's container `tensorrt_llm` has backend tensorrtllm and
the python models are the container's own; with the torch backend every model is trtspec's python
model behind the same names.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from trtspec.repository.pbtxt import PERF_OUTPUTS, Tensor, ensemble_step, model_config

LOGITS = "FP32"  # logits_datatype: TYPE_FP32 in every documented draft-target setup


def _opt(name: str, dtype: str, dims: tuple[int, ...] = (1,), ragged: bool = False, reshape: bool = True) -> Tensor:
    return Tensor(name, dtype, dims, optional=True, ragged=ragged, reshape=() if reshape and dims == (1,) else None)


def _rb(name: str, dtype: str, dims: tuple[int, ...] = (-1,)) -> Tensor:
    return Tensor(name, dtype, dims, optional=True, ragged=True)


TRTLLM_INPUTS = [
    _rb("input_ids", "INT32"),
    _rb("encoder_input_features", "FP16", (-1, -1)),
    _opt("encoder_output_lengths", "INT32"),
    Tensor("input_lengths", "INT32", (1,), reshape=()),
    Tensor("request_output_len", "INT32", (1,), reshape=()),
    _opt("num_return_sequences", "INT32"),
    _rb("draft_input_ids", "INT32"),
    _rb("decoder_input_ids", "INT32"),
    _opt("decoder_input_lengths", "INT32"),
    _rb("draft_logits", LOGITS, (-1, -1)),
    _opt("draft_acceptance_threshold", "FP32"),
    _opt("end_id", "INT32"),
    _opt("pad_id", "INT32"),
    _rb("stop_words_list", "INT32", (2, -1)),
    _rb("bad_words_list", "INT32", (2, -1)),
    _rb("embedding_bias", "FP32"),
    *(
        _opt(name, dtype)
        for name, dtype in [
            ("beam_width", "INT32"),
            ("temperature", "FP32"),
            ("runtime_top_k", "INT32"),
            ("runtime_top_p", "FP32"),
            ("runtime_top_p_min", "FP32"),
            ("runtime_top_p_decay", "FP32"),
            ("runtime_top_p_reset_ids", "INT32"),
            ("len_penalty", "FP32"),
            ("early_stopping", "BOOL"),
            ("repetition_penalty", "FP32"),
            ("min_tokens", "INT32"),
            ("beam_search_diversity_rate", "FP32"),
            ("presence_penalty", "FP32"),
            ("frequency_penalty", "FP32"),
            ("seed", "UINT64"),
            ("return_log_probs", "BOOL"),
            ("return_context_logits", "BOOL"),
            ("return_generation_logits", "BOOL"),
            ("return_perf_metrics", "BOOL"),
            ("return_num_input_tokens", "BOOL"),
            ("return_num_output_tokens", "BOOL"),
            ("exclude_input_in_output", "BOOL"),
            ("stop", "BOOL"),
            ("streaming", "BOOL"),
        ]
    ),
    _rb("prompt_embedding_table", "FP16", (-1, -1)),
    _rb("prompt_table_extra_ids", "UINT64"),
    _opt("prompt_vocab_size", "INT32"),
    _rb("cross_attention_mask", "BOOL", (-1, -1)),
    _opt("mrope_rotary_cos_sin", "FP32", (-1,)),
    _opt("mrope_position_deltas", "INT64", reshape=False),
    _opt("lora_task_id", "UINT64"),
    _rb("lora_weights", "FP16", (-1, -1)),
    _rb("lora_config", "INT32", (-1, 3)),
    _rb("context_phase_params", "UINT8"),
    _rb("skip_cross_attn_blocks", "BOOL", (1,)),
    *(_rb(f"retention_token_range_{part}", "INT32") for part in ("starts", "ends", "priorities", "durations_ms")),
    _rb("retention_decode_priority", "INT32", (1,)),
    _rb("retention_decode_duration_ms", "INT32", (1,)),
    _rb("guided_decoding_guide_type", "STRING", (1,)),
    _rb("guided_decoding_guide", "STRING", (1,)),
    *(_rb(f"lookahead_{part}", "INT32", (1,)) for part in ("window_size", "ngram_size", "verification_set_size")),
]

TRTLLM_OUTPUTS = [
    Tensor("output_ids", "INT32", (-1, -1)),
    Tensor("sequence_length", "INT32", (-1,)),
    Tensor("cum_log_probs", "FP32", (-1,)),
    Tensor("output_log_probs", "FP32", (-1, -1)),
    Tensor("context_logits", LOGITS, (-1, -1)),
    Tensor("generation_logits", LOGITS, (-1, -1, -1)),
    Tensor("batch_index", "INT32", (1,)),
    Tensor("sequence_index", "INT32", (1,)),
    Tensor("context_phase_params", "UINT8", (-1,)),
    Tensor("kv_cache_alloc_new_blocks", "INT32", (1,)),
    Tensor("kv_cache_reused_blocks", "INT32", (1,)),
    Tensor("kv_cache_alloc_total_blocks", "INT32", (1,)),
    *PERF_OUTPUTS,
    Tensor("num_input_tokens", "INT32", (1,)),
    Tensor("num_output_tokens", "INT32", (1,)),
]

PREPROCESSING_INPUTS = [
    Tensor("QUERY", "STRING", (1,)),
    _opt("DECODER_QUERY", "STRING", reshape=False),
    Tensor("REQUEST_OUTPUT_LEN", "INT32", (1,)),
    _opt("BAD_WORDS_DICT", "STRING", (-1,)),
    _opt("STOP_WORDS_DICT", "STRING", (-1,)),
    _opt("EMBEDDING_BIAS_WORDS", "STRING", (-1,)),
    _opt("EMBEDDING_BIAS_WEIGHTS", "FP32", (-1,)),
    _opt("END_ID", "INT32", reshape=False),
    _opt("PAD_ID", "INT32", reshape=False),
]
PREPROCESSING_OUTPUTS = [
    Tensor("INPUT_ID", "INT32", (-1,)),
    Tensor("REQUEST_INPUT_LEN", "INT32", (1,)),
    Tensor("DECODER_INPUT_ID", "INT32", (-1,)),
    Tensor("REQUEST_DECODER_INPUT_LEN", "INT32", (1,)),
    Tensor("BAD_WORDS_IDS", "INT32", (2, -1)),
    Tensor("STOP_WORDS_IDS", "INT32", (2, -1)),
    Tensor("EMBEDDING_BIAS", "FP32", (-1,)),
    Tensor("REQUEST_OUTPUT_LEN", "INT32", (-1,)),
    Tensor("OUT_END_ID", "INT32", (1,)),
    Tensor("OUT_PAD_ID", "INT32", (1,)),
]
POSTPROCESSING_INPUTS = [Tensor("TOKENS_BATCH", "INT32", (-1, -1)), Tensor("SEQUENCE_LENGTH", "INT32", (-1,))]
POSTPROCESSING_OUTPUTS = [Tensor("OUTPUT", "STRING", (-1,))]

# The client-facing inputs of the ensemble and the BLS that trtspec maps (a subset of NVIDIA's list:
# multimodal, LoRA, embedding bias and guided decoding are not wired).
CLIENT_INPUTS = [
    Tensor("text_input", "STRING", (1,)),
    Tensor("max_tokens", "INT32", (1,)),
    _opt("bad_words", "STRING", (-1,)),
    _opt("stop_words", "STRING", (-1,)),
    _opt("end_id", "INT32", reshape=False),
    _opt("pad_id", "INT32", reshape=False),
    _opt("top_k", "INT32", reshape=False),
    _opt("top_p", "FP32", reshape=False),
    _opt("temperature", "FP32", reshape=False),
    _opt("seed", "UINT64", reshape=False),
    _opt("exclude_input_in_output", "BOOL", reshape=False),
    _opt("return_perf_metrics", "BOOL", reshape=False),
    _opt("stream", "BOOL", reshape=False),
]
CLIENT_OUTPUTS = [Tensor("text_output", "STRING", (-1,)), *PERF_OUTPUTS]
BLS_INPUTS = [
    *CLIENT_INPUTS,
    _opt("num_draft_tokens", "INT32", reshape=False),
    _opt("use_draft_logits", "BOOL"),
]


@dataclass(frozen=True)
class EngineParams:
    """The values the documented fill_template commands give, as trtspec sets them."""

    max_batch_size: int
    decoupled: bool
    engine_dir: str
    tokenizer_dir: str
    kv_cache_free_gpu_mem_fraction: float = 0.9  # 0.5 when target and draft share a GPU
    gpu_device_ids: str | None = None
    instances: int = 1


def tensorrt_llm_config(
    name: str, p: EngineParams, backend: str, extra: dict[str, str] | None = None
) -> mc.ModelConfig:
    """tensorrt_llm or tensorrt_llm_draft; backend tensorrtllm (NVIDIA's) or python (trtspec's torch model)."""
    parameters = {
        "max_beam_width": "1",
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "gpt_model_type": "inflight_fused_batching",
        "gpt_model_path": p.engine_dir,
        "batch_scheduler_policy": "guaranteed_no_evict",
        "kv_cache_free_gpu_mem_fraction": str(p.kv_cache_free_gpu_mem_fraction),
        "exclude_input_in_output": "False",
        "enable_kv_cache_reuse": "True",
        "normalize_log_probs": "True",
        "enable_chunked_context": "False",
        "decoding_mode": "top_k_top_p",
        "tokenizer_dir": p.tokenizer_dir,
    }
    if p.gpu_device_ids is not None:
        parameters["gpu_device_ids"] = p.gpu_device_ids
    if backend == "tensorrtllm":
        parameters["executor_worker_path"] = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"
    parameters.update(extra or {})
    config = model_config(
        name,
        TRTLLM_INPUTS,
        TRTLLM_OUTPUTS,
        backend=backend,
        max_batch_size=p.max_batch_size,
        decoupled=p.decoupled,
        instances=p.instances,
        parameters=parameters,
    )
    config.dynamic_batching.preferred_batch_size.append(p.max_batch_size)
    config.dynamic_batching.max_queue_delay_microseconds = 0
    config.dynamic_batching.default_queue_policy.max_queue_size = 0
    return config


def preprocessing_config(p: EngineParams) -> mc.ModelConfig:
    return model_config(
        "preprocessing",
        PREPROCESSING_INPUTS,
        PREPROCESSING_OUTPUTS,
        backend="python",
        max_batch_size=p.max_batch_size,
        instances=p.instances,
        parameters={"tokenizer_dir": p.tokenizer_dir, "add_special_tokens": "True"},
    )


def postprocessing_config(p: EngineParams) -> mc.ModelConfig:
    return model_config(
        "postprocessing",
        POSTPROCESSING_INPUTS,
        POSTPROCESSING_OUTPUTS,
        backend="python",
        max_batch_size=p.max_batch_size,
        instances=p.instances,
        parameters={"tokenizer_dir": p.tokenizer_dir, "skip_special_tokens": "True"},
        dynamic_batching=True,
    )


def bls_config(p: EngineParams, draft_model: str | None, streams: bool = True) -> mc.ModelConfig:
    """Non-decoupled whenever a draft model is wired (the BLS speculates only without streaming) or
    the BLS cannot stream at all (trtspec's: streaming goes through the ensemble)."""
    parameters = {"accumulate_tokens": "False", "tensorrt_llm_model_name": "tensorrt_llm"}
    if draft_model:
        parameters["tensorrt_llm_draft_model_name"] = draft_model
    return model_config(
        "tensorrt_llm_bls",
        BLS_INPUTS,
        CLIENT_OUTPUTS,
        backend="python",
        max_batch_size=p.max_batch_size,
        decoupled=p.decoupled and streams and not draft_model,
        instances=max(p.instances, p.max_batch_size),  # NVIDIA: one BLS instance per request in flight
        parameters=parameters,
    )


def ensemble_config(p: EngineParams) -> mc.ModelConfig:
    config = model_config(
        "ensemble", CLIENT_INPUTS, CLIENT_OUTPUTS, platform="ensemble", max_batch_size=p.max_batch_size
    )
    ensemble_step(
        config,
        "preprocessing",
        {
            "QUERY": "text_input",
            "REQUEST_OUTPUT_LEN": "max_tokens",
            "BAD_WORDS_DICT": "bad_words",
            "STOP_WORDS_DICT": "stop_words",
            "END_ID": "end_id",
            "PAD_ID": "pad_id",
        },
        {
            "INPUT_ID": "_INPUT_ID",
            "REQUEST_INPUT_LEN": "_REQUEST_INPUT_LEN",
            "REQUEST_OUTPUT_LEN": "_REQUEST_OUTPUT_LEN",
            "STOP_WORDS_IDS": "_STOP_WORDS_IDS",
            "BAD_WORDS_IDS": "_BAD_WORDS_IDS",
            "OUT_END_ID": "_PREPROCESSOR_END_ID",
            "OUT_PAD_ID": "_PREPROCESSOR_PAD_ID",
        },
    )
    ensemble_step(
        config,
        "tensorrt_llm",
        {
            "input_ids": "_INPUT_ID",
            "input_lengths": "_REQUEST_INPUT_LEN",
            "request_output_len": "_REQUEST_OUTPUT_LEN",
            "end_id": "_PREPROCESSOR_END_ID",
            "pad_id": "_PREPROCESSOR_PAD_ID",
            "stop_words_list": "_STOP_WORDS_IDS",
            "bad_words_list": "_BAD_WORDS_IDS",
            "runtime_top_k": "top_k",
            "runtime_top_p": "top_p",
            "temperature": "temperature",
            "seed": "seed",
            "exclude_input_in_output": "exclude_input_in_output",
            "return_perf_metrics": "return_perf_metrics",
            "streaming": "stream",
        },
        {
            "output_ids": "_TOKENS_BATCH",
            "sequence_length": "_SEQUENCE_LENGTH",
            **{t.name: t.name for t in PERF_OUTPUTS},
        },
    )
    ensemble_step(
        config,
        "postprocessing",
        {"TOKENS_BATCH": "_TOKENS_BATCH", "SEQUENCE_LENGTH": "_SEQUENCE_LENGTH"},
        {"OUTPUT": "text_output"},
    )
    return config


def required_inputs_checked_by_preprocessing(ensemble: mc.ModelConfig, preprocessing: mc.ModelConfig) -> None:
    """Make text_input and max_tokens optional for Triton and required by trtspec's preprocessing.

    A decoupled ensemble given a request without a required input (when the input count is still
    in range) never schedules its first step and ends the stream with no response and no error.
    Declared optional, the step runs and trtspec's preprocessing answers with an error naming the
    input. Only for trtspec's own preprocessing: NVIDIA's expects QUERY to be there.
    """
    for config, names in ((ensemble, ("text_input", "max_tokens")), (preprocessing, ("QUERY", "REQUEST_OUTPUT_LEN"))):
        for tensor in config.input:
            if tensor.name in names:
                tensor.optional = True
