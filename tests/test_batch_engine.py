"""The in-flight batching engine: rows join and leave mid-flight and still give what they give alone.

Greedy text per request equals running it alone whatever joins or leaves around it, with chunked
prefill and prefix reuse; sampled rows that joined mid-flight follow the target exactly (chi-square
against the enumerated distribution, and a planted bug in the same setting fails); a cancelled
sequence frees its slot for the next; a request that can never fit is refused without disturbing
the others; given drafts (the engine flavour's BLS) reproduce plain greedy decoding.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from test_lossless import PROMPT, T1, V, chi_square, exact_joint
from tiny_models import make_checkpoint

from trtspec.modes import get_mode
from trtspec.speculative import drafters
from trtspec.speculative.batch import RowSampling, Sequence
from trtspec.speculative.drafters import BatchState, DraftModelDrafter, MTPDrafter, NgramDrafter
from trtspec.speculative.model import Slots, load_transformer
from trtspec.speculative.planted import PLANTED
from trtspec.speculative.policy import COST_WINDOW, AdaptiveK, FixedK, batch_sizes, calibrate
from trtspec.speculative.requests import SamplingParams, TreeShape, positions_needed
from trtspec.speculative.runner import GenerationParams, SpeculativeRunner

PROMPTS = [[3, 4, 5, 6, 7], [9, 10, 11], [12, 13, 14, 15, 16, 17, 18, 12, 13], [3, 4, 5, 6, 8, 9], [20] * 12, [7]]
GREEDY = GenerationParams(max_tokens=20)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine")
    target = load_transformer(
        make_checkpoint(root / "t", vocab=50, hidden=32, layers=2, heads=4, kv_heads=2, mtp_layers=2, seed=1)
    )
    # the draft is the target with a perturbed head: agrees often, not always
    draft = load_transformer(make_checkpoint(root / "d", vocab=50, hidden=32, layers=2, heads=4, kv_heads=2, seed=1))
    noise = torch.randn(draft.lm_head.weight.shape, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        draft.lm_head.weight.add_(0.05 * noise)
    return target, draft


def runners(pair) -> dict[str, SpeculativeRunner]:
    target, draft = pair
    return {
        "none": SpeculativeRunner(target, max_len=128),
        "draft-target": SpeculativeRunner(target, DraftModelDrafter(draft), num_draft_tokens=3, max_len=128),
        "mtp": SpeculativeRunner(target, MTPDrafter(target), num_draft_tokens=3, max_len=128),
        "ngram": SpeculativeRunner(target, NgramDrafter(), num_draft_tokens=3, max_len=128),
        "auto": SpeculativeRunner(target, get_mode("auto").drafter(target, None, {}), num_draft_tokens=5, max_len=128),
    }


def staggered(engine, prompts, params, every: int = 2) -> list[Sequence]:
    """Add one sequence every `every` steps, then run until all are done."""
    seqs = []
    for prompt in prompts:
        seq = Sequence(prompt, params)
        engine.add(seq)
        seqs.append(seq)
        for _ in range(every):
            engine.step()
    while engine.has_work():
        engine.step()
    return seqs


@pytest.mark.parametrize("mode", ["none", "draft-target", "mtp", "ngram", "auto"])
@pytest.mark.parametrize("budget", [None, 7])
def test_rows_joining_and_leaving_mid_flight_give_the_text_they_give_alone(pair, mode, budget):
    runner = runners(pair)[mode]
    alone = [runner.generate([p], GREEDY)[0].tokens for p in PROMPTS]
    engine = runner.engine(slots=3, capacity=128, max_num_tokens=budget)  # fewer slots than prompts: some wait
    seqs = staggered(engine, PROMPTS * 2, GREEDY)
    assert [s.result.tokens for s in seqs] == alone * 2
    # the second round found every prompt's prefix left in a slot by the first
    assert sum(s.result.stats.reused_prompt_tokens for s in seqs[len(PROMPTS) :]) > 0
    assert engine.running == 0 and engine.free == {0, 1, 2}


@pytest.mark.parametrize("mode", ["none", "draft-target", "mtp", "ngram"])
def test_rows_feeding_one_prompt_are_prefilled_once_and_give_the_text_they_give_alone(pair, mode, monkeypatch):
    runner = runners(pair)[mode]
    target = pair[0]
    alone = {tuple(p): runner.generate([p], GREEDY)[0].tokens for p in PROMPTS[:3]}
    batch = [PROMPTS[0], PROMPTS[1], PROMPTS[0], PROMPTS[2], PROMPTS[1], PROMPTS[0]]
    prefill_rows = []
    original = target.forward

    def forward(tokens, positions, cache, last_only=False, slots=None, **options):
        if last_only:
            prefill_rows.append(tokens.shape[0])
        return original(tokens, positions, cache, last_only, slots, **options)

    monkeypatch.setattr(target, "forward", forward)
    out = runner.generate(batch, GREEDY)
    assert prefill_rows == [3]  # three distinct prompts: one row each, their copies' keys and values copied
    assert [g.tokens for g in out] == [alone[tuple(p)] for p in batch]


def test_only_rows_feeding_the_same_tokens_after_the_same_prefix_share_a_prefill():
    from trtspec.speculative.batch import _same_rows

    tokens = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [4, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 9]])
    index = torch.arange(5)
    starts, counts = torch.tensor([1, 1, 1, 0, 1]), torch.tensor([3, 3, 3, 4, 2])
    first, copy_of = _same_rows(tokens, index, starts, counts)
    # row 1 feeds what row 0 feeds; row 2 another prefix, row 3 from another start, row 4 fewer tokens
    assert first[copy_of].tolist() == [0, 0, 2, 3, 4]
    assert _same_rows(tokens, index[:1], starts[:1], counts[:1]) is None
    assert _same_rows(tokens[2:], index[:3], starts[2:], counts[2:]) is None


def test_chunked_prefill_keeps_each_step_within_max_num_tokens(pair):
    target, _ = pair
    engine = SpeculativeRunner(target, max_len=128).engine(slots=4, capacity=128, max_num_tokens=6)
    per_step: list[int] = []
    original_forward, original_step = target.forward, engine.step

    def forward(tokens, positions, cache, last_only=False, slots=None, **options):
        per_step[-1] += sum(len(set(row)) for row in positions.tolist())  # padding repeats a position
        return original_forward(tokens, positions, cache, last_only, slots, **options)

    def step():
        per_step.append(0)
        return original_step()

    target.forward, engine.step = forward, step
    try:
        seqs = staggered(engine, [list(range(3, 25)), [5, 6, 7], list(range(30, 45))], GenerationParams(max_tokens=8))
    finally:
        del target.forward
    assert [s.result.stats.output_tokens for s in seqs] == [8, 8, 8]
    assert max(per_step) == 6  # a 22-token prompt went in over several steps, beside the others' decoding
    assert seqs[0].result.tokens == SpeculativeRunner(target).generate([list(range(3, 25))], GREEDY)[0].tokens[:8]


def test_a_cancelled_sequence_frees_its_slot_for_a_waiting_one(pair):
    target, draft = pair
    engine = SpeculativeRunner(target, DraftModelDrafter(draft), 3, max_len=128).engine(slots=1, capacity=128)
    first, second = Sequence(PROMPTS[0], GenerationParams(max_tokens=60)), Sequence(PROMPTS[1], GREEDY)
    engine.add(first)
    engine.add(second)
    engine.step()
    engine.step()
    assert engine.running == 1 and list(engine.waiting) == [second]
    third = Sequence(PROMPTS[2], GREEDY)
    engine.add(third)
    third.cancelled = True  # a waiting request whose client went away leaves the queue at once
    assert third in engine.step() and third.result.finish_reason == "cancelled" and third.slot == -1
    assert list(engine.waiting) == [second]
    first.cancelled = True
    finished = engine.step()
    assert first in finished and first.result.finish_reason == "cancelled"
    assert 0 < first.result.stats.output_tokens < 60
    assert second.slot == 0  # admitted into the freed slot in the same step
    while engine.has_work():
        engine.step()
    assert second.result.tokens == runners(pair)["draft-target"].generate([PROMPTS[1]], GREEDY)[0].tokens


def test_a_request_that_cannot_fit_is_refused_and_the_others_run_on(pair):
    target, _ = pair
    engine = SpeculativeRunner(target, max_len=64).engine(slots=2, capacity=64)
    ok = Sequence(PROMPTS[0], GREEDY)
    engine.add(ok)
    engine.step()
    with pytest.raises(ValueError, match=r"prompt \(5\) \+ max_tokens \(100\) \+ drafts \(0\) exceed .* 64 positions"):
        engine.add(Sequence(PROMPTS[0], GenerationParams(max_tokens=100)))
    with pytest.raises(ValueError, match="at least one token"):
        engine.add(Sequence([], GREEDY))
    while engine.has_work():
        engine.step()
    assert ok.result.tokens == SpeculativeRunner(target).generate([PROMPTS[0]], GREEDY)[0].tokens


def test_seeded_rows_draw_the_same_tokens_whoever_shares_their_batch(pair):
    target, draft = pair
    runner = SpeculativeRunner(target, DraftModelDrafter(draft), 3, max_len=128)
    params = GenerationParams(max_tokens=16, sampling=SamplingParams(temperature=1.0), seed=11)
    alone = runner.generate([PROMPTS[2]], params)[0].tokens
    engine = runner.engine(slots=4, capacity=128)
    noise = [Sequence(p, GenerationParams(max_tokens=16, sampling=T1, seed=i)) for i, p in enumerate(PROMPTS[:3])]
    for seq in noise:
        engine.add(seq)
    engine.step()
    mine = Sequence(PROMPTS[2], params)
    engine.add(mine)
    while engine.has_work():
        engine.step()
    assert mine.result.tokens == alone


@pytest.mark.slow
@pytest.mark.parametrize("bug", [None, "residual-from-p"])
def test_rows_that_join_mid_flight_follow_the_target_exactly(tmp_path_factory, bug):
    """Sampled rows admitted as others finish, beside greedy rows of another prompt: chi-square
    against the enumerated joint distribution passes, and with a planted verification bug fails."""
    root = tmp_path_factory.mktemp("mixed")
    target = load_transformer(make_checkpoint(root / "target", vocab=V, layers=2, mtp_layers=2, seed=11))
    draft = load_transformer(make_checkpoint(root / "draft", vocab=V, layers=1, seed=12))
    verify_fn = PLANTED[bug] if bug else None
    runner = SpeculativeRunner(
        target, DraftModelDrafter(draft), 2, max_len=32, **({"verify_fn": verify_fn} if bug else {})
    )
    engine = runner.engine(slots=512, capacity=32)
    generator = torch.Generator().manual_seed(3)  # one generator for the sampled rows: they draw as one group
    sampled = GenerationParams(max_tokens=4, sampling=T1)
    n, seqs = 30_000, []
    while len(seqs) < n or engine.has_work():
        for _ in range(min(200, n - len(seqs))):  # a wave of arrivals before every step
            seqs.append(Sequence(PROMPT, sampled, generator=generator))
            engine.add(seqs[-1])
        if len(seqs) < n:
            engine.add(Sequence([1, 2, 3, 4], GenerationParams(max_tokens=6)))  # greedy rows of another prompt
        engine.step()
    samples = np.array([s.result.tokens for s in seqs])
    assert len({s.slot for s in seqs}) == 512  # rows really did take over slots others left
    stat, p = chi_square(samples, exact_joint(target, T1))
    if bug is None:
        assert p > 1e-3, f"chi2 {stat:.1f}, p {p:.2e}"
    else:
        assert p < 1e-6, f"{bug}: chi2 {stat:.1f}, p {p:.2e}: the mixed-batch test cannot tell a broken sampler"


def test_given_drafts_reproduce_plain_greedy_and_reuse_the_prefix(pair):
    """The engine flavour's BLS loop: the draft model asked for K tokens, the target given them as drafts."""
    target, draft = pair
    draft_engine = SpeculativeRunner(draft, max_len=128).engine(slots=2, capacity=128)
    target_engine = SpeculativeRunner(target, max_len=128).engine(slots=2, capacity=128)
    prompt, k, drafted, accepted = [3, 4, 5, 6, 7], 3, 0, 0
    seq = list(prompt)
    while len(seq) - len(prompt) < 20:
        n = min(k, 20 - (len(seq) - len(prompt)) - 1)
        d = Sequence(seq, GenerationParams(max_tokens=n), keep_logits=True) if n > 0 else None
        if d is not None:
            run(draft_engine, d)
        drafts = d.result.tokens if d else []
        v = Sequence(seq, GenerationParams(max_tokens=len(drafts) + 1), drafts=drafts or None)
        if d is not None:
            v.draft_logits = torch.stack(d.logits)
            assert v.draft_logits.shape == (len(drafts), 50)
        run(target_engine, v)
        drafted, accepted = drafted + v.result.stats.draft_tokens, accepted + v.result.stats.accepted_tokens
        seq += v.result.tokens
    plain = SpeculativeRunner(target).generate([prompt], GenerationParams(max_tokens=20))[0].tokens
    assert seq[len(prompt) :] == plain
    assert 0 < accepted < drafted  # the perturbed draft is right sometimes, wrong sometimes
    # every call after the first resent the whole sequence; all but its newest tokens came from the slot
    assert target_engine.rows == [None, None]
    assert v.result.stats.reused_prompt_tokens >= len(seq) - len(v.result.tokens) - k - 2


