"""trtspec bench without a server: the arrival process, the metrics on known timestamps, the
request contract per protocol, exact synthetic lengths and the tables; the lossless check has its own
file (tests/test_lossless_check.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import REPO
from scipy import stats
from transformers import AutoTokenizer

from trtspec.bench.datasets import LengthSpec, count_tokens, synthetic
from trtspec.bench.load import Item, TokenCounter, WorkerPlan, split
from trtspec.bench.metrics import SLO, acceptance, distribution, summarize
from trtspec.bench.protocols import Chunk, Contract, Request, Target
from trtspec.bench.records import RecordWriter, RequestRecord, read_records
from trtspec.bench.results import Acceptance, BenchSummary, ClientCheck, Distribution, LevelSummary, TargetSummary
from trtspec.bench.run import compare_levels
from trtspec.bench.schedule import Load, arrival_gaps, arrival_times
from trtspec.errors import UsageError
from trtspec.prompts import BUILTIN_PROMPTS, load_prompts

TOKENIZER = str(REPO / "trtspec" / "assets" / "tiny-target")


# ---- the arrival process -------------------------------------------------------------------------


def test_poisson_arrivals_have_the_configured_rate_and_exponential_gaps():
    rate, n = 8.0, 20_000
    gaps = arrival_gaps(n, rate, "poisson", seed=3)
    assert abs(gaps.mean() - 1 / rate) < 4 * (1 / rate) / np.sqrt(n)
    assert stats.kstest(gaps, "expon", args=(0, 1 / rate)).pvalue > 1e-3
    # counts in 1 s windows of a Poisson process: mean = variance = rate
    times = np.cumsum(gaps)
    counts = np.bincount(times.astype(int))[:-1]
    assert abs(counts.var() / counts.mean() - 1) < 0.1


def test_gamma_arrivals_follow_the_burstiness_and_the_test_tells_them_from_poisson():
    rate, n = 5.0, 20_000
    bursty = arrival_gaps(n, rate, "gamma", burstiness=0.25, seed=4)
    assert abs(bursty.mean() - 1 / rate) < 4 * bursty.std() / np.sqrt(n)
    assert stats.kstest(bursty, "gamma", args=(0.25, 0, 1 / (rate * 0.25))).pvalue > 1e-3
    # the same KS test rejects the bursty gaps as exponential: it has the power to fail
    assert stats.kstest(bursty, "expon", args=(0, 1 / rate)).pvalue < 1e-12
    assert stats.kstest(arrival_gaps(n, rate, "poisson", seed=4), "gamma", args=(0.25, 0, 0.8)).pvalue < 1e-12


def test_schedules_start_at_zero_and_are_absolute():
    times = arrival_times(50, Load(rate=10.0), seed=1)
    assert times[0] == 0 and np.all(np.diff(times) >= 0)
    assert np.allclose(arrival_times(4, Load(rate=2.0, arrival="constant")), [0, 0.5, 1.0, 1.5])
    assert np.all(arrival_times(5, Load(rate=float("inf"))) == 0)
    assert np.all(arrival_times(5, Load(concurrency=3)) == 0)
    with pytest.raises(ValueError):
        Load(concurrency=2, rate=1.0)
    with pytest.raises(ValueError):
        Load(rate=-1.0)


# ---- metrics on hand-made timestamps ---------------------------------------------------------------


def record(index, scheduled, sent, chunks, tokens, end, **kw) -> RequestRecord:
    return RequestRecord(
        index=index, target="A", level="rate=1", phase="measure", prompt_index=0, category=kw.pop("category", "x"),
        input_tokens=10, requested_output_tokens=kw.pop("requested", None), scheduled=scheduled, sent=sent,
        chunk_times=chunks, chunk_tokens=tokens, end=end, output_tokens=sum(tokens), output_tokens_source="server",
        **kw,
    )  # fmt: skip


def test_per_request_metrics_count_from_the_scheduled_time():
    # scheduled at 1.0, held by the concurrency cap until 1.5, first chunk at 1.7, chunks of 1, 3, 2 tokens
    r = record(0, 1.0, 1.5, [1.7, 1.9, 2.2], [1, 3, 2], 2.2)
    assert r.queue_s == pytest.approx(0.5)
    assert r.ttft_s == pytest.approx(0.7)  # not 0.2: the wait counts (no coordinated omission)
    assert r.e2e_s == pytest.approx(1.2)
    assert r.tpot_s == pytest.approx((2.2 - 1.7) / 5)  # decode time over the 5 tokens after the first
    assert r.itl_s == pytest.approx([0.2, 0.3])  # one sample per chunk
    failed = record(1, 0.0, 0.0, [0.1], [1], None, error="boom")
    assert not failed.ok and failed.e2e_s is None and failed.tpot_s is None


def perf(drafted: int, accepted: int) -> dict:
    return {"total_draft_tokens": drafted, "total_accepted_draft_tokens": accepted}


def test_aggregates_equal_hand_computed_values():
    records = [
        record(0, 0.0, 0.0, [0.1, 0.3, 0.5], [1, 2, 2], 0.5, perf=perf(4, 2)),
        record(1, 1.0, 1.0, [1.2, 1.6], [1, 3], 1.6, perf=perf(2, 2)),
        record(2, 2.0, 2.0, [], [], None, error="HTTP 500: x"),
    ]  # fmt: skip
    s = summarize(records, SLO.parse("ttft=150,tpot=200"))
    assert (s.requests, s.completed, s.failed) == (3, 2, 1)
    assert s.duration_s == pytest.approx(1.6)  # first scheduled -> last end
    assert s.output_token_throughput == pytest.approx(9 / 1.6)
    assert s.request_throughput == pytest.approx(2 / 1.6)
    assert s.ttft_ms.mean == pytest.approx(150.0)
    assert s.ttft_ms.max == pytest.approx(200.0)
    assert s.tpot_ms.mean == pytest.approx(((0.4 / 4) + (0.4 / 3)) / 2 * 1000)
    assert s.itl_ms.count == 3 and s.itl_ms.mean == pytest.approx(1000 * (0.2 + 0.2 + 0.4) / 3)
    assert s.e2e_ms.p50 == pytest.approx(550.0)
    # pooled over tokens: (2 + 2) / (4 + 2), and (4 + 3 produced after the first) / (7 - 4 accepted) steps
    assert s.acceptance.acceptance_rate == pytest.approx(4 / 6)
    assert s.acceptance.accepted_tokens_per_step == pytest.approx(7 / 3)
    assert s.acceptance.source == "server"
    assert (s.acceptance.draft_tokens, s.acceptance.accepted_draft_tokens) == (6, 4)
    # SLO: request 0 (ttft 100, tpot 100) is good, request 1 has ttft 200 > 150, the failure is not
    assert s.slo.good_requests == 1 and s.slo.attainment == pytest.approx(1 / 3)
    assert s.slo.goodput == pytest.approx(1 / 1.6)


def test_percentiles_and_estimated_acceptance():
    d = distribution(range(1, 101))
    assert [d.p50, d.p90, d.p99, d.max, d.mean] == pytest.approx([50.5, 90.1, 99.01, 100.0, 50.5])
    assert d.std == pytest.approx(np.std(range(1, 101)))
    est = acceptance([record(0, 0, 0, [0.1, 0.2, 0.3], [1, 3, 2], 0.3)])
    assert est.source.startswith("estimate") and est.accepted_tokens_per_step == pytest.approx(2.5)


def test_slo_parsing_rejects_bad_specs():
    assert SLO.parse("ttft=200,e2e=1500").limits_ms == {"ttft": 200.0, "e2e": 1500.0}
    for bad in ("ttft", "latency=3", "tpot=fast"):
        with pytest.raises(ValueError):
            SLO.parse(bad)


def dist(mean: float, p99: float | None = None) -> Distribution:
    p99 = mean * 3 if p99 is None else p99
    return Distribution(64, mean, mean / 4, mean / 3, mean * 0.9, p99 * 0.8, p99 * 0.9, p99, p99 * 1.1)


def measured(e2e_ms: float, tok_s: float, **kw) -> TargetSummary:
    """A target's summary at a level with every request completed: latencies scale with the e2e mean."""
    return TargetSummary(
        requests=1024, completed=1024, failed=0, not_sent=0, errors=[], short_outputs=0, duration_s=30.0,
        request_throughput=tok_s / 200, output_token_throughput=tok_s, input_token_throughput=tok_s / 2,
        output_tokens=int(tok_s * 30), ttft_ms=dist(e2e_ms / 10), tpot_ms=dist(e2e_ms / 100), itl_ms=dist(e2e_ms / 50),
        e2e_ms=dist(e2e_ms), queue_ms=dist(1.0), tokens_per_chunk=dist(1.0, 1.0), acceptance=Acceptance(None), **kw,
    )  # fmt: skip


