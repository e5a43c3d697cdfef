"""Lookahead decoding in the torch runner: Jacobi guesses, the n-gram pool built from their trajectory, and
greedy output identical to plain decoding (its lossless sampling is in test_lossless)."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import make_checkpoint

from trtspec.errors import UsageError
from trtspec.speculative.drafters import BatchState
from trtspec.speculative.factory import load_runner
from trtspec.speculative.lookahead import LookaheadDrafter
from trtspec.speculative.model import Slots, load_transformer
from trtspec.speculative.runner import GenerationParams, SpeculativeRunner
from trtspec.speculative.tree import TreeShape

V = 64


def guesses_as_logits(drafter: LookaheadDrafter, nodes: list[int], guesses: list[int]) -> torch.Tensor:
    """Target logits [1, 1+T, V] whose argmax is guesses[0] at the root and guesses[j+1] at window node j."""
    logits = torch.zeros(1, 1 + drafter.nodes, V)
    logits[0, 0, guesses[0]] = 1.0
    for j, node in enumerate(nodes):
        logits[0, 1 + node, guesses[j + 1]] = 1.0
    return logits


def test_the_pool_holds_the_diagonals_of_the_jacobi_trajectory():
    """With nothing accepted the window moves one column a step; after N-1 windows of real guesses the
    pool holds each diagonal: a guess, the guess made after it one step later, and the target's next."""
    drafter = LookaheadDrafter(window=3, ngram=3, verification=2)
    state = BatchState(tokens=torch.zeros(1, 32, dtype=torch.long), lengths=torch.tensor([3]))
    state.tokens[0, :3] = torch.tensor([5, 6, 7])
    drafter.start(state, 32)
    slots = Slots.of([0])
    for step, guesses in enumerate([[10, 11, 12, 13], [30, 31, 32, 33], [40, 41, 42, 43]]):
        tree = drafter.propose_tree(state, drafter.fixed_tree, slots)
        window = drafter.rows[0].window
        assert tree.tokens[0, :3].tolist() == window  # the window is the first branch, a chain
        assert tree.parents[0, :3].tolist() == [-1, 0, 1]
        old = state.lengths.clone()
        state.tokens[0, int(old)] = guesses[0]  # nothing accepted: the root's token is committed alone
        state.lengths += 1
        drafter.commit_tree(state, old, slots, guesses_as_logits(drafter, drafter.rows[0].window_nodes, guesses))
        drafter.propose_tree(state, drafter.fixed_tree, slots)
        assert drafter.rows[0].window == guesses[1:]  # the next guesses, moved on by the one committed token
        if step < 2:
            assert drafter.rows[0].pool == {}  # fillers and too few windows make no n-grams
    # step 2's window [11, 12, 13] -> step 3's [31, 32, 33] (31 guessed after 11 ...) -> step 3's guesses
    assert drafter.rows[0].pool == {12: [(32, 42)], 13: [(33, 43)]}
    state.tokens[0, int(state.lengths) - 1] = 12  # a row whose last token starts a pooled n-gram
    tree = drafter.propose_tree(state, drafter.fixed_tree, slots)
    valid = tree.valid[0].tolist()
    branch = [(int(t), int(p)) for t, p, ok in zip(tree.tokens[0], tree.parents[0], valid, strict=True) if ok]
    assert branch == [(41, -1), (32, -1), (42, 0), (42, 1), (43, 2)]  # window 41 42 43, n-gram 32 42, as a trie


@pytest.fixture(scope="module")
def target_path(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("lookahead") / "t", vocab=V, hidden=32, layers=2, seed=3)


PROMPTS = [[3, 4, 5, 6, 7, 3, 4, 5], [9, 10, 11], [12, 13, 14, 15, 16, 17, 18, 12, 13]]


@pytest.mark.parametrize("wng", [(4, 3, 2), (3, 2, 1), (5, 4, 3)])
def test_greedy_output_is_plain_decodings_alone_and_in_a_batch(target_path, wng):
    target = load_transformer(target_path)
    params = GenerationParams(max_tokens=40)
    plain = [g.tokens for g in SpeculativeRunner(target).generate(PROMPTS, params)]
    settings = dict(zip(("window_size", "ngram_size", "verification_set_size"), wng, strict=True))
    runner = load_runner(target_path, "lookahead", target=target, settings=settings)
    assert runner.tree == LookaheadDrafter(*wng).fixed_tree
    batched = runner.generate(PROMPTS, params)
    assert [g.tokens for g in batched] == plain
    assert [runner.generate([p], params)[0].tokens for p in PROMPTS] == plain
    # the guesses do get accepted: fewer target passes than tokens
    assert sum(g.stats.accepted_tokens for g in batched) > 0
    assert all(g.stats.steps + 1 <= len(g.tokens) for g in batched)


