"""The runner: exact greedy equality with plain decoding, KV rollback, MTP chaining, stops, batching."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from tiny_models import make_checkpoint

from trtspec.speculative.drafters import DraftModelDrafter, MTPDrafter, NgramDrafter
from trtspec.speculative.eagle import Eagle3Head
from trtspec.speculative.heads import MedusaHeads
from trtspec.speculative.model import Linear, column_major, load_transformer
from trtspec.speculative.requests import SamplingParams
from trtspec.speculative.runner import GenerationParams, SpeculativeRunner

PROMPTS = [[3, 4, 5, 6, 7], [9, 10, 11], [12, 13, 14, 15, 16, 17, 18, 12, 13]]
GREEDY = GenerationParams(max_tokens=24)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("runner")
    target = load_transformer(
        make_checkpoint(root / "t", vocab=50, hidden=32, layers=2, heads=4, kv_heads=2, mtp_layers=2, seed=1)
    )
    draft = load_transformer(make_checkpoint(root / "d", vocab=50, hidden=32, layers=1, heads=4, kv_heads=2, seed=2))
    return target, draft


@pytest.fixture(scope="module")
def plain(pair):
    return SpeculativeRunner(pair[0]).generate(PROMPTS, GREEDY)


def test_lean_model_matches_transformers(tmp_path):
    from transformers import LlamaForCausalLM

    path = make_checkpoint(tmp_path / "m", vocab=40, hidden=32, layers=2, heads=4, kv_heads=2, seed=3)
    ours = load_transformer(path)
    theirs = LlamaForCausalLM.from_pretrained(path).eval()
    x = torch.tensor([[1, 5, 9, 2, 7, 7, 3]])
    with torch.no_grad():
        ref = theirs(x).logits
        got = ours(x, torch.arange(7)[None], ours.new_cache(1, 16)).logits
    assert torch.allclose(ref, got, atol=1e-5)


def test_linear_wide_inputs_use_a_column_major_copy_that_follows_the_weight():
    torch.manual_seed(0)
    layer = Linear(24, 40)
    for rows in (1, 3, 4, 9):
        x = torch.randn(1, rows, 24)
        with torch.inference_mode():
            assert torch.allclose(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5)
    copy = column_major(layer.weight)
    assert copy.stride() == (1, 40) and torch.equal(copy, layer.weight.detach())
    tied = Linear(24, 40)
    tied.weight = layer.weight  # a head tied to the target's matrix shares its copy, not one more of its own
    with torch.inference_mode():
        tied(torch.randn(5, 24))
    assert column_major(tied.weight) is copy
    with torch.no_grad():
        layer.weight.mul_(2)  # an in-place change (a training step, a load) must not leave the copy stale
        x = torch.randn(5, 24)
        assert torch.allclose(layer(x), F.linear(x, layer.weight, layer.bias), atol=1e-5)
    x = torch.randn(6, 24)
    layer(x).sum().backward()  # autograd multiplies by the weight itself, so gradients reach it
    assert layer.weight.grad is not None and layer.weight.grad.abs().sum() > 0


def test_every_matrix_of_the_runners_models_is_that_linear(pair):
    """A verify pass costs about one token's only if every product in it takes that path (blocks, MTP, heads)."""
    target, draft = pair
    head = MedusaHeads(2, 1, target.dims.hidden_size, target.dims.vocab_size)
    dims = replace(target.dims, num_layers=1, num_mtp_layers=0)
    eagle = Eagle3Head(dims, (0, 1), target.dims.hidden_size, target.dims.vocab_size)
    models = (target, draft, head, eagle)
    layers = [m for model in models for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(layers) > 4 * target.dims.num_layers and all(type(m) is Linear for m in layers)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_draft_equal_to_target_accepts_everything_and_matches_greedy(pair, plain, k):
    target, _ = pair
    out = SpeculativeRunner(target, DraftModelDrafter(target), num_draft_tokens=k).generate(PROMPTS, GREEDY)
    assert [g.tokens for g in out] == [g.tokens for g in plain]
    assert all(g.stats.acceptance_rate == 1.0 for g in out)
    # 23 tokens after the prefill's first, k + 1 per step (the last step drafts only what is left)
    assert all(g.stats.steps == -(-23 // (k + 1)) for g in out)


@pytest.mark.parametrize("k", [1, 4])
def test_random_draft_is_mostly_rejected_and_still_matches_greedy(pair, plain, k):
    target, draft = pair
    out = SpeculativeRunner(target, DraftModelDrafter(draft), num_draft_tokens=k).generate(PROMPTS, GREEDY)
    assert [g.tokens for g in out] == [g.tokens for g in plain]
    assert sum(g.stats.accepted_tokens for g in out) < 0.2 * sum(g.stats.draft_tokens for g in out)


@pytest.mark.parametrize("k", [1, 2, 5])
def test_mtp_and_ngram_match_greedy(pair, plain, k):
    target, _ = pair
    for drafter in (MTPDrafter(target), MTPDrafter(target, num_layers=1), NgramDrafter()):
        out = SpeculativeRunner(target, drafter, num_draft_tokens=k).generate(PROMPTS, GREEDY)
        assert [g.tokens for g in out] == [g.tokens for g in plain], type(drafter).__name__


def test_batched_rows_equal_single_requests(pair):
    target, draft = pair
    runner = SpeculativeRunner(target, DraftModelDrafter(draft), num_draft_tokens=3)
    together = runner.generate(PROMPTS, GREEDY)
    for prompt, g in zip(PROMPTS, together, strict=True):
        alone = runner.generate([prompt], GREEDY)[0]
        assert alone.tokens == g.tokens and alone.stats.accepted_tokens == g.stats.accepted_tokens


@torch.inference_mode()
def test_logits_after_rollback_equal_a_fresh_forward(pair):
    target, _ = pair
    seq = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
    cache = target.new_cache(1, 32)
    target(seq[:, :4], torch.arange(4)[None], cache)
    target(torch.tensor([[40, 41, 42]]), torch.arange(4, 7)[None], cache)  # drafts, then "rejected"
    rolled = target(seq[:, 4:], torch.arange(4, 7)[None], cache).logits  # overwrite from position 4
    fresh = target(seq, torch.arange(7)[None], target.new_cache(1, 32)).logits[:, 4:]
    assert torch.allclose(rolled, fresh, atol=1e-5)


@torch.inference_mode()
def test_mtp_drafts_equal_a_from_scratch_chain(pair):
    """The incremental MTP caches give the depth-1 and depth-2 drafts of a full recomputation."""
    target, _ = pair
    drafter = MTPDrafter(target)
    runner = SpeculativeRunner(target, drafter, num_draft_tokens=2)
    seen = []
    original = drafter.propose

    def spy(state, k, slots):
        proposal = original(state, k, slots)
        seen.append((state.tokens[0, : int(state.lengths[0])].clone(), proposal.tokens[0].clone()))
        return proposal

    drafter.propose = spy
    runner.generate([PROMPTS[2]], GenerationParams(max_tokens=12))
    for seq, drafts in seen:
        n = len(seq)
        h0 = target(seq[None], torch.arange(n)[None], target.new_cache(1, 64)).hidden
        c = target.new_mtp_cache(1, 64)
        out1 = target.mtp_forward(0, h0[:, : n - 1], seq[None, 1:n], torch.arange(n - 1)[None], c)
        d1 = out1.logits[0, -1].argmax()
        toks2 = torch.cat([seq[2:n], d1[None]])[None]
        out2 = target.mtp_forward(1, out1.hidden, toks2, torch.arange(n - 1)[None], c)
        expected = [int(d1), int(out2.logits[0, -1].argmax())]
        assert drafts.tolist() == expected[: len(drafts)]
    assert sum(len(d) == 2 for _, d in seen) >= 3


def test_stop_tokens_and_max_tokens(pair, plain):
    target, _ = pair
    stop = plain[0].tokens[5]
    params = GenerationParams(max_tokens=24, stop_token_ids=frozenset({stop}))
    out = SpeculativeRunner(target, DraftModelDrafter(target), num_draft_tokens=4).generate([PROMPTS[0]], params)[0]
    first = plain[0].tokens.index(stop)
    assert out.tokens == plain[0].tokens[: first + 1] and out.finish_reason == "stop"
    short = SpeculativeRunner(target, DraftModelDrafter(target), 4).generate([PROMPTS[0]], GenerationParams(7))[0]
    assert short.tokens == plain[0].tokens[:7] and short.finish_reason == "length"


def test_streaming_callback_sees_every_accepted_chunk_in_order(pair):
    target, _ = pair
    chunks: dict[int, list[list[int]]] = {0: [], 1: []}
    out = SpeculativeRunner(target, DraftModelDrafter(target), 3).generate(
        PROMPTS[:2], GREEDY, on_tokens=lambda row, toks: chunks[row].append(toks)
    )
    for row in (0, 1):
        assert [t for c in chunks[row] for t in c] == out[row].tokens
        assert max(len(c) for c in chunks[row]) == 4  # three accepted drafts and the bonus


def test_seeded_sampling_is_reproducible_and_stats_are_consistent(pair):
    target, draft = pair
    params = GenerationParams(max_tokens=30, sampling=SamplingParams(temperature=1.0), seed=7)
    runner = SpeculativeRunner(target, DraftModelDrafter(draft), num_draft_tokens=3)
    a, b = runner.generate(PROMPTS, params), runner.generate(PROMPTS, params)
    assert [g.tokens for g in a] == [g.tokens for g in b]
    for g in a:
        s = g.stats
        assert s.output_tokens == len(g.tokens) == 30
        assert sum(s.accepted_per_position) == s.accepted_tokens <= s.draft_tokens == sum(s.drafted_per_position)
        # every step emits its accepted drafts plus one token; the first token comes from the prefill
        assert s.output_tokens - 1 <= s.accepted_tokens + s.steps


def test_bad_requests_raise(pair):
    target, _ = pair
    runner = SpeculativeRunner(target, max_len=64)
    with pytest.raises(ValueError, match="at least one token"):
        runner.generate([[]], GREEDY)
    with pytest.raises(ValueError, match="max_tokens"):
        runner.generate([[1]], GenerationParams(max_tokens=0))
    with pytest.raises(ValueError, match="exceed"):
        runner.generate([[1] * 60], GenerationParams(max_tokens=10))