def test_what_a_server_checks_is_what_the_engine_refuses_by(pair):
    """The served engine model refuses a request by `positions_needed` before queueing it: a sequence bringing
    its own drafts fits at exactly that many positions and is refused at one fewer, plain or drafting."""
    target, draft = pair
    prompt, params = [3, 4, 5], GenerationParams(max_tokens=4)
    for drafter, drafts in ((None, [6, 7, 8]), (None, None), (DraftModelDrafter(draft), None)):
        runner = SpeculativeRunner(target, drafter, num_draft_tokens=2, max_len=64)
        need = runner.engine(slots=1, capacity=64).positions_needed(len(prompt), params, drafts)
        assert run(runner.engine(slots=1, capacity=need), Sequence(prompt, params, drafts=drafts)).result.tokens
        with pytest.raises(ValueError, match="exceed"):
            runner.engine(slots=1, capacity=need - 1).add(Sequence(prompt, params, drafts=drafts))


def run(engine, seq: Sequence) -> Sequence:
    engine.add(seq)
    while engine.has_work():
        engine.step()
    return seq


def test_draft_logits_equal_to_the_targets_are_always_accepted(pair):
    # p == q makes min(1, p/q) = 1: any rejection would mean q was processed unlike p
    target, _ = pair
    engine = SpeculativeRunner(target, max_len=64).engine(slots=2, capacity=64)
    sampling = SamplingParams(temperature=0.9, top_k=20, top_p=0.9)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        d = run(
            engine,
            Sequence([3, 4, 5], GenerationParams(max_tokens=4, sampling=sampling), generator=g, keep_logits=True),
        )
        v = Sequence([3, 4, 5], GenerationParams(max_tokens=5, sampling=sampling), generator=g, drafts=d.result.tokens)
        v.draft_logits = torch.stack(d.logits)
        run(engine, v)
        assert v.result.stats.accepted_tokens == 4 and v.result.tokens[:4] == d.result.tokens


