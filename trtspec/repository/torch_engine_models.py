"""trtspec's python models for the engine flavour on the torch backend, behind TensorRT-LLM's names.

`tensorrt_llm` / `tensorrt_llm_draft` take token ids as TensorRT-LLM's backend does (input_ids,
input_lengths, request_output_len, draft_input_ids, draft_logits, ...) and answer output_ids,
sequence_length, generation_logits and the perf outputs; `preprocessing` and `postprocessing`
tokenize with the checkpoint's tokenizer; `tensorrt_llm_bls` runs the documented draft-target loop
through them with BLS calls. Each repository's 1/model.py is a one-line import of a class here.
Every input the configs declare (NVIDIA's full lists) is honoured or, where trtspec does not
implement it (LoRA, multimodal, guided decoding, beams, penalties, bad words), refused with an error
response naming it, never silently ignored.
"""

from __future__ import annotations

import json
import secrets
import time
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from trtspec.repository.pb import (
    MAX_TEMPERATURE,
    BatchedPythonModel,
    PythonModel,
    RequestError,
    decoded,
    first_refused,
    given,
    neutral_only,
    number,
    scalar,
    utf8,
)
from trtspec.repository.spec_metrics import BLS_REQUEST_PREFIX, SpecMetrics
from trtspec.speculative.requests import positions_needed

# What trtspec's torch engine does with each input TensorRT-LLM's tensorrt_llm model declares. An
# input in none of these groups is refused whenever a request gives it, so nothing a client sends is
# accepted and then ignored.
HONOURED = frozenset(
    {
        "input_ids", "input_lengths", "request_output_len", "end_id", "pad_id", "draft_input_ids", "draft_logits",
        "temperature", "runtime_top_k", "runtime_top_p", "seed", "streaming", "exclude_input_in_output",
        "min_tokens", "stop_words_list", "bad_words_list", "return_generation_logits", "return_perf_metrics",
        "return_num_input_tokens", "return_num_output_tokens",
    }
)  # fmt: skip
# No effect on a decoder-only model at beam width 1, in TensorRT-LLM too (NVIDIA's preprocessing always
# sends a one-token decoder_input_ids).
NO_EFFECT = frozenset({"decoder_input_ids", "decoder_input_lengths", "len_penalty", "early_stopping"})
# Accepted at the value that changes nothing, refused at any other.
NEUTRAL: dict[str, object] = {
    "beam_width": 1,
    "num_return_sequences": 1,
    "beam_search_diversity_rate": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "return_log_probs": False,
    "return_context_logits": False,
    "stop": False,
}


@cache
def ensemble_names() -> dict[str, str]:
    """tensorrt_llm input -> the client input NVIDIA's ensemble feeds it from (runtime_top_k <- top_k)."""
    from trtspec.repository import contract

    steps = {step["model"]: step["input_map"] for step in contract.ensemble_steps()}
    return {name: client for name, client in steps["tensorrt_llm"].items() if not client.startswith("_")}


INT32_MAX = 2**31 - 1
MAX_LEN_PENALTY = 1000.0
UINT64_MAX = 2**64 - 1


def ends_with_any(tokens: list[int], sequences: tuple[tuple[int, ...], ...]) -> bool:
    """Whether `tokens` ends with one of the stop words (TensorRT-LLM includes the word in the output)."""
    return any(seq and len(tokens) >= len(seq) and tuple(tokens[-len(seq) :]) == seq for seq in sequences)


def words(array: np.ndarray) -> tuple[tuple[int, ...], ...]:
    """TensorRT-LLM's [1, 2, L] word list: flat token ids, then each word's end offset (-1 pads)."""
    if array.size == 0:
        return ()
    flat, offsets = np.asarray(array).reshape(-1, 2, array.shape[-1])[0]
    found, start = [], 0
    for end in offsets.tolist():
        if end < 0:
            break
        found.append(tuple(int(t) for t in flat[start:end]))
        start = end
    return tuple(w for w in found if w)


