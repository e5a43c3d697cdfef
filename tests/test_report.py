"""report.html as a person sees it: rendered from a realistic A/B summary, opened in real headless
Chromium (Debian's package, driven by Playwright), and checked for what a reader needs: the answer
before the figures, every figure drawn with data, no horizontal scrolling on a 1280-pixel laptop
screen, no raw JSON, and no script errors. The checks are shown to fail when a figure is removed or
drawn empty. TRTSPEC_REPORT_SCREENSHOT=path also saves the full-page screenshot there (docs/img)."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
from conftest import require_tool

from trtspec.bench import report
from trtspec.bench.records import RequestRecord

TARGETS = {"A": "triton://gpu-0.example:8001/tensorrt_llm_bls", "B": "triton://gpu-1.example:8001/tensorrt_llm_bls"}
LEVELS = ("concurrency=1", "concurrency=8")
DRAWN = ("fig-speedup", "fig-load", "fig-latency-cdf", "fig-tokens-per-step")
OMITTED = ("fig-acceptance-position",)  # the bench pools acceptance over draft positions
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


def _records(label: str, level: str, concurrency: int, rng: np.random.Generator) -> list[RequestRecord]:
    """32 requests of 48 tokens: A streams speculative steps of 1-4 tokens, B one token a step; both
    slow down with load, A more so (its draft model shares the GPU)."""
    out, batch_start, batch_end = [], 0.0, 0.0
    step_ms = (9.0 if label == "A" else 7.0) * (1 + 0.35 * np.log2(concurrency))
    for i in range(32):
        if i % concurrency == 0:  # a closed loop, simplified: the next batch starts when this one ends
            batch_start = batch_end
        scheduled = batch_start
        now = scheduled + rng.gamma(4, 0.012) * (1 + 0.2 * concurrency)
        chunks, times, drafted, accepted = [1], [now], 0, 0
        while sum(chunks) < 48:
            n = min(int(rng.choice([1, 2, 3, 4], p=[0.2, 0.3, 0.3, 0.2])) if label == "A" else 1, 48 - sum(chunks))
            drafted, accepted = drafted + 3, accepted + n - 1
            now += rng.gamma(6, step_ms / 6) / 1000
            chunks.append(n)
            times.append(now)
        batch_end = max(batch_end, now)
        perf = {"total_draft_tokens": drafted, "total_accepted_draft_tokens": accepted} if label == "A" else {}
        out.append(RequestRecord(
            index=i, target=label, level=level, phase="measure", prompt_index=i % 8, category="chat",
            input_tokens=200, requested_output_tokens=48, scheduled=scheduled, sent=scheduled, chunk_times=times,
            chunk_tokens=chunks, end=now, output_tokens=48, output_tokens_source="server", text="…", perf=perf,
        ))  # fmt: skip
    return out


def _lossless() -> dict:
    """The lossless check's result as trtspec.bench.lossless_run writes it, with a key the report has never seen."""
    planted = {
        "residual-from-p": [{"statistic": 92.4, "df": 31, "p_value": 2e-8, "caught": True, "power": 0.999}],
        "bonus-position-skipped": [{"statistic": 410.0, "df": 28, "p_value": 1e-70, "caught": True, "power": 1.0}],
    }
    return {
        "verdict": "PASS", "pass": True,
        "greedy": {"prompts": 8, "identical": 8, "mismatched": []},
        "sampled": {"prompts": 1, "samples_per_side": 1000, "baseline_samples": 4000, "p_values": [0.41],
                    "chi_square": [30.1], "df": [29], "strata": [6], "alpha": 0.01, "bonferroni_bound": 0.01,
                    "rejected": []},
        "power": {"target": 0.8, "detectable_w": [0.21], "max_detectable_w": None,
                  "against_planted": {"residual-from-p": 0.999, "bonus-position-skipped": 1.0}, "planted": planted},
        "inconclusive": [], "temperature": 1.0, "first_tokens": 4,
        "contexts": ["ROMEO:\nBut soft, what light through yonder window breaks?"],
        "reference": "configs/tiny-draft-target.yaml", "baseline": "target in-process",
        "seen_by_no_report": {"yet": 1},
    }  # fmt: skip


