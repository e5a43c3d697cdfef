"""`trtspec plan`: prompt formats, the prediction from acceptance and costs, the GPU roofline, and a
run on the embedded pair that writes plan.json and plan.png."""

from __future__ import annotations

import itertools
import json
import statistics

import pytest
from conftest import CONFIGS
from test_check import DEEPSEEK_R1, LLAMA_1B, LLAMA_70B, _published, config

from trtspec.cli import cli
from trtspec.config import validate_config
from trtspec.errors import UsageError
from trtspec.methods import CHAIN_KS, ESTIMATE_PAIRS, TREES, PromptsRun, paired_speedups
from trtspec.plan import batch_sizes, gpu_costs, predict
from trtspec.prompts import BUILTIN_PROMPTS, load_prompts
from trtspec.speculative.requests import RequestStats


def test_prompt_formats(tmp_path):
    # Spec-Bench's rows (question_id, category, turns): the first turn is the prompt
    spec_rows = tmp_path / "question.jsonl"
    spec_rows.write_text(
        "".join(
            json.dumps({"question_id": i, "category": c, "turns": [f"{c} question {i}", "a second turn"]}) + "\n"
            for i, c in enumerate(["writing", "writing", "writing", "math", "math", "rag"])
        )
    )
    spec = load_prompts(spec_rows, per_category=2)
    assert [(p.id, p.category, p.text) for p in spec][:3] == [
        ("0", "writing", "writing question 0"),
        ("1", "writing", "writing question 1"),
        ("3", "math", "math question 3"),
    ]
    assert len(spec) == 5 and len({p.category for p in spec}) == 3
    builtin = load_prompts(BUILTIN_PROMPTS, per_category=2)
    assert len(builtin) == 6 and len({p.category for p in builtin}) == 3
    rows = tmp_path / "p.jsonl"
    rows.write_text('{"prompt": "hello"}\n\n{"text": "world", "category": "qa"}\n')
    assert [(p.text, p.category) for p in load_prompts(rows)] == [("hello", "all"), ("world", "qa")]
    text = tmp_path / "p.txt"
    text.write_text("first line\nsecond\\nline\n")
    assert [p.text for p in load_prompts(text)] == ["first line", "second\nline"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"nope": 1}\n')
    with pytest.raises(UsageError, match=r"bad.jsonl:2: no prompt text"):
        load_prompts(bad)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"prompt": \n')
    with pytest.raises(UsageError, match="invalid JSON"):
        load_prompts(broken)


def test_prediction_from_known_costs():
    # plain step 10 ms; a draft token 1 ms; verifying K+1 tokens 10 + K ms
    costs = {
        "by_batch": {
            1: {"plain_s": 0.010, "step_s": {k: 0.001 * k + 0.010 + 0.001 * k for k in (1, 2, 3)}},
            8: {"plain_s": 0.010, "step_s": {k: 0.004 * k + 0.010 * (k + 1) for k in (1, 2, 3)}},
        }
    }
    rates = [0.8, 0.5, 0.5]
    out = predict(rates, costs)
    # K=2 at batch 1: tokens 1 + 0.8 + 0.4 = 2.2, cost 2 x 1 + 12 = 14 ms -> 2.2 x 10 / 14
    assert out["speedup"][1][2] == pytest.approx(2.2 * 10 / 14)
    assert out["best"][1]["k"] == 2
    # at batch 8 verification is compute-bound: every K loses
    assert out["best"][8]["speedup"] < 1 and out["stops_paying_at_batch"] == 8


def test_a_prompt_run_sums_requests_and_keeps_the_prefill_apart():
    """plan and the methods benchmark read the same sums: tokens after each prefill's first, the loop's seconds
    without the prefill, per-position counts over chains of different lengths."""
    run = PromptsRun()
    a = RequestStats(steps=3, prefill_s=0.5, draft_s=0.25, verify_s=1.0, draft_tokens=6, accepted_tokens=4)
    a.drafted_per_position, a.accepted_per_position = [3, 3], [3, 1]
    b = RequestStats(steps=2, prefill_s=0.25, draft_s=0.5, verify_s=0.5, draft_tokens=6, accepted_tokens=2)
    b.drafted_per_position, b.accepted_per_position = [2, 2, 2], [1, 1, 0]
    run.add([7, 8, 9, 10, 11, 12, 13, 14], 2.0, a)
    run.add([1, 2, 3, 4, 5], 1.5, b)
    assert (run.tokens, run.steps, run.draft_tokens, run.accepted_tokens) == (7 + 4, 5, 12, 6)
    assert run.loop_s == pytest.approx(3.5 - 0.75) and (run.draft_s, run.verify_s) == (0.75, 1.5)
    assert (run.drafted, run.accepted) == ([5, 5, 2], [4, 2, 0]) and run.outputs[1] == [1, 2, 3, 4, 5]
    # tokens/step's spread over the prompts: 7/3 and 4/2 around 11/5, residuals +-0.4, so sqrt(0.32 x 2) / 5 / 2.2
    assert run.tokens_per_step_se == pytest.approx(0.8 / 5 / 2.2)
    one = PromptsRun()
    one.add([1, 2, 3], 1.0, RequestStats(steps=2))
    assert one.tokens_per_step_se is None  # no spread from one prompt
    one.add([4, 5, 6, 7, 8], 1.0, RequestStats(steps=4))
    assert one.tokens_per_step_se == 0.0  # both at one token a step