def word_list(request, name: str) -> tuple[tuple[int, ...], ...]:
    import triton_python_backend_utils as pb_utils

    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return () if tensor is None else words(tensor.as_numpy())


def parameters(args: dict[str, str]) -> dict[str, str]:
    """config.pbtxt parameters; an unfilled `${...}` or empty value counts as unset, as NVIDIA's models read them."""
    raw = json.loads(args["model_config"]).get("parameters", {})
    values = {k: v.get("string_value", "") for k, v in raw.items()}
    return {k: v for k, v in values.items() if v and not v.startswith("${")}


def ids(request, name: str) -> list[int] | None:
    import triton_python_backend_utils as pb_utils

    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None or tensor.as_numpy().size == 0:
        return None
    return tensor.as_numpy().reshape(-1).astype(np.int64).tolist()


def array(name: str, values, dtype) -> Any:
    import triton_python_backend_utils as pb_utils

    return pb_utils.Tensor(name, np.asarray(values, dtype=dtype))


def perf_tensors(
    arrival: int, scheduled: int, first: int, last: int, drafted: int, accepted: int, wanted: set[str] | None = None
) -> list:
    """TensorRT-LLM's perf outputs; with `wanted`, only those (each tensor is a copy into shared memory)."""
    values = {
        "arrival_time_ns": ([[arrival]], np.int64),
        "first_scheduled_time_ns": ([[scheduled]], np.int64),
        "first_token_time_ns": ([[first]], np.int64),
        "last_token_time_ns": ([[last]], np.int64),
        "acceptance_rate": ([[accepted / drafted if drafted else 0.0]], np.float32),
        "total_accepted_draft_tokens": ([[accepted]], np.int32),
        "total_draft_tokens": ([[drafted]], np.int32),
    }
    return [array(name, v, dtype) for name, (v, dtype) in values.items() if not wanted or name in wanted]


