"""trtspec bench and trtspec demo against real servers: tritonserver serving the embedded pair, and a
small local OpenAI-compatible server (tests/openai_server.py) running the same model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import CONFIGS, REPO

from trtspec.bench.records import read_records
from trtspec.demo import POLICIES
from trtspec.serve.locate import find_tritonserver
from trtspec.serve.server import Ports, free_ports, start_server, stop_all, wait_ready
from trtspec.speculative.planted import PLANTED, PLANTED_ENV

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(find_tritonserver() is None, reason="no tritonserver (install the server extra)"),
]
TOKENIZER = str(REPO / "trtspec" / "assets" / "tiny-target")
PROMPTS = str(REPO / "trtspec" / "assets" / "demo_prompts.jsonl")


def free_port() -> int:
    return free_ports(1)[0]


def trtspec(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trtspec", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def serve_config(source: str, name: str, tmp: Path):
    data = yaml.safe_load((CONFIGS / source).read_text())
    data["name"] = name
    data["speculation"]["policy"] = "fixed"  # the lossless check's power is computed for the config's K
    config = tmp / f"{name}.yaml"
    config.write_text(yaml.safe_dump(data))
    for step in ("build", "package"):
        res = trtspec(step, str(config), cwd=tmp)
        assert res.returncode == 0, res.stderr
    ports = Ports(*free_ports(3))
    server = start_server(tmp / "model_repository" / name, ports, tmp / f"{name}.log")
    wait_ready(server, 300)
    return server


@pytest.fixture(scope="module")
def triton(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench-e2e")
    servers = {
        "spec": serve_config("tiny-draft-target.yaml", "spec", tmp),
        "base": serve_config("tiny-baseline.yaml", "base", tmp),
    }
    yield tmp, servers
    stop_all(servers.values())


def grpc(server) -> str:
    return f"triton-grpc://localhost:{server.ports.grpc}/tensorrt_llm"


def metrics(server) -> str:
    return f"http://localhost:{server.ports.metrics}/metrics"


def test_ab_over_grpc_with_the_lossless_check(triton):
    tmp, s = triton
    out = tmp / "ab"
    res = trtspec(
        "bench", grpc(s["spec"]), "--compare", grpc(s["base"]), "--tokenizer", TOKENIZER, "--dataset", PROMPTS,
        "--max-tokens", "24", "--concurrency", "1,2", "--num-requests", "4", "--verify-lossless",
        "--lossless-samples", "60", "--out", str(out), "--server-metrics", metrics(s["spec"]),
        "--compare-server-metrics", metrics(s["base"]), cwd=tmp,
    )  # fmt: skip
    # 60 samples per side cannot show a planted bug: the check says so and the run fails, never PASS
    assert res.returncode == 1, res.stdout + res.stderr
    assert "lossless check: inconclusive" in res.stdout and "A/B" in res.stdout and "server acc." in res.stdout
    assert {p.name for p in out.iterdir()} >= {"requests.jsonl", "summary.json", "summary.csv", "report.html"}
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] and len(summary["comparison"]) == 2
    for level in summary["levels"]:
        a, b = level["targets"]["A"], level["targets"]["B"]
        assert a["completed"] == b["completed"] == 4
        assert a["acceptance"]["source"] == "server" and 0 < a["acceptance"]["acceptance_rate"] < 1
        assert a["acceptance"]["accepted_tokens_per_step"] > 1.0
        assert b["acceptance"]["draft_tokens"] == 0
        # the server's own counters over the level: the same drafts as the responses reported, nothing else
        sa, sb = a["server_metrics"], b["server_metrics"]
        assert sa["available"] and sb["available"], (sa, sb)
        assert (sa["draft_tokens"], sa["accepted_tokens"]) == (
            a["acceptance"]["draft_tokens"],
            a["acceptance"]["accepted_draft_tokens"],
        )
        assert sa["requests"] == sa["speculated_requests"] == 4 and sa["acceptance_rate"] == pytest.approx(
            a["acceptance"]["acceptance_rate"]
        )
        assert sb["requests"] == 4 and sb["speculated_requests"] == 0 and sb["acceptance_rate"] is None
        # several tokens per streamed chunk is what speculation looks like on the wire
        assert a["tokens_per_chunk"]["mean"] > 1.2 and b["tokens_per_chunk"]["mean"] < 1.1
        # the client's verdict follows from its own figures (whether it kept up depends on the machine)
        c = level["client"]["A"]
        kept_up = (
            c["dispatch_lag_ms"]["p99"] <= 5 and c["loop_lag_ms"]["p99"] <= 10 and c["cpu_fraction_per_worker"] <= 0.9
        )
        assert c["ok"] == kept_up and c["verdict"].startswith("ok" if kept_up else "client-bound"), c
    records = read_records(out / "requests.jsonl")
    assert len(records) == 2 * 2 + 2 * 4 * 2 + 12 * 2 + 1 * 60 * 2  # warm-up, levels, greedy, one context
    measured = [r for r in records if r.phase == "measure"]
    assert all(r.ok and r.output_tokens == 24 and r.ttft_s > 0 and r.e2e_s >= r.ttft_s for r in measured)
    text = {(r.target, r.level, r.prompt_index): r.text for r in measured}
    assert all(text[("A", lv, i)] == text[("B", lv, i)] for (_, lv, i) in text)  # greedy: identical output
    lossless = summary["lossless"]
    assert lossless["verdict"] == "inconclusive" and lossless["greedy"]["identical"] == 12
    assert all(p is not None and p > 0.005 / 2 for p in lossless["sampled"]["p_values"])
    assert all(w > lossless["power"]["max_detectable_w"] for w in lossless["power"]["detectable_w"])
    assert "data:image/png;base64" in (out / "report.html").read_text()
    assert len((out / "summary.csv").read_text().splitlines()) == 1 + 4


@pytest.fixture(scope="module")
def planted(triton):
    """The same draft-target repository served with each planted verification bug."""
    tmp, _ = triton
    servers = {}
    try:
        for bug in PLANTED:
            os.environ[PLANTED_ENV] = bug
            ports = Ports(*free_ports(3))
            servers[bug] = start_server(tmp / "model_repository" / "spec", ports, tmp / f"planted-{bug}.log")
        os.environ.pop(PLANTED_ENV)
        for server in servers.values():
            wait_ready(server, 300)
        yield servers
    finally:
        os.environ.pop(PLANTED_ENV, None)
        stop_all(servers.values())


@pytest.mark.slow
@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_the_served_lossless_check_fails_each_planted_bug(triton, planted, bug):
    """The rule itself, unplanted, passes with its power in the demo's test below."""
    tmp, s = triton
    out = tmp / f"lossless-{bug}"
    res = trtspec(
        "bench", grpc(planted[bug]), "--compare", grpc(s["base"]), "--tokenizer", TOKENIZER, "--dataset", PROMPTS,
        "--max-tokens", "8", "--num-requests", "2", "--verify-lossless", "--lossless-reference",
        str(tmp / "spec.yaml"), "--out", str(out), cwd=tmp,
    )  # fmt: skip
    lossless = json.loads((out / "summary.json").read_text())["lossless"]
    power = lossless["power"]["against_planted"]
    assert set(power) == set(PLANTED) and min(power.values()) >= 0.8, lossless["power"]
    assert res.returncode == 1 and lossless["verdict"] == "FAIL", res.stdout + res.stderr
    assert lossless["sampled"]["rejected"] or lossless["greedy"]["mismatched"], lossless
    assert "lossless check: FAIL" in res.stdout


