"""The `trtspec` command: parse, call one stage, print.

Exit codes: 0 ok, 1 a failed check or run, 2 bad usage or input. Errors are one line on stderr;
--verbose adds the traceback.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import traceback
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from trtspec import __version__
from trtspec.errors import TrtspecError, UsageError
from trtspec.modes import BACKENDS, MODE_NAMES, REGISTRY, RUNNER_MODES, get_mode

console = Console()


class TrtspecGroup(click.Group):
    """Turns TrtspecError into one line on stderr with its exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (TrtspecError, OSError) as exc:
            from trtspec.fsutil import path_error

            error = exc if isinstance(exc, TrtspecError) else path_error(exc)
            if error is None:
                raise
            if ctx.obj and ctx.obj.get("verbose"):
                traceback.print_exc()
            click.echo(f"trtspec: error: {error}", err=True)
            ctx.exit(error.exit_code)


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


config_argument = click.argument("config", type=click.Path(dir_okay=False, path_type=Path))


@click.group(cls=TrtspecGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="trtspec")
@click.option("--verbose", is_flag=True, help="Show tracebacks for errors.")
@click.pass_context
def cli(ctx: click.Context, verbose: bool) -> None:
    """Speculative decoding from a checkpoint pair to a served, load-tested deployment."""
    ctx.obj = {"verbose": verbose}


@cli.command()
@click.option("--target", required=True, help="Target checkpoint: a local HF directory, embedded:<name> or a hub id.")
@click.option(
    "--draft",
    help="Draft checkpoint: a model sharing the target's tokenizer (draft-target), or EAGLE-3 or Medusa heads.",
)
@click.option("--mtp", is_flag=True, help="Draft with the target's own MTP layers (same as --mode mtp).")
@click.option(
    "--mode",
    type=click.Choice(MODE_NAMES),
    default=None,
    help="Speculative mode (default: with --draft, the heads' own mode or draft-target; mtp with --mtp; else none).",
)
@click.option("--name", help="Deployment name (default: from the target's directory name).")
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default=None,
    help="Engine backend (default: torch for embedded models, else the first of tensorrt, pytorch the mode exists on).",
)
@click.option(
    "--out", type=click.Path(dir_okay=False, path_type=Path), help="Where to write (default configs/NAME.yaml)."
)
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def init(
    target: str,
    draft: str | None,
    mtp: bool,
    mode: str | None,
    name: str | None,
    backend: str | None,
    out: Path | None,
    force: bool,
) -> None:
    """Write a commented deployment config for a target/draft pair or an MTP checkpoint."""
    from trtspec.config import resolve_checkpoint
    from trtspec.errors import UsageError
    from trtspec.init_config import build_config_dict, draft_mode, write_init_config
    from trtspec.modes import HEAD_MODE_NAMES, wrong_draft

    if mtp and mode not in (None, "mtp"):
        raise UsageError(f"--mtp and --mode {mode} exclude each other")
    if name is None:
        stem = target.removeprefix("embedded:").rstrip("/").split("/")[-1].lower()
        name = "".join(c if c.isalnum() else "-" for c in stem).strip("-")[:63] or "deployment"
    out = out or Path("configs") / f"{name}.yaml"
    base_dir = out.parent.resolve()
    typed = draft
    target, draft = (_from_config(ref, base_dir) if ref else ref for ref in (target, draft))
    guessed = bool(draft) and not mtp and mode is None  # the mode is the draft's to say
    reads_draft = guessed or bool(draft and mode and get_mode(mode).needs_draft)
    head = draft_mode(draft, base_dir) if reads_draft else None  # a head is its mode's draft, never a model's
    mode = mode or ("mtp" if mtp else ((head.name if head else "draft-target") if draft else "none"))
    spec = get_mode(mode)
    if draft and not spec.needs_draft:
        raise UsageError(f"--draft is not used with mode {mode}: it takes no draft checkpoint")
    if spec.needs_draft and not draft:
        raise UsageError(f"mode {mode} needs --draft: its draft checkpoint ({spec.draft_role})")
    if head is not None and head is not spec:
        raise UsageError(f"--draft {wrong_draft(typed, head, mode)}: use --mode {head.name}")
    if backend is None:  # embedded models on trtspec's runner where it has the mode; else NVIDIA's first
        usable = [b for b in BACKENDS if spec.row(b).exists]
        on_torch = "torch" in usable and (target.startswith("embedded:") or usable == ["torch"])
        backend = "torch" if on_torch else next(b for b in usable if b != "torch")
    data = build_config_dict(name, target, draft, mode, backend, base_dir)  # type: ignore[arg-type]
    path = write_init_config(out, data, force)
    click.echo(f"wrote {path} (mode {mode}, backend {backend}); next: trtspec validate {path}")
    if guessed and resolve_checkpoint(draft, base_dir) is None:  # a hub id: nothing here says what it is
        click.echo(f"--draft {typed} is a hub id, not read here: for heads pass --mode {HEAD_MODE_NAMES}")


