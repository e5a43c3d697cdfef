"""Hostile request inputs on a real tritonserver: every refusal is one line, names the input, and shows
no traceback or server path; the server keeps serving after each.

One module-scoped server per flavour (test_serve_e2e's `servers` fixture): the llmapi model (decoupled:
HTTP generate, SSE and gRPC streams) and the engine flavour's draft-target repository (the BLS, the
ensemble, and tensorrt_llm / tensorrt_llm_draft / preprocessing called directly).
"""

from __future__ import annotations

import json
import math
import queue
import re

import numpy as np
import pytest
import test_serve_e2e as e2e
from conftest import REPO
from test_serve_e2e import PROMPT, Served, generate, post

from trtspec.serve.locate import find_tritonserver

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_tritonserver() is None, reason="no tritonserver (install the server extra)"),
]
servers = e2e.servers  # its module-scoped servers, started on demand: one per flavour here
LLMAPI, ENGINE = "llmapi-draft-target", "engine-draft-target"
BAD = [math.nan, math.inf, -1, 10**12]
BAD_IDS = ["nan", "inf", "-1", "1e12"]
SERVER_PATH = re.compile(r"(/[\w.+-]+){2,}|\.py\b")


def clean(message: str, name: str | None = None) -> None:
    """A one-line refusal naming `name`, with nothing of the server's code or files in it."""
    assert message, "no error message"
    assert "\n" not in message.strip(), message
    assert "Traceback" not in message and 'File "' not in message, message
    assert not SERVER_PATH.search(message), message
    if name is not None:
        assert name in message, (name, message)


def json_body(body: dict) -> bytes:
    """JSON with NaN / Infinity literals where a float is not finite (Python's json writes them)."""
    return json.dumps(body).encode()


def http_error(served: Served, body: dict, model: str | None = None) -> str:
    status, answer = post(served, "generate", json_body(body), model=model)
    assert status >= 400 and "error" in answer, (body, answer)
    return answer["error"]


def sse_error(served: Served, body: dict) -> str:
    _, text = post(served, "generate_stream", json_body(body))
    events = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
    events += [json.loads(text)] if text.startswith("{") else []  # refused before streaming began
    errors = [e["error"] for e in events if "error" in e]
    assert errors and not any("text_output" in e for e in events), (body, text)
    return errors[0]


GRPC_TYPES = {
    "FP32": np.float32, "INT32": np.int32, "UINT64": np.uint64, "BOOL": bool, "BYTES": np.object_,
}  # fmt: skip