def test_http_stream_open_loop_with_a_cap_queues_and_fails_the_slo(triton):
    tmp, s = triton
    out = tmp / "rate"
    url = f"triton-http://localhost:{s['spec'].ports.http}/tensorrt_llm"
    res = trtspec(
        "bench", url, "--tokenizer", TOKENIZER, "--rate", "50", "--max-concurrency", "1", "--num-requests", "8",
        "--input-len", "20", "--output-len", "12", "--slo", "ttft=1,tpot=0.01", "--fail-on-slo", "--out", str(out),
        cwd=tmp,
    )  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr
    assert "SLO missed" in res.stdout
    summary = json.loads((out / "summary.json").read_text())
    a = summary["levels"][0]["targets"]["A"]
    assert a["completed"] == 8 and a["slo"]["good_requests"] == 0
    # 50 req/s offered to one slot: requests wait in the client, and that wait is in their latency
    records = [r for r in read_records(out / "requests.jsonl") if r.phase == "measure"]
    assert max(r.queue_s for r in records) > 0.1
    assert all(r.ttft_s >= r.queue_s for r in records)
    assert all(r.input_tokens == 20 and r.requested_output_tokens == 12 for r in records)
    assert a["short_outputs"] == sum(r.output_tokens < 12 for r in records)


def test_a_server_killed_mid_run_keeps_every_completed_record(triton):
    tmp, _ = triton
    victim = serve_config("tiny-baseline.yaml", "victim", tmp)
    out = tmp / "killed"
    bench = subprocess.Popen(
        [sys.executable, "-m", "trtspec", "bench", grpc(victim), "--tokenizer", TOKENIZER, "--concurrency", "2",
         "--num-requests", "400", "--input-len", "16", "--output-len", "24", "--out", str(out)],
        cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            lines = (out / "requests.jsonl").read_text().splitlines() if (out / "requests.jsonl").exists() else []
            if len(lines) >= 6:
                break
            time.sleep(0.2)
        os.kill(victim.process.pid, signal.SIGKILL)
        stdout, stderr = bench.communicate(timeout=180)
    finally:
        victim.stop()
        bench.kill()
    assert bench.returncode == 1, stdout + stderr
    assert "server unreachable" in stdout + stderr and "results so far kept" in stdout + stderr
    summary = json.loads((out / "summary.json").read_text())
    a = summary["levels"][0]["targets"]["A"]
    assert not summary["complete"] and a["failed"] > 0 and a["completed"] >= 4
    assert a["completed"] + a["failed"] == 400
    records = read_records(out / "requests.jsonl")
    assert len(records) == len((out / "requests.jsonl").read_text().splitlines())  # every line parses
    done = [r for r in records if r.phase == "measure" and r.ok]
    assert len(done) == a["completed"] and all(r.text and r.output_tokens for r in done)


def test_bad_targets_are_one_line_errors(triton):
    tmp, s = triton
    res = trtspec("bench", f"triton-grpc://localhost:{s['spec'].ports.grpc}/nope", "--tokenizer", TOKENIZER, cwd=tmp)
    assert res.returncode == 2 and res.stderr.startswith("trtspec: error:") and "nope" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    res = trtspec("bench", f"triton-http://localhost:{free_port()}/m", "--tokenizer", TOKENIZER, cwd=tmp)
    assert res.returncode == 2 and "cannot connect" in res.stderr
    res = trtspec("bench", "localhost:8001", "--tokenizer", TOKENIZER, cwd=tmp)
    assert res.returncode == 2 and "PROTOCOL://HOST:PORT/MODEL" in res.stderr


@pytest.fixture
def openai_server(tmp_path):
    started = []

    def start(*args: str) -> int:
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "openai_server.py"), "--port", str(port), *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        started.append(proc)
        import urllib.request

        for _ in range(120):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                return port
            except OSError:
                time.sleep(0.25)
        raise AssertionError(proc.stdout.read())

    yield start
    for proc in started:
        proc.terminate()
        proc.wait(10)


