"""`trtspec bench` from parsed options to an exit code: 0 ok, 1 an SLO, lossless or server failure."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trtspec.bench.crossover import plan_check
from trtspec.bench.datasets import LengthSpec, from_file, load_tokenizer, synthetic
from trtspec.bench.load import default_workers
from trtspec.bench.metrics import SLO
from trtspec.bench.results import BenchSummary
from trtspec.bench.run import BenchOptions, run_bench
from trtspec.bench.schedule import Load
from trtspec.bench.tables import for_output, print_summary
from trtspec.bench.targets import resolve
from trtspec.errors import UsageError


def _numbers(text: str | None, kind: type) -> list:
    if not text:
        return []
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"expected comma-separated numbers, got {text!r}") from None


def _pairs(values: tuple[str, ...], flag: str) -> dict:
    out = {}
    for item in values:
        key, sep, raw = item.partition("=")
        if not sep:
            raise UsageError(f"{flag}: expected name=value, got {item!r}")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


@dataclass(frozen=True)
class BenchArgs:
    """`trtspec bench`'s flags as click parsed them (click holds the defaults and the help)."""

    target: str
    baseline: str | None  # --compare
    protocol: str
    host: str
    concurrency: str | None  # comma-separated levels
    rate: str | None  # comma-separated requests/s; inf
    arrival: str
    burstiness: float
    max_concurrency: int | None
    num_requests: int | None
    duration: float | None
    warmup: int
    dataset: str  # synthetic, or a prompt file
    per_category: int | None
    input_len: int
    input_std: float
    output_len: int
    output_std: float
    corpus: Path | None
    max_tokens: int
    fixed_length: bool
    temperature: float
    seed: int
    tokenizer: str | None
    extra: tuple[str, ...]  # name=value
    compare_extra: tuple[str, ...]
    slo: str | None
    slo_attainment: float
    fail_on_slo: bool
    verify_lossless: bool
    lossless_samples: int
    lossless_contexts: int
    lossless_tokens: int
    lossless_reference: Path | None
    timeout: float
    grace: float
    workers: str  # a number or auto
    server_metrics: str | None
    compare_server_metrics: str | None
    out: Path | None
    as_json: bool