def _dist(values, scale: float = 1.0) -> dict:
    v = np.array([x for x in values if x is not None], dtype=float) * scale
    pct = {f"p{p}": float(np.percentile(v, p)) for p in (50, 90, 95, 99)}
    return {"count": int(v.size), "mean": float(v.mean()), "std": float(v.std()), "min": float(v.min()), **pct,
            "max": float(v.max())}  # fmt: skip


def _target(records: list[RequestRecord], label: str) -> dict:
    """One target at one level, with summary.json's keys in its order (tests/test_bench.py TARGET_KEYS)."""
    start, end = min(r.scheduled for r in records), max(r.end for r in records)
    tokens = sum(r.output_tokens for r in records)
    drafted = sum(r.perf.get("total_draft_tokens", 0) for r in records)
    accepted = sum(r.perf.get("total_accepted_draft_tokens", 0) for r in records)
    steps = tokens - len(records) - accepted
    acceptance = (
        {"source": "server", "acceptance_rate": accepted / drafted, "accepted_tokens_per_step": (steps + accepted)
         / steps, "draft_tokens": drafted, "accepted_draft_tokens": accepted}
        if drafted else {"source": "estimate (tokens per chunk)", "acceptance_rate": None,
                         "accepted_tokens_per_step": float(np.mean([n for r in records for n in r.chunk_tokens[1:]]))}
    )  # fmt: skip
    good = sum(r.e2e_s < 1.5 for r in records)
    s = {
        "requests": len(records), "completed": len(records), "failed": 0, "not_sent": 0, "errors": [],
        "short_outputs": 0, "duration_s": end - start, "request_throughput": len(records) / (end - start),
        "output_token_throughput": tokens / (end - start),
        "input_token_throughput": sum(r.input_tokens for r in records) / (end - start), "output_tokens": tokens,
        "ttft_ms": _dist((r.ttft_s for r in records), 1000), "tpot_ms": _dist((r.tpot_s for r in records), 1000),
        "itl_ms": _dist((g for r in records for g in r.itl_s), 1000), "e2e_ms": _dist((r.e2e_s for r in records), 1000),
        "queue_ms": _dist((r.queue_s for r in records), 1000),
        "tokens_per_chunk": _dist(n for r in records for n in r.chunk_tokens), "acceptance": acceptance,
        "slo": {"limits_ms": {"e2e": 1500.0}, "good_requests": good, "attainment": good / len(records),
                "goodput": good / (end - start)},
    }  # fmt: skip
    s["by_category"] = {"chat": {k: s[k] for k in ("completed", "tpot_ms", "acceptance")}}
    s["server_metrics"] = (
        {"available": True, "url": "http://gpu-0.example:8002/metrics", "requests": 32.0, "speculated_requests": 32.0,
         "steps": float(steps), "draft_tokens": float(drafted), "accepted_tokens": float(accepted),
         "acceptance_rate": accepted / drafted, "tokens_per_step": 1 + accepted / steps}
        if label == "A" else {"available": False, "why": "no metrics URL", "url": None}
    )  # fmt: skip
    s["min_tokens_sent"] = True
    return s


def _client(rng: np.random.Generator) -> dict:
    dispatch, loop = (np.sort(rng.uniform(0, ms, 32)) for ms in (2.0, 3.0))
    lag = lambda x: {"p50": float(np.percentile(x, 50)), "p99": float(np.percentile(x, 99)), "max": float(x.max())}  # noqa: E731
    return {"workers": 1, "dispatch_lag_ms": lag(dispatch), "loop_lag_ms": lag(loop), "cpu_fraction_per_worker": 0.13,
            "ok": True, "verdict": "ok: the client kept up"}  # fmt: skip


def _comparison(a: dict, b: dict, level: str) -> dict:
    speedup = b["e2e_ms"]["mean"] / a["e2e_ms"]["mean"]
    return {"level": level, "latency_speedup": speedup, "tpot_speedup": b["tpot_ms"]["mean"] / a["tpot_ms"]["mean"],
            "throughput_ratio": a["output_token_throughput"] / b["output_token_throughput"], "pays": speedup > 1,
            "stops_paying_here": False}  # fmt: skip