def test_end_token_stops_and_min_tokens_holds_it_back(pair):
    target, _ = pair
    engine = SpeculativeRunner(target, max_len=64).engine(slots=2, capacity=64)
    first = run(engine, Sequence([3, 4, 5], GenerationParams(max_tokens=6))).result.tokens
    stop = frozenset({first[2]})
    stopped = run(engine, Sequence([3, 4, 5], GenerationParams(max_tokens=6, stop_token_ids=stop))).result
    assert stopped.finish_reason == "stop" and stopped.tokens == first[:3]
    held = run(engine, Sequence([3, 4, 5], GenerationParams(max_tokens=6, stop_token_ids=stop), min_tokens=4))
    assert first[2] not in held.result.tokens[:4] and held.result.stats.output_tokens >= 4


@pytest.mark.parametrize("mode", ["draft-target", "mtp", "ngram", "draft-target-tree"])
def test_min_tokens_holds_the_end_back_while_speculating(pair, mode):
    """The stop token is banned in every verified column before min_tokens, not only the first: greedy text equals
    plain decoding's with the same min_tokens, though the drafts propose the stop token where it is likely."""
    target, draft = pair
    runner = {
        **runners(pair),
        "draft-target-tree": SpeculativeRunner(target, DraftModelDrafter(draft), tree=TreeShape(2, 2)),
    }[mode]
    plain = SpeculativeRunner(target, max_len=64).engine(slots=1, capacity=64)
    first = run(plain, Sequence([3, 4, 5], GenerationParams(max_tokens=12))).result.tokens
    stop = frozenset({first[1], target.dims.vocab_size + 5})  # an id past the vocabulary is never drawn, nor banned
    params = GenerationParams(max_tokens=12, stop_token_ids=stop)
    want = run(plain, Sequence([3, 4, 5], params, min_tokens=8)).result
    assert first[1] not in want.tokens[:8] and len(want.tokens) >= 8
    got = run(runner.engine(slots=2, capacity=64), Sequence([3, 4, 5], params, min_tokens=8)).result
    assert got.stats.draft_tokens > 0
    assert got.tokens == want.tokens


