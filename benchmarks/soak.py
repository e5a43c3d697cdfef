"""Soak: a served tiny config under mixed good and hostile traffic for a set time, loopback only.

Does the server keep its promises over minutes, not one request: every good request answered, every
hostile one refused in one line without a stack trace or a server path, memory flat, and every
client-side record on disk when the run ends? The embedded draft-target pair is built, packaged and
served (llmapi flavour by default) on 127.0.0.1; `--workers` threads send requests until
`--duration` seconds or `--max-requests` have passed, each one good (HTTP generate, or
generate_stream read to the end) or, with probability `--bad-fraction`, one from the hostile
catalogue below (NaN/inf/negative/huge numbers, non-UTF-8 bytes, malformed JSON, an unknown model,
a missing input, an oversized prompt, a client that hangs up mid-stream). Each request's record is
appended to a JSON-lines file and flushed as it completes.

The server's resident memory (tritonserver and its python backend stubs) is sampled every
`--sample-s`; growth is the mean of the last tenth of the samples over the mean of the first tenth
after warm-up (`--warmup`, a fraction of the duration).

Criteria (exit 1 if one fails): zero failed good requests; zero hostile requests answered with a
traceback or a server path, and zero accepted; the server alive at the end; every record on disk and
parseable; RSS growth < 5% after warm-up.

    python benchmarks/soak.py [--duration 600] [--workers 4] [--bad-fraction 0.3] [--max-tokens 24]
        [--max-requests 100000] [--mode draft-target] [--flavour llmapi] [--out results/soak.json]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from serving import MODES, REPO, config_for, held_out_prompts, request_body

from trtspec.build.builder import run_build
from trtspec.errors import run_script
from trtspec.fsutil import atomic_write_text
from trtspec.repository.package import package_repository
from trtspec.serve.server import Ports, Server, free_ports, start_server, wait_ready

RSS_GROWTH_MAX = 0.05
HOST = "127.0.0.1"
LEAK_MARKERS = ("Traceback", 'File "', "site-packages", '.py", line')


@dataclass
class Record:
    """One request as the client saw it."""

    worker: int
    kind: str  # "good", "good-stream", or the hostile case's name
    hostile: bool
    status: int  # HTTP status; 0 when the connection failed
    ok: bool  # good: a full answer; hostile: refused cleanly (or, for hang-ups, the server moved on)
    outcome: str  # answered, refused, leaked, accepted, connection-error, hung-up
    seconds: float
    detail: str  # the error body's first 200 characters, for the report


def _post(path: str, body: bytes, port: int, timeout: float = 120.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _hang_up(path: str, body: bytes, port: int) -> tuple[int, bytes]:
    """Open a stream, read its first bytes, and close the socket: a client that went away."""
    conn = http.client.HTTPConnection(HOST, port, timeout=60)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        first = response.read1(64) if response.status == 200 else response.read()
        return response.status, first
    finally:
        conn.close()


def hostile_cases(model: str, prompt: str, fields: dict, max_seq_len: int) -> dict[str, tuple[str, bytes]]:
    """Name -> (path, raw body). Each must be refused with a 4xx and one clean line."""
    gen = f"/v2/models/{model}/generate"
    temperature, max_tokens = fields["temperature"], fields["max_tokens"]

    def body(**extra: object) -> bytes:
        return json.dumps({"text_input": prompt, **extra}).encode()

    return {
        "nan-temperature": (gen, body(**{temperature: float("nan")})),  # json writes a bare NaN
        "inf-temperature": (gen, body(**{temperature: float("inf")})),
        "negative-max-tokens": (gen, body(**{max_tokens: -1})),
        "huge-max-tokens": (gen, body(**{max_tokens: 10**12})),
        "over-budget-max-tokens": (gen, body(**{max_tokens: max_seq_len * 4})),
        "non-utf8-prompt": (gen, b'{"text_input": "caf\xe9 \xff\xfe"}'),
        "malformed-json": (gen, b'{"text_input": "unterminated'),
        "unknown-model": ("/v2/models/no-such-model/generate", body()),
        "missing-text-input": (gen, json.dumps({max_tokens: 4}).encode()),
        "oversized-prompt": (gen, body(text_input="to be or not " * (max_seq_len * 2))),
        "string-for-number": (gen, body(**{max_tokens: "many"})),
    }


def classify(kind: str, hostile: bool, status: int, text: str) -> tuple[bool, str]:
    if status == 0:
        return False, "connection-error"
    if not hostile:
        return (status == 200 and "error" not in text[:200].lower()), "answered" if status == 200 else "failed"
    if kind == "hang-up":
        return True, "hung-up"
    if any(marker in text for marker in LEAK_MARKERS):
        return False, "leaked"
    if 200 <= status < 300:
        return False, "accepted"
    return True, "refused"


def process_tree_rss(pid: int) -> int:
    """Resident bytes of `pid` and every descendant (tritonserver's python backend stubs)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        todo.extend(children.get(current, []))
        try:
            for line in Path(f"/proc/{current}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total


def rss_growth(samples: list[tuple[float, int]], start: float) -> dict[str, float | int]:
    after = [rss for t, rss in samples if t >= start]
    if len(after) < 4:
        return {"samples": len(after), "growth": float("nan")}
    tenth = max(1, len(after) // 10)
    first, last = statistics.mean(after[:tenth]), statistics.mean(after[-tenth:])
    return {"samples": len(after), "first_mb": first / 2**20, "last_mb": last / 2**20, "growth": last / first - 1}


class Soak:
    def __init__(self, server: Server, cfg, prompts: list[str], args: argparse.Namespace, records: Path) -> None:
        self.server, self.cfg, self.prompts, self.args = server, cfg, prompts, args
        self.model, _ = request_body(cfg, prompts[0], 1)
        llmapi = cfg.serve.flavour == "llmapi"
        fields = {
            "temperature": "sampling_param_temperature" if llmapi else "temperature",
            "max_tokens": "sampling_param_max_tokens" if llmapi else "max_tokens",
        }
        self.hostile = hostile_cases(self.model, prompts[0], fields, cfg.build.max_seq_len)
        self.records_path = records
        self.lock = threading.Lock()
        self.sent = 0
        self.counts: dict[str, dict[str, int]] = {}
        self.deadline = time.monotonic() + args.duration

    def _next(self) -> bool:
        with self.lock:
            if self.sent >= self.args.max_requests or time.monotonic() >= self.deadline:
                return False
            self.sent += 1
            return True

    def _one(self, worker: int, rng: random.Random) -> Record:
        port = self.server.ports.http
        prompt = rng.choice(self.prompts)
        _, good = request_body(self.cfg, prompt, self.args.max_tokens)
        if rng.random() < self.args.bad_fraction:
            names = [*self.hostile, "hang-up"]
            kind = rng.choice(names)
            hostile = True
            if kind == "hang-up":
                path, body, call = f"/v2/models/{self.model}/generate_stream", json.dumps(good).encode(), _hang_up
            else:
                (path, body), call = self.hostile[kind], _post
        else:
            hostile = False
            kind = rng.choice(["good", "good-stream"]) if self.cfg.serve.streaming else "good"
            suffix = "generate_stream" if kind == "good-stream" else "generate"
            path, body, call = f"/v2/models/{self.model}/{suffix}", json.dumps(good).encode(), _post
        t0 = time.perf_counter()
        try:
            status, raw = call(path, body, port)
        except (OSError, http.client.HTTPException) as exc:
            status, raw = 0, str(exc).encode()
        text = raw.decode("utf-8", errors="replace")
        if kind == "good-stream" and status == 200:
            status = 200 if "text_output" in text and '"error"' not in text else 500
        ok, outcome = classify(kind, hostile, status, text)
        detail = "" if ok and not hostile else text[:200]
        return Record(worker, kind, hostile, status, ok, outcome, time.perf_counter() - t0, detail)

    def worker(self, index: int, fh) -> None:
        rng = random.Random(index)
        while self._next():
            record = self._one(index, rng)
            with self.lock:
                fh.write(json.dumps(asdict(record)) + "\n")
                fh.flush()
                bucket = self.counts.setdefault(record.kind, {})
                bucket[record.outcome] = bucket.get(record.outcome, 0) + 1

    def run(self) -> tuple[list[tuple[float, int]], float]:
        samples: list[tuple[float, int]] = []
        t0 = time.monotonic()
        with self.records_path.open("w", encoding="utf-8") as fh:
            threads = [
                threading.Thread(target=self.worker, args=(i, fh), daemon=True) for i in range(self.args.workers)
            ]
            for t in threads:
                t.start()
            while any(t.is_alive() for t in threads):
                samples.append((time.monotonic() - t0, process_tree_rss(self.server.process.pid)))
                for t in threads:
                    t.join(timeout=self.args.sample_s / len(threads))
        return samples, time.monotonic() - t0


def read_records(path: Path) -> tuple[int, int]:
    """(lines, lines that parse as a whole record): every record flushed means both equal `sent`."""
    lines = parsed = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        lines += 1
        with contextlib.suppress(ValueError):
            parsed += set(json.loads(line)) == set(Record.__dataclass_fields__)
    return lines, parsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of traffic")
    ap.add_argument("--max-requests", type=int, default=100_000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--bad-fraction", type=float, default=0.3)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--warmup", type=float, default=0.2, help="fraction of the duration before RSS is compared")
    ap.add_argument("--sample-s", type=float, default=2.0)
    ap.add_argument("--mode", choices=sorted(MODES), default="draft-target")
    ap.add_argument("--flavour", choices=("llmapi", "engine"), default="llmapi")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "soak.json")
    args = ap.parse_args()
    prompts = held_out_prompts(16)
    with tempfile.TemporaryDirectory(prefix="trtspec-soak-") as tmp:
        cfg = config_for(args.mode, args.flavour, Path(tmp), name=f"soak-{args.mode}")
        run_build(cfg)
        repo = package_repository(cfg)
        server = start_server(repo, Ports(*free_ports(3)), args.out.with_suffix(".tritonserver.log"))
        try:
            wait_ready(server, 300)
            records = args.out.with_suffix(".records.jsonl")
            records.parent.mkdir(parents=True, exist_ok=True)
            soak = Soak(server, cfg, prompts, args, records)
            samples, seconds = soak.run()
            alive = server.process.poll() is None
        finally:
            server.stop()
    lines, parsed = read_records(records)
    growth = rss_growth(samples, args.warmup * seconds)
    good = {o: n for k, b in soak.counts.items() if k.startswith("good") for o, n in b.items()}
    bad = {o: n for k, b in soak.counts.items() if not k.startswith("good") for o, n in b.items()}
    good_failed = sum(n for o, n in good.items() if o != "answered")
    criteria = [
        ("good requests that failed", good_failed, good_failed == 0),
        ("hostile requests leaked a trace or path", bad.get("leaked", 0), bad.get("leaked", 0) == 0),
        ("hostile requests accepted", bad.get("accepted", 0), bad.get("accepted", 0) == 0),
        ("hostile requests lost the connection", bad.get("connection-error", 0), bad.get("connection-error", 0) == 0),
        ("server alive at the end", alive, alive),
        ("records on disk / sent", f"{parsed}/{soak.sent}", lines == parsed == soak.sent),
        ("RSS growth after warm-up", growth["growth"], growth["growth"] < RSS_GROWTH_MAX),
    ]
    result = {
        "mode": args.mode,
        "flavour": args.flavour,
        "duration_s": seconds,
        "workers": args.workers,
        "bad_fraction": args.bad_fraction,
        "sent": soak.sent,
        "by_kind": soak.counts,
        "good_failed": good_failed,
        "rss": growth,
        "rss_samples": samples,
        "records": {"path": str(records), "lines": lines, "parsed": parsed},
        "criteria": [{"what": w, "value": v, "pass": p} for w, v, p in criteria],
    }
    atomic_write_text(args.out, json.dumps(result, indent=2, default=str))
    print(f"{'kind':<24} outcomes")
    for kind in sorted(soak.counts):
        print(f"{kind:<24} " + ", ".join(f"{o} {n}" for o, n in sorted(soak.counts[kind].items())))
    rss_line = growth.get("first_mb"), growth.get("last_mb")
    print(f"server RSS after warm-up: {rss_line[0] or 0:.0f} -> {rss_line[1] or 0:.0f} MiB")
    for what, value, passed in criteria:
        shown = f"{value:.4f}" if isinstance(value, float) else value
        print(f"{'PASS' if passed else 'FAIL'} {what}: {shown}")
    print(f"wrote {args.out}")
    return 0 if all(p for _, _, p in criteria) else 1


if __name__ == "__main__":
    sys.exit(run_script(main))
