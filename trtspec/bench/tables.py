"""The short tables a bench prints: one row per level and target, the A/B speedups, the verdicts.

Nothing is cut to fit: a terminal wide enough for every column with its full name gets one table;
a narrower one gets two (latency; throughput and speculation) with short headers and a legend. The
full names are in summary.json, summary.csv and the HTML report either way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from trtspec.bench.results import BenchSummary, LevelSummary, TargetSummary
from trtspec.bench.schedule import Load


def _f(value, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def _acceptance(s: TargetSummary) -> tuple[str, str, str]:
    """(the full cell, the rate, the tokens per step) from the responses; ~ marks an estimate."""
    acc = s.acceptance
    if acc is None or (acc.acceptance_rate is None and acc.accepted_tokens_per_step is None):
        drafted_none = acc is not None and acc.draft_tokens == 0
        return ("no drafts", "none", "-") if drafted_none else ("-", "-", "-")
    per_step = acc.accepted_tokens_per_step
    if acc.acceptance_rate is None:
        return f"~{per_step:.2f}/chunk (est.)", "-", f"~{per_step:.2f}"
    return f"{acc.acceptance_rate:.2f} ({per_step or 0:.2f}/step)", f"{acc.acceptance_rate:.2f}", _f(per_step, "{:.2f}")


def _server(s: TargetSummary) -> tuple[str, str, str]:
    """(the full cell, the rate, the tokens per step) from the server's own counters over the level."""
    srv = s.server_metrics  # ServerWindow.close(): a plain dict whose keys depend on what the server exports
    if srv.get("acceptance_rate") is not None:
        rate, per_step = srv["acceptance_rate"], srv["tokens_per_step"]
        return f"{rate:.2f} ({per_step:.2f} tok/step)", f"{rate:.2f}", f"{per_step:.2f}"
    return ("no drafts", "none", "-") if srv.get("available") else ("-", "-", "-")


class Column(NamedTuple):
    name: str  # the header of the full table
    short: str  # the header of the compact tables, explained by LEGEND where it needs it
    cell: Callable[[TargetSummary], str]


OK = Column("ok/fail", "ok/fail", lambda s: f"{s.completed}/{s.failed}")
LATENCY = (
    Column("TTFT p50", "TTFT50", lambda s: _f(s.ttft_ms and s.ttft_ms.p50)),
    Column("TTFT p99", "TTFT99", lambda s: _f(s.ttft_ms and s.ttft_ms.p99)),
    Column("TPOT mean", "TPOT", lambda s: _f(s.tpot_ms and s.tpot_ms.mean, "{:.2f}")),
    Column("ITL p99", "ITL99", lambda s: _f(s.itl_ms and s.itl_ms.p99)),
    Column("e2e mean", "e2e", lambda s: _f(s.e2e_ms and s.e2e_ms.mean)),
    Column("e2e p99", "e2e99", lambda s: _f(s.e2e_ms and s.e2e_ms.p99)),
)
THROUGHPUT = (
    Column("req/s", "req/s", lambda s: _f(s.request_throughput, "{:.2f}")),
    Column("out tok/s", "tok/s", lambda s: _f(s.output_token_throughput)),
)
CHUNK = Column("tok/chunk", "tok/ch", lambda s: _f(s.tokens_per_chunk and s.tokens_per_chunk.mean, "{:.2f}"))
FULL = (
    OK, *THROUGHPUT, *LATENCY, CHUNK,
    Column("acceptance", "", lambda s: _acceptance(s)[0]), Column("server acc.", "", lambda s: _server(s)[0]),
)  # fmt: skip
NOTE = (
    "latencies in ms, measured from each request's scheduled send time; acceptance: from the responses;"
    " server acc.: the change in the server's own counters over the level (every client's requests)"
)
# narrower: two tables, the acceptance cells split into their rate and tokens per step
COMPACT = (
    ("trtspec bench: requests and latency (ms)", (OK, *LATENCY)),
    ("trtspec bench: throughput and speculation", (
        *THROUGHPUT, CHUNK,
        Column("", "acc", lambda s: _acceptance(s)[1]), Column("", "t/step", lambda s: _acceptance(s)[2]),
        Column("", "srv acc", lambda s: _server(s)[1]), Column("", "srv t/step", lambda s: _server(s)[2]),
    )),
)  # fmt: skip
LEGEND = (
    "latencies in ms, measured from each request's scheduled send time; c=N: N requests in flight; R/s: sent per"
    " second (max N: at most N in flight); TPOT: mean time per output token; e2e: end-to-end mean; tok/s: output"
    " tokens/s; tok/ch: tokens per streamed chunk; acc, t/step: acceptance rate and tokens per decoding step from"
    " the responses (~: estimated from chunks); srv: the same from the server's own counters over the level"
    " (every client's requests); none: no drafts"
)


def short_level(load: Load) -> str:
    if load.concurrency is not None:
        return f"c={load.concurrency}"
    return f"{load.rate:g}/s" + (f" max {load.max_concurrency}" if load.max_concurrency else "")


def _new_table(title: str, compact: bool) -> Table:
    if compact:
        return Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
    return Table(title=title)


def _table(summary: BenchSummary, columns: tuple[Column, ...], title: str, compact: bool) -> Table:
    table = _new_table(title, compact)
    table.add_column("level" if not compact else "", no_wrap=True)
    table.add_column("target" if not compact else "", no_wrap=True)
    for col in columns:
        table.add_column(col.short if compact else col.name, justify="right", no_wrap=True)
    for level in summary.levels:
        name = short_level(level.load) if compact else level.level
        for i, (label, s) in enumerate(level.targets.items()):
            table.add_row(name if i == 0 else "", label, *(col.cell(s) for col in columns))
    return table


