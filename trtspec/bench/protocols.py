"""The wire protocols a bench speaks, each behind one `generate(request, on_chunk)` coroutine.

- `triton-grpc`: KServe v2 ModelStreamInfer (bidirectional streaming) through tritonclient's asyncio
  stub, with `triton_enable_empty_final_response` so the end of a decoupled stream is known.
- `triton-http`: the generate extension, `generate_stream` (SSE) for decoupled models and `generate`
  otherwise; every SSE event is checked for an error object, since the status code is sent with
  the first event and stays 200 when a later one fails.
- `openai` / `openai-chat`: /v1/completions and /v1/chat/completions with SSE (trtllm-serve, vLLM).

Triton models are read once for their contract: TensorRT-LLM's llmapi model (`sampling_param_*`
inputs) or its engine ensemble/BLS (`max_tokens`, `min_tokens`, `stream`...), and whether they are
decoupled. A target is `PROTOCOL://HOST:PORT/MODEL`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from trtspec.errors import UsageError

PROTOCOLS = ("triton-grpc", "triton-http", "openai", "openai-chat")
ALIASES = {"grpc": "triton-grpc", "http": "triton-http"}
PERF_KEYS = (
    "acceptance_rate",
    "total_accepted_draft_tokens",
    "total_draft_tokens",
    "arrival_time_ns",
    "first_scheduled_time_ns",
    "first_token_time_ns",
    "last_token_time_ns",
)


class ServerError(Exception):
    """The server answered with an error (an error object, a non-200 status, a broken stream)."""


class Unreachable(ServerError):
    """The connection itself failed: the server is down or the address is wrong."""


@dataclass(frozen=True)
class Target:
    protocol: str
    host: str
    port: int
    model: str

    @classmethod
    def parse(cls, text: str) -> Target:
        scheme, sep, rest = text.partition("://")
        scheme = ALIASES.get(scheme, scheme)
        address, _, model = rest.partition("/")
        host, _, port = address.rpartition(":")
        if not sep or scheme not in PROTOCOLS or not host or not port.isdigit() or not model:
            wanted = ", ".join(PROTOCOLS)
            raise UsageError(f"target {text!r}: expected PROTOCOL://HOST:PORT/MODEL with PROTOCOL in {wanted}")
        return cls(scheme, host, int(port), model)

    def __str__(self) -> str:
        return f"{self.protocol}://{self.host}:{self.port}/{self.model}"


@dataclass
class Request:
    prompt: str
    max_tokens: int
    min_tokens: int | None = None  # set to fix the output length where the server supports it
    temperature: float = 0.0
    seed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Chunk:
    text: str = ""
    ids: list[int] | None = None
    tokens: int | None = None  # the server's count of the tokens in this chunk, when it says


@dataclass
class Reply:
    text: str = ""
    output_tokens: int | None = None  # the server's count, when it reports one
    perf: dict[str, float] = field(default_factory=dict)


ChunkCallback = Callable[[Chunk], None]


# what each Triton contract calls a request's fields; TensorRT-LLM's llmapi model has no min_tokens
INPUT_NAMES = {
    "llmapi": {
        "prompt": "text_input", "stream": "streaming", "max_tokens": "sampling_param_max_tokens",
        "temperature": "sampling_param_temperature", "perf": "sampling_param_return_perf_metrics",
        "exclude_input": "sampling_param_exclude_input_from_output", "seed": "sampling_param_seed",
    },
    "engine": {
        "prompt": "text_input", "stream": "stream", "max_tokens": "max_tokens", "temperature": "temperature",
        "perf": "return_perf_metrics", "exclude_input": "exclude_input_in_output", "seed": "seed",
        "min_tokens": "min_tokens",
    },
}  # fmt: skip


@dataclass
class Contract:
    """How a Triton model names things: TensorRT-LLM's llmapi model, or its engine ensemble/BLS."""

    kind: str  # "llmapi" or "engine"
    inputs: dict[str, tuple[str, list[int]]]  # name -> (datatype, shape with -1 as 1)
    decoupled: bool

    @classmethod
    def from_metadata(cls, metadata: dict, config: dict) -> Contract:
        inputs = {
            i["name"]: (i["datatype"], [1 if int(d) < 0 else int(d) for d in i["shape"]]) for i in metadata["inputs"]
        }
        if "text_input" not in inputs:
            raise UsageError(
                f"model {metadata.get('name')} has no text_input: bench the ensemble, the BLS or the llmapi model"
            )
        kind = "llmapi" if "sampling_param_max_tokens" in inputs else "engine"
        decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled", False))
        return cls(kind, inputs, decoupled)

    @property
    def supports_min_tokens(self) -> bool:
        return "min_tokens" in self.inputs

    @staticmethod
    def speculating_bls(request: Request) -> bool:
        """NVIDIA's BLS (before its exclude_input_in_output fix) finds the drafts by cutting the prompt
        off the draft's output, so a speculative request that excludes the input gets no drafts and a
        wrong text; it also overrides min_tokens. Such a request keeps both unset and the client cuts
        the prompt off the answer."""
        return bool(request.extra.get("num_draft_tokens"))

    def text(self, request: Request, text: str) -> str:
        if self.speculating_bls(request) and text.startswith(request.prompt):
            return text[len(request.prompt) :]
        return text

    def values(self, request: Request) -> dict[str, Any]:
        """The request as this model's input values (only those the model declares)."""
        speculating = self.speculating_bls(request)
        generic = {
            "prompt": request.prompt,
            "stream": self.decoupled,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "perf": True,
            "exclude_input": None if speculating else True,
            "seed": request.seed,
            "min_tokens": None if speculating else (request.min_tokens or None),
        }
        names = INPUT_NAMES[self.kind]
        values = {names[k]: v for k, v in generic.items() if v is not None and names.get(k)}
        values.update(request.extra)
        return {k: v for k, v in values.items() if k in self.inputs}


