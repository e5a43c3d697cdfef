"""When each request is due: closed-loop concurrency, or an open-loop arrival process.

Open-loop arrival times are drawn up front and slept against one absolute start, so the offered
load does not drift with the client's own overheads. Gaps are gamma distributed with shape
`burstiness` and mean 1/rate: burstiness 1 is a Poisson process, below 1 burstier, above 1 smoother.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Load:
    """One load level: a fixed number of requests in flight, or an arrival rate (optionally capped)."""

    concurrency: int | None = None
    rate: float | None = None  # requests/s; inf sends everything at t=0
    max_concurrency: int | None = None
    arrival: str = "poisson"  # "poisson", "gamma" or "constant"
    burstiness: float = 1.0

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("a load level is either a concurrency or a rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"rate must be > 0, got {self.rate}")
        if self.arrival not in ("poisson", "gamma", "constant"):
            raise ValueError(f"arrival must be poisson, gamma or constant, got {self.arrival!r}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")

    @property
    def label(self) -> str:
        if self.concurrency is not None:
            return f"concurrency={self.concurrency}"
        cap = f",max_concurrency={self.max_concurrency}" if self.max_concurrency else ""
        return f"rate={self.rate:g}{cap}"

    @property
    def in_flight_cap(self) -> int | None:
        return self.concurrency if self.concurrency is not None else self.max_concurrency


def arrival_gaps(
    count: int, rate: float, arrival: str = "poisson", burstiness: float = 1.0, seed: int = 0
) -> np.ndarray:
    """`count` gaps in seconds between successive arrivals (the first one from t=0)."""
    if math.isinf(rate):
        return np.zeros(count)
    rng = np.random.default_rng(seed)
    if arrival == "constant":
        return np.full(count, 1.0 / rate)
    shape = 1.0 if arrival == "poisson" else burstiness
    return rng.gamma(shape, 1.0 / (rate * shape), size=count)


def arrival_times(count: int, load: Load, seed: int = 0) -> np.ndarray:
    """Scheduled send times from the start of the level; zeros for closed-loop concurrency."""
    if load.rate is None:
        return np.zeros(count)
    gaps = arrival_gaps(count, load.rate, load.arrival, load.burstiness, seed)
    gaps[0] = 0.0  # the first request goes at the start
    return np.cumsum(gaps)
