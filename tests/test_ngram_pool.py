"""The torch runner's n-gram drafts follow TensorRT-LLM's NGram pool (NGramPoolManager's rules and flags)."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_checkpoint

from trtspec.speculative.batch import Sequence
from trtspec.speculative.drafters import BatchState, NgramDrafter
from trtspec.speculative.model import Slots, load_transformer
from trtspec.speculative.ngram_pool import NgramPool
from trtspec.speculative.runner import GenerationParams, SpeculativeRunner


def test_a_hit_drafts_the_oldest_match_or_the_newest():
    prefix = [1, 2, 3, 1, 2, 4, 1, 2]
    assert NgramPool().drafts(prefix, 0, 2, 2) == [3, 1]
    assert NgramPool(use_oldest=False).drafts(prefix, 0, 2, 2) == [4, 1]


def test_the_longest_suffix_found_drafts_and_k_cuts_it():
    pool = NgramPool()
    assert pool.drafts([7, 9, 1, 5, 6, 2, 9, 1], 0, 3, 3) == [5, 6, 2]  # (9, 1) found; (2, 9, 1) is not
    assert pool.start[0] == 8 - (3 + 3 - 1)  # the next scan starts K + N - 1 tokens before the end
    assert pool.drafts([7, 9, 1, 5, 6, 2, 9, 1, 5], 0, 1, 3) == [6]


def test_a_public_pool_drafts_from_other_requests_and_a_private_one_does_not():
    for public, want in ((True, [7, 8]), (False, [])):
        pool = NgramPool(public=public)
        pool.drafts([5, 6, 7, 8, 9], 0, 2, 2)
        assert pool.drafts([4, 5, 6], 1, 2, 2) == want


def test_a_finished_request_takes_its_private_pool_with_it():
    pool = NgramPool(public=False)
    pool.drafts([5, 6, 7, 5], 0, 2, 2)
    pool.forget(0)
    assert pool.private == {} and pool.start == {}
    shared = NgramPool()
    shared.drafts([5, 6, 7, 5], 0, 2, 2)
    shared.forget(0)
    assert shared.shared[(5,)] == [(6, 7)]  # the public pool is never pruned (NVIDIA's own TODO)


def test_a_match_cut_short_by_the_sequence_end_is_extended_later():
    pool = NgramPool()
    assert pool.drafts([1, 2], 0, 3, 3) == []  # (1,) -> (2,) only
    assert pool.shared[(1,)] == [(2,)]
    assert pool.drafts([1, 2, 3, 4, 1], 0, 3, 3) == [2, 3, 4]  # the scan restarted K + N - 1 before the end
    assert pool.shared[(1,)] == [(2, 3, 4)]


def test_no_drafts_leave_the_pool_untouched():
    pool = NgramPool()
    assert pool.drafts([1, 2, 1], 0, 0, 3) == [] and pool.shared == {} and pool.start == {}


def test_keep_all_off_replaces_a_pattern_by_a_longer_match():
    for keep_all, want in ((False, [(5, 6)]), (True, [(3, 4), (5, 6)])):
        pool = NgramPool(keep_all=keep_all)
        pool.shared[(1,)] = [(2,), (3, 4)]
        pool.drafts([1, 5, 6], 0, 2, 1)
        assert pool.shared[(1,)] == want


def test_shorter_matches_are_dropped_as_nvidia_drops_them():
    """NGramPoolManager removes from the OrderedSet it iterates, so the match after each removed one stays."""
    pool = NgramPool()
    pool.shared[(5,)] = [(1,), (2,), (3, 4)]
    pool.drafts([5, 6, 7], 0, 2, 1)
    assert pool.shared[(5,)] == [(2,), (3, 4), (6, 7)]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    root = tmp_path_factory.mktemp("pool")
    return load_transformer(make_checkpoint(root / "t", vocab=12, hidden=32, layers=1, heads=4, seed=3))


def accepted_in_one_engine(runner: SpeculativeRunner, prompt: list[int], times: int) -> list[int]:
    """Accepted drafts of each of `times` identical requests run one after another through one engine."""
    engine = runner.engine(slots=1, capacity=96)
    counts = []
    for _ in range(times):
        seq = Sequence(prompt, GenerationParams(max_tokens=40))
        engine.add(seq)
        while engine.has_work():
            engine.step()
        counts.append(seq.result.stats.accepted_tokens)
    return counts


def test_a_public_pool_outlives_its_requests_until_the_runner_forgets_them(target):
    prompt = [3, 5, 7, 2, 9, 4, 6, 1, 8]
    public = SpeculativeRunner(target, NgramDrafter(), num_draft_tokens=3, max_len=96)
    first, second = accepted_in_one_engine(public, prompt, 2)
    assert second > first  # the second request drafts from the first one's tokens
    private = SpeculativeRunner(target, NgramDrafter(public=False), num_draft_tokens=3, max_len=96)
    assert accepted_in_one_engine(private, prompt, 2) == [first, first]
    assert list(private.drafter.pool.private) == private.drafter.requests  # only the slot's last request's is kept
    private.forget_history()  # empties the pool and keeps its flags
    pool = private.drafter.pool
    assert pool.private == {} and pool.start == {}
    assert (pool.keep_all, pool.use_oldest, pool.public) == (True, True, False)
    # generate calls share the pool (TensorRT-LLM's lives with its executor) until a measurement forgets it
    public.forget_history()
    runs = [public.generate([prompt], GenerationParams(max_tokens=40))[0] for _ in range(2)]
    assert runs[0].stats.accepted_tokens == first < runs[1].stats.accepted_tokens
    public.forget_history()
    again = public.generate([prompt], GenerationParams(max_tokens=40))[0]
    assert again.stats.accepted_tokens == first and again.tokens == runs[0].tokens == runs[1].tokens


def test_a_row_with_no_room_left_leaves_the_pool_untouched():
    """NVIDIA's pool is not called for a request whose next token is its last; the engine says so per row."""
    drafter = NgramDrafter(max_ngram=2)
    state = BatchState(tokens=torch.tensor([[5, 6, 7, 5, 6], [5, 6, 9, 5, 6]]), lengths=torch.tensor([5, 5]))
    drafter.start(state, 5)
    state.room = torch.tensor([0, 2])
    proposal = drafter.propose(state, 2, Slots.of([0, 1], torch.device("cpu")))
    assert proposal.num_drafts.tolist() == [0, 2] and proposal.tokens[1].tolist() == [9, 5]
    assert (7,) not in drafter.pool.shared  # row 0's tokens never reached the shared pool


