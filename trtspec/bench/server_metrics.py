"""The server's own count of speculation, read from Triton's metrics port before and after a run.

The difference of trtspec's counters over the run is the server-side acceptance, which `trtspec
bench` reports beside the client-side figures: it covers every request the server finished in the
window (other clients' included), and needs no perf outputs on the requests.
"""

from __future__ import annotations

import http.client
import re
import urllib.error
import urllib.request
from dataclasses import dataclass

from trtspec.repository import spec_metrics as names

Samples = dict[tuple[str, frozenset], float]
_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _unescape(value: str) -> str:
    """The exposition format escapes only backslash, double quote and newline in label values."""
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value)


def parse(text: str) -> Samples:
    """Every sample of a Prometheus text exposition, keyed by its name as exposed and its label set.

    Hand-parsed because prometheus_client's parser renames counters to end in _total, and the
    names are what the dashboard test compares.
    """
    samples: Samples = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = _SAMPLE.match(line.strip())
        if match is None:
            raise ValueError(f"not a Prometheus sample line: {line[:120]!r}")
        name, labels, value = match.groups()
        pairs = frozenset((k, _unescape(v)) for k, v in _LABEL.findall(labels or ""))
        samples[(name, pairs)] = float(value)
    return samples


def scrape(url: str, timeout: float = 5.0) -> Samples:
    """GET a /metrics page; a server that does not answer raises OSError with the reason."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return parse(response.read().decode("utf-8"))
    except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException) as exc:
        raise OSError(f"cannot read server metrics from {url}: {getattr(exc, 'reason', exc)}") from None


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of a metric over every label set that matches `labels`."""
    want = set(labels.items())
    return sum(v for (n, lbl), v in samples.items() if n == name and want <= lbl)


@dataclass(frozen=True)
class SpecCounters:
    requests: float
    speculated_requests: float
    steps: float
    draft_tokens: float
    accepted_tokens: float

    @classmethod
    def read(cls, samples: Samples, **labels: str) -> SpecCounters:
        return cls(
            requests=total(samples, names.REQUESTS, **labels),
            speculated_requests=total(samples, names.REQUESTS, speculative="true", **labels),
            steps=total(samples, names.STEPS, **labels),
            draft_tokens=total(samples, names.DRAFT_TOKENS, **labels),
            accepted_tokens=total(samples, names.ACCEPTED_TOKENS, **labels),
        )

    def __sub__(self, other: SpecCounters) -> SpecCounters:
        return SpecCounters(*(a - b for a, b in zip(self.__dict__.values(), other.__dict__.values(), strict=True)))

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def tokens_per_step(self) -> float | None:
        return 1 + self.accepted_tokens / self.steps if self.steps else None

    def as_dict(self) -> dict:
        return {**self.__dict__, "acceptance_rate": self.acceptance_rate, "tokens_per_step": self.tokens_per_step}


def exposes_spec_metrics(samples: Samples) -> bool:
    return any(name == names.REQUESTS for name, _ in samples)


NOT_EXPORTED = (
    "the server exports no trtspec_spec_decode_* families (NVIDIA's models report acceptance per request only)"
)


class ServerWindow:
    """The server's counters at the start of a measured level; close() gives their change over it.

    A server that cannot be read (down, wrong URL) gives `available: false` with the reason; the
    bench goes on, since its client-side figures do not depend on this.
    """

    def __init__(self, url: str | None) -> None:
        self.url = url
        self.before = self._read()

    def _read(self) -> Samples | str:
        if self.url is None:
            return "no metrics URL (bench a config, or give --server-metrics)"
        try:
            return scrape(self.url)
        except (OSError, ValueError) as exc:
            return str(exc)

    def close(self) -> dict:
        after = self._read()
        for state in (self.before, after):
            if isinstance(state, str):
                return {"available": False, "why": state, "url": self.url}
        if not exposes_spec_metrics(after) or not exposes_spec_metrics(self.before):
            return {"available": False, "why": NOT_EXPORTED, "url": self.url}
        delta = SpecCounters.read(after) - SpecCounters.read(self.before)
        if any(v < 0 for v in delta.__dict__.values()):
            return {"available": False, "why": "the server's counters went back: it restarted during the level"}
        return {"available": True, "url": self.url, **delta.as_dict()}
