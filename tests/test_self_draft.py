"""The target drafting for itself: a prefix of its layers, or its weights in int8."""

from __future__ import annotations

import pytest
import torch
from tiny_models import make_checkpoint

from trtspec.errors import UsageError
from trtspec.speculative.drafters import DraftModelDrafter
from trtspec.speculative.factory import load_runner
from trtspec.speculative.model import load_transformer
from trtspec.speculative.runner import GenerationParams, SpeculativeRunner
from trtspec.speculative.self_draft import Int8Linear, self_draft_model
from trtspec.speculative.tree import TreeShape

PROMPTS = [[3, 4, 5, 6, 7], [9, 10, 11], [12, 13, 14, 15, 16, 17, 18, 12, 13]]
GREEDY = GenerationParams(max_tokens=24)


@pytest.fixture(scope="module")
def target_path(tmp_path_factory):
    root = tmp_path_factory.mktemp("self")
    return make_checkpoint(root / "t", vocab=50, hidden=32, layers=3, heads=4, kv_heads=2, seed=5)


@pytest.fixture(scope="module")
def target(target_path):
    return load_transformer(target_path)


@pytest.fixture(scope="module")
def plain(target):
    return [g.tokens for g in SpeculativeRunner(target).generate(PROMPTS, GREEDY)]


@torch.inference_mode()
def test_the_layer_subset_is_the_target_with_those_layers_only(target):
    """Same tensors, not copies; its logits are the target's embedding, those blocks, norm and head."""
    draft = self_draft_model(target, [0, 2])
    assert draft.layers[1] is target.layers[2] and draft.lm_head is target.lm_head
    x = torch.tensor([[4, 8, 15, 16, 23]])
    pos = torch.arange(5)[None]
    cache = target.new_cache(1, 8)
    h = target.embed_tokens(x)
    cos, sin, mask, kv_len = target._attention_inputs(pos, cache)
    for i in (0, 2):
        h = target.layers[i](h, cos, sin, cache, i, pos, mask, kv_len)
    expected = target.lm_head(target.norm(h))
    assert torch.allclose(draft(x, pos, draft.new_cache(1, 8)).logits, expected, atol=1e-6)
    whole = target(x, pos, target.new_cache(1, 8)).logits
    assert not torch.allclose(whole, expected, atol=1e-3), "skipping a layer changed nothing: the test is void"


@torch.inference_mode()
def test_int8_rows_round_trip_within_half_a_step_and_leave_the_target_alone(target):
    linear = target.layers[0].gate_up
    before = linear.weight.clone()
    q = Int8Linear(linear)
    assert q.weight.dtype == torch.int8
    step = linear.weight.abs().amax(1, keepdim=True) / 127
    assert ((q.weight.float() * q.scale[:, None] - linear.weight).abs() <= step / 2 + 1e-7).all()
    x = torch.randn(3, linear.in_features)
    assert torch.allclose(q(x), x @ linear.weight.T, atol=0.05 * (x @ linear.weight.T).abs().max())
    int8 = self_draft_model(target, [0, 1, 2], "int8")
    assert isinstance(int8.layers[0].gate_up, Int8Linear) and isinstance(int8.lm_head, Int8Linear)
    assert torch.equal(linear.weight, before) and isinstance(target.lm_head, torch.nn.Linear)


@torch.inference_mode()
def test_the_int8_copy_dequantizes_into_one_buffer_per_shape_and_each_matrix_still_gets_its_own(target):
    """The int8 copy's matrices share a scratch buffer per shape (a fresh fp32 copy per call left the cost to
    the allocator); sharing must not mix them up: each call answers with its own rows."""
    int8 = self_draft_model(target, [0, 1, 2], "int8")
    mats = [m for m in int8.modules() if isinstance(m, Int8Linear)]
    q, o = int8.layers[0].o_proj, int8.layers[1].o_proj
    assert q.weight.shape == o.weight.shape and not torch.equal(q.weight, o.weight)
    x = torch.randn(2, q.weight.shape[1])
    first = q(x)  # kept while o and q run again: an output aliasing the shared buffer would change under it
    for m in (q, o, q):
        assert torch.allclose(m(x), (x @ m.weight.float().T) * m.scale, atol=1e-5)
    assert torch.allclose(first, (x @ q.weight.float().T) * q.scale, atol=1e-5)
    scratch = mats[0].scratch
    assert all(m.scratch is scratch for m in mats)
    int8(torch.tensor([[4, 8, 15]]), torch.arange(3)[None], int8.new_cache(1, 8))
    assert len(scratch) == len({tuple(m.weight.shape) for m in mats}) < len(mats)


def test_an_int8_buffer_made_under_inference_mode_still_serves_calls_outside_it(target):
    """The first call may come from the runner (inference mode) and a later one from plain no_grad code: a buffer
    born as an inference tensor refuses the in-place copy there."""
    q = Int8Linear(target.layers[0].o_proj)
    x = torch.randn(2, q.weight.shape[1])
    with torch.inference_mode():
        first = q(x)
    with torch.no_grad():
        assert torch.allclose(q(x), first)


