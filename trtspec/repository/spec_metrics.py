"""Speculative-decoding figures on Triton's metrics port, through the python backend's custom metrics.

Triton's TensorRT-LLM metric families have none for speculative decoding: acceptance comes back
only per request. So the trtspec model that runs the draft/verify loop counts it: the llmapi model,
the engine flavour's BLS when it has a draft model, or `tensorrt_llm` (MTP and plain decoding,
through the ensemble or a draftless BLS). A `tensorrt_llm` call made by a drafting BLS is one step
of the BLS's request and is not counted again: the BLS marks those calls with BLS_REQUEST_PREFIX in
their request id.

Counts are per step (one target pass after the prefill that had drafts to check), so that
acceptance rate = accepted / draft tokens and tokens per step = 1 + accepted / steps.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the deploy side reads the names here without importing torch
    from trtspec.repository.engine_loop import BatchSnapshot
    from trtspec.speculative.runner import Step

PREFIX = "trtspec_spec_decode_"
REQUESTS = PREFIX + "requests_total"
STEPS = PREFIX + "steps_total"
DRAFT_TOKENS = PREFIX + "draft_tokens_total"
ACCEPTED_TOKENS = PREFIX + "accepted_tokens_total"
ACCEPTED_LENGTH = PREFIX + "accepted_length"
DRAFT_SECONDS = PREFIX + "draft_seconds"
VERIFY_SECONDS = PREFIX + "verify_seconds"
TTFT_SECONDS = "trtspec_time_to_first_token_seconds"
ITL_SECONDS = "trtspec_inter_token_latency_seconds"
KV_POSITIONS = "trtspec_kv_cache_positions"
RUNNING = "trtspec_batch_running_requests"
DRAFT_LEN = PREFIX + "draft_len"
GAUGES = (RUNNING, DRAFT_LEN)
COUNTERS = (REQUESTS, STEPS, DRAFT_TOKENS, ACCEPTED_TOKENS)
HISTOGRAMS = (ACCEPTED_LENGTH, DRAFT_SECONDS, VERIFY_SECONDS, TTFT_SECONDS, ITL_SECONDS)
SECONDS_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
BLS_REQUEST_PREFIX = "trtspec-bls-step:"
DESCRIPTIONS = {
    REQUESTS: "Requests finished, by whether any step drafted tokens (speculative=true|false)",
    STEPS: "Target passes after the prefill that verified at least one draft token",
    DRAFT_TOKENS: "Draft tokens proposed to the target",
    ACCEPTED_TOKENS: "Draft tokens the target accepted",
    ACCEPTED_LENGTH: "Draft tokens accepted per step (the target adds one token of its own)",
    DRAFT_SECONDS: "Time spent drafting, per step",
    VERIFY_SECONDS: "Time spent in the target's verification pass, per step",
    TTFT_SECONDS: "From the model receiving a request to its first token (Triton's queue time not included)",
    ITL_SECONDS: "Mean time between output tokens after the first, per request",
    KV_POSITIONS: "Target KV-cache positions held (state=used), and the most the model's instances hold (capacity)",
    RUNNING: "Requests in the running batch (waiting=queued for a slot)",
    DRAFT_LEN: "Drafts per row in the latest step, as the speculation policy chose it for the running batch",
}


class SpecMetrics:
    """The families and this model's labelled metrics; one per model instance (stub process)."""

    def __init__(self, model: str, version: str, mode: str, max_draft_tokens: int) -> None:
        import triton_python_backend_utils as pb_utils

        kind = pb_utils.MetricFamily
        labels = {"model": model, "version": version, "mode": mode}
        self._families = {name: kind(name=name, description=DESCRIPTIONS[name], kind=kind.COUNTER) for name in COUNTERS}
        self._families |= {
            name: kind(name=name, description=DESCRIPTIONS[name], kind=kind.HISTOGRAM) for name in HISTOGRAMS
        }
        for name in (KV_POSITIONS, *GAUGES):
            self._families[name] = kind(name=name, description=DESCRIPTIONS[name], kind=kind.GAUGE)
        f = self._families
        self.requests = {
            flag: f[REQUESTS].Metric(labels={**labels, "speculative": str(flag).lower()}) for flag in (True, False)
        }
        self.steps, self.drafted, self.accepted = (f[n].Metric(labels=labels) for n in COUNTERS[1:])
        lengths = [float(n) for n in range(max(max_draft_tokens, 1) + 1)]
        self.accepted_length = f[ACCEPTED_LENGTH].Metric(labels=labels, buckets=lengths)
        self.draft_seconds = f[DRAFT_SECONDS].Metric(labels=labels, buckets=SECONDS_BUCKETS)
        self.verify_seconds = f[VERIFY_SECONDS].Metric(labels=labels, buckets=SECONDS_BUCKETS)
        self.ttft = f[TTFT_SECONDS].Metric(labels=labels, buckets=SECONDS_BUCKETS)
        self.itl = f[ITL_SECONDS].Metric(labels=labels, buckets=SECONDS_BUCKETS)
        self._labels = labels
        self.kv: dict = {}  # made on first use: a model with no KV cache of its own (the BLS) shows none
        self._kv_mine = {"used": 0, "capacity": 0}  # this instance's share of the model-wide gauges
        self._failed = False
        self._gauges: dict = {}  # made by start() or the first step: the BLS runs no batch and shows none
        self._batch_mine = {"running": 0, "waiting": 0}  # this instance's share, as for the KV gauges

    def _guard(self, action) -> None:
        """A metric that cannot be written is logged once; it never fails the request it describes."""
        try:
            action()
        except Exception as exc:  # pb_utils raises its own exception types
            if not self._failed:
                self._failed = True
                import triton_python_backend_utils as pb_utils

                pb_utils.Logger.log_warn(f"trtspec: speculation metrics not recorded: {exc}")

    def kv_cache(self, used: int, capacity: int) -> None:
        """This instance's KV use; instances of one model share the gauges, so each adds its own change."""

        def update() -> None:
            if not self.kv:
                family = self._families[KV_POSITIONS]
                self.kv = {s: family.Metric(labels={**self._labels, "state": s}) for s in ("used", "capacity")}
            for state, value in (("used", used), ("capacity", capacity)):
                if value != self._kv_mine[state]:
                    self.kv[state].increment(value - self._kv_mine[state])
                    self._kv_mine[state] = value

        self._guard(update)

    def start(self, kv_capacity: int) -> None:
        """A model that runs a batch, before its first step: an empty batch, shown as 0 running and 0
        waiting (the HPA's per-pod load reads these; an absent series would be no value at all)."""
        self._guard(lambda: self._batch_counts(0, 0))
        self.kv_cache(0, kv_capacity)

    def _batch_counts(self, running: int, waiting: int) -> None:
        """Instances of one model share the gauges (each adds its own change): the model's batch is their sum."""
        if not self._gauges:
            f = self._families
            self._gauges = {
                "running": f[RUNNING].Metric(labels={**self._labels, "state": "running"}),
                "waiting": f[RUNNING].Metric(labels={**self._labels, "state": "waiting"}),
            }
        for state, value in (("running", running), ("waiting", waiting)):
            if value != self._batch_mine[state]:
                self._gauges[state].increment(value - self._batch_mine[state])
                self._batch_mine[state] = value

    def batch(self, now: BatchSnapshot) -> None:
        """The running batch after a step: requests running and waiting, the K chosen, KV positions held."""

        def update() -> None:
            self._batch_counts(now.running, now.waiting)
            if "k" not in self._gauges:
                self._gauges["k"] = self._families[DRAFT_LEN].Metric(labels=self._labels)
            self._gauges["k"].set(now.k)

        self._guard(update)
        self.kv_cache(now.kv_used, now.kv_capacity)

    def record(self, steps: Iterable[Step], first_token_s: float, output_tokens: int, decode_s: float) -> None:
        """One finished request; steps without drafts (plain decoding, the last token) count only the request.

        first_token_s is from the request's arrival in the model; decode_s from its first token to its last.
        """
        self._guard(lambda: self._record(list(steps), first_token_s, output_tokens, decode_s))

    def _record(self, steps: list[Step], first_token_s: float, output_tokens: int, decode_s: float) -> None:
        speculated = [s for s in steps if s.drafted > 0]
        self.requests[bool(speculated)].increment(1)
        self.ttft.observe(first_token_s)
        if output_tokens > 1:
            self.itl.observe(decode_s / (output_tokens - 1))
        if not speculated:
            return
        self.steps.increment(len(speculated))
        self.drafted.increment(sum(s.drafted for s in speculated))
        self.accepted.increment(sum(s.accepted for s in speculated))
        for s in speculated:
            self.accepted_length.observe(s.accepted)
            self.draft_seconds.observe(s.draft_s)
            self.verify_seconds.observe(s.verify_s)

    def close(self) -> None:
        """This instance's KV share given back; metrics before families, as the python backend requires."""
        if self.kv:
            self.kv_cache(0, 0)
        if self._gauges:
            self._guard(lambda: self._batch_counts(0, 0))
        self.requests = self.steps = self.drafted = self.accepted = None
        self.accepted_length = self.draft_seconds = self.verify_seconds = self.ttft = self.itl = None
        self.kv = {}
        self._gauges = {}
        self._families = {}
