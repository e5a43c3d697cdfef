"""The llmapi repository of the embedded pair on a real tritonserver (the nvidia-pytriton wheel's).

Built and packaged with the CLI, served by `trtspec serve --detach`, queried over HTTP generate,
HTTP generate_stream (SSE) and gRPC streaming, and stopped with `trtspec serve --stop`.
"""

from __future__ import annotations

import json
import queue
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from functools import partial

import numpy as np
import pytest
from conftest import CONFIGS

from trtspec.serve.locate import find_tritonserver

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_tritonserver() is None, reason="no tritonserver (install the server extra)"),
]
PROMPT = "ROMEO:\nBut soft, what light"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def trtspec(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtspec", *args], cwd=cwd, capture_output=True, text=True)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    config = tmp / "pair.yaml"
    shutil.copy(CONFIGS / "tiny-draft-target.yaml", config)
    for step in (("build", str(config)), ("package", str(config))):
        res = trtspec(*step, cwd=tmp)
        assert res.returncode == 0, res.stderr
    http, grpc, metrics = free_port(), free_port(), free_port()
    ports = ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    res = trtspec("serve", str(config), *ports, "--detach", cwd=tmp)
    assert res.returncode == 0, res.stdout + res.stderr
    yield {"http": f"localhost:{http}", "grpc": f"localhost:{grpc}", "config": config}
    stopped = trtspec("serve", str(config), "--stop", cwd=tmp)
    assert stopped.returncode == 0, stopped.stderr


def post(server, path: str, body: dict | bytes) -> tuple[int, dict | str]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{server['http']}{path}", data=data, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            text = response.read().decode()
            return response.status, json.loads(text) if path.endswith("/generate") else text
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read().decode())


def generate(server, **fields) -> dict:
    status, body = post(server, "/v2/models/tensorrt_llm/generate", {"text_input": PROMPT, **fields})
    assert status == 200, body
    return body


@pytest.fixture(scope="module")
def in_process(server):
    res = trtspec(
        "generate",
        str(server["config"]),
        "--prompt",
        PROMPT,
        "--max-tokens",
        "32",
        "--json",
        cwd=server["config"].parent,
    )
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def test_http_generate_equals_the_in_process_runner(server, in_process):
    body = generate(server, sampling_param_max_tokens=32, sampling_param_return_perf_metrics=True)
    assert body["text_output"] == in_process["text"]
    accepted, drafted = body["total_accepted_draft_tokens"], body["total_draft_tokens"]
    assert 0 <= accepted <= drafted and drafted > 0
    assert body["acceptance_rate"] == pytest.approx(accepted / drafted, rel=1e-6)
    assert body["arrival_time_ns"] <= body["first_token_time_ns"] <= body["last_token_time_ns"]


def test_sse_stream_concatenates_to_the_same_text(server, in_process):
    status, text = post(
        server,
        "/v2/models/tensorrt_llm/generate_stream",
        {"text_input": PROMPT, "sampling_param_max_tokens": 32, "streaming": True},
    )
    assert status == 200
    chunks = [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
    assert len(chunks) > 2
    assert "".join(c.get("text_output", "") for c in chunks) == in_process["text"]


def grpc_stream(server, prompt: str, max_tokens: int) -> str:
    import tritonclient.grpc as grpcclient

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server["grpc"])

    def tensor(name, value, dtype):
        t = grpcclient.InferInput(name, [1], dtype)
        t.set_data_from_numpy(np.array([value], dtype=np.object_ if dtype == "BYTES" else None))
        return t

    inputs = [
        tensor("text_input", prompt.encode(), "BYTES"),
        tensor("streaming", True, "BOOL"),
        tensor("sampling_param_max_tokens", np.int32(max_tokens), "INT32"),
    ]
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    client.async_stream_infer("tensorrt_llm", inputs, enable_empty_final_response=True)
    pieces = []
    while True:
        result, error = results.get(timeout=120)
        assert error is None, error
        response = result.get_response()
        out = result.as_numpy("text_output")
        if out is not None:
            pieces.append(out.reshape(-1)[0].decode())
        if response.parameters["triton_final_response"].bool_param:
            break
    client.stop_stream()
    client.close()
    return "".join(pieces)


def test_grpc_streaming_returns_the_same_text(server, in_process):
    assert grpc_stream(server, PROMPT, 32) == in_process["text"]


def test_eight_concurrent_streams_complete(server):
    prompts = [f"{PROMPT} {i}" for i in range(8)]
    with ThreadPoolExecutor(8) as pool:
        texts = list(pool.map(partial(grpc_stream, server, max_tokens=16), prompts))
    assert len(texts) == 8 and all(texts)


@pytest.mark.parametrize(
    "body",
    [
        {"sampling_param_max_tokens": 4},  # no text_input
        {"text_input": PROMPT, "sampling_param_max_tokens": 0},
        {"text_input": PROMPT, "sampling_param_max_tokens": 100000},
        {"text_input": PROMPT, "sampling_param_max_tokens": "many"},  # wrong dtype
        b'{"text_input": "\xff\xfe not utf-8", "sampling_param_max_tokens": 4}',
    ],
)
def test_bad_requests_get_errors_and_the_server_stays_up(server, body):
    status, answer = post(server, "/v2/models/tensorrt_llm/generate", body)
    assert status >= 400 and "error" in answer
    assert generate(server, sampling_param_max_tokens=4)["text_output"]


def test_unknown_model_is_an_error(server):
    status, answer = post(server, "/v2/models/nope/generate", {"text_input": PROMPT})
    assert status >= 400 and "error" in answer
