"""The engine flavour: preprocessing -> tensorrt_llm -> postprocessing (ensemble), plus
tensorrt_llm_draft and tensorrt_llm_bls for draft-target. Tensor names, types and dims are NVIDIA's
`inflight_batcher_llm` templates' as `contract` records them; the parameter values are those the
documented draft-target fill_template commands set.

The same configs serve both engines: on NVIDIA's container `tensorrt_llm` has backend tensorrtllm and
the python models are the container's own; with the torch backend every model is trtspec's python
model behind the same names.
"""

from __future__ import annotations

from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from trtspec.repository import contract
from trtspec.repository.pbtxt import Tensor, ensemble_step, model_config


# Every tensor NVIDIA's templates declare, over all the trees in the contract: NVIDIA's python models
# look outputs up by name at load time and the BLS asks for them, so none may be left out. trtspec's
# own python models honour what they can and refuse the rest with an error naming the input.
def _inputs(name: str) -> list[Tensor]:
    """The template's inputs, plus any NVIDIA's BLS sends that a template of another tree declares only
    as an output (IMAGE_SIZES): typed as that output and optional, so the request never fails on it."""
    c = contract.model(name)
    inputs = list(c.inputs)
    known = {t.name for t in inputs}
    for missing in sorted(contract.bls_requests().get(name, {}).get("sent", frozenset()) - known):
        twin = next((t for t in c.outputs if t.name == missing), None)
        if twin is not None:
            inputs.append(Tensor(missing, twin.dtype, twin.dims, optional=True))
    return inputs


TRTLLM_INPUTS = _inputs("tensorrt_llm")
TRTLLM_OUTPUTS = list(contract.model("tensorrt_llm").outputs)
PREPROCESSING_INPUTS = _inputs("preprocessing")
PREPROCESSING_OUTPUTS = list(contract.model("preprocessing").outputs)
POSTPROCESSING_INPUTS = list(contract.model("postprocessing").inputs)
POSTPROCESSING_OUTPUTS = list(contract.model("postprocessing").outputs)
CLIENT_INPUTS = list(contract.model("ensemble").inputs)
CLIENT_OUTPUTS = list(contract.model("ensemble").outputs)
BLS_INPUTS = list(contract.model("tensorrt_llm_bls").inputs)
BLS_OUTPUTS = list(contract.model("tensorrt_llm_bls").outputs)


def template_parameters(name: str, values: dict[str, str]) -> dict[str, str]:
    """Every parameter of a python model's template: ours where trtspec sets one, else left unfilled
    (`${key}`) exactly as NVIDIA's fill_template leaves it, which NVIDIA's models read as unset."""
    keys = sorted(contract.model(name).parameters | set(values))
    return {key: values.get(key, "${" + key + "}") for key in keys}


@dataclass(frozen=True)
class EngineParams:
    """The values the documented fill_template commands give, as trtspec sets them."""

    max_batch_size: int
    decoupled: bool
    engine_dir: str
    tokenizer_dir: str
    kv_cache_free_gpu_mem_fraction: float = 0.9
    max_tokens_in_paged_kv_cache: int | None = None  # a hard cap where two models share a GPU
    gpu_device_ids: str | None = None
    instances: int = 1


def _queue(config: mc.ModelConfig, max_batch_size: int) -> None:
    """The templates' dynamic batching: preferred batch = max batch, no queue delay, no queue limit."""
    config.dynamic_batching.preferred_batch_size.append(max_batch_size)
    config.dynamic_batching.max_queue_delay_microseconds = 0
    config.dynamic_batching.default_queue_policy.max_queue_size = 0


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
    if p.max_tokens_in_paged_kv_cache is not None:
        parameters["max_tokens_in_paged_kv_cache"] = str(p.max_tokens_in_paged_kv_cache)
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
    _queue(config, p.max_batch_size)
    return config


def preprocessing_config(p: EngineParams) -> mc.ModelConfig:
    config = model_config(
        "preprocessing",
        PREPROCESSING_INPUTS,
        PREPROCESSING_OUTPUTS,
        backend="python",
        max_batch_size=p.max_batch_size,
        instances=p.instances,
        parameters=template_parameters(
            "preprocessing",
            {"tokenizer_dir": p.tokenizer_dir, "add_special_tokens": "True", "gpt_model_path": p.engine_dir},
        ),
    )
    _queue(config, p.max_batch_size)
    return config


def postprocessing_config(p: EngineParams) -> mc.ModelConfig:
    return model_config(
        "postprocessing",
        POSTPROCESSING_INPUTS,
        POSTPROCESSING_OUTPUTS,
        backend="python",
        max_batch_size=p.max_batch_size,
        instances=p.instances,
        parameters=template_parameters(
            "postprocessing", {"tokenizer_dir": p.tokenizer_dir, "skip_special_tokens": "True"}
        ),
        dynamic_batching=True,
    )


def bls_config(
    p: EngineParams, draft_model: str | None, streams: bool = True, extra: dict[str, str] | None = None
) -> mc.ModelConfig:
    """Non-decoupled whenever a draft model is wired (the BLS speculates only without streaming) or
    the BLS cannot stream at all (trtspec's: streaming goes through the ensemble)."""
    values = {"accumulate_tokens": "False", "tensorrt_llm_model_name": "tensorrt_llm"}
    if draft_model:
        values["tensorrt_llm_draft_model_name"] = draft_model
    values.update(extra or {})
    return model_config(
        "tensorrt_llm_bls",
        BLS_INPUTS,
        BLS_OUTPUTS,
        backend="python",
        max_batch_size=p.max_batch_size,
        decoupled=p.decoupled and streams and not draft_model,
        instances=max(p.instances, p.max_batch_size),  # NVIDIA: one BLS instance per request in flight
        parameters=template_parameters("tensorrt_llm_bls", values),
    )


def ensemble_config(p: EngineParams) -> mc.ModelConfig:
    """NVIDIA's ensemble: every client input it declares, wired step by step as its template wires it."""
    config = model_config(
        "ensemble", CLIENT_INPUTS, CLIENT_OUTPUTS, platform="ensemble", max_batch_size=p.max_batch_size
    )
    for step in contract.ensemble_steps():
        ensemble_step(config, step["model"], step["input_map"], step["output_map"])
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