def test_compare_marks_where_speculation_stops_paying():
    def level(n, a_ms, b_ms):
        a, b = measured(a_ms, 1000 / a_ms), measured(b_ms, 1000 / b_ms)
        return LevelSummary(f"concurrency={n}", Load(concurrency=n), {"A": a, "B": b})

    rows = compare_levels([level(1, 50, 100), level(8, 90, 100), level(32, 120, 100), level(64, 200, 100)])
    assert [r.latency_speedup for r in rows] == pytest.approx([2.0, 100 / 90, 100 / 120, 0.5])
    assert [r.pays for r in rows] == [True, True, False, False]
    assert [r.stops_paying_here for r in rows] == [False, False, True, False]
    assert [r.tpot_speedup for r in rows] == pytest.approx([2.0, 100 / 90, 100 / 120, 0.5])


def test_records_are_flushed_per_line_and_a_cut_line_is_skipped(tmp_path):
    path = tmp_path / "requests.jsonl"
    writer = RecordWriter(path)
    writer.write(record(0, 0.0, 0.0, [0.1], [1], 0.1))
    assert len(path.read_text().splitlines()) == 1  # on disk before close
    writer.write(record(1, 0.0, 0.0, [0.1], [1], 0.2))
    writer.close()
    with path.open("a") as fh:
        fh.write('{"index": 2, "target": "A", "lev')  # a kill mid-write
    back = read_records(path)
    assert [r.index for r in back] == [0, 1] and back[1].e2e_s == pytest.approx(0.2)


