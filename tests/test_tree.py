"""Token trees: tree attention gives each node the logits of its own branch, the accepted path's cache
is the committed sequence's, and greedy tree decoding is plain decoding for every drafter that
proposes trees, alone and batched."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_models import make_checkpoint

from trtspec.speculative.batch import Sequence
from trtspec.speculative.drafters import DraftModelDrafter, MedusaDrafter, MTPDrafter, NgramDrafter
from trtspec.speculative.heads import WEIGHTS, MedusaHeads, load_heads
from trtspec.speculative.model import load_transformer
from trtspec.speculative.ngram_pool import NgramPool
from trtspec.speculative.requests import SamplingParams
from trtspec.speculative.runner import GenerationParams, SpeculativeRunner
from trtspec.speculative.tree import TokenTree, TreeShape, ancestors, verification_attention

PROMPTS = [[3, 4, 5, 6, 7], [9, 10, 11], [12, 13, 14, 15, 16, 17, 18, 12, 13]]
GREEDY = GenerationParams(max_tokens=24)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("tree")
    target = load_transformer(make_checkpoint(root / "t", vocab=50, hidden=32, layers=2, heads=4, kv_heads=2, seed=1))
    draft = load_transformer(make_checkpoint(root / "d", vocab=50, hidden=32, layers=1, heads=4, kv_heads=2, seed=2))
    return target, draft


@pytest.fixture(scope="module")
def plain(pair):
    return SpeculativeRunner(pair[0]).generate(PROMPTS, GREEDY)


def test_shape_parses_and_refuses():
    assert TreeShape.parse(" 4x3 ") == TreeShape(4, 3) and TreeShape(4, 3).nodes == 12
    for bad in ("4", "0x3", "4x0", "axb", "4x3x2"):
        with pytest.raises(ValueError, match="DEPTHxWIDTH"):
            TreeShape.parse(bad)


def test_ancestors_follow_parents():
    #      root -> 0 -> 2 -> 3 ; root -> 1
    anc = ancestors(torch.tensor([[-1, -1, 0, 2]]))[0]
    assert anc.tolist() == [
        [True, False, False, False],
        [False, True, False, False],
        [True, False, True, False],
        [True, False, True, True],
    ]


@torch.inference_mode()
def test_every_node_gets_the_logits_of_its_own_branch(pair):
    """One tree pass equals, node by node, a plain forward of prefix + that node's branch."""
    target, _ = pair
    prefix = [5, 6, 7, 8]
    tree = TokenTree(
        tokens=torch.tensor([[20, 21, 22, 23, 24, 25]]),
        parents=torch.tensor([[-1, -1, 0, 0, 1, 3]]),
        depths=torch.tensor([[1, 1, 2, 2, 2, 3]]),
        valid=torch.ones(1, 6, dtype=torch.bool),
    )
    cache = target.new_cache(1, 32)
    target(torch.tensor([prefix[:-1]]), torch.arange(3)[None], cache)  # all but the root, as the engine keeps it
    old = torch.tensor([len(prefix)])
    slots, attention = verification_attention(tree, old)
    got = target(torch.cat([torch.tensor([[prefix[-1]]]), tree.tokens], 1), slots, cache, tree=attention).logits[0]
    branches = {0: [20], 1: [21], 2: [20, 22], 3: [20, 23], 4: [21, 24], 5: [20, 23, 25]}
    for node, branch in branches.items():
        seq = torch.tensor([prefix + branch])
        fresh = target(seq, torch.arange(seq.shape[1])[None], target.new_cache(1, 32)).logits[0, -1]
        assert torch.allclose(got[node + 1], fresh, atol=1e-5), node
    root = target(torch.tensor([prefix]), torch.arange(4)[None], target.new_cache(1, 32)).logits[0, -1]
    assert torch.allclose(got[0], root, atol=1e-5)


@pytest.mark.parametrize("shape", ["1x1", "3x2", "4x3"])
def test_greedy_tree_decoding_is_plain_decoding(pair, plain, shape):
    target, draft = pair
    for drafter in (DraftModelDrafter(draft), DraftModelDrafter(target), NgramDrafter()):
        runner = SpeculativeRunner(target, drafter, tree=TreeShape.parse(shape))
        together = runner.generate(PROMPTS, GREEDY)
        assert [g.tokens for g in together] == [g.tokens for g in plain], type(drafter).__name__
        alone = [runner.generate([p], GREEDY)[0] for p in PROMPTS]
        assert [g.tokens for g in alone] == [g.tokens for g in plain]