def levels_from(args: BenchArgs) -> list[Load]:
    if args.concurrency and args.rate:
        raise UsageError("--concurrency and --rate are different load models: give one")
    try:
        if args.rate:
            rates = [math.inf if v.strip() == "inf" else float(v) for v in args.rate.split(",") if v.strip()]
            arrival = "gamma" if args.burstiness != 1.0 and args.arrival == "poisson" else args.arrival
            return [Load(rate=r, max_concurrency=args.max_concurrency, arrival=arrival, burstiness=args.burstiness)
                    for r in rates]  # fmt: skip
        return [Load(concurrency=c) for c in (_numbers(args.concurrency, int) or [1])]
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def options_from(args: BenchArgs) -> BenchOptions:
    a = resolve(args.target, args.protocol, args.host)
    b = resolve(args.baseline, args.protocol, args.host) if args.baseline else None
    if args.verify_lossless and b is None:
        raise UsageError("--verify-lossless needs --compare BASELINE")
    if args.num_requests and args.duration:
        raise UsageError("--num-requests and --duration both bound a level: give one")
    tokenizer = args.tokenizer or a.tokenizer or (b.tokenizer if b else None)
    if tokenizer is None and (args.dataset == "synthetic" or not args.dataset):
        raise UsageError("synthetic prompts need --tokenizer (the model's) to be exact in tokens")
    if args.fail_on_slo and not args.slo:
        raise UsageError("--fail-on-slo needs --slo")
    if args.dataset == "synthetic":
        tok = load_tokenizer(tokenizer)
        prompts = synthetic(
            tok, max(args.num_requests or 32, 8), LengthSpec(args.input_len, args.input_std),
            LengthSpec(args.output_len, args.output_std), args.corpus, args.seed,
        )  # fmt: skip
    else:
        if tokenizer is None:
            raise UsageError("counting prompt tokens needs --tokenizer")
        tok = load_tokenizer(tokenizer)
        prompts = from_file(tok, Path(args.dataset), None, per_category=args.per_category)
    workers = default_workers() if args.workers == "auto" else int(args.workers) if args.workers.isdigit() else 0
    if workers < 1:
        raise UsageError(f"--workers: expected a positive number or auto, got {args.workers!r}")
    try:
        slo = SLO.parse(args.slo)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    targets = {"A": a.url} | ({"B": b.url} if b else {})
    metrics = {"A": args.server_metrics or a.metrics_url, "B": args.compare_server_metrics or (b and b.metrics_url)}
    extra = {"A": a.extra | _pairs(args.extra, "--extra")}
    if b:
        extra["B"] = b.extra | _pairs(args.compare_extra, "--compare-extra")
    out = args.out or Path("results") / time.strftime("bench-%Y%m%d-%H%M%S")
    return BenchOptions(
        targets=targets, levels=levels_from(args), prompts=prompts, out_dir=out,
        num_requests=None if args.duration else (args.num_requests or 32), duration_s=args.duration,
        warmup=args.warmup, max_tokens=args.max_tokens, fixed_length=args.fixed_length,
        temperature=args.temperature, seed=args.seed, timeout_s=args.timeout, grace_s=args.grace,
        tokenizer=tokenizer, extra=extra, workers=workers, slo=slo, slo_attainment=args.slo_attainment,
        lossless=args.verify_lossless, lossless_samples=args.lossless_samples, lossless_tokens=args.lossless_tokens,
        lossless_prompts=args.lossless_contexts,
        lossless_reference=args.lossless_reference,
        metrics_urls={k: v for k, v in metrics.items() if v and k in targets},
    )  # fmt: skip


def run_with_progress(opts: BenchOptions, console: Console) -> BenchSummary:
    per_level = (opts.num_requests or 0) * len(opts.targets)
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(), console=console, transient=True, disable=not console.is_terminal,
    ) as bar:  # fmt: skip
        tasks: dict[str, Any] = {}
        failed: dict[str, int] = {}

        def progress(name: str, record) -> None:
            if name not in tasks:
                total = opts.warmup * len(opts.targets) if name == "warmup" else per_level or None
                tasks[name] = bar.add_task(name, total=total, status="")
            failed[name] = failed.get(name, 0) + (record is not None and not record.ok)
            bar.update(tasks[name], advance=1, status=f"{failed[name]} failed" if failed[name] else "")

        return run_bench(opts, progress)


def bench_command(args: BenchArgs, console: Console) -> int:
    opts = options_from(args)
    console = for_output(console)
    summary = run_with_progress(opts, console)
    if args.as_json:
        print(json.dumps(summary.to_json(), indent=2, default=str))
    else:
        print_summary(summary, console, opts.out_dir)
        plan = resolve(args.target, args.protocol, args.host).plan
        line = plan_check(summary, plan) if plan is not None and summary.comparison else None
        if line:
            console.print(line)
    code = 0
    failures, cancellations = summary.unfinished()
    if summary.aborted:
        console.print(f"[red]trtspec: error: {summary.aborted}; results so far kept in {opts.out_dir}[/red]")
        code = 1
    elif failures:  # the completed requests' records and summary are written all the same
        console.print(f"[red]trtspec: error: {failures}; records in {opts.out_dir}[/red]", soft_wrap=True)
        code = 1
    if cancellations:
        console.print(f"[yellow]{cancellations}[/yellow]", soft_wrap=True)
    if summary.lossless and not summary.lossless["pass"]:
        code = 1
    if args.fail_on_slo and summary.slo_failed:
        for line in summary.slo_failed:
            console.print(f"[red]SLO missed: {line}[/red]")
        code = 1
    return code