def test_given_drafts_holding_the_end_token_early_are_rejected_under_min_tokens(pair):
    """The engine flavour's target call with drafts: a drafted end token before min_tokens is rejected, and the
    token drawn in its place is plain decoding's under the same min_tokens."""
    target, _ = pair
    engine = SpeculativeRunner(target, max_len=64).engine(slots=2, capacity=64)
    first = run(engine, Sequence([3, 4, 5], GenerationParams(max_tokens=6))).result.tokens
    stop = frozenset({first[1]})
    held = run(engine, Sequence([3, 4, 5], GenerationParams(max_tokens=6, stop_token_ids=stop), min_tokens=4))
    params = GenerationParams(max_tokens=4, stop_token_ids=stop)
    ended = run(engine, Sequence([3, 4, 5], params, drafts=first[:3])).result
    assert ended.tokens == first[:2] and ended.finish_reason == "stop"  # without min_tokens the drafts end it
    got = run(engine, Sequence([3, 4, 5], params, drafts=first[:3], min_tokens=4)).result
    assert got.stats.accepted_tokens == 1 and got.tokens == held.result.tokens[:2]


def test_a_plain_row_beside_given_drafts_keeps_to_its_room_and_its_min_tokens(pair):
    """A row with fewer drafts than the batch's widest writes no further than it reserved, and a plain row
    keeps min_tokens and its logits though a row beside it verifies drafts."""
    target, _ = pair
    engine = SpeculativeRunner(target, max_len=64).engine(slots=1, capacity=64)
    alone = run(engine, Sequence([3, 4, 5], GenerationParams(max_tokens=20))).result.tokens
    stop = frozenset({alone[17]})
    capacity = positions_needed(3, 20, 0)  # exactly the plain rows' room: no slot for anyone else's drafts
    engine = SpeculativeRunner(target, max_len=64).engine(slots=3, capacity=capacity)
    plain = Sequence([3, 4, 5], GenerationParams(max_tokens=20), keep_logits=True)
    held = Sequence([3, 4, 5], GenerationParams(max_tokens=20, stop_token_ids=stop), min_tokens=19)
    engine.add(plain)
    engine.add(held)
    while not plain.step_log or engine.produced[plain.slot] < 17:
        engine.step()
    # 6 drafts after a one-token prompt fit the capacity; the plain rows' pass must stay within their 25
    engine.add(Sequence([9], GenerationParams(max_tokens=7), drafts=[12, 13, 14, 15, 16, 17]))
    while engine.has_work():
        engine.step()
    assert plain.result.tokens == alone
    assert len(plain.logits) == 20
    assert alone[17] not in held.result.tokens[:19] and held.result.stats.output_tokens >= 19


