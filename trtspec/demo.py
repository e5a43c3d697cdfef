"""`trtspec demo`: the whole product on the embedded pair, on this machine, in a few minutes.

It builds the baseline, draft-target and MTP repositories (torch backend, llmapi flavour; `--methods` picks
among the modes a torch engine serves, n-gram, EAGLE-3, Medusa and lookahead too, the draft model's n-gram
cascade, and the first-layer self-draft served as the draft-target pair that deploys it), each
speculative mode twice (a fixed K, and the adaptive policy that picks K per running batch; once, fixed,
where the mode's settings fix its tree: Medusa's choices, lookahead's W, N, G), serves
each on its own real tritonserver, and benches each against a baseline of its own flavour over gRPC
streaming on the same prompts and schedule at concurrency 1 to 16, with the lossless check on the fixed-K
servers (whose K the check's power is computed for); then prints the tables, the throughput curve with where
speculation stops paying, and where the reports are. Medusa and lookahead are served by the engine flavour
(TensorRT-LLM serves them from compiled engines only), so they are benched through the ensemble against an
engine-flavour baseline.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml
from rich.console import Console

from trtspec.assets import ASSETS_DIR
from trtspec.bench.datasets import from_file, load_tokenizer
from trtspec.bench.results import BenchSummary
from trtspec.bench.run import BenchOptions, run_bench
from trtspec.bench.schedule import Load
from trtspec.bench.tables import print_summary
from trtspec.modes import get_mode
from trtspec.modes.medusa import runner_up_once_tree

COMMON = {
    "target": {"checkpoint": "embedded:tiny-target", "dtype": "float32"},
    "build": {"backend": "torch", "device": "cpu", "max_batch_size": 16, "max_input_len": 256, "max_seq_len": 512},
    "serve": {"flavour": "llmapi", "streaming": True},
}
SPECULATIVE = {
    "draft-target": {
        "draft": {"checkpoint": "embedded:tiny-draft", "dtype": "float32"},
        "speculation": {"mode": "draft-target", "num_draft_tokens": 2},
    },
    "mtp": {"mtp": {"num_nextn_predict_layers": 2}, "speculation": {"mode": "mtp", "num_draft_tokens": 2}},
    "eagle3": {
        "draft": {"checkpoint": "embedded:tiny-eagle3", "dtype": "float32"},
        "speculation": {"mode": "eagle3", "num_draft_tokens": 2},
    },
    # a private pool: the demo sends its 12 prompts over and over, and TensorRT-LLM's default public pool would
    # draft each repeat from its earlier output, a replay no real traffic gets
    "ngram": {"ngram": {"is_public_pool": False}, "speculation": {"mode": "ngram", "num_draft_tokens": 2}},
    # the trained heads verifying the static tree of medusa.choices, served as TensorRT-LLM serves Medusa
    "medusa": {
        "draft": {"checkpoint": "embedded:tiny-medusa", "dtype": "float32"},
        "medusa": {"num_heads": 2, "choices": runner_up_once_tree(2)},
        "speculation": {"mode": "medusa"},
    },
    # the draft model's drafts sped up by n-gram guesses (a setting of draft-target, not a mode): served by
    # trtspec's llmapi model, which reads it from model.yaml's own trtspec section; K=3 as benchmarks/speculative.py
    "draft-target-cascade": {
        "draft": {"checkpoint": "embedded:tiny-draft", "dtype": "float32"},
        "draft_target": {"cascade": "ngram"},
        "speculation": {"mode": "draft-target", "num_draft_tokens": 3},
    },
    # the target's first layer drafting for it (the README's self-draft row), served as TensorRT-LLM would serve
    # it: a draft-target pair whose draft is the target cut to that layer (written as export-self-draft does)
    "self-draft": {"self_draft": {"layers": [0]}, "speculation": {"mode": "self-draft", "num_draft_tokens": 1}},
    # (3, 2, 1): the README's measured lookahead row; the engine flavour, as TensorRT-LLM serves lookahead
    "lookahead": {
        "lookahead": {"window_size": 3, "ngram_size": 2, "verification_set_size": 1},
        "speculation": {"mode": "lookahead"},
    },
}
DEFAULT_METHODS = ("draft-target", "mtp")
POLICIES = ("fixed", "adaptive")
LEVELS = (1, 2, 4, 8, 16)


def flavour(setup: dict) -> str:
    """The flavour a setup names, else the one that serves its mode on backend torch (Medusa, lookahead: engine)."""
    mode = setup.get("speculation", {}).get("mode", "none")
    return setup.get("serve", {}).get("flavour") or get_mode(mode).torch_flavour


def policies(method: str) -> tuple[str, ...]:
    """Fixed, and adaptive where K is the mode's to choose: not for a tree its own settings fix."""
    setup = SPECULATIVE[method]
    spec = get_mode(setup["speculation"]["mode"])
    own = spec.runner_tree(setup.get(spec.section or "", {})) is not None
    return ("fixed",) if own else POLICIES