def _from_config(ref: str, config_dir: Path) -> str:
    """A checkpoint path typed relative to the current directory, as the config reads it: relative to its own
    folder. Embedded names, absolute paths and hub ids (org/name with no such folder here) stay as typed."""
    here = Path(ref).expanduser()
    if ref.startswith("embedded:") or here.is_absolute() or not (here.exists() or ref.startswith(("./", "../"))):
        return ref
    relative = os.path.relpath(os.path.abspath(here), config_dir)  # a symlink stays the link the user named
    return relative if relative.startswith("..") else f"./{relative}"


@cli.command()
@config_argument
@click.option("--json", "as_json", is_flag=True, help="Print the resolved config as JSON.")
def validate(config: Path, as_json: bool) -> None:
    """Load a deployment config and apply every field and cross-field rule."""
    from trtspec.config import load_config

    cfg = load_config(config)
    resolved = cfg.model_dump(mode="json")
    for field in ("target", "draft"):
        section = getattr(cfg, field)
        if section is not None:
            local = cfg.checkpoint_path(section)
            resolved[field]["resolved_path"] = str(local) if local else None
    if as_json:
        _print_json(resolved)
        return
    spec = get_mode(cfg.mode)
    k = spec.fixed_draft_len(cfg) or cfg.speculation.num_draft_tokens
    click.echo(
        f"{config}: ok: {cfg.name}: mode {cfg.mode}, backend {cfg.build.backend}, "
        f"flavour {cfg.serve.flavour}, {spec.drafts_label(cfg, k)}"
    )


@cli.command()
@config_argument
@click.option("--json", "as_json", is_flag=True, help="Print findings and facts as JSON.")
def check(config: Path, as_json: bool) -> None:
    """Find every known pitfall of the pair from metadata, before the build (exit 1 on an error)."""
    from trtspec.check import run_check
    from trtspec.config import load_config

    report = run_check(load_config(config))
    if as_json:
        _print_json(report.as_dict())
    else:
        table = Table(title=f"trtspec check {config}")
        for col in ("severity", "finding", "fix"):
            table.add_column(col, overflow="fold")
        styles = {"error": "red", "warning": "yellow", "info": "dim"}
        for f in report.findings:
            table.add_row(f"[{styles[f.severity]}]{f.severity}[/]", f"{f.message} [dim]({f.code})[/]", f.fix)
        if report.findings:
            console.print(table)
        mem = report.facts.get("memory")
        if mem:
            console.print(
                f"memory per GPU: weights {mem['weights_gb_per_gpu']} GB, KV at full batch "
                f"{mem['kv_needed_gb_per_gpu']} GB, KV budget {mem['kv_budget_gb_per_gpu']} GB"
            )
        errors = sum(f.severity == "error" for f in report.findings)
        console.print(
            f"{'FAILED' if errors else 'ok'}: {errors} error(s), "
            f"{sum(f.severity == 'warning' for f in report.findings)} warning(s)"
        )
    if not report.ok:
        raise SystemExit(1)


