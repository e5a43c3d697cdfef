"""Repositories of the embedded pair on a real tritonserver (the nvidia-pytriton wheel's).

Both flavours for draft-target, MTP and baseline, the llmapi flavour for EAGLE-3 (the head built beside the
target) and the engine flavour for Medusa and lookahead (which TensorRT-LLM serves from compiled engines only):
each is built and packaged with the CLI, served by
`trtspec serve --detach`, queried over HTTP generate, HTTP generate_stream (SSE) and gRPC streaming,
and stopped with `trtspec serve --stop`. The servers stay up together until the module ends, so the
speculative and baseline repositories are also checked side by side.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import numpy as np
import pytest
import yaml
from conftest import CONFIGS

from trtspec.bench.server_metrics import SpecCounters, scrape, total
from trtspec.config import load_config
from trtspec.modes import get_mode
from trtspec.repository import spec_metrics
from trtspec.serve.locate import find_tritonserver
from trtspec.serve.server import free_ports

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_tritonserver() is None, reason="no tritonserver (install the server extra)"),
]
PROMPT = "ROMEO:\nBut soft, what light"
REPOS = {
    "llmapi-draft-target": ("tiny-draft-target.yaml", {}),
    "llmapi-mtp": ("tiny-mtp.yaml", {}),
    "llmapi-eagle3": ("tiny-eagle3.yaml", {}),  # the head in the build's draft folder, named by model.yaml
    "llmapi-baseline": ("tiny-baseline.yaml", {}),
    "engine-draft-target": ("tiny-draft-target.yaml", {"flavour": "engine", "streaming": False}),
    "engine-mtp": ("tiny-mtp.yaml", {"flavour": "engine"}),
    "engine-baseline": ("tiny-baseline.yaml", {"flavour": "engine"}),
    "engine-lookahead": ("tiny-lookahead.yaml", {}),  # (W, N, G) from the tensorrt_llm model's lookahead_* parameters
    "engine-medusa": ("tiny-medusa.yaml", {}),  # the heads beside the target, the tree from medusa_choices
    # the BLS calls tensorrt_llm without decoupled=True, so it needs a non-streaming repository
    "engine-mtp-unary": ("tiny-mtp.yaml", {"flavour": "engine", "streaming": False}),
}
# every repository here runs a fixed K, so that each request speculates: the adaptive policy may find plain
# decoding cheaper on a slow machine (a CI run served MTP with no drafts at all); bench's tests serve it
FIXED_K = {"policy": "fixed"}


def trtspec(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtspec", *args], cwd=cwd, capture_output=True, text=True)


@dataclass
class Served:
    """One running repository and how its flavour names things."""

    key: str
    config: object
    http: str
    grpc: str
    flavour: str
    mode: str
    k: int
    decoupled: bool
    metrics: str

    @property
    def model(self) -> str:
        if self.flavour == "llmapi":
            return "tensorrt_llm"
        return "tensorrt_llm_bls" if self.mode == "draft-target" else "ensemble"

    def body(self, prompt: str | None = PROMPT, max_tokens=32, perf=False, stream=False, extra=None) -> dict:
        if self.flavour == "llmapi":
            body = {"sampling_param_max_tokens": max_tokens, "sampling_param_return_perf_metrics": perf}
            body["streaming"] = stream
        else:
            body = {"max_tokens": max_tokens, "return_perf_metrics": perf, "exclude_input_in_output": True}
            body["stream"] = stream
            if self.model == "tensorrt_llm_bls":
                body["num_draft_tokens"] = self.k
        body.update(extra or {})
        return body if prompt is None else {"text_input": prompt, **body}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """Starts repositories on demand and keeps every one up until the module ends."""
    started: dict[str, Served] = {}
    tmp = tmp_path_factory.mktemp("serve")

    def get(key: str) -> Served:
        if key in started:
            return started[key]
        source, serve = REPOS[key]
        data = yaml.safe_load((CONFIGS / source).read_text())
        data["name"] = key
        data["serve"].update(serve)
        data["speculation"].update(FIXED_K)
        config = tmp / f"{key}.yaml"
        config.write_text(yaml.safe_dump(data))
        for step in (("build", str(config)), ("package", str(config))):
            res = trtspec(*step, cwd=tmp)
            assert res.returncode == 0, res.stderr
        http, grpc, metrics = free_ports(3)
        ports = ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
        res = trtspec("serve", str(config), *ports, "--detach", cwd=tmp)
        assert res.returncode == 0, res.stdout + res.stderr
        mode = data["speculation"]["mode"]
        cfg, spec = load_config(config), get_mode(mode)
        tree = spec.own_tree(cfg)  # a step drafts K, or a tree the mode's settings fix as deep as it is
        k = tree.depth if tree is not None else spec.drafts_per_step(cfg)
        started[key] = Served(
            key, config, f"localhost:{http}", f"localhost:{grpc}", data["serve"]["flavour"], mode, k,
            decoupled=data["serve"]["streaming"], metrics=f"http://localhost:{metrics}/metrics",
        )  # fmt: skip
        return started[key]

    yield get
    with ThreadPoolExecutor(max(1, len(started))) as pool:  # together: each takes seconds to unload its models
        stops = list(pool.map(lambda served: trtspec("serve", str(served.config), "--stop", cwd=tmp), started.values()))
    for stopped in stops:
        assert stopped.returncode == 0, stopped.stderr


def post(served: Served, path: str, body: dict | bytes, model: str | None = None) -> tuple[int, dict | str]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    url = f"http://{served.http}/v2/models/{model or served.model}/{path}"
    request = urllib.request.Request(url, data=data, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            text = response.read().decode()
            return response.status, json.loads(text) if path == "generate" else text
    except urllib.error.HTTPError as exc:
        text = exc.read().decode()
        return exc.code, json.loads(text) if path == "generate" else text


def generate(served: Served, **fields) -> dict:
    status, body = post(served, "generate", served.body(**fields))
    assert status == 200, body
    return body


_in_process: dict[str, str] = {}


def in_process_text(served: Served) -> str:
    if served.key not in _in_process:
        res = trtspec("generate", str(served.config), "--prompt", PROMPT, "--max-tokens", "32", "--json", cwd=None)
        assert res.returncode == 0, res.stderr
        _in_process[served.key] = json.loads(res.stdout)["text"]
    return _in_process[served.key]


def grpc_stream(served: Served, prompt: str, max_tokens: int) -> list[str]:
    import tritonclient.grpc as grpcclient

    # the llmapi model has no batch dimension (one element per tensor); the engine models have one
    shape = [1] if served.flavour == "llmapi" else [1, 1]
    inputs = []
    for name, value in served.body(prompt, max_tokens, stream=served.decoupled).items():
        dtype, np_dtype = {str: ("BYTES", np.object_), bool: ("BOOL", bool), int: ("INT32", np.int32)}[type(value)]
        data = np.array(value.encode() if isinstance(value, str) else value, dtype=np_dtype).reshape(shape)
        inputs.append(grpcclient.InferInput(name, shape, dtype).set_data_from_numpy(data))
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(served.grpc)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    client.async_stream_infer(served.model, inputs, enable_empty_final_response=served.decoupled)
    pieces = []
    while True:
        result, error = results.get(timeout=120)
        assert error is None, error
        out = result.as_numpy("text_output")
        if out is not None:
            pieces.append(out.reshape(-1)[0].decode())
        if not served.decoupled or result.get_response().parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    client.close()
    return pieces


@pytest.mark.parametrize("key", list(REPOS))
def test_http_generate_equals_the_in_process_runner(servers, key):
    served = servers(key)
    body = generate(served, perf=True)
    assert body["text_output"] == in_process_text(served)
    accepted, drafted = body["total_accepted_draft_tokens"], body["total_draft_tokens"]
    assert 0 <= accepted <= drafted
    if served.mode == "none":
        assert drafted == 0
    else:
        assert drafted > 0 and body["acceptance_rate"] == pytest.approx(accepted / drafted, rel=1e-6)
    assert body["arrival_time_ns"] <= body["first_token_time_ns"] <= body["last_token_time_ns"]


@pytest.mark.parametrize("key", list(REPOS))
def test_sse_and_grpc_streams_concatenate_to_the_same_text(servers, key):
    served = servers(key)
    status, text = post(served, "generate_stream", served.body(stream=served.decoupled))
    assert status == 200, text
    chunks = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
    assert not any("error" in c for c in chunks), chunks
    assert len(chunks) > 2 if served.decoupled else len(chunks) == 1
    assert "".join(c.get("text_output", "") for c in chunks) == in_process_text(served)
    pieces = grpc_stream(served, PROMPT, 32)
    assert len(pieces) > 2 if served.decoupled else len(pieces) == 1
    assert "".join(pieces) == in_process_text(served)


@pytest.mark.parametrize(
    "key", ["llmapi-draft-target", "engine-mtp", "engine-draft-target", "engine-lookahead", "engine-medusa"]
)
def test_eight_concurrent_streams_complete(servers, key):
    served = servers(key)
    prompts = [f"{PROMPT} {i}" for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(partial(grpc_stream, served, max_tokens=16), prompts))
    assert len(texts) == 8 and all("".join(t) for t in texts)


def bad_bodies(served: Served) -> list[dict | bytes]:
    good = served.body(max_tokens=4)
    limit = "sampling_param_max_tokens" if served.flavour == "llmapi" else "max_tokens"
    not_utf8 = json.dumps({**good, "text_input": "@@"}).encode().replace(b"@@", b"\xff\xfe not utf-8")
    return [
        served.body(prompt=None, max_tokens=4),  # no text_input
        {**good, limit: 0},
        {**good, limit: 100000},
        {**good, limit: "many"},  # wrong dtype
        not_utf8,
    ]


@pytest.mark.parametrize("key", ["llmapi-draft-target", "engine-draft-target", "engine-mtp"])
def test_bad_requests_get_errors_and_the_server_stays_up(servers, key):
    served = servers(key)
    for body in bad_bodies(served):
        if served.decoupled and served.flavour == "engine":
            # a decoupled ensemble answers over SSE: the error arrives as an event, maybe under status 200
            status, text = post(served, "generate_stream", body)
            events = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
            events += [json.loads(text)] if text.startswith("{") else []  # refused before streaming began
            assert any("error" in e for e in events), (body, text)
        else:
            status, answer = post(served, "generate", body)
            assert status >= 400 and "error" in answer, (body, answer)
        assert generate(served, max_tokens=4)["text_output"]
    status, answer = post(served, "generate", {"text_input": PROMPT}, model="nope")
    assert status >= 400 and "error" in answer


def test_bls_refuses_what_the_documented_loop_refuses(servers):
    served = servers("engine-draft-target")
    status, answer = post(served, "generate", {**served.body(), "stream": True})
    assert status >= 400 and "stream" in answer["error"]
    baseline = servers("engine-baseline")
    status, answer = post(baseline, "generate", {**baseline.body(), "num_draft_tokens": 2}, model="tensorrt_llm_bls")
    assert status >= 400 and "without draft model" in answer["error"]


def test_speculative_and_baseline_repositories_serve_side_by_side(servers):
    pairs = [
        (servers("llmapi-draft-target"), servers("llmapi-baseline")),
        (servers("engine-mtp"), servers("engine-baseline")),
    ]
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(generate, s, perf=True) for pair in pairs for s in pair]
        answers = [f.result() for f in futures]
    for (spec, base), (a, b) in zip(pairs, zip(answers[::2], answers[1::2], strict=True), strict=True):
        assert spec.http != base.http
        # greedy speculation is lossless: the same text as the baseline, with drafts behind it
        assert a["text_output"] == b["text_output"]
        assert a["total_draft_tokens"] > 0 and b["total_draft_tokens"] == 0


def histogram(samples, name: str, **labels) -> tuple[float, float]:
    """(count, sum) of a histogram over every label set matching `labels`."""
    return total(samples, name + "_count", **labels), total(samples, name + "_sum", **labels)


@pytest.mark.parametrize("key", list(REPOS))
def test_metrics_port_counts_equal_the_sums_of_per_request_outputs(servers, key):
    """N requests with perf outputs on: trtspec's counters on :8002 move by exactly their sums."""
    served = servers(key)
    before = scrape(served.metrics)
    lengths = [6, 11, 17, 24, 32]
    answers = [generate(served, prompt=f"{PROMPT} {i}", max_tokens=n, perf=True) for i, n in enumerate(lengths)]
    after = scrape(served.metrics)
    delta = SpecCounters.read(after) - SpecCounters.read(before)
    drafted = sum(a["total_draft_tokens"] for a in answers)
    accepted = sum(a["total_accepted_draft_tokens"] for a in answers)
    assert (delta.draft_tokens, delta.accepted_tokens) == (drafted, accepted)
    assert delta.requests == len(lengths)  # the BLS's calls into tensorrt_llm are not counted again
    # count the requests that drafted (the sum, not the number of requests, is what the counter must equal)
    assert delta.speculated_requests == sum(a["total_draft_tokens"] > 0 for a in answers)
    assert (delta.speculated_requests > 0) == (served.mode != "none")
    now, then = (histogram(x, spec_metrics.ACCEPTED_LENGTH) for x in (after, before))
    assert (now[0] - then[0], now[1] - then[1]) == (delta.steps, accepted)
    for name in (spec_metrics.DRAFT_SECONDS, spec_metrics.VERIFY_SECONDS):
        assert histogram(after, name)[0] - histogram(before, name)[0] == delta.steps
    assert histogram(after, spec_metrics.TTFT_SECONDS)[0] - histogram(before, spec_metrics.TTFT_SECONDS)[0] == 5
    if served.mode != "none":
        # every counted step drafts at most K and at least one, and emits at least one token after the first
        assert drafted / served.k <= delta.steps <= min(drafted, sum(n - 1 for n in lengths))
        assert delta.acceptance_rate == pytest.approx(accepted / drafted)
    kv = {s: total(after, spec_metrics.KV_POSITIONS, model="tensorrt_llm", state=s) for s in ("used", "capacity")}
    max_len = yaml.safe_load(served.config.read_text())["build"]["max_seq_len"]
    # one instance of max_batch_size slots in either flavour; positions are given back as requests end
    slots = yaml.safe_load(served.config.read_text())["build"]["max_batch_size"]
    assert kv == {"used": 0, "capacity": slots * max_len}