def test_the_engine_leaves_a_requests_last_token_out_of_the_pool(target, monkeypatch):
    """The engine tells the drafter which rows have room for drafts: the pool is called for a request until
    two tokens are left to produce, never for its last, as NVIDIA's is."""
    runner = SpeculativeRunner(target, NgramDrafter(), num_draft_tokens=3, max_len=96)
    seen, drafts = [], runner.drafter.pool.drafts

    def logged(prefix, *args):
        seen.append(len(prefix))
        return drafts(prefix, *args)

    monkeypatch.setattr(runner.drafter.pool, "drafts", logged)
    prompt = [3, 5, 7, 2, 9, 4, 6, 1, 8]
    for max_tokens in (2, 3, 12):  # at 2 the first decoding step already makes the last token
        seen.clear()
        out = runner.generate([prompt], GenerationParams(max_tokens=max_tokens))[0]
        assert len(out.tokens) == max_tokens
        assert all(n <= len(prompt) + max_tokens - 2 for n in seen)
        assert bool(seen) == (max_tokens > 2)


def test_measurements_and_calibration_start_from_an_empty_pool(target):
    from trtspec.methods import run_prompts
    from trtspec.speculative.policy import AdaptiveK, batch_sizes, calibrate

    runner = SpeculativeRunner(target, NgramDrafter(), num_draft_tokens=3, max_len=96)
    prompts, params = [[3, 5, 7, 2, 9, 4, 6, 1, 8], [4, 4, 6, 2]], GenerationParams(max_tokens=30)
    first, again = run_prompts(runner, prompts, params), run_prompts(runner, prompts, params)
    assert first.accepted_tokens == again.accepted_tokens > 0  # the second run replays nothing from the first
    engine = runner.engine(slots=2, capacity=96)
    calibrate(engine, AdaptiveK(), batch_sizes(2), reps=1)
    assert runner.drafter.pool.shared == {}  # its random prompts would stay the oldest match of their patterns


def test_a_served_yaml_gives_the_drafter_nvidias_fields_and_a_bad_size_is_one_line(target):
    from trtspec.errors import UsageError
    from trtspec.modes import get_mode

    mode = get_mode("ngram")
    assert mode.drafter(target, None, {}).max_ngram == 3  # the field left out: the section's default
    fields = mode.runner_settings({"max_matching_ngram_size": 4, "is_keep_all": False, "is_use_oldest": False})
    drafter = mode.drafter(target, None, fields)
    pool = drafter.pool
    assert drafter.max_ngram == 4 and (pool.keep_all, pool.use_oldest, pool.public) == (False, False, True)
    for bad in (0, None):  # TensorRT-LLM's int field refuses null too
        with pytest.raises(UsageError, match=rf"^speculative_config.max_matching_ngram_size: .* \(got {bad}\)$"):
            mode.runner_settings({"decoding_type": "NGram", "max_matching_ngram_size": bad})
