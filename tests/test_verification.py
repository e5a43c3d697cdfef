"""Deterministic cases of the rejection rule: accept all, reject at i, bonus, one-hot drafts."""

from __future__ import annotations

import torch

from trtspec.speculative.requests import SamplingParams
from trtspec.speculative.sampling import probs_from_logits
from trtspec.speculative.verification import verify

V = 5


def one_hot(*ids: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(torch.tensor(ids), V).float()


def test_all_accepted_then_bonus_from_last_target_position():
    drafts = torch.tensor([[1, 2, 3]])
    q = one_hot(1, 2, 3)[None]
    p = one_hot(1, 2, 3, 4)[None]
    out = verify(drafts, q, p, torch.Generator().manual_seed(0))
    assert out.num_accepted.tolist() == [3]
    assert out.tokens.tolist() == [[1, 2, 3, 4]]


def test_reject_at_i_draws_from_the_residual():
    drafts = torch.tensor([[1, 2, 3]])
    q = one_hot(1, 2, 3)[None]
    # position 1: the target gives d=2 probability 0, so it is rejected; p - q leaves only token 0
    p = torch.stack([one_hot(1)[0], 0.5 * one_hot(0)[0] + 0.5 * one_hot(4)[0], one_hot(3)[0], one_hot(4)[0]])[None]
    q[0, 1] = 0.5 * one_hot(2)[0] + 0.5 * one_hot(4)[0]
    for seed in range(20):
        out = verify(drafts, q, p, torch.Generator().manual_seed(seed))
        assert out.num_accepted.tolist() == [1]
        assert out.tokens.tolist() == [[1, 0, -1, -1]]  # 4 is in both p and q: the residual is only 0


def test_one_hot_draft_none_q_is_greedy_at_temperature_zero():
    logits = torch.randn(1, 4, V, generator=torch.Generator().manual_seed(3))
    p = probs_from_logits(logits, SamplingParams(temperature=0.0))
    greedy = logits.argmax(-1)[0]
    drafts = torch.tensor([[int(greedy[0]), int(greedy[1]), (int(greedy[2]) + 1) % V]])
    out = verify(drafts, None, p, torch.Generator().manual_seed(0))
    assert out.num_accepted.tolist() == [2]
    assert out.tokens[0, :3].tolist() == greedy[:3].tolist()


def test_rows_are_independent_and_num_drafts_caps_acceptance():
    drafts = torch.tensor([[1, 2], [1, 2]])
    q = one_hot(1, 2)[None].repeat(2, 1, 1)
    p = one_hot(1, 2, 3)[None].repeat(2, 1, 1)
    out = verify(drafts, q, p, None, num_drafts=torch.tensor([2, 1]))
    assert out.num_accepted.tolist() == [2, 1]
    # row 1 carried one draft: its next token is drawn from p at position 1 (token 2), as a bonus
    assert out.tokens.tolist() == [[1, 2, 3], [1, 2, -1]]


def test_no_drafts_samples_the_target():
    p = one_hot(3)[None]
    out = verify(torch.zeros(1, 0, dtype=torch.long), None, p, None)
    assert out.tokens.tolist() == [[3]] and out.num_accepted.tolist() == [0]


def test_acceptance_probability_is_min_one_p_over_q():
    # a single position: p(d) = 0.3, q(d) = 0.6 -> accept with probability 0.5
    p = torch.tensor([[[0.3, 0.7, 0, 0, 0], [0.2, 0.2, 0.2, 0.2, 0.2]]]).repeat(40000, 1, 1)
    q = torch.tensor([[[0.6, 0.4, 0, 0, 0]]]).repeat(40000, 1, 1)
    drafts = torch.zeros(40000, 1, dtype=torch.long)
    out = verify(drafts, q, p, torch.Generator().manual_seed(1))
    rate = out.num_accepted.float().mean().item()
    assert abs(rate - 0.5) < 4 * (0.25 / 40000) ** 0.5
    rejected = out.num_accepted == 0
    assert bool((out.tokens[rejected, 0] == 1).all())  # residual max(0, p - q) is all on token 1


def test_top_k_and_top_p_mask_the_same_way_for_p_and_q():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]])
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=3))
    assert (probs[0, 3:] == 0).all() and abs(probs.sum().item() - 1) < 1e-6
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=0.5))
    full = logits.softmax(-1)
    assert full[0, 0] > 0.5 and probs[0, 0].item() == 1.0
    probs = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert (probs[0, :2] > 0).all() and (probs[0, 2:] == 0).all()


def test_greedy_fast_path_equals_the_general_rule_with_one_hot_p():
    from trtspec.speculative.verification import verify_greedy

    g = torch.Generator().manual_seed(4)
    for _ in range(200):
        k = int(torch.randint(0, 5, (1,), generator=g))
        logits = torch.randn(3, k + 1, V, generator=g)
        best = logits.argmax(-1)
        # drafts that follow the argmax for a while, then stray
        drafts = torch.where(torch.rand(3, k, generator=g) < 0.7, best[:, :k], torch.randint(0, V, (3, k), generator=g))
        counts = torch.randint(0, k + 1, (3,), generator=g)
        fast = verify_greedy(drafts, logits, counts)
        slow = verify(drafts, None, probs_from_logits(logits, SamplingParams()), g, counts)
        assert torch.equal(fast.tokens, slow.tokens) and torch.equal(fast.num_accepted, slow.num_accepted)