class TensorRTLLMModel(BatchedPythonModel):
    """`tensorrt_llm` (target) and `tensorrt_llm_draft`: one engine directory, TensorRT-LLM's tensors.

    Every request joins the instance's running batch (`engine_loop`): plain decoding, a drafter inside the
    target (MTP, Medusa, lookahead; `serving.engine_from_parameters`), and the BLS's verification calls
    (draft_input_ids) alike. With enable_kv_cache_reuse a request whose
    tokens start with what a finished request left in a slot skips that prefix, so the BLS loop,
    which resends the whole sequence each call, costs a call per step, not a prefill.
    """

    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils

        from trtspec.build.torch_engine import read_engine_config
        from trtspec.modes import get_mode
        from trtspec.repository.engine_loop import EngineLoop
        from trtspec.repository.serving import engine_from_parameters
        from trtspec.speculative.factory import resolve_device

        config = json.loads(args["model_config"])
        self.decoupled = bool(config.get("model_transaction_policy", {}).get("decoupled", False))
        p = parameters(args)
        engine_dir = Path(p["gpt_model_path"])
        spec = get_mode(p.get("trtspec_mode", "none"))  # a mode whose drafter lives in the target speculates here

        def build():  # on the engine thread: see engine_loop
            if p.get("trtspec_cpu_threads") and resolve_device(p.get("trtspec_device", "auto")) == "cpu":
                import torch

                torch.set_num_threads(int(p["trtspec_cpu_threads"]))
            return engine_from_parameters(p, slots=int(config.get("max_batch_size") or 8))

        self.loop = EngineLoop(build, log_error=pb_utils.Logger.log_error)
        self.engine = self.loop.engine
        eos = json.loads((engine_dir / "config.json").read_text(encoding="utf-8")).get("eos_token_id")
        self.end_id = eos[0] if isinstance(eos, list) else eos
        self.defaults = json.loads(p.get("trtspec_sampling", "{}"))
        self.exclude_input = p.get("exclude_input_in_output", "False").lower() == "true"
        self.declared = [tensor["name"] for tensor in config.get("input", [])]
        self.max_draft_len = int(read_engine_config(engine_dir).get("build_config", {}).get("max_draft_len") or 0)
        self.speculates = spec.speculates()
        self.metrics = SpecMetrics(args["model_name"], args["model_version"], spec.name, self.engine.num_draft_tokens)
        self.metrics.start(len(self.engine.rows) * self.engine.capacity)
        self.loop.on_step = self.metrics.batch

    def _sampling(self, request):
        from trtspec.speculative.requests import SamplingParams

        d, vocab = self.defaults, self.engine.target.dims.vocab_size
        temperature = self._number(request, "temperature", float(d.get("temperature", 0.0)), 0, MAX_TEMPERATURE)
        top_k = self._number(request, "runtime_top_k", int(d.get("top_k", 0)), 0, vocab, integer=True)
        top_p = self._number(request, "runtime_top_p", float(d.get("top_p", 1.0)), 0, 1, open_low=True)
        return SamplingParams(temperature, top_k, top_p)

    @staticmethod
    def _number(request, name: str, default, low, high, **kind):
        """number(), the message naming the input as the ensemble's client knows it too."""
        client = ensemble_names().get(name)
        label = f"{name} (the ensemble's {client})" if client and client != name else name
        return number(request, name, default, low, high, label=label, **kind)

    def _token_ids(self, request, name: str) -> list[int] | None:
        """Token ids a request gives, each inside the vocabulary (any other would fail the batch's step)."""
        tokens = ids(request, name)
        vocab = self.engine.target.dims.vocab_size
        bad = next((t for t in tokens or [] if not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError(f"{name} must hold token ids in [0, {vocab - 1}], got {bad}")
        return tokens

    def _draft_logits(self, request, drafts: list[int]):
        import torch
        import triton_python_backend_utils as pb_utils

        tensor = pb_utils.get_input_tensor_by_name(request, "draft_logits")
        if tensor is None or tensor.as_numpy().size == 0:
            return None
        values = np.array(tensor.as_numpy(), dtype=np.float32)
        vocab = self.engine.target.dims.vocab_size
        if values.size != len(drafts) * vocab:
            raise RequestError(f"draft_logits has {values.size} values, want {len(drafts)} drafts x vocab {vocab}")
        if np.isnan(values).any() or np.isposinf(values).any():
            raise RequestError("draft_logits must be finite numbers (or -inf for a token ruled out)")
        return torch.from_numpy(values.reshape(len(drafts), vocab))

    def submit(self, request, sender) -> None:
        import torch
        import triton_python_backend_utils as pb_utils

        from trtspec.repository.engine_loop import Stream
        from trtspec.speculative.batch import Sequence
        from trtspec.speculative.runner import GenerationParams

        arrival = time.time_ns()
        refused = first_refused(request, self.declared, HONOURED | NO_EFFECT, NEUTRAL)
        if refused is not None:
            raise RequestError(neutral_only(refused, NEUTRAL))
        if word_list(request, "bad_words_list"):
            raise RequestError("bad_words_list is not supported by trtspec's torch engine")
        self._number(request, "len_penalty", None, -MAX_LEN_PENALTY, MAX_LEN_PENALTY)  # no effect, but a number
        stop_words = word_list(request, "stop_words_list")
        prompt = self._token_ids(request, "input_ids")
        if not prompt:
            raise RequestError("input_ids is required and must not be empty")
        prompt = prompt[: self._number(request, "input_lengths", len(prompt), 1, len(prompt), integer=True)]
        capacity = self.engine.capacity
        if scalar(request, "request_output_len") is None:
            raise RequestError("request_output_len is required")
        max_new = self._number(request, "request_output_len", 0, 1, capacity, integer=True)
        min_tokens = self._number(request, "min_tokens", 0, 0, max_new, integer=True)
        drafts = self._token_ids(request, "draft_input_ids") or []
        if len(drafts) > self.max_draft_len:
            raise RequestError(
                f"draft_input_ids has {len(drafts)} tokens, more than this engine's max_draft_len "
                f"{self.max_draft_len}: ask for fewer num_draft_tokens or rebuild with more"
            )
        streaming = bool(scalar(request, "streaming", False))
        if streaming and not self.decoupled:
            raise RequestError("streaming requires a decoupled model (decoupled_mode True)")
        end_id = int(scalar(request, "end_id", self.end_id if self.end_id is not None else -1))
        sampling = self._sampling(request)
        seed = self._number(request, "seed", None, 0, UINT64_MAX, integer=True)
        generator = torch.Generator().manual_seed(seed if seed is not None else secrets.randbits(63))
        exclude = bool(scalar(request, "exclude_input_in_output", self.exclude_input))
        want_logits = bool(scalar(request, "return_generation_logits", False))
        if want_logits and (drafts or self.speculates):  # NVIDIA's BLS never asks for them there
            raise RequestError("return_generation_logits with speculation is not supported by trtspec's torch engine")
        want_inputs = bool(scalar(request, "return_num_input_tokens", False))
        want_outputs = bool(scalar(request, "return_num_output_tokens", False))
        kept: list[int] = []  # the output so far: the end token left out, cut after a stop word
        first = [0]

        def on_tokens(chunk: list[int]) -> bool:
            first[0] = first[0] or time.time_ns()
            ended = end_id in chunk
            chunk = chunk[: chunk.index(end_id)] if ended else chunk
            for n in range(1, len(chunk) + 1):
                if ends_with_any(prompt + kept + chunk[:n], stop_words):  # a word may begin in an earlier call
                    chunk, ended = chunk[:n], True
                    break
            kept.extend(chunk)
            if streaming and chunk:
                stream.push(chunk)
            return ended

        stream = Stream(self.loop, lambda new: sender.send(pb_utils.InferenceResponse(self._tokens(new))))

        def done(seq: Sequence, error: str | None) -> None:
            final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            if error is not None or seq.result.finish_reason == "cancelled":
                message = error or "request cancelled"
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(message)), flags=final)
                return
            stats = seq.result.stats
            last = time.time_ns()
            if not request_id.startswith(BLS_REQUEST_PREFIX):  # a BLS step: the BLS counts its request
                first_token = first[0] or last
                self.metrics.record(
                    stats.step_log, (first_token - arrival) / 1e9, len(kept), (last - first_token) / 1e9
                )
            outputs = self._tokens([] if streaming else (kept if exclude else prompt + kept))
            if want_logits:
                v = self.engine.target.dims.vocab_size
                values = torch.stack(seq.logits[: len(kept)]).numpy() if kept else np.zeros((0, v), np.float32)
                outputs.append(array("generation_logits", values[None, None], np.float32))
            scheduled, first_token = seq.admitted_ns or arrival, first[0] or last
            drafted, accepted = stats.draft_tokens, stats.accepted_tokens
            outputs += perf_tensors(arrival, scheduled, first_token, last, drafted, accepted, wanted)
            if want_inputs:
                outputs.append(array("num_input_tokens", [[len(prompt)]], np.int32))
            if want_outputs:
                outputs.append(array("num_output_tokens", [[len(kept)]], np.int32))
            if wanted:  # Triton drops the others, but only after each was copied into shared memory
                outputs = [tensor for tensor in outputs if tensor.name() in wanted]
            sender.send(pb_utils.InferenceResponse(outputs), flags=final)

        request_id = request.request_id()
        wanted = set(request.requested_output_names())  # the BLS's calls ask for two or three outputs
        params = GenerationParams(
            max_tokens=min(max_new, len(drafts) + 1) if drafts else max_new,
            sampling=sampling,
            stop_token_ids=frozenset([end_id]),
        )
        need = self.engine.positions_needed(len(prompt), params, drafts or None)
        if need > capacity:
            raise RequestError(
                f"input ({len(prompt)} tokens) + request_output_len ({params.max_tokens} generated here) need "
                f"{need} positions with this engine's drafts: more than its {capacity}"
            )
        seq = Sequence(
            prompt,
            params,
            on_tokens=on_tokens,
            generator=generator,
            drafts=drafts or None,
            draft_logits=self._draft_logits(request, drafts) if drafts else None,
            min_tokens=min_tokens,
            keep_logits=want_logits,
        )
        self.loop.submit(seq, done, is_cancelled=request.is_cancelled)

    @staticmethod
    def _tokens(tokens: list[int]) -> list:
        return [array("output_ids", [[tokens]], np.int32), array("sequence_length", [[len(tokens)]], np.int32)]

    def finalize(self) -> None:
        self.loop.close()
        self.metrics.close()
        self.engine = None