def grpc_error(served: Served, model: str, tensors: dict[str, tuple[str, object]], batched: bool) -> str:
    """Sends `tensors` (name -> (Triton type, value)) over gRPC, streaming for a decoupled model."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    inputs = []
    for name, (dtype, value) in tensors.items():
        data = np.array(value, dtype=GRPC_TYPES[dtype])
        data = data.reshape([1, -1] if batched else [-1])
        inputs.append(grpcclient.InferInput(name, list(data.shape), dtype).set_data_from_numpy(data))
    client = grpcclient.InferenceServerClient(served.grpc)
    try:
        if served.decoupled and model == served.model:
            results: queue.Queue = queue.Queue()
            client.start_stream(callback=lambda result, error: results.put((result, error)))
            client.async_stream_infer(model, inputs, enable_empty_final_response=True)
            while True:
                result, error = results.get(timeout=120)
                if error is not None:
                    client.stop_stream()
                    return str(error.message() if hasattr(error, "message") else error)
                assert result.as_numpy("text_output") is None, "text before the refusal"
                assert not result.get_response().parameters["triton_final_response"].bool_param, "no error"
        try:
            client.infer(model, inputs)
        except InferenceServerException as exc:
            return exc.message()
        raise AssertionError(f"{model} accepted {tensors}")
    finally:
        client.close()


def still_serves(served: Served) -> None:
    assert generate(served, max_tokens=4)["text_output"]


def grpc_type(value) -> str:
    return "FP32" if isinstance(value, float) else "INT32"


# Every numeric input each model declares and reads, with its Triton type. A non-finite value into an
# integer input over HTTP is refused by Triton's JSON parser before any model sees it (a one-line error
# that cannot name the input); everything else reaches the model, which names the input and its range.
LLMAPI_NUMBERS = {
    "sampling_param_temperature": "FP32",
    "sampling_param_top_k": "INT32",
    "sampling_param_top_p": "FP32",
    "sampling_param_max_tokens": "INT32",
    "sampling_param_best_of": "INT32",
    "sampling_param_frequency_penalty": "FP32",
    "sampling_param_presence_penalty": "FP32",
}
ENGINE_NUMBERS = {  # the client's names, as the BLS and the ensemble take them
    "max_tokens": "INT32",
    "temperature": "FP32",
    "top_k": "INT32",
    "top_p": "FP32",
    "min_tokens": "INT32",
    "beam_width": "INT32",
    "length_penalty": "FP32",
    "repetition_penalty": "FP32",
    "presence_penalty": "FP32",
    "frequency_penalty": "FP32",
    "num_return_sequences": "INT32",
}


# values inside an input's range: a negative length penalty is one (with no effect at beam width 1)
VALID = {("length_penalty", -1)}


def http_refusal(served: Served, name: str, dtype: str, value, model: str | None = None) -> None:
    extra = {name: value}
    if model == "ensemble":
        extra["num_draft_tokens"] = None
    body = {k: v for k, v in served.body(max_tokens=4, extra=extra).items() if v is not None}
    if (name, value) in VALID:
        status, answer = post(served, "generate", body, model=model)
        assert status == 200 and answer["text_output"], answer
        return
    reaches_model = dtype == "FP32" or isinstance(value, int)
    clean(http_error(served, body, model=model), name if reaches_model else None)
    if served.decoupled:  # the same refusal as a server-sent event
        clean(sse_error(served, {**body, "streaming": True}), name if reaches_model else None)
    still_serves(served)


@pytest.mark.parametrize("value", BAD, ids=BAD_IDS)
@pytest.mark.parametrize("name", list(LLMAPI_NUMBERS))
def test_llmapi_refuses_bad_numbers_in_one_line(servers, name, value):
    http_refusal(servers(LLMAPI), name, LLMAPI_NUMBERS[name], value)


@pytest.mark.parametrize("value", BAD, ids=BAD_IDS)
@pytest.mark.parametrize("name", list(ENGINE_NUMBERS))
@pytest.mark.parametrize("model", ["tensorrt_llm_bls", "ensemble"])
def test_engine_flavour_refuses_bad_numbers_in_one_line(servers, model, name, value):
    http_refusal(servers(ENGINE), name, ENGINE_NUMBERS[name], value, model=model)


@pytest.mark.parametrize("value", BAD, ids=BAD_IDS)
def test_bls_refuses_num_draft_tokens_out_of_range(servers, value):
    """num_draft_tokens beyond the target engine's max_draft_len is an error naming the range, not capped."""
    served = servers(ENGINE)
    message = http_error(served, served.body(max_tokens=4, extra={"num_draft_tokens": value}))
    clean(message, None if isinstance(value, float) else "num_draft_tokens")
    if value == 10**12 or value == -1:
        assert "[0, " in message, message
    status, answer = post(served, "generate", served.body(max_tokens=4, extra={"num_draft_tokens": 1000000}))
    assert status >= 400 and "max_draft_len" in answer["error"], answer
    clean(answer["error"], "num_draft_tokens")
    still_serves(served)


def test_seed_is_any_uint64(servers):
    """Every UINT64 is a seed: a huge one serves; a negative or non-finite one is refused in one line."""
    for served in (servers(LLMAPI), servers(ENGINE)):
        name = "sampling_param_seed" if served.flavour == "llmapi" else "seed"
        assert generate(served, max_tokens=4, extra={name: 10**12})["text_output"]
        assert generate(served, max_tokens=4, extra={name: 2**64 - 1})["text_output"]
        for value in (-1, math.nan, math.inf):
            clean(http_error(served, served.body(max_tokens=4, extra={name: value})))
        still_serves(served)


def grpc_value(dtype: str, value):
    """`value` as the gRPC client can send it in `dtype`; 10**12 becomes the type's largest value."""
    if dtype == "FP32":
        return float(value)
    if isinstance(value, float):
        return None  # NaN and infinities have no integer encoding
    return min(value, 2**31 - 1)


LLMAPI_GRPC = [(n, t, v) for n, t in LLMAPI_NUMBERS.items() for v in BAD if grpc_value(t, v) is not None]
ENGINE_GRPC = [
    (n, t, v) for n, t in ENGINE_NUMBERS.items() for v in BAD if grpc_value(t, v) is not None and (n, v) not in VALID
]


def grpc_body(served: Served, extra: dict[str, tuple[str, object]]) -> dict[str, tuple[str, object]]:
    types = {str: "BYTES", bool: "BOOL", int: "INT32"}
    body = {k: (types[type(v)], v.encode() if isinstance(v, str) else v) for k, v in served.body(max_tokens=4).items()}
    if served.decoupled:
        body["streaming"] = ("BOOL", True)
    return {**body, **extra}


