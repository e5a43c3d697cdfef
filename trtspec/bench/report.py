"""The results directory: summary.json, summary.csv and report.html, each written atomically;
requests.jsonl is written by the run itself as requests finish.

report.html is for a person: the answer first (does speculation pay at each level, is it lossless,
did the client keep up), then figures (matplotlib PNGs embedded as base64, so the page is one
self-contained file), then a per-level table narrow enough for a laptop screen. Every figure is one
function returning (caption, png) or, when this run has no data for it, the one-line reason it is
left out. Text from the summary is escaped; nothing is dumped as JSON (summary.json has it all).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
from pathlib import Path

from trtspec.bench.records import CANCELLED_AT_END, RequestRecord
from trtspec.fsutil import atomic_write_text

CSV_COLUMNS = (
    "level", "target", "requests", "completed", "failed", "short_outputs", "request_throughput",
    "output_token_throughput", "input_token_throughput", "ttft_ms_mean", "ttft_ms_p99", "tpot_ms_mean",
    "tpot_ms_p99", "itl_ms_mean", "itl_ms_p99", "e2e_ms_mean", "e2e_ms_p50", "e2e_ms_p99", "tokens_per_chunk_mean",
    "acceptance_rate", "accepted_tokens_per_step", "acceptance_source", "server_acceptance_rate",
    "server_tokens_per_step", "slo_attainment", "goodput",
)  # fmt: skip


def csv_rows(summary: dict) -> list[dict]:
    rows = []
    for level in summary["levels"]:
        for label, s in level["targets"].items():
            row = {"level": level["level"], "target": label}
            for key in ("requests", "completed", "failed", "short_outputs", "request_throughput",
                        "output_token_throughput", "input_token_throughput"):  # fmt: skip
                row[key] = s.get(key)
            for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
                for stat in ("mean", "p50", "p99"):
                    if f"{metric}_{stat}" in CSV_COLUMNS:
                        row[f"{metric}_{stat}"] = (s.get(metric) or {}).get(stat)
            row["tokens_per_chunk_mean"] = (s.get("tokens_per_chunk") or {}).get("mean")
            acc = s.get("acceptance") or {}
            row["acceptance_rate"] = acc.get("acceptance_rate")
            row["accepted_tokens_per_step"] = acc.get("accepted_tokens_per_step")
            row["acceptance_source"] = acc.get("source")
            srv = s.get("server_metrics") or {}
            row["server_acceptance_rate"], row["server_tokens_per_step"] = (
                srv.get("acceptance_rate"),
                srv.get("tokens_per_step"),
            )
            slo = s.get("slo") or {}
            row["slo_attainment"], row["goodput"] = slo.get("attainment"), slo.get("goodput")
            rows.append(row)
    return rows


# ---- formatting ------------------------------------------------------------------------------------

esc = html.escape


def num(v, fmt: str = ".3g", suffix: str = "") -> str:
    """A figure for a cell: '—' when missing, never 'None' or 'nan'."""
    if v is None or isinstance(v, bool) or not isinstance(v, int | float) or v != v:
        return "—"
    return f"{v:{fmt}}{suffix}"


def ms(v) -> str:
    """Milliseconds: whole above 100, three significant figures below (a local server answers in 2 ms)."""
    return num(v, ",.0f") if isinstance(v, int | float) and abs(v) >= 100 else num(v, ".3g")


def words(v) -> str:
    """Any summary value as HTML a person reads: lists joined, dicts as small tables, no JSON."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"  # counts in full: 1,000 samples, not 1e+03
    if isinstance(v, float):
        return num(v)
    if isinstance(v, dict):
        if not v:
            return "none"
        rows = "".join(f"<tr><th>{esc(_key(k))}</th><td>{words(x)}</td></tr>" for k, x in v.items())
        return f"<table class='kv'>{rows}</table>"
    if isinstance(v, list | tuple):
        if not v:
            return "none"
        if all(isinstance(x, dict) for x in v):
            cols = list(dict.fromkeys(k for x in v for k in x))
            head = "".join(f"<th>{esc(_key(c))}</th>" for c in cols)
            body = "".join("<tr>" + "".join(f"<td>{words(x.get(c))}</td>" for c in cols) + "</tr>" for x in v)
            return f"<table class='kv'><tr>{head}</tr>{body}</table>"
        shown = ", ".join(words(x) for x in v[:20])
        return shown + (f" … ({len(v) - 20} more)" if len(v) > 20 else "")
    return esc(str(v))


