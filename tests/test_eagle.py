"""EAGLE-3 heads in the torch runner: the head reads the captured layers of the position it drafts from,
its chain is the head's own forward over the committed tokens, greedy decoding is plain decoding, and the
checkpoint is the layout TensorRT-LLM's loader reads; bad heads are refused in one line."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from safetensors.torch import load_file
from tiny_models import make_checkpoint, make_eagle3_head

from trtspec.config import DeploymentConfig, validate_config
from trtspec.errors import ConfigError, UsageError
from trtspec.speculative.batch import Sequence
from trtspec.speculative.eagle import WEIGHTS, EagleDrafter, default_capture, load_eagle3
from trtspec.speculative.factory import load_runner
from trtspec.speculative.model import load_transformer
from trtspec.speculative.requests import SamplingParams
from trtspec.speculative.runner import GenerationParams, SpeculativeRunner
from trtspec.speculative.tree import TreeShape

PROMPTS = [[3, 4, 5, 6, 7], [9, 10, 11], [12, 13, 14, 15, 16, 17, 18, 12, 13]]
GREEDY = GenerationParams(max_tokens=24)


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle")
    target = make_checkpoint(root / "t", vocab=50, hidden=32, layers=6, heads=4, kv_heads=2, seed=1)
    return target, make_eagle3_head(root / "head", target, draft_vocab=40, seed=3)


@pytest.fixture(scope="module")
def target(paths):
    return load_transformer(paths[0])


@pytest.fixture(scope="module")
def head(paths):
    return load_eagle3(paths[1])


def test_default_capture_is_low_middle_high_and_distinct():
    assert default_capture(32) == (1, 15, 28)  # TensorRT-LLM's own default where it has three layers
    assert default_capture(6) == (1, 2, 4)
    for depth in range(2, 40):
        layers = default_capture(depth)
        assert len(set(layers)) == len(layers) and max(layers) < depth and len(layers) >= 2


@pytest.mark.parametrize("k", [1, 3, 5])
def test_greedy_eagle_decoding_is_plain_decoding(target, head, k):
    plain = SpeculativeRunner(target).generate(PROMPTS, GREEDY)
    runner = SpeculativeRunner(target, EagleDrafter(target, head), num_draft_tokens=k)
    together = runner.generate(PROMPTS, GREEDY)
    assert [g.tokens for g in together] == [g.tokens for g in plain]
    assert runner.generate([PROMPTS[2]], GREEDY)[0].tokens == plain[2].tokens
    assert sum(g.stats.draft_tokens for g in together) > 0


@torch.inference_mode()
def test_every_draft_is_the_heads_own_chain_over_the_committed_tokens(target, head):
    """Each step's drafts equal the head run afresh: fc over the captured layers of a fresh target forward
    at every committed position, then its own output fed back for the later drafts. A head that read the
    wrong layers, a stale cache entry or a shifted token would draft something else."""
    drafter = EagleDrafter(target, head)
    seen = []
    original = drafter.propose

    def spy(state, k, slots):
        proposal = original(state, k, slots)
        for row, slot in enumerate(slots.index.tolist()):
            n = int(state.lengths[slot])
            seen.append((state.tokens[slot, :n].tolist(), proposal.tokens[row, :k].tolist()))
        return proposal

    drafter.propose = spy
    sampled = GenerationParams(max_tokens=20, sampling=SamplingParams(temperature=0.0), seed=0)
    SpeculativeRunner(target, drafter, num_draft_tokens=3).generate(PROMPTS, sampled)
    assert len(seen) > 10
    for tokens, drafts in seen:
        n = len(tokens)
        seq = torch.tensor([tokens])
        features = target(seq, torch.arange(n)[None], target.new_cache(1, 64), capture=head.capture).features
        cache = head.new_cache(1, 64)
        out = head.layer(target, features[:, : n - 1], seq[:, 1:], torch.arange(n - 1)[None], cache)
        hidden, expected = out.hidden[:, -1:], [int(out.logits[0, -1].argmax())]
        for j in range(1, 3):
            out = head.layer(target, hidden, torch.tensor([[expected[-1]]]), torch.tensor([[n - 2 + j]]), cache)
            hidden = out.hidden
            expected.append(int(out.logits[0, -1].argmax()))
        assert drafts == expected, tokens


@pytest.mark.parametrize("shape", ["2x2", "3x2", "4x3"])
def test_greedy_eagle_tree_decoding_is_plain_decoding(target, head, shape):
    plain = SpeculativeRunner(target).generate(PROMPTS, GREEDY)
    runner = SpeculativeRunner(target, EagleDrafter(target, head), tree=TreeShape.parse(shape))
    together = runner.generate(PROMPTS, GREEDY)
    assert [g.tokens for g in together] == [g.tokens for g in plain]
    assert runner.generate([PROMPTS[2]], GREEDY)[0].tokens == plain[2].tokens
    assert sum(g.stats.accepted_tokens for g in together) > 0


@torch.inference_mode()
def fresh_chain_logits(target, head, tokens: list[int], branch: list[int]) -> torch.Tensor:
    """The head's logits after the committed `tokens` and then `branch`, run afresh as one chain."""
    n, seq = len(tokens), torch.tensor([tokens])
    features = target(seq, torch.arange(n)[None], target.new_cache(1, 64), capture=head.capture).features
    cache = head.new_cache(1, 64)
    out = head.layer(target, features[:, : n - 1], seq[:, 1:], torch.arange(n - 1)[None], cache)
    hidden, logits = out.hidden[:, -1:], out.logits[0, -1]
    for j, token in enumerate(branch, start=1):
        out = head.layer(target, hidden, torch.tensor([[token]]), torch.tensor([[n - 2 + j]]), cache)
        hidden, logits = out.hidden, out.logits[0, -1]
    return logits