@pytest.mark.parametrize(("name", "dtype", "value"), LLMAPI_GRPC, ids=[f"{n}-{v}" for n, _, v in LLMAPI_GRPC])
def test_llmapi_grpc_stream_refuses_bad_numbers_in_one_line(servers, name, dtype, value):
    served = servers(LLMAPI)
    tensors = grpc_body(served, {name: (dtype, grpc_value(dtype, value))})
    clean(grpc_error(served, served.model, tensors, batched=False), name)
    still_serves(served)


@pytest.mark.parametrize(("name", "dtype", "value"), ENGINE_GRPC, ids=[f"{n}-{v}" for n, _, v in ENGINE_GRPC])
def test_bls_grpc_refuses_bad_numbers_in_one_line(servers, name, dtype, value):
    served = servers(ENGINE)
    tensors = grpc_body(served, {name: (dtype, grpc_value(dtype, value))})
    clean(grpc_error(served, served.model, tensors, batched=True), name)
    still_serves(served)


def engine_call(tokens: list[int], **extra: tuple[str, object]) -> dict[str, tuple[str, object]]:
    return {
        "input_ids": ("INT32", tokens),
        "input_lengths": ("INT32", [len(tokens)]),
        "request_output_len": ("INT32", [4]),
        **extra,
    }


# tensorrt_llm, tensorrt_llm_draft and preprocessing called directly, as the BLS and the ensemble call them
DIRECT = {
    "temperature-nan": ("tensorrt_llm", engine_call([1, 2, 3], temperature=("FP32", math.nan)), "temperature"),
    "temperature-inf": ("tensorrt_llm_draft", engine_call([1, 2, 3], temperature=("FP32", math.inf)), "temperature"),
    "top_p-nan": ("tensorrt_llm", engine_call([1, 2, 3], runtime_top_p=("FP32", math.nan)), "runtime_top_p"),
    "top_k-huge": ("tensorrt_llm", engine_call([1, 2, 3], runtime_top_k=("INT32", 2**31 - 1)), "runtime_top_k"),
    "output-len-negative": (
        "tensorrt_llm",
        engine_call([1, 2, 3], request_output_len=("INT32", [-1])),
        "request_output_len",
    ),
    "output-len-huge": (
        "tensorrt_llm_draft",
        engine_call([1, 2, 3], request_output_len=("INT32", [2**31 - 1])),
        "request_output_len",
    ),
    "output-len-past-the-room": (  # 3 + 508 fit 512 positions; with the bonus and the step's room they do not
        "tensorrt_llm",
        engine_call([1, 2, 3], request_output_len=("INT32", [508])),
        "request_output_len",
    ),
    "min-tokens-negative": ("tensorrt_llm", engine_call([1, 2, 3], min_tokens=("INT32", -1)), "min_tokens"),
    "input-lengths-zero": ("tensorrt_llm", engine_call([1, 2, 3], input_lengths=("INT32", [0])), "input_lengths"),
    "token-id-outside-vocab": ("tensorrt_llm", engine_call([1, 2, 10**9]), "input_ids"),
    "token-id-negative": ("tensorrt_llm_draft", engine_call([1, -5, 3]), "input_ids"),
    "draft-id-outside-vocab": (
        "tensorrt_llm",
        engine_call([1, 2, 3], draft_input_ids=("INT32", [10**9])),
        "draft_input_ids",
    ),
    "draft-logits-nan": (
        "tensorrt_llm",
        engine_call([1, 2, 3], draft_input_ids=("INT32", [4]), draft_logits=("FP32", "nan-logits")),
        "draft_logits",
    ),
    "length-penalty-nan": ("tensorrt_llm", engine_call([1, 2, 3], len_penalty=("FP32", math.nan)), "len_penalty"),
    "preprocessing-max-tokens": (
        "preprocessing",
        {"QUERY": ("BYTES", [PROMPT.encode()]), "REQUEST_OUTPUT_LEN": ("INT32", [-3])},
        "max_tokens",
    ),
}


@pytest.mark.parametrize("case", list(DIRECT))
def test_engine_models_called_directly_refuse_in_one_line(servers, case):
    """A bad value fails its own request up front: none reaches the batch engine, where it would fail the
    step of every request in flight."""
    served = servers(ENGINE)
    model, tensors, name = DIRECT[case]
    if ("FP32", "nan-logits") in tensors.values():
        target = served.config.parent / "engines" / ENGINE / "target" / "config.json"
        vocab = json.loads(target.read_text())["vocab_size"]  # the tiny target's
        tensors = {**tensors, "draft_logits": ("FP32", [[math.nan] * vocab])}
    clean(grpc_error(served, model, tensors, batched=True), name)
    still_serves(served)


@pytest.mark.parametrize("key", [LLMAPI, ENGINE])
def test_text_input_that_is_not_utf8_is_refused_in_one_line(servers, key):
    served = servers(key)
    tensors = grpc_body(served, {"text_input": ("BYTES", b"\xff\xfe not utf-8")})
    message = grpc_error(served, served.model, tensors, batched=served.flavour != "llmapi")
    clean(message, "text_input")
    assert "UTF-8" in message, message
    still_serves(served)