def test_mtp_through_a_draftless_bls_is_counted_once_by_tensorrt_llm(servers):
    """The BLS without a draft model only forwards: the MTP speculation inside tensorrt_llm is what counts."""
    served = servers("engine-mtp-unary")
    before = scrape(served.metrics)
    body = {"text_input": PROMPT, "max_tokens": 16, "exclude_input_in_output": True}
    status, answer = post(served, "generate", body, model="tensorrt_llm_bls")
    assert status == 200 and answer["text_output"], answer
    delta = SpecCounters.read(scrape(served.metrics), model="tensorrt_llm", mode="mtp") - SpecCounters.read(
        before, model="tensorrt_llm", mode="mtp"
    )
    assert delta.requests == delta.speculated_requests == 1 and delta.draft_tokens > 0
    everyone = SpecCounters.read(scrape(served.metrics)) - SpecCounters.read(before)
    assert everyone.requests == 1  # nothing recorded under the BLS's name


@pytest.mark.parametrize("key", ["engine-mtp", "engine-medusa"])
def test_min_tokens_holds_the_end_back_in_a_speculating_ensemble(servers, key):
    """`trtspec bench` fixes output lengths with min_tokens: a tensorrt_llm model that drafts by itself honours it
    (every request failed before), giving plain decoding's greedy text with the end token held back."""
    from transformers import AutoTokenizer

    from trtspec.assets import EMBEDDED_CHECKPOINTS

    served, plain = servers(key), servers("engine-baseline")
    tok = AutoTokenizer.from_pretrained(EMBEDDED_CHECKPOINTS["tiny-target"])
    full = generate(served, max_tokens=24)["text_output"]
    ids = tok(full, add_special_tokens=False).input_ids
    end = next(t for i, t in enumerate(ids) if i >= 2 and tok.encode(tok.decode([t]), add_special_tokens=False) == [t])
    cut = generate(served, max_tokens=24, extra={"end_id": end})["text_output"]
    held = generate(served, max_tokens=24, extra={"end_id": end, "min_tokens": 24})["text_output"]
    assert len(cut) < len(full) and len(held) > len(cut), (full, cut, held)
    assert held == generate(plain, max_tokens=24, extra={"end_id": end, "min_tokens": 24})["text_output"]