@pytest.mark.parametrize("protocol", ["openai", "openai-chat"])
def test_openai_server_fixed_length_with_server_token_counts(openai_server, tmp_path, protocol):
    port = openai_server("--checkpoint", TOKENIZER)
    out = tmp_path / protocol
    res = trtspec(
        "bench", f"{protocol}://127.0.0.1:{port}/tiny", "--tokenizer", TOKENIZER, "--num-requests", "4",
        "--input-len", "24", "--output-len", "20", "--out", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout + res.stderr
    records = [r for r in read_records(out / "requests.jsonl") if r.phase == "measure"]
    assert len(records) == 4
    assert all(r.ok and r.output_tokens == 20 and r.output_tokens_source == "server" for r in records)
    assert all(sum(r.chunk_tokens) == 20 and len(r.chunk_times) == len(r.chunk_tokens) for r in records)


def test_an_error_inside_a_200_stream_is_counted(openai_server, tmp_path):
    port = openai_server("--checkpoint", TOKENIZER, "--fail-after", "4")  # 2 warm-up + 2 measured succeed
    out = tmp_path / "errors"
    res = trtspec(
        "bench", f"openai://127.0.0.1:{port}/tiny", "--tokenizer", TOKENIZER, "--num-requests", "6",
        "--input-len", "16", "--output-len", "8", "--out", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 1, res.stdout + res.stderr  # measured requests failed: the run says so and fails
    assert "4 of 6 measured requests failed" in res.stdout + res.stderr
    a = json.loads((out / "summary.json").read_text())["levels"][0]["targets"]["A"]
    assert (a["completed"], a["failed"]) == (2, 4)
    assert a["errors"] == ["engine failed"]


def test_demo_runs_to_the_end(tmp_path):
    """One method, both policies: the default's MTP pairs run the same code with another mode and cost CI
    2.5 minutes (served MTP's counted acceptance: test_serve_e2e's metrics test; an underpowered check's
    inconclusive verdict: above and test_lossless_check)."""
    res = trtspec(
        "demo", "--out", str(tmp_path / "demo"), "--requests", "4", "--methods", "draft-target", cwd=tmp_path,
        timeout=1200,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr
    verdicts = {}
    for mode in ("draft-target",):
        for policy in ("fixed", "adaptive"):
            pair = f"{mode}-{policy}-vs-baseline"
            summary = json.loads((tmp_path / "demo" / "results" / pair / "summary.json").read_text())
            assert summary["complete"] and (tmp_path / "demo" / "results" / pair / "report.html").exists()
            assert [lv["load"]["concurrency"] for lv in summary["levels"]] == [1, 2, 4, 8, 16]
            # server-side acceptance on every level, the same drafts the responses reported
            for level in summary["levels"]:
                a = level["targets"]["A"]
                server, client = a["server_metrics"], a["acceptance"]
                # a fixed K drafts in every request; the adaptive policy may turn drafting off under load
                speculated = server["speculated_requests"] if server["available"] else None
                assert speculated == 4 if policy == "fixed" else speculated in range(5), server
                # a level where the adaptive policy drafted nothing reports no accepted count (there is none)
                assert (server["draft_tokens"], server["accepted_tokens"]) == (
                    client["draft_tokens"],
                    client.get("accepted_draft_tokens", 0)
                    if client["draft_tokens"] == 0
                    else client["accepted_draft_tokens"],
                )
                if client["draft_tokens"]:
                    assert server["acceptance_rate"] == pytest.approx(client["acceptance_rate"])
            verdicts[pair] = summary.get("lossless")  # left out of summary.json where none ran
    # the lossless check runs on the fixed-K servers, whose K its power is computed for
    assert verdicts["draft-target-adaptive-vs-baseline"] is None
    dt = verdicts["draft-target-fixed-vs-baseline"]
    assert dt["verdict"] == "PASS" and min(dt["power"]["against_planted"].values()) >= 0.8, dt["power"]
    # a pipe gets the full table: both policies' server-side acceptance beside the client's, and the verdict
    assert "lossless check: PASS" in res.stdout and "server acc." in res.stdout
    assert "power against planted verification bugs" in res.stdout
    # the curve: every server's tokens/s per level, and where each stops paying (or that it never did)
    curve = json.loads((tmp_path / "demo" / "results" / "curve.json").read_text())
    assert sorted(curve["stops_paying_at"]) == sorted(f"draft-target-{p}" for p in POLICIES)
    assert sorted(curve["tokens_per_s"], key=int) == ["1", "2", "4", "8", "16"]
    for name, crossed in curve["stops_paying_at"].items():
        said = f"stops paying (mean latency) at concurrency {crossed}" if crossed else "pays (mean latency) at every"
        assert f"{name}: {said}" in res.stdout