# ---- protocols and requests ------------------------------------------------------------------------


def test_targets_parse_and_bad_ones_are_usage_errors():
    t = Target.parse("grpc://gpu-host:8001/ensemble")
    assert (t.protocol, t.host, t.port, t.model) == ("triton-grpc", "gpu-host", 8001, "ensemble")
    assert str(Target.parse("openai-chat://localhost:9000/llama")) == "openai-chat://localhost:9000/llama"
    for bad in ("localhost:8001/x", "ftp://h:1/m", "http://h/m", "http://h:1/"):
        with pytest.raises(UsageError):
            Target.parse(bad)


def _contract(names: dict[str, str], decoupled: bool) -> Contract:
    metadata = {"name": "m", "inputs": [{"name": n, "datatype": d, "shape": [-1] if d == "BYTES" else [1]}
                                        for n, d in names.items()]}  # fmt: skip
    return Contract.from_metadata(metadata, {"model_transaction_policy": {"decoupled": decoupled}})


def test_llmapi_and_engine_contracts_get_their_own_names():
    names = {"text_input": "BYTES", "streaming": "BOOL", "sampling_param_max_tokens": "INT32"}
    names |= {"sampling_param_seed": "UINT64", "sampling_param_return_perf_metrics": "BOOL"}
    llmapi = _contract(names, True)
    values = llmapi.values(Request("hi", 32, min_tokens=32, seed=7))
    assert values == {"text_input": "hi", "streaming": True, "sampling_param_max_tokens": 32,
                      "sampling_param_seed": 7, "sampling_param_return_perf_metrics": True}  # fmt: skip
    assert not llmapi.supports_min_tokens  # TensorRT-LLM's llmapi model declares no min_tokens
    engine = _contract({"text_input": "BYTES", "max_tokens": "INT32", "stream": "BOOL", "min_tokens": "INT32",
                        "num_draft_tokens": "INT32"}, False)  # fmt: skip
    values = engine.values(Request("hi", 16, min_tokens=16))
    assert values == {"text_input": "hi", "max_tokens": 16, "stream": False, "min_tokens": 16}
    # speculation through NVIDIA's BLS: no min_tokens (it overrides it) and no exclude_input_in_output
    # (older BLS versions then find no drafts); the client cuts the prompt off the answer
    speculative = Request("hi", 16, min_tokens=16, extra={"num_draft_tokens": 3})
    values = engine.values(speculative)
    assert values == {"text_input": "hi", "max_tokens": 16, "stream": False, "num_draft_tokens": 3}
    assert engine.text(speculative, "hi there") == " there" and engine.text(Request("hi", 16), "hi x") == "hi x"
    with pytest.raises(UsageError):
        _contract({"input_ids": "INT32"}, False)