def test_every_tree_node_is_among_the_top_of_the_heads_own_chain_along_its_branch(target, head):
    """A node's children are among the top `width` tokens the head gives when run afresh down the node's
    branch: the tree's nodes read their parent's output at their branch's positions, seeing only their
    ancestors. The root's children are exactly its top `width`."""
    drafter, shape = EagleDrafter(target, head), TreeShape.parse("3x2")
    trees = []
    original = drafter.propose_tree

    def spy(state, tree_shape, slots):
        tree = original(state, tree_shape, slots)
        for row, slot in enumerate(slots.index.tolist()):
            rows = (tree.tokens[row].tolist(), tree.parents[row].tolist(), tree.valid[row].tolist())
            trees.append((state.tokens[slot, : int(state.lengths[slot])].tolist(), *rows))
        return tree

    drafter.propose_tree = spy
    SpeculativeRunner(target, drafter, tree=shape).generate(PROMPTS, GREEDY)
    assert len(trees) > 10
    checked = 0
    for tokens, nodes, parents, valid in trees:
        for parent in sorted({parents[i] for i, ok in enumerate(valid) if ok}):
            branch, p = [], parent
            while p >= 0:
                branch.insert(0, nodes[p])
                p = parents[p]
            top = set(fresh_chain_logits(target, head, tokens, branch).topk(shape.width).indices.tolist())
            children = {nodes[i] for i, ok in enumerate(valid) if ok and parents[i] == parent}
            assert children == top if parent < 0 else children <= top, (tokens, branch)
            checked += parent >= 0
    assert checked > 10


def test_drafts_come_from_the_draft_vocabulary_mapped_by_d2t(target, head):
    to_target = head.draft_to_target()
    assert to_target.tolist() == list(range(10, 50))  # make_eagle3_head: the last 40 ids
    features, tokens = torch.randn(1, 2, head.fc.in_features), torch.tensor([[3, 4]])
    logits = head.layer(target, features, tokens, torch.arange(2)[None], head.new_cache(1, 8)).logits
    assert torch.isinf(logits[..., :10]).all() and torch.isfinite(logits[..., 10:]).all()


