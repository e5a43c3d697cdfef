"""config.pbtxt from typed values: Triton's own ModelConfig message, rendered and parsed back.

Building the protobuf message (never filling a text template) means a misspelt field or a wrong
enum fails here, in Python, instead of when tritonserver loads the repository on the GPU host.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from trtspec.errors import TrtspecError

DTYPES = {
    "BOOL": mc.TYPE_BOOL,
    "UINT8": mc.TYPE_UINT8,
    "UINT64": mc.TYPE_UINT64,
    "INT32": mc.TYPE_INT32,
    "INT64": mc.TYPE_INT64,
    "FP16": mc.TYPE_FP16,
    "FP32": mc.TYPE_FP32,
    "BF16": mc.TYPE_BF16,
    "STRING": mc.TYPE_STRING,
}


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str  # a DTYPES key
    dims: tuple[int, ...] = (-1,)
    optional: bool = False
    ragged: bool = False  # allow_ragged_batch
    reshape: tuple[int, ...] | None = None  # e.g. () for reshape { shape: [] }


def _io(message, tensor: Tensor) -> None:
    message.name = tensor.name
    message.data_type = DTYPES[tensor.dtype]
    message.dims.extend(tensor.dims)
    if tensor.reshape is not None:
        message.reshape.shape.extend(tensor.reshape)
        if not tensor.reshape:
            message.reshape.SetInParent()


def model_config(
    name: str,
    inputs: list[Tensor],
    outputs: list[Tensor],
    *,
    backend: str | None = None,
    platform: str | None = None,
    max_batch_size: int = 0,
    decoupled: bool | None = None,
    instances: int | None = None,
    parameters: dict[str, str] | None = None,
    dynamic_batching: bool = False,
) -> mc.ModelConfig:
    config = mc.ModelConfig(name=name, max_batch_size=max_batch_size)
    if backend:
        config.backend = backend
    if platform:
        config.platform = platform
    for tensor in inputs:
        message = config.input.add()
        _io(message, tensor)
        message.optional = tensor.optional
        message.allow_ragged_batch = tensor.ragged
    for tensor in outputs:
        _io(config.output.add(), tensor)
    if decoupled is not None:
        config.model_transaction_policy.decoupled = decoupled
    if instances is not None:
        config.instance_group.add(count=instances, kind=mc.ModelInstanceGroup.KIND_CPU)
    if dynamic_batching:
        config.dynamic_batching.SetInParent()
    for key, value in (parameters or {}).items():
        config.parameters[key].string_value = value
    return config


def ensemble_step(config: mc.ModelConfig, model: str, inputs: dict[str, str], outputs: dict[str, str]) -> None:
    """A step of ensemble_scheduling: model input <- ensemble tensor, model output -> ensemble tensor."""
    step = config.ensemble_scheduling.step.add(model_name=model, model_version=-1)
    for key, value in inputs.items():
        step.input_map[key] = value
    for key, value in outputs.items():
        step.output_map[key] = value


def render(config: mc.ModelConfig) -> str:
    """The text Triton reads, checked by parsing it back into ModelConfig before anyone writes it."""
    text = text_format.MessageToString(config)
    parsed = mc.ModelConfig()
    try:
        text_format.Parse(text, parsed)
    except text_format.ParseError as exc:  # pragma: no cover - MessageToString output always parses
        raise TrtspecError(f"config.pbtxt for {config.name} does not parse as ModelConfig: {exc}") from None
    if parsed != config:
        raise TrtspecError(f"config.pbtxt for {config.name} does not round-trip through ModelConfig")
    return text


def parse(text: str) -> mc.ModelConfig:
    parsed = mc.ModelConfig()
    text_format.Parse(text, parsed)
    return parsed
