"""Can one client process drive a fast server? Streamed responses/s and dispatch lag of `trtspec bench`
against trivial streaming models on loopback, so the client is the only thing that can be slow.

Two trivial servers, each answering a request with `max_tokens` one-token responses as fast as it can:
a decoupled python model on a real tritonserver (gRPC bidirectional streaming, the bench's main
protocol) and an aiohttp OpenAI SSE server (tests/openai_server.py --trivial). Each is driven with
one client process at open-loop rates offering 1,000 to 4,000 responses/s. Target: one process
sustains >= 1,000 streamed responses/s with p99 dispatch lag under 5 ms.

    python benchmarks/loadgen.py [--requests 300] [--tokens 64] [--out results/loadgen.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from trtspec.bench.datasets import BenchPrompt  # noqa: E402
from trtspec.bench.records import read_records  # noqa: E402
from trtspec.bench.run import BenchOptions, run_bench  # noqa: E402
from trtspec.bench.schedule import Load  # noqa: E402
from trtspec.fsutil import atomic_write_text  # noqa: E402
from trtspec.serve.server import Ports, free_ports, start_server, wait_ready  # noqa: E402

TRIVIAL_MODEL = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Answers max_tokens one-token responses as fast as the backend sends them."""

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "max_tokens").as_numpy().reshape(-1)[0])
            for i in range(n):
                out = [pb_utils.Tensor("text_output", np.array([b"a"], dtype=object)),
                       pb_utils.Tensor("output_ids", np.array([i], dtype=np.int32))]
                flags = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if i == n - 1 else 0
                sender.send(pb_utils.InferenceResponse(out), flags=flags)
        return None
'''

TRIVIAL_CONFIG = """name: "trivial"
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "text_input" data_type: TYPE_STRING dims: [ -1 ] },
        { name: "max_tokens" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] },
         { name: "output_ids" data_type: TYPE_INT32 dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def measure(url: str, rate: float, requests: int, tokens: int, out: Path) -> dict:
    prompts = [BenchPrompt("hello", "trivial", 1, tokens)]
    opts = BenchOptions(
        targets={"A": url}, levels=[Load(rate=rate, arrival="poisson")], prompts=prompts, out_dir=out,
        num_requests=requests, warmup=2, fixed_length=False, tokenizer=None,
    )  # fmt: skip
    summary = run_bench(opts, lambda _n, _r: None)
    level = summary.levels[0]
    a, client = level.targets["A"], level.client["A"]
    chunks = sum(len(r.chunk_times) for r in read_records(out / "requests.jsonl") if r.phase == "measure")
    return {
        "offered_responses_per_s": rate * tokens,
        "responses_per_s": chunks / a.duration_s,
        "completed": a.completed,
        "failed": a.failed,
        "dispatch_lag_p99_ms": client.dispatch_lag_ms["p99"],
        "loop_lag_p99_ms": client.loop_lag_ms["p99"],
        "client_cpu": client.cpu_fraction_per_worker,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=REPO / "results" / "loadgen.json")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="trtspec-loadgen-") as tmp:
        repo = Path(tmp) / "repo" / "trivial"
        (repo / "1").mkdir(parents=True)
        (repo / "1" / "model.py").write_text(TRIVIAL_MODEL)
        (repo / "config.pbtxt").write_text(TRIVIAL_CONFIG)
        ports = Ports(*free_ports(3))
        server = start_server(repo.parent, ports, Path(tmp) / "triton.log")
        oai_port = free_ports(1)[0]
        oai = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "openai_server.py"), "--port", str(oai_port), "--trivial"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            wait_ready(server, 120)
            time.sleep(1.0)
            targets = {
                "triton-grpc": f"triton-grpc://localhost:{ports.grpc}/trivial",
                "openai": f"openai://127.0.0.1:{oai_port}/trivial",
            }
            for protocol, url in targets.items():
                for offered in (1000, 2000, 4000):
                    row = measure(url, offered / args.tokens, args.requests, args.tokens, Path(tmp) / protocol)
                    rows.append({"protocol": protocol, **row})
                    atomic_write_text(args.out, json.dumps({"rows": rows}, indent=2))
        finally:
            server.stop()
            oai.terminate()
    print(f"{'protocol':12s} {'offered/s':>9s} {'responses/s':>11s} {'p99 dispatch ms':>15s} {'p99 loop ms':>11s} cpu")
    for r in rows:
        print(
            f"{r['protocol']:12s} {r['offered_responses_per_s']:9.0f} {r['responses_per_s']:11.0f} "
            f"{r['dispatch_lag_p99_ms']:15.2f} {r['loop_lag_p99_ms']:11.2f} {r['client_cpu']:.0%}"
        )
    best = {p: max((r for r in rows if r["protocol"] == p and r["dispatch_lag_p99_ms"] < 5 and not r["failed"]),
                   key=lambda r: r["responses_per_s"], default=None) for p in ("triton-grpc", "openai")}  # fmt: skip
    ok = True
    for protocol, r in best.items():
        if r is None or r["responses_per_s"] < 1000:
            print(f"{protocol}: target NOT met: no level reached 1,000 responses/s with p99 dispatch lag < 5 ms")
            ok = False
        else:
            print(
                f"{protocol}: target met: one client process sustained {r['responses_per_s']:.0f} streamed responses/s "
                f"with p99 dispatch lag {r['dispatch_lag_p99_ms']:.2f} ms (< 5 ms)"
            )
    print(f"wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