def test_the_checkpoint_is_the_layout_tensorrt_llms_eagle3_loader_reads(paths, head, tmp_path):
    """Keys as the published EAGLE-3 heads and TensorRT-LLM's Eagle3ForCausalLM name them, no embedding
    (the target's), the fused widths in config.json; saved and loaded again it drafts the same."""
    names = set(load_file(str(paths[1] / WEIGHTS)))
    a, m = "midlayer.self_attn", "midlayer.mlp"
    assert names == {
        "fc.weight",
        "midlayer.hidden_norm.weight",
        "midlayer.input_layernorm.weight",
        "midlayer.post_attention_layernorm.weight",
        *(f"{a}.{p}_proj.weight" for p in "qkvo"),
        *(f"{m}.{p}_proj.weight" for p in ("gate", "up", "down")),
        "norm.weight",
        "lm_head.weight",
        "d2t",
    }
    w = load_file(str(paths[1] / WEIGHTS))
    assert w["fc.weight"].shape == (32, 3 * 32) and w[f"{a}.q_proj.weight"].shape == (32, 2 * 32)
    cfg = json.loads((paths[1] / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["num_hidden_layers"] == 1  # + draft_vocab_size
    assert (cfg["draft_vocab_size"], cfg["vocab_size"], cfg["target_hidden_size"]) == (40, 50, 32)
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(default_capture(6))
    head.save(tmp_path / "again", json.loads((paths[0] / "config.json").read_text()), dtype=torch.float32)
    again = load_eagle3(tmp_path / "again")
    for (name, x), (_, y) in zip(head.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


def test_bad_heads_are_refused_in_one_line(paths, tmp_path):
    _, head_path = paths
    with pytest.raises(UsageError, match=r"no readable config\.json"):
        load_eagle3(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(UsageError, match=r"not an EAGLE-3 head \(config\.json has no draft_vocab_size\)"):
        load_eagle3(tmp_path)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((head_path / "config.json").read_text())
    w = load_file(str(head_path / WEIGHTS))
    from safetensors.torch import save_file

    save_file({k: v for k, v in w.items() if k != "fc.weight"}, str(broken / WEIGHTS))
    with pytest.raises(UsageError, match=r"missing weight fc\.weight"):
        load_eagle3(broken)
    (broken / WEIGHTS).write_bytes(b"not safetensors")
    with pytest.raises(UsageError, match="corrupt"):
        load_eagle3(broken)
    other = make_checkpoint(tmp_path / "other", vocab=50, hidden=16, layers=6, heads=2, kv_heads=1)
    with pytest.raises(UsageError, match="a head for another model") as err:
        load_runner(other, "eagle3", head_path)
    assert "\n" not in str(err.value)
    shallow = make_checkpoint(tmp_path / "shallow", vocab=50, hidden=32, layers=2, heads=4, kv_heads=2)
    with pytest.raises(UsageError, match="the target has 2 layers"):
        load_runner(shallow, "eagle3", head_path)


def test_the_runner_reads_the_configured_layers_and_refuses_ones_the_head_was_not_trained_on(paths):
    runner = load_runner(paths[0], "eagle3", paths[1], settings={"layers_to_capture": [4, 1, 2]})
    assert runner.drafter.feature_layers == (1, 2, 4)  # sorted, as TensorRT-LLM orders the fused features
    with pytest.raises(UsageError, match=r"layers_to_capture \[0, 2, 4\]: the EAGLE-3 head was trained on"):
        load_runner(paths[0], "eagle3", paths[1], settings={"layers_to_capture": [0, 2, 4]})


def test_a_head_over_the_whole_vocabulary_may_leave_its_output_matrix_to_the_target(paths, target, tmp_path):
    """TensorRT-LLM takes the target's lm_head where the head has none and drafts the whole vocabulary; a
    smaller draft vocabulary needs d2t, and a d2t that leaves the target's vocabulary is refused."""
    full = make_eagle3_head(tmp_path / "full", paths[0], seed=5)
    w = load_file(str(full / WEIGHTS))
    from safetensors.torch import save_file

    save_file({k: v for k, v in w.items() if k not in ("lm_head.weight", "d2t")}, str(full / WEIGHTS))
    runner = load_runner(paths[0], "eagle3", full, num_draft_tokens=2)
    assert runner.drafter.head.lm_head.weight.data_ptr() == runner.target.lm_head.weight.data_ptr()
    plain = SpeculativeRunner(target).generate(PROMPTS, GREEDY)
    assert [g.tokens for g in runner.generate(PROMPTS, GREEDY)] == [g.tokens for g in plain]
    small = load_file(str(paths[1] / WEIGHTS))
    save_file({k: v for k, v in small.items() if k != "d2t"}, str(full / WEIGHTS))
    cfg = json.loads((paths[1] / "config.json").read_text())
    (full / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UsageError, match="drafts 40 of 50 tokens but has no d2t"):
        load_eagle3(full)
    save_file({**small, "d2t": small["d2t"] + 5}, str(full / WEIGHTS))  # ids 15..54: past the target's 50
    with pytest.raises(UsageError, match="maps its 40 draft tokens outside the target's 50"):
        load_runner(paths[0], "eagle3", full)
    cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [1, -2, 4]}
    (full / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UsageError, match="must be layer numbers >= 0"):
        load_eagle3(full)


def test_a_head_that_does_not_record_its_layers_reads_tensorrt_llms_default(paths, tmp_path):
    """Published heads carry no eagle_config: they were trained on the layers TensorRT-LLM captures by default."""
    import shutil

    bare = tmp_path / "bare"
    shutil.copytree(paths[1], bare)
    cfg = json.loads((bare / "config.json").read_text())
    del cfg["eagle_config"]
    (bare / "config.json").write_text(json.dumps(cfg))
    target = make_checkpoint(tmp_path / "t8", vocab=50, hidden=32, layers=8, heads=4, kv_heads=2, seed=1)
    runner = load_runner(target, "eagle3", bare, num_draft_tokens=2)
    assert runner.drafter.feature_layers == (1, 3, 4)  # (1, L/2 - 1, L - 4)
    assert load_runner(paths[0], "eagle3", bare).drafter.feature_layers == (1, 2, 2)  # as TensorRT-LLM reads 6
    shallow = make_checkpoint(tmp_path / "t5", vocab=50, hidden=32, layers=5, heads=4, kv_heads=2, seed=1)
    with pytest.raises(UsageError, match="has no default for a 5-layer target"):
        load_runner(shallow, "eagle3", bare)
    # naming them in the deployment works where TensorRT-LLM has no default, as eagle3_layers_to_capture does
    named = load_runner(shallow, "eagle3", bare, settings={"layers_to_capture": [0, 2, 4]})
    assert named.drafter.feature_layers == (0, 2, 4)


def _deployment(paths, root, version: str = "1.2.1", **speculation) -> DeploymentConfig:
    data = {
        "name": "e3",
        "target": {"checkpoint": str(paths[0]), "dtype": "float32"},
        "draft": {"checkpoint": str(paths[1]), "dtype": "bfloat16"},
        "eagle3": {"layers_to_capture": [4, 2, 1]},
        "speculation": {"mode": "eagle3", "num_draft_tokens": 2, "policy": "fixed", **speculation},
        "build": {"backend": "torch", "device": "cpu", "max_batch_size": 2, "max_seq_len": 64, "max_input_len": 32},
        "build_version": version,
        "serve": {"flavour": "llmapi", "repository": str(root / "repo")},
    }
    data["build"].update(output_dir=str(root / "engines"), tensorrt_llm_version=data.pop("build_version"))
    return validate_config(data, root / "e3.yaml")


def test_an_eagle3_deployment_builds_packages_and_serves_the_head_beside_its_target(paths, tmp_path):
    """Backend torch carries the head into the build (cast, loaded) and the llmapi model.yaml names it as
    TensorRT-LLM's Eagle3 speculative_config does; the served engine drafts with it on the configured layers,
    chains or the configured tree, and decodes greedily as plain decoding."""
    from trtspec.build.builder import run_build
    from trtspec.repository.package import package_repository
    from trtspec.repository.serving import engine_from_model_yaml

    plain = SpeculativeRunner(load_transformer(paths[0])).generate(PROMPTS, GREEDY)
    # 1.2 spells it Eagle3 and speculative_model, 1.0 Eagle; backend torch reads the layers from either
    for tree, version, decoding_type in ((None, "1.2.1", "Eagle3"), ("2x2", "1.0.3", "Eagle")):
        cfg = _deployment(paths, tmp_path / str(tree), version, **({"tree": tree} if tree else {}))
        assert run_build(cfg).built == ["target", "draft"]
        engines = tmp_path / str(tree) / "engines" / "e3"
        assert json.loads((engines / "draft" / "engine.json").read_text())["role"] == "draft"
        weights = load_file(str(engines / "draft" / WEIGHTS))  # cast as the draft section says, the map kept
        assert weights["fc.weight"].dtype == torch.bfloat16 and not weights["d2t"].is_floating_point()
        repo = package_repository(cfg)
        options = yaml.safe_load((repo / "tensorrt_llm" / "1" / "model.yaml").read_text())
        spec = options["speculative_config"]
        assert spec["decoding_type"] == decoding_type and spec["max_draft_len"] == 2
        assert spec["speculative_model"] == str(engines / "draft") and spec["eagle3_layers_to_capture"] == [4, 2, 1]
        engine, _ = engine_from_model_yaml(options)
        assert isinstance(engine.drafter, EagleDrafter) and engine.drafter.feature_layers == (1, 2, 4)
        assert engine.tree == (TreeShape.parse(tree) if tree else None)
        served = [Sequence(p, GREEDY) for p in PROMPTS]  # three requests in the served engine's two slots
        for seq in served:
            engine.add(seq)
        while engine.has_work():
            engine.step()
        assert [s.result.tokens for s in served] == [g.tokens for g in plain]
        assert sum(s.result.stats.draft_tokens for s in served) > 0  # drafted (a random head is seldom right)
    # the served runner reads the layers from model.yaml: layers the head was not trained on are refused
    options["speculative_config"]["eagle3_layers_to_capture"] = [0, 2, 4]
    with pytest.raises(UsageError, match=r"layers_to_capture \[0, 2, 4\]: the EAGLE-3 head was trained on"):
        engine_from_model_yaml(options)


def test_the_head_is_rebuilt_when_it_or_its_target_changes_and_only_then(paths, tmp_path):
    import shutil

    from trtspec.build.builder import run_build

    pair = (tmp_path / "t", tmp_path / "h")
    shutil.copytree(paths[0], pair[0])
    shutil.copytree(paths[1], pair[1])
    cfg = _deployment(pair, tmp_path)
    assert run_build(cfg).built == ["target", "draft"]
    assert run_build(cfg).built == []
    config = json.loads((pair[1] / "config.json").read_text())
    (pair[1] / "config.json").write_text(json.dumps({**config, "note": "retrained"}))
    assert run_build(cfg).built == ["draft"]
    (pair[0] / "generation_config.json").write_text("{}")
    assert run_build(cfg).built == ["target", "draft"]


def test_a_head_for_other_layers_or_another_target_fails_the_build_in_one_line(paths, tmp_path):
    """The build holds the head to its target as `trtspec check` does, not the server's first load."""
    from trtspec.build.builder import run_build

    cfg = _deployment(paths, tmp_path).model_dump(mode="json")
    cfg["eagle3"]["layers_to_capture"] = [0, 2, 4]  # the head was trained on (1, 2, 4)
    with pytest.raises(UsageError, match=r"trained on target layers \[1, 2, 4\]") as err:
        run_build(validate_config(cfg, tmp_path / "e3.yaml"))
    assert "\n" not in str(err.value) and not (tmp_path / "engines" / "e3" / "draft").exists()
    wide = make_checkpoint(tmp_path / "wide", vocab=50, hidden=48, layers=6, heads=4, kv_heads=2, seed=1)
    with pytest.raises(UsageError, match="hidden states of width 32"):
        run_build(_deployment((wide, paths[1]), tmp_path / "w"))


def test_a_head_that_does_not_load_fails_the_build_in_one_line_and_builds_nothing(paths, tmp_path):
    import shutil

    from trtspec.build.builder import run_build

    broken = tmp_path / "broken"
    shutil.copytree(paths[1], broken)
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "num_attention_heads": None}))
    cfg = _deployment((paths[0], broken), tmp_path)
    with pytest.raises(UsageError, match=r"config\.json") as err:
        run_build(cfg)
    assert "\n" not in str(err.value) and not (tmp_path / "engines" / "e3" / "draft").exists()


