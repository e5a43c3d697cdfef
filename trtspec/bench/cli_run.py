"""`trtspec bench` from parsed options to an exit code: 0 ok, 1 an SLO, lossless or server failure."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from trtspec.bench.datasets import LengthSpec, from_file, load_tokenizer, synthetic
from trtspec.bench.load import default_workers
from trtspec.bench.metrics import SLO
from trtspec.bench.run import BenchOptions, run_bench
from trtspec.bench.schedule import Load
from trtspec.bench.tables import print_summary
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


def levels_from(o: dict[str, Any]) -> list[Load]:
    if o["concurrency"] and o["rate"]:
        raise UsageError("--concurrency and --rate are different load models: give one")
    try:
        if o["rate"]:
            rates = [math.inf if v.strip() == "inf" else float(v) for v in o["rate"].split(",") if v.strip()]
            arrival = "gamma" if o["burstiness"] != 1.0 and o["arrival"] == "poisson" else o["arrival"]
            return [Load(rate=r, max_concurrency=o["max_concurrency"], arrival=arrival, burstiness=o["burstiness"])
                    for r in rates]  # fmt: skip
        return [Load(concurrency=c) for c in (_numbers(o["concurrency"], int) or [1])]
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def options_from(target: str, baseline: str | None, protocol: str, host: str, o: dict[str, Any]) -> BenchOptions:
    a = resolve(target, protocol, host)
    b = resolve(baseline, protocol, host) if baseline else None
    if o["verify_lossless"] and b is None:
        raise UsageError("--verify-lossless needs --compare BASELINE")
    if o["num_requests"] and o["duration"]:
        raise UsageError("--num-requests and --duration both bound a level: give one")
    tokenizer = o["tokenizer"] or a.tokenizer or (b.tokenizer if b else None)
    if tokenizer is None and (o["dataset"] == "synthetic" or not o["dataset"]):
        raise UsageError("synthetic prompts need --tokenizer (the model's) to be exact in tokens")
    if o["fail_on_slo"] and not o["slo"]:
        raise UsageError("--fail-on-slo needs --slo")
    if o["dataset"] == "synthetic":
        tok = load_tokenizer(tokenizer)
        prompts = synthetic(
            tok, max(o["num_requests"] or 32, 8), LengthSpec(o["input_len"], o["input_std"]),
            LengthSpec(o["output_len"], o["output_std"]), o["corpus"], o["seed"],
        )  # fmt: skip
    else:
        if tokenizer is None:
            raise UsageError("counting prompt tokens needs --tokenizer")
        tok = load_tokenizer(tokenizer)
        prompts = from_file(tok, Path(o["dataset"]), None, per_category=o["per_category"])
    workers = default_workers() if o["workers"] == "auto" else int(o["workers"]) if o["workers"].isdigit() else 0
    if workers < 1:
        raise UsageError(f"--workers: expected a positive number or auto, got {o['workers']!r}")
    try:
        slo = SLO.parse(o["slo"])
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    targets = {"A": a.url} | ({"B": b.url} if b else {})
    metrics = {"A": o["server_metrics"] or a.metrics_url, "B": o["compare_server_metrics"] or (b and b.metrics_url)}
    extra = {"A": a.extra | _pairs(o["extra"], "--extra")}
    if b:
        extra["B"] = b.extra | _pairs(o["compare_extra"], "--compare-extra")
    out = o["out"] or Path("results") / time.strftime("bench-%Y%m%d-%H%M%S")
    return BenchOptions(
        targets=targets, levels=levels_from(o), prompts=prompts, out_dir=out,
        num_requests=None if o["duration"] else (o["num_requests"] or 32), duration_s=o["duration"],
        warmup=o["warmup"], max_tokens=o["max_tokens"], fixed_length=o["fixed_length"],
        temperature=o["temperature"], seed=o["seed"], timeout_s=o["timeout"], grace_s=o["grace"],
        tokenizer=tokenizer, extra=extra, workers=workers, slo=slo, slo_attainment=o["slo_attainment"],
        lossless=o["verify_lossless"], lossless_samples=o["lossless_samples"],
        metrics_urls={k: v for k, v in metrics.items() if v and k in targets},
    )  # fmt: skip


def run_with_progress(opts: BenchOptions, console: Console) -> dict:
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


def bench_command(target: str, baseline: str | None, protocol: str, host: str, o: dict, console: Console) -> int:
    opts = options_from(target, baseline, protocol, host, o)
    if not console.is_terminal:
        console = Console(width=160)  # a log or a pipe: keep every column readable
    summary = run_with_progress(opts, console)
    if o["as_json"]:
        print(json.dumps(summary, indent=2, default=str))
    else:
        print_summary(summary, console, opts.out_dir)
    code = 0
    aborted = [lv["aborted"] for lv in summary["levels"] if lv.get("aborted")]
    if aborted:
        console.print(f"[red]trtspec: error: {aborted[0]}; results so far kept in {opts.out_dir}[/red]")
        code = 1
    if summary.get("lossless") and not summary["lossless"]["pass"]:
        code = 1
    if o["fail_on_slo"] and summary["slo_failed"]:
        for line in summary["slo_failed"]:
            console.print(f"[red]SLO missed: {line}[/red]")
        code = 1
    return code
