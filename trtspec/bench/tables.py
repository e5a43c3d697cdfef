"""The short tables a bench prints: one row per level and target, the A/B speedups, the verdicts."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from trtspec.bench.results import BenchSummary


def _f(value, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def print_summary(summary: BenchSummary, console: Console, out_dir) -> None:
    for label, url in summary.targets.items():
        console.print(f"{label}: {url}")
    table = Table(title="trtspec bench")
    cols = ("level", "target", "ok/fail", "req/s", "out tok/s", "TTFT p50", "TTFT p99", "TPOT mean", "ITL p99",
            "e2e mean", "e2e p99", "tok/chunk", "acceptance", "server acc.")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="left" if col in ("level", "target") else "right")
    for level in summary.levels:
        for label, s in level.targets.items():
            acc = s.acceptance
            if acc and acc.acceptance_rate is not None:
                accept = f"{acc.acceptance_rate:.2f} ({acc.accepted_tokens_per_step or 0:.2f}/step)"
            elif acc and acc.accepted_tokens_per_step is not None:
                accept = f"~{acc.accepted_tokens_per_step:.2f}/chunk (est.)"
            elif acc and acc.draft_tokens == 0:
                accept = "no drafts"
            else:
                accept = "-"
            srv = s.server_metrics  # ServerWindow.close(): a plain dict whose keys depend on what the server exports
            if srv.get("acceptance_rate") is not None:
                server = f"{srv['acceptance_rate']:.2f} ({srv['tokens_per_step']:.2f} tok/step)"
            else:
                server = "no drafts" if srv.get("available") else "-"
            table.add_row(
                level.level, label, f"{s.completed}/{s.failed}",
                _f(s.request_throughput, "{:.2f}"), _f(s.output_token_throughput),
                _f(s.ttft_ms and s.ttft_ms.p50), _f(s.ttft_ms and s.ttft_ms.p99),
                _f(s.tpot_ms and s.tpot_ms.mean, "{:.2f}"), _f(s.itl_ms and s.itl_ms.p99),
                _f(s.e2e_ms and s.e2e_ms.mean), _f(s.e2e_ms and s.e2e_ms.p99),
                _f(s.tokens_per_chunk and s.tokens_per_chunk.mean, "{:.2f}"), accept, server,
            )  # fmt: skip
    console.print(table)
    console.print(
        "latencies in ms, measured from each request's scheduled send time; acceptance: from the responses;"
        " server acc.: the change in the server's own counters over the level (every client's requests)"
    )
    if summary.comparison:
        ab = Table(title="A/B: A's speedup over B at each level (same prompts, same schedule)")
        for col in ("level", "latency", "TPOT", "throughput", "pays?"):
            ab.add_column(col)
        for row in summary.comparison:
            mark = "yes" if row.pays else ("NO: stops paying here" if row.stops_paying_here else "no")
            ab.add_row(
                row.level, f"{row.latency_speedup:.2f}x", _f(row.tpot_speedup, "{:.2f}x"),
                f"{row.throughput_ratio:.2f}x", mark,
            )  # fmt: skip
        console.print(ab)
    lossless = summary.lossless  # the lossless check's own dict
    if lossless:
        g, s = lossless["greedy"], lossless["sampled"]
        p = ", ".join("inconclusive" if v is None else f"{v:.3g}" for v in s["p_values"])
        console.print(
            f"lossless check: {'PASS' if lossless['pass'] else 'FAIL'}: temperature 0 identical on "
            f"{g['identical']}/{g['prompts']} prompts; temperature {lossless['temperature']:g}, first "
            f"{lossless['first_tokens']} tokens x {s['samples_per_side']} samples per side: chi-square p = [{p}] "
            f"(fail below {s['bonferroni_bound']:.4f})"
        )
    for level in summary.levels:
        for label, check in level.client.items():
            if not check.ok:
                console.print(f"[yellow]client {level.level} {label}: {check.verdict}[/yellow]")
        short = sum(s.short_outputs for s in level.targets.values())
        if short:
            console.print(f"[yellow]{level.level}: {short} outputs stopped short of the requested length[/yellow]")
        if level.aborted:
            console.print(f"[red]{level.level}: stopped: {level.aborted}[/red]")
    checks = [c for lv in summary.levels for c in lv.client.values()]
    if checks and all(c.ok for c in checks):
        worst = max(c.dispatch_lag_ms["p99"] for c in checks)
        console.print(f"client self-check: ok (p99 dispatch lag {worst:.2f} ms)")
    console.print(f"results: {out_dir}/ (requests.jsonl, summary.json, summary.csv, report.html)")