def test_bls_refuses_a_request_over_the_sequence_limit_before_generating(servers):
    """max_tokens past the target's positions is refused at once, in one line, as the llmapi model does."""
    import time

    served = servers(ENGINE)
    for max_tokens in (100000, 505):  # past max_seq_len 512; inside it, but not with the prompt and drafts
        started = time.monotonic()
        message = http_error(served, served.body(max_tokens=max_tokens))
        assert time.monotonic() - started < 10, message
        clean(message, "max_tokens")
        assert "512" in message, message
    still_serves(served)


# --- trtspec bench: a run whose requests did not all complete says so and exits 1 ---

TOKENIZER = str(REPO / "trtspec" / "assets" / "tiny-target")


@pytest.fixture(scope="module")
def flaky_openai():
    """An OpenAI-compatible stand-in whose model name says how it answers: `ok` streams four chunks;
    `flaky` also answers every third request with an error event and hangs on the one after it."""
    import http.server
    import threading

    release = threading.Event()
    count = [0]
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            with lock:
                count[0] += 1
                n = count[0]
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            if body["model"] == "flaky" and n % 3 == 1:
                self._event({"error": {"message": "model exploded"}})
                return
            if body["model"] == "flaky" and n % 3 == 2:
                release.wait(60)  # never answers while the run lasts
                return
            for i in range(4):
                self._event({"choices": [{"text": "a"}], "usage": {"completion_tokens": i + 1}})
            self.wfile.write(b"data: [DONE]\n\n")

        def _event(self, data: dict) -> None:
            self.wfile.write(f"data: {json.dumps(data)}\n\n".encode())
            self.wfile.flush()

        def log_message(self, *_args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"openai://127.0.0.1:{server.server_port}"
    release.set()
    server.shutdown()


def bench(runner, target: str, out, *args: str):
    from trtspec.cli import cli

    common = ["--tokenizer", TOKENIZER, "--max-tokens", "4", "--warmup", "0", "--concurrency", "2", "--out", str(out)]
    return runner.invoke(cli, ["bench", target, *common, *args])


def lines_with(output: str, word: str) -> list[str]:
    return [line for line in output.splitlines() if word in line]


def test_bench_with_failed_requests_says_so_in_one_line_and_exits_1(flaky_openai, runner, tmp_path):
    """A count-bounded level means every request to complete: an error or a timeout fails the run."""
    out = tmp_path / "run"
    result = bench(runner, f"{flaky_openai}/flaky", out, "--num-requests", "6", "--timeout", "2")
    assert result.exit_code == 1, result.output
    said = lines_with(result.output, "measured requests failed")
    assert len(said) == 1 and "4 of 6" in said[0] and "model exploded" in said[0], result.output
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    done = [r for r in records if r["error"] is None]
    assert len(records) == 6 and len(done) == 2 and all(r["text"] == "aaaa" for r in done)
    assert sorted({r["error"] for r in records if r["error"]}) == ["model exploded", "timeout after 2s"]
    target = json.loads((out / "summary.json").read_text())["levels"][0]["targets"]["A"]
    assert (target["completed"], target["failed"], target["cancelled_at_end"]) == (2, 4, 0)


def test_bench_counts_requests_cut_at_a_timed_levels_end_apart(flaky_openai, runner, tmp_path):
    """A duration-bounded level cancels what still runs after --grace, by design: counted apart and said
    in one line; only the requests that failed otherwise (here the error events) fail the run."""
    out = tmp_path / "timed"
    result = bench(runner, f"{flaky_openai}/flaky", out, "--duration", "1", "--grace", "0.5")
    target = json.loads((out / "summary.json").read_text())["levels"][0]["targets"]["A"]
    assert target["cancelled_at_end"] >= 1 and target["failed"] > target["cancelled_at_end"], target
    said = lines_with(result.output, "cancelled")
    assert len(said) == 1 and f"{target['cancelled_at_end']} requests" in said[0], result.output
    assert result.exit_code == 1 and len(lines_with(result.output, "measured requests failed")) == 1
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert sum(r["error"] is None for r in records) == target["completed"] > 0
    # nothing but the cut: the run passes, and says what was cut
    clean_out = tmp_path / "timed-ok"
    result = bench(runner, f"{flaky_openai}/ok", clean_out, "--duration", "0.5", "--grace", "0")
    target = json.loads((clean_out / "summary.json").read_text())["levels"][0]["targets"]["A"]
    assert target["failed"] == target["cancelled_at_end"], target
    assert result.exit_code == 0, result.output