def test_the_engine_flavour_refuses_eagle3_which_compiled_engines_lack(paths, tmp_path):
    data = _deployment(paths, tmp_path).model_dump(mode="json")
    data["serve"].update(flavour="engine", streaming=False)
    with pytest.raises(ConfigError, match=r"serve\.flavour: the engine flavour stands in for compiled engines"):
        validate_config(data, tmp_path / "e3.yaml")
    one = _deployment(paths, tmp_path).model_dump(mode="json")
    one["eagle3"]["one_model"] = True  # an engine layout the runner would silently ignore
    with pytest.raises(ConfigError, match=r"eagle3\.one_model: TensorRT-LLM's engine layout"):
        validate_config(one, tmp_path / "e3.yaml")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"eagle_config": [1, 2]}, "eagle_config must be a mapping"),
        ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [True, 2]}}, "must be layer numbers"),
        ({"draft_vocab_size": "many"}, "config.json: invalid literal"),
        ({"draft_vocab_size": -4}, "sizes must be positive"),
        ({"hidden_size": None}, "config.json"),
        ({"num_attention_heads": None}, "config.json"),
    ],
)
def test_a_malformed_head_config_is_refused_in_one_line(paths, tmp_path, change, message):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(paths[1], bad)
    cfg = {**json.loads((bad / "config.json").read_text()), **change}
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UsageError, match=message) as err:
        load_eagle3(bad)
    assert "\n" not in str(err.value)