def test_a_row_asking_fewer_drafts_has_room_for_the_batchs_widest(pair):
    """The draft model drafts the batch's K for every row, so a row asking for K=1 beside rows at K=3 reserves
    the engine's K, and at exactly that capacity runs to the end with its greedy text unchanged."""
    target, draft = pair
    runner = SpeculativeRunner(target, DraftModelDrafter(draft), num_draft_tokens=3, max_len=64)
    one = GenerationParams(max_tokens=20, num_draft_tokens=1)
    engine = runner.engine(slots=2, capacity=64)
    assert engine.positions_needed(3, one) == positions_needed(3, 20, 3)
    alone = run(engine, Sequence([3, 4, 5], one)).result.tokens
    engine = runner.engine(slots=2, capacity=positions_needed(3, 20, 3))
    short, wide = Sequence([3, 4, 5], one), Sequence([3, 4, 5, 6], GenerationParams(max_tokens=19))
    engine.add(short)
    engine.add(wide)
    while engine.has_work():
        engine.step()
    assert short.result.tokens == alone


def scores(policy: AdaptiveK, batch: int, k_max: int) -> dict[int, float | None]:
    rates = policy.rates(k_max)
    return {k: policy.throughput(batch, k, rates) for k in range(k_max + 1)}


def test_adaptive_k_turns_speculation_off_where_it_costs_and_on_where_it_pays():
    policy = AdaptiveK(prior=[0.9, 0.8, 0.7])
    # a memory-bound batch 1 (drafts nearly free) and a compute-bound batch 16 (each draft costs a step)
    policy.costs = {1: {0: 1.0, 1: 1.1, 2: 1.2, 3: 1.3}, 16: {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}}
    assert policy.k(1, 3) == 3
    assert policy.k(16, 3) == 0
    assert policy.table(3, [1, 16])[16] == {"k": 0, "speedup": 1.0}
    assert AdaptiveK(prior=[0.9], costs=policy.costs, max_concurrency=8).k(1, 3) == 3
    assert AdaptiveK(prior=[0.9], costs=policy.costs, max_concurrency=8).k(9, 3) == 0
    assert FixedK(2, max_concurrency=4).k(4, 3) == 2 and FixedK(2, max_concurrency=4).k(5, 3) == 0
    # measured acceptance replaces the prior: a draft that is always wrong is never worth its cost
    for _ in range(20):
        policy.observe(1, 3, 1.3, [1, 1, 1], [0, 0, 0])
    assert policy.k(1, 3) == 0
    # the first step after a change of K (the drafter catching up) does not count as that K's cost
    policy.observe(1, 0, 9.0, [], [])
    assert policy.costs[1][0] == 1.0
    policy.observe(1, 0, 2.0, [], [])
    assert policy.costs[1][0] == pytest.approx(1.5)  # the mean of the recent steps, the seed one of them
    for _ in range(100):
        policy.observe(1, 0, 2.0, [], [])
    policy.observe(1, 0, 30.0, [], [])
    assert policy.costs[1][0] == 2.0  # a lone outlier (a GC pause, another process) does not move it
    for _ in range(5):  # a cost that recurs (a drafter catching up on a row that just joined) does
        policy.observe(1, 0, 3.0, [], [])
    assert policy.costs[1][0] == pytest.approx((8 * 2.0 + 5 * 3.0) / 13)  # the slowest (30) and fastest dropped


def test_adaptive_acceptance_per_position_holds_when_steps_run_different_k():
    """Position j's rate is over the rows that reached it: steps at K=1 say nothing about position 2, and
    counting them as if they did (one denominator for every position) made deep drafts look worthless."""
    policy = AdaptiveK()
    for _ in range(20):  # K=3, one row: positions 0 and 1 accepted, 2 rejected
        policy.observe(1, 3, 1.0, [1, 1, 1], [1, 1, 0])
    for _ in range(100):  # K=1: position 0 accepted
        policy.observe(1, 1, 1.0, [1], [1])
    assert policy.rates(3) == [1.0, 1.0, 0.0]