def test_token_counter_splits_chunks_and_prefers_server_counts():
    counter = TokenCounter(TOKENIZER)
    tok = counter.tokenizer
    text = "ROMEO:\nBut soft, what light through yonder window breaks?"
    ids = tok(text, add_special_tokens=False).input_ids
    pieces = [
        tok.decode(ids[:3]),
        tok.decode(ids[:7])[len(tok.decode(ids[:3])) :],
        tok.decode(ids)[len(tok.decode(ids[:7])) :],
    ]
    r = record(0, 0, 0, [0.1, 0.2, 0.3], [], 0.3)
    counter.fill(r, [Chunk(text=p) for p in pieces], None)
    assert sum(r.chunk_tokens) == r.output_tokens == len(ids) and r.output_tokens_source == "tokenizer"
    counter.fill(r, [Chunk(text="a", tokens=2), Chunk(text="b", tokens=5)], 7)
    assert (r.chunk_tokens, r.output_tokens, r.output_tokens_source) == ([2, 5], 7, "server")


def test_split_shares_the_cap_and_round_robins_items():
    items = [Item(i, i, None, float(i)) for i in range(10)]
    plan = WorkerPlan("openai://h:1/m", "A", Load(concurrency=5), "measure", items, 5, 8, False, 0.0, 0, 10.0,
                      None, 1.0, None)  # fmt: skip
    parts = split(plan, 3)
    assert [p.in_flight_cap for p in parts] == [2, 2, 1]
    assert sorted(i.index for p in parts for i in p.items) == list(range(10))
    assert [p.worker for p in parts] == [0, 1, 2]


# ---- datasets ---------------------------------------------------------------------------------------


def test_synthetic_prompts_are_exact_in_the_models_tokens(tmp_path):
    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    # a corpus of the project's own: the demo's prompts, many times over
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(p.text for p in load_prompts(BUILTIN_PROMPTS)) * 20)
    prompts = synthetic(tok, 12, LengthSpec(40, 10), LengthSpec(16, 4), corpus, seed=2)
    assert all(count_tokens(tok, p.text) == p.input_tokens for p in prompts)
    assert len({p.input_tokens for p in prompts}) > 3  # the std is honoured
    assert all(p.output_tokens >= 1 for p in prompts)
    random_vocab = synthetic(tok, 4, LengthSpec(25), LengthSpec(8), None, seed=3)
    assert [count_tokens(tok, p.text) for p in random_vocab] == [25] * 4


def test_server_metrics_parse_names_as_exposed_and_escaped_labels():
    from trtspec.bench.server_metrics import parse, total

    text = (
        "# TYPE nv_inference_count counter\n"
        'nv_inference_count{model="a",version="1"} 3\n'
        'nv_inference_count{model="b\\"q",version="1"} 4 1700000000000\n'
        'h_bucket{le="+Inf"} 2\n'
        "# HELP up whether the target answered\n"
        "up 1\n"
        'odd{model="modèle",path="a\\\\b\\nc"} NaN\n'
        "inf +Inf\n"
    )
    samples = parse(text)
    assert ("odd", frozenset({("model", "modèle"), ("path", "a\\b\nc")})) in samples
    assert total(samples, "inf") == float("inf")
    assert total(samples, "nv_inference_count") == 7 and total(samples, "nv_inference_count", model='b"q') == 4
    assert ("nv_inference_count_total", frozenset({("model", "a"), ("version", "1")})) not in samples
    assert total(samples, "up") == 1 and total(samples, "h_bucket", le="+Inf") == 2
    with pytest.raises(ValueError, match="not a Prometheus sample"):
        parse("this is { not metrics\n")