def _key(k) -> str:
    return str(k).replace("_", " ")


def table(head: list[str], rows: list[list[str]], cls: str = "") -> str:
    """Cells are HTML already (escaped by the caller); headers are plain text."""
    th = "".join(f"<th>{esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table class='{cls}'><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def badge(text: str, good: bool | None) -> str:
    kind = {True: "good", False: "bad", None: "unsure"}[good]
    return f"<span class='badge {kind}'>{esc(text)}</span>"


def _target(level: dict, label: str) -> dict:
    return level["targets"].get(label) or {}


def _stat(s: dict, metric: str, stat: str = "mean"):
    return (s.get(metric) or {}).get(stat)


# ---- the answer ------------------------------------------------------------------------------------


def pays_section(summary: dict) -> str:
    rows = summary.get("comparison") or []
    out = ["<h3>Does speculation pay?</h3>"]
    if not rows:
        why = ("no level completed requests on both A and B" if "B" in summary["targets"]
               else "one target was measured, with no baseline to compare with (run with --compare)")  # fmt: skip
        return out[0] + f"<p>{badge('no comparison', None)} Not answered by this run: {esc(why)}.</p>"
    lat = [r["latency_speedup"] for r in rows]
    thr = [r["throughput_ratio"] for r in rows]
    span = lambda xs: f"{min(xs):.2f}×" if min(xs) == max(xs) else f"{min(xs):.2f}–{max(xs):.2f}×"  # noqa: E731
    paying = [r["level"] for r in rows if r.get("pays")]
    if len(paying) == len(rows):
        head = badge("pays", True) + f" Yes, at every level measured ({len(rows)})."
    elif not paying:
        head = badge("does not pay", False) + " No: at no level measured is A's mean latency lower than B's."
    else:
        stop = next((r["level"] for r in rows if r.get("stops_paying_here")), "?")
        head = badge("pays up to a point", None) + (
            f" It pays at {esc(', '.join(map(str, paying)))} and stops paying at {esc(str(stop))}."
        )
    out.append(
        f"<p>{head} Speculative A against baseline B, on identical schedules: latency speedup {span(lat)} "
        f"(B's mean end-to-end latency over A's), output tokens/s {span(thr)} B's.</p>"
    )
    levels = {lv["level"]: lv for lv in summary["levels"]}
    body = []
    for r in rows:
        lv = levels.get(r["level"], {"targets": {}})
        a, b = _target(lv, "A"), _target(lv, "B")
        body.append([
            esc(str(r["level"])), num(a.get("output_token_throughput"), ",.0f"),
            num(b.get("output_token_throughput"), ",.0f"), num(r.get("throughput_ratio"), ".2f", "×"),
            ms(_stat(a, "e2e_ms")), ms(_stat(b, "e2e_ms")), num(r.get("latency_speedup"), ".2f", "×"),
            num(r.get("tpot_speedup"), ".2f", "×"), badge("yes", True) if r.get("pays") else badge("no", False),
        ])  # fmt: skip
    head_row = ["Level", "A tokens/s", "B tokens/s", "Throughput A/B", "A mean latency (ms)", "B mean latency (ms)",
                "Latency speedup", "Per-token speedup", "Pays"]  # fmt: skip
    out.append(table(head_row, body, "num"))
    out.append("<p class='note'>Speedup is B's mean over A's (above 1: A is faster); it pays where A's mean "
               "end-to-end latency is lower than B's. Output tokens/s are A's over B's.</p>")  # fmt: skip
    return "".join(out)


LOSSLESS_WORDS = {
    "PASS": ("lossless", True, "Yes: A's outputs are indistinguishable from the baseline's, with the power to tell."),
    "FAIL": ("not lossless", False, "No: A's outputs differ from the baseline's."),
    "inconclusive": ("inconclusive", None, "Not shown: the check found no difference, but lacked the data or power "
                     "to rule one out."),
}  # fmt: skip
LOSSLESS_IN_WORDS = {"verdict", "pass", "greedy", "sampled", "inconclusive", "temperature", "first_tokens"}


def lossless_section(summary: dict) -> str:
    out = ["<h3>Is it lossless?</h3>"]
    ll = summary.get("lossless")
    if not ll:
        return out[0] + (f"<p>{badge('not checked', None)} Not checked in this run "
                         "(bench with --compare and --verify-lossless).</p>")  # fmt: skip
    verdict = ll.get("verdict") or ("PASS" if ll.get("pass") else "FAIL")
    label, good, sentence = LOSSLESS_WORDS.get(verdict, (str(verdict), None, ""))
    out.append(f"<p>{badge(label, good)} {esc(sentence)}</p><ul>")
    g = ll.get("greedy") or {}
    if g:
        miss = g.get("mismatched") or []
        out.append(f"<li>Greedy (temperature 0): {words(g.get('identical'))} of {words(g.get('prompts'))} prompts "
                   "gave identical text from A and B" + (f"; different at prompts {words(miss)}" if miss else "")
                   + ".</li>")  # fmt: skip
    s = ll.get("sampled") or {}
    if s:
        out.append(
            f"<li>Sampled (temperature {words(ll.get('temperature'))}, first {words(ll.get('first_tokens'))} "
            f"tokens): {words(s.get('prompts'))} prompts, {words(s.get('samples_per_side'))} samples from A"
            + (
                f" against {words(s.get('baseline_samples'))} of the target in-process"
                if ll.get("baseline") == "target in-process"
                else " and from B"
            )
            + ", "
            f"chi-square test of homogeneity at α = {words(s.get('alpha'))} "
            f"({words(s.get('bonferroni_bound'))} per prompt after Bonferroni)"
            + (f"; rejected at prompts {words(s['rejected'])}" if s.get("rejected") else "")
            + (f"; too little data at prompts {words(ll['inconclusive'])}" if ll.get("inconclusive") else "")
            + ".</li>"
        )
    out.append("</ul>")
    p_values = s.get("p_values") or []
    if p_values:
        w = ((ll.get("power") or {}).get("detectable_w") if isinstance(ll.get("power"), dict) else None) or []
        cols = [("χ²", s.get("chi_square") or []), ("df", s.get("df") or []), ("p-value", p_values),
                ("detectable shift (Cohen's w)", w)]  # fmt: skip
        cols = [(name, vals) for name, vals in cols if len(vals) == len(p_values)]
        body = [[str(i)] + [words(vals[i]) for _, vals in cols] for i in range(len(p_values))]
        out.append(table(["Prompt"] + [name for name, _ in cols], body, "num"))
    rest = {k: v for k, v in ll.items() if k not in LOSSLESS_IN_WORDS}
    if rest:  # power, planted bugs and whatever the check adds later: one small table
        rows = power_rows(rest.pop("power")) if isinstance(rest.get("power"), dict) else []
        rows += [(_key(k).capitalize(), words(v)) for k, v in rest.items()]
        out.append(table(["Power and further figures", "Value"], [[esc(k), v] for k, v in rows]))
    return "".join(out)


def power_rows(power: dict) -> list[tuple[str, str]]:
    """The lossless check's power section in words; keys it does not know are listed as they come."""
    power = dict(power)
    target = power.pop("target", None)
    at = num(target, ".0%") if target is not None else "the target"
    rows = []
    widths = power.pop("detectable_w", None)
    if widths:
        rows.append((f"Smallest shift detected with {at} probability (Cohen's w, per prompt)", words(widths)))
    limit = power.pop("max_detectable_w", None)
    if limit is not None:
        rows.append(("Largest such shift a PASS allows (no planted bugs run)", words(limit)))
    against = power.pop("against_planted", None) or {}
    planted = power.pop("planted", None) or {}
    for bug in dict.fromkeys([*against, *planted]):
        runs = planted.get(bug) or []
        caught = sum(1 for o in runs if isinstance(o, dict) and o.get("caught"))
        seen = f" (caught on {caught} of {len(runs)} prompts in-process)" if runs else ""
        rows.append((f"Power against the planted bug {bug} (needs {at})", num(against.get(bug), ".1%") + esc(seen)))
    return rows + [(_key(k).capitalize(), words(v)) for k, v in power.items()]


def client_section(summary: dict) -> str:
    out = ["<h3>Did the client keep up?</h3>"]
    checks = [(lv["level"], label, c) for lv in summary["levels"] for label, c in (lv.get("client") or {}).items()]
    if not checks:
        return out[0] + "<p>No level has been measured yet.</p>"
    behind = [f"{level} {label}" for level, label, c in checks if not c.get("ok")]
    if behind:
        out.append(f"<p>{badge('client-bound', False)} Not everywhere: at {esc(', '.join(map(str, behind)))} the "
                   "client, not the server, may have shaped the numbers.</p>")  # fmt: skip
    else:
        out.append(f"<p>{badge('kept up', True)} Yes, at every level: its dispatch lag, event-loop lag and CPU "
                   "stayed under the thresholds.</p>")  # fmt: skip
    body = [[esc(str(level)), esc(str(label)), badge(str(c.get("verdict", "")), bool(c.get("ok"))),
             num(_stat(c, "dispatch_lag_ms", "p99"), ".2f"), num(_stat(c, "loop_lag_ms", "p99"), ".2f"),
             num(c.get("cpu_fraction_per_worker"), ".0%"), words(c.get("workers"))]
            for level, label, c in checks]  # fmt: skip
    heads = ["Level", "Target", "Verdict", "p99 dispatch lag (ms)", "p99 loop lag (ms)", "CPU per worker", "Workers"]
    return "".join(out) + table(heads, body, "num")


def slo_section(summary: dict) -> str:
    failed = summary.get("slo_failed") or []
    if not failed:
        return ""
    return "<h3>Service-level objective</h3><ul>" + "".join(f"<li>{esc(str(f))}</li>" for f in failed) + "</ul>"


# ---- figures ---------------------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=88, bbox_inches="tight")
    _plt().close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _levels_axis(ax, names: list[str]) -> None:
    ax.set_xticks(range(len(names)), names, rotation=15 if len(names) > 4 else 0, fontsize=8)
    ax.set_xlabel("load level")
    ax.grid(alpha=0.3)


def fig_speedup(summary: dict, records: list[RequestRecord]):
    rows = summary.get("comparison") or []
    if not rows:
        return "no baseline B measured at any level, so there is no speedup to draw"
    plt = _plt()
    fig, ax = plt.subplots(figsize=(12, 3.4))
    x = range(len(rows))
    for key, name in (("latency_speedup", "mean latency (B/A)"), ("tpot_speedup", "per-token latency (B/A)"),
                      ("throughput_ratio", "output tokens/s (A/B)")):  # fmt: skip
        ys = [r.get(key) if r.get(key) is not None else float("nan") for r in rows]
        ax.plot(x, ys, marker="o", label=name)
    ax.axhline(1.0, color="black", lw=1, ls="--")
    _levels_axis(ax, [str(r["level"]) for r in rows])
    ax.set(ylabel="speedup of A over B (×)", title="Speedup against load (above the dashed line, A is better)")
    ax.legend(fontsize=8)
    return "Speedup of speculative A over baseline B at each load level, from the same schedules.", _png(fig)


def fig_load(summary: dict, records: list[RequestRecord]):
    levels = [lv for lv in summary["levels"] if any(t.get("output_token_throughput") for t in lv["targets"].values())]
    if not levels:
        return "no level completed a request"
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.4))
    names = [str(lv["level"]) for lv in levels]
    for label in summary["targets"]:
        thr = [_target(lv, label).get("output_token_throughput") or float("nan") for lv in levels]
        lat = [_stat(_target(lv, label), "e2e_ms") or float("nan") for lv in levels]
        axes[0].plot(range(len(levels)), thr, marker="o", label=label)
        axes[1].plot(range(len(levels)), lat, marker="o", label=label)
    axes[0].set(ylabel="output tokens/s", title="Throughput")
    axes[1].set(ylabel="mean end-to-end latency (ms)", title="Latency")
    for ax in axes:
        _levels_axis(ax, names)
        ax.legend(fontsize=8)
    return "Output throughput and mean end-to-end latency of each target against load.", _png(fig)