def _int(value: str | None) -> int | None:
    return int(value) if value else None


class _TokenizerModel(PythonModel):
    """A model whose only state is the checkpoint's tokenizer and one special-tokens flag."""

    flag = ""  # the config.pbtxt parameter the flag is read from (default True)

    def initialize(self, args: dict[str, str]) -> None:
        from transformers import AutoTokenizer

        p = parameters(args)
        self.tokenizer = AutoTokenizer.from_pretrained(p["tokenizer_dir"])
        self.special = p.get(self.flag, "True").lower() == "true"
        self.declared = [t["name"] for t in json.loads(args["model_config"]).get("input", [])]


def strings(request, name: str) -> list[str]:
    import triton_python_backend_utils as pb_utils

    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return []
    return [decoded(v, name) for v in tensor.as_numpy().reshape(-1).tolist()]


class PreprocessingModel(_TokenizerModel):
    """QUERY -> INPUT_ID with the checkpoint's tokenizer; END_ID/PAD_ID default to the tokenizer's;
    stop and bad words become TensorRT-LLM's word lists as NVIDIA's preprocessing writes them."""

    flag = "add_special_tokens"
    HONOURED = frozenset({"QUERY", "REQUEST_OUTPUT_LEN", "END_ID", "PAD_ID", "BAD_WORDS_DICT", "STOP_WORDS_DICT"})

    def _word_list(self, words: list[str]) -> np.ndarray:
        """[1, 2, L]: the words' token ids end to end, then each word's end offset, padded 0 / -1."""
        encoded = [ids for w in words if (ids := self.tokenizer.encode(w, add_special_tokens=False))]
        flat = [t for ids in encoded for t in ids]
        offsets = np.cumsum([len(ids) for ids in encoded]).tolist() if encoded else []
        width = max(1, len(flat))
        if not encoded:
            return np.zeros((1, 2, 0), dtype=np.int32)
        rows = [flat + [0] * (width - len(flat)), offsets + [-1] * (width - len(offsets))]
        return np.array([rows], dtype=np.int32)

    def answer(self, request, sender):
        import triton_python_backend_utils as pb_utils

        for name in self.declared:
            if name not in self.HONOURED and given(request, name):
                raise RequestError(f"{name} is not supported by trtspec's torch engine")
        query = utf8(request, "QUERY")
        if not query:
            raise RequestError("text_input is required and must not be empty")
        if scalar(request, "REQUEST_OUTPUT_LEN") is None:
            raise RequestError("max_tokens is required")
        out_len = number(request, "REQUEST_OUTPUT_LEN", None, 1, INT32_MAX, integer=True, label="max_tokens")
        tok = self.tokenizer
        tokens = tok(query, add_special_tokens=self.special).input_ids
        end = scalar(request, "END_ID", tok.eos_token_id)
        pad = scalar(request, "PAD_ID", tok.pad_token_id if tok.pad_token_id is not None else end)
        return pb_utils.InferenceResponse(
            [
                array("INPUT_ID", [tokens], np.int32),
                array("REQUEST_INPUT_LEN", [[len(tokens)]], np.int32),
                array("DECODER_INPUT_ID", [[pad]], np.int32),
                array("REQUEST_DECODER_INPUT_LEN", [[1]], np.int32),
                pb_utils.Tensor("BAD_WORDS_IDS", self._word_list(strings(request, "BAD_WORDS_DICT"))),
                pb_utils.Tensor("STOP_WORDS_IDS", self._word_list(strings(request, "STOP_WORDS_DICT"))),
                pb_utils.Tensor("EMBEDDING_BIAS", np.zeros((1, 0), dtype=np.float32)),
                array("REQUEST_OUTPUT_LEN", [[out_len]], np.int32),
                array("OUT_END_ID", [[end]], np.int32),
                array("OUT_PAD_ID", [[pad]], np.int32),
            ]
        )