@cli.command()
@config_argument
@click.option(
    "--prompts",
    "prompts_file",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="JSONL (Spec-Bench rows or prompt/text fields) or text, one prompt per line "
    "(default: the built-in set of 12 prompts in 3 categories, matched to the embedded pair).",
)
@click.option("--max-tokens", type=click.IntRange(8), default=96, help="Tokens generated per prompt.")
@click.option("--limit", type=click.IntRange(1), default=None, help="Use the first N prompts.")
@click.option("--per-category", type=click.IntRange(1), default=None, help="Use the first N prompts of each category.")
@click.option(
    "--gpu",
    type=click.Choice(["a100", "h100", "h200", "b200"]),
    default=None,
    help="GPU to estimate costs for (non-torch backends; default from build.gpu_memory_gb).",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="Directory for plan.json and plan.png (default engines/NAME).",
)
@click.option(
    "--methods",
    "only",
    default=None,
    help="Comma-separated modes to compare on backend torch (default: every one the pair supports).",
)
@click.option("--json", "as_json", is_flag=True, help="Print plan.json.")
def plan(
    config: Path,
    prompts_file: Path | None,
    max_tokens: int,
    limit: int | None,
    per_category: int | None,
    gpu: str | None,
    out: Path | None,
    only: str | None,
    as_json: bool,
) -> None:
    """Measure acceptance on your prompts, choose num_draft_tokens, predict speedup per batch size."""
    from trtspec.config import load_config
    from trtspec.fsutil import atomic_write_text
    from trtspec.plan import run_plan, write_plot
    from trtspec.prompts import BUILTIN_PROMPTS, load_prompts

    cfg = load_config(config)
    prompts = load_prompts(prompts_file or BUILTIN_PROMPTS, limit=limit, per_category=per_category)
    methods = [m.strip() for m in only.split(",") if m.strip()] if only is not None else None
    result = run_plan(cfg, prompts, max_tokens, gpu, methods=methods)
    out = out or Path(cfg.build.output_dir) / cfg.name
    atomic_write_text(out / "plan.json", json.dumps(result, indent=2))
    write_plot(result, out / "plan.png")
    if as_json:
        _print_json(result)
        return
    table = Table(title=f"trtspec plan: {cfg.name} ({result['costs']['where']})")
    table.add_column("batch")
    table.add_column("best K")
    table.add_column("speedup at best K")
    table.add_column(f"speedup at K={result['recommended_num_draft_tokens']}")
    for b, best in result["best_by_batch"].items():
        at_rec = result["predicted_speedup"][b][str(result["recommended_num_draft_tokens"])]
        table.add_row(b, str(best["k"]), f"{best['speedup']:.2f}x", f"{at_rec:.2f}x")
    console.print(table)
    rates = ", ".join(f"{r:.2f}" for r in result["acceptance_per_position"])
    console.print(f"acceptance per position: {rates}; c = {result['costs']['c']:.3f}")
    for cat, row in sorted(result["by_category"].items()):
        console.print(f"  {cat:16s} acceptance {row['acceptance_rate']:.2f}, tokens/step {row['tokens_per_step']:.2f}")
    stop = result["stops_paying_at_batch"]
    console.print(
        f"recommended num_draft_tokens: {result['recommended_num_draft_tokens']} "
        f"(predicted {result['predicted_speedup_batch1']:.2f}x at batch 1); "
        + (
            f"speculation stops paying at batch {stop}"
            if stop
            else f"pays at every batch size up to {cfg.build.max_batch_size}"
        )
    )
    if result.get("methods"):
        methods = Table(title="methods on these prompts (torch runner; speedup predicted per batch size)")
        methods.add_column("method")
        methods.add_column("run")  # the leaders' figures come from later runs than the rest's
        methods.add_column("tokens/pass")
        for b in result["best_by_batch"]:
            methods.add_column(f"batch {b}")
        for row in sorted(result["methods"]["rows"], key=lambda r: -r["predicted_speedup"]["1"]):
            speedups = [f"{row['predicted_speedup'][b]:.2f}x" for b in result["best_by_batch"]]
            run = "3rd" if "chosen_at" in row else "2nd" if row.get("confirmed") else "1st"
            methods.add_row(row["method"], run, f"{row['tokens_per_step']:.2f}", *speedups)
        console.print(methods)
        if chose := result["methods"]["chosen"].get("self-draft"):
            rates = ", ".join(f"{a:.2f}" for a in chose["acceptance_by_layers"])
            console.print(f"self-draft: acceptance of the first 1, 2, ... layers {rates}; ran {len(chose['layers'])}")
        best = result["recommended_method"]
        se = best.get("relative_se")
        spread = f" +/- {100 * se:.1f}% from the prompts' spread" if se is not None else ""
        console.print(
            f"recommended method: {best['method']} (predicted {best['predicted_speedup']['1']:.2f}x at batch 1{spread})"
        )
    console.print(f"wrote {out / 'plan.json'} and {out / 'plan.png'}")