def test_paired_speedups_alternate_the_order_and_take_each_pair_alone():
    """A drift that slows the host with every run costs whichever side runs second: alternating the order keeps
    an even count's median on the true ratio (2x here), where running plain first every time would read it low;
    an odd count's median keeps one pair's bias."""
    calls: list[str] = []

    def rate(name: str, speed: float):
        def run() -> float:
            calls.append(name)
            return speed / (1 + 0.1 * len(calls))  # each run 10% slower than the one before

        return run

    ratios = paired_speedups(rate("plain", 100.0), rate("spec", 200.0), 4)
    assert calls == ["plain", "spec", "spec", "plain"] * 2
    assert ratios == pytest.approx([2 * 1.1 / 1.2, 2 * 1.4 / 1.3, 2 * 1.5 / 1.6, 2 * 1.8 / 1.7])
    assert ratios[0] < 2 < ratios[1] and ratios[2] < 2 < ratios[3]  # the drift cuts both ways in turn
    assert statistics.median(ratios) == pytest.approx(2, rel=0.01)  # and cancels in an even count's median
    calls.clear()
    odd = paired_speedups(rate("plain", 100.0), rate("spec", 200.0), 3)
    assert statistics.median(odd) == odd[2] < 2  # an odd count's median is a plain-first pair's: one run's drift
    with pytest.raises(ValueError, match="at least 1"):
        paired_speedups(rate("plain", 1.0), rate("spec", 1.0), 0)


def test_batch_sizes():
    assert batch_sizes(1) == [1] and batch_sizes(16) == [1, 2, 4, 8, 16] and batch_sizes(12) == [1, 2, 4, 8, 12]


def test_gpu_roofline_for_published_pairs(tmp_path):
    data = config(
        tmp_path,
        _published(tmp_path, "70b", LLAMA_70B),
        _published(tmp_path, "1b", LLAMA_1B),
        build={"gpu_memory_gb": 141, "max_batch_size": 64},
    )
    data["target"]["quantization"] = "fp8"
    costs = gpu_costs(validate_config(data), "h200", 4, [1, 64], context=1024)
    # c is the ratio of bytes read per step: 2.47 GB of BF16 draft against 70.6 GB of FP8 target, plus KV
    assert 0.03 < costs["c"] < 0.05
    # at batch 1 verifying 5 tokens costs the same memory traffic as 1
    assert costs["by_batch"][1]["verify_s"][4] == pytest.approx(costs["by_batch"][1]["plain_s"])
    assert costs["by_batch"][1]["step_s"][4] == pytest.approx(
        4 * costs["by_batch"][1]["draft_s"] + costs["by_batch"][1]["plain_s"]
    )
    ds = config(
        tmp_path,
        _published(tmp_path, "r1", DEEPSEEK_R1),
        speculation={"mode": "mtp"},
        build={"backend": "pytorch", "tp": 8, "gpu_memory_gb": 141},
        serve={"flavour": "llmapi", "streaming": True},
    )
    ds_costs = gpu_costs(validate_config(ds), "h200", 3, [1], context=1024)
    assert 0.01 < ds_costs["c"] < 0.05  # one MTP layer against 61 trunk layers