def test_a_perfect_drafter_accepts_the_whole_depth(pair, plain):
    """Width 1 keeps the argmax path (wider trees prune by cumulative score, which can drop it)."""
    target, _ = pair
    out = SpeculativeRunner(target, DraftModelDrafter(target), tree=TreeShape(3, 1)).generate(PROMPTS, GREEDY)
    assert all(g.stats.acceptance_rate == 1.0 for g in out)
    assert all(g.stats.steps == -(-23 // 4) for g in out)  # depth + 1 tokens per pass


def test_wider_trees_accept_more_than_chains(pair):
    """The random draft's top candidate is rarely the target's; its top 4 more often are."""
    target, draft = pair
    chain = SpeculativeRunner(target, DraftModelDrafter(draft), tree=TreeShape(3, 1)).generate(PROMPTS, GREEDY)
    wide = SpeculativeRunner(target, DraftModelDrafter(draft), tree=TreeShape(3, 4)).generate(PROMPTS, GREEDY)
    accepted = [sum(g.stats.accepted_tokens for g in out) for out in (chain, wide)]
    assert accepted[1] > accepted[0]


def test_ngram_tree_merges_several_matches():
    """The pool's matches of the longest suffix in its order (oldest first by default), then shorter suffixes'."""
    seq = [1, 2, 7, 8, 1, 2, 9, 4, 1, 2, 7, 5, 1, 2]
    assert NgramPool().candidates(seq, 0, 2, 3, 2) == [[7, 8], [9, 4], [7, 5]]
    assert NgramPool(use_oldest=False).candidates(seq, 0, 2, 3, 2) == [[7, 5], [9, 4], [7, 8]]
    assert NgramPool().candidates(seq, 0, 2, 2, 2) == [[7, 8], [9, 4]]  # up to the tree's width


def test_sampled_tree_decoding_is_reproducible_and_counts_positions(pair):
    target, draft = pair
    params = GenerationParams(max_tokens=24, sampling=SamplingParams(temperature=1.0), seed=3)
    runner = SpeculativeRunner(target, DraftModelDrafter(draft), tree=TreeShape(3, 3))
    first, again = runner.generate(PROMPTS, params), runner.generate(PROMPTS, params)
    assert [g.tokens for g in first] == [g.tokens for g in again]
    for g in first:
        assert len(g.stats.drafted_per_position) == 3
        assert g.stats.accepted_per_position[0] <= g.stats.drafted_per_position[0] == g.stats.steps


def test_a_seeded_request_samples_the_same_tokens_whatever_shares_its_batch(pair):
    """Each sampled row draws a fixed number of times per step, not until the whole batch stopped (here a
    greedy row beside it accepts every level of the perfect drafter's tree)."""
    target, _ = pair
    runner = SpeculativeRunner(target, DraftModelDrafter(target), tree=TreeShape(3, 2))
    engine = runner.engine(slots=2, capacity=64)
    hot = GenerationParams(max_tokens=20, sampling=SamplingParams(temperature=1.0), seed=7)
    alone = Sequence(PROMPTS[2], hot)
    engine.add(alone)
    while engine.has_work():
        engine.step()
    engine = runner.engine(slots=2, capacity=64)
    beside, other = Sequence(PROMPTS[2], hot), Sequence(PROMPTS[0], GenerationParams(max_tokens=20, seed=99))
    engine.add(other)
    engine.add(beside)
    while engine.has_work():
        engine.step()
    assert beside.result.tokens == alone.result.tokens


def test_chain_only_drafters_and_given_drafts_are_refused(pair):
    target, _ = pair
    with pytest.raises(ValueError, match="chains only"):
        SpeculativeRunner(target, None, tree=TreeShape(2, 2)).engine(1)
    runner = SpeculativeRunner(target, NgramDrafter(), tree=TreeShape(2, 2))
    with pytest.raises(ValueError, match="drafts its own tokens"):
        runner.engine(1).add(Sequence([1, 2, 3], GREEDY, drafts=[4, 5]))


def test_mtp_drafts_chains_only(tmp_path):
    target = load_transformer(make_checkpoint(tmp_path / "m", vocab=50, hidden=32, layers=1, heads=4, mtp_layers=1))
    with pytest.raises(ValueError, match="MTPDrafter drafts chains only"):
        SpeculativeRunner(target, MTPDrafter(target), tree=TreeShape(2, 2)).engine(1)


@pytest.fixture(scope="module")
def medusa(pair, tmp_path_factory):
    """Random Medusa heads for the tiny target, saved and loaded in TensorRT-LLM's converter layout."""
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("heads") / "medusa"
    MedusaHeads(3, 1, pair[0].dims.hidden_size, pair[0].dims.vocab_size).save(folder)
    return load_heads(folder)


def test_medusa_heads_round_trip_in_the_converters_layout(medusa, tmp_path):
    from safetensors.torch import load_file

    medusa.save(tmp_path / "h")
    names = set(load_file(str(tmp_path / "h" / WEIGHTS)))
    # examples/medusa/convert_checkpoint.py (load_medusa_hf) reads exactly these per head
    assert names == {f"{h}.{k}" for h in range(3) for k in ("0.linear.weight", "0.linear.bias", "1.weight")}
    again = load_heads(tmp_path / "h")
    x = torch.randn(2, medusa.config()["hidden_size"])
    assert torch.allclose(again(x), medusa(x), atol=1e-2)  # saved as bf16


def test_tied_heads_store_no_output_matrices_and_take_the_targets(pair, tmp_path):
    from safetensors.torch import load_file

    from trtspec.modes import get_mode

    target, _ = pair
    heads = MedusaHeads(2, 1, target.dims.hidden_size, target.dims.vocab_size)
    heads.tie(target.lm_head.weight)
    heads.save(tmp_path / "t", tied=True)
    assert set(load_file(str(tmp_path / "t" / WEIGHTS))) == {
        f"{h}.0.linear.{p}" for h in range(2) for p in ("weight", "bias")
    }
    loaded = load_heads(tmp_path / "t")
    assert loaded.needs_target_head
    with pytest.raises(ValueError, match="tie"):
        MedusaDrafter(loaded)
    drafter = get_mode("medusa").drafter(target, loaded, {})
    x = torch.randn(3, target.dims.hidden_size)
    assert torch.allclose(drafter.heads(x), heads(x), atol=1e-2)
    assert drafter.heads.heads[1][-1].weight.data_ptr() == target.lm_head.weight.data_ptr()


def test_shipped_assets_stay_within_the_size_budget():
    """Everything under trtspec/assets within the model card's budget, the Medusa and EAGLE-3 heads included."""
    from trtspec.assets import ASSETS_BUDGET_BYTES, ASSETS_DIR, EMBEDDED_CHECKPOINTS

    shipped = [p for p in ASSETS_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
    assert (EMBEDDED_CHECKPOINTS["tiny-medusa"] / WEIGHTS) in shipped
    assert (EMBEDDED_CHECKPOINTS["tiny-eagle3"] / "model.safetensors") in shipped
    assert sum(p.stat().st_size for p in shipped) < ASSETS_BUDGET_BYTES
    assert f"limit {ASSETS_BUDGET_BYTES / 1e6:.0f} MB" in (ASSETS_DIR / "MODEL_CARD.md").read_text()


@pytest.mark.parametrize("shape", [None, "3x1", "3x3", "5x2"])
def test_medusa_greedy_decoding_is_plain_decoding(pair, plain, medusa, shape):
    target, _ = pair
    tree = TreeShape.parse(shape) if shape else None
    runner = SpeculativeRunner(target, MedusaDrafter(medusa), num_draft_tokens=5, tree=tree)
    together = runner.generate(PROMPTS, GREEDY)
    assert [g.tokens for g in together] == [g.tokens for g in plain]
    alone = runner.generate([PROMPTS[2]], GREEDY)[0]
    assert alone.tokens == plain[2].tokens
    # never more drafts per step than heads, whatever K or depth asks
    assert max(s.drafted for g in together for s in g.stats.step_log) <= 3


CHOICES = [[1], [0], [0, 0], [0, 2], [1, 0], [0, 0, 0]]  # unsorted, as a user may write medusa_choices


def test_medusa_choices_are_the_static_tree_of_each_heads_ranked_guesses(pair, plain, medusa):
    """A path [i0, i1, ...] is head 0's i0-th best token, then head 1's i1-th best under it: parents first, the
    node count exactly the paths', and greedy decoding over that tree is plain decoding."""
    drafter = MedusaDrafter(medusa, CHOICES)
    assert drafter.fixed_tree == TreeShape(3, 3) and drafter.tree_nodes(drafter.fixed_tree) == len(CHOICES)
    logp = torch.randn(2, 3, 50, generator=torch.Generator().manual_seed(5)).log_softmax(-1)
    tree = drafter._static_tree(logp)
    ranked = logp.argsort(-1, descending=True)
    paths = [(0,), (1,), (0, 0), (0, 2), (1, 0), (0, 0, 0)]  # parents before children
    assert tree.tokens.tolist() == [[int(ranked[b, len(c) - 1, c[-1]]) for c in paths] for b in range(2)]
    assert tree.parents[0].tolist() == [-1, -1, 0, 0, 1, 2] and tree.depths[0].tolist() == [1, 1, 2, 2, 2, 3]
    runner = SpeculativeRunner(pair[0], drafter)
    assert runner.tree == drafter.fixed_tree
    out = runner.generate(PROMPTS, GREEDY)
    assert [g.tokens for g in out] == [g.tokens for g in plain]
    assert max(s.drafted for g in out for s in g.stats.step_log) == 3  # a tree step counts its depth


def test_medusa_reads_the_state_of_the_last_verified_position(pair, plain):
    """After tree steps (whose accepted states are moved into place) the heads read, at n - 2, exactly the
    state a fresh forward over the committed tokens gives. The heads are random, so their first guesses are
    set to greedy decoding's continuation: every step then accepts a path as deep as the tree."""
    target, _ = pair
    seen = []
    heads = MedusaHeads(3, 1, target.dims.hidden_size, target.dims.vocab_size)
    drafter = MedusaDrafter(heads)
    original = drafter._logp
    greedy = [prompt + out.tokens for prompt, out in zip(PROMPTS, plain, strict=True)]

    def spy(state, slots):
        logp = original(state, slots)
        for row, slot in enumerate(slots.index.tolist()):
            n = int(state.lengths[slot])
            tokens = state.tokens[slot, :n].tolist()
            seen.append((tokens, state.target_hidden[slot, n - 2].clone()))
            ahead = next(full[n : n + logp.shape[1]] for full in greedy if full[:n] == tokens)
            for head, token in enumerate(ahead):
                logp[row, head, token] = logp[row, head].max() + 1.0
        return logp

    drafter._logp = spy
    runner = SpeculativeRunner(target, drafter, num_draft_tokens=1, tree=TreeShape(3, 16))
    outs = runner.generate(PROMPTS, GREEDY)
    assert [o.tokens for o in outs] == [o.tokens for o in plain]
    assert max(s.accepted for o in outs for s in o.stats.step_log) == 3  # whole paths moved into place
    assert all(any(t[: len(p)] == p for t, _ in seen) for p in PROMPTS)  # every request's row was read
    for tokens, hidden in seen:
        seq = torch.tensor([tokens[:-1]])
        fresh = target(seq, torch.arange(seq.shape[1])[None], target.new_cache(1, seq.shape[1])).hidden[0, -1]
        assert torch.allclose(hidden, fresh, atol=1e-5)


def test_bad_heads_are_refused_in_one_line(pair, medusa, tmp_path):
    from trtspec.errors import UsageError
    from trtspec.modes import get_mode

    with pytest.raises(UsageError, match=r"no config\.json"):
        load_heads(tmp_path)
    medusa.save(tmp_path / "h")
    (tmp_path / "h" / WEIGHTS).write_bytes(b"not safetensors")
    with pytest.raises(UsageError, match="corrupt"):
        load_heads(tmp_path / "h")
    config = json.loads((tmp_path / "h" / "config.json").read_text())
    for count in (0, True, None, "2"):  # what check calls no heads folder, the runner does not load either
        (tmp_path / "h" / "config.json").write_text(json.dumps({**config, "medusa_num_heads": count}))
        with pytest.raises(UsageError, match=r"counts no heads \(medusa_num_heads\): no Medusa heads folder"):
            load_heads(tmp_path / "h")
    (tmp_path / "h" / "config.json").write_text("[2]")
    with pytest.raises(UsageError, match="counts no heads"):
        load_heads(tmp_path / "h")
    MedusaHeads(2, 1, 16, 50).save(tmp_path / "small")
    with pytest.raises(UsageError, match="heads for another model"):
        get_mode("medusa").drafter(pair[0], load_heads(tmp_path / "small"), {})
