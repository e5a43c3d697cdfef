"""The load generator: sends a level's requests on schedule, times every chunk, and watches itself.

One asyncio loop per worker process. Open-loop levels sleep each request against the level's
absolute start; a request held back by `max_concurrency` keeps its scheduled time, so its wait
shows in TTFT and e2e (and in `queue_s`) instead of vanishing. Closed-loop levels keep N requests
in flight. Alongside, the client measures its own dispatch lag (scheduled -> sent, the cap's wait
excluded), event-loop lag and CPU, so a report can say whether the client kept up.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import os
import queue as queue_module
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from trtspec.bench.datasets import BenchPrompt, load_tokenizer
from trtspec.bench.protocols import (
    Chunk,
    Request,
    ServerError,
    Target,
    Unreachable,
    make_client,
    supports_min_tokens,
)
from trtspec.bench.records import CANCELLED_AT_END, RequestRecord
from trtspec.bench.schedule import Load

UNREACHABLE_LIMIT = 8  # consecutive connection failures that end a level: the server is gone


@dataclass
class Item:
    index: int
    prompt_index: int
    prompt: BenchPrompt
    offset: float  # scheduled seconds after the level's start (open loop)


@dataclass
class WorkerPlan:
    target: str
    target_label: str
    load: Load
    phase: str
    items: list[Item]
    in_flight_cap: int | None  # this worker's share of the level's cap
    max_tokens: int
    fixed_length: bool
    temperature: float
    seed: int | None
    timeout_s: float
    duration_s: float | None
    grace_s: float
    tokenizer: str | None
    extra: dict = field(default_factory=dict)
    worker: int = 0


@dataclass
class ClientStats:
    dispatch_lag_s: list[float] = field(default_factory=list)
    loop_lag_s: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    wall_s: float = 0.0
    aborted: str | None = None
    min_tokens_supported: bool = False

    def merge(self, other: ClientStats) -> None:
        self.dispatch_lag_s += other.dispatch_lag_s
        self.loop_lag_s += other.loop_lag_s
        self.cpu_s += other.cpu_s
        self.wall_s = max(self.wall_s, other.wall_s)
        self.aborted = self.aborted or other.aborted
        self.min_tokens_supported = self.min_tokens_supported or other.min_tokens_supported


class TokenCounter:
    """Output tokens per chunk: the server's count or ids where given, else the model's tokenizer
    on the accumulated text (differences of prefix counts, so merges across chunks add up)."""

    def __init__(self, tokenizer_path: str | None) -> None:
        self.tokenizer = load_tokenizer(tokenizer_path) if tokenizer_path else None

    def fill(self, record: RequestRecord, chunks: list[Chunk], server_total: int | None) -> None:
        if chunks and all(c.tokens is not None for c in chunks):
            record.chunk_tokens = [int(c.tokens) for c in chunks]
            record.output_tokens, record.output_tokens_source = server_total or sum(record.chunk_tokens), "server"
            return
        if self.tokenizer is None:
            record.chunk_tokens = []
            record.output_tokens = server_total
            record.output_tokens_source = "server" if server_total is not None else None
            return
        counts, text, before = [], "", 0
        for chunk in chunks:
            text += chunk.text
            now = len(self.tokenizer(text, add_special_tokens=False).input_ids)
            counts.append(max(now - before, 0))
            before = now
        record.chunk_tokens = counts
        if server_total is not None:
            record.output_tokens, record.output_tokens_source = server_total, "server"
        else:
            record.output_tokens, record.output_tokens_source = before, "tokenizer"


async def _watch_loop(stats: ClientStats, stop: asyncio.Event, period: float = 0.01) -> None:
    while not stop.is_set():
        t = time.monotonic()
        await asyncio.sleep(period)
        stats.loop_lag_s.append(max(time.monotonic() - t - period, 0.0))


async def execute(
    plan: WorkerPlan, sink: Callable[[RequestRecord], None], ready: Callable[[], float] | None = None
) -> ClientStats:
    """Run one worker's share of a level; every finished request goes to `sink` at once. `ready` is
    called once connected and returns the shared start (several workers start together)."""
    stats = ClientStats()
    counter = TokenCounter(plan.tokenizer)
    client = make_client(Target.parse(plan.target))
    await client.open()
    # a speculative BLS request leaves min_tokens unset (NVIDIA's BLS overrides it): lengths are not fixed
    stats.min_tokens_supported = supports_min_tokens(client) and not plan.extra.get("num_draft_tokens")
    start = await asyncio.to_thread(ready) if ready is not None else time.monotonic()
    cap = asyncio.Semaphore(plan.in_flight_cap) if plan.in_flight_cap else None
    unreachable = [0]
    stop_watch = asyncio.Event()
    watcher = asyncio.create_task(_watch_loop(stats, stop_watch))
    cpu0, wall0 = time.process_time(), time.monotonic()

    def now() -> float:
        return time.monotonic() - start

    def record_for(item: Item, scheduled: float) -> RequestRecord:
        wanted = item.prompt.output_tokens or plan.max_tokens
        return RequestRecord(
            index=item.index, target=plan.target_label, level=plan.load.label, phase=plan.phase,
            prompt_index=item.prompt_index, category=item.prompt.category, input_tokens=item.prompt.input_tokens,
            requested_output_tokens=wanted if plan.fixed_length else None, scheduled=scheduled, worker=plan.worker,
        )  # fmt: skip

    async def send(item: Item, scheduled: float) -> None:
        record = record_for(item, scheduled)
        if stats.aborted:
            record.error = f"not sent: {stats.aborted}"
            sink(record)
            return
        wanted = item.prompt.output_tokens or plan.max_tokens
        request = Request(
            item.prompt.text, wanted, wanted if plan.fixed_length and stats.min_tokens_supported else None,
            plan.temperature, None if plan.seed is None else (plan.seed + item.index) % 2**63, plan.extra,
        )  # fmt: skip
        chunks: list[Chunk] = []

        def on_chunk(chunk: Chunk) -> None:
            record.chunk_times.append(now())
            chunks.append(chunk)

        try:
            async with cap if cap is not None else contextlib.nullcontext():
                record.sent = now()
                reply = await asyncio.wait_for(client.generate(request, on_chunk, str(item.index)), plan.timeout_s)
            record.end = now()
            record.text, record.perf = reply.text, reply.perf
            counter.fill(record, chunks, reply.output_tokens)
            unreachable[0] = 0
        except asyncio.TimeoutError:
            record.error = f"timeout after {plan.timeout_s:g}s"
        except asyncio.CancelledError:
            record.error = CANCELLED_AT_END
        except Unreachable as exc:
            record.error = f"server unreachable: {exc}"
            unreachable[0] += 1
            if unreachable[0] >= UNREACHABLE_LIMIT:
                stats.aborted = f"server unreachable ({unreachable[0]} connection failures in a row)"
        except ServerError as exc:
            record.error = str(exc) or type(exc).__name__
        if record.error and chunks:  # what streamed before the failure still counts per chunk
            counter.fill(record, chunks, None)
        sink(record)

    tasks: list[asyncio.Task] = []
    try:
        if plan.load.concurrency is not None:
            pending = iter(plan.items)

            async def user() -> None:
                for item in pending:
                    if plan.duration_s is not None and now() >= plan.duration_s:
                        return
                    scheduled = now()
                    stats.dispatch_lag_s.append(0.0)
                    await send(item, scheduled)

            tasks = [asyncio.create_task(user()) for _ in range(plan.in_flight_cap or 1)]
        else:
            for item in plan.items:
                if plan.duration_s is not None and item.offset >= plan.duration_s:
                    break
                delay = item.offset - now()
                if delay > 0:
                    await asyncio.sleep(delay)
                stats.dispatch_lag_s.append(max(now() - item.offset, 0.0))
                tasks.append(asyncio.create_task(send(item, item.offset)))
        deadline = None if plan.duration_s is None else plan.duration_s + plan.grace_s
        if tasks:
            timeout = None if deadline is None else max(deadline - now(), 0.0)
            _done, late = await asyncio.wait(tasks, timeout=timeout)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
    finally:
        stop_watch.set()
        await watcher
        stats.cpu_s, stats.wall_s = time.process_time() - cpu0, time.monotonic() - wall0
        await client.close()
    return stats


def _worker_main(plan: WorkerPlan, out: mp.Queue, go, start) -> None:
    def ready() -> float:
        out.put(("ready", None))
        go.wait()
        return start.value

    try:
        stats = asyncio.run(execute(plan, lambda r: out.put(("record", r)), ready))
        out.put(("stats", stats))
    except BaseException as exc:  # report, never hang the parent
        out.put(("failed", f"{type(exc).__name__}: {exc}"))


def split(plan: WorkerPlan, workers: int) -> list[WorkerPlan]:
    """Round-robin the items; the in-flight cap is shared out so the level's total is unchanged."""
    cap = plan.in_flight_cap
    plans = []
    for w in range(workers):
        share = None if cap is None else cap // workers + (1 if w < cap % workers else 0)
        if share == 0:
            continue
        plans.append(
            WorkerPlan(**{**plan.__dict__, "items": plan.items[w::workers], "in_flight_cap": share, "worker": w})
        )
    return plans