@cli.command()
@config_argument
@click.option("--prompt", required=True, help="Prompt text.")
@click.option(
    "--mode",
    type=click.Choice(RUNNER_MODES),
    default=None,
    help="Drafter to use (default: the config's speculation.mode).",
)
@click.option("--max-tokens", type=click.IntRange(1), default=None, help="Output tokens (default: config).")
@click.option("--temperature", type=click.FloatRange(0), default=None, help="0 is greedy (default: config).")
@click.option("--top-k", type=click.IntRange(0), default=None)
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=None)
@click.option("--seed", type=click.IntRange(-(2**63), 2**64 - 1), default=None)
@click.option("--num-draft-tokens", type=click.IntRange(1, 16), default=None, help="K (default: config).")
@click.option("--tree", default=None, help="Verify a token tree DEPTHxWIDTH, e.g. 4x3 (default: speculation.tree).")
@click.option("--ignore-eos", is_flag=True, help="Do not stop at the end-of-sequence token.")
@click.option("--json", "as_json", is_flag=True, help="Print text, tokens and stats as JSON.")
def generate(
    config: Path,
    prompt: str,
    mode: str | None,
    max_tokens: int | None,
    temperature: float | None,
    top_k: int | None,
    top_p: float | None,
    seed: int | None,
    num_draft_tokens: int | None,
    tree: str | None,
    ignore_eos: bool,
    as_json: bool,
) -> None:
    """Generate in-process with the torch runner and report acceptance and speed."""
    from trtspec.config import load_config
    from trtspec.generate import GenerateRequest, generate_text

    cfg = load_config(config)
    req = GenerateRequest(
        prompt, mode, max_tokens, temperature, top_k, top_p, seed, num_draft_tokens, tree=tree, ignore_eos=ignore_eos
    )
    if as_json:
        _print_json(generate_text(cfg, req))
        return
    shown = []  # the prompt is echoed with the first text, so a refused request prints only its error

    def show(text: str) -> None:
        if not shown:
            click.echo(prompt, nl=False)
            shown.append(True)
        click.echo(text, nl=False)

    result = generate_text(cfg, req, on_text=show)
    if not shown:
        click.echo(prompt, nl=False)
    s = result["stats"]
    click.echo()
    click.echo(
        f"[{result['mode']}, {'tree ' + result['tree'] if result['tree'] else 'K=' + str(result['num_draft_tokens'])}] "
        f"{s['output_tokens']} tokens in {s['steps']} steps, "
        f"acceptance {s['acceptance_rate']:.2f}, {s['tokens_per_step']:.2f} tokens/step, "
        f"{s['tokens_per_s']:.1f} tokens/s (draft {s['draft_s'] * 1000:.0f} ms, verify {s['verify_s'] * 1000:.0f} ms)",
        err=True,
    )


