"""A whole bench: warm-up, every load level for each target on identical schedules, the optional
lossless check, and the results directory, rewritten after every level so a killed run keeps
what it measured (requests.jsonl is flushed per request on top of that)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from trtspec.bench.datasets import BenchPrompt
from trtspec.bench.load import ClientStats, Item, WorkerPlan, run_workers
from trtspec.bench.lossless_run import run_lossless
from trtspec.bench.metrics import SLO, summarize
from trtspec.bench.records import RecordWriter, RequestRecord
from trtspec.bench.report import write_reports
from trtspec.bench.results import BenchSummary, Comparison, LevelSummary, TargetSummary
from trtspec.bench.schedule import Load, arrival_times
from trtspec.bench.selfcheck import client_check
from trtspec.bench.server_metrics import ServerWindow
from trtspec.errors import TrtspecError

PAYS_MARGIN = 1.0  # speculation pays at a level when the baseline's mean latency / its own exceeds this


@dataclass
class BenchOptions:
    targets: dict[str, str]  # label -> PROTOCOL://HOST:PORT/MODEL; "A" is measured, "B" the baseline
    levels: list[Load]
    prompts: list[BenchPrompt]
    out_dir: Path
    num_requests: int | None = 32
    duration_s: float | None = None
    warmup: int = 2
    max_tokens: int = 64
    fixed_length: bool = False
    temperature: float = 0.0
    seed: int | None = 0
    timeout_s: float = 300.0
    grace_s: float = 30.0
    tokenizer: str | None = None
    extra: dict[str, dict] = field(default_factory=dict)  # per target label
    workers: int = 1
    slo: SLO | None = None
    slo_attainment: float = 0.95
    lossless: bool = False
    lossless_samples: int = 1000
    lossless_tokens: int = 4  # K + 2 tokens reach the token after a fully accepted step (K = 2)
    lossless_temperature: float = 1.0
    lossless_prompts: int = 1  # contexts: one well chosen beats several (each costs a Bonferroni share)
    lossless_reference: Path | None = None  # the speculative deployment's trtspec config, run in-process
    metrics_urls: dict[str, str] = field(default_factory=dict)  # per target label: the server's /metrics


Progress = Callable[[str, RequestRecord | None], None]


def _items(opts: BenchOptions, load: Load) -> list[Item]:
    count = opts.num_requests
    if count is None:  # bounded by duration: enough items to outlast it at the offered rate
        count = 100_000 if load.rate is None or math.isinf(load.rate) else int(load.rate * opts.duration_s * 2) + 16
    times = arrival_times(count, load, seed=opts.seed or 0)
    n = len(opts.prompts)
    return [Item(i, i % n, opts.prompts[i % n], float(times[i])) for i in range(count)]


def _plan(opts: BenchOptions, label: str, load: Load, phase: str, items: list[Item], **over) -> WorkerPlan:
    base = dict(
        target=opts.targets[label], target_label=label, load=load, phase=phase, items=items,
        in_flight_cap=load.in_flight_cap, max_tokens=opts.max_tokens, fixed_length=opts.fixed_length,
        temperature=opts.temperature, seed=opts.seed, timeout_s=opts.timeout_s, duration_s=opts.duration_s,
        grace_s=opts.grace_s, tokenizer=opts.tokenizer, extra=opts.extra.get(label, {}),
    )  # fmt: skip
    base.update(over)
    return WorkerPlan(**base)


def compare_levels(levels: list[LevelSummary]) -> list[Comparison]:
    """Speedup of A over B per level, from numbers measured in the same run on the same schedule."""
    rows = []
    for level in levels:
        a, b = level.targets.get("A"), level.targets.get("B")
        if not a or not b or not a.e2e_ms or not b.e2e_ms:
            continue
        latency = b.e2e_ms.mean / a.e2e_ms.mean
        rows.append(
            Comparison(
                level=level.level,
                latency_speedup=latency,
                tpot_speedup=b.tpot_ms.mean / a.tpot_ms.mean if a.tpot_ms and b.tpot_ms else None,
                throughput_ratio=a.output_token_throughput / b.output_token_throughput,
                pays=latency > PAYS_MARGIN,
                stops_paying_here=False,
            )
        )
    first_loss = next((i for i, r in enumerate(rows) if not r.pays), None)
    return [replace(r, stops_paying_here=i == first_loss) for i, r in enumerate(rows)]


def _by_category(records: list[RequestRecord]) -> dict[str, dict]:
    out = {}
    for category in sorted({r.category or "all" for r in records}):
        s = summarize([r for r in records if (r.category or "all") == category])
        out[category] = {"completed": s.completed, "tpot_ms": s.tpot_ms, "acceptance": s.acceptance}
    return out


def target_summary(records: list[RequestRecord], opts: BenchOptions, server: dict, stats: ClientStats) -> TargetSummary:
    """One target's measured requests at a level, with the server's counters over the same window."""
    out = summarize(records, opts.slo)
    out.by_category = _by_category([r for r in records if r.ok])
    out.server_metrics = server
    out.min_tokens_sent = opts.fixed_length and stats.min_tokens_supported
    return out


def run_bench(opts: BenchOptions, progress: Progress) -> BenchSummary:
    opts.out_dir.mkdir(parents=True, exist_ok=True)
    (opts.out_dir / "requests.jsonl").unlink(missing_ok=True)
    writer = RecordWriter(opts.out_dir / "requests.jsonl")
    summary = BenchSummary(
        started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        targets=opts.targets,
        options={
            "num_requests": opts.num_requests,
            "duration_s": opts.duration_s,
            "warmup": opts.warmup,
            "max_tokens": opts.max_tokens,
            "fixed_length": opts.fixed_length,
            "temperature": opts.temperature,
            "workers": opts.workers,
            "prompts": len(opts.prompts),
            "slo_attainment": opts.slo_attainment,
        },
    )
    records: list[RequestRecord] = []

    def sink(r: RequestRecord) -> None:
        writer.write(r)
        records.append(r)

    def flush() -> None:
        write_reports(opts.out_dir, summary.to_json(), records)

    try:
        for label in opts.targets:
            if opts.warmup:
                items = [Item(-1 - i, i % len(opts.prompts), opts.prompts[i % len(opts.prompts)], 0.0)
                         for i in range(opts.warmup)]  # fmt: skip
                plan = _plan(opts, label, Load(concurrency=1), "warmup", items, duration_s=None)
                warm: list[RequestRecord] = []
                run_workers(plan, 1, lambda r, w=warm: (sink(r), w.append(r), progress("warmup", r)))
                if not any(r.ok for r in warm):  # nothing works: a wrong target or input, not a load effect
                    raise TrtspecError(f"{opts.targets[label]}: every warm-up request failed: {warm[0].error}")
        for load in opts.levels:
            level = LevelSummary(load.label, load)
            items = _items(opts, load)
            for label in opts.targets:
                start = len(records)

                def report(r: RequestRecord, name: str = load.label) -> None:
                    sink(r)
                    progress(name, r)

                window = ServerWindow(opts.metrics_urls.get(label))
                stats: ClientStats = run_workers(_plan(opts, label, load, "measure", items), opts.workers, report)
                server = window.close()
                mine = [r for r in records[start:] if r.phase == "measure"]
                level.targets[label] = target_summary(mine, opts, server, stats)
                level.client[label] = client_check(stats, opts.workers)
                if stats.aborted:
                    level.aborted = stats.aborted
            summary.levels.append(level)
            summary.comparison = compare_levels(summary.levels)
            flush()
            if level.aborted:
                break
        if opts.lossless and "B" in opts.targets and not summary.aborted:
            summary.lossless = run_lossless(opts, progress, sink)
        summary.complete = not summary.aborted
    finally:
        writer.close()
        summary.slo_failed = slo_failures(summary, opts)
        flush()
    return summary


def slo_failures(summary: BenchSummary, opts: BenchOptions) -> list[str]:
    """Levels and targets whose SLO attainment fell short of --slo-attainment (for --fail-on-slo)."""
    out = []
    for level in summary.levels:
        for label, s in level.targets.items():
            if s.slo is not None and s.slo.attainment < opts.slo_attainment:
                out.append(f"{level.level} {label}: {s.slo.attainment:.0%} of requests met the SLO")
    return out