def _perf(get: Callable[[str], Any]) -> dict[str, float]:
    out = {}
    for key in PERF_KEYS:
        value = get(key)
        if value is not None:
            out[key] = float(np.asarray(value).reshape(-1)[0])
    return out


class TritonGrpc:
    def __init__(self, target: Target) -> None:
        self.target = target
        self.client = None
        self.contract: Contract | None = None

    async def open(self) -> None:
        import tritonclient.grpc.aio as grpcclient
        from tritonclient.utils import InferenceServerException

        self.client = grpcclient.InferenceServerClient(f"{self.target.host}:{self.target.port}")
        try:
            metadata = await self.client.get_model_metadata(self.target.model, as_json=True)
            config = (await self.client.get_model_config(self.target.model, as_json=True))["config"]
        except InferenceServerException as exc:
            await self.client.close()
            raise UsageError(f"{self.target}: {exc.message()}") from None
        self.contract = Contract.from_metadata(metadata, config)

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()

    def _request(self, request: Request, request_id: str):
        import tritonclient.grpc as grpcclient
        from tritonclient.grpc._utils import _get_inference_request

        tensors = []
        for name, value in self.contract.values(request).items():
            dtype, shape = self.contract.inputs[name]
            array = np.array(value, dtype=object if dtype == "BYTES" else _NP[dtype]).reshape(shape)
            if dtype == "BYTES":
                array = np.array([v.encode("utf-8") for v in array.reshape(-1)], dtype=object).reshape(shape)
            tensor = grpcclient.InferInput(name, shape, dtype)
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        proto = _get_inference_request(
            model_name=self.target.model, inputs=tensors, model_version="", request_id=request_id, outputs=None,
            sequence_id=0, sequence_start=False, sequence_end=False, priority=0, timeout=None, parameters=None,
        )  # fmt: skip
        proto.parameters["triton_enable_empty_final_response"].bool_param = True
        return proto

    async def generate(self, request: Request, on_chunk: ChunkCallback, request_id: str = "") -> Reply:
        import grpc
        from tritonclient.grpc import InferResult

        proto = self._request(request, request_id)
        finished = asyncio.Event()

        async def outgoing():
            yield proto
            await finished.wait()  # keep the stream open until the last response is in

        reply = Reply()
        call = self.client._client_stub.ModelStreamInfer(outgoing())
        try:
            async for response in call:
                if response.error_message:
                    raise ServerError(response.error_message)
                result = InferResult(response.infer_response)
                names = {o.name for o in response.infer_response.outputs}
                if names:
                    chunk = Chunk()
                    if "text_output" in names:
                        text = b"".join(result.as_numpy("text_output").reshape(-1)).decode("utf-8", "replace")
                        chunk.text = self.contract.text(request, text)
                    if "output_ids" in names:
                        ids = result.as_numpy("output_ids").reshape(-1).tolist()
                        chunk.ids, chunk.tokens = ids, len(ids)
                    if chunk.text or chunk.ids:
                        on_chunk(chunk)
                        reply.text += chunk.text
                    reply.perf |= _perf(lambda k, r=result, n=names: r.as_numpy(k) if k in n else None)
                params = response.infer_response.parameters
                if "triton_final_response" in params and params["triton_final_response"].bool_param:
                    return reply
            raise ServerError("stream ended without a final response")
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                raise Unreachable(f"gRPC unavailable: {exc.details()}") from None
            raise ServerError(f"gRPC {exc.code().name}: {exc.details()}") from None
        finally:
            finished.set()
            call.cancel()


_NP = {
    "BOOL": np.bool_, "INT32": np.int32, "INT64": np.int64, "UINT64": np.uint64, "FP32": np.float32,
    "FP64": np.float64, "UINT32": np.uint32, "INT8": np.int8, "UINT8": np.uint8, "FP16": np.float16,
}  # fmt: skip


