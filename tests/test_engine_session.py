"""The engine flavour's per-call model: prefix KV reuse is exact, and the BLS's draft-then-verify
loop over whole-sequence calls reproduces plain greedy decoding."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_checkpoint

from trtspec.speculative.engine_session import CachedModel
from trtspec.speculative.model import load_transformer
from trtspec.speculative.runner import GenerationParams, SpeculativeRunner
from trtspec.speculative.sampling import SamplingParams

GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine")
    target = load_transformer(make_checkpoint(root / "t", vocab=50, hidden=32, layers=2, heads=4, kv_heads=2, seed=1))
    # the draft is the target with a perturbed head: agrees often, not always
    draft = load_transformer(make_checkpoint(root / "d", vocab=50, hidden=32, layers=2, heads=4, kv_heads=2, seed=1))
    noise = torch.randn(draft.lm_head.weight.shape, generator=torch.Generator().manual_seed(0))  # not the global RNG
    with torch.no_grad():
        draft.lm_head.weight.add_(0.05 * noise.to(draft.lm_head.weight.dtype))
    return target, draft


@torch.inference_mode()
def fresh_logits(model, tokens: list[int]) -> torch.Tensor:
    cache = model.new_cache(1, 64)
    return model(torch.tensor([tokens]), torch.arange(len(tokens))[None], cache).logits[0]


def test_prefix_reuse_gives_the_logits_of_a_fresh_forward(pair):
    target, _ = pair
    engine = CachedModel(target, capacity=64, slots=3)
    a = [3, 4, 5, 6, 7, 8, 9, 10]
    b = [3, 4, 5, 20, 21]  # diverges at position 3: stale entries of `a` lie beyond
    c = [30, 31, 32]  # shares nothing: a second slot
    for seq in (a, b, [*a, 11, 12], c, [*b, 22]):
        assert torch.allclose(engine.forward(seq, 2), fresh_logits(target, seq)[-2:], atol=1e-5)
    # b took its own slot rather than overwrite most of a; a+[11,12] then reused all of a, and
    # b+[22] all of b but its last token, fed again because its logits were asked for (tail 2)
    assert engine.reused_tokens == len(a) + len(b) - 1
    assert len(engine.slots) == 3


def bls_loop(draft: CachedModel, target: CachedModel, prompt: list[int], max_tokens: int, k: int, use_logits: bool):
    seq, drafted, accepted = list(prompt), 0, 0
    while len(seq) - len(prompt) < max_tokens:
        n = min(k, max_tokens - (len(seq) - len(prompt)) - 1)
        d = draft.decode(seq, n, GREEDY, None, None, keep_logits=use_logits) if n > 0 else None
        drafts = d.tokens if d else []
        out = target.verify_drafts(seq, drafts, d.logits if d else None, GREEDY, None, None, max_tokens)
        drafted, accepted = drafted + out.draft_tokens, accepted + out.accepted_tokens
        seq += out.tokens
    return seq[len(prompt) :], drafted, accepted


@pytest.mark.parametrize("k,use_logits", [(1, False), (3, True), (5, False)])
def test_draft_then_verify_calls_equal_plain_greedy(pair, k, use_logits):
    target, draft = pair
    prompt = [3, 4, 5, 6, 7]
    plain = SpeculativeRunner(target).generate([prompt], GenerationParams(max_tokens=20))[0].tokens
    tokens, drafted, accepted = bls_loop(CachedModel(draft, 64), CachedModel(target, 64), prompt, 20, k, use_logits)
    assert tokens == plain
    assert 0 < accepted < drafted  # the perturbed draft is right sometimes, wrong sometimes


def test_draft_logits_equal_to_the_targets_are_always_accepted(pair):
    # p == q makes min(1, p/q) = 1: any rejection would mean q was processed unlike p
    target, _ = pair
    engine = CachedModel(target, 64)
    prompt = [3, 4, 5]
    sampling = SamplingParams(temperature=0.9, top_k=20, top_p=0.9)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        d = engine.decode(prompt, 4, sampling, g, None, keep_logits=True)
        out = CachedModel(target, 64).verify_drafts(prompt, d.tokens, d.logits, sampling, g, None, 5)
        assert out.accepted_tokens == 4 and out.tokens[:4] == d.tokens


def test_end_id_stops_and_is_not_returned(pair):
    target, _ = pair
    engine = CachedModel(target, 64)
    first = engine.decode([3, 4, 5], 6, GREEDY, None, None).tokens
    stopped = engine.decode([3, 4, 5], 6, GREEDY, None, end_id=first[2])
    assert stopped.ended and stopped.tokens == first[:2]