def test_its_tree_comes_from_its_settings_alone(target_path):
    with pytest.raises(UsageError, match="tree its own settings give"):
        load_runner(target_path, "lookahead", tree=TreeShape(2, 2))
    own = SpeculativeRunner(load_transformer(target_path), LookaheadDrafter(3, 2, 1), tree=TreeShape(2, 2))
    with pytest.raises(ValueError, match="drafts its own tree"):
        own.generate([[3, 4, 5]], GenerationParams(max_tokens=4))
    with pytest.raises(ValueError, match="N >= 2"):
        LookaheadDrafter(3, 1, 2)
    with pytest.raises(ValueError, match="N <= W \\+ 1"):
        LookaheadDrafter(3, 5, 2)
    with pytest.raises(UsageError, match="at most 64"):
        load_runner(target_path, "lookahead", settings={"window_size": 7, "ngram_size": 7, "verification_set_size": 10})


def test_plan_compares_it_at_each_window_and_refuses_to_plan_its_k(target_path, tmp_path):
    """plan's methods: lookahead at each (W, N, G) it tries, K its tree's depth; a config in mode lookahead has
    no K to choose, and plan says so in one line."""
    from click.testing import CliRunner
    from conftest import CONFIGS

    from trtspec.cli import cli
    from trtspec.config import load_config
    from trtspec.methods import LOOKAHEADS, compare_methods
    from trtspec.speculative.requests import SamplingParams

    target = load_transformer(target_path)
    cfg = load_config(CONFIGS / "tiny-ngram.yaml")
    rows = compare_methods(cfg, target_path, None, target, PROMPTS, 12, SamplingParams(), [1, 2], modes=["lookahead"])
    expected = {f"lookahead W={w} N={n} G={g}": max(w, n - 1) for w, n, g in LOOKAHEADS}
    assert {r["method"]: r["k"] for r in rows["rows"]} == expected
    assert all(r["tokens_per_step"] >= 1 and set(r["predicted_speedup"]) == {"1", "2"} for r in rows["rows"])
    runner = CliRunner()
    out = tmp_path / "la.yaml"
    res = runner.invoke(cli, ["init", "--target", "embedded:tiny-target", "--mode", "lookahead", "--out", str(out)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(cli, ["plan", str(out)])
    assert res.exit_code == 2 and "lookahead's follow from its own settings" in res.output
    assert len(res.output.strip().splitlines()) == 1


def _deployment(target_path, root, flavour: str = "engine", wng=(4, 3, 2)):
    from trtspec.config import validate_config

    data = {
        "name": "la",
        "target": {"checkpoint": str(target_path), "dtype": "float32"},
        "lookahead": dict(zip(("window_size", "ngram_size", "verification_set_size"), wng, strict=True)),
        "speculation": {"mode": "lookahead"},  # policy auto, which is fixed for a tree its settings give
        "build": {"backend": "torch", "device": "cpu", "max_batch_size": 2, "max_seq_len": 256, "max_input_len": 32},
        "serve": {"flavour": flavour, "repository": str(root / "repo")},
    }
    data["build"]["output_dir"] = str(root / "engines")
    return validate_config(data, root / "la.yaml")


def test_a_lookahead_deployment_builds_packages_and_serves_on_the_engine_flavour(target_path, tmp_path):
    """Backend torch builds lookahead as TensorRT-LLM does (the engine records max_draft_len f(W, N, G)) and the
    engine flavour's tensorrt_llm model carries NVIDIA's lookahead_* parameters; the engine trtspec's stand-in
    makes of them drafts with that (W, N, G), decodes greedily as plain decoding, and `trtspec check` holds the
    engine to the configured settings."""
    from conftest import pbtxt_parameters

    from trtspec.build.builder import run_build
    from trtspec.check import run_check
    from trtspec.modes.lookahead import TRITON_FIELDS
    from trtspec.repository.package import package_repository
    from trtspec.repository.serving import engine_from_parameters
    from trtspec.speculative.batch import Sequence

    cfg = _deployment(target_path, tmp_path)
    assert run_build(cfg).built == ["target"]
    build = json.loads((tmp_path / "engines" / "la" / "target" / "engine.json").read_text())["build_config"]
    assert build["max_draft_len"] == 11 and build["speculative_decoding_mode"] == "lookahead_decoding"
    repo = package_repository(cfg)
    p = pbtxt_parameters(repo / "tensorrt_llm" / "config.pbtxt")
    assert p["decoding_mode"] == "lookahead" and p["trtspec_mode"] == "lookahead"
    assert (p["trtspec_policy"], p["trtspec_num_draft_tokens"]) == ("fixed", "4")  # the 4x3 tree's depth
    assert (p["lookahead_window_size"], p["lookahead_ngram_size"], p["lookahead_verification_set_size"]) == (
        "4", "3", "2"
    )  # fmt: skip
    assert [f.code for f in run_check(cfg).findings if f.severity == "error"] == []  # engine.json read, not config.json

    params = GenerationParams(max_tokens=40)
    plain = [g.tokens for g in SpeculativeRunner(load_transformer(target_path)).generate(PROMPTS, params)]
    for wng in ((4, 3, 2), (3, 2, 1)):  # the stand-in's (W, N, G) are the parameters', not a default
        given = {key: str(v) for key, v in zip(TRITON_FIELDS, wng, strict=True)}  # W, N, G's parameter names
        engine = engine_from_parameters({**p, **given}, slots=2)
        assert isinstance(engine.drafter, LookaheadDrafter) and engine.tree == LookaheadDrafter(*wng).fixed_tree
        served = [Sequence(prompt, params) for prompt in PROMPTS]  # three requests in the engine's two slots
        for seq in served:
            engine.add(seq)
        while engine.has_work():
            engine.step()
        assert [s.result.tokens for s in served] == plain
        assert sum(s.result.stats.accepted_tokens for s in served) > 0
    # a server whose (W, N, G) need more drafts than the engine's max_draft_len is found before it starts;
    # fewer run (TensorRT-LLM's executor checks <=, as the stand-in served (3, 2, 1) above): a warning
    for wng, severity in (((3, 2, 1), "warning"), ((5, 3, 2), "error")):
        other = _deployment(target_path, tmp_path, wng=wng)
        found = [f for f in run_check(other).findings if f.code == "tree-draft-len"]
        assert [f.severity for f in found] == [severity] and "max_draft_len 11" in found[0].message


def test_the_llmapi_flavour_refuses_lookahead_which_the_llm_api_lacks(target_path, tmp_path):
    from trtspec.build.builder import run_build

    with pytest.raises(UsageError, match=r"no LLM API config.*set serve\.flavour engine"):
        run_build(_deployment(target_path, tmp_path, flavour="llmapi"))
    assert not (tmp_path / "engines" / "la" / "target").exists()


def test_settings_the_served_runner_cannot_run_are_refused_in_one_line(target_path, tmp_path):
    from trtspec.config import validate_config
    from trtspec.errors import ConfigError
    from trtspec.modes import get_mode

    data = _deployment(target_path, tmp_path).model_dump(mode="json")
    for change, message in (
        ({"lookahead": {"window_size": 10, "ngram_size": 8, "verification_set_size": 8}}, "66 tokens a step"),
        ({"lookahead": {"window_size": 2, "ngram_size": 4, "verification_set_size": 1}}, r"N <= W \+ 1"),
        ({"speculation": {"mode": "lookahead", "policy": "adaptive"}}, "lookahead's settings fix its tree"),
    ):
        with pytest.raises(ConfigError, match=message) as err:
            validate_config({**data, **change}, tmp_path / "la.yaml")
        assert "\n" not in str(err.value)
    mode = get_mode("lookahead")  # the parameters a server reads: a number in range, or one line saying not
    for value, message in (("7x", "must be a whole number"), ("0", "greater than or equal to 1"), ("99", "64")):
        with pytest.raises(UsageError, match=message):
            mode.triton_settings({"lookahead_ngram_size": value})


def test_the_lossless_check_runs_against_it_and_says_why_its_power_is_not_stated(tmp_path):
    """The served check's planted bugs are rules for chains; lookahead verifies its own tree, so the reference
    plants nothing there, says so, and still picks its contexts. A chain at a fixed K keeps its planted bugs."""
    import yaml
    from conftest import CONFIGS

    from trtspec.bench.lossless_reference import load_reference
    from trtspec.speculative.planted import PLANTED

    for name in ("tiny-lookahead.yaml", "tiny-ngram.yaml"):  # at a fixed K, as the demo checks its servers
        data = yaml.safe_load((CONFIGS / name).read_text())
        data["speculation"]["policy"] = "fixed"
        (tmp_path / name).write_text(yaml.safe_dump(data))
    reference = load_reference(tmp_path / "tiny-lookahead.yaml")
    assert reference.planted == {} and "4-node token tree" in reference.unstated_power  # W + G(N-1) = 3 + 1
    assert len(reference.choose(["The history of", "Once upon a time"], 1, 4, 1.0)) == 1
    reference = load_reference(tmp_path / "tiny-ngram.yaml")
    assert set(reference.planted) == set(PLANTED) and reference.unstated_power is None
