"""A draft model sped up by n-gram guesses (a vertical cascade): same drafts, fewer draft passes."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_models import make_checkpoint

from trtspec.speculative.batch import Sequence
from trtspec.speculative.cost_model import cascade_draft_passes
from trtspec.speculative.drafters import CascadeDrafter, DraftModelDrafter, NgramDrafter
from trtspec.speculative.model import load_transformer
from trtspec.speculative.requests import SamplingParams
from trtspec.speculative.runner import GenerationParams, SpeculativeRunner

REPO = Path(__file__).resolve().parents[1]
# repetitive prompts, so the n-gram lookup has guesses to offer
PROMPTS = [[3, 4, 5, 6, 3, 4, 5, 6, 3, 4], [9, 10, 11, 9, 10, 11, 9], [12, 13, 14, 15, 16, 17, 18, 12, 13]]
GREEDY = GenerationParams(max_tokens=30)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("cascade")
    target = load_transformer(make_checkpoint(root / "t", vocab=50, hidden=32, layers=2, heads=4, kv_heads=2, seed=1))
    draft = load_transformer(make_checkpoint(root / "d", vocab=50, hidden=32, layers=1, heads=4, kv_heads=2, seed=2))
    return target, draft


@pytest.mark.parametrize("k", [1, 2, 4, 6])
def test_a_cascaded_draft_drafts_what_the_draft_model_alone_drafts(pair, k):
    """Greedy: the same drafts, so the same accepted counts per step, in no more passes than K per step."""
    target, draft = pair
    alone = SpeculativeRunner(target, DraftModelDrafter(draft), num_draft_tokens=k).generate(PROMPTS, GREEDY)
    cascade = CascadeDrafter(draft)
    together = SpeculativeRunner(target, cascade, num_draft_tokens=k).generate(PROMPTS, GREEDY)
    plain = SpeculativeRunner(target).generate(PROMPTS, GREEDY)
    assert [g.tokens for g in together] == [g.tokens for g in plain] == [g.tokens for g in alone]
    assert [g.stats.accepted_per_position for g in together] == [g.stats.accepted_per_position for g in alone]
    assert cascade.passes[0] <= max(k, 1) * cascade.passes[1]
    if k > 2:  # the draft follows the repetition, so some of its drafts came from the pass over guesses
        assert cascade.rows[1] > 0 and cascade.usable[2] > 0


def test_the_cost_model_predicts_the_passes_at_batch_1(pair):
    target, draft = pair
    k = 5
    cascade = CascadeDrafter(draft)
    runner = SpeculativeRunner(target, cascade, num_draft_tokens=k)
    for prompt in PROMPTS:
        runner.generate([prompt], GREEDY)
    with_guesses = cascade.rows[1] / cascade.rows[0]
    shares = [1.0] + [cascade.usable[j] / cascade.rows[1] for j in range(2, k)]
    predicted = cascade_draft_passes(k, with_guesses, shares)
    assert 1 < predicted < k  # fewer passes than the draft model alone, at batch 1
    assert predicted == pytest.approx(cascade.passes[0] / cascade.passes[1], rel=1e-9)


def test_a_seeded_cascaded_row_samples_the_same_tokens_whatever_shares_its_batch(pair):
    """One draw per draft position and row, whether its draft came from the guesses' pass or its own, and
    as many near its end beside longer rows as alone (a step drafts the rows' K, not what the end leaves)."""
    target, draft = pair
    runner = SpeculativeRunner(target, CascadeDrafter(draft), num_draft_tokens=4)
    hot = GenerationParams(max_tokens=24, sampling=SamplingParams(temperature=1.0), seed=7)
    results = []
    for others in ([], [PROMPTS[0], PROMPTS[1]]):
        engine = runner.engine(slots=3, capacity=64)
        row = Sequence(PROMPTS[2], hot)
        for prompt in others:
            engine.add(Sequence(prompt, GenerationParams(max_tokens=40, seed=99)))
        engine.add(row)
        while engine.has_work():
            engine.step()
        results.append(row.result.tokens)
    assert results[0] == results[1]


def _config(tmp_path, backend: str, flavour: str | None = None, output_dir: str | None = None, repository=None):
    import yaml

    from trtspec.config import load_config

    cfg = yaml.safe_load((REPO / "configs" / "tiny-draft-target.yaml").read_text())
    cfg["draft_target"] = {"cascade": "ngram"}
    cfg["build"]["backend"] = backend
    cfg["speculation"]["policy"] = "fixed"  # every step drafts (the adaptive policy may decline on a slow host)
    cfg["build"].update({"output_dir": output_dir} if output_dir else {})
    cfg["serve"].update({k: v for k, v in (("flavour", flavour), ("repository", repository)) if v})
    cfg["serve"].update({"streaming": False} if flavour == "engine" else {})
    path = tmp_path / f"{backend}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return load_config(path)


def test_a_cascade_is_the_torch_runners_and_is_refused_elsewhere(tmp_path):
    from trtspec.build.builder import _torch_steps
    from trtspec.errors import ConfigError, UsageError

    with pytest.raises(ConfigError, match=r"draft_target\.cascade.*the torch runner.s") as err:
        _config(tmp_path, "pytorch")
    assert "\n" not in str(err.value)
    cfg = _config(tmp_path, "torch", flavour="engine")
    with pytest.raises(
        UsageError, match=r"draft_target\.cascade runs in trtspec's llmapi model.*serve\.flavour llmapi"
    ):
        _torch_steps(cfg, 2, {})
    from trtspec.speculative.factory import runner_for

    assert isinstance(runner_for(cfg).drafter, CascadeDrafter)


def test_a_cascade_deploys_on_backend_torch_through_trtspecs_own_model_yaml_section(tmp_path, monkeypatch):
    """TensorRT-LLM's speculative_config has no cascade, so the llmapi model.yaml carries it in its trtspec
    section; the served engine drafts with the cascade and decodes greedily as plain decoding."""
    import yaml

    from trtspec.build.builder import run_build
    from trtspec.repository.package import package_repository
    from trtspec.repository.serving import engine_from_model_yaml

    cfg = _config(tmp_path, "torch", output_dir=str(tmp_path / "engines"), repository=str(tmp_path / "repo"))
    run_build(cfg)
    options = yaml.safe_load((package_repository(cfg) / "tensorrt_llm" / "1" / "model.yaml").read_text())
    assert options["trtspec"]["settings"] == {"cascade": "ngram"} and "cascade" not in options["speculative_config"]
    engine, _ = engine_from_model_yaml(options)
    assert isinstance(engine.drafter, CascadeDrafter)
    plain = SpeculativeRunner(load_transformer(cfg.checkpoint_path(cfg.target))).generate(PROMPTS, GREEDY)
    served = [Sequence(p, GREEDY) for p in PROMPTS]
    for seq in served:
        engine.add(seq)
    while engine.has_work():
        engine.step()
    assert [s.result.tokens for s in served] == [g.tokens for g in plain]
    assert sum(s.result.stats.draft_tokens for s in served) > 0
    # only the mode's own runner-only fields reach the drafter, whatever else the section holds
    from trtspec.repository import serving

    given = []
    real = serving.load_runner
    monkeypatch.setattr(serving, "load_runner", lambda *a, **kw: given.append(kw["settings"]) or real(*a, **kw))
    options["trtspec"]["settings"] = {"cascade": "none", "num_nextn_predict_layers": 9, "layers": [0]}
    plain_engine, _ = engine_from_model_yaml(options)
    assert given == [{"cascade": "none"}] and type(plain_engine.drafter) is DraftModelDrafter


def test_each_drafter_says_how_its_drafting_grows_with_the_batch(pair):
    """plan's larger-batch prediction: host lookups per row, a draft model's forward at the batch, heads and
    MTP as the target's pass, and a cascade as many passes as a plain chain (a batch runs while any row needs)."""
    from trtspec.speculative.drafters import Drafter
    from trtspec.speculative.lookahead import LookaheadDrafter

    target, draft = pair

    def seconds(model, batch: int, tokens: int) -> float:  # a draft pass costs its batch; a target's, half of it
        return batch * tokens if model is draft else 1 + batch * tokens / 2

    assert NgramDrafter().batch_scale(8, 3, 1, seconds, target) == 8
    assert LookaheadDrafter(3, 2, 1).batch_scale(8, 3, 1, seconds, target) == 8
    assert DraftModelDrafter(draft).batch_scale(8, 3, 2, seconds, target) == 8
    assert Drafter().batch_scale(8, 3, 1, seconds, target) == 5 / 1.5  # heads, MTP: the target's pass
    cascade = CascadeDrafter(draft)
    assert cascade.batch_scale(8, 4, 1, seconds, target) == 8  # no steps yet: as the draft model
    cascade.passes = [30, 10]  # 3 passes a step at batch 1; a batch takes K = 4
    assert cascade.batch_scale(8, 4, 1, seconds, target) == 8 * 4 / 3