def baseline_for(setup: dict) -> str:
    """The baseline server a setup is benched against: plain decoding served by the same flavour."""
    return "baseline" if flavour(setup) == COMMON["serve"]["flavour"] else f"baseline-{flavour(setup)}"


def demo_modes(methods: tuple[str, ...] = DEFAULT_METHODS) -> dict[str, dict]:
    """The servers the demo runs: a baseline per flavour the methods need, then each method with a fixed K and
    with the adaptive policy (fixed only where its settings fix a tree)."""
    baselines = {
        baseline_for(setup): {"speculation": {"mode": "none"}, "serve": {"flavour": flavour(setup)}}
        for setup in (SPECULATIVE[mode] for mode in methods)
    }
    return baselines | {
        f"{mode}-{policy}": {
            **SPECULATIVE[mode],
            "speculation": {**SPECULATIVE[mode]["speculation"], "policy": policy},
            "serve": {"flavour": flavour(SPECULATIVE[mode])},
        }
        for mode in methods
        for policy in policies(mode)
    }


def bench_model(setup: dict) -> str:
    """The Triton model the bench sends text to: the llmapi model, or the engine flavour's ensemble."""
    return "tensorrt_llm" if flavour(setup) == "llmapi" else "ensemble"


def write_configs(workdir: Path, methods: tuple[str, ...] = DEFAULT_METHODS) -> dict[str, Path]:
    from trtspec.serve.server import free_ports

    paths = {}
    modes = demo_modes(methods)
    ports_left = free_ports(3 * len(modes))
    for name, extra in modes.items():
        data = {"name": f"demo-{name}", **COMMON, **extra}
        data["build"] = {**COMMON["build"], "output_dir": str(workdir / "engines")}
        ports = {f"{k}_port": ports_left.pop() for k in ("http", "grpc", "metrics")}
        data["serve"] = {**COMMON["serve"], **extra.get("serve", {}), "repository": str(workdir / "model_repository")}
        data["serve"].update(ports)
        if data["speculation"]["mode"] == "self-draft":
            data = served_self_draft(data, workdir)
        path = workdir / "configs" / f"demo-{name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        paths[name] = path
    return paths


def served_self_draft(data: dict, workdir: Path) -> dict:
    """A self-draft setup as the draft-target config that serves it, its draft the target cut to its layers (an
    absolute path: the config in workdir/configs resolves relative ones from there)."""
    from trtspec.checkpoints.self_draft import cut_checkpoint, draft_target_data
    from trtspec.config import resolve_checkpoint

    layers = data["self_draft"]["layers"]
    folder = (workdir / "self-draft" / ("layers-" + "-".join(map(str, layers)))).resolve()
    if not folder.exists():  # the same layers of the same embedded target: cut once per demo folder
        cut_checkpoint(resolve_checkpoint(data["target"]["checkpoint"], workdir / "configs"), layers, folder)
    return draft_target_data(data, {**data["target"], "checkpoint": str(folder)}, None)


# The lossless check's size: on the embedded draft-target pair one context of 1,000 samples catches
# each planted verification bug with power near 1 (800 gave 0.92 against the residual bug, 400 on
# two contexts 0.70); MTP's drafts are rejected too rarely for that, and its verdict says so.
LOSSLESS = {"samples": 1000, "tokens": 4, "prompts": 1, "temperature": 1.0}