def test_server_window_says_why_it_has_no_figures():
    from trtspec.bench.server_metrics import NOT_EXPORTED, ServerWindow
    from trtspec.serve.server import free_ports

    assert ServerWindow(None).close()["available"] is False
    dead = ServerWindow(f"http://localhost:{free_ports(1)[0]}/metrics").close()
    assert dead["available"] is False and "cannot read server metrics" in dead["why"]
    assert NOT_EXPORTED.startswith("the server exports no trtspec")


def test_server_window_differences_the_counters_and_knows_nvidia_servers_have_none():
    """A stand-in /metrics page (http.server) whose counters move between the two reads."""
    import http.server
    import threading

    from trtspec.bench.server_metrics import NOT_EXPORTED, ServerWindow
    from trtspec.repository import spec_metrics as m

    pages = []

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = pages.pop(0).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args):
            pass

    def page(drafted: int, accepted: int, steps: int, requests: int) -> str:
        lbl = 'model="tensorrt_llm",mode="draft-target",version="1"'
        return (
            f"{m.DRAFT_TOKENS}{{{lbl}}} {drafted}\n{m.ACCEPTED_TOKENS}{{{lbl}}} {accepted}\n"
            f'{m.STEPS}{{{lbl}}} {steps}\n{m.REQUESTS}{{{lbl},speculative="true"}} {requests}\n'
            f'{m.REQUESTS}{{{lbl},speculative="false"}} 1\n'
        )

    server = http.server.HTTPServer(("localhost", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://localhost:{server.server_port}/metrics"
    try:
        pages[:] = [page(100, 40, 50, 3), page(160, 70, 70, 5)]
        got = ServerWindow(url).close()
        assert got["available"] and (got["draft_tokens"], got["accepted_tokens"], got["steps"]) == (60, 30, 20)
        assert got["acceptance_rate"] == 0.5 and got["tokens_per_step"] == 2.5
        assert got["requests"] == got["speculated_requests"] == 2
        pages[:] = ['nv_inference_count{model="tensorrt_llm",version="1"} 1\n'] * 2
        assert ServerWindow(url).close() == {"available": False, "why": NOT_EXPORTED, "url": url}
    finally:
        server.shutdown()


# ---- the client's verdict on itself ---------------------------------------------------------------


def test_client_check_blames_the_client_only_past_its_thresholds():
    from trtspec.bench.load import ClientStats
    from trtspec.bench.selfcheck import client_check

    calm = client_check(ClientStats(dispatch_lag_s=[0.001] * 100, loop_lag_s=[0.002] * 100, cpu_s=1, wall_s=10), 1)
    assert calm.ok and calm.verdict.startswith("ok")
    late = client_check(ClientStats(dispatch_lag_s=[0.001] * 90 + [0.05] * 10, cpu_s=1, wall_s=10), 1)
    assert not late.ok and "dispatch lag" in late.verdict and late.dispatch_lag_ms["max"] == pytest.approx(50)
    busy = client_check(ClientStats(cpu_s=19, wall_s=10), 2)
    assert not busy.ok and "client CPU 95% of 2 worker(s)" in busy.verdict
    assert client_check(ClientStats(cpu_s=17, wall_s=10), 2).ok


# ---- the shape of summary.json ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def trivial_openai():
    """tests/openai_server.py --trivial: a stream of one-token chunks, no model (fast, in a subprocess)."""
    import subprocess
    import sys
    import time
    import urllib.request

    from trtspec.serve.server import free_ports

    port = free_ports(1)[0]
    server = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "openai_server.py"), "--port", str(port), "--trivial"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for _ in range(200):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)
        yield f"openai://127.0.0.1:{port}/trivial"
    finally:
        server.terminate()
        server.wait(10)


