"""trtspec's `tensorrt_llm` python model for the llmapi flavour: TensorRT-LLM's contract, torch runner inside.

The repository's 1/model.py is one line that imports this class, so the logic is versioned with the
package. It reads 1/model.yaml as NVIDIA's llmapi model does (`model`, `speculative_config`,
`triton_config`), honours the same inputs, and answers with the same outputs, including the
return_perf_metrics ones. Requests join the instance's running batch between steps
(`engine_loop`), as TensorRT-LLM's in-flight batcher schedules them; a bad request gets an error
response and the others are not disturbed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import yaml

from trtspec.repository.pb import (
    MAX_TEMPERATURE,
    BatchedPythonModel,
    RequestError,
    decoded,
    first_refused,
    neutral_only,
    number,
    scalar,
    string_tensor,
    utf8,
)

# What this model does with each input NVIDIA's llmapi model declares; any other given input is refused.
HONOURED = frozenset(
    {
        "text_input", "streaming", "sampling_param_temperature", "sampling_param_top_k", "sampling_param_top_p",
        "sampling_param_max_tokens", "sampling_param_stop", "sampling_param_seed",
        "sampling_param_exclude_input_from_output", "sampling_param_return_perf_metrics", "return_finish_reason",
        "return_stop_reason",
    }
)  # fmt: skip
NEUTRAL = {
    "sampling_param_best_of": 1,
    "sampling_param_frequency_penalty": 0.0,
    "sampling_param_presence_penalty": 0.0,
    "return_cumulative_logprob": False,
    "stop": False,
}


def stop_strings(request) -> list[str]:
    import triton_python_backend_utils as pb_utils

    tensor = pb_utils.get_input_tensor_by_name(request, "sampling_param_stop")
    if tensor is None:
        return []
    words = [decoded(w, "sampling_param_stop") for w in tensor.as_numpy().reshape(-1).tolist()]
    return [w for w in words if w]


def cut_at_stop(text: str, stops: list[str]) -> tuple[str, str | None]:
    """The text before the earliest stop string (the LLM API leaves the stop string out), and which one."""
    hits = [(text.find(s), s) for s in stops if s in text]
    if not hits:
        return text, None
    at, word = min(hits)
    return text[:at], word


class TorchLLMAPIModel(BatchedPythonModel):
    def initialize(self, args: dict[str, str]) -> None:
        import triton_python_backend_utils as pb_utils
        from transformers import AutoTokenizer

        from trtspec.repository.engine_loop import EngineLoop
        from trtspec.repository.serving import decoding_mode, engine_from_model_yaml
        from trtspec.repository.spec_metrics import SpecMetrics

        here = Path(args["model_repository"]) / args["model_version"]
        self.options = yaml.safe_load((here / "model.yaml").read_text(encoding="utf-8"))
        self.decoupled = bool(self.options.get("triton_config", {}).get("decoupled", False))
        defaults: dict = {}

        def build():  # on the engine thread: see engine_loop
            engine, found = engine_from_model_yaml(self.options, engines_dir=here)
            defaults.update(found)
            return engine

        self.loop = EngineLoop(build, log_error=pb_utils.Logger.log_error)
        self.engine, self.defaults = self.loop.engine, defaults
        self.tokenizer = AutoTokenizer.from_pretrained(self.options["model"])
        self.max_seq_len = self.engine.capacity
        self.vocab_size = self.engine.target.dims.vocab_size
        mode = decoding_mode(self.options)
        self.metrics = SpecMetrics(args["model_name"], args["model_version"], mode, self.engine.num_draft_tokens)
        self.metrics.start(len(self.engine.rows) * self.engine.capacity)
        self.declared = [t["name"] for t in json.loads(args["model_config"]).get("input", [])]
        self.loop.on_step = self.metrics.batch

    def _params(self, request):
        from trtspec.speculative.requests import SamplingParams
        from trtspec.speculative.runner import GenerationParams

        d = self.defaults
        max_tokens = number(
            request, "sampling_param_max_tokens", int(d["max_tokens"]), 1, self.max_seq_len, integer=True
        )
        temperature = number(request, "sampling_param_temperature", float(d["temperature"]), 0, MAX_TEMPERATURE)
        top_k = number(request, "sampling_param_top_k", int(d["top_k"]), 0, self.vocab_size, integer=True)
        top_p = number(request, "sampling_param_top_p", float(d["top_p"]), 0, 1, open_low=True)
        seed = number(request, "sampling_param_seed", d["seed"], 0, 2**64 - 1, integer=True)
        stop = [self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else []
        return GenerationParams(
            max_tokens=max_tokens,
            sampling=SamplingParams(temperature, top_k, top_p),
            stop_token_ids=frozenset(stop),
            seed=None if seed is None else int(seed),  # a default from model.yaml may be None
        )

    def submit(self, request, sender) -> None:
        import triton_python_backend_utils as pb_utils

        from trtspec.repository.engine_loop import Stream
        from trtspec.speculative.batch import Sequence

        arrival = time.time_ns()
        refused = first_refused(request, self.declared, HONOURED, NEUTRAL)
        if refused is not None:
            raise RequestError(neutral_only(refused, NEUTRAL))
        prompt = utf8(request, "text_input")
        if prompt is None or prompt == "":
            raise RequestError("text_input is required and must not be empty")
        stops = stop_strings(request)
        hold = max((len(s) for s in stops), default=1) - 1  # streamed text that may still begin a stop string
        params = self._params(request)
        ids = self.tokenizer(prompt).input_ids
        if self.engine.positions_needed(len(ids), params) > self.max_seq_len:
            raise RequestError(
                f"prompt ({len(ids)} tokens) + sampling_param_max_tokens ({params.max_tokens}) exceed "
                f"max_seq_len {self.max_seq_len}"
            )
        streaming = bool(scalar(request, "streaming", False))
        if streaming and not self.decoupled:
            raise RequestError("Streaming is only supported in decoupled mode.")
        exclude_input = bool(scalar(request, "sampling_param_exclude_input_from_output", True))
        perf = bool(scalar(request, "sampling_param_return_perf_metrics", False))
        want_reason = bool(scalar(request, "return_finish_reason", False))
        want_stop_reason = bool(scalar(request, "return_stop_reason", False))
        sent = [0, 0]  # characters of text already streamed, time of first token
        stopped: list[str | None] = [None]

        def emit(_new: list[int]) -> None:  # on the responder thread, off the engine's steps
            shown = self.tokenizer.decode(stream.items[: stream.sent], skip_special_tokens=True)
            text, word = cut_at_stop(shown, stops)
            if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence waits for more
                return
            safe = len(text) if word else max(sent[0], len(text) - hold)
            if safe > sent[0]:
                chunk, sent[0] = text[sent[0] : safe], safe
                sender.send(pb_utils.InferenceResponse([string_tensor("text_output", chunk)]))

        stream = Stream(self.loop, emit)
        tokens = stream.items  # the one copy of the output so far: streamed from, and checked for stops

        def on_tokens(new: list[int]) -> bool:
            if not sent[1]:
                sent[1] = time.time_ns()
            if streaming:
                stream.push(new)
            elif stops:
                tokens.extend(new)
            if stops:  # only a stop string needs the text on the engine thread: it ends the row now
                stopped[0] = cut_at_stop(self.tokenizer.decode(tokens, skip_special_tokens=True), stops)[1]
            return stopped[0] is not None

        def done(seq: Sequence, error: str | None) -> None:
            final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            if error is not None:
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(error)), flags=final)
                return
            generation = seq.result
            last = time.time_ns()
            first = sent[1] or last
            n = len([t for t in generation.tokens if t not in params.stop_token_ids])
            self.metrics.record(generation.stats.step_log, (first - arrival) / 1e9, n, (last - first) / 1e9)
            if generation.finish_reason == "cancelled":
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("request cancelled")), flags=final)
                return
            text, stop_word = cut_at_stop(self.tokenizer.decode(generation.tokens, skip_special_tokens=True), stops)
            outputs = [string_tensor("text_output", text[sent[0] :] if streaming else text)]
            if not streaming and not exclude_input:
                outputs = [string_tensor("text_output", prompt + text)]
            if want_reason:
                outputs.append(string_tensor("finish_reason", "stop" if stop_word else generation.finish_reason))
            if want_stop_reason:
                outputs.append(string_tensor("stop_reason", str(stop_word)))
            if perf:
                s = generation.stats
                outputs += [
                    pb_utils.Tensor("acceptance_rate", np.array([s.acceptance_rate], dtype=np.float32)),
                    pb_utils.Tensor("total_accepted_draft_tokens", np.array([s.accepted_tokens], dtype=np.int32)),
                    pb_utils.Tensor("total_draft_tokens", np.array([s.draft_tokens], dtype=np.int32)),
                    pb_utils.Tensor("arrival_time_ns", np.array([arrival], dtype=np.int64)),
                    pb_utils.Tensor("first_scheduled_time_ns", np.array([seq.admitted_ns or arrival], dtype=np.int64)),
                    pb_utils.Tensor("first_token_time_ns", np.array([first], dtype=np.int64)),
                    pb_utils.Tensor("last_token_time_ns", np.array([last], dtype=np.int64)),
                ]
            sender.send(pb_utils.InferenceResponse(outputs), flags=final)

        seq = Sequence(ids, params, on_tokens=on_tokens)
        self.loop.submit(seq, done, is_cancelled=request.is_cancelled)

    def finalize(self) -> None:
        self.loop.close()
        self.metrics.close()
        self.engine = None