@pytest.mark.slow
def test_plan_on_the_embedded_pair_writes_plan_and_plot(runner, tmp_path):
    res = runner.invoke(
        cli,
        [
            "plan",
            str(CONFIGS / "tiny-draft-target.yaml"),
            "--per-category",
            "1",
            "--max-tokens",
            "24",
            "--out",
            str(tmp_path),
            "--methods",
            "draft-target,self-draft",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan == json.loads(res.output)
    assert 1 <= plan["recommended_num_draft_tokens"] <= 8
    assert len(plan["acceptance_per_position"]) >= 1 and all(0 <= r <= 1 for r in plan["acceptance_per_position"])
    # no --prompts: the built-in set, one prompt of each of its three categories
    assert (
        set(plan["by_category"])
        == {p.category for p in load_prompts(BUILTIN_PROMPTS)}
        == {
            "tragedy",
            "history",
            "comedy",
        }
    )
    assert set(plan["best_by_batch"]) == {"1", "2", "4"}
    assert (tmp_path / "plan.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the methods asked for, measured: the configured draft model, and the target drafting for itself with the
    # prefix of its layers chosen by measured acceptance and cost, and with its int8 copy (longer chains only)
    rows = {r["method"]: r for r in plan["methods"]["rows"]}
    chose = plan["methods"]["chosen"]["self-draft"]
    assert len(chose["acceptance_by_layers"]) == len(chose["cost_by_layers"]) == 5  # the target's 6 layers less one
    assert all(0 <= a <= 1 for a in chose["acceptance_by_layers"]) and 1 <= len(chose["layers"]) <= 5
    prefix = f"self-draft layer {chose['layers'][0]}" if len(chose["layers"]) == 1 else None
    prefix = prefix or f"self-draft layers 0-{chose['layers'][-1]}"
    assert {"draft-target K=1", "draft-target tree 3x3", f"{prefix} K=2", f"{prefix} tree 2x2"} <= set(rows)
    assert {"self-draft int8 K=2", "self-draft int8 K=8", "draft-target cascade ngram K=3"} <= set(rows)
    assert not any(("int8" in label or "cascade" in label) and r["tree"] for label, r in rows.items())
    assert {r["mode"] for r in rows.values()} == {"draft-target", "self-draft"}
    assert all(1.0 <= r["tokens_per_step"] <= 1 + (4 if r["tree"] else r["k"]) for r in rows.values())
    assert all(set(r["predicted_speedup"]) == {"1", "2", "4"} for r in rows.values())
    # each prediction carries tokens/step's standard error over the three prompts (none equal: some spread)
    assert all(0 <= r["relative_se"] < 1 for r in rows.values()) and any(r["relative_se"] > 0 for r in rows.values())
    # the leaders are measured again; the best of that second round runs a third time (a run that chose nothing),
    # and so does the next leader while a third run falls below what it was chosen at; plan predicts from the best
    # third run
    confirmed = [r for r in rows.values() if r.get("confirmed")]
    assert len(confirmed) == 3
    estimated = sorted((r for r in confirmed if "chosen_at" in r), key=lambda r: -r["chosen_at"])
    assert estimated[0]["chosen_at"] == max(r.get("chosen_at", r["predicted_speedup"]["1"]) for r in confirmed)
    assert plan["recommended_method"] in estimated
    best = plan["recommended_method"]["predicted_speedup"]["1"]
    assert best == max(r["predicted_speedup"]["1"] for r in estimated)
    # the rest were left with their second runs because a third run in hand beat what they were chosen at
    assert all(r["predicted_speedup"]["1"] <= best for r in confirmed if r not in estimated)
    for before, after in itertools.pairwise(estimated):  # the next ran only after a third run fell short
        assert before["predicted_speedup"]["1"] < after["chosen_at"]
    # a third run is three plain/method pairs back to back; the median pair predicts, against its own baseline
    for r in estimated:
        assert len(r["pairs"]) == ESTIMATE_PAIRS
        assert r["predicted_speedup"]["1"] == pytest.approx(sorted(r["pairs"])[ESTIMATE_PAIRS // 2])
    assert not any("pairs" in r for r in rows.values() if r not in estimated)


def test_plan_refuses_baseline_and_hub_ids(runner, tmp_path):
    res = runner.invoke(
        cli,
        ["plan", str(CONFIGS / "tiny-baseline.yaml")],
    )
    assert res.exit_code == 2 and "nothing to plan" in res.stderr
    res = runner.invoke(
        cli,
        [
            "plan",
            str(CONFIGS / "llama-3.3-70b-1b-draft-h200.yaml"),
        ],
    )
    assert res.exit_code == 2 and "hub id" in res.stderr


def test_plan_compares_only_the_methods_asked_for_and_refuses_others(runner, tmp_path):
    res = runner.invoke(cli, ["plan", str(CONFIGS / "tiny-draft-target.yaml"), "--methods", "draft-target,eagle3"])
    assert res.exit_code == 2
    assert "--methods eagle3: this pair's methods are draft-target, ngram, lookahead, self-draft, mtp" in res.stderr
    assert "Traceback" not in res.output
    res = runner.invoke(cli, ["plan", str(CONFIGS / "tiny-draft-target.yaml"), "--methods", " , "])
    assert res.exit_code == 2 and "--methods (none)" in res.stderr


def test_plan_compares_the_shipped_eagle3_heads_chains_and_trees(runner, tmp_path):
    """An EAGLE-3 deployment: plan measures the head's chains and trees (its method rows) and recommends one."""
    config = {
        "name": "e3",
        "target": {"checkpoint": "embedded:tiny-target", "dtype": "float32"},
        "draft": {"checkpoint": "embedded:tiny-eagle3"},
        "eagle3": {"layers_to_capture": [1, 2, 4]},
        "speculation": {"mode": "eagle3", "num_draft_tokens": "auto"},
        "build": {"backend": "torch", "device": "cpu", "max_seq_len": 512, "max_input_len": 256},
    }
    path = tmp_path / "e3.yaml"
    path.write_text(json.dumps(config))
    args = ["plan", str(path), "--per-category", "1", "--max-tokens", "16", "--out", str(tmp_path / "p")]
    res = runner.invoke(cli, [*args, "--methods", "eagle3", "--json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.output)
    rows = {r["method"]: r for r in plan["methods"]["rows"]}
    assert set(rows) == {f"eagle3 K={k}" for k in CHAIN_KS} | {f"eagle3 tree {shape}" for shape in TREES}
    assert plan["recommended_method"]["mode"] == "eagle3"
    # the trained head is accepted far above chance on the first draft of a step
    assert plan["acceptance_per_position"][0] > 0.2
