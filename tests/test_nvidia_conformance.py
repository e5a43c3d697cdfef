"""NVIDIA's own python models load trtspec's repositories and answer NVIDIA's documented requests.

Runs where TRTSPEC_NVIDIA_MODELS points at an `all_models` folder: `/app/all_models` inside
`nvcr.io/nvidia/tritonserver:<yy.mm>-trtllm-python-py3`, `triton_backend/all_models` in a
TensorRT-LLM checkout, or `all_models` in tensorrtllm_backend up to 0.20. For each GPU config in
configs/, it packages the repository for NVIDIA's container exactly as `trtspec package` does (with
the embedded tiny pair in place of the checkpoints, and the container's mount points under a
temporary folder), links NVIDIA's preprocessing, postprocessing, BLS and llmapi code from that
folder, puts stand-ins in the slots that need TensorRT-LLM (trtspec's torch `tensorrt_llm` models;
for the llmapi model, tests/nvidia_standin/tensorrt_llm on that model's path only), starts a real
tritonserver and sends the requests NVIDIA's READMEs and trtspec's README show, streaming and not.
NVIDIA's code is read from the variable's folder and never copied into the project.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from conftest import CONFIGS

from trtspec.assets import EMBEDDED_CHECKPOINTS
from trtspec.config import load_config
from trtspec.repository import contract
from trtspec.repository.package import package_repository
from trtspec.serve.locate import find_tritonserver
from trtspec.serve.server import free_ports

NVIDIA = os.environ.get("TRTSPEC_NVIDIA_MODELS", "")
STANDIN = Path(__file__).parent / "nvidia_standin" / "tensorrt_llm"
pytestmark = [
    pytest.mark.nvidia,
    pytest.mark.e2e,
    pytest.mark.skipif(
        not NVIDIA, reason="TRTSPEC_NVIDIA_MODELS is not set (point it at NVIDIA's all_models, /app/all_models)"
    ),
    pytest.mark.skipif(find_tritonserver() is None, reason="no tritonserver (install the server extra)"),
]
GPU_CONFIGS = {
    "llama-70b-draft": "llama-3.3-70b-1b-draft-h200.yaml",
    "llama-405b-draft-tp4": "llama-3.1-405b-3b-draft-tp4.yaml",
    "deepseek-r1-mtp": "deepseek-r1-mtp-8gpu.yaml",
    "deepseek-r1-mtp-2node": "deepseek-r1-mtp-2x8-h100.yaml",
    "llama-8b-ngram": "llama-3.1-8b-ngram.yaml",
}
STORY = "Continue writing the following story: James Best, best known for his"


def trtspec(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtspec", *args], cwd=cwd, capture_output=True, text=True)


def tiny(data: dict, name: str) -> dict:
    """The GPU config with the embedded pair as its checkpoints: the repository's shape is unchanged."""
    data = json.loads(json.dumps(data))
    data["name"] = name
    data["target"] = {"checkpoint": "embedded:tiny-target", "dtype": "float32"}
    if data.get("draft"):
        data["draft"] = {"checkpoint": "embedded:tiny-draft", "dtype": "float32"}
    if data["speculation"]["mode"] == "mtp":
        data["speculation"]["num_draft_tokens"] = 2  # the tiny target has two MTP layers
        data.setdefault("mtp", {})["num_nextn_predict_layers"] = 2
    data["build"].update(max_input_len=256, max_seq_len=512, max_num_tokens=2048)
    return data


def nvidia_imports_or_skip() -> None:
    """NVIDIA's models import these at load time; the container has them, a bare venv may not."""
    for module in ("PIL", "requests", "mpi4py", "pandas"):
        pytest.importorskip(module, reason=f"NVIDIA's models import {module} (pip install trtspec[conformance])")