class _HttpBase:
    def __init__(self, target: Target) -> None:
        self.target = target
        self.session: aiohttp.ClientSession | None = None
        self.base = f"http://{target.host}:{target.port}"

    async def open(self) -> None:
        # no connection cap (the load level caps in-flight requests) and a large read buffer
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
        self.session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None), read_bufsize=10 * 2**20
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def _get(self, path: str) -> dict:
        try:
            async with self.session.get(self.base + path) as response:
                body = await response.json(content_type=None)
        except aiohttp.ClientConnectionError as exc:
            raise UsageError(f"{self.target}: cannot connect: {exc}") from None
        if response.status != 200:
            raise UsageError(f"{self.target}: GET {path}: {body.get('error', response.status)}")
        return body

    async def _events(self, path: str, body: dict):
        """POST and yield each JSON object of the answer: SSE `data:` events, or the one JSON body."""
        try:
            async with self.session.post(self.base + path, json=body) as response:
                if response.status != 200:
                    text = (await response.text()).strip()
                    text = text[5:].strip() if text.startswith("data:") else text  # an SSE-framed error
                    try:
                        message = json.loads(text).get("error", text)
                    except (ValueError, AttributeError):
                        message = text
                    raise ServerError(f"HTTP {response.status}: {_message(message)}")
                if not response.headers.get("Content-Type", "").startswith("text/event-stream"):
                    yield await response.json(content_type=None)
                    return
                async for raw in response.content:
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    try:
                        yield json.loads(data)
                    except ValueError:
                        raise ServerError(f"unparseable event: {data[:80]!r}") from None
        except aiohttp.ClientConnectorError as exc:
            raise Unreachable(f"cannot connect: {exc.os_error or exc}") from None
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise ServerError(f"connection lost mid-response: {exc}") from None


def _message(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message", error))
    return str(error)


class TritonHttp(_HttpBase):
    contract: Contract | None = None

    async def open(self) -> None:
        await super().open()
        try:
            model = f"/v2/models/{self.target.model}"
            self.contract = Contract.from_metadata(await self._get(model), await self._get(model + "/config"))
        except BaseException:
            await self.close()
            raise

    async def generate(self, request: Request, on_chunk: ChunkCallback, request_id: str = "") -> Reply:
        path = f"/v2/models/{self.target.model}/" + ("generate_stream" if self.contract.decoupled else "generate")
        reply = Reply()
        async for event in self._events(path, self.contract.values(request)):
            if "error" in event:  # under status 200 too: a later SSE event can carry the failure
                raise ServerError(_message(event["error"]))
            text = event.get("text_output", "")
            if isinstance(text, list):
                text = "".join(text)
            text = self.contract.text(request, text)
            if text:
                on_chunk(Chunk(text=text))
                reply.text += text
            reply.perf |= _perf(lambda k, e=event: e.get(k))
        return reply


class OpenAI(_HttpBase):
    def __init__(self, target: Target, chat: bool) -> None:
        super().__init__(target)
        self.chat = chat
        self.supports_min_tokens = True  # vLLM and trtllm-serve take min_tokens and ignore_eos

    async def generate(self, request: Request, on_chunk: ChunkCallback, request_id: str = "") -> Reply:
        body: dict[str, Any] = {
            "model": self.target.model,
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        if self.chat:
            body["messages"] = [{"role": "user", "content": request.prompt}]
        else:
            body["prompt"] = request.prompt
        if request.seed is not None:
            body["seed"] = request.seed
        if request.min_tokens:
            body |= {"min_tokens": request.min_tokens, "ignore_eos": True}
        body |= request.extra
        reply, counted = Reply(), 0
        path = "/v1/chat/completions" if self.chat else "/v1/completions"
        async for event in self._events(path, body):
            if "error" in event or event.get("object") == "error":
                raise ServerError(_message(event.get("error", event.get("message"))))
            usage = event.get("usage") or {}
            choices = event.get("choices") or []
            text = ""
            if choices:
                part = (choices[0].get("delta") or {}).get("content") if self.chat else choices[0].get("text")
                text = part or ""
            total = usage.get("completion_tokens")
            if text:
                tokens = total - counted if total is not None else None
                on_chunk(Chunk(text=text, tokens=tokens))
                reply.text += text
            if total is not None:
                counted = reply.output_tokens = int(total)
        return reply


def make_client(target: Target):
    if target.protocol == "triton-grpc":
        return TritonGrpc(target)
    if target.protocol == "triton-http":
        return TritonHttp(target)
    return OpenAI(target, chat=target.protocol == "openai-chat")


def supports_min_tokens(client) -> bool:
    contract = getattr(client, "contract", None)
    return contract.supports_min_tokens if contract is not None else bool(getattr(client, "supports_min_tokens", False))
