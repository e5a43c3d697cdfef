"""The results directory: summary.json, summary.csv and report.html (plots embedded as PNG), each
written atomically; requests.jsonl is written by the run itself as requests finish."""

from __future__ import annotations

import base64
import csv
import html
import io
import json
from pathlib import Path

from trtspec.bench.records import RequestRecord
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


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def _figures(summary: dict, records: list[RequestRecord]) -> list[tuple[str, str]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    measured = [r for r in records if r.phase == "measure"]
    figures = []
    groups = sorted({(r.target, r.level) for r in measured})
    if groups:
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
        for ax, (name, attr) in zip(axes, (("TTFT", "ttft_s"), ("end-to-end latency", "e2e_s")), strict=True):
            for target, level in groups:
                values = np.sort([getattr(r, attr) * 1000 for r in measured if (r.target, r.level) == (target, level)
                                  and getattr(r, attr) is not None])  # fmt: skip
                if values.size:
                    ax.plot(values, np.arange(1, values.size + 1) / values.size, label=f"{target} {level}")
            ax.set(xlabel=f"{name} (ms)", ylabel="fraction of requests", title=f"{name} CDF")
            ax.grid(alpha=0.3)
        axes[1].legend(fontsize=7)
        figures.append(("Latency CDFs", _png(fig)))
        plt.close(fig)
    levels = summary["levels"]
    if levels:
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
        names = [lv["level"] for lv in levels]
        for label in summary["targets"]:
            thr = [(lv["targets"].get(label) or {}).get("output_token_throughput") or np.nan for lv in levels]
            lat = [((lv["targets"].get(label) or {}).get("e2e_ms") or {}).get("mean", np.nan) for lv in levels]
            axes[0].plot(names, thr, marker="o", label=label)
            axes[1].plot(names, lat, marker="o", label=label)
        axes[0].set(ylabel="output tokens/s", title="Throughput by load level")
        axes[1].set(ylabel="mean e2e latency (ms)", title="Latency by load level")
        for ax in axes:
            ax.tick_params(axis="x", labelrotation=20, labelsize=7)
            ax.grid(alpha=0.3)
            ax.legend()
        figures.append(("Throughput and latency against load", _png(fig)))
        plt.close(fig)
        last = levels[-1]["targets"].get("A") or {}
        cats = last.get("by_category") or {}
        values = {c: (v.get("acceptance") or {}) for c, v in cats.items()}
        plotted = {c: a.get("acceptance_rate") or a.get("accepted_tokens_per_step") for c, a in values.items()}
        plotted = {c: v for c, v in plotted.items() if v is not None}
        if plotted:
            source = next(iter(values.values())).get("source")
            what = "acceptance rate" if any(a.get("acceptance_rate") for a in values.values()) else "tokens per chunk"
            fig, ax = plt.subplots(figsize=(11, 3.2))
            ax.bar(list(plotted), list(plotted.values()), color="#4c72b0")
            ax.set(ylabel=what, title=f"A: {what} by category ({levels[-1]['level']}; {source})")
            ax.tick_params(axis="x", labelrotation=30, labelsize=8)
            figures.append(("Acceptance by category", _png(fig)))
            plt.close(fig)
    if measured:
        fig, ax = plt.subplots(figsize=(11, 3.8))
        for y, r in enumerate(sorted(measured, key=lambda r: (r.target, r.level, r.scheduled))):
            end = r.end if r.end is not None else (r.chunk_times[-1] if r.chunk_times else r.scheduled)
            ax.plot([r.scheduled, end], [y, y], color="#c44e52" if not r.ok else "#4c72b0", lw=1)
            if r.sent is not None and r.sent > r.scheduled:
                ax.plot([r.scheduled, r.sent], [y, y], color="#dd8452", lw=1)
        ax.set(xlabel="seconds since the level's start", ylabel="request")
        ax.set_title("Timeline (orange: queued, red: failed)")
        figures.append(("Timeline", _png(fig)))
        plt.close(fig)
    return figures


def _html(summary: dict, rows: list[dict], figures: list[tuple[str, str]]) -> str:
    def cell(v) -> str:
        return f"{v:.3g}" if isinstance(v, float) else html.escape(str("" if v is None else v))

    head = "".join(f"<th>{html.escape(c)}</th>" for c in CSV_COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{cell(r.get(c))}</td>" for c in CSV_COLUMNS) + "</tr>" for r in rows)
    parts = [
        "<!doctype html><meta charset='utf-8'><title>trtspec bench</title>",
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:12px}"
        "td,th{border:1px solid #ccc;padding:3px 6px}</style>",
        "<h1>trtspec bench</h1>",
        f"<p>targets: {html.escape(json.dumps(summary['targets']))}; complete: {summary.get('complete')}</p>",
        f"<table><tr>{head}</tr>{body}</table>",
    ]
    if summary.get("comparison"):
        parts.append("<h2>A/B</h2><pre>" + html.escape(json.dumps(summary["comparison"], indent=1)) + "</pre>")
    if summary.get("lossless"):
        parts.append("<h2>Lossless check</h2><pre>" + html.escape(json.dumps(summary["lossless"], indent=1)) + "</pre>")
    clients = {lv["level"]: lv.get("client") for lv in summary["levels"]}
    parts.append("<h2>Client self-check</h2><pre>" + html.escape(json.dumps(clients, indent=1)) + "</pre>")
    for title, png in figures:
        parts.append(f"<h2>{html.escape(title)}</h2><img src='data:image/png;base64,{png}'>")
    return "\n".join(parts)


def write_reports(out_dir: Path, summary: dict, records: list[RequestRecord]) -> None:
    rows = csv_rows(summary)
    atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2, default=str))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    atomic_write_text(out_dir / "summary.csv", buf.getvalue())
    atomic_write_text(out_dir / "report.html", _html(summary, rows, _figures(summary, records)))