@cli.command()
@config_argument
@click.option(
    "--emit-script",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the build as a shell script for the TensorRT-LLM container instead of running it.",
)
@click.option("--dry-run", is_flag=True, help="Print the steps and commands; build nothing.")
@click.option(
    "--force", is_flag=True, help="Rebuild every step even if its inputs are unchanged; with --emit-script: overwrite."
)
@click.option("--no-package", is_flag=True, help="Stop after the engines: no model repository.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@click.option("--wait", is_flag=True, help="If another build holds these engines, wait for it instead of refusing.")
def build(
    config: Path, emit_script: Path | None, dry_run: bool, force: bool, no_package: bool, as_json: bool, wait: bool
) -> None:
    """Build engines (compiled, LLM API or torch) into engines/NAME, resumably, with a manifest."""
    from trtspec.build.builder import describe_plan, run_build
    from trtspec.config import load_config

    cfg = load_config(config)
    if cfg.build.backend == "torch" and emit_script is not None:
        raise UsageError("--emit-script is for backends tensorrt and pytorch; the torch backend builds here")
    if dry_run and emit_script is not None:
        raise UsageError("--dry-run writes nothing and --emit-script writes a script (and the repository): choose one")
    if emit_script is not None:
        from trtspec.build.script import write_script

        write_script(cfg, emit_script, force)
        click.echo(f"wrote {emit_script}: run it inside the TensorRT-LLM container it names")
        if not no_package:  # the container's repository needs no engines here, only their mount paths
            click.echo(f"wrote {_package(cfg)}")
        return
    if dry_run:
        click.echo("\n".join(describe_plan(cfg)))
        return
    err = Console(stderr=True, soft_wrap=True)
    result = run_build(cfg, force=force, progress=lambda msg: err.print(f"[dim]build[/dim] {msg}"), wait=wait)
    summary = {
        "engine_dir": str(result.engine_dir),
        "built": result.built,
        "up_to_date": result.skipped,
        "num_draft_tokens": result.num_draft_tokens,
        "repository": None if no_package else str(_package(cfg)),
    }
    if as_json:
        _print_json(summary)
        return
    if not result.built:
        click.echo(f"nothing to do: {result.engine_dir} is up to date ({', '.join(result.skipped)})")
    else:
        click.echo(f"built {', '.join(result.built)} in {result.engine_dir}")
    if summary["repository"]:
        click.echo(f"wrote {summary['repository']}")


def _package(cfg, nvidia_models: str | None = None):
    from trtspec.repository.package import CONTAINER_MODELS, package_repository

    return package_repository(cfg, nvidia_models=nvidia_models or CONTAINER_MODELS)


@cli.command()
@config_argument
@click.option(
    "--nvidia-models",
    default=None,
    help="Where the serving image has NVIDIA's all_models (backends tensorrt and pytorch; default /app/all_models).",
)
def package(config: Path, nvidia_models: str | None) -> None:
    """Write the Triton model repository for a config into model_repository/NAME (build runs it too)."""
    from trtspec.config import load_config

    click.echo(f"wrote {_package(load_config(config), nvidia_models)}")


@cli.command()
@click.argument("target", type=click.Path(path_type=Path))
@click.option("--http-port", type=click.IntRange(1, 65535), default=None, help="Default: the config's, else 8000.")
@click.option("--grpc-port", type=click.IntRange(1, 65535), default=None)
@click.option("--metrics-port", type=click.IntRange(1, 65535), default=None)
@click.option("--timeout", type=click.FloatRange(1), default=300.0, help="Seconds to wait for the models to load.")
@click.option("--detach", is_flag=True, help="Return once ready, leaving the server running (see --stop).")
@click.option("--stop", "stop_", is_flag=True, help="Stop a server started with --detach.")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    envvar="TRTSPEC_SERVE_HOST",
    help="Address the HTTP, gRPC and metrics ports bind: loopback only by default, 0.0.0.0 for all interfaces "
    "(also $TRTSPEC_SERVE_HOST, which the images set).",
)
def serve(
    target: Path,
    http_port: int | None,
    grpc_port: int | None,
    metrics_port: int | None,
    timeout: float,
    detach: bool,
    stop_: bool,
    host: str,
) -> None:
    """Run a real tritonserver on a config's repository (or a repository directory) until Ctrl-C."""
    from trtspec.serve.run import serve_forever, stop_detached

    if stop_:
        click.echo(stop_detached(target))
        return
    serve_forever(target, (http_port, grpc_port, metrics_port), timeout, detach, echo=click.echo, host=host)