def run_demo(
    workdir: Path,
    console: Console,
    requests: int = 32,
    lossless_samples: int = LOSSLESS["samples"],
    methods: tuple[str, ...] = DEFAULT_METHODS,
) -> int:
    from trtspec.build.builder import run_build
    from trtspec.config import load_config
    from trtspec.repository.package import package_repository
    from trtspec.serve.server import Ports, start_server, stop_all, wait_ready

    workdir.mkdir(parents=True, exist_ok=True)
    setups = demo_modes(methods)
    configs = {name: load_config(path) for name, path in write_configs(workdir, methods).items()}
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
        curves: dict[str, BenchSummary] = {}
        for name in configs:
            if name.startswith("baseline"):
                continue
            fixed = name.endswith("-fixed")
            baseline = baseline_for(setups[name])
            out = workdir / "results" / f"{name}-vs-{baseline}"
            pair = {"A": servers[name], "B": servers[baseline]}
            model = bench_model(setups[name])
            opts = BenchOptions(
                targets={label: f"triton-grpc://localhost:{s.ports.grpc}/{model}" for label, s in pair.items()},
                metrics_urls={label: f"http://localhost:{s.ports.metrics}/metrics" for label, s in pair.items()},
                levels=[Load(concurrency=c) for c in LEVELS], prompts=prompts, out_dir=out,
                num_requests=requests, warmup=2, max_tokens=48, fixed_length=True, tokenizer=tokenizer,
                lossless=fixed, lossless_samples=lossless_samples, lossless_tokens=LOSSLESS["tokens"],
                lossless_prompts=LOSSLESS["prompts"], lossless_temperature=LOSSLESS["temperature"],
                lossless_reference=workdir / "configs" / f"demo-{name}.yaml",
            )  # fmt: skip
            console.print(f"\n[bold]{name} (A) against the {baseline} (B)[/bold]")
            summary = run_bench(opts, lambda _name, _record: None)
            print_summary(summary, console, out)
            curves[name] = summary
            # an underpowered check is reported as inconclusive; only a FAIL or a broken run fails the demo
            failed = failed or (summary.lossless or {}).get("verdict") == "FAIL" or not summary.complete
        baselines = {name: baseline_for(setups[name]) for name in curves}
        print_curve(curves, console, workdir / "results" / "curve.json", baselines)
        return 1 if failed else 0
    finally:
        stop_all(servers.values())


def print_curve(
    curves: dict[str, BenchSummary], console: Console, path: Path, baselines: dict[str, str] | None = None
) -> None:
    """Output tokens/s per concurrency for each baseline and every speculative server (against the baseline
    `baselines` names for it, else "baseline"), and where each stops paying."""
    from rich.table import Table

    from trtspec.bench.crossover import measured_crossover
    from trtspec.fsutil import atomic_write_text

    against = {name: (baselines or {}).get(name, "baseline") for name in curves}
    columns = list(dict.fromkeys(against.values())) + list(curves)
    table = Table(title="Output tokens/s by concurrency (x the baseline measured beside it)")
    table.add_column("concurrency", no_wrap=True)
    for name in columns:
        table.add_column(name, no_wrap=True)
    rows: dict[int, dict[str, float | None]] = {}
    for name, summary in curves.items():
        ratios = {row.level: row.throughput_ratio for row in summary.comparison or []}
        for level in summary.levels:
            row = rows.setdefault(level.load.concurrency, {})
            row[name] = level.targets["A"].output_token_throughput
            row[f"{name}:ratio"] = ratios.get(level.level)
            row.setdefault(against[name], level.targets["B"].output_token_throughput)
    for c, row in sorted(rows.items()):
        cells = [_tps(row.get(n)) for n in columns[: len(columns) - len(curves)]]
        cells += [f"{_tps(row.get(n))} ({_ratio(row.get(f'{n}:ratio'))})" for n in curves]
        table.add_row(str(c), *cells)
    console.print(table)
    crossings = {}
    for name, summary in curves.items():
        crossed, highest = measured_crossover(summary)
        crossings[name] = crossed
        console.print(  # by mean request latency, as the A/B tables' `pays?` (bench.crossover)
            f"{name}: stops paying (mean latency) at concurrency {crossed}"
            if crossed
            else f"{name}: pays (mean latency) at every level up to {highest}"
        )
    atomic_write_text(path, json.dumps({"tokens_per_s": rows, "stops_paying_at": crossings}, indent=2))


def _tps(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"