def test_adaptive_explores_with_the_k_that_would_run_not_the_longest():
    """Exploring at a batch where K=0 wins refreshes the K a switch would choose, at a fraction of k_max's cost."""
    from trtspec.speculative.policy import EXPLORE_STEPS

    policy = AdaptiveK(prior=[0.7, 0.1, 0.1])
    policy.costs = {16: {0: 1.0, 1: 1.8, 2: 2.6, 3: 3.4}}
    interval = policy.explore_interval(16, 0, 1, scores(policy, 16, 3))
    chosen = [policy.k(16, 3) for _ in range(interval + EXPLORE_STEPS)]
    assert set(chosen) == {0, 1} and chosen.count(1) == EXPLORE_STEPS
    assert chosen.index(1) == interval - 1


def test_adaptive_exploration_is_rarer_the_more_a_switch_costs():
    """Leaving K=0 costs a catch-up step (MTP passes over every token it skipped): measured, it spaces the
    explorations so that they cost at most EXPLORE_BUDGET of plain decoding's time."""
    from trtspec.speculative.policy import EXPLORE_BUDGET, EXPLORE_STEPS

    policy = AdaptiveK(prior=[0.7, 0.1, 0.1])
    policy.costs = {16: {0: 1.0, 1: 2.7, 2: 3.6, 3: 4.5}}
    # four K=1 steps of 2.7 s yield 1.7 tokens each where K=0 yields 1 per second: 4 s lost
    lost = EXPLORE_STEPS * 2.7 * (1 - 1.7 / 2.7)
    cheap = policy.explore_interval(16, 0, 1, scores(policy, 16, 3))
    assert cheap == pytest.approx(lost / EXPLORE_BUDGET, abs=1)
    policy.observe(16, 0, 1.0, [], [])
    policy.observe(16, 1, 6.7, [16], [10])  # the first step at K=1 took 4 s more than K=1's steady cost
    assert policy.switch_seconds == pytest.approx(4.0)
    assert policy.costs[16][1] == 2.7  # and is not K=1's cost
    interval = policy.explore_interval(16, 0, 1, scores(policy, 16, 3))
    assert interval == pytest.approx((4.0 + lost) / EXPLORE_BUDGET, abs=1)


def test_adaptive_tries_a_nearly_tied_runner_up_more_often_than_a_distant_one():
    """While drafting runs, K = 0 is timed as often as the budget allows: a K = 0 that nearly ties is
    cheap to try and its cost matters most there (concurrency 16), one far behind (batch 1) rarely."""
    from trtspec.speculative.policy import EXPLORE_MAX, EXPLORE_MIN

    policy = AdaptiveK(prior=[0.8])  # K=1 yields 1.8 tokens per step
    policy.costs = {1: {0: 1.0, 1: 1.1}, 16: {0: 1.0, 1: 1.7}}  # drafting wins 1.64x at 1, 1.06x at 16
    near = policy.explore_interval(16, 1, 0, scores(policy, 16, 1))
    far = policy.explore_interval(1, 1, 0, scores(policy, 1, 1))
    assert EXPLORE_MIN[True] <= near < far <= EXPLORE_MAX and far > 4 * near
    # trying a K > 0 that nearly ties with K = 0 is not made as frequent: that switch may well lose
    policy.costs[16][1] = 1.8 / 0.99  # drafting now 1% behind
    assert policy.explore_interval(16, 0, 1, scores(policy, 16, 1)) == EXPLORE_MIN[False] > near


def test_adaptive_stops_drafting_on_a_gain_inside_its_timings_noise():
    """Served at concurrency 16 a step's time swings 2x from one step to the next, and drafting's predicted
    gain was 1-3%: inside that noise the policy kept drafting (and lost ~10%). A gain the timings cannot
    tell from noise turns drafting off; the same gain from steady timings keeps it on."""
    for spread, expected in ((0.0, 1), (0.5, 0)):
        policy = AdaptiveK(prior=[0.5])  # K=1 yields 1.5 tokens per step
        policy.costs = {16: {0: 1.0, 1: 1.5 / 1.03}}  # drafting predicted 3% ahead
        for i in range(COST_WINDOW):  # alternate fast and slow steps around the same means
            swing = 1 + spread * (1 if i % 2 else -1)
            policy.observe(16, 1, 1.5 / 1.03 * swing, [16], [8])
        policy.previous_k = 0
        for i in range(COST_WINDOW + 1):  # the first step after a change of K is not timed
            swing = 1 + spread * (1 if i % 2 else -1)
            policy.observe(16, 0, 1.0 * swing, [], [])
        policy.previous_k = 1  # drafting is what runs
        assert policy.k(16, 1) == expected, spread