@cli.command()
@click.argument("target")
@click.option("--compare", "baseline", help="A second target (the baseline) run on the same prompts and schedule.")
@click.option(
    "--protocol",
    type=click.Choice(["triton-grpc", "triton-http"]),
    default="triton-grpc",
    help="How to reach a config's server (URL targets name their own).",
)
@click.option("--host", default="localhost", help="Host of a config's server.")
@click.option("--concurrency", help="Closed-loop levels, e.g. 1,2,4 (default 1).")
@click.option("--rate", help="Open-loop request rates per second, e.g. 1,2,4 (inf: all at once).")
@click.option("--arrival", type=click.Choice(["poisson", "gamma", "constant"]), default="poisson")
@click.option("--burstiness", type=click.FloatRange(min=0, min_open=True), default=1.0, help="Gamma shape.")
@click.option("--max-concurrency", type=click.IntRange(1), help="Cap on in-flight requests at a --rate level.")
@click.option("--num-requests", type=click.IntRange(1), help="Requests per level (default 32 unless --duration).")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), help="Seconds per level instead.")
@click.option("--warmup", type=click.IntRange(0), default=2, help="Requests per target before measuring.")
@click.option("--dataset", default="synthetic", help="synthetic, or a JSONL (Spec-Bench or prompt rows) / text file.")
@click.option("--per-category", type=click.IntRange(1), help="Prompts kept per category of a JSONL dataset.")
@click.option("--input-len", type=click.IntRange(1), default=128, help="Synthetic input tokens (mean).")
@click.option("--input-std", type=click.FloatRange(0), default=0.0)
@click.option("--output-len", type=click.IntRange(1), default=64, help="Output tokens (mean) for synthetic prompts.")
@click.option("--output-std", type=click.FloatRange(0), default=0.0)
@click.option(
    "--corpus", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="Text for synthetic prompts."
)
@click.option("--max-tokens", type=click.IntRange(1), default=64, help="Output tokens for file prompts.")
@click.option("--fixed-length/--natural-length", default=True, help="Ask for exactly the output length (min_tokens).")
@click.option("--temperature", type=click.FloatRange(0), default=0.0)
@click.option("--seed", type=click.IntRange(-(2**63), 2**64 - 1), default=0)
@click.option("--tokenizer", help="Tokenizer to count tokens with (default: a config's target checkpoint).")
@click.option("--extra", multiple=True, help="name=value input sent with every request to the target.")
@click.option("--compare-extra", multiple=True, help="name=value input sent with every request to the baseline.")
@click.option("--slo", help="Per-request limits in ms, e.g. ttft=200,tpot=50,e2e=2000 (goodput).")
@click.option("--slo-attainment", type=click.FloatRange(0, 1), default=0.95, help="Fraction that must meet --slo.")
@click.option("--fail-on-slo", is_flag=True, help="Exit 1 when a level misses --slo-attainment.")
@click.option(
    "--verify-lossless",
    is_flag=True,
    help="Check the target against --compare: greedy, then sampled per prefix.",
)
@click.option("--lossless-samples", type=click.IntRange(20), default=1000, help="Samples per side per context.")
@click.option("--lossless-contexts", type=click.IntRange(1), default=1, help="Contexts the sampled check runs on.")
@click.option("--lossless-tokens", type=click.IntRange(2, 16), default=4, help="Tokens sampled (K + 2 reach a bonus).")
@click.option(
    "--lossless-reference",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The target's trtspec config, loaded in-process: picks contexts and states power against planted bugs.",
)
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=300.0, help="Per request, seconds.")
@click.option(
    "--grace", type=click.FloatRange(0), default=30.0, help="Seconds in-flight requests get after --duration."
)
@click.option("--workers", default="1", help="Client processes, or auto (one per spare core, at most 4).")
@click.option("--server-metrics", help="The target server's Triton /metrics URL (default: a config's metrics port).")
@click.option("--compare-server-metrics", help="The baseline server's /metrics URL (default: a config's).")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="Results directory.")
@click.option("--json", "as_json", is_flag=True, help="Print summary.json instead of tables.")
def bench(**flags: Any) -> None:
    """Load-test a served deployment from the client side, optionally A/B against a baseline."""
    from trtspec.bench.cli_run import BenchArgs, bench_command

    code = bench_command(BenchArgs(**flags), console)
    if code:
        sys.exit(code)


