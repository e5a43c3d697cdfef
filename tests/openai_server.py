"""A small OpenAI-compatible server for tests and benchmarks (not part of the product).

`--checkpoint DIR`: the embedded model through trtspec's runner, streaming each decoding step as
one SSE chunk with `usage` (vLLM's continuous_usage_stats), honouring max_tokens, min_tokens,
ignore_eos, temperature and seed. `--trivial`: no model, streams `max_tokens` one-token chunks as
fast as it can (for measuring the client). `--fail-after N`: every request after the N-th gets an
error object inside a 200 stream, as a failing server sends it.

    python tests/openai_server.py --port 9000 --checkpoint trtspec/assets/tiny-target
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from pathlib import Path

from aiohttp import web


def sse(data: dict | str) -> bytes:
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()


class Backend:
    def __init__(self, checkpoint: str | None, draft: str | None, k: int) -> None:
        self.runner = self.tokenizer = None
        self.lock = threading.Lock()
        if checkpoint:
            from transformers import AutoTokenizer

            from trtspec.speculative.factory import load_runner

            mode = "draft-target" if draft else "none"
            self.runner = load_runner(
                Path(checkpoint), mode, Path(draft) if draft else None, num_draft_tokens=k, max_len=512
            )
            self.tokenizer = AutoTokenizer.from_pretrained(checkpoint)

    def generate(self, prompt: str, body: dict, emit) -> int:
        from trtspec.speculative.requests import SamplingParams
        from trtspec.speculative.runner import GenerationParams

        ids = self.tokenizer(prompt).input_ids
        eos = self.tokenizer.eos_token_id
        stops = frozenset() if body.get("ignore_eos") else frozenset([eos])
        params = GenerationParams(
            max_tokens=int(body.get("max_tokens", 16)),
            sampling=SamplingParams(float(body.get("temperature", 1.0))),
            stop_token_ids=stops,
            seed=body.get("seed"),
        )
        produced = [0]

        def on_tokens(_row: int, new: list[int]) -> None:
            produced[0] += len(new)
            emit(self.tokenizer.decode(new, skip_special_tokens=True), produced[0])

        with self.lock:
            self.runner.generate([ids], params, on_tokens=on_tokens)
        return produced[0]


def make_app(backend: Backend, fail_after: int | None) -> web.Application:
    served = [0]

    async def handle(request: web.Request) -> web.StreamResponse:
        chat = request.path.endswith("/chat/completions")
        try:
            body = await request.json()
        except ValueError:
            return web.json_response({"error": {"message": "invalid JSON"}}, status=400)
        prompt = body["messages"][-1]["content"] if chat else body.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            return web.json_response({"error": {"message": "prompt is required"}}, status=400)
        served[0] += 1
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if fail_after is not None and served[0] > fail_after:
            await response.write(sse({"error": {"message": "engine failed", "type": "InternalServerError"}}))
            return response

        def chunk(text: str, total: int) -> dict:
            choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
            return {"object": "chat.completion.chunk" if chat else "text_completion", "choices": [choice],
                    "usage": {"completion_tokens": total}}  # fmt: skip

        if backend.runner is None:  # trivial: one token per chunk, as fast as the loop goes
            for i in range(int(body.get("max_tokens", 16))):
                await response.write(sse(chunk("a", i + 1)))
            await response.write(sse("[DONE]"))
            return response
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def emit(text: str, total: int) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (text, total))

        def work() -> None:
            total = backend.generate(prompt, body, emit)
            loop.call_soon_threadsafe(queue.put_nowait, (None, total))

        threading.Thread(target=work, daemon=True).start()
        while True:
            text, total = await queue.get()
            if text is None:
                break
            await response.write(sse(chunk(text, total)))
        final = {"object": "text_completion", "choices": [], "usage": {"completion_tokens": total}}
        await response.write(sse(final))
        await response.write(sse("[DONE]"))
        return response

    app = web.Application()
    app.router.add_post("/v1/completions", handle)
    app.router.add_post("/v1/chat/completions", handle)
    app.router.add_get("/health", lambda _r: web.Response(text="ok"))
    return app


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--checkpoint")
    ap.add_argument("--draft")
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--trivial", action="store_true")
    ap.add_argument("--fail-after", type=int)
    args = ap.parse_args()
    backend = Backend(None if args.trivial else args.checkpoint, args.draft, args.k)
    started = time.time()
    print(f"ready after {time.time() - started:.1f}s", flush=True)
    web.run_app(make_app(backend, args.fail_after), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
