"""Did the client keep up? A verdict from its own dispatch lag, event-loop lag and CPU.

Thresholds: a request sent more than 5 ms after its scheduled time at p99, an event loop that
wakes more than 10 ms late at p99, or a worker busy more than 90% of its wall time means the
client, not the server, may be shaping the numbers.
"""

from __future__ import annotations

import numpy as np

from trtspec.bench.load import ClientStats
from trtspec.bench.results import ClientCheck

DISPATCH_P99_MS = 5.0
LOOP_P99_MS = 10.0
CPU_BUSY = 0.9


def client_check(stats: ClientStats, workers: int) -> ClientCheck:
    dispatch = np.array(stats.dispatch_lag_s or [0.0]) * 1000
    loop = np.array(stats.loop_lag_s or [0.0]) * 1000
    cpu = stats.cpu_s / (stats.wall_s * workers) if stats.wall_s > 0 else 0.0
    problems = []
    if np.percentile(dispatch, 99) > DISPATCH_P99_MS:
        problems.append(f"p99 dispatch lag {np.percentile(dispatch, 99):.1f} ms > {DISPATCH_P99_MS:g} ms")
    if np.percentile(loop, 99) > LOOP_P99_MS:
        problems.append(f"p99 event-loop lag {np.percentile(loop, 99):.1f} ms > {LOOP_P99_MS:g} ms")
    if cpu > CPU_BUSY:
        problems.append(f"client CPU {cpu:.0%} of {workers} worker(s)")
    verdict = "ok: the client kept up" if not problems else "client-bound: " + "; ".join(problems) + " (add --workers)"
    return ClientCheck(
        workers=workers,
        dispatch_lag_ms={"p50": float(np.percentile(dispatch, 50)), "p99": float(np.percentile(dispatch, 99)),
                         "max": float(dispatch.max())},
        loop_lag_ms={"p50": float(np.percentile(loop, 50)), "p99": float(np.percentile(loop, 99)),
                     "max": float(loop.max())},
        cpu_fraction_per_worker=cpu, ok=not problems, verdict=verdict,
    )  # fmt: skip