def _metrics_page():
    """A stand-in Triton /metrics whose trtspec counters move by 10 drafts and 4 accepted per read."""
    import http.server
    import threading

    from trtspec.repository import spec_metrics as m

    reads = [0]

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            n = reads[0] = reads[0] + 1
            lbl = 'model="tensorrt_llm",mode="draft-target",version="1"'
            body = (
                f"{m.DRAFT_TOKENS}{{{lbl}}} {10 * n}\n{m.ACCEPTED_TOKENS}{{{lbl}}} {4 * n}\n"
                f'{m.STEPS}{{{lbl}}} {5 * n}\n{m.REQUESTS}{{{lbl},speculative="true"}} {2 * n}\n'
            )
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *_args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


# The keys of summary.json, in order, at every level: the HTML report and users' scripts read them.
SUMMARY_KEYS = ["started", "targets", "options", "levels", "complete", "comparison", "lossless", "slo_failed"]
OPTIONS_KEYS = ["num_requests", "duration_s", "warmup", "max_tokens", "fixed_length", "temperature", "workers",
                "prompts", "slo_attainment"]  # fmt: skip
LEVEL_KEYS = ["level", "load", "targets", "client"]
LOAD_KEYS = ["concurrency", "rate", "max_concurrency", "arrival", "burstiness"]
TARGET_KEYS = ["requests", "completed", "failed", "not_sent", "errors", "short_outputs", "cancelled_at_end",
               "duration_s", "request_throughput", "output_token_throughput", "input_token_throughput",
               "output_tokens", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms", "tokens_per_chunk", "acceptance",
               "slo", "by_category", "server_metrics", "min_tokens_sent"]  # fmt: skip
FAILED_TARGET_KEYS = ["requests", "completed", "failed", "not_sent", "errors", "short_outputs", "cancelled_at_end",
                      "by_category",
                      "server_metrics", "min_tokens_sent"]  # fmt: skip
DISTRIBUTION_KEYS = ["count", "mean", "std", "min", "p50", "p90", "p95", "p99", "max"]
ESTIMATED_ACCEPTANCE_KEYS = ["source", "acceptance_rate", "accepted_tokens_per_step"]
SLO_KEYS = ["limits_ms", "good_requests", "attainment", "goodput"]
CATEGORY_KEYS = ["completed", "tpot_ms", "acceptance"]
SERVER_KEYS = ["available", "url", "requests", "speculated_requests", "steps", "draft_tokens", "accepted_tokens",
               "acceptance_rate", "tokens_per_step"]  # fmt: skip
NO_SERVER_KEYS = ["available", "why", "url"]
CLIENT_KEYS = ["workers", "dispatch_lag_ms", "loop_lag_ms", "cpu_fraction_per_worker", "ok", "verdict"]
COMPARISON_KEYS = ["level", "latency_speedup", "tpot_speedup", "throughput_ratio", "pays", "stops_paying_here"]


