"""Aggregates over one level's measured requests: latency distributions, throughput, goodput and
speculative acceptance.

Acceptance is pooled over tokens (sum of accepted / sum of drafted), not averaged per request: a
per-request mean weights short answers like long ones. When the server returns no perf outputs, the
tokens per streamed chunk after the first stand in for the tokens per step, labelled an estimate:
a stream response is one decoding step only when the server streams every step.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from trtspec.bench.records import CANCELLED_AT_END, RequestRecord
from trtspec.bench.results import Acceptance, Distribution, SloResult, TargetSummary

PERCENTILES = (50, 90, 95, 99)
SLO_METRICS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s"}


def distribution(values: Iterable[float | None], scale: float = 1.0) -> Distribution | None:
    """mean, std, p50, p90, p95, p99, max (and count) of the values that exist, times `scale`."""
    arr = np.array([v for v in values if v is not None], dtype=float) * scale
    if arr.size == 0:
        return None
    p50, p90, p95, p99 = (float(np.percentile(arr, p)) for p in PERCENTILES)
    return Distribution(
        count=int(arr.size), mean=float(arr.mean()), std=float(arr.std()), min=float(arr.min()),
        p50=p50, p90=p90, p95=p95, p99=p99, max=float(arr.max()),
    )  # fmt: skip


@dataclass(frozen=True)
class SLO:
    """Per-request limits in milliseconds; a request is good when it meets every one."""

    limits_ms: dict[str, float]

    @classmethod
    def parse(cls, text: str | None) -> SLO | None:
        if not text:
            return None
        limits = {}
        for part in text.split(","):
            name, sep, value = part.partition("=")
            name = name.strip()
            if not sep or name not in SLO_METRICS:
                raise ValueError(f"--slo: expected name=ms with name in {sorted(SLO_METRICS)}, got {part!r}")
            try:
                limits[name] = float(value)
            except ValueError:
                raise ValueError(f"--slo: {name} needs a number of milliseconds, got {value!r}") from None
        return cls(limits)

    def met(self, record: RequestRecord) -> bool:
        if not record.ok:
            return False
        for name, limit in self.limits_ms.items():
            value = getattr(record, SLO_METRICS[name])
            if value is not None and value * 1000 > limit:
                return False
        return True


def acceptance(records: list[RequestRecord]) -> Acceptance:
    """From the server's perf outputs where they came back, else estimated from tokens per chunk."""
    with_perf = [r for r in records if r.ok and "total_draft_tokens" in r.perf]
    drafted = sum(int(r.perf["total_draft_tokens"]) for r in with_perf)
    if with_perf and drafted == 0:
        return Acceptance("server", draft_tokens=0)
    if with_perf and drafted > 0:
        accepted = sum(int(r.perf["total_accepted_draft_tokens"]) for r in with_perf)
        # every step yields its accepted drafts + 1 token; the first output token comes from the prefill
        produced = sum(max((r.output_tokens or 0) - 1, 0) for r in with_perf)
        steps = produced - accepted
        per_step = produced / steps if steps > 0 else None
        return Acceptance("server", accepted / drafted, per_step, draft_tokens=drafted, accepted_draft_tokens=accepted)
    later = [n for r in records if r.ok for n in r.chunk_tokens[1:]]
    if not later:
        return Acceptance(None)
    return Acceptance("estimate (tokens per chunk)", accepted_tokens_per_step=float(np.mean(later)))


def summarize(records: list[RequestRecord], slo: SLO | None = None) -> TargetSummary:
    """Everything a level reports; `records` are the measured (not warm-up) requests of one target."""
    done = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    out = TargetSummary(
        requests=len(records), completed=len(done), failed=len(failed),
        not_sent=sum(1 for r in failed if (r.error or "").startswith("not sent")),
        cancelled_at_end=sum(1 for r in failed if r.error == CANCELLED_AT_END),
        errors=sorted({r.error for r in failed if r.error})[:5], short_outputs=sum(r.short for r in done),
    )  # fmt: skip
    if not done:
        return out
    start = min(r.scheduled for r in records)
    duration = max(r.end for r in done) - start
    out.duration_s = duration
    out.output_tokens = sum(r.output_tokens or 0 for r in done)
    if duration > 0:
        out.request_throughput = len(done) / duration
        out.output_token_throughput = out.output_tokens / duration
        out.input_token_throughput = sum(r.input_tokens for r in done) / duration
    out.ttft_ms = distribution((r.ttft_s for r in done), 1000)
    out.tpot_ms = distribution((r.tpot_s for r in done), 1000)
    out.itl_ms = distribution((gap for r in done for gap in r.itl_s), 1000)
    out.e2e_ms = distribution((r.e2e_s for r in done), 1000)
    out.queue_ms = distribution((r.queue_s for r in done), 1000)
    out.tokens_per_chunk = distribution(n for r in done for n in r.chunk_tokens)
    out.acceptance = acceptance(done)
    if slo is not None:
        good = sum(slo.met(r) for r in records)
        out.slo = SloResult(slo.limits_ms, good, good / len(records), good / duration if duration > 0 else None)
    return out
