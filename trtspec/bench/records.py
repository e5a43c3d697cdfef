"""One request as the client saw it, and the per-request metrics derived from it.

Times are seconds on time.monotonic() (system-wide on Linux, so worker processes share the clock)
relative to the run's start. Latencies are measured from the *scheduled* send time: a request that
waited because the client or its concurrency cap was busy still counts that wait (no coordinated
omission); `queue_s` says how much of it was the client's.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from trtspec.fsutil import write_error

# the error of a request a duration-bounded level cut at its end (--duration + --grace): counted apart
CANCELLED_AT_END = "cancelled: still running when the level's grace period ended"


@dataclass
class RequestRecord:
    index: int
    target: str  # "A" or "B" of a comparison, or the only target
    level: str  # the load level, e.g. "concurrency=4" or "rate=2.0"
    phase: str  # "warmup" or "measure"
    prompt_index: int
    category: str | None
    input_tokens: int
    requested_output_tokens: int | None
    scheduled: float
    sent: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    end: float | None = None
    output_tokens: int | None = None
    output_tokens_source: str | None = None  # "server" or "tokenizer"
    text: str = ""
    error: str | None = None
    perf: dict[str, float] = field(default_factory=dict)  # the server's return_perf_metrics outputs
    worker: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None

    @property
    def queue_s(self) -> float | None:
        return None if self.sent is None else self.sent - self.scheduled

    @property
    def ttft_s(self) -> float | None:
        return self.chunk_times[0] - self.scheduled if self.chunk_times else None

    @property
    def e2e_s(self) -> float | None:
        return self.end - self.scheduled if self.ok else None

    @property
    def tpot_s(self) -> float | None:
        """Decode time spread over every output token after the first (what a user waits per token)."""
        if not self.ok or not self.chunk_times or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.end - self.chunk_times[0]) / (self.output_tokens - 1)

    @property
    def itl_s(self) -> list[float]:
        """Gaps between streamed chunks: one sample per chunk, however many tokens it carried."""
        t = self.chunk_times
        return [b - a for a, b in itertools.pairwise(t)]

    @property
    def short(self) -> bool:
        """Stopped before the requested length (only meaningful when a fixed length was asked for)."""
        return (
            self.ok
            and self.requested_output_tokens is not None
            and (self.output_tokens or 0) < self.requested_output_tokens
        )

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(
            ok=self.ok, queue_s=self.queue_s, ttft_s=self.ttft_s, tpot_s=self.tpot_s, e2e_s=self.e2e_s, short=self.short
        )
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        names = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in names})


class RecordWriter:
    """requests.jsonl, one line per finished request, flushed at once: a killed run keeps every record."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fh: IO[str] = path.open("a", encoding="utf-8")

    def write(self, record: RequestRecord) -> None:
        try:
            self._fh.write(json.dumps(record.as_json()) + "\n")
            self._fh.flush()
        except OSError as exc:  # a full disk: the records before this one are on disk, whole
            raise write_error(exc, self.path, atomic=False) from None

    def close(self) -> None:
        self._fh.close()


def read_records(path: Path) -> list[RequestRecord]:
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                records.append(RequestRecord.from_json(json.loads(line)))
            except (ValueError, TypeError):
                continue  # a line cut short by a kill: everything before it still counts
    return records