def test_summary_json_keeps_its_keys_at_every_level(trivial_openai, tmp_path, runner, monkeypatch):
    from trtspec.cli import cli

    # the lossless check's result is its own module's dict, stored whole under "lossless"
    monkeypatch.setattr("trtspec.bench.run.run_lossless", lambda *_args: {"pass": True})
    page = _metrics_page()
    try:
        out = tmp_path / "ab"
        result = runner.invoke(cli, [
            "bench", trivial_openai, "--compare", trivial_openai, "--tokenizer", TOKENIZER,
            "--dataset", str(REPO / "trtspec" / "assets" / "demo_prompts.jsonl"), "--per-category", "1",
            "--max-tokens", "6", "--concurrency", "1,2", "--num-requests", "4", "--warmup", "1", "--slo", "e2e=60000",
            "--verify-lossless", "--lossless-samples", "20", "--natural-length", "--out", str(out), "--json",
            "--server-metrics", f"http://127.0.0.1:{page.server_port}/metrics",
        ])  # fmt: skip
    finally:
        page.shutdown()
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert json.loads(result.stdout) == summary  # --json prints what summary.json holds
    assert list(summary) == SUMMARY_KEYS and list(summary["options"]) == OPTIONS_KEYS
    assert summary["complete"] and summary["slo_failed"] == [] and summary["lossless"] == {"pass": True}
    assert [lv["level"] for lv in summary["levels"]] == ["concurrency=1", "concurrency=2"]
    for level in summary["levels"]:
        assert list(level) == LEVEL_KEYS and list(level["load"]) == LOAD_KEYS
        assert list(level["targets"]) == list(level["client"]) == ["A", "B"]
        for label, t in level["targets"].items():
            assert list(t) == TARGET_KEYS
            for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms", "tokens_per_chunk"):
                assert list(t[metric]) == DISTRIBUTION_KEYS, metric
            assert list(t["acceptance"]) == ESTIMATED_ACCEPTANCE_KEYS and list(t["slo"]) == SLO_KEYS
            assert list(t["by_category"]) == ["comedy", "history", "tragedy"]
            for category in t["by_category"].values():
                assert list(category) == CATEGORY_KEYS and list(category["tpot_ms"]) == DISTRIBUTION_KEYS
            assert list(t["server_metrics"]) == (SERVER_KEYS if label == "A" else NO_SERVER_KEYS)
            assert t["min_tokens_sent"] is False
            assert list(level["client"][label]) == CLIENT_KEYS
            assert list(level["client"][label]["dispatch_lag_ms"]) == ["p50", "p99", "max"]
        assert level["targets"]["A"]["server_metrics"]["draft_tokens"] == 10
    assert [list(row) for row in summary["comparison"]] == [COMPARISON_KEYS] * 2


def test_summary_of_a_target_with_nothing_completed_keeps_its_short_shape():
    from trtspec.bench.load import ClientStats
    from trtspec.bench.results import to_json
    from trtspec.bench.run import BenchOptions, target_summary

    failed = [record(i, 0.0, 0.0, [], [], None, error="HTTP 500: x") for i in range(3)]
    opts = BenchOptions(targets={"A": "openai://h:1/m"}, levels=[], prompts=[], out_dir=REPO, slo=SLO.parse("e2e=9"))
    s = target_summary(failed, opts, {"available": False, "why": "down", "url": None}, ClientStats())
    assert list(to_json(s)) == FAILED_TARGET_KEYS and to_json(s)["errors"] == ["HTTP 500: x"]
    level = LevelSummary("rate=2", Load(rate=2.0), {"A": s}, aborted="the server stopped answering")
    assert list(to_json(level)) == [*LEVEL_KEYS, "aborted"]
    # before the first level: no comparison yet, and no slo_failed until the run ends
    assert list(BenchSummary("t", {"A": "u"}, {}).to_json()) == ["started", "targets", "options", "levels", "complete"]


# ---- the tables fit the terminal ------------------------------------------------------------------