def _fits(console: Console, table: Table) -> bool:
    """Whether the table's natural width (every cell whole) is within the console's."""
    return Measurement.get(console, console.options.update_width(10_000), table).maximum <= console.width


def print_results_tables(summary: BenchSummary, console: Console) -> bool:
    """The per-level tables: one with full names where it fits, else two compact ones. True: compact."""
    full = _table(summary, FULL, "trtspec bench", compact=False)
    if _fits(console, full):
        console.print(full)
        console.print(NOTE)
        return False
    for title, columns in COMPACT:
        console.print(_table(summary, columns, title, compact=True))
    console.print(LEGEND)
    return True


def _lossless_line(lossless: dict) -> str:
    """The lossless check's verdict in one line (its dict is trtspec.bench.lossless.verdict's)."""
    g, s = lossless["greedy"], lossless["sampled"]
    p = ", ".join("inconclusive" if v is None else f"{v:.3g}" for v in s["p_values"])
    result = lossless.get("verdict") or ("PASS" if lossless["pass"] else "FAIL")
    line = (
        f"lossless check: {result}: temperature 0 identical on {g['identical']}/{g['prompts']} prompts; temperature"
        f" {lossless['temperature']:g}, first {lossless['first_tokens']} tokens x {s['samples_per_side']} samples"
        f" per side: chi-square p = [{p}] (fail below {s['bonferroni_bound']:.4f})"
    )
    note = f"\n  note: {lossless['note']}" if lossless.get("note") else ""
    return line + _power_line(lossless.get("power")) + note


def _power_line(power: dict | None) -> str:
    """What the check could have seen: its power against the planted bugs, or the shift it detects."""
    if not power:
        return ""
    target = f"{power['target']:.0%}"
    if power.get("against_planted"):
        bugs = ", ".join(f"{bug} {p:.0%}" for bug, p in power["against_planted"].items())
        return f"\n  power against planted verification bugs (needs {target}): {bugs}"
    widths = ", ".join("-" if w is None else f"{w:.2f}" for w in power["detectable_w"])
    return (
        f"\n  detects with {target} probability a shift of Cohen's w >= [{widths}] per context"
        f" (PASS needs <= {power['max_detectable_w']:g}; --lossless-reference measures power against planted bugs)"
    )


def _acceptance_disagreement(level: LevelSummary) -> list[str]:
    """Where the server's own counters and the responses' perf outputs give different acceptance."""
    notes = []
    for label, target in level.targets.items():
        server, client = target.server_metrics, target.acceptance
        if client is None or client.source != "server" or server.get("acceptance_rate") is None:
            continue
        if client.acceptance_rate is None or abs(server["acceptance_rate"] - client.acceptance_rate) > 0.005:
            mine = "-" if client.acceptance_rate is None else f"{client.acceptance_rate:.3f}"
            notes.append(
                f"{level.level} {label}: the server counted acceptance {server['acceptance_rate']:.3f} over the"
                f" level, the responses {mine}: other traffic on the server, or counters that disagree"
            )
    return notes


def _level_notes(level: LevelSummary, console: Console) -> None:
    for note in _acceptance_disagreement(level):
        console.print(f"[yellow]{note}[/yellow]")
    for label, check in level.client.items():
        if not check.ok:
            console.print(f"[yellow]client {level.level} {label}: {check.verdict}[/yellow]")
    short = sum(s.short_outputs for s in level.targets.values())
    if short:
        console.print(f"[yellow]{level.level}: {short} outputs stopped short of the requested length[/yellow]")
    if level.aborted:
        console.print(f"[red]{level.level}: stopped: {level.aborted}[/red]")


def for_output(console: Console) -> Console:
    """A log or a pipe gets room for the full table; a terminal keeps its width (narrower: compact)."""
    return console if console.is_terminal else Console(width=200)


def print_summary(summary: BenchSummary, console: Console, out_dir) -> None:
    for label, url in summary.targets.items():
        console.print(f"{label}: {url}")
    compact = print_results_tables(summary, console)
    if summary.comparison:
        names = {lv.level: short_level(lv.load) if compact else lv.level for lv in summary.levels}
        ab = _new_table("A/B: A's speedup over B, same prompts and schedule", compact)
        for col in ("level", "latency", "TPOT", "throughput", "pays?"):
            ab.add_column(col, no_wrap=True)
        for row in summary.comparison:
            mark = "yes" if row.pays else ("NO: stops paying here" if row.stops_paying_here else "no")
            ab.add_row(
                names[row.level], f"{row.latency_speedup:.2f}x", _f(row.tpot_speedup, "{:.2f}x"),
                f"{row.throughput_ratio:.2f}x", mark,
            )  # fmt: skip
        console.print(ab)
    if summary.lossless:
        console.print(_lossless_line(summary.lossless))
    for level in summary.levels:
        _level_notes(level, console)
    checks = [c for lv in summary.levels for c in lv.client.values()]
    if checks and all(c.ok for c in checks):
        worst = max(c.dispatch_lag_ms["p99"] for c in checks)
        console.print(f"client self-check: ok (p99 dispatch lag {worst:.2f} ms)")
    console.print(f"results: {out_dir}/ (requests.jsonl, summary.json, summary.csv, report.html)")