@cli.command()
@config_argument
@click.option(
    "--target",
    "kind",
    type=click.Choice(["k8s", "docker"]),
    default="k8s",
    help="k8s: kustomize-ready manifests; docker: a compose setup for one host.",
)
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="Directory to write.")
@click.option("--force", is_flag=True, help="Replace a non-empty --out.")
@click.option(
    "--check", "check_only", is_flag=True, help="Write nothing: say whether the manifests can come up on a cluster."
)
def deploy(config: Path, kind: str, out: Path | None, force: bool, check_only: bool) -> None:
    """Write Kubernetes manifests (or a compose setup) that build and serve a config's repository."""
    from trtspec.config import load_config
    from trtspec.deploy.topology import image_for, topology
    from trtspec.deploy.write import refuse_undeployable, write_deployment

    cfg = load_config(config)
    refuse_undeployable(cfg)
    if check_only or kind == "k8s":
        from trtspec.deploy import cluster_check, k8s

        findings = cluster_check.check(cfg, k8s.render(cfg))
        errors = [f.what for f in findings if f.level == "error"]
        if check_only:
            for f in findings:
                click.echo(f"{f.level}: {f.what}")
            sys.exit(1 if errors else 0)
        if errors:  # manifests that would not come up are not written
            more = f" (and {len(errors) - 1} more: trtspec deploy --check)" if len(errors) > 1 else ""
            raise UsageError(errors[0] + more)
    if out is None:
        raise UsageError("--out is required (or --check, which writes nothing)")
    written = write_deployment(cfg, kind, out, force)  # type: ignore[arg-type]
    topo = topology(cfg)
    shape = (
        "CPU"
        if topo.cpu_only
        else f"{topo.pods_per_replica} pod(s) x {topo.gpus_per_pod} GPU(s), {topo.mpi_ranks} rank(s) per replica"
    )
    click.echo(f"wrote {len(written)} files to {out} ({shape}; image {image_for(cfg)})")
    if kind == "k8s":
        from trtspec.deploy.k8s import local_checkpoints

        for moved in local_checkpoints(cfg).values():  # the pods read them there; the compose setup mounts them
            for local, inside in moved.items():
                click.echo(f"  copy:  {local} onto the volume as {inside}")
        click.echo(f"  apply: kubectl apply -k {out}")
    else:
        click.echo(f"  run:   docker compose -f {shlex.quote(str(out / 'compose.yaml'))} up --build")


@cli.command("export-self-draft")
@config_argument
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder for the cut checkpoint (default: self-draft/NAME beside the config).",
)
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default=None,
    help="Backend the draft-target config builds on (default: the config's), served by its default flavour.",
)
@click.option("--force", is_flag=True, help="Replace an existing checkpoint folder or config.")
def export_self_draft(config: Path, out: Path | None, backend: str | None, force: bool) -> None:
    """Write a self-draft config as the draft-target config that builds and serves it (the target cut to its layers)."""
    from trtspec.checkpoints.self_draft import export_self_draft as export

    checkpoint, written = export(config, out, force, backend)
    if checkpoint is not None:
        click.echo(f"wrote the draft checkpoint to {checkpoint}")
    click.echo(f"wrote {written} (mode draft-target)")
    click.echo(f"  next: trtspec check {written}")