def _realistic_summary() -> BenchSummary:
    """An A/B run over four levels (one open-loop with a cap), with server-side acceptance and the
    lossless check: A speculates and stops paying at concurrency 64."""
    levels = []
    loads = [Load(concurrency=1), Load(concurrency=16), Load(concurrency=64), Load(rate=12.5, max_concurrency=128)]
    for i, (load, ratio) in enumerate(zip(loads, (0.45, 0.8, 1.15, 1.3), strict=True)):
        b_ms = 1234.5 * (i + 1) ** 2
        server_a = {"available": True, "url": "http://gpu-host:8002/metrics", "requests": 64,
                    "speculated_requests": 64, "steps": 1800, "draft_tokens": 7200, "accepted_tokens": 4464,
                    "acceptance_rate": 0.62, "tokens_per_step": 3.48}  # fmt: skip
        server_b = {**server_a, "url": "http://gpu-host:8102/metrics", "speculated_requests": 0, "steps": 4096,
                    "draft_tokens": 0, "accepted_tokens": 0, "acceptance_rate": None,
                    "tokens_per_step": None}  # fmt: skip
        a = measured(b_ms * ratio, 12345.6 / ratio, server_metrics=server_a, min_tokens_sent=True)
        a.acceptance = Acceptance("server", 0.6234, 2.4812, draft_tokens=7200, accepted_draft_tokens=4488)
        a.tokens_per_chunk = dist(2.48, 5.0)
        b = measured(b_ms, 12345.6, server_metrics=server_b, min_tokens_sent=True)
        b.acceptance = Acceptance("server", draft_tokens=0)
        a.completed, a.failed = 1022, 2  # four-digit counts and a failure or two
        check = ClientCheck(1, {"p50": 0.1, "p99": 0.42, "max": 1.3}, {"p50": 0.2, "p99": 0.9, "max": 2.0}, 0.21, True,
                            "ok: the client kept up")  # fmt: skip
        levels.append(LevelSummary(load.label, load, {"A": a, "B": b}, {"A": check, "B": check}))
    lossless = {
        "verdict": "PASS", "pass": True, "greedy": {"prompts": 12, "identical": 12, "mismatched": []},
        "sampled": {"prompts": 2, "samples_per_side": 600, "p_values": [0.412, 0.733], "chi_square": [3.1, 1.2],
                    "df": [3, 2], "strata": [1, 1], "alpha": 0.01, "bonferroni_bound": 0.005, "rejected": []},
        "power": {"target": 0.8, "detectable_w": [0.31, 0.29], "max_detectable_w": None,
                  "against_planted": {"residual-from-p": 0.97, "bonus-position-skipped": 1.0}, "planted": {}},
        "inconclusive": [], "temperature": 1.0, "first_tokens": 4,
    }  # fmt: skip
    return BenchSummary(
        "2025-06-01T12:00:00+0000",
        {"A": "triton-grpc://gpu-host:8001/tensorrt_llm_bls", "B": "triton-grpc://gpu-host:8101/tensorrt_llm"},
        {}, levels, True, compare_levels(levels), lossless, [],
    )  # fmt: skip


def _render(summary: BenchSummary, width: int) -> str:
    import io

    from rich.console import Console

    from trtspec.bench.tables import print_summary

    console = Console(file=io.StringIO(), width=width, record=True)
    print_summary(summary, console, "results/bench-x")
    return console.export_text()


@pytest.mark.parametrize("width", [80, 100, 150])
def test_the_tables_cut_nothing_in_a_narrow_terminal(width):
    text = _render(_realistic_summary(), width)
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= width, text
    # short headers, explained below the tables; every figure still there
    assert "TTFT99" in text and "srv t/step" in text and "acc, t/step: acceptance rate" in text
    assert "12.5/s max 128" in text and "1022/2" in text and "0.62" in text and "3.48" in text
    assert "NO: stops paying here" in text and "lossless check: PASS" in text
    assert "power against planted verification bugs (needs 80%): residual-from-p 97%, bonus-position-skipped 100%" in (
        " ".join(text.split())
    )


def test_a_wide_terminal_gets_one_table_with_the_full_names():
    text = _render(_realistic_summary(), 200)
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 200
    header = next(line for line in text.splitlines() if "TTFT p99" in line)
    for name in ("level", "target", "ok/fail", "out tok/s", "TPOT mean", "tok/chunk", "acceptance", "server acc."):
        assert name in header
    assert "rate=12.5,max_concurrency=128" in text and "0.62 (3.48 tok/step)" in text


def test_the_tables_say_where_server_and_responses_disagree_on_acceptance():
    summary = _realistic_summary()
    assert "disagree" not in _render(summary, 200)  # 0.620 against 0.623: the same drafts, rounded
    first = summary.levels[0].targets["A"]
    first.server_metrics = {**first.server_metrics, "acceptance_rate": 0.70}
    text = " ".join(_render(summary, 200).split())
    assert "concurrency=1 A: the server counted acceptance 0.700 over the level, the responses 0.623" in text
    assert text.count("counters that disagree") == 1