def fig_latency_cdf(summary: dict, records: list[RequestRecord]):
    measured = [r for r in records if r.phase == "measure" and r.ok]
    if not measured:
        return "requests.jsonl holds no completed measured request"
    import numpy as np

    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    level_names = [lv["level"] for lv in summary["levels"]] or sorted({r.level for r in measured})
    styles = {"A": "-", "B": "--"}
    for ax, (name, attr) in zip(axes, (("TTFT", "ttft_s"), ("per-token latency", "tpot_s"),
                                       ("end-to-end latency", "e2e_s")), strict=True):  # fmt: skip
        for i, level in enumerate(level_names):
            for label in summary["targets"]:
                mine = [getattr(r, attr) for r in measured if r.level == level and r.target == label]
                values = np.sort([v * 1000 for v in mine if v is not None])
                if values.size:
                    ax.plot(values, np.arange(1, values.size + 1) / values.size, color=f"C{i % 10}",
                            ls=styles.get(label, ":"), label=f"{label} {level}")  # fmt: skip
        ax.set(xlabel=f"{name} (ms)", title=f"{name} CDF")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of requests")
    axes[-1].legend(fontsize=7)
    return "Latency CDFs per target (A solid, B dashed) and load level (colour), from requests.jsonl.", _png(fig)


