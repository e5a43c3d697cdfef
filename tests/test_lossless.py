"""The lossless guarantee, tested statistically: speculative output follows the target exactly.

On tiny context-dependent models (vocabulary 8) the exact joint distribution of the first four
generated tokens is enumerated from the target, and N = 100,000 speculative samples are tested
against it with a chi-square test at significance 1e-3. The same test is run on deliberately
broken samplers (the classic bugs: resampling from p after a rejection, an argmax draft verified
with its softmax q, Medusa's typical acceptance), which must fail by orders of magnitude with a fifth
of the samples (N_BROKEN; they reach p < 1e-190 there); that is what shows the test has the power to
catch a broken sampler at N.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy import stats
from tiny_models import make_checkpoint, make_eagle3_head

from trtspec.speculative import batch
from trtspec.speculative.drafters import CascadeDrafter, DraftModelDrafter, MedusaDrafter, MTPDrafter, NgramDrafter
from trtspec.speculative.eagle import EagleDrafter, load_eagle3
from trtspec.speculative.heads import MedusaHeads
from trtspec.speculative.lookahead import LookaheadDrafter
from trtspec.speculative.model import load_transformer
from trtspec.speculative.planted import PLANTED
from trtspec.speculative.requests import SamplingParams
from trtspec.speculative.runner import GenerationParams, SpeculativeRunner
from trtspec.speculative.sampling import probs_from_logits
from trtspec.speculative.self_draft import self_draft_model
from trtspec.speculative.tree import TreeShape, TreeVerified

pytestmark = pytest.mark.slow

V, N, LENGTH, ALPHA = 8, 100_000, 4, 1e-3
N_BROKEN = 20_000  # a broken sampler fails by orders of magnitude at a fifth of N
N_MIXED = 30_000  # through the batch engine, as its mixed-batch test does
PROMPT = [2, 3, 2, 3, 2]
T1 = SamplingParams(temperature=1.0)
WARPED = SamplingParams(temperature=0.8, top_k=5, top_p=0.9)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("lossless")


@pytest.fixture(scope="module")
def models(root):
    target = load_transformer(make_checkpoint(root / "target", vocab=V, layers=2, mtp_layers=2, seed=11))
    draft = load_transformer(make_checkpoint(root / "draft", vocab=V, layers=1, seed=12))
    return target, draft


@torch.inference_mode()
def exact_joint(target, params: SamplingParams, length: int = LENGTH, banned: tuple[int, ...] = ()) -> np.ndarray:
    """P(t1..tL | prompt) for every one of V^L continuations, from the target's processed conditionals (the
    `banned` tokens masked out, as min_tokens masks stop tokens)."""
    prefixes = torch.tensor(list(itertools.product(range(V), repeat=length - 1)))
    seqs = torch.cat([torch.tensor(PROMPT).expand(len(prefixes), -1), prefixes], dim=1)
    positions = torch.arange(seqs.shape[1]).expand_as(seqs)
    logits = target(seqs, positions, target.new_cache(len(seqs), seqs.shape[1])).logits
    logits[..., list(banned)] = float("-inf")
    probs = probs_from_logits(logits[:, len(PROMPT) - 1 :], params).double()  # [P, L, V]
    joint = torch.ones(len(prefixes), V, dtype=torch.float64)
    for i in range(length - 1):
        joint *= probs[torch.arange(len(prefixes)), i, prefixes[:, i]][:, None]
    joint = joint * probs[:, length - 1]
    return joint.reshape([V] * length).numpy()


def chi_square(samples: np.ndarray, exact: np.ndarray) -> tuple[float, float]:
    """Chi-square statistic and p-value; cells expected below 5 are pooled into one."""
    cells = np.ravel_multi_index(samples.T, exact.shape)
    observed = np.bincount(cells, minlength=exact.size).astype(float)
    expected = exact.ravel() * len(samples)
    assert observed[expected == 0].sum() == 0, "a token with target probability 0 was emitted"
    small = expected < 5
    obs = np.append(observed[~small], observed[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    obs, exp = obs[keep], exp[keep] * obs[keep].sum() / exp[keep].sum()
    stat, p = stats.chisquare(obs, exp)
    return float(stat), float(p)


def run(target, drafter, params: SamplingParams, k: int = 3, seed: int = 0, n: int = N, **kw):
    runner = SpeculativeRunner(target, drafter, num_draft_tokens=k, **kw)
    out = runner.generate([PROMPT] * n, GenerationParams(max_tokens=LENGTH, sampling=params, seed=seed))
    samples = np.array([g.tokens for g in out])
    assert samples.shape == (n, LENGTH)
    accepted = sum(g.stats.accepted_tokens for g in out) / max(1, sum(g.stats.draft_tokens for g in out))
    return samples, accepted


@pytest.fixture(scope="module")
def eagle_head(root, models):
    """A random EAGLE-3 head for the `models` target, drafting from 6 of the 8 tokens: q is 0 on the other
    two, which the target still emits through the residual."""
    return load_eagle3(make_eagle3_head(root / "head", root / "target", draft_vocab=6, seed=14))


@pytest.mark.parametrize("params", [T1, WARPED], ids=["t1", "topk-topp"])
@pytest.mark.parametrize(
    "mode",
    ["draft-target", "mtp", "eagle3", "ngram", "medusa", "self-draft", "self-draft-int8", "draft-target-cascade"],
)
def test_speculative_samples_follow_the_target_exactly(models, eagle_head, mode, params):
    target, draft = models
    drafter = {
        "draft-target": lambda: DraftModelDrafter(draft),
        "mtp": lambda: MTPDrafter(target),
        "eagle3": lambda: EagleDrafter(target, eagle_head),
        "ngram": lambda: NgramDrafter(),
        "medusa": lambda: MedusaDrafter(medusa_heads(target)),
        "self-draft": lambda: DraftModelDrafter(self_draft_model(target, [0])),
        "self-draft-int8": lambda: DraftModelDrafter(self_draft_model(target, [0], "int8")),
        "draft-target-cascade": lambda: CascadeDrafter(draft),
    }[mode]()
    samples, acceptance = run(target, drafter, params)
    stat, p = chi_square(samples, exact_joint(target, params))
    assert 0.02 < acceptance < 0.98, "both accepts and rejects must occur for the test to mean anything"
    assert p > ALPHA, f"{mode}: chi2 {stat:.1f}, p {p:.2e}"


class ArgmaxDraftSoftmaxQ(DraftModelDrafter):
    """BROKEN on purpose: drafts the argmax but reports the softmax as q (transformers #32867)."""

    def draw(self, logits, state):
        q = state.sampling.probs(logits)
        return q.argmax(-1), q


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_planted_verification_bugs_fail_by_a_wide_margin(models, bug):
    """The bugs the served lossless check is shown to catch are really wrong, by the exact test."""
    target, draft = models
    samples, _ = run(target, DraftModelDrafter(draft), T1, k=2, n=N_BROKEN, verify_fn=PLANTED[bug])
    stat, p = chi_square(samples, exact_joint(target, T1))
    assert p < 1e-30, f"{bug}: chi2 {stat:.1f}, p {p:.2e}: the test cannot tell a broken sampler"


def test_a_planted_bug_under_a_self_draft_fails_by_a_wide_margin(models):
    """The self-draft's samples go through the same verifier: the exact test sees it broken there too."""
    target, _ = models
    bug = sorted(PLANTED)[0]
    drafter = DraftModelDrafter(self_draft_model(target, [0], "int8"))
    samples, _ = run(target, drafter, T1, k=2, n=N_BROKEN, verify_fn=PLANTED[bug])
    stat, p = chi_square(samples, exact_joint(target, T1))
    assert p < 1e-30, f"{bug}: chi2 {stat:.1f}, p {p:.2e}: the test cannot tell a broken sampler"


def test_a_planted_bug_under_an_eagle3_head_fails_by_a_wide_margin(models, eagle_head):
    """The head's drafts (q zero off its draft vocabulary) go through the same verifier: a broken rule shows."""
    target, _ = models
    bug = sorted(PLANTED)[0]
    samples, _ = run(target, EagleDrafter(target, eagle_head), T1, k=2, n=N_BROKEN, verify_fn=PLANTED[bug])
    stat, p = chi_square(samples, exact_joint(target, T1))
    assert p < 1e-30, f"{bug}: chi2 {stat:.1f}, p {p:.2e}: the test cannot tell a broken sampler"


def test_broken_argmax_draft_with_softmax_q_fails_by_a_wide_margin(models):
    target, draft = models
    samples, _ = run(target, ArgmaxDraftSoftmaxQ(draft), T1, n=N_BROKEN)
    stat, p = chi_square(samples, exact_joint(target, T1))
    assert p < 1e-30, f"chi2 {stat:.1f}, p {p:.2e}: the test cannot tell a broken sampler"


TREE = TreeShape(3, 2)
MEDUSA_CHOICES = [[0], [1], [0, 0], [1, 0], [0, 0, 0]]  # a static tree, as TensorRT-LLM's medusa_choices


def medusa_heads(target) -> MedusaHeads:
    torch.manual_seed(13)
    return MedusaHeads(3, 1, target.dims.hidden_size, V).eval().requires_grad_(False)


@pytest.mark.parametrize("params", [T1, WARPED], ids=["t1", "topk-topp"])
@pytest.mark.parametrize("mode", ["draft-target", "ngram", "medusa", "medusa-choices", "self-draft", "eagle3"])
def test_tree_samples_follow_the_target_exactly(models, eagle_head, mode, params):
    """Multi-candidate verification of a token tree (SpecInfer's rule with deterministic candidates); Medusa's
    choices are the static tree TensorRT-LLM's engines verify."""
    target, draft = models
    drafter = {
        "draft-target": lambda: DraftModelDrafter(draft),
        "eagle3": lambda: EagleDrafter(target, eagle_head),
        "self-draft": lambda: DraftModelDrafter(self_draft_model(target, [0])),
        "ngram": NgramDrafter,
        "medusa": lambda: MedusaDrafter(medusa_heads(target)),
        "medusa-choices": lambda: MedusaDrafter(medusa_heads(target), MEDUSA_CHOICES),
    }[mode]()
    samples, acceptance = run(target, drafter, params, tree=drafter.fixed_tree or TREE)
    stat, p = chi_square(samples, exact_joint(target, params))
    assert 0.02 < acceptance < 0.98, "both accepts and rejects must occur for the test to mean anything"
    assert p > ALPHA, f"{mode} tree: chi2 {stat:.1f}, p {p:.2e}"


def typical_acceptance(tree, logits, sampling, depth=None, threshold: float = 0.25) -> TreeVerified:
    """BROKEN on purpose: Medusa's typical acceptance, descending into the likeliest child whenever the
    target gives it at least `threshold`, without a draw. Fast, and not the target's distribution."""
    b, depth = tree.tokens.shape[0], tree.max_depth
    rows = torch.arange(b)
    current = torch.full((b,), -1, dtype=torch.long)
    alive = torch.ones(b, dtype=torch.bool)
    accepted = torch.zeros(b, dtype=torch.long)
    path = torch.full((b, depth), -1, dtype=torch.long)
    tokens = torch.full((b, depth + 1), -1, dtype=torch.long)
    for level in range(depth + 1):
        p = sampling.probs(logits[rows, current + 1])
        x = torch.multinomial(p, 1).squeeze(-1)
        p_child = p.gather(1, tree.tokens).masked_fill(~(tree.valid & (tree.parents == current[:, None])), -1.0)
        best, child = p_child.max(1)
        take = alive & (best >= threshold) if level < depth else torch.zeros_like(alive)
        tokens[rows, accepted] = torch.where(alive & ~take, x, tokens[rows, accepted])
        if level < depth:
            tokens[:, level] = torch.where(take, tree.tokens[rows, child], tokens[:, level])
            path[:, level] = torch.where(take, child, path[:, level])
            current = torch.where(take, child, current)
            accepted += take.long()
        alive = take
    return TreeVerified(tokens, accepted, path)


@pytest.mark.parametrize("drafter", ["draft-target", "medusa-choices"])
def test_typical_acceptance_on_a_tree_fails_by_a_wide_margin(models, monkeypatch, drafter):
    target, draft = models
    monkeypatch.setattr(batch, "verify_tree", typical_acceptance)
    medusa = drafter == "medusa-choices"
    made = MedusaDrafter(medusa_heads(target), MEDUSA_CHOICES) if medusa else DraftModelDrafter(draft)
    samples, _ = run(target, made, T1, n=N_BROKEN, tree=made.fixed_tree or TREE)
    stat, p = chi_square(samples, exact_joint(target, T1))
    assert p < 1e-30, f"chi2 {stat:.1f}, p {p:.2e}: the test cannot tell a broken tree verifier"


LOOKAHEAD = (3, 2, 2)  # W, N, G: bigrams, so the pool offers candidates from the second step on


@pytest.mark.parametrize("params", [T1, WARPED], ids=["t1", "topk-topp"])
def test_lookahead_samples_follow_the_target_exactly(models, params):
    """Lookahead's window and pooled n-grams, verified as one tree with deterministic candidates."""
    target, _ = models
    drafter = LookaheadDrafter(*LOOKAHEAD)
    samples, acceptance = run(target, drafter, params, tree=drafter.fixed_tree)
    stat, p = chi_square(samples, exact_joint(target, params))
    assert 0.02 < acceptance < 0.98, "both accepts and rejects must occur for the test to mean anything"
    assert any(row is not None and row.pool for row in drafter.rows), "the pool must have offered candidates"
    assert p > ALPHA, f"lookahead: chi2 {stat:.1f}, p {p:.2e}"


def test_typical_acceptance_under_lookahead_fails_by_a_wide_margin(models, monkeypatch):
    target, _ = models
    monkeypatch.setattr(batch, "verify_tree", typical_acceptance)
    drafter = LookaheadDrafter(*LOOKAHEAD)
    samples, _ = run(target, drafter, T1, n=N_BROKEN, tree=drafter.fixed_tree)
    stat, p = chi_square(samples, exact_joint(target, T1))
    assert p < 1e-30, f"chi2 {stat:.1f}, p {p:.2e}: the test cannot tell a broken verifier under lookahead"


@torch.inference_mode()
def test_empirical_acceptance_equals_sum_min_p_q(models):
    """One draft after the first token: P(accept) = sum_t1 P(t1) sum_x min(p(x|t1), q(x|t1))."""
    target, draft = models
    out = SpeculativeRunner(target, DraftModelDrafter(draft), num_draft_tokens=1).generate(
        [PROMPT] * N, GenerationParams(max_tokens=3, sampling=T1, seed=5)
    )
    rate = sum(g.stats.accepted_tokens for g in out) / sum(g.stats.draft_tokens for g in out)
    assert sum(g.stats.draft_tokens for g in out) == N
    seqs = torch.cat([torch.tensor(PROMPT).expand(V, -1), torch.arange(V)[:, None]], dim=1)
    pos = torch.arange(seqs.shape[1]).expand_as(seqs)
    p = probs_from_logits(target(seqs, pos, target.new_cache(V, 8)).logits[:, -1], T1).double()
    q = probs_from_logits(draft(seqs, pos, draft.new_cache(V, 8)).logits[:, -1], T1).double()
    p_first = probs_from_logits(
        target(torch.tensor([PROMPT]), torch.arange(len(PROMPT))[None], target.new_cache(1, 8)).logits[0, -1], T1
    ).double()
    expected = float((p_first * torch.minimum(p, q).sum(-1)).sum())
    sigma = (expected * (1 - expected) / N) ** 0.5
    assert abs(rate - expected) < 4 * sigma, f"measured {rate:.4f}, expected {expected:.4f} +- {4 * sigma:.4f}"


def likeliest_first(target) -> int:
    cache = target.new_cache(1, len(PROMPT))
    return int(target(torch.tensor([PROMPT]), torch.arange(len(PROMPT))[None], cache).logits[0, -1].argmax())


def min_tokens_samples(target, drafter, n: int, stop: int, tree: TreeShape | None = None) -> list[list[int]]:
    """n samples at temperature 1 with `stop` as the end token and min_tokens = LENGTH, through the engine."""
    engine = SpeculativeRunner(target, drafter, num_draft_tokens=3, tree=tree).engine(slots=1024, capacity=32)
    generator = torch.Generator().manual_seed(4)
    params = GenerationParams(max_tokens=LENGTH, sampling=T1, stop_token_ids=frozenset({stop}))
    seqs = [batch.Sequence(PROMPT, params, generator=generator, min_tokens=LENGTH) for _ in range(n)]
    for seq in seqs:
        engine.add(seq)
    while engine.has_work():
        engine.step()
    return [s.result.tokens for s in seqs]


@torch.inference_mode()
@pytest.mark.parametrize("tree", [None, TreeShape(2, 2)], ids=["chain", "tree"])
def test_min_tokens_while_speculating_follows_the_masked_target(models, tree):
    """With min_tokens the output follows the target with its stop token masked, drafts or not (the stop token is
    the target's likeliest first token, so the draft proposes it often); banning it in the first verified column
    only, as a plain row does, lets it through by a wide margin."""
    target, draft = models
    stop = likeliest_first(target)
    samples = min_tokens_samples(target, DraftModelDrafter(draft), N_MIXED, stop, tree)
    assert all(len(s) == LENGTH for s in samples) and not any(stop in s for s in samples)
    stat, p = chi_square(np.array(samples), exact_joint(target, T1, banned=(stop,)))
    assert p > ALPHA, f"chi2 {stat:.1f}, p {p:.2e}"


@torch.inference_mode()
def test_min_tokens_banned_in_the_first_column_only_fails_by_a_wide_margin(models, monkeypatch):
    target, draft = models
    ban = batch.BatchEngine._ban_early_stops
    monkeypatch.setattr(
        batch.BatchEngine,
        "_ban_early_stops",
        lambda self, seqs, logits, ahead: ban(self, seqs, logits, ahead + (ahead > 0) * LENGTH),
    )
    stop = likeliest_first(target)
    samples = min_tokens_samples(target, DraftModelDrafter(draft), N_BROKEN, stop)
    early = sum(len(s) < LENGTH for s in samples)
    assert early > 100, f"only {early} of {len(samples)} outputs ended before min_tokens under the broken ban"