def realistic_run() -> tuple[dict, list[RequestRecord]]:
    """A summary with summary.json's shape and contents of a real A/B run at 2 levels, and its records.

    Built here from the records, not through the bench's own aggregation, so the report's test does
    not move with that code; its keys and their order are those tests/test_bench.py pins."""
    rng = np.random.default_rng(7)
    summary = {"started": "2025-06-01T10:00:00+0000", "targets": TARGETS,
               "options": {"num_requests": 32, "duration_s": None, "warmup": 2, "max_tokens": 48,
                           "fixed_length": True, "temperature": 0.0, "workers": 1, "prompts": 8,
                           "slo_attainment": 0.95},
               "levels": [], "complete": True, "comparison": []}  # fmt: skip
    records = []
    for level, concurrency in zip(LEVELS, (1, 8), strict=True):
        entry = {"level": level, "load": {"concurrency": concurrency, "rate": None, "max_concurrency": None,
                 "arrival": "poisson", "burstiness": 1.0}, "targets": {}, "client": {}}  # fmt: skip
        for label in TARGETS:
            mine = _records(label, level, concurrency, rng)
            records += mine
            entry["targets"][label] = _target(mine, label)
            entry["client"][label] = _client(rng)
        summary["levels"].append(entry)
        summary["comparison"].append(_comparison(entry["targets"]["A"], entry["targets"]["B"], level))
    summary.update(lossless=_lossless(), slo_failed=[])
    return summary, records


# ---- in the browser --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    chromium = require_tool("chromium", "apt-get install chromium; .ci/run does")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        why = "playwright is not installed (pip install -e '.[test]')"
        pytest.fail(why) if os.environ.get("CI") else pytest.skip(why)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        yield b
        b.close()


PIXELS = """id => {
  const img = document.querySelector(`#${id} img`);
  if (!img) return null;
  const c = document.createElement('canvas');
  c.width = img.naturalWidth; c.height = img.naturalHeight;
  const ctx = c.getContext('2d');
  if (!img.complete || !c.width) return {complete: img.complete, width: img.naturalWidth, coloured: 0};
  ctx.drawImage(img, 0, 0);
  const d = ctx.getImageData(0, 0, c.width, c.height).data;
  let coloured = 0;  // data lines are coloured; axes, ticks and grid are grey
  for (let i = 0; i < d.length; i += 4)
    if (Math.max(d[i], d[i+1], d[i+2]) - Math.min(d[i], d[i+1], d[i+2]) > 80) coloured++;
  return {complete: img.complete, width: img.naturalWidth, coloured};
}"""