class PostprocessingModel(_TokenizerModel):
    """TOKENS_BATCH [batch, beam, len] + SEQUENCE_LENGTH -> OUTPUT text, special tokens skipped."""

    flag = "skip_special_tokens"

    def answer(self, request, sender):
        import triton_python_backend_utils as pb_utils

        batch = pb_utils.get_input_tensor_by_name(request, "TOKENS_BATCH").as_numpy()
        lengths = pb_utils.get_input_tensor_by_name(request, "SEQUENCE_LENGTH").as_numpy()
        texts = [
            [
                self.tokenizer.decode(beam[: int(n)].tolist(), skip_special_tokens=self.special).encode("utf-8")
                for beam, n in zip(row, row_lengths, strict=True)
            ]
            for row, row_lengths in zip(batch, lengths, strict=True)
        ]
        return pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", np.array(texts, dtype=np.object_))])


class BLSModel(PythonModel):
    """`tensorrt_llm_bls`: preprocessing, then draft K / verify in the target until done, then postprocessing.

    The loop is TensorRT-LLM's documented one (draft asked for K tokens, target given them as
    draft_input_ids, with draft_logits when use_draft_logits) with two differences that keep it
    lossless at temperature > 0: each call gets its own seed (a shared seed would correlate the draws
    of successive steps), and the stop rule is the target's end token or a stop word, not "draft == target".
    """

    # accepted-length buckets: the BLS learns K per request, so it counts up to this and puts longer in +Inf
    LONGEST_DRAFT_BUCKET = 8

    # client inputs the BLS itself reads; the others go where NVIDIA's ensemble sends them (to_models)
    OWN = frozenset(
        {
            "text_input", "max_tokens", "num_draft_tokens", "use_draft_logits", "stream", "seed",
            "exclude_input_in_output", "return_perf_metrics", "return_num_input_tokens", "return_num_output_tokens",
        }
    )  # fmt: skip

    def initialize(self, args: dict[str, str]) -> None:
        from trtspec.repository import contract

        p = parameters(args)
        self.declared = [t["name"] for t in json.loads(args["model_config"]).get("input", [])]
        steps = {step["model"]: step["input_map"] for step in contract.ensemble_steps()}
        # client input -> (model, its input name), wired as NVIDIA's ensemble wires it
        self.to_models = {
            client: (model, name)
            for model in ("preprocessing", "tensorrt_llm")
            for name, client in steps[model].items()
            if not client.startswith("_")
        }
        self.target = p.get("tensorrt_llm_model_name", "tensorrt_llm")
        self.draft = p.get("tensorrt_llm_draft_model_name")
        # the target's positions and longest draft (trtspec's package writes them): a request that cannot
        # fit is refused before it runs, not after the steps it could take
        self.max_seq_len = _int(p.get("trtspec_max_seq_len"))
        self.max_draft_len = _int(p.get("trtspec_max_draft_len"))
        # Without a draft model the BLS only forwards to tensorrt_llm, which counts (MTP speculates there).
        self.metrics = None
        if self.draft:
            self.metrics = SpecMetrics(
                args["model_name"], args["model_version"], "draft-target", self.LONGEST_DRAFT_BUCKET
            )

    def finalize(self) -> None:
        if self.metrics is not None:
            self.metrics.close()

    def _call(
        self, model: str, inputs: dict[str, np.ndarray], outputs: list[str], request_id: str = ""
    ) -> dict[str, np.ndarray]:
        import triton_python_backend_utils as pb_utils

        request = pb_utils.InferenceRequest(
            model_name=model,
            requested_output_names=outputs,
            inputs=[pb_utils.Tensor(name, value) for name, value in inputs.items()],
            request_id=request_id,
        )
        response = request.exec()
        if response.has_error():
            raise RequestError(f"{model}: {response.error().message()}")
        return {name: pb_utils.get_output_tensor_by_name(response, name).as_numpy() for name in outputs}

    def answer(self, request, sender):
        import triton_python_backend_utils as pb_utils

        from trtspec.speculative.requests import Step

        arrival = time.time_ns()
        prompt = utf8(request, "text_input")
        if not prompt:
            raise RequestError("text_input is required and must not be empty")
        if scalar(request, "max_tokens") is None:
            raise RequestError("max_tokens is required")
        max_tokens = number(request, "max_tokens", None, 1, self.max_seq_len or INT32_MAX, integer=True)
        if bool(scalar(request, "stream", False)):
            raise RequestError("streaming is not supported by the BLS model; use the ensemble")
        k = number(request, "num_draft_tokens", 0, 0, INT32_MAX, integer=True)
        if k > 0 and not self.draft:
            raise RequestError("cannot perform speculative decoding without draft model")
        if self.max_draft_len is not None and k > self.max_draft_len:
            raise RequestError(
                f"num_draft_tokens must be an integer in [0, {self.max_draft_len}] (the target engine's "
                f"max_draft_len), got {k}"
            )
        use_logits = bool(scalar(request, "use_draft_logits", False))
        seed = number(request, "seed", None, 0, UINT64_MAX, integer=True)
        forwarded: dict[str, dict[str, np.ndarray]] = {"preprocessing": {}, "tensorrt_llm": {}}
        for name in self.declared:
            if name in self.OWN or not given(request, name):
                continue
            if name not in self.to_models:
                raise RequestError(f"{name} is not supported by trtspec's torch engine")
            model, target_name = self.to_models[name]
            forwarded[model][target_name] = pb_utils.get_input_tensor_by_name(request, name).as_numpy()
        if k > 0 and "min_tokens" in forwarded["tensorrt_llm"]:
            raise RequestError("min_tokens beside num_draft_tokens is refused by the BLS model (NVIDIA's overrides it)")
        for name in ("return_log_probs", "return_context_logits", "return_generation_logits"):
            if bool(scalar(request, name, False)):  # NVIDIA's BLS documents these as unsupported too
                raise RequestError(f"{name} is not supported by the BLS model")
            forwarded["tensorrt_llm"].pop(name, None)
        pre_inputs = {
            **forwarded["preprocessing"],
            "QUERY": np.array([[(prompt or "").encode("utf-8")]], dtype=np.object_),
            "REQUEST_OUTPUT_LEN": np.array([[max_tokens]], dtype=np.int32),
        }
        word_lists = ["STOP_WORDS_IDS", "BAD_WORDS_IDS"]
        pre = self._call("preprocessing", pre_inputs, ["INPUT_ID", "REQUEST_INPUT_LEN", "OUT_END_ID", *word_lists])
        seq = pre["INPUT_ID"][0][: int(pre["REQUEST_INPUT_LEN"].reshape(-1)[0])].tolist()
        n_prompt = len(seq)
        # the longest call the loop can make: the sequence before the last K drafts, K drafts, K + 1 outputs
        need = positions_needed(n_prompt, max_tokens, min(k, max_tokens - 1))
        if self.max_seq_len is not None and need > self.max_seq_len:
            raise RequestError(
                f"prompt ({n_prompt} tokens) + max_tokens ({max_tokens}) + num_draft_tokens "
                f"({min(k, max_tokens - 1)}) need {need} positions, more than max_seq_len {self.max_seq_len}"
            )
        stops = words(pre["STOP_WORDS_IDS"])
        common = {
            **forwarded["tensorrt_llm"],
            "end_id": pre["OUT_END_ID"].reshape(1, 1).astype(np.int32),
            "stop_words_list": pre["STOP_WORDS_IDS"],
            "bad_words_list": pre["BAD_WORDS_IDS"],
        }
        base = seed if seed is not None else secrets.randbits(62)
        scheduled, first = time.time_ns(), 0
        steps: list[Step] = []
        # tensorrt_llm leaves the counting of a request to the BLS when it runs the draft/verify loop
        step_id = (BLS_REQUEST_PREFIX if self.metrics is not None else "") + request.request_id()

        def call(model: str, tokens: list[int], out_len: int, extra: dict, outputs: list[str]) -> dict:
            inputs = {
                "input_ids": np.array([tokens], dtype=np.int32),
                "input_lengths": np.array([[len(tokens)]], dtype=np.int32),
                "request_output_len": np.array([[out_len]], dtype=np.int32),
                "exclude_input_in_output": np.array([[True]]),
                **common,
                **extra,
            }
            return self._call(model, inputs, ["output_ids", "sequence_length", *outputs], step_id)

        while len(seq) - n_prompt < max_tokens:
            remaining = max_tokens - (len(seq) - n_prompt)
            n = min(k, remaining - 1)
            step = len(steps)
            extra: dict[str, np.ndarray] = {"seed": np.array([[(base + 2 * step + 1) % 2**63]], dtype=np.uint64)}
            t0 = time.perf_counter()
            if n > 0:
                d = call(
                    self.draft,
                    seq,
                    n,
                    {
                        "seed": np.array([[(base + 2 * step) % 2**63]], dtype=np.uint64),
                        "return_generation_logits": np.array([[use_logits]]),
                    },
                    ["generation_logits"] if use_logits else [],
                )
                drafts = d["output_ids"][0][0][: int(d["sequence_length"].reshape(-1)[0])].tolist()
                if drafts:
                    extra["draft_input_ids"] = np.array([drafts], dtype=np.int32)
                    if use_logits:
                        extra["draft_logits"] = d["generation_logits"][0][0][: len(drafts)][None].astype(np.float32)
            else:
                drafts = []
            out_len = len(drafts) + 1 if n > 0 else remaining
            t1 = time.perf_counter()
            t = call(self.target, seq, out_len, extra, ["total_accepted_draft_tokens"])
            new = t["output_ids"][0][0][: int(t["sequence_length"].reshape(-1)[0])].tolist()
            m = int(t["total_accepted_draft_tokens"].reshape(-1)[0]) if drafts else 0
            steps.append(Step(len(drafts), m, t1 - t0, time.perf_counter() - t1))
            first = first or time.time_ns()
            seq += new
            if len(new) < (m + 1 if n > 0 else out_len) or (new and ends_with_any(seq, stops)):
                break  # the target stopped at its end token or a stop word
        post = self._call(
            "postprocessing",
            {
                "TOKENS_BATCH": np.array([[seq[n_prompt:]]], dtype=np.int32),
                "SEQUENCE_LENGTH": np.array([[len(seq) - n_prompt]], dtype=np.int32),
            },
            ["OUTPUT"],
        )
        text = post["OUTPUT"].reshape(-1)[0].decode("utf-8")
        if not bool(scalar(request, "exclude_input_in_output", False)):
            text = prompt + text
        last = time.time_ns()
        first = first or last
        if self.metrics is not None:
            self.metrics.record(steps, (first - arrival) / 1e9, len(seq) - n_prompt, (last - first) / 1e9)
        outputs = [pb_utils.Tensor("text_output", np.array([[text.encode("utf-8")]], dtype=np.object_))]
        drafted, accepted = sum(s.drafted for s in steps), sum(s.accepted for s in steps)
        outputs += perf_tensors(arrival, scheduled, first, last, drafted, accepted)
        if bool(scalar(request, "return_num_input_tokens", False)):
            outputs.append(array("num_input_tokens", [[n_prompt]], np.int32))
        if bool(scalar(request, "return_num_output_tokens", False)):
            outputs.append(array("num_output_tokens", [[len(seq) - n_prompt]], np.int32))
        return pb_utils.InferenceResponse(outputs)