def fig_acceptance_position(summary: dict, records: list[RequestRecord]):
    series = [(lv["level"], label, (t.get("acceptance") or {}).get("acceptance_per_position"))
              for lv in summary["levels"] for label, t in lv["targets"].items()]  # fmt: skip
    series = [s for s in series if s[2]]
    if not series:
        return "the summary holds acceptance pooled over draft positions only (see the table), not per position"
    plt = _plt()
    fig, ax = plt.subplots(figsize=(12, 3.4))
    for level, label, rates in series:
        ax.plot(range(1, len(rates) + 1), rates, marker="o", label=f"{label} {level}")
    ax.set(xlabel="draft position", ylabel="acceptance rate", ylim=(0, 1.05), title="Acceptance per draft position")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return "Share of drafted tokens accepted at each draft position.", _png(fig)


def fig_tokens_per_step(summary: dict, records: list[RequestRecord]):
    levels = summary["levels"]
    lines = []
    for label in summary["targets"]:
        client = [(_target(lv, label).get("acceptance") or {}).get("accepted_tokens_per_step") for lv in levels]
        server = [(_target(lv, label).get("server_metrics") or {}).get("tokens_per_step") for lv in levels]
        for ys, how in ((client, "client"), (server, "server")):
            if any(y is not None for y in ys):
                lines.append((label, how, [y if y is not None else float("nan") for y in ys]))
    if not lines:
        return "no level has tokens per step: the server sent no perf outputs and streamed no chunk after the first"
    plt = _plt()
    fig, ax = plt.subplots(figsize=(12, 3.4))
    colours = {label: f"C{i % 10}" for i, label in enumerate(summary["targets"])}
    for label, how, ys in lines:
        ax.plot(range(len(levels)), ys, marker="o", color=colours.get(label), ls="--" if how == "server" else "-",
                label=f"{label} ({how})")  # fmt: skip
    _levels_axis(ax, [str(lv["level"]) for lv in levels])
    ax.set(ylabel="tokens per decoding step", title="Tokens per step (1 = no speculation)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    return ("Output tokens per decoding step: from the server's perf outputs where it sent them, else estimated "
            "from tokens per streamed chunk; dashed, from the server's own counters.", _png(fig))  # fmt: skip