# An input from each group the full contract declares: one trtspec's torch models honour, one they refuse.
REFUSED = {
    "llmapi": [("sampling_param_best_of", 2), ("sampling_param_presence_penalty", 0.5), ("image_url", "http://x")],
    "engine": [("repetition_penalty", 1.3), ("beam_width", 2), ("bad_words", ["the"]), ("lora_task_id", 3)],
}


@pytest.mark.parametrize(
    "key", ["llmapi-baseline", "llmapi-mtp", "engine-baseline", "engine-draft-target", "engine-mtp"]
)
def test_every_declared_input_is_honoured_or_refused_by_name(servers, key):
    """Nothing a client sends is accepted and ignored: a stop word ends the text at it, an input the torch
    engine cannot honour is an error naming it; at its no-op value it is accepted."""
    from transformers import AutoTokenizer

    from trtspec.assets import EMBEDDED_CHECKPOINTS

    served = servers(key)
    tok = AutoTokenizer.from_pretrained(EMBEDDED_CHECKPOINTS["tiny-target"])
    plain = {} if served.flavour == "llmapi" else {"exclude_input_in_output": True}  # llmapi: excluded already
    full = generate(served, max_tokens=32, extra=plain)["text_output"]
    ids = tok(full, add_special_tokens=False).input_ids
    # a token that is its own text's whole encoding, so the stop word is that one token
    at = next(i for i, t in enumerate(ids) if i >= 3 and tok.encode(tok.decode([t]), add_special_tokens=False) == [t])
    word = tok.decode([ids[at]])
    stop_field = "sampling_param_stop" if served.flavour == "llmapi" else "stop_words"
    extra = {stop_field: [word], **plain}
    stopped = generate(served, max_tokens=32, extra=extra)["text_output"]
    if served.flavour == "llmapi":  # the LLM API cuts the text before the stop string
        assert stopped == full[: full.index(word)], (full, word, stopped)
    else:  # TensorRT-LLM's stop words end the tokens with the word included
        first = ids.index(ids[at])
        assert stopped == tok.decode(ids[: first + 1]), (full, word, stopped)
    if served.decoupled:  # streamed, the chunks hold back what may begin the stop word and end at it too
        status, text = post(served, "generate_stream", served.body(max_tokens=32, stream=True, extra=extra))
        chunks = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
        assert status == 200 and "".join(c.get("text_output", "") for c in chunks) == stopped, (text, stopped)
    for name, value in REFUSED[served.flavour]:
        status, answer = post(served, "generate", {**served.body(max_tokens=4), name: value})
        assert status >= 400 and name.replace("bad_words", "bad_words_list") in answer["error"], (name, answer)
    neutral = "sampling_param_best_of" if served.flavour == "llmapi" else "repetition_penalty"
    assert generate(served, max_tokens=4, extra={neutral: 1})["text_output"]
