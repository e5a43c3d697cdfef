"""What a bench measured, as the records the run, the tables and the exit code read.

summary.json is `BenchSummary.to_json()`, made here and nowhere else. The HTML report and users'
scripts read that JSON, so its keys, their order and nesting stay what they were when these were
dicts: a key that was only sometimes written (a level's `aborted`, the throughput and latencies of
a target with nothing completed) is still left out rather than written as null.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from trtspec.bench.records import CANCELLED_AT_END as CANCELLED
from trtspec.bench.schedule import Load


def to_json(value: Any) -> Any:
    """Dataclasses as dicts in field order, less the keys each leaves out; lists and dicts recursed."""
    if is_dataclass(value) and not isinstance(value, type):
        skip = value.left_out() if hasattr(value, "left_out") else ()
        return {f.name: to_json(getattr(value, f.name)) for f in fields(value) if f.name not in skip}
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    return value


def _none(obj: Any, *names: str) -> set[str]:
    return {n for n in names if getattr(obj, n) is None}


@dataclass(frozen=True)
class Distribution:
    """Of the values that exist: their count, mean, std, min, percentiles and max."""

    count: int
    mean: float
    std: float
    min: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float


@dataclass(frozen=True)
class Acceptance:
    """Speculative acceptance of one target's requests, from the server's perf outputs or estimated."""

    source: str | None  # "server", "estimate (tokens per chunk)", or None: nothing to go on
    acceptance_rate: float | None = None
    accepted_tokens_per_step: float | None = None
    draft_tokens: int | None = None  # written only when the server reported perf outputs
    accepted_draft_tokens: int | None = None  # and this only when it drafted

    def left_out(self) -> set[str]:
        return _none(self, "draft_tokens", "accepted_draft_tokens")


@dataclass(frozen=True)
class SloResult:
    limits_ms: dict[str, float]
    good_requests: int
    attainment: float  # good requests / all requests of the level, failures counted as missed
    goodput: float | None  # good requests per second


# written only when a request completed: a level where every request failed has none of these
MEASURED = (
    "duration_s", "request_throughput", "output_token_throughput", "input_token_throughput", "output_tokens",
    "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "queue_ms", "tokens_per_chunk", "acceptance", "slo",
)  # fmt: skip


@dataclass
class TargetSummary:
    """One target at one level, over its measured (not warm-up) requests."""

    requests: int
    completed: int
    failed: int  # every request that did not complete, the next two included
    not_sent: int
    errors: list[str]  # the first five distinct
    short_outputs: int
    cancelled_at_end: int = 0  # still running when a duration-bounded level ended: cut by design, not failed
    duration_s: float | None = None  # first scheduled send to last completion
    request_throughput: float | None = None
    output_token_throughput: float | None = None
    input_token_throughput: float | None = None
    output_tokens: int | None = None
    ttft_ms: Distribution | None = None
    tpot_ms: Distribution | None = None
    itl_ms: Distribution | None = None
    e2e_ms: Distribution | None = None
    queue_ms: Distribution | None = None
    tokens_per_chunk: Distribution | None = None
    acceptance: Acceptance | None = None
    slo: SloResult | None = None  # with --slo
    # per category of the dataset: {"completed", "tpot_ms", "acceptance"}
    by_category: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the server's own counters over the level (trtspec.bench.server_metrics.ServerWindow.close)
    server_metrics: dict[str, Any] = field(default_factory=dict)
    min_tokens_sent: bool = False

    def left_out(self) -> set[str]:
        return set(MEASURED) if not self.completed else _none(self, "slo")


@dataclass(frozen=True)
class ClientCheck:
    """Whether the client kept up (trtspec.bench.selfcheck)."""

    workers: int
    dispatch_lag_ms: dict[str, float]  # p50, p99, max
    loop_lag_ms: dict[str, float]  # p50, p99, max
    cpu_fraction_per_worker: float
    ok: bool
    verdict: str


@dataclass
class LevelSummary:
    level: str  # the load's label, e.g. concurrency=4
    load: Load
    targets: dict[str, TargetSummary] = field(default_factory=dict)  # by label: "A", "B"
    client: dict[str, ClientCheck] = field(default_factory=dict)
    aborted: str | None = None  # why the level stopped early

    def left_out(self) -> set[str]:
        return _none(self, "aborted")


@dataclass(frozen=True)
class Comparison:
    """A's speedup over B at one level, from numbers measured on the same schedule."""

    level: str
    latency_speedup: float  # B's mean e2e / A's
    tpot_speedup: float | None  # B's mean TPOT / A's, where both have one
    throughput_ratio: float  # A's output tokens/s / B's
    pays: bool
    stops_paying_here: bool

    def left_out(self) -> set[str]:
        return _none(self, "tpot_speedup")


@dataclass
class BenchSummary:
    started: str
    targets: dict[str, str]  # label -> PROTOCOL://HOST:PORT/MODEL
    options: dict[str, Any]  # the settings the run was made with, as recorded
    levels: list[LevelSummary] = field(default_factory=list)
    complete: bool = False
    comparison: list[Comparison] | None = None  # once a level is measured
    lossless: dict[str, Any] | None = None  # the lossless check's own result (trtspec.bench.lossless)
    slo_failed: list[str] | None = None  # once the run has ended

    def left_out(self) -> set[str]:
        return _none(self, "comparison", "lossless", "slo_failed")

    def to_json(self) -> dict[str, Any]:
        return to_json(self)

    @property
    def aborted(self) -> str | None:
        return next((lv.aborted for lv in self.levels if lv.aborted), None)

    def unfinished(self) -> tuple[str | None, str | None]:
        """(failures, cancellations): one line each, None when there are none. A failure is a measured
        request the run meant to complete that did not (an error, a timeout, not sent): the run exits 1.
        A duration-bounded level cancels what is still running when its grace period ends, by design:
        those are counted apart and do not fail the run."""
        failed = cancelled = total = 0
        where: list[str] = []
        first = None
        for lv in self.levels:
            for label, t in lv.targets.items():
                total += t.requests
                cancelled += t.cancelled_at_end
                n = t.failed - t.cancelled_at_end
                if n:
                    failed += n
                    where.append(f"{lv.level} {label}")
                    first = first or next((e for e in t.errors if e != CANCELLED), None)
        failures = None
        if failed:
            failures = f"{failed} of {total} measured requests failed ({', '.join(where)}); first error: {first or '?'}"
        cancellations = None
        if cancelled:
            cancellations = (
                f"{cancelled} requests still running when their level's --duration + --grace ended were "
                "cancelled (counted apart as cancelled_at_end, not as failures)"
            )
        return failures, cancellations
