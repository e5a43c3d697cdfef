"""Does speculation survive the server? Tokens/s at concurrency 1 through a real tritonserver
against the same runner in-process, for both flavours and every mode of the embedded pair.

For each (mode, flavour) the config is built and packaged with the CLI's own functions and served;
the same held-out prompts go through HTTP generate one at a time (greedy), and in-process through
the runner with the same K, tokenization and detokenization included on both sides. The served
text must equal the in-process text (so both produced the same tokens); targets: served tokens/s
within 10% of in-process, and the speculative speedup over the baseline kept through the server.

    python benchmarks/serving.py [--prompts 6] [--max-tokens 64] [--rounds 2] [--out results/serving.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml
from transformers import AutoTokenizer

from trtspec.build.builder import run_build
from trtspec.config import load_config
from trtspec.data import data_file
from trtspec.errors import run_script
from trtspec.fsutil import atomic_write_text
from trtspec.repository.package import package_repository
from trtspec.serve.server import Ports, free_ports, start_server, wait_ready
from trtspec.speculative.factory import load_runner
from trtspec.speculative.runner import GenerationParams

REPO = Path(__file__).resolve().parents[1]
MODES = {"none": "tiny-baseline.yaml", "draft-target": "tiny-draft-target.yaml", "mtp": "tiny-mtp.yaml"}
FLAVOURS = ("llmapi", "engine")


def held_out_prompts(count: int) -> list[str]:
    text = data_file("tinyshakespeare.txt").read_text()
    held = text[int(len(text) * 0.95) :]
    chunks = [c.strip() for c in held.split("\n\n") if len(c.strip()) > 200]
    step = max(1, len(chunks) // count)
    return [chunks[i * step][:400] for i in range(count)]


def config_for(mode: str, flavour: str, workdir: Path, name: str | None = None, overrides: dict | None = None):
    """The embedded pair's config for `mode` served by `flavour`, built and packaged under `workdir`;
    `overrides` updates its sections ({"build": {"max_batch_size": 16}, ...})."""
    data = yaml.safe_load((REPO / "configs" / MODES[mode]).read_text())
    data["name"] = name or f"{flavour}-{mode}"
    data["serve"].update(flavour=flavour, streaming=not (flavour == "engine" and mode == "draft-target"))
    if mode != "none":  # the configured K, as in-process runs it (adaptive K is benchmarks/batching.py's subject)
        data["speculation"]["policy"] = "fixed"
    for section, values in (overrides or {}).items():
        data.setdefault(section, {}).update(values)
    data["build"]["output_dir"] = str(workdir / "engines")
    data["serve"]["repository"] = str(workdir / "model_repository")
    path = workdir / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_config(path)


def request_body(cfg, prompt: str, max_tokens: int) -> tuple[str, dict]:
    k = int(cfg.speculation.num_draft_tokens) if cfg.mode != "none" else 0
    if cfg.serve.flavour == "llmapi":
        return "tensorrt_llm", {"text_input": prompt, "sampling_param_max_tokens": max_tokens}
    body = {"text_input": prompt, "max_tokens": max_tokens, "exclude_input_in_output": True}
    if cfg.mode == "draft-target":
        return "tensorrt_llm_bls", {**body, "num_draft_tokens": k}
    return "ensemble", body


def in_process(cfg, prompts: list[str], max_tokens: int) -> tuple[list[str], list[int], float]:
    target = cfg.checkpoint_path(cfg.target)
    draft = cfg.checkpoint_path(cfg.draft) if cfg.draft else None
    k = int(cfg.speculation.num_draft_tokens) if cfg.mode != "none" else 1
    runner = load_runner(target, cfg.mode, draft, num_draft_tokens=k, max_len=cfg.build.max_seq_len)
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    params = GenerationParams(max_tokens=max_tokens, stop_token_ids=frozenset({tokenizer.eos_token_id}))
    runner.generate([tokenizer(prompts[0]).input_ids], GenerationParams(max_tokens=4))  # warm-up
    texts, counts, seconds = [], [], 0.0
    for prompt in prompts:
        t0 = time.perf_counter()
        out = runner.generate([tokenizer(prompt).input_ids], params)[0]
        texts.append(tokenizer.decode(out.tokens, skip_special_tokens=True))
        seconds += time.perf_counter() - t0
        counts.append(len([t for t in out.tokens if t != tokenizer.eos_token_id]))
    return texts, counts, seconds


def served(cfg, prompts: list[str], max_tokens: int) -> tuple[list[str], float]:
    ports = Ports(*free_ports(3))
    repo = package_repository(cfg)
    server = start_server(repo, ports, repo.parent / f"{repo.name}.log")
    try:
        wait_ready(server, 300)
        model, _ = request_body(cfg, prompts[0], 4)

        def call(prompt: str, tokens: int) -> str:
            _, body = request_body(cfg, prompt, tokens)
            url = f"http://{server.http_url}/v2/models/{model}/generate"
            request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
            with urllib.request.urlopen(request, timeout=300) as response:
                answer = json.loads(response.read())
            if "error" in answer:
                raise RuntimeError(f"{cfg.name}: {answer['error']}")
            return answer["text_output"]

        call(prompts[0], 4)  # warm-up
        texts, seconds = [], 0.0
        for prompt in prompts:
            t0 = time.perf_counter()
            texts.append(call(prompt, max_tokens))
            seconds += time.perf_counter() - t0
        return texts, seconds
    finally:
        server.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2, help="best of N per side, interleaved")
    ap.add_argument("--out", type=Path, default=REPO / "results" / "serving.json")
    args = ap.parse_args()
    prompts = held_out_prompts(args.prompts)
    rows = []
    with tempfile.TemporaryDirectory(prefix="trtspec-serving-") as tmp:
        for flavour in FLAVOURS:
            for mode in MODES:
                cfg = config_for(mode, flavour, Path(tmp))
                run_build(cfg)
                best_local = best_served = 0.0
                for _ in range(args.rounds):
                    local_texts, counts, local_s = in_process(cfg, prompts, args.max_tokens)
                    served_texts, served_s = served(cfg, prompts, args.max_tokens)
                    best_local = max(best_local, sum(counts) / local_s)
                    best_served = max(best_served, sum(counts) / served_s)
                rows.append(
                    {
                        "flavour": flavour,
                        "mode": mode,
                        "num_draft_tokens": int(cfg.speculation.num_draft_tokens) if mode != "none" else 0,
                        "tokens": sum(counts),
                        "same_text": served_texts == local_texts,
                        "in_process_tokens_per_s": best_local,
                        "served_tokens_per_s": best_served,
                        "served_over_in_process": best_served / best_local,
                    }
                )
                atomic_write_text(args.out, json.dumps({"prompts": len(prompts), "rows": rows}, indent=2))
    base = {(r["flavour"], "local"): r["in_process_tokens_per_s"] for r in rows if r["mode"] == "none"}
    base |= {(r["flavour"], "served"): r["served_tokens_per_s"] for r in rows if r["mode"] == "none"}
    for r in rows:
        r["speedup_in_process"] = r["in_process_tokens_per_s"] / base[(r["flavour"], "local")]
        r["speedup_served"] = r["served_tokens_per_s"] / base[(r["flavour"], "served")]
    atomic_write_text(args.out, json.dumps({"prompts": len(prompts), "rows": rows}, indent=2))
    header = f"{'flavour':7s} {'mode':13s} {'in-proc t/s':>11s} {'served t/s':>10s} {'ratio':>6s}"
    print(f"{header} {'speedup local/served':>21s} same")
    for r in rows:
        print(
            f"{r['flavour']:7s} {r['mode']:13s} {r['in_process_tokens_per_s']:11.1f} {r['served_tokens_per_s']:10.1f}"
            f" {r['served_over_in_process']:6.2f} {r['speedup_in_process']:10.2f}x / {r['speedup_served']:.2f}x"
            f" {'yes' if r['same_text'] else 'NO'}"
        )
    print(f"wrote {args.out}")
    ok = all(r["same_text"] and r["served_over_in_process"] >= 0.9 for r in rows)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run_script(main))