@pytest.mark.parametrize(
    "settings,tree",
    [({"layers": [0]}, None), ({"layers": [0, 1]}, "3x2"), ({"weights": "int8"}, None), ({"weights": "int8"}, "2x2")],
)
def test_greedy_self_drafting_is_plain_decoding(target_path, target, plain, settings, tree):
    runner = load_runner(
        target_path,
        "self-draft",
        target=target,
        settings=settings,
        num_draft_tokens=3,
        tree=TreeShape.parse(tree) if tree else None,
    )
    out = runner.generate(PROMPTS, GREEDY)
    assert [g.tokens for g in out] == plain
    assert isinstance(runner.drafter, DraftModelDrafter)
    draft = runner.drafter.model  # the settings were applied, not the defaults
    assert len(draft.layers) == len(settings.get("layers", range(3)))
    assert (draft.layers[0] is target.layers[0]) == (settings.get("weights") != "int8")


def test_the_int8_copy_agrees_more_than_a_layer_prefix(target_path, target):
    """What makes a quantized self-draft worth measuring: acceptance near one."""

    def acceptance(settings) -> float:
        runner = load_runner(target_path, "self-draft", target=target, settings=settings, num_draft_tokens=3)
        out = runner.generate(PROMPTS, GREEDY)
        return sum(g.stats.accepted_tokens for g in out) / sum(g.stats.draft_tokens for g in out)

    assert acceptance({"weights": "int8"}) > 0.9
    assert acceptance({"weights": "int8"}) > acceptance({"layers": [0]})


@pytest.mark.parametrize(
    "settings,message",
    [
        ({"layers": [0, 1, 2]}, "is the target itself"),
        ({"layers": [1, 0]}, "distinct and ascending"),
        ({"layers": [0, 3]}, "not all among the target's layers 0..2"),
        ({"layers": []}, "at least one layer"),
    ],
)
def test_bad_layer_sets_are_refused_in_one_line(target_path, target, settings, message):
    with pytest.raises(UsageError, match=message) as err:
        load_runner(target_path, "self-draft", target=target, settings=settings)
    assert "\n" not in str(err.value)


def test_plan_chooses_the_prefix_by_measured_acceptance_and_cost(target):
    """The prefix the cost model rates best from measured acceptance and cost; the methods it makes are keys."""
    from trtspec.methods import Method, candidates, self_draft_settings
    from trtspec.speculative.requests import SamplingParams
    from trtspec.speculative.self_draft import best_prefix

    def seconds(model, batch, width):
        return float(model.dims.num_layers)  # a layer costs the same wherever it is

    settings, chose = self_draft_settings(target, PROMPTS, SamplingParams(), seconds)
    for layers, acceptance in enumerate(chose["acceptance_by_layers"], start=1):  # argmax agreement at T=0
        prefix, agree, total = self_draft_model(target, range(layers)), 0, 0
        for ids in PROMPTS:
            x, pos = torch.tensor([ids]), torch.arange(len(ids))[None]
            mine = prefix(x, pos, prefix.new_cache(1, len(ids))).logits.argmax(-1)
            theirs = target(x, pos, target.new_cache(1, len(ids))).logits.argmax(-1)
            agree, total = agree + int((mine == theirs).sum()), total + len(ids)
        assert acceptance == pytest.approx(agree / total)
    assert chose["cost_by_layers"] == pytest.approx([1 / 3, 2 / 3])
    assert len(chose["acceptance_by_layers"]) == 2
    assert chose["layers"] == list(range(best_prefix(chose["acceptance_by_layers"], chose["cost_by_layers"])))
    methods = candidates("self-draft", settings)
    assert len({hash(m) for m in methods}) == len(methods) and all(isinstance(m, Method) for m in methods)
    assert best_prefix([0.1, 0.9], [0.5, 0.6]) == 2 and best_prefix([0.8, 0.81], [0.2, 0.9]) == 1


@pytest.mark.parametrize(
    ("section", "label", "ks"),
    [
        ({"weights": "int8"}, "self-draft int8 K=", "INT8_KS"),
        ({"layers": [0, 1]}, "self-draft layers 0-1 K=", "CHAIN_KS"),
    ],
)
def test_the_configured_self_draft_is_compared_as_configured(section, label, ks):
    """A config that asks for the int8 copy gets the int8 copy's chain lengths in plan, and its label says so."""
    from conftest import CONFIGS

    from trtspec import methods
    from trtspec.config import load_config
    from trtspec.modes.self_draft import SelfDraftSection

    cfg = load_config(CONFIGS / "tiny-draft-target.yaml")
    speculation = cfg.speculation.model_copy(update={"mode": "self-draft"})
    cfg = cfg.model_copy(update={"speculation": speculation, "draft": None, "self_draft": SelfDraftSection(**section)})
    assert cfg.mode == "self-draft"
    configured = methods.configured_settings(cfg, "self-draft")
    chains = [m for m in methods.candidates("self-draft", [configured]) if not m.tree]
    assert [m.k for m in chains] == list(getattr(methods, ks))
    assert all(m.label.startswith(label) for m in chains), [m.label for m in chains]
    # what the recommendation is then run with: the configured section under the method's own settings
    assert methods.runner_settings(cfg, "self-draft", {"weights": "int8"})["weights"] == "int8"
    assert methods.runner_settings(cfg, "self-draft", {}) == {"layers": None, "weights": "same", **section}
    assert methods.runner_settings(cfg, "ngram", dict(configured)) == dict(configured)  # not the configured mode