def test_adaptive_leaves_plain_decoding_only_for_a_clear_gain():
    """A K>0 predicted to win by less than UP_MARGIN does not pull the policy off K=0 (it would pay a
    switch for a gain inside the estimates' noise), but once running it stays while it beats K=0."""
    from trtspec.speculative.policy import UP_MARGIN

    policy = AdaptiveK(prior=[0.5])
    gain = 1 + UP_MARGIN / 2  # K=1 yields 1.5 tokens per step: its step costs 1.5 / gain
    policy.costs = {4: {0: 1.0, 1: 1.5 / gain}}
    assert policy.k(4, 1) == 1  # nothing running yet: the better K
    policy.observe(4, 1, 1.5 / gain, [4], [2])
    assert policy.k(4, 1) == 1
    policy.observe(4, 0, 1.0, [], [])
    assert policy.k(4, 1) == 0
    policy.costs[4][1] = 1.5 / (1 + 2 * UP_MARGIN)
    assert policy.k(4, 1) == 1


def test_adaptive_scales_drafting_cost_to_plain_decodings_time_under_load():
    """Served, K = 0's time at the running batch is measured under load (the server's threads and the
    client share the cores), K > 0's mostly at calibration on an idle engine. Compared as they stand,
    drafting looked cheap wherever it had not run lately; its cost relative to K = 0 is what holds."""
    policy = AdaptiveK(prior=[0.3])  # K=1 yields 1.3 tokens per step
    policy.costs = {8: {0: 1.0, 1: 1.4}, 16: {0: 2.0, 1: 2.8}}  # calibrated: drafting costs 1.4x a plain step
    for _ in range(3):
        policy.observe(12, 0, 3.0, [], [])  # under load every step takes twice as long
    assert policy.step_seconds(12, 1) == pytest.approx(3.0 * 1.4)
    assert policy.k(12, 1) == 0  # 1.3 tokens per 4.2 s loses to 1 per 3.0 s (per 2.1 s as calibrated, it won)
    assert policy.step_seconds(32, 1) == pytest.approx(2.0 * 32 / 16 * 1.4)  # past the largest batch measured


def test_adaptive_times_a_wandering_batch_under_the_nearest_calibrated_size():
    """Served at concurrency 16 the running batch wanders (13, 15, 14, ...): a step re-times the nearest
    calibrated size, so drafting found costly at 13 is costly at 14 too, not calibration's idle figure."""
    policy = AdaptiveK(prior=[0.5], grid=[1, 2, 4, 8, 16])  # K=1 yields 1.5 tokens per step
    policy.costs = {8: {0: 1.0, 1: 1.2}, 16: {0: 2.0, 1: 2.4}}  # calibrated: K=1 pays everywhere
    assert policy.k(14, 1) == 1
    for _ in range(COST_WINDOW):
        policy.observe(13, 1, 4.0, [13], [6])  # drafting at 13 takes twice K=0's time
    assert set(policy.costs) == {8, 16} and policy.costs[16][1] == pytest.approx(4.0)
    assert policy.k(14, 1) == 0 and policy.k(15, 1) == 0
    assert policy.k(5, 1) == 1  # nearer 4 and 8, which nothing re-timed


def test_adaptive_refreshes_plain_decodings_cost_while_drafting_wins():
    """A K = 0 cost measured too high at calibration would keep drafting on for ever at that batch (only
    a K that runs is re-timed): K = 0 is tried as often as the budget allows, and its true cost turns
    drafting off."""
    from trtspec.speculative.policy import EXPLORE_STEPS

    policy = AdaptiveK(prior=[0.6])
    policy.costs = {16: {0: 1.5, 1: 2.0}}  # K=1: 1.6 tokens per 2.0 s beats 1 per 1.5 s; really K=0 takes 1.0 s
    interval = policy.explore_interval(16, 1, 0, scores(policy, 16, 1))
    chosen = []
    for _ in range(interval + 2 * EXPLORE_STEPS + 50):
        k = policy.k(16, 1)
        chosen.append(k)
        policy.observe(16, k, 1.0 if k == 0 else 2.0, [16] if k else [], [10] if k else [])
    assert chosen[: interval - 1] == [1] * (interval - 1)
    assert policy.costs[16][0] < 1.5 and chosen[-50:] == [0] * 50


def test_calibration_measures_every_batch_size_and_k_and_leaves_the_engine_empty(pair):
    target, draft = pair
    engine = SpeculativeRunner(target, DraftModelDrafter(draft), 2, max_len=128).engine(slots=4, capacity=128)
    policy = AdaptiveK()
    calibrate(engine, policy, batch_sizes(4), reps=1)
    assert set(policy.costs) >= {1, 2, 4} and all(set(policy.costs[b]) >= {0, 1, 2} for b in (1, 2, 4))
    assert engine.running == 0 and not engine.waiting and int(engine.cached.sum()) == 0
    assert policy.steps_with_drafts == 0  # drafts on random tokens say nothing about acceptance