def run_workers(plan: WorkerPlan, workers: int, sink: Callable[[RequestRecord], None]) -> ClientStats:
    """The plan on one process (workers=1, this loop) or several spawned ones feeding `sink`."""
    if workers <= 1:
        return asyncio.run(execute(plan, sink))
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    plans = split(plan, workers)
    go, start = ctx.Event(), ctx.Value("d", 0.0)
    processes = [ctx.Process(target=_worker_main, args=(p, out, go, start), daemon=True) for p in plans]
    for p in processes:
        p.start()
    total, finished, failures, ready = ClientStats(), 0, [], 0
    while finished < len(processes):
        try:
            kind, payload = out.get(timeout=1.0)
        except queue_module.Empty:
            if not any(p.is_alive() for p in processes) and out.empty():
                failures.append("a worker process died")
                break
            continue
        if kind == "failed" and not go.is_set():
            go.set()  # let the others run out rather than wait forever
        if kind == "ready":
            ready += 1
            if ready == len(processes):
                start.value = time.monotonic() + 0.05  # a moment for every worker to wake
                go.set()
        elif kind == "record":
            sink(payload)
        else:
            finished += 1
            if kind == "stats":
                total.merge(payload)
            else:
                failures.append(payload)
    for p in processes:
        p.join(timeout=5)
    if failures:
        total.aborted = total.aborted or f"worker failed: {failures[0]}"
    return total


def default_workers() -> int:
    return max(1, min(4, (os.cpu_count() or 2) - 1))