def open_report(browser, path):
    """The page at a laptop's 1280x800, with the console errors and page errors it raised."""
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(f"console: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.goto(path.as_uri())
    page.wait_for_load_state("load")
    return page, errors


def check_page(page, errors: list[str]) -> None:
    problems = list(errors)
    for fid in DRAWN:
        seen = page.evaluate(PIXELS, fid)
        if seen is None:
            problems.append(f"figure {fid} is missing")
        elif not (seen["complete"] and seen["width"] > 0):
            problems.append(f"figure {fid} did not load: {seen}")
        elif seen["coloured"] < 300:
            problems.append(f"figure {fid} is drawn without data ({seen['coloured']} coloured pixels)")
        elif not page.locator(f"#{fid} figcaption").inner_text().strip():
            problems.append(f"figure {fid} has no caption")
    for fid in OMITTED:
        if page.locator(f"#{fid}").count() or not page.locator(f"#{fid}-omitted").count():
            problems.append(f"figure {fid} should be left out with the reason")
    width = page.evaluate("document.documentElement.scrollWidth")
    if width > 1280:
        problems.append(f"the page is {width} px wide: it scrolls sideways on a 1280-px screen")
    text = page.inner_text("body")
    for raw in ('{"', "{'", '":', "[{"):
        if raw in text:
            problems.append(f"raw JSON on the page: ...{text[max(text.index(raw) - 60, 0) : text.index(raw) + 60]}...")
    order = page.evaluate("""() => {
      const a = document.getElementById('answer'), f = document.querySelector('figure');
      return !!a && !!f && !!(a.compareDocumentPosition(f) & Node.DOCUMENT_POSITION_FOLLOWING)
        && a.getBoundingClientRect().bottom <= f.getBoundingClientRect().top; }""")
    if not order:
        problems.append("the answer section does not come before the figures")
    assert not problems, "; ".join(problems)


def test_report_reads_as_a_report_in_a_browser(browser, tmp_path):
    summary, records = realistic_run()
    report.write_reports(tmp_path, summary, records)
    page, errors = open_report(browser, tmp_path / "report.html")
    check_page(page, errors)
    answer = page.inner_text("#answer")
    assert "Yes, at every level measured (2)" in answer
    assert "8 of 8 prompts gave identical text" in answer
    assert "Seen by no report" in answer and "planted bug residual-from-p" in answer  # power, in words
    assert "1,000 samples from A against 4,000 of the target in-process" in answer
    assert "ok: the client kept up" in answer
    assert page.locator("a[href='summary.json']").count() and page.locator("a[href='summary.csv']").count()
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    if os.environ.get("TRTSPEC_REPORT_SCREENSHOT"):
        shutil.copyfile(tmp_path / "report.png", os.environ["TRTSPEC_REPORT_SCREENSHOT"])
    page.close()


def _empty_figure(summary, records):
    plt = report._plt()
    fig, ax = plt.subplots(figsize=(12, 3.4))
    ax.set(title="Tokens per step")
    return "drawn with no data", report._png(fig)


@pytest.mark.parametrize(
    ("builder", "replacement", "message"),
    [("fig_latency_cdf", lambda summary, records: "removed by the test", "figure fig-latency-cdf is missing"),
     ("fig_tokens_per_step", _empty_figure, "figure fig-tokens-per-step is drawn without data")],
)  # fmt: skip
def test_the_checks_catch_a_figure_removed_or_drawn_empty(
    browser, tmp_path, monkeypatch, builder, replacement, message
):
    monkeypatch.setattr(report, builder, replacement)
    summary, records = realistic_run()
    report.write_reports(tmp_path, summary, records)
    page, errors = open_report(browser, tmp_path / "report.html")
    with pytest.raises(AssertionError, match=message):
        check_page(page, errors)
    page.close()


# ---- without a browser -----------------------------------------------------------------------------


def test_text_from_the_summary_is_escaped_and_missing_parts_say_why(tmp_path):
    summary, _ = realistic_run()
    summary["targets"] = {"A": "openai://h:1/<script>alert(1)</script>"}
    for level in summary["levels"]:
        level["targets"].pop("B")
        level["client"].pop("B")
    summary["comparison"], summary["lossless"] = [], {"verdict": "FAIL", "new_key": {"<b>bug</b>": 0.5}}
    page = report.render(summary, [])
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<b>bug</b>" not in page and "&lt;b&gt;bug&lt;/b&gt;" in page
    assert "no baseline to compare with" in page and "not lossless" in page
    assert "id='fig-speedup-omitted'" in page and "id='fig-latency-cdf-omitted'" in page
    assert "<img" in page  # throughput against load needs no baseline and no records


def test_requests_cut_at_a_timed_levels_end_are_not_listed_as_failures():
    from trtspec.bench.records import CANCELLED_AT_END
    from trtspec.bench.report import levels_section

    target = {
        "requests": 10,
        "completed": 7,
        "failed": 3,
        "cancelled_at_end": 2,
        "errors": [CANCELLED_AT_END, "HTTP 500"],
    }
    page = levels_section({"levels": [{"level": "c=4", "targets": {"A": target}}]})
    assert "c=4 A: 1 of 10 failed (HTTP 500)" in page
    assert "c=4 A: 2 still running at the level&#x27;s end, cancelled by design" in page
    assert "3 of 10 failed" not in page
