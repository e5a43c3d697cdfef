"""LLM, SamplingParams and RequestOutput with the LLM API's interface, generating with trtspec's runner.

Requests run one at a time on a worker thread (the runner is not re-entrant); the asyncio side sees
the LLM API's shape: `generate_async` returns an async iterator of RequestOutput, streamed outputs
carry the text so far, the last one has `finished` set.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any


@dataclass
class SamplingParams:
    max_tokens: int = 32
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    best_of: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: Any = None
    exclude_input_from_output: bool = True
    return_perf_metrics: bool = False

    def __post_init__(self) -> None:
        if self.best_of not in (None, 1):
            raise ValueError("best_of > 1 is not supported by the stand-in")
        if self.frequency_penalty or self.presence_penalty:
            raise ValueError("penalties are not supported by the stand-in")
        if self.stop is not None:
            self.stop = [s.decode() if isinstance(s, bytes) else str(s) for s in list(self.stop)]


@dataclass
class KvCacheMetrics:
    num_total_allocated_blocks: int = 0
    num_new_allocated_blocks: int = 0
    num_reused_blocks: int = 0
    num_missed_blocks: int = 0
    kv_cache_hit_rate: float = 0.0


@dataclass
class TimingMetrics:
    arrival_time: timedelta
    first_scheduled_time: timedelta
    first_token_time: timedelta
    last_token_time: timedelta


@dataclass
class SpeculativeDecodingMetrics:
    acceptance_rate: float
    total_accepted_draft_tokens: int
    total_draft_tokens: int


@dataclass
class RequestPerfMetrics:
    timing_metrics: TimingMetrics
    kv_cache_metrics: KvCacheMetrics
    speculative_decoding: SpeculativeDecodingMetrics


@dataclass
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: str | None = None
    request_perf_metrics: RequestPerfMetrics | None = None


@dataclass
class RequestOutput:
    request_id: int
    prompt: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = False


def _since_epoch(ns: int) -> timedelta:
    return timedelta(microseconds=ns / 1000)


class _Stream:
    """The async iterator generate_async returns."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True

    def __aiter__(self):
        return self

    async def __anext__(self) -> RequestOutput:
        item = await self.queue.get()
        if item is None:
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            raise item
        return item


class LLM:
    def __init__(self, model: str, **options: Any) -> None:
        from transformers import AutoTokenizer

        from trtspec.repository.serving import runner_from_model_yaml

        self.runner, self.defaults = runner_from_model_yaml({"model": model, **options})
        self.tokenizer = AutoTokenizer.from_pretrained(Path(model))
        self.lock = threading.Lock()
        self.next_id = 0

    def shutdown(self) -> None:
        self.runner = None

    def generate_async(self, prompt: str, sampling_params: SamplingParams, streaming: bool = False) -> _Stream:
        stream = _Stream()
        loop = asyncio.get_running_loop()
        self.next_id += 1
        request_id = self.next_id
        threading.Thread(
            target=self._run, args=(loop, stream, request_id, prompt, sampling_params, streaming), daemon=True
        ).start()
        return stream

    def _run(self, loop, stream: _Stream, request_id: int, prompt: str, sp: SamplingParams, streaming: bool) -> None:
        def put(item) -> None:
            loop.call_soon_threadsafe(stream.queue.put_nowait, item)

        try:
            for output in self._generate(request_id, prompt, sp, streaming):
                if stream.aborted:
                    break
                if streaming or output.finished:
                    put(output)
                if output.finished:
                    break
        except Exception as exc:  # the LLM API raises out of the iterator
            put(exc)
        put(None)

    def _generate(self, request_id: int, prompt: str, sp: SamplingParams, streaming: bool):
        from trtspec.speculative.requests import SamplingParams as RunnerSampling
        from trtspec.speculative.runner import GenerationParams

        d = self.defaults
        ids = self.tokenizer(prompt).input_ids
        eos = self.tokenizer.eos_token_id
        params = GenerationParams(
            max_tokens=int(sp.max_tokens),
            sampling=RunnerSampling(
                float(d["temperature"] if sp.temperature is None else sp.temperature),
                int(d["top_k"] if sp.top_k is None else sp.top_k),
                float(d["top_p"] if sp.top_p is None else sp.top_p),
            ),
            stop_token_ids=frozenset([eos] if eos is not None else []),
            seed=None if sp.seed is None else int(sp.seed),
        )
        prefix = "" if sp.exclude_input_from_output else prompt
        chunks: list[list[int]] = []
        arrival = time.time_ns()
        first = [0]
        pieces: queue.Queue = queue.Queue()

        def on_tokens(_row: int, new: list[int]) -> None:
            first[0] = first[0] or time.time_ns()
            pieces.put(list(new))

        result: dict[str, Any] = {}

        def work() -> None:
            try:
                with self.lock:
                    result["generation"] = self.runner.generate([ids], params, on_tokens=on_tokens)[0]
            except Exception as exc:
                result["error"] = exc
            pieces.put(None)

        threading.Thread(target=work, daemon=True).start()
        while (new := pieces.get()) is not None:
            chunks.append(new)
            if streaming:
                yield self._output(request_id, prompt, ids, prefix, chunks, sp, finished=False)
        if "error" in result:
            raise result["error"]
        g = result["generation"]
        last = time.time_ns()
        output = self._output(request_id, prompt, ids, prefix, [g.tokens], sp, finished=True, reason=g.finish_reason)
        if sp.return_perf_metrics:
            s = g.stats
            output.outputs[0].request_perf_metrics = RequestPerfMetrics(
                TimingMetrics(_since_epoch(arrival), _since_epoch(arrival), _since_epoch(first[0] or last),
                              _since_epoch(last)),
                KvCacheMetrics(),
                SpeculativeDecodingMetrics(s.acceptance_rate, s.accepted_tokens, s.draft_tokens),
            )  # fmt: skip
        yield output

    def _output(self, request_id, prompt, ids, prefix, chunks, sp, finished, reason=None) -> RequestOutput:
        eos = self.tokenizer.eos_token_id
        tokens = [t for chunk in chunks for t in chunk if t != eos]
        text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        stop_reason = None
        for word in sp.stop or []:
            at = text.find(word)
            if word and at >= 0:
                # include_stop_str_in_output defaults to False in the LLM API's SamplingParams
                text, stop_reason, finished, reason = text[:at], word, True, "stop"
                break
        done = CompletionOutput(0, prefix + text, tokens, finish_reason=reason if finished else None,
                                stop_reason=stop_reason)  # fmt: skip
        return RequestOutput(request_id, prompt, ids, [done], finished=finished)