FIGURES = (
    ("fig-speedup", "Speedup against load"),
    ("fig-load", "Throughput and latency against load"),
    ("fig-latency-cdf", "Latency distributions"),
    ("fig-acceptance-position", "Acceptance per draft position"),
    ("fig-tokens-per-step", "Tokens per step"),
)


def figures_section(summary: dict, records: list[RequestRecord]) -> str:
    builders = {
        "fig-speedup": fig_speedup,
        "fig-load": fig_load,
        "fig-latency-cdf": fig_latency_cdf,
        "fig-acceptance-position": fig_acceptance_position,
        "fig-tokens-per-step": fig_tokens_per_step,
    }
    out = ["<section id='figures'><h2>Figures</h2>"]
    for fid, title in FIGURES:
        drawn = builders[fid](summary, records)
        if isinstance(drawn, tuple):
            caption, png = drawn
            out.append(f"<figure id='{fid}'><img alt='{esc(title)}' src='data:image/png;base64,{png}'>"
                       f"<figcaption><b>{esc(title)}.</b> {esc(caption)}</figcaption></figure>")  # fmt: skip
        else:
            out.append(f"<p class='omitted' id='{fid}-omitted'>{esc(title)}: not drawn, {esc(str(drawn))}.</p>")
    return "".join(out) + "</section>"