def test_a_failing_answer_still_sends_the_client_an_error_and_the_loop_serves_on(pair):
    """A bug while building one request's final response (on the responder thread) must still end that
    request with an error, or its client waits for ever; the other requests are unaffected."""
    import threading
    import time

    from trtspec.repository.engine_loop import INTERNAL_ERROR, EngineLoop

    engine = runners(pair)["draft-target"].engine(slots=2)
    logged: list[str] = []
    loop = EngineLoop(lambda: engine, log_error=logged.append)
    answers: dict[str, list[str | None]] = {"broken": [], "good": []}
    finished = threading.Event()

    def broken(seq, error):
        answers["broken"].append(error)
        if error is None:
            raise RuntimeError("building the response failed")

    def good(seq, error):
        answers["good"].append(error)
        finished.set()

    try:
        loop.submit(Sequence(PROMPTS[0], GREEDY), broken)
        loop.submit(Sequence(PROMPTS[1], GREEDY), good)
        assert finished.wait(60)
        deadline = time.monotonic() + 30
        while len(answers["broken"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        loop.close()
    assert answers["broken"] == [None, INTERNAL_ERROR]
    assert answers["good"] == [None]
    assert any("building the response failed" in m for m in logged)


def test_the_engine_is_built_on_its_own_thread_and_a_failed_build_is_raised(pair):
    """Torch work on the model's thread and on the engine thread made every step ~30% slower on CPU (two
    OpenMP teams): loading and calibration run where the steps run. A build that fails fails initialize()."""
    import threading

    from trtspec.repository.engine_loop import EngineLoop

    where = []

    def build():
        where.append(threading.current_thread().name)
        return runners(pair)["none"].engine(slots=1)

    loop = EngineLoop(build)
    try:
        assert where == ["trtspec-engine"] and loop.engine is not None
    finally:
        loop.close()

    def broken():
        raise FileNotFoundError("no engine here")

    with pytest.raises(FileNotFoundError, match="no engine here"):
        EngineLoop(broken)


@pytest.mark.parametrize("mode", ["draft-target", "mtp"])
def test_a_row_far_behind_is_caught_up_alone_and_drafts_what_one_padded_pass_drafts(pair, mode, monkeypatch):
    """A joined row's catch-up runs apart from the rows beside it (no padding to its length), exactly."""
    target, draft = pair
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 50, (2, 64), generator=g)
    hidden = torch.randn(2, 64, target.dims.hidden_size, generator=g)
    sampling = RowSampling([(SamplingParams(temperature=1.0), None)] * 2, "cpu")

    def drafted_probs(catch_up_at: int) -> torch.Tensor:
        monkeypatch.setattr(drafters, "CATCH_UP_AT", catch_up_at)
        drafter = DraftModelDrafter(draft) if mode == "draft-target" else MTPDrafter(target)
        state = BatchState(tokens.clone(), torch.tensor([30, 0]), sampling, hidden if mode == "mtp" else None)
        drafter.start(state, 64)
        drafter.propose(state, 1, Slots.of([0]))  # row 0 runs...
        state.lengths[0] = 31
        drafter.commit(state, torch.tensor([30]), 1, Slots.of([0]))
        state.lengths[1] = 40  # ... when row 1 joins, 39 positions behind
        return drafter.propose(state, 1, Slots.of([0, 1])).probs

    apart, padded = drafted_probs(drafters.CATCH_UP_AT), drafted_probs(10**9)
    assert torch.allclose(apart, padded, atol=1e-5)


def test_a_stream_sends_what_piled_up_behind_a_busy_responder_as_one_chunk_and_loses_nothing():
    from trtspec.repository.engine_loop import Stream

    class Loop:  # the responder's queue, run by hand
        def __init__(self) -> None:
            self.actions: list = []

        def defer(self, action) -> None:
            self.actions.append(action)

    loop, sent = Loop(), []
    stream = Stream(loop, sent.append)
    stream.push([1])
    stream.push([2, 3])  # while the first send is still queued: joins it
    assert len(loop.actions) == 1
    loop.actions.pop(0)()
    stream.push([4])  # after the flush: a send of its own
    loop.actions.pop(0)()
    assert sent == [[1, 2, 3], [4]] and not loop.actions


@pytest.mark.parametrize("tree", [None, TreeShape(2, 2)])
def test_a_drafters_work_after_the_pass_is_timed_as_drafting(pair, monkeypatch, tree):
    """What a drafter does once the target has spoken (a rollback, lookahead's Jacobi step) is part of what
    drafting costs: the benchmark's bound and plan's batch scaling read it from the step's draft time."""
    target, _ = pair
    drafter = NgramDrafter()
    runner = SpeculativeRunner(target, drafter, num_draft_tokens=2, max_len=128, tree=tree)
    name = "commit_tree" if tree else "commit"
    work = getattr(drafter, name)

    def slow(*args):
        time.sleep(0.05)
        return work(*args)

    monkeypatch.setattr(drafter, name, slow)
    stats = runner.generate([PROMPTS[2]], GenerationParams(max_tokens=6))[0].stats
    assert stats.steps > 0
    assert all(step.draft_s >= 0.05 and step.verify_s < step.draft_s for step in stats.step_log)