class Repo:
    def __init__(self, key: str, tmp: Path) -> None:
        self.key, self.tmp = key, tmp
        self.data = tiny(yaml.safe_load((CONFIGS / GPU_CONFIGS[key]).read_text()), key)
        self.data["serve"]["repository"] = str(tmp / "model_repository")
        self.data["build"]["output_dir"] = str(tmp / "engines")
        self.flavour, self.mode = self.data["serve"]["flavour"], self.data["speculation"]["mode"]
        self.config = tmp / f"{key}.yaml"
        self.config.write_text(yaml.safe_dump(self.data))
        self.root = tmp / "mounts"  # what the deployment mounts at /trtspec
        self.path: Path | None = None

    def build(self) -> Path:
        cfg = load_config(self.config)
        (self.root / "checkpoints").mkdir(parents=True)
        for role, name in (("target", "tiny-target"), ("draft", "tiny-draft")):
            (self.root / "checkpoints" / role).symlink_to(EMBEDDED_CHECKPOINTS[name])
        repo = package_repository(cfg, nvidia_models=NVIDIA, container_root=str(self.root))
        if self.flavour == "engine":
            self._swap_engines(repo)
        else:
            shutil.copytree(STANDIN, repo / "tensorrt_llm" / "1" / "tensorrt_llm")
        self.path = repo
        return repo

    def _swap_engines(self, repo: Path) -> None:
        """trtspec's torch tensorrt_llm models in the slots the tensorrtllm backend would fill."""
        torch = json.loads(json.dumps(self.data))
        torch["name"] = f"{self.key}-torch"
        torch["build"].update(backend="torch", device="cpu", tp=1, pp=1)
        config = self.tmp / f"{self.key}-torch.yaml"
        config.write_text(yaml.safe_dump(torch))
        res = trtspec("build", str(config), cwd=self.tmp)
        assert res.returncode == 0, res.stderr
        built = self.tmp / "model_repository" / torch["name"]
        for name in ("tensorrt_llm", "tensorrt_llm_draft"):
            if (built / name).exists():
                shutil.rmtree(repo / name)
                shutil.copytree(built / name, repo / name)


@pytest.fixture(scope="module", params=list(GPU_CONFIGS))
def served(request, tmp_path_factory):
    nvidia_imports_or_skip()
    tmp = tmp_path_factory.mktemp(request.param)
    repo = Repo(request.param, tmp)
    path = repo.build()
    http, grpc, metrics = free_ports(3)
    ports = ["--http-port", str(http), "--grpc-port", str(grpc), "--metrics-port", str(metrics)]
    res = trtspec("serve", str(path), *ports, "--detach", "--timeout", "240", cwd=tmp)
    assert res.returncode == 0, res.stdout + res.stderr
    repo.http, repo.grpc = f"localhost:{http}", f"localhost:{grpc}"
    yield repo
    stopped = trtspec("serve", str(path), "--stop", cwd=tmp)
    assert stopped.returncode == 0, stopped.stderr


