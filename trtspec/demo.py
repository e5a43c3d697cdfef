"""`trtspec demo`: the whole product on the embedded pair, on this machine, in a few minutes.

It builds the baseline, draft-target and MTP repositories (torch backend, llmapi flavour), serves
each on its own real tritonserver, and benches each speculative mode against the baseline over
gRPC streaming on the same prompts and schedule, with the lossless check; then prints the tables
and where the reports are.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from rich.console import Console

from trtspec.assets import ASSETS_DIR
from trtspec.bench.datasets import from_file, load_tokenizer
from trtspec.bench.run import BenchOptions, run_bench
from trtspec.bench.schedule import Load
from trtspec.bench.tables import print_summary

COMMON = {
    "target": {"checkpoint": "embedded:tiny-target", "dtype": "float32"},
    "build": {"backend": "torch", "device": "cpu", "max_batch_size": 4, "max_input_len": 256, "max_seq_len": 512},
    "serve": {"flavour": "llmapi", "streaming": True},
}
MODES = {
    "baseline": {"speculation": {"mode": "none"}},
    "draft-target": {
        "draft": {"checkpoint": "embedded:tiny-draft", "dtype": "float32"},
        "speculation": {"mode": "draft-target", "num_draft_tokens": 2},
    },
    "mtp": {"mtp": {"num_nextn_predict_layers": 2}, "speculation": {"mode": "mtp", "num_draft_tokens": 2}},
}


def write_configs(workdir: Path) -> dict[str, Path]:
    from trtspec.serve.server import free_ports

    paths = {}
    ports_left = free_ports(3 * len(MODES))
    for name, extra in MODES.items():
        data = {"name": f"demo-{name}", **COMMON, **extra}
        data["build"] = {**COMMON["build"], "output_dir": str(workdir / "engines")}
        ports = {f"{k}_port": ports_left.pop() for k in ("http", "grpc", "metrics")}
        data["serve"] = {**COMMON["serve"], "repository": str(workdir / "model_repository"), **ports}
        path = workdir / "configs" / f"demo-{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        paths[name] = path
    return paths


# The lossless check's size: on the embedded draft-target pair one context of 1,000 samples catches
# each planted verification bug with power near 1 (800 gave 0.92 against the residual bug, 400 on
# two contexts 0.70); MTP's drafts are rejected too rarely for that, and its verdict says so.
LOSSLESS = {"samples": 1000, "tokens": 4, "prompts": 1, "temperature": 1.0}


def run_demo(workdir: Path, console: Console, requests: int = 8, lossless_samples: int = LOSSLESS["samples"]) -> int:
    from trtspec.build.builder import run_build
    from trtspec.config import load_config
    from trtspec.repository.package import package_repository
    from trtspec.serve.server import Ports, start_server, wait_ready

    workdir.mkdir(parents=True, exist_ok=True)
    configs = {name: load_config(path) for name, path in write_configs(workdir).items()}
    for name, cfg in configs.items():
        run_build(cfg)
        console.print(f"built and packaged {name}: {package_repository(cfg)}")
    servers = {}
    try:
        for name, cfg in configs.items():
            ports = Ports(cfg.serve.http_port, cfg.serve.grpc_port, cfg.serve.metrics_port)
            repo = workdir / "model_repository" / cfg.name
            servers[name] = start_server(repo, ports, workdir / "logs" / f"{name}.tritonserver.log")
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda s: wait_ready(s, 300), servers.values()))
        console.print("serving: " + ", ".join(f"{n} on gRPC :{s.ports.grpc}" for n, s in servers.items()))
        tokenizer = str(ASSETS_DIR / "tiny-target")
        prompts = from_file(load_tokenizer(tokenizer), ASSETS_DIR / "demo_prompts.jsonl", 48)
        failed = False
        for mode in ("draft-target", "mtp"):
            out = workdir / "results" / f"{mode}-vs-baseline"
            pair = {"A": servers[mode], "B": servers["baseline"]}
            opts = BenchOptions(
                targets={label: f"triton-grpc://localhost:{s.ports.grpc}/tensorrt_llm" for label, s in pair.items()},
                metrics_urls={label: f"http://localhost:{s.ports.metrics}/metrics" for label, s in pair.items()},
                levels=[Load(concurrency=1), Load(concurrency=4)], prompts=prompts, out_dir=out,
                num_requests=requests, warmup=2, max_tokens=48, fixed_length=True, tokenizer=tokenizer,
                lossless=True, lossless_samples=lossless_samples, lossless_tokens=LOSSLESS["tokens"],
                lossless_prompts=LOSSLESS["prompts"], lossless_temperature=LOSSLESS["temperature"],
                lossless_reference=workdir / "configs" / f"demo-{mode}.yaml",
            )  # fmt: skip
            console.print(f"\n[bold]{mode} (A) against the baseline (B)[/bold]")
            summary = run_bench(opts, lambda _name, _record: None)
            print_summary(summary, console, out)
            # an underpowered check is reported as inconclusive; only a FAIL or a broken run fails the demo
            failed = failed or (summary.lossless or {}).get("verdict") == "FAIL" or not summary.complete
        return 1 if failed else 0
    finally:
        for server in servers.values():
            server.stop()