def test_weights_that_do_not_fit_are_refused_in_one_line(paths, tmp_path):
    import shutil

    from safetensors.torch import save_file

    w = load_file(str(paths[1] / WEIGHTS))
    k = "midlayer.self_attn.k_proj.weight"
    for name, tensors, message in (
        ("flat", {**w, "fc.weight": w["fc.weight"].flatten()}, "not all 2-D"),
        ("narrow", {**w, k: w[k][:, :3].clone()}, "fit"),  # k reads 3 inputs where q and v read 2d
    ):
        bad = tmp_path / name
        shutil.copytree(paths[1], bad)
        save_file(tensors, str(bad / WEIGHTS))
        with pytest.raises(UsageError, match=message):
            load_eagle3(bad)


def test_a_head_for_another_models_heads_or_vocabulary_is_refused_before_it_drafts(paths, tmp_path):
    """A head whose head_dim differs (the target's rotary tables would not fit it) or that leaves its output
    matrix to a target of another vocabulary is refused when the runner is built, not at the first draft."""
    other_heads = make_checkpoint(tmp_path / "t", vocab=50, hidden=32, layers=6, heads=2, kv_heads=2, seed=1)
    with pytest.raises(UsageError, match="head_dim"):
        load_runner(other_heads, "eagle3", paths[1])
    untied = make_eagle3_head(tmp_path / "h", paths[0], seed=5)  # the whole vocabulary of 50
    w = load_file(str(untied / WEIGHTS))
    from safetensors.torch import save_file

    save_file({k: v for k, v in w.items() if k not in ("lm_head.weight", "d2t")}, str(untied / WEIGHTS))
    wider = make_checkpoint(tmp_path / "t60", vocab=60, hidden=32, layers=6, heads=4, kv_heads=2, seed=1)
    with pytest.raises(UsageError, match="has no lm_head and drafts 50 tokens; the target has 60"):
        load_runner(wider, "eagle3", untied)
    with pytest.raises(UsageError, match="is empty"):
        load_runner(paths[0], "eagle3", paths[1], settings={"layers_to_capture": []})