def post(repo: Repo, model: str, body: dict, stream: bool = False) -> tuple[int, object]:
    path = "generate_stream" if stream else "generate"
    url = f"http://{repo.http}/v2/models/{model}/{path}"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=180) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    if stream:
        return 200, [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:")]
    return 200, json.loads(text)


def documented_requests(repo: Repo) -> list[tuple[str, str, dict, bool]]:
    """(what, model, body, stream): NVIDIA's README curls and trtspec's, for this repository's flavour."""
    if repo.flavour == "llmapi":
        return [
            ("NVIDIA llmapi README", "tensorrt_llm",
             {"text_input": "What is ML?", "sampling_param_max_tokens": 50,
              "sampling_param_return_perf_metrics": True}, False),
            ("trtspec README llmapi", "tensorrt_llm",
             {"text_input": "ROMEO:", "sampling_param_max_tokens": 32, "sampling_param_return_perf_metrics": True},
             False),
            ("llmapi streaming", "tensorrt_llm",
             {"text_input": "ROMEO:", "sampling_param_max_tokens": 16, "streaming": True}, True),
            ("llmapi stop words and finish reason", "tensorrt_llm",
             {"text_input": "ROMEO:", "sampling_param_max_tokens": 32, "sampling_param_stop": ["the"],
              "return_finish_reason": True}, False),
        ]  # fmt: skip
    k = int(repo.data["speculation"]["num_draft_tokens"])
    return [
        ("NVIDIA ensemble README", "ensemble",
         {"text_input": "What is machine learning?", "max_tokens": 20, "bad_words": "", "stop_words": ""}, False),
        ("NVIDIA draft-target README (draft logits, 10 drafts)", "tensorrt_llm_bls",
         {"text_input": STORY, "max_tokens": 128, "num_draft_tokens": 10, "use_draft_logits": True,
          "stream": False}, False),
        ("NVIDIA draft-target README (token acceptance)", "tensorrt_llm_bls",
         {"text_input": STORY, "max_tokens": 64, "num_draft_tokens": 10, "use_draft_logits": False,
          "stream": False}, False),
        ("trtspec README BLS", "tensorrt_llm_bls",
         {"text_input": "ROMEO:", "max_tokens": 32, "num_draft_tokens": k, "return_perf_metrics": True,
          "stream": False}, False),
        ("BLS without speculation", "tensorrt_llm_bls",
         {"text_input": "ROMEO:", "max_tokens": 16, "stream": False}, False),
        ("ensemble with sampling, seed and stop words", "ensemble",
         {"text_input": "ROMEO:", "max_tokens": 24, "temperature": 0.8, "top_k": 20, "top_p": 0.9, "seed": 7,
          "stop_words": ["the"], "return_num_input_tokens": True, "return_num_output_tokens": True}, False),
    ]  # fmt: skip


def llmapi_perf() -> bool:
    """Whether this tree's llmapi model returns perf metrics at all (older ones send text_output alone)."""
    return "request_perf_metrics" in (Path(NVIDIA) / "llmapi/tensorrt_llm/1/model.py").read_text(encoding="utf-8")


def test_nvidia_models_load_the_repository(served):
    """Every model is ready, and the python models are NVIDIA's own files, not trtspec's."""
    with urllib.request.urlopen(f"http://{served.http}/v2/health/ready", timeout=30) as response:
        assert response.status == 200
    names = ("llmapi",) if served.flavour == "llmapi" else ("preprocessing", "postprocessing", "tensorrt_llm_bls")
    for name in names:
        slot = "tensorrt_llm" if name == "llmapi" else name
        for file in ("model.py", *contract.model(name).sibling_files):
            target = (served.path / slot / "1" / file).resolve()
            assert target.is_relative_to(Path(NVIDIA).resolve()), (slot, file, target)


def test_documented_requests_are_answered(served):
    for what, model, body, stream in documented_requests(served):
        status, answer = post(served, model, body, stream)
        assert status == 200, (what, answer)
        outputs = answer if stream else [answer]
        text = "".join(str(o.get("text_output", "")) for o in outputs)
        assert text.strip(), (what, answer)
        if body.get("return_perf_metrics") or (body.get("sampling_param_return_perf_metrics") and llmapi_perf()):
            last = outputs[-1]
            if served.mode != "none" and ("num_draft_tokens" in body or served.flavour == "llmapi"):
                assert float(last["total_draft_tokens"]) > 0, (what, last)
                assert 0 <= float(last["total_accepted_draft_tokens"]) <= float(last["total_draft_tokens"])
        if body.get("return_num_output_tokens"):
            assert int(answer["num_output_tokens"]) > 0, (what, answer)


def test_greedy_speculation_matches_plain_decoding(served):
    """The lossless check through NVIDIA's code: speculative and plain greedy output are the same text.
    (Without exclude_input_in_output: NVIDIA's BLS before its fix finds the drafts by cutting the prompt
    off the draft's output, and a request that excludes the input gets no drafts and a wrong text.)"""
    if served.flavour == "llmapi":
        pytest.skip("the llmapi model speculates inside tensorrt_llm: trtspec's serve tests compare it")
    plain = {"text_input": "ROMEO:", "max_tokens": 40, "stream": False}
    status, base = post(served, "tensorrt_llm_bls", plain)
    assert status == 200, base
    for k in (1, 4, 10):
        status, spec = post(served, "tensorrt_llm_bls", {**plain, "num_draft_tokens": k})
        assert status == 200, spec
        assert spec["text_output"] == base["text_output"], k


def test_stop_words_end_the_text(served):
    """Through NVIDIA's preprocessing (engine) or NVIDIA's llmapi helpers (llmapi): the text ends at the stop
    word, kept by TensorRT-LLM's token-level stop words, left out by the LLM API's stop strings."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(EMBEDDED_CHECKPOINTS["tiny-target"])
    if served.flavour == "llmapi":
        model, body, field = (
            "tensorrt_llm",
            {"text_input": "ROMEO:", "sampling_param_max_tokens": 32},
            "sampling_param_stop",
        )
    else:
        model, field = "ensemble", "stop_words"
        body = {"text_input": "ROMEO:", "max_tokens": 32, "exclude_input_in_output": True}
    status, full = post(served, model, body)
    assert status == 200, full
    ids = tok(full["text_output"], add_special_tokens=False).input_ids
    at = next(i for i, t in enumerate(ids) if i >= 3 and tok.encode(tok.decode([t]), add_special_tokens=False) == [t])
    word = tok.decode([ids[at]])
    status, stopped = post(served, model, {**body, field: [word]})
    assert status == 200, stopped
    if served.flavour == "llmapi":
        assert stopped["text_output"] == full["text_output"][: full["text_output"].index(word)]
    else:
        assert stopped["text_output"] == tok.decode(ids[: ids.index(ids[at]) + 1])


def test_a_request_nvidia_refuses_gets_an_error_not_a_hang(served):
    """NVIDIA's models answer a bad request with an error response: the repository leaves them able to."""
    if served.flavour == "llmapi":
        status, answer = post(served, "tensorrt_llm", {"sampling_param_max_tokens": 8})  # no text_input
    else:  # streaming with speculation, which NVIDIA's Request.validate() refuses
        body = {"text_input": "x", "max_tokens": 8, "num_draft_tokens": 2, "stream": True}
        status, answer = post(served, "tensorrt_llm_bls", body)
    assert status == 400, answer