# ---- the per-level table and the page --------------------------------------------------------------


def levels_section(summary: dict) -> str:
    body = []
    for lv in summary["levels"]:
        for label, s in lv["targets"].items():
            acc = s.get("acceptance") or {}
            srv = s.get("server_metrics") or {}
            rate = acc.get("acceptance_rate")
            rate_cell = num(rate, ".0%") if rate is not None else num(srv.get("acceptance_rate"), ".0%", " (server)")
            estimate = " (est.)" if str(acc.get("source") or "").startswith("estimate") else ""
            body.append([
                esc(str(lv["level"])), esc(str(label)), f"{words(s.get('completed'))}/{words(s.get('requests'))}",
                num(s.get("output_token_throughput"), ",.0f"), ms(_stat(s, "ttft_ms", "p50")),
                ms(_stat(s, "ttft_ms", "p99")), ms(_stat(s, "tpot_ms")),
                ms(_stat(s, "e2e_ms", "p50")), ms(_stat(s, "e2e_ms", "p99")),
                num(acc.get("accepted_tokens_per_step"), ".2f", estimate), rate_cell,
                num((s.get("slo") or {}).get("attainment"), ".0%"),
            ])  # fmt: skip
    if not body:
        return "<section id='levels'><h2>Each level</h2><p>No level has been measured yet.</p></section>"
    heads = ["Level", "Target", "Done", "Tokens/s", "TTFT p50", "TTFT p99", "Per-token mean", "Latency p50",
             "Latency p99", "Tokens/step", "Acceptance", "SLO met"]  # fmt: skip
    problems = []
    for lv in summary["levels"]:
        if lv.get("aborted"):
            problems.append(f"{lv['level']}: aborted, {lv['aborted']}")
        for label, s in lv["targets"].items():
            cut = s.get("cancelled_at_end") or 0
            if (s.get("failed") or 0) > cut:
                first = next((e for e in s.get("errors") or [] if e != CANCELLED_AT_END), "?")
                problems.append(f"{lv['level']} {label}: {s['failed'] - cut} of {s.get('requests')} failed ({first})")
            if cut:
                problems.append(f"{lv['level']} {label}: {cut} still running at the level's end, cancelled by design")
    return (
        "<section id='levels'><h2>Each level</h2>" + table(heads, body, "num")
        + "<p class='note'>Times in ms; latency is end to end from the scheduled send time. Full detail "
        "(every percentile, per category, server counters) is in <a href='summary.json'>summary.json</a> and "
        "<a href='summary.csv'>summary.csv</a>; every request in <a href='requests.jsonl'>requests.jsonl</a>.</p>"
        + ("<ul class='problems'>" + "".join(f"<li>{esc(str(p))}</li>" for p in problems) + "</ul>" if problems else "")
        + "</section>"
    )  # fmt: skip


STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;padding:16px 24px;
max-width:1180px;color:#222;line-height:1.4;font-size:15px}
h1{margin:0 0 4px}h2{border-bottom:2px solid #ddd;padding-bottom:4px;margin-top:28px}h3{margin:18px 0 6px}
.meta{color:#555;font-size:13px;overflow-wrap:anywhere}
table{border-collapse:collapse;font-size:13px;margin:6px 0;max-width:100%}
td,th{border:1px solid #ddd;padding:3px 7px;vertical-align:top;overflow-wrap:anywhere}
th{background:#f4f4f4;text-align:left}table.num td{text-align:right}table.num td:first-child{text-align:left}
table.kv{font-size:12px;margin:0}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-weight:600;font-size:13px;text-align:left}
.good{background:#d9f2dd;color:#14532d}.bad{background:#fadbd8;color:#7f1d1d}.unsure{background:#fcefc7;color:#6b4e00}
.note,.omitted{color:#555;font-size:13px}.omitted{font-style:italic}
.warn{background:#fadbd8;padding:6px 10px;border-radius:4px}
figure{margin:14px 0}figure img{max-width:100%;height:auto;display:block}figcaption{font-size:13px;color:#444}
"""


def render(summary: dict, records: list[RequestRecord]) -> str:
    opts = summary.get("options") or {}
    facts = [f"Started {esc(str(summary.get('started', '?')))}"]
    if opts.get("num_requests") is not None:
        facts.append(f"{words(opts['num_requests'])} requests per level")
    elif opts.get("duration_s") is not None:
        facts.append(f"{words(opts['duration_s'])} s per level")
    for key, text in (("max_tokens", "at most {} output tokens"), ("temperature", "temperature {}"),
                      ("workers", "{} client worker(s)")):  # fmt: skip
        if opts.get(key) is not None:
            facts.append(text.format(words(opts[key])))
    targets = "; ".join(f"{esc(str(k))}: {esc(str(v))}" for k, v in summary["targets"].items())
    meta = f"Targets: {targets}. {', '.join(facts)}."
    aborted = [f"{lv['level']}: {lv['aborted']}" for lv in summary["levels"] if lv.get("aborted")]
    incomplete = "" if summary.get("complete") else (
        "<p class='warn'>This run is incomplete (still running, stopped, or a level was aborted"
        + (f": {esc('; '.join(aborted))}" if aborted else "") + "): the page covers only the levels it finished.</p>"
    )  # fmt: skip
    return "\n".join([
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        "<meta name='viewport' content='width=device-width,initial-scale=1'><title>trtspec bench report</title>",
        f"<style>{STYLE}</style></head><body>",
        f"<h1>trtspec bench report</h1><p class='meta'>{meta}</p>{incomplete}",
        "<section id='answer'><h2>The answer</h2>",
        pays_section(summary), lossless_section(summary), client_section(summary), slo_section(summary),
        "</section>",
        figures_section(summary, records),
        levels_section(summary),
        "</body></html>",
    ])  # fmt: skip


def write_reports(out_dir: Path, summary: dict, records: list[RequestRecord]) -> None:
    rows = csv_rows(summary)
    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2, default=str))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(out_dir / "summary.csv", buf.getvalue())
    atomic_write_text(out_dir / "report.html", render(summary, records))