def _demo_methods(value: str | None) -> tuple[str, ...]:
    """The demo's --methods: the methods it has an embedded setup for (None: its default); any other is refused
    saying why."""
    from trtspec.demo import DEFAULT_METHODS, SPECULATIVE

    if value is None:
        return DEFAULT_METHODS
    names = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    for name in names:
        if name in SPECULATIVE:
            continue
        mode = REGISTRY.get(name)
        # a mode the torch engine lacks says so in its own words (the base rule reads no config)
        why = mode.torch_deploy_refusal(None) if mode and not mode.torch_deploys else None
        why = why or ("none: the baseline always runs" if name == "none" else None)
        why = why or f"{name}: not a mode the demo has an embedded setup for"
        raise click.BadParameter(f"{why}; the demo serves {', '.join(SPECULATIVE)}")
    if not names:
        raise click.BadParameter(f"name at least one of {', '.join(SPECULATIVE)}")
    return names


@cli.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("trtspec-demo"))
@click.option("--requests", type=click.IntRange(2), default=32, help="Requests per load level and target.")
@click.option("--lossless-samples", type=click.IntRange(20), help="Samples per side per context (default: enough).")
@click.option(
    "--methods",
    callback=lambda _ctx, _param, value: _demo_methods(value),
    help="Methods to serve and bench against the baseline, comma-separated: speculative modes, "
    "draft-target-cascade and self-draft (default: draft-target,mtp).",
)
def demo(out: Path, requests: int, lossless_samples: int | None, methods: tuple[str, ...]) -> None:
    """Build, serve and A/B-bench the embedded pair (by default baseline, draft-target, MTP) with the lossless check."""
    from trtspec.bench.tables import for_output
    from trtspec.demo import LOSSLESS, run_demo

    code = run_demo(out, for_output(console), requests, lossless_samples or LOSSLESS["samples"], methods)
    if code:
        sys.exit(code)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def doctor(as_json: bool) -> None:
    """Report what this machine can build and serve, and why not."""
    from trtspec.doctor import diagnose

    report = diagnose()
    if as_json:
        _print_json(report)
        return
    t = report["torch"]
    trt = report["tensorrt_llm"]
    facts = Table(show_header=False, box=None)
    facts.add_row("python", report["python"])
    facts.add_row("torch", f"{t['version']} (CUDA {'yes' if t['cuda_available'] else 'no'})")
    facts.add_row("transformers", str(report["transformers"]))
    facts.add_row("tritonclient", str(report["tritonclient"]))
    facts.add_row("tensorrt_llm", trt["version"] if trt["imports"] else f"no ({trt['error']})")
    facts.add_row("trtllm-build", str(report["trtllm_build"] or "not found"))
    gpus = ", ".join(f"{g['name']} {g['memory_gib']} GiB sm{g['compute_capability']}" for g in report["gpus"])
    facts.add_row("GPUs", gpus or "none")
    ts = report["tritonserver"]
    facts.add_row("tritonserver", f"{ts['binary']} ({ts['source']})" if ts else "not found")
    facts.add_row("docker", str(report["docker"] or "not found"))
    facts.add_row("kubectl", str(report["kubectl"] or "not found"))
    console.print(facts)
    caps = Table(title="what this machine can do")
    for col in ("backend", "build", "serve", "flavours", "why not"):
        caps.add_column(col)
    for backend, c in report["capabilities"].items():
        caps.add_row(
            backend,
            "yes" if c["build"] else "no",
            "yes" if c["serve"] else "no",
            ", ".join(c["flavours"]) or "-",
            "; ".join(c["why_not"]) or "-",
        )
    console.print(caps)


def main() -> None:
    cli(prog_name="trtspec")


if __name__ == "__main__":
    sys.exit(main())
